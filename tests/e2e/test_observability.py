"""Observability on a live Prometheus: the whole stack (two simulated engines, two workers,
budget, router, gateway with budget auth, accounting) under a mixed load, scraped every second
by Debian's Prometheus with the project's rules. Then:

* every service's exposition stays inside the label allow-list and the series bound;
* every recording rule returns data, every alert expression evaluates, and every dashboard
  panel's query returns data of the shape the panel expects;
* the dashboard figures agree with the raw rows in ClickHouse: request, token and error counts
  exactly, TTFT p95 within one histogram bucket, list cost within 1%.

One stack and one load run serve every test of the module (the load is what they all read)."""

from __future__ import annotations

import asyncio
import bisect
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import yaml
from llmlab_common.metrics import LATENCY_BUCKETS, check_exposition
from llmlab_testkit.budget import DEV_ADMIN_KEY, BudgetAdmin
from llmlab_testkit.e2e import LLAMA, QWEN, client
from llmlab_testkit.e2e import accounting_sql as sql
from llmlab_testkit.procs import ManagedProcess, Stack, unique_namespace, url
from llmlab_testkit.prom import RULES_DIR, Prometheus, binaries_missing, start_prometheus

from tests.e2e.test_accounting import list_prices

if TYPE_CHECKING:
    from llmlab_lab.dashboards.spec import PanelQuery

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
STREAMED, UNARY, REFUSED, UNKNOWN_MODEL, BAD_KEY = 60, 30, 8, 4, 3
ATTRIBUTION_PERIOD_S = 3600  # LLMLAB_ACCOUNTING_ATTRIBUTION_PERIOD_S of the run below
ADMIN = {"Authorization": f"Bearer {DEV_ADMIN_KEY}"}


@dataclass
class Run:
    stack: Stack
    prom: Prometheus
    acc: ManagedProcess
    scraped: dict[str, ManagedProcess]  # job name -> process
    started: float  # wall clock: the stack started (the panels' range queries begin here)
    attributed_until: float  # the end the test gave GPU attribution (its last period ends there)


