#!/bin/bash
# Interleaved: orig = services' code of 01ef916 (before the data plane changes), lev = the first
# levers (commit given as wt-lev), new = working tree (batched stream messages).
cd /work/main
OUT=${1:-/tmp/abc}; mkdir -p $OUT/orig $OUT/lev $OUT/new
pp() { echo "/tmp/$1/libs/worker:/tmp/$1/services/gateway:/tmp/$1/libs/common:/tmp/$1/libs/routing"; }
for i in 1 2; do
  PYTHONPATH=$(pp wt-orig) .venv/bin/python -m llmlab_loadtest.relay_bench --workload gpu-like --levels 100,1000 --repeats 1 --quiet-wait 20 --out-dir $OUT/orig > $OUT/orig-$i.log 2>&1
  PYTHONPATH=$(pp wt-lev) .venv/bin/python -m llmlab_loadtest.relay_bench --workload gpu-like --levels 100,1000 --repeats 1 --quiet-wait 20 --out-dir $OUT/lev > $OUT/lev-$i.log 2>&1
  .venv/bin/python -m llmlab_loadtest.relay_bench --workload gpu-like --levels 100,1000 --repeats 1 --quiet-wait 20 --out-dir $OUT/new > $OUT/new-$i.log 2>&1
done
echo done
