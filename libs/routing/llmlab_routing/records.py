"""Decision records: one JSON line per decision with everything :func:`decide` read (so the choice
can be recomputed from the log alone, random seed included) and what it decided.

``python -m llmlab_router explain <request_id> --log FILE`` finds the record, recomputes the
decision from its inputs and shows both; it fails when they differ."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from llmlab_routing.decide import decide
from llmlab_routing.model import Decision, DecisionInputs

log = logging.getLogger(__name__)
RECORD_VERSION = 1
WRITE_BATCH = 1000  # records per write at most
# One JSON line per record.
_ORJSON = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
BATCH_PAUSE_S = 0.01  # the writer's pause between batches (records wait at most this long more)


def make_record(inp: DecisionInputs, dec: Decision, at: float | None = None) -> dict[str, Any]:
    """The record as the log writes it: the decision stays a dataclass (orjson writes it as
    ``Decision.to_json`` would, without ``asdict``'s deep copy: a quarter of the router's CPU)."""
    return {
        "record_version": RECORD_VERSION,
        "at": round(time.time() if at is None else at, 6),
        "request_id": inp.request_id,
        "policy": inp.policy,
        "policy_version": inp.policy_version,
        "inputs": inp.to_json(),
        "decision": dec,
    }


class DecisionLog:
    """Append-only JSON lines written by a background thread (serialising a record costs more than
    the decision itself); a size cap rotates to ``<file>.1`` so the log cannot fill the disk."""

    def __init__(self, path: str | Path, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._q: queue.Queue[dict[str, Any] | Callable[[], dict[str, Any]] | None] = queue.Queue(maxsize=100_000)
        self._f: IO[bytes] = self.path.open("ab")
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Queue a record, or a function that builds it (built on the writer thread, off the decision path)."""
        try:
            self._q.put_nowait(record)
        except queue.Full:  # the disk cannot keep up: lose records, never block routing
            self.dropped += 1
            if self.dropped in (1, 1000) or self.dropped % 100_000 == 0:
                log.error("decision log queue full: %d records dropped", self.dropped)

    def flush(self) -> None:
        """Wait until every record written so far is on disk (tests, shutdown)."""
        self._q.join()

    def _run(self) -> None:
        while True:
            batch = [self._q.get()]
            while len(batch) < WRITE_BATCH:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            stop = False
            try:
                lines = []
                for rec in batch:
                    if rec is None:
                        stop = True
                        break
                    if callable(rec):
                        rec = rec()
                    lines.append(orjson.dumps(rec, option=_ORJSON))
                self._f.write(b"".join(lines))
                self._f.flush()
                if self._f.tell() > self.max_bytes:
                    self._f.close()
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                    self._f = self.path.open("ab")
            except Exception:
                log.exception("could not write a decision record")
            finally:
                for _ in batch:
                    self._q.task_done()
            if stop:
                return
            # Gather the next batch: a writer that waits on the queue after every record makes
            # each routing decision pay a thread wake-up (Condition.notify) on the event loop.
            time.sleep(BATCH_PAUSE_S)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)
        self._f.close()


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    for p in (Path(str(path) + ".1"), Path(path)):
        if not p.exists():
            continue
        with p.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    log.warning("%s:%d: not a JSON record (skipped)", p, n)


def find_record(path: str | Path, request_id: str) -> dict[str, Any] | None:
    found = None
    for rec in iter_records(path):
        if rec.get("request_id") == request_id:
            found = rec  # the last one: a request is decided once, but be safe with re-used ids
    return found


def replay(record: dict[str, Any]) -> tuple[Decision, bool]:
    """Recompute the decision from the record's inputs; True when it equals the logged one."""
    inp = DecisionInputs.from_json(record["inputs"])
    dec = decide(inp)
    return dec, dec.to_json() == record["decision"]


def explain_text(record: dict[str, Any], recomputed: Decision, same: bool) -> str:
    inp = record["inputs"]
    d = record["decision"]
    c = inp["constraints"]
    lines = [
        f"request {record['request_id']}  policy {record['policy']} (version {record['policy_version']})  "
        f"seed {inp['seed']}",
        f"  request: model {inp['model']!r}, {inp['prompt_tokens']} prompt + {inp['max_output_tokens']} output tokens, "
        f"{inp['difficulty_class']} (difficulty {inp['difficulty']}), {inp['length_class']}, "
        f"{inp['prefix_blocks']} prefix blocks, tools={inp['needs_tools']}",
        f"  constraints: plan {c['plan']}, SLO {c['slo_class']}, quality >= {c['quality_floor']}, "
        f"difficulty wants >= {c['difficulty_floor']}, cost <= ${c['cost_cap_usd']}",
        f"  weights {inp['weights'] or '{} (catalog order)'}; picker {inp['picker']}; "
        f"chain <= {inp['max_chain']}, replica retries {inp['replica_retries']}",
        "  candidates:",
    ]
    for dep in inp["deployments"]:
        verdict = d["verdicts"].get(dep["id"], {})
        failed = {k: v for k, v in verdict.items() if v != "ok"}
        score = d["scores"].get(dep["id"])
        lines.append(
            f"    {dep['id']:<24} q={dep['quality']:.2f} ttft95={dep['ttft_p95_s']:.3f}s ({dep['latency_source']}) "
            f"workers={len(dep['workers'])} -> "
            + (f"score {score}" if score else "filtered")
            + (f"  [{'; '.join(f'{k}: {v}' for k, v in failed.items())}]" if failed else "")
        )
    chain = " -> ".join(f"{t['deployment']}/{t['worker_id'] or 'pool'}" for t in d["targets"]) or "(none)"
    lines += [f"  chain: {chain}", f"  reason: {d['reason']}"]
    lines.append("  recomputed from the record: " + ("IDENTICAL" if same else "DIFFERENT"))
    if not same:
        lines.append(f"  recomputed chain: {[(t.deployment, t.worker_id) for t in recomputed.targets]}")
    return "\n".join(lines)