async def _load(gw: ManagedProcess, pro: str, free: str, tiny: str) -> None:
    sem = asyncio.Semaphore(24)

    async def streamed(i: int) -> None:
        async with sem:
            s = await client(gw, pro).chat.completions.create(
                model=LLAMA,
                messages=[{"role": "user", "content": f"hello {i}"}],
                max_tokens=8 + i % 9,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for _ in s:
                pass

    async def unary(i: int) -> None:
        async with sem:
            await client(gw, free).chat.completions.create(
                model=QWEN, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4 + i % 5
            )

    async def refused(key: str, model: str, exc: type[Exception]) -> None:
        with pytest.raises(exc):
            await client(gw, key).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "x"}], max_tokens=4
            )

    # One refusal of each kind first, then a scrape (every second): each error series is born
    # at 1, so the "in range" panel's increase() can miss at most that first one (the bound the
    # figures test holds it to); a series born with all its refusals would read 0.
    kinds = ((tiny, LLAMA, openai.RateLimitError), (pro, "no-such-model", openai.NotFoundError))
    kinds += (("sk-wrong", LLAMA, openai.AuthenticationError),)
    await asyncio.gather(*(refused(*kind) for kind in kinds))
    await asyncio.sleep(2.5)
    await asyncio.gather(
        *(streamed(i) for i in range(STREAMED)),
        *(unary(i) for i in range(UNARY)),
        *(refused(tiny, LLAMA, openai.RateLimitError) for _ in range(REFUSED - 1)),
        *(refused(pro, "no-such-model", openai.NotFoundError) for _ in range(UNKNOWN_MODEL - 1)),
        *(refused("sk-wrong", LLAMA, openai.AuthenticationError) for _ in range(BAD_KEY - 1)),
    )


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    if missing := binaries_missing():
        pytest.fail(f"{missing} missing: `make test` installs them (scripts/ensure-prometheus.sh)")
    stack = Stack(namespace=unique_namespace())
    prom = None
    try:
        sims = [
            stack.sim("vllm", LLAMA, ttft_ms=40, itl_ms=5, output_len=16),
            stack.sim("sglang", QWEN, ttft_ms=60, itl_ms=5, output_len=16),
        ]
        workers = [
            stack.worker("vllm", "gpu-vllm", url(sims[0]), heartbeat_s=1.0),
            stack.worker("sglang", "gpu-sglang", url(sims[1]), heartbeat_s=1.0),
        ]
        budget = stack.budget()
        admin = BudgetAdmin(url(budget))
        router = stack.router()
        gw = stack.gateway(auth="budget", router="service")
        # Hour-long attribution periods: the loop never attributes (and exports) another period
        # than the one the test asks for below, so the cost gauges are that period's.
        acc = stack.accounting(
            env={
                "LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2",
                "LLMLAB_ACCOUNTING_ATTRIBUTION_PERIOD_S": str(ATTRIBUTION_PERIOD_S),
            }
        )
        started = time.time()
        scraped = {"gateway": gw, "budget": budget, "router": router, "accounting": acc}
        targets: dict[str, list[str]] = {job: [f"127.0.0.1:{p.port}"] for job, p in scraped.items()}  # type: ignore[attr-defined]
        targets["workers"] = [f"127.0.0.1:{w.port}" for w in workers]  # type: ignore[attr-defined]
        targets["engines"] = [f"127.0.0.1:{s.port}" for s in sims]  # type: ignore[attr-defined]
        prom = start_prometheus(targets, rule_files=sorted(RULES_DIR.glob("*.yml")))
        prom.wait_scraped(list(targets))
        pro = admin.provision("pro").api_key
        # The free plan allows a user 8 requests in flight, released at settlement (asynchronous).
        free = admin.provision("free", {"user": {"max_concurrent": 64}}).api_key
        tiny = admin.provision("pro", {"key": {"daily_tokens": 50}}).api_key
        asyncio.run(_load(gw, pro, free, tiny))
        # Settled: every row in ClickHouse, and a scrape plus a rule evaluation after it.
        want = STREAMED + UNARY
        for _ in range(150):
            if sql(acc, "SELECT count() FROM attempts WHERE outcome = 'completed'") == [[want]]:
                break
            asyncio.run(asyncio.sleep(0.2))
        attributed_until = time.time()
        window = {"start": started, "end": attributed_until}
        r = httpx.post(url(acc) + "/admin/v1/attribute", json=window, headers=ADMIN, timeout=60)
        assert r.status_code == 200 and r.json()["periods"] >= 1, r.text
        asyncio.run(asyncio.sleep(3.5))
        yield Run(
            stack,
            prom,
            acc,
            {
                **scraped,
                "worker-vllm": workers[0],
                "worker-sglang": workers[1],
                "sim-vllm": sims[0],
                "sim-sglang": sims[1],
            },
            started,
            attributed_until,
        )
    finally:
        crashed = [p.name for p in stack.procs if p.crashed()]
        if prom is not None:
            prom.stop()
        stack.close()
        assert not crashed, f"crashed during the run: {crashed}"


def test_every_exposition_stays_inside_the_label_allow_list_and_series_bound(run: Run) -> None:
    """Catches: a request id, user, key or worker id as a label (unbounded series), or a family
    whose series grow with traffic past the stated bound."""
    problems = {}
    for name, p in run.scraped.items():
        found = check_exposition(httpx.get(url(p) + "/metrics", timeout=10).text)
        if found:
            problems[name] = found
    assert not problems, problems


# The docs a user reads for metric names: docs/, the README and every package's README.
DOCS = sorted(
    [
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
        *REPO.glob("*/README.md"),
        *REPO.glob("libs/*/README.md"),
        *REPO.glob("services/*/README.md"),
    ]
)
PACKAGES = {p.name for p in REPO.glob("*/*/llmlab_*") if p.is_dir()} | {p.name for p in REPO.glob("*/llmlab_*")}


def _families(exposition: str) -> set[str]:
    """The metric names an exposition serves, as a user would write them: counters with _total,
    histograms by family name and by their _bucket/_sum/_count series."""
    out: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            out.add(name)
            if kind == "counter":
                out.add(name + "_total")
            elif kind == "histogram":
                out |= {name + "_bucket", name + "_sum", name + "_count"}
    return out


