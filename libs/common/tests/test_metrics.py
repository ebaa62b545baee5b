"""The metric conventions of llmlab_common.metrics: the process and network collectors on every
registry, the label rules' checker, and the JetStream probe's summing (docs/observability.md)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from llmlab_common.jsprobe import (
    ConsumerLoad,
    PoolQueue,
    consumer_load,
    pending_by_durable,
    pending_by_pool,
    run_probe,
)
from llmlab_common.metrics import (
    ITL_BUCKETS,
    LABEL_ALLOW_LIST,
    MAX_SERIES_PER_FAMILY,
    HostOomCollector,
    Metrics,
    NetworkCollector,
    check_exposition,
    parse_net_dev,
)
from llmlab_common.subjects import Topology
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.unit

NET_DEV = "\n".join(
    [
        "Inter-|   Receive                                  |  Transmit",
        " face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier",
        "    lo:  333758 1107 0 0 0 0 0 0   333758 1107 0 0 0 0 0 0",
        "  eth0:    1000   10 0 0 0 0 0 0      200    2 0 0 0 0 0 0",
        "  eth1:      24    1 0 0 0 0 0 0        6    1 0 0 0 0 0 0",
    ]
)


def _text(m: Metrics) -> str:
    return m.render()[0].decode()


def test_every_registry_carries_the_process_and_network_collectors_once() -> None:
    """Catches: an app without process_* (no restart or RSS signal), two apps in one process
    clashing over the process collector, or a second Metrics on one registry doubling it."""
    a, b = Metrics("llmlab"), Metrics("llmlab")
    a.counter("x_total", "x")
    b.counter("x_total", "x")  # same names, own registries: no clash
    for m in (a, b):
        text = _text(m)
        assert "process_cpu_seconds_total" in text and "process_start_time_seconds" in text
        assert "process_resident_memory_bytes" in text and "process_open_fds" in text
    shared = CollectorRegistry()
    Metrics("llmlab", shared)
    Metrics("llmlab", shared)
    text = generate_latest(shared).decode()
    assert text.count("\nprocess_cpu_seconds_total ") == 1
    if Path("/proc/self/net/dev").exists():
        assert text.count("\nllmlab_process_network_receive_bytes_total ") == 1
        assert "llmlab_process_network_transmit_bytes_total" in text


def test_network_bytes_sum_every_interface_but_loopback_and_are_absent_without_the_file(tmp_path: Path) -> None:
    """Catches: loopback traffic (NATS, Redis on the host) counted as network bytes, transmit
    read from the wrong column, or a missing /proc file failing the whole scrape."""
    assert parse_net_dev(NET_DEV) == (1024, 206)
    assert parse_net_dev("") is None
    f = tmp_path / "dev"
    f.write_text(NET_DEV)
    fams = {m.name: m.samples[0].value for m in NetworkCollector("llmlab", f).collect()}
    assert fams == {"llmlab_process_network_receive_bytes": 1024, "llmlab_process_network_transmit_bytes": 206}
    assert list(NetworkCollector("llmlab", tmp_path / "missing").collect()) == []


def test_host_oom_kills_come_from_the_kernels_counter_and_are_absent_without_it(tmp_path: Path) -> None:
    """Catches: another vmstat line read as the OOM count (oom_kill_disable-like prefixes), or a
    kernel without the counter failing the scrape."""
    f = tmp_path / "vmstat"
    f.write_text("nr_free_pages 12\noom_kill_extra 9\noom_kill 3\npgfault 5\n")
    (fam,) = HostOomCollector("llmlab", f).collect()
    assert (fam.name, fam.samples[0].value) == ("llmlab_host_oom_kills", 3)
    f.write_text("nr_free_pages 12\n")
    assert list(HostOomCollector("llmlab", f).collect()) == []
    assert list(HostOomCollector("llmlab", tmp_path / "missing").collect()) == []


def test_check_exposition_flags_labels_outside_the_allow_list_and_oversized_families() -> None:
    """Catches: a per-user or per-request label slipping through, a family whose cardinality grew
    without bound, or a histogram's buckets miscounted as separate series."""
    m = Metrics("llmlab")
    h = m.histogram("ok_seconds", "fine", ("model", "plan"))
    for i in range(MAX_SERIES_PER_FAMILY):  # at the limit, many buckets each: still fine
        h.labels(f"m{i}", "free").observe(0.1)
    m.gauge("bad", "a request id as a label", ("pool", "request_id")).labels("p", "r1").set(1)
    big = m.counter("big_total", "too many", ("model",))
    for i in range(MAX_SERIES_PER_FAMILY + 1):
        big.labels(f"m{i}").inc()
    problems = check_exposition(_text(m))
    assert problems == [
        "llmlab_bad: label 'request_id' is not in LABEL_ALLOW_LIST",
        f"llmlab_big: {MAX_SERIES_PER_FAMILY + 1} series, more than {MAX_SERIES_PER_FAMILY}",
    ]


