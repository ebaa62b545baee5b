"""Request traces: a JSONL format and a seeded generator.

Format: the first line is a header ``{"trace_version", "seed", "generator", "params"}``, then one
request per line::

    {"t": 0.0123, "id": "r000001", "tenant": "pro", "priority": 1, "slo_class": "interactive",
     "class": "chat", "prompt_tokens": 812, "output_tokens": 240,
     "prefix_group": "sys2", "prefix_tokens": 1024}

``t`` is the arrival time in seconds from the trace start; ``prefix_group``/``prefix_tokens``
(optional) say that the prompt starts with the group's ``prefix_tokens`` shared tokens (the same
for every request of the group: a system prompt, a document); ``model`` is optional.
``priority`` follows vLLM (lower first).

Generator::

    python -m llmlab_twin.trace gen --mix tutorial-8.3 --arrival poisson --rate 20 \\
        --duration 3600 --seed 1 -o trace.jsonl

Mixes: ``tutorial-8.3`` (§8.3: 50% short 64-256 in / 32-128 out, 30% chat 256-1024 / 128-512,
15% long document 4K-16K / 128-512, 5% long generation 256-1K / 1K-4K), and §3.3's three traffic
sets: ``short-chat`` (short chats only), ``shared-system`` (every request starts with one shared
system prompt), ``longdoc-mix`` (20 long-document queries per 100 short chats). Arrival shapes:
``poisson`` (steady), ``bursty`` (on/off: bursts at ``--burst-factor`` x the rate), ``diurnal``
(sinusoidal rate, one period over the trace), ``ramp`` (rate rising linearly from 0 to 2x).
Shared prefixes: ``--shared-share`` of the requests start with one of ``--prefix-groups``
prefixes of ``--prefix-tokens`` tokens. Same arguments and seed give a byte-identical file.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

TRACE_VERSION = 1
GENERATOR = "llmlab_twin.trace"


@dataclass(frozen=True)
class RequestClass:
    name: str
    share: float
    prompt: tuple[int, int]
    output: tuple[int, int]
    slo_class: str = "interactive"


MIXES: dict[str, tuple[RequestClass, ...]] = {
    "tutorial-8.3": (
        RequestClass("short", 0.50, (64, 256), (32, 128)),
        RequestClass("chat", 0.30, (256, 1024), (128, 512)),
        RequestClass("long_doc", 0.15, (4096, 16384), (128, 512)),
        RequestClass("long_gen", 0.05, (256, 1024), (1024, 4096), "batch"),
    ),
    "short-chat": (RequestClass("short", 1.0, (64, 256), (32, 128)),),
    "shared-system": (RequestClass("short", 1.0, (64, 256), (32, 128)),),
    "longdoc-mix": (
        RequestClass("long_doc", 20 / 120, (4096, 16384), (128, 512)),
        RequestClass("short", 100 / 120, (64, 256), (32, 128)),
    ),
}
# §3.3 "requests sharing one system prompt": every request, one group, unless overridden.
MIX_PREFIX_DEFAULTS: dict[str, tuple[float, int, int]] = {"shared-system": (1.0, 1, 1024)}

DEFAULT_TENANTS = "enterprise:0.1:0,pro:0.3:1,free:0.6:2"
ARRIVALS = ("poisson", "bursty", "diurnal", "ramp")


@dataclass(slots=True)
class TraceRequest:
    t: float
    id: str
    prompt_tokens: int
    output_tokens: int
    tenant: str = ""
    priority: int = 0
    slo_class: str = "interactive"
    cls: str = ""
    model: str | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "t": round(self.t, 6),
            "id": self.id,
            "tenant": self.tenant,
            "priority": self.priority,
            "slo_class": self.slo_class,
            "class": self.cls,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.model is not None:
            d["model"] = self.model
        if self.prefix_group is not None:
            d["prefix_group"] = self.prefix_group
            d["prefix_tokens"] = self.prefix_tokens
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceRequest:
        return cls(
            t=float(d["t"]),
            id=str(d["id"]),
            prompt_tokens=int(d["prompt_tokens"]),
            output_tokens=int(d["output_tokens"]),
            tenant=str(d.get("tenant", "")),
            priority=int(d.get("priority", 0)),
            slo_class=str(d.get("slo_class", "interactive")),
            cls=str(d.get("class", "")),
            model=d.get("model"),
            prefix_group=d.get("prefix_group"),
            prefix_tokens=int(d.get("prefix_tokens", 0) or 0),
        )


@dataclass
class Trace:
    header: dict[str, Any]
    requests: list[TraceRequest]

    @property
    def duration(self) -> float:
        params = self.header.get("params", {})
        d = params.get("duration")
        if isinstance(d, int | float) and d > 0:
            return float(d)
        return self.requests[-1].t if self.requests else 0.0


@dataclass(frozen=True)
class Tenant:
    name: str
    share: float
    priority: int


def parse_tenants(spec: str) -> list[Tenant]:
    """``name:share:priority,...``"""
    out: list[Tenant] = []
    for part in spec.split(","):
        name, share, prio = part.strip().split(":")
        out.append(Tenant(name, float(share), int(prio)))
    if not out or sum(t.share for t in out) <= 0:
        raise ValueError(f"bad tenants spec {spec!r}")
    return out


# -- arrivals --------------------------------------------------------------------------------------


def _rate_fn(shape: str, rate: float, duration: float, burst_factor: float, burst_share: float) -> tuple[Any, float]:
    """(rate(t), its maximum) for thinning; the mean over the trace is ``rate``."""
    if shape == "poisson":
        return (lambda t: rate), rate
    if shape == "diurnal":
        amp = 0.8
        return (lambda t: rate * (1 + amp * math.sin(2 * math.pi * t / duration - math.pi / 2))), rate * (1 + amp)
    if shape == "ramp":
        return (lambda t: 2 * rate * t / duration), 2 * rate
    if shape == "bursty":
        # Periods of 60 s: bursts (burst_share of the time) at burst_factor x the base; base set so
        # the mean stays `rate`.
        period = min(60.0, duration)
        base = rate / (burst_share * burst_factor + (1 - burst_share))
        hi = base * burst_factor
        return (lambda t: hi if (t % period) < burst_share * period else base), hi
    raise ValueError(f"unknown arrival shape {shape!r} ({', '.join(ARRIVALS)})")


def arrival_times(
    rng: random.Random,
    shape: str,
    rate: float,
    duration: float,
    count: int | None = None,
    burst_factor: float = 4.0,
    burst_share: float = 0.2,
) -> list[float]:
    """Non-homogeneous Poisson arrivals by thinning. With ``count``, arrivals are drawn until
    ``count`` (the duration then only shapes the rate)."""
    fn, peak = _rate_fn(shape, rate, duration, burst_factor, burst_share)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if count is None and t >= duration:
            break
        if count is not None and len(out) >= count:
            break
        if rng.random() * peak <= fn(t % duration if count is not None else t):
            out.append(t)
    return out


# -- generator -------------------------------------------------------------------------------------


def generate(
    *,
    mix: str = "tutorial-8.3",
    arrival: str = "poisson",
    rate: float = 20.0,
    duration: float = 60.0,
    count: int | None = None,
    seed: int = 1,
    tenants: str = DEFAULT_TENANTS,
    shared_share: float | None = None,
    prefix_groups: int | None = None,
    prefix_tokens: int | None = None,
    burst_factor: float = 4.0,
    burst_share: float = 0.2,
    model: str | None = None,
) -> Trace:
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r} ({', '.join(MIXES)})")
    d_share, d_groups, d_tokens = MIX_PREFIX_DEFAULTS.get(mix, (0.0, 4, 512))
    shared_share = d_share if shared_share is None else shared_share
    prefix_groups = d_groups if prefix_groups is None else prefix_groups
    prefix_tokens = d_tokens if prefix_tokens is None else prefix_tokens
    classes = MIXES[mix]
    tenant_list = parse_tenants(tenants)
    rng = random.Random(seed)
    times = arrival_times(rng, arrival, rate, duration, count, burst_factor, burst_share)
    cls_weights = [c.share for c in classes]
    ten_weights = [t.share for t in tenant_list]
    reqs: list[TraceRequest] = []
    width = max(6, len(str(len(times))))
    for i, t in enumerate(times):
        c = rng.choices(classes, cls_weights)[0]
        ten = rng.choices(tenant_list, ten_weights)[0]
        p = rng.randint(*c.prompt)
        o = rng.randint(*c.output)
        group: str | None = None
        ptoks = 0
        if shared_share > 0 and prefix_groups > 0 and rng.random() < shared_share:
            # Zipf-like popularity: group g with weight 1/(g+1).
            g = rng.choices(range(prefix_groups), [1 / (k + 1) for k in range(prefix_groups)])[0]
            group = f"sys{g}"
            ptoks = prefix_tokens
            p += ptoks  # the shared prefix comes before the request's own prompt
        reqs.append(
            TraceRequest(
                t=t,
                id=f"r{i:0{width}d}",
                prompt_tokens=p,
                output_tokens=o,
                tenant=ten.name,
                priority=ten.priority,
                slo_class=c.slo_class,
                cls=c.name,
                model=model,
                prefix_group=group,
                prefix_tokens=ptoks,
            )
        )
    header = {
        "trace_version": TRACE_VERSION,
        "seed": seed,
        "generator": GENERATOR,
        "params": {
            "mix": mix,
            "classes": [_class_json(c) for c in classes],
            "arrival": arrival,
            "rate": rate,
            "duration": duration if count is None else (reqs[-1].t if reqs else 0.0),
            "count": len(reqs),
            "tenants": tenants,
            "shared_share": shared_share,
            "prefix_groups": prefix_groups,
            "prefix_tokens": prefix_tokens,
            "burst_factor": burst_factor,
            "burst_share": burst_share,
            "model": model,
        },
    }
    return Trace(header, reqs)


def _class_json(c: RequestClass) -> dict[str, Any]:
    return {
        "name": c.name,
        "share": c.share,
        "prompt": list(c.prompt),
        "output": list(c.output),
        "slo_class": c.slo_class,
    }


def dump(trace: Trace, out: TextIO) -> None:
    out.write(json.dumps(trace.header, separators=(",", ":"), sort_keys=True) + "\n")
    for r in trace.requests:
        out.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")


def save(trace: Trace, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        dump(trace, f)


def parse_lines(lines: Iterable[str]) -> Trace:
    header: dict[str, Any] | None = None
    reqs: list[TraceRequest] = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        obj = json.loads(line)
        if header is None and "trace_version" in obj:
            header = obj
            continue
        try:
            reqs.append(TraceRequest.from_json(obj))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"trace line {n}: {exc}") from exc
    if header is None:
        header = {"trace_version": TRACE_VERSION, "seed": None, "generator": "unknown", "params": {}}
    reqs.sort(key=lambda r: r.t)
    return Trace(header, reqs)


def load(path: str | Path) -> Trace:
    with open(path, encoding="utf-8") as f:
        return parse_lines(f)


def describe(trace: Trace) -> dict[str, Any]:
    reqs = trace.requests
    n = len(reqs)
    by_class: dict[str, int] = {}
    for r in reqs:
        by_class[r.cls] = by_class.get(r.cls, 0) + 1
    shared = sum(1 for r in reqs if r.prefix_group)
    return {
        "requests": n,
        "duration_s": trace.duration,
        "rate_rps": n / trace.duration if trace.duration else None,
        "prompt_tokens": sum(r.prompt_tokens for r in reqs),
        "output_tokens": sum(r.output_tokens for r in reqs),
        "by_class": by_class,
        "shared_prefix_share": shared / n if n else 0.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmlab_twin.trace", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="generate a seeded trace")
    g.add_argument("--mix", default="tutorial-8.3", choices=sorted(MIXES))
    g.add_argument("--arrival", default="poisson", choices=ARRIVALS)
    g.add_argument("--rate", type=float, default=20.0, help="mean requests/s")
    g.add_argument("--duration", type=float, default=60.0, help="seconds")
    g.add_argument("--count", type=int, help="exactly this many requests (instead of --duration)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--tenants", default=DEFAULT_TENANTS, help="name:share:priority,... (lower priority first)")
    g.add_argument("--shared-share", type=float, help="share of requests starting with a shared prefix")
    g.add_argument("--prefix-groups", type=int, help="number of distinct shared prefixes")
    g.add_argument("--prefix-tokens", type=int, help="tokens of each shared prefix")
    g.add_argument("--burst-factor", type=float, default=4.0)
    g.add_argument("--burst-share", type=float, default=0.2)
    g.add_argument("--model")
    g.add_argument("-o", "--out", required=True, help="output .jsonl ('-' for stdout)")
    i = sub.add_parser("info", help="summarise a trace")
    i.add_argument("trace")
    args = p.parse_args(argv)
    if args.cmd == "gen":
        trace = generate(
            mix=args.mix,
            arrival=args.arrival,
            rate=args.rate,
            duration=args.duration,
            count=args.count,
            seed=args.seed,
            tenants=args.tenants,
            shared_share=args.shared_share,
            prefix_groups=args.prefix_groups,
            prefix_tokens=args.prefix_tokens,
            burst_factor=args.burst_factor,
            burst_share=args.burst_share,
            model=args.model,
        )
        if args.out == "-":
            dump(trace, sys.stdout)
        else:
            save(trace, args.out)
            sys.stderr.write(json.dumps(describe(trace)) + "\n")
        return 0
    sys.stdout.write(json.dumps(describe(load(args.trace)), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