def test_every_metric_the_docs_name_is_exposed(run: Run) -> None:
    """Catches: docs that name a metric no service exports (a renamed family, a typo such as
    llmlab_budget_reserved_vs_actual for budget_charged_to_reserved_ratio): a user's query or alert
    written from the docs would match nothing. A name ending in '_' names a family prefix."""
    exposed: set[str] = set()
    for p in run.scraped.values():
        exposed |= _families(httpx.get(url(p) + "/metrics", timeout=10).text)
    # worker-openai fronts local servers (llama.cpp, Ollama), not this simulated stack: its own families as
    # its /metrics renders them (its real-server tests scrape them from the process).
    from llmlab_worker_openai.adapter import BackendMetrics
    from prometheus_client import CollectorRegistry, generate_latest

    local = CollectorRegistry()
    for collector in BackendMetrics().collectors():
        local.register(collector)
    exposed |= _families(generate_latest(local).decode())
    cited = {
        (doc.relative_to(REPO).as_posix(), name)
        for doc in DOCS
        for name in re.findall(r"\bllmlab_[a-z0-9_]+", doc.read_text())
        if name not in PACKAGES
    }
    assert len(cited) > 50, "the docs name fewer metrics than they do: is the pattern still right?"
    missing = sorted(
        (doc, name)
        for doc, name in cited
        if not (name in exposed or (name.endswith("_") and any(e.startswith(name) for e in exposed)))
    )
    assert not missing, f"metrics named in the docs that no process exports: {missing}"