def test_allow_list_covers_the_labels_of_the_documented_families() -> None:
    """Catches: a documented label (or one of the engines' and DCGM's) missing from the list."""
    documented = {"endpoint", "model", "plan", "status", "code", "step", "why", "pool", "engine", "outcome"}
    documented |= {"policy", "deployment", "table", "consumer", "kind", "reason", "le"}
    documented |= {"model_name", "engine_type", "tp_rank", "pp_rank", "finished_reason"}
    documented |= {"gpu", "modelName", "simulated"}
    assert documented <= LABEL_ALLOW_LIST
    assert not {"user", "tenant", "key_id", "request_id", "worker_id", "prompt"} & LABEL_ALLOW_LIST


# -- the JetStream probe's summing -------------------------------------------------------------


def _info(name: str, filter_subject: str | None, pending: int, ack: int, durable: bool = True) -> Any:
    cfg = SimpleNamespace(durable_name=name if durable else None, filter_subject=filter_subject, filter_subjects=None)
    return SimpleNamespace(name=name, config=cfg, num_pending=pending, num_ack_pending=ack)


def test_request_subject_pool_parses_only_this_namespaces_request_subjects() -> None:
    topo = Topology("ns1")
    assert topo.request_subject_pool(topo.pool_subject("gpu-vllm")) == "gpu-vllm"
    assert topo.request_subject_pool(topo.worker_subject("gpu-vllm", "w-1")) == "gpu-vllm"
    assert topo.request_subject_pool(Topology("ns2").pool_subject("gpu-vllm")) is None
    assert topo.request_subject_pool(topo.attempt_event_subject) is None
    assert topo.request_subject_pool(topo.requests_wildcard) is None
    assert topo.request_subject_pool("ns1.req.pool.a.b") is None


def test_queue_backlog_sums_the_pool_consumer_and_its_workers_for_every_catalog_pool() -> None:
    """Catches: a worker's own consumer left out of its pool, a consumer counted under the wrong
    pool, a pool with no consumer missing (no zero series), or an unknown pool becoming a label."""
    topo = Topology("ns1")
    infos = [
        _info(topo.pool_consumer("a"), topo.pool_subject("a"), 3, 1),
        _info(topo.worker_consumer("w1"), topo.worker_subject("a", "w1"), 2, 4),
        _info(topo.worker_consumer("w2"), topo.worker_subject("b", "w2"), 5, 0),
        _info(topo.pool_consumer("gone"), topo.pool_subject("gone"), 9, 9),
        _info("stray", None, 7, 7),
    ]
    by_pool = pending_by_pool(topo, [consumer_load(i) for i in infos], ["a", "b", "c"])
    assert by_pool == {"a": PoolQueue(5, 5), "b": PoolQueue(5, 0), "c": PoolQueue(0, 0)}
    # What a gone worker's own consumer still holds no worker can take: left out when liveness is known.
    loads = [consumer_load(i) for i in infos]
    assert pending_by_pool(topo, loads, ["a", "b"], alive=lambda w: w != "w1") == {
        "a": PoolQueue(3, 1),
        "b": PoolQueue(5, 0),
    }
    assert topo.request_subject_worker(topo.worker_subject("a", "w1", 2)) == "w1"
    assert topo.request_subject_worker(topo.pool_subject("a")) is None


