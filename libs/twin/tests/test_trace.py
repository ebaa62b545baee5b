"""Trace format and the seeded generator."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from llmlab_twin import trace as tr

pytestmark = pytest.mark.unit


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    assert (
        tr.main(["gen", "--rate", "10", "--duration", "30", "--seed", "3", "--shared-share", "0.4", "-o", str(a)]) == 0
    )
    assert (
        tr.main(["gen", "--rate", "10", "--duration", "30", "--seed", "3", "--shared-share", "0.4", "-o", str(b)]) == 0
    )
    assert (
        tr.main(["gen", "--rate", "10", "--duration", "30", "--seed", "4", "--shared-share", "0.4", "-o", str(c)]) == 0
    )
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_round_trip_and_header() -> None:
    t = tr.generate(rate=5, duration=20, seed=1, shared_share=0.5)
    buf = io.StringIO()
    tr.dump(t, buf)
    back = tr.parse_lines(buf.getvalue().splitlines())
    assert back.header["trace_version"] == 1 and back.header["seed"] == 1
    assert back.header["generator"] == "llmlab_twin.trace"
    assert [r.to_json() for r in back.requests] == [r.to_json() for r in t.requests]
    first = back.requests[0].to_json()
    assert {"t", "id", "tenant", "priority", "slo_class", "prompt_tokens", "output_tokens"} <= set(first)


def test_tutorial_mix_shares_and_ranges() -> None:
    t = tr.generate(mix="tutorial-8.3", rate=100, duration=200, seed=2)
    n = len(t.requests)
    assert 19_000 < n < 21_000  # Poisson around 100/s x 200 s
    counts: dict[str, int] = {}
    for r in t.requests:
        counts[r.cls] = counts.get(r.cls, 0) + 1
        lo, hi = {"short": (64, 256), "chat": (256, 1024), "long_doc": (4096, 16384), "long_gen": (256, 1024)}[r.cls]
        assert lo <= r.prompt_tokens <= hi
        olo, ohi = {"short": (32, 128), "chat": (128, 512), "long_doc": (128, 512), "long_gen": (1024, 4096)}[r.cls]
        assert olo <= r.output_tokens <= ohi
    for cls, share in {"short": 0.5, "chat": 0.3, "long_doc": 0.15, "long_gen": 0.05}.items():
        assert counts[cls] / n == pytest.approx(share, abs=0.015)
    assert all(r.slo_class == ("batch" if r.cls == "long_gen" else "interactive") for r in t.requests)


def test_shared_prefix_share_and_tenants() -> None:
    t = tr.generate(rate=50, duration=100, seed=5, shared_share=0.3, prefix_groups=3, prefix_tokens=256)
    shared = [r for r in t.requests if r.prefix_group]
    assert len(shared) / len(t.requests) == pytest.approx(0.3, abs=0.03)
    assert {r.prefix_group for r in shared} == {"sys0", "sys1", "sys2"}
    assert all(r.prefix_tokens == 256 and r.prompt_tokens >= 256 + 64 for r in shared)
    prios = {r.tenant: r.priority for r in t.requests}
    assert prios == {"enterprise": 0, "pro": 1, "free": 2}


def test_section_3_3_mixes() -> None:
    shared = tr.generate(mix="shared-system", count=100, seed=1)
    assert len(shared.requests) == 100 and all(r.prefix_group == "sys0" for r in shared.requests)
    mixed = tr.generate(mix="longdoc-mix", count=1200, seed=1)
    docs = sum(1 for r in mixed.requests if r.cls == "long_doc")
    assert docs / 1200 == pytest.approx(20 / 120, abs=0.03)


@pytest.mark.parametrize("shape", ["poisson", "bursty", "diurnal", "ramp"])
def test_arrival_shapes_keep_the_mean_rate(shape: str) -> None:
    t = tr.generate(arrival=shape, rate=20, duration=600, seed=9)
    assert len(t.requests) / 600 == pytest.approx(20, rel=0.06)
    times = [r.t for r in t.requests]
    assert times == sorted(times) and times[-1] < 600


def test_ramp_and_diurnal_shapes() -> None:
    ramp = tr.generate(arrival="ramp", rate=20, duration=600, seed=1).requests
    first, second = sum(r.t < 300 for r in ramp), sum(r.t >= 300 for r in ramp)
    assert second > 2.5 * first  # linear ramp: 1/4 vs 3/4 of the arrivals
    bursty = tr.generate(arrival="bursty", rate=20, duration=600, seed=1).requests
    in_burst = sum((r.t % 60) < 12 for r in bursty)
    assert in_burst / len(bursty) == pytest.approx(0.5, abs=0.05)  # 20% of the time at 4x the base