def _rules(kind: str) -> list[dict[str, object]]:
    doc = yaml.safe_load((RULES_DIR / f"{'recording' if kind == 'record' else 'alerts'}.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if kind in r]


def test_every_recording_rule_has_data_and_every_alert_expression_evaluates(run: Run) -> None:
    """Catches: a rule over a metric name or label that no service exposes (it evaluates to
    nothing, silently, forever)."""
    loaded = run.prom.rules()
    assert all(r["health"] == "ok" for r in loaded), [r for r in loaded if r["health"] != "ok"]
    empty = [r["record"] for r in _rules("record") if not run.prom.query(str(r["record"]))["result"]]
    assert not empty, f"recording rules without data after the load run: {empty}"
    for r in _rules("alert"):
        assert run.prom.query(str(r["expr"]))["resultType"] == "vector", r["alert"]
    firing = [
        a["labels"]["alertname"]
        for a in httpx.get(run.prom.url + "/api/v1/alerts").json()["data"]["alerts"]
        if a["state"] == "firing"
    ]
    assert not firing, f"alerts firing on a healthy run: {firing}"


# Panels whose series this run cannot produce: no retry or fallback happens, and the simulated
# engines are never short of KV cache. Each must say so in the spec (empty_because).
NOT_IN_THIS_RUN = {"Retries and fallbacks/s", "Preemptions/s"}


def test_every_dashboard_panel_returns_data_of_its_shape(run: Run) -> None:
    """Catches: a panel whose query names a metric, label or recording rule that does not exist
    (the panel would show 'No data' on every Grafana), and a panel that reads other than it is
    drawn: a time-series panel is evaluated as Grafana does, a range query over the run (a matrix
    with points), a stat panel as an instant query (a vector). Every panel the run exercises must
    have data; one that may be empty says why in the spec."""
    from llmlab_lab.dashboards import panels

    end = time.time()
    bad = []
    for panel in panels():
        if panel.title in NOT_IN_THIS_RUN:
            if not panel.empty_because:
                bad.append(f"{panel.title}: may be empty here but its spec does not say why (empty_because)")
            continue
        for expr in panel.queries:
            if panel.shape == "matrix":
                data = run.prom.query_range(expr, run.started, end, 1.0)
                points = sum(len(series["values"]) for series in data["result"])
            else:
                data = run.prom.query(expr)
                points = len(data["result"])
            if data["resultType"] != panel.shape or points == 0:
                bad.append(
                    f"{panel.dashboard} / {panel.row} / {panel.title}: {expr} -> {data['resultType']} "
                    f"(panel reads a {panel.shape}), {len(data['result'])} series, {points} points"
                )
    assert not bad, "\n".join(bad)


def _bucket(v: float) -> int:
    return bisect.bisect_left(LATENCY_BUCKETS, v)


def _panel(title: str, range_s: float) -> PanelQuery:
    from llmlab_lab.dashboards import panels

    (found,) = [q for q in panels(range_s=range_s) if q.title == title]
    return found


def test_dashboard_figures_agree_with_the_raw_rows_in_clickhouse(run: Run) -> None:
    """Catches: the gateway counting a request, a token or an error that accounting does not (or
    the reverse), a TTFT histogram fed another figure than the rows, token counters that do not
    add up to the list cost, and a Cost panel (its own expression) that disagrees with the GPU
    cost computed here from the catalog's prices and the raw rows: a wrong price or GPU count,
    idle time left out, an attempt counted twice. Raw tables (attempts_raw, requests_raw) are
    read, not the views.

    Counts come from the "in range" panels' own expressions, as Grafana evaluates a stat panel:
    an instant query at the range's end, here the gateway's last scrape, over a range that begins
    before Prometheus started. Prometheus's increase() is then exact for a series whose first
    sample is 0 (nothing to extrapolate at either end): the success and token series, which the
    gateway creates at 0. An error series is born at its first refusal, so increase() can only
    say it lies between (count - its first sample) and the count; the raw counter must match
    exactly."""
    p, acc = run.prom, run.acc
    end = p.value('timestamp(up{job="gateway"})')
    assert end is not None
    range_s = end - run.started + 1.0
    by_status = _panel("Requests in range by status", range_s)
    (expr,) = by_status.queries
    panel_status = {s["metric"]["status"]: float(s["value"][1]) for s in p.query(expr, at=end)["result"]}
    ok_ch = sql(acc, "SELECT uniqExact(request_id) FROM attempts_raw WHERE outcome = 'completed'")[0][0]
    raw_ok = sql(acc, "SELECT count() FROM attempts_raw WHERE outcome = 'completed' AND source = 'worker'")[0][0]
    print(f"completed requests: panel {panel_status.get('200')}, ClickHouse {ok_ch} (raw worker rows {raw_ok})")
    assert panel_status.get("200") == ok_ch == raw_ok == STREAMED + UNARY

    errors_ch = {str(s): n for s, n in sql(acc, "SELECT status, count() FROM requests_raw GROUP BY status")}
    assert errors_ch == {"429": REFUSED, "404": UNKNOWN_MODEL, "401": BAD_KEY}
    selector = f'llmlab_gateway_requests_total{{status=~"4.."}}[{round(range_s * 1000)}ms]'
    first = {}
    for series in p.query(selector, at=end)["result"]:
        status = series["metric"]["status"]
        first[status] = first.get(status, 0.0) + float(series["values"][0][1])
    for status, n in errors_ch.items():
        print(f"{status}: panel {panel_status.get(status)}, ClickHouse {n}, first sample {first[status]}")
        assert first[status] == 1.0, "the run's first refusal of each kind was not scraped alone"
        assert n - first[status] <= panel_status.get(status, 0.0) <= n, status
    errors_prom = {
        s["metric"]["status"]: int(float(s["value"][1]))
        for s in p.query('sum by (status) (llmlab_gateway_requests_total{status!="200"})', at=end)["result"]
    }
    assert errors_prom == errors_ch, errors_prom

    tokens = _panel("Tokens in range", range_s)
    for kind, expr in zip(("prompt", "completion"), tokens.queries, strict=True):
        panel_tokens = {s["metric"]["model"]: float(s["value"][1]) for s in p.query(expr, at=end)["result"]}
        ch_tokens = dict(
            sql(
                acc,
                f"SELECT model, sum({kind}_tokens) FROM attempts_raw WHERE outcome = 'completed' "
                "AND source = 'worker' GROUP BY model",
            )
        )
        print(f"{kind} tokens: panel {panel_tokens}, ClickHouse {ch_tokens}")
        assert len(ch_tokens) == 2
        assert {m: v for m, v in panel_tokens.items() if v} == ch_tokens, kind

    ttft_prom = p.value("histogram_quantile(0.95, sum by (le) (llmlab_gateway_ttft_seconds_bucket))")
    # The gateway's TTFT runs from acceptance to the first token: admission + NATS + the engine's.
    (ttft_ch,) = sql(
        acc,
        "SELECT quantileExact(0.95)(dispatch_offset_s + nats_queue_s + ttft_s) FROM attempts_raw "
        "WHERE outcome = 'completed' AND source = 'worker'",
    )[0]
    print(
        f"TTFT p95: Prometheus {ttft_prom:.4f} s (bucket {_bucket(ttft_prom)}), "
        f"ClickHouse {ttft_ch:.4f} s (bucket {_bucket(ttft_ch)})"
    )
    assert ttft_prom is not None and abs(_bucket(ttft_prom) - _bucket(ttft_ch)) <= 1

    cost_prom = 0.0
    for model in (LLAMA, QWEN):
        price_in, price_out = list_prices(model)
        tin = p.value(f'sum(llmlab_gateway_prompt_tokens_total{{model="{model}"}})') or 0.0
        tout = p.value(f'sum(llmlab_gateway_completion_tokens_total{{model="{model}"}})') or 0.0
        cost_prom += (tin * price_in + tout * price_out) / 1e6
    (cost_ch,) = sql(acc, "SELECT sum(list_cost_usd) FROM attempts")[0]
    print(f"list cost: Prometheus tokens x catalog prices ${cost_prom:.8f}, ClickHouse ${cost_ch:.8f}")
    assert cost_ch > 0 and abs(cost_prom - cost_ch) <= 0.01 * cost_ch

    # The Cost row, through its panels' own expressions, against a computation of ours from the
    # catalog's prices and the raw attempt rows (not from accounting's attribution). The gauges
    # show the last attributed period, [its aligned start, the end the test gave): every worker
    # with an attempt in it costs $/GPU-hour x gpu_count for the period's length, idle included.
    period_end = run.attributed_until
    period_start = (period_end // ATTRIBUTION_PERIOD_S) * ATTRIBUTION_PERIOD_S
    hours = (period_end - period_start) / 3600
    catalog = yaml.safe_load((REPO / "configs" / "catalog.yaml").read_text())
    gpu_price = {g["gpu"]: float(g["usd_per_hour"]) for g in catalog["prices"]["gpus"]}
    per_hour_of = {
        d["model"]: gpu_price[d["gpu"]] * int(d.get("gpu_count", 1))
        for d in catalog["deployments"]
        if d["id"] in ("llama-8b-vllm", "qwen3-32b-sglang")
    }
    attempts = {
        m: (workers, n, tokens)
        for m, workers, n, tokens in sql(
            acc,
            "SELECT model, uniqExact(worker_id), count(), sum(prompt_tokens + completion_tokens) FROM attempts_raw "
            "FINAL WHERE source = 'worker' AND started_at IS NOT NULL "
            f"AND toFloat64(started_at) < {period_end} AND toFloat64(ended_at) >= {period_start} GROUP BY model",
        )
    }
    want = {
        "GPU cost per hour": {m: per_hour_of[m] * w for m, (w, _, _) in attempts.items()},
        "GPU cost per request": {m: per_hour_of[m] * w * hours / n for m, (w, n, _) in attempts.items()},
        "GPU cost per 1M tokens": {m: per_hour_of[m] * w * hours / t * 1e6 for m, (w, _, t) in attempts.items()},
    }
    from llmlab_lab.dashboards import panels

    cost_panels = [q for q in panels() if q.row == "Cost" and q.title in want]
    assert sorted(q.title for q in cost_panels) == sorted(want), "a Cost panel was renamed or removed"
    for panel in cost_panels:
        (expr,) = panel.queries
        got = {s["metric"]["model"]: float(s["value"][1]) for s in p.query(expr)["result"]}
        print(f"{panel.title}: panel {got}, catalog x raw rows {want[panel.title]}")
        assert set(got) == set(want[panel.title]) == {LLAMA, QWEN}, panel.title
        for m, v in want[panel.title].items():
            assert got[m] == pytest.approx(v, rel=1e-6), (panel.title, m)
