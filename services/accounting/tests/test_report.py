"""Every reports/sql file runs on a chdb store with data and gives tables and plots; the query
endpoint is read-only and admin-only."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from llmlab_accounting.admin_api import check_read_only, mount_admin_api
from llmlab_accounting.domain import attempt_row, request_row
from llmlab_accounting.metrics import AccountingMetrics
from llmlab_accounting.report import main as report_main
from llmlab_accounting.service import AccountingService, Batch
from llmlab_accounting.settings import DEV_ADMIN_KEY, AccountingSettings
from llmlab_accounting.store import ClickHouseStore
from llmlab_common.catalog import Catalog
from llmlab_common.errors import InvalidRequest
from llmlab_common.http import install_error_handlers
from llmlab_common.messages import AttemptEvent, RequestEvent
from llmlab_common.metrics import Metrics

pytestmark = pytest.mark.integration


def seed(
    store: ClickHouseStore, catalog: Catalog, attempt: Callable[..., AttemptEvent], refusal: Callable[..., RequestEvent]
) -> None:
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    now = time.time()
    events = [attempt(f"r{i}", 1, "completed", prompt=50 + i, completion=20, ended_at=now - 30 + i) for i in range(20)]
    events += [attempt("r20", 1, "worker_lost", "gateway"), attempt("r20", 2, "completed", ended_at=now - 5)]
    store.query("SELECT 1")
    svc.insert(Batch.of([attempt_row(e, catalog) for e in events], [request_row(refusal("refused"), catalog)]))
    svc.attribute_period(now - 60, now)


def test_every_report_runs_and_plots(
    tmp_path: Path,
    catalog: Catalog,
    attempt_factory: Callable[..., AttemptEvent],
    refusal_factory: Callable[..., RequestEvent],
) -> None:
    data = tmp_path / "chdb"
    store = ClickHouseStore.open(data_dir=data)
    store.ensure_schema()
    try:
        seed(store, catalog, attempt_factory, refusal_factory)
    finally:
        store.close()
    out = tmp_path / "out"
    assert report_main(["--data-dir", str(data), "--out", str(out), "--url", ""]) == 0
    sql_files = sorted((Path(__file__).resolve().parents[3] / "reports" / "sql").glob("*.sql"))
    assert len(sql_files) >= 8
    for f in sql_files:
        lines = (out / f"{f.stem}.csv").read_text().splitlines()
        assert len(lines) >= 2, f"{f.name} returned no rows"
        if "-- plot:" in f.read_text():
            assert (out / f"{f.stem}.png").stat().st_size > 1000
    assert "cost_by_model_day" in (out / "README.md").read_text()


def test_read_only_check() -> None:
    assert check_read_only("-- c\nSELECT 1;") == "SELECT 1"
    assert check_read_only("WITH x AS (SELECT 1) SELECT * FROM x")
    # Keywords inside quoted text are text: a model named after a keyword is still readable.
    assert check_read_only("SELECT count() FROM attempts WHERE model = 'INSERT; INTO OUTFILE'")
    for bad in (
        "DROP TABLE attempts_raw",
        "SELECT 1; DROP TABLE x",
        "INSERT INTO t VALUES (1)",
        "WITH 1 AS x INSERT INTO attempts SELECT * FROM attempts LIMIT 0",
        "SELECT 1 INTO OUTFILE '/tmp/x'",
        "SELECT 1 into  /* c */ outfile '/tmp/x'",
    ):
        with pytest.raises(InvalidRequest):
            check_read_only(bad)


def _admin_client(store: ClickHouseStore, settings: AccountingSettings) -> TestClient:
    from fastapi import FastAPI

    app = FastAPI()
    install_error_handlers(app, "accounting service")
    mount_admin_api(app, store, settings, lambda _t0, _t1: (0.0, 0.0))
    return TestClient(app)


def test_no_admin_query_stops_ingest_or_writes_anything(
    tmp_path: Path, catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """Catches: an admin query that leaves the ingest session read-only (confirmed on dd4f538:
    'WITH 1 AS x INSERT ...' passed the SELECT/WITH check, clickhouse-connect ran it as an insert
    with readonly=1 SET on the one session, and every later insert failed until a restart), and a
    query that writes a file, reads the host's files or the network, lifts its own limits or
    exhausts memory. After each refused statement the service still ingests, and the endpoint
    still answers."""
    store = ClickHouseStore.open(data_dir=tmp_path / "chdb")
    store.ensure_schema()
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    outfile = tmp_path / "out.txt"
    settings = AccountingSettings(query_max_rows=100, query_max_memory_bytes=64 << 20)
    hostile = {
        "WITH 1 AS x INSERT INTO attempts SELECT * FROM attempts LIMIT 0": "read_only",
        f"SELECT 1 INTO OUTFILE '{outfile}'": "read_only",
        "SELECT * FROM file('/etc/passwd', 'LineAsString')": "query_failed",
        "SELECT * FROM url('http://127.0.0.1:9/x', 'LineAsString')": "query_failed",
        "SELECT number FROM numbers(10) SETTINGS max_result_rows = 0": "query_failed",
        "SELECT number FROM numbers(10) SETTINGS readonly = 0": "query_failed",
        "SELECT number FROM numbers(1000)": "query_failed",  # past query_max_rows
        "SELECT groupArray(number) FROM numbers(100000000)": "query_failed",  # past max_memory
    }
    ok = {"Authorization": f"Bearer {DEV_ADMIN_KEY}"}
    count = {"sql": "SELECT count() FROM attempts_raw"}

    def ingest(rid: str, after: str) -> None:
        try:
            svc.insert(Batch.of([attempt_row(attempt_factory(rid), catalog)], []))
        except Exception as exc:
            pytest.fail(f"ingest stopped after {after!r}: {exc}")

    try:
        c = _admin_client(store, settings)
        for i, (sql, code) in enumerate(hostile.items()):
            r = c.post("/admin/v1/query", json={"sql": sql}, headers=ok)
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (sql, r.text)
            ingest(f"r{i}", sql)
            r = c.post("/admin/v1/query", json=count, headers=ok)
            assert r.status_code == 200 and r.json()["rows"] == [[i + 1]], (sql, r.text)
        assert not outfile.exists()
        # The real guard, past the statement check: the statement that broke dd4f538, sent
        # straight to the store, fails on its own client and the ingest client still inserts.
        with pytest.raises(Exception, match=r"(?i)readonly"):
            store.query_isolated(next(iter(hostile)), max_rows=10, timeout_s=5, max_memory_bytes=64 << 20)
        ingest("after", "the statement sent to the store")
        assert store.query("SELECT count() FROM attempts_raw").rows == [[len(hostile) + 1]]
        # System tables are readable: the endpoint is root-only (the admin key), not tenant-scoped.
        r = c.post("/admin/v1/query", json={"sql": "SELECT count() > 0 FROM system.tables"}, headers=ok)
        assert r.status_code == 200 and r.json()["rows"] == [[True]]
    finally:
        store.close()


def test_query_endpoint_needs_the_admin_key_and_refuses_writes(tmp_path: Path) -> None:
    from fastapi import FastAPI

    store = ClickHouseStore.open(data_dir=tmp_path / "chdb")
    store.ensure_schema()
    try:
        app = FastAPI()
        install_error_handlers(app, "accounting service")
        mount_admin_api(app, store, AccountingSettings(), lambda _t0, _t1: (0.0, 0.0))
        c = TestClient(app)
        body = {"sql": "SELECT count() AS n FROM attempts"}
        assert c.post("/admin/v1/query", json=body).status_code == 401
        assert c.post("/admin/v1/query", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        # Authenticated before the body is parsed (dd4f538 answered a bad body before a bad key).
        r = c.post("/admin/v1/query", content=b"{not json", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        ok = {"Authorization": f"Bearer {DEV_ADMIN_KEY}"}
        r = c.post("/admin/v1/query", json=body, headers=ok)
        assert r.status_code == 200 and r.json()["rows"] == [[0]] and r.json()["columns"] == ["n"]
        # An aggregate over no rows is nan in ClickHouse: null in JSON, never a 500.
        r = c.post("/admin/v1/query", json={"sql": "SELECT quantile(0.5)(e2e_s) AS q FROM attempts"}, headers=ok)
        assert r.status_code == 200 and r.json()["rows"] == [[None]]
        r = c.post("/admin/v1/query", json={"sql": "ALTER TABLE attempts_raw DELETE WHERE 1"}, headers=ok)
        assert r.status_code == 400 and r.json()["error"]["code"] == "read_only"
        # ClickHouse's own readonly=1 guard, past the statement check
        r = c.post("/admin/v1/query", json={"sql": "SELECT * FROM system.one SETTINGS readonly = 0"}, headers=ok)
        assert r.status_code == 400
    finally:
        store.close()


def test_attribute_endpoint_runs_every_aligned_period_up_to_now() -> None:
    """Catches: a demo or operator asking for attribution of a window and getting the wrong
    periods (misaligned ones would never be replaced by the loop's later runs), a future period,
    or the endpoint open without the admin key."""
    from fastapi import FastAPI

    calls: list[tuple[float, float]] = []

    def attribute(t0: float, t1: float) -> tuple[float, float]:
        calls.append((t0, t1))
        return 1.0, 0.5

    app = FastAPI()
    install_error_handlers(app, "accounting service")
    settings = AccountingSettings(attribution_period_s=60)
    mount_admin_api(app, None, settings, attribute)  # type: ignore[arg-type]
    c = TestClient(app)
    ok = {"Authorization": f"Bearer {DEV_ADMIN_KEY}"}
    assert c.post("/admin/v1/attribute", json={"start": 1000}).status_code == 401
    r = c.post("/admin/v1/attribute", json={"start": 1_000_030, "end": 1_000_150}, headers=ok)
    assert r.status_code == 200, r.text
    # Periods start at multiples of 60: 1,000,030 lies in [1,000,020, 1,000,080); the last is clipped.
    assert calls == [(1_000_020, 1_000_080), (1_000_080, 1_000_140), (1_000_140, 1_000_150)]
    assert r.json() == {"periods": 3, "gpu_cost_usd": 3.0, "attributed_usd": 1.5}
    calls.clear()
    now = time.time()
    r = c.post("/admin/v1/attribute", json={"start": now - 10, "end": now + 3600}, headers=ok)
    assert r.status_code == 200 and calls and max(t1 for _, t1 in calls) <= time.time()
    r = c.post("/admin/v1/attribute", json={"start": 1, "end": 10**9}, headers=ok)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value"
    # Not a number, though Python would make one of it: refused as the document says, nothing attributed.
    calls.clear()
    for bad in ({"start": 1_000_030, "end": True}, {"start": True}, {"start": "1000030"}):
        r = c.post("/admin/v1/attribute", json=bad, headers=ok)
        assert r.status_code in (400, 422) and "error" in r.json(), (bad, r.text)
    assert calls == []


def test_dev_admin_key_is_refused_in_prod(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmlab_accounting.settings import DEV_ADMIN_KEY_SHA256

    monkeypatch.delenv("LLMLAB_ENV", raising=False)  # unset is prod
    with pytest.raises(ValueError, match="unauthenticated NATS"):
        AccountingSettings()
    monkeypatch.setenv("LLMLAB_NATS_USER", "accounting")  # authenticated: now the admin key
    with pytest.raises(ValueError, match="ADMIN_KEY_SHA256"):
        AccountingSettings()
    monkeypatch.setenv("LLMLAB_ENV", "prod")
    # The same hash in upper case is the same key (it passed the check on dd4f538).
    monkeypatch.setenv("LLMLAB_ACCOUNTING_ADMIN_KEY_SHA256", DEV_ADMIN_KEY_SHA256.upper())
    with pytest.raises(ValueError, match="ADMIN_KEY_SHA256"):
        AccountingSettings()
