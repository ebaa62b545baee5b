#!/bin/bash
# Interleaved old/new relay comparison: base = worker+gateway of 01ef916, new = working tree.
cd /work/main
OUT=${1:-/tmp/abab}; mkdir -p $OUT/base $OUT/new
for i in 1 2; do
  PYTHONPATH=/tmp/wt-base/libs/worker:/tmp/wt-base/services/gateway .venv/bin/python -m llmlab_loadtest.relay_bench --workload gpu-like --levels 100,1000 --repeats 1 --quiet-wait 20 --out-dir $OUT/base > $OUT/base-$i.log 2>&1
  .venv/bin/python -m llmlab_loadtest.relay_bench --workload gpu-like --levels 100,1000 --repeats 1 --quiet-wait 20 --out-dir $OUT/new > $OUT/new-$i.log 2>&1
done
echo done