def test_events_consumer_backlog_keeps_only_durable_consumers() -> None:
    """Catches: ephemeral consumers (generated names) becoming label values."""
    loads = [
        consumer_load(_info("budget-settle", "ns.evt.>", 4, 0)),
        consumer_load(_info("accounting", None, 0, 2)),
        consumer_load(_info("Xy12ab", "ns.evt.attempt", 10, 0, durable=False)),
    ]
    assert pending_by_durable(loads) == {"budget-settle": 4, "accounting": 0}
    assert loads[0] == ConsumerLoad("budget-settle", True, ("ns.evt.>",), 4, 0)


async def test_a_failing_probe_is_retried_and_never_ends_the_task() -> None:
    """Catches: one NATS error (a restart, a timeout) ending the probe for the process's life."""
    calls: list[int] = []

    async def step() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("nats down")

    task = asyncio.create_task(run_probe(step, 0.001, "test"))
    while len(calls) < 4:
        await asyncio.sleep(0.005)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_bulk_histogram_renders_what_prometheus_clients_histogram_renders() -> None:
    """Catches: the bulk histogram's buckets off by one at a bound (``le`` is inclusive), not
    cumulative, or its sum and count apart from the observations."""
    times = [0.0, 0.001, 0.0035, 0.0135, 0.0135, 1.0, 4.0]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    bulk_m, ref_m = Metrics("llmlab"), Metrics("llmlab")
    bulk = bulk_m.bulk_histogram("gap_seconds", "gaps", {"pool": "p"}, ITL_BUCKETS)
    bulk.observe_gaps(times)
    bulk.observe_gaps([5.0])  # a single time: no gap
    bulk.observe(0.3)
    ref = ref_m.histogram("gap_seconds", "gaps", ("pool",), ITL_BUCKETS).labels("p")
    for g in [*gaps, 0.3]:
        ref.observe(g)

    def samples(m: Metrics) -> dict[str, float]:
        return {
            f"{s.name}{sorted(s.labels.items())}": s.value
            for fam in text_string_to_metric_families(m.render()[0].decode())
            if fam.name == "llmlab_gap_seconds"
            for s in fam.samples
            if not s.name.endswith("_created")
        }

    got, want = samples(bulk_m), samples(ref_m)
    assert got.keys() == want.keys()
    assert got == pytest.approx(want)


def _gc_pauses(m: Metrics) -> dict[str, tuple[float, float]]:
    """(count, sum) of the GC pause histogram by generation, from a scrape."""
    fams = {f.name: f for f in text_string_to_metric_families(m.render()[0].decode())}
    out: dict[str, list[float]] = {}
    for s in fams["llmlab_process_gc_pause_seconds"].samples:
        if s.name.endswith(("_count", "_sum")):
            out.setdefault(s.labels["generation"], [0.0, 0.0])[s.name.endswith("_sum")] = s.value
    return {g: (c, t) for g, (c, t) in out.items()}


def test_each_garbage_collection_is_timed_by_generation() -> None:
    """Catches: the GC pause histogram missing from a service's scrape, or a collection counted
    under the wrong generation or without its time."""
    import gc

    m = Metrics("llmlab", CollectorRegistry())
    before = _gc_pauses(m)
    assert set(before) == {"0", "1", "2"}
    garbage = [[i] for i in range(20_000)]  # a heap for the full collection to walk
    gc.collect(2)
    gc.collect(1)
    del garbage
    after = _gc_pauses(m)
    assert after["2"][0] == before["2"][0] + 1 and after["2"][1] > before["2"][1]
    assert after["1"][0] >= before["1"][0] + 1
    assert not check_exposition(m.render()[0].decode())


def test_start_up_objects_are_frozen_unless_turned_off() -> None:
    import gc

    from llmlab_common.runtime import freeze_startup_objects
    from llmlab_common.settings import InfraSettings

    threshold = gc.get_threshold()
    try:
        gc.unfreeze()
        assert freeze_startup_objects(InfraSettings(gc_freeze=False, gc_young_threshold=0)) == 0
        assert gc.get_threshold() == threshold  # 0: CPython's own
        assert freeze_startup_objects(InfraSettings(gc_freeze=True, gc_young_threshold=5000)) > 1000
        assert gc.get_threshold() == (5000, *threshold[1:])
        gc.unfreeze()
        freeze_startup_objects(InfraSettings())
        assert gc.get_threshold() == (50_000, *threshold[1:])  # the default: a burst's collections
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
