"""One alert end to end: a malformed event → accounting dead-letters it → real Prometheus scrapes
accounting's /metrics and evaluates infra/prometheus/rules/alerts.yml → LLMLabDeadLetters fires →
real Alertmanager → a webhook POST to a server of the test.

The rules are a copy of alerts.yml in which ONLY the `for:` of LLMLabDeadLetters is rewritten, to
0s, so the test does not wait out its minute; expression, labels and annotations are the file's.
Prometheus scrapes and evaluates every second; Alertmanager groups with a 1 s group_wait. The
binaries are Debian's prometheus and prometheus-alertmanager (`make prom-tools`), started by
:mod:`llmlab_testkit.prom`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.e2e import LLAMA
from llmlab_testkit.procs import Stack, url
from llmlab_testkit.prom import binaries_missing, start_alertmanager, start_prometheus

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
ALERTS_FILE = REPO / "infra" / "prometheus" / "rules" / "alerts.yml"
ALERT = "LLMLabDeadLetters"
FIRING_WITHIN_S = 60.0


class Webhook:
    """An HTTP server collecting Alertmanager's webhook POSTs (JSON bodies)."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hook.lock:
                    hook.posts.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        with self.lock:
            return [
                a
                for post in self.posts
                for a in post.get("alerts", [])
                if a.get("labels", {}).get("alertname") == alertname and a.get("status") == "firing"
            ]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    hook.thread.start()
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()


def rules_copy(dst: Path) -> Path:
    """alerts.yml with only LLMLabDeadLetters' `for:` set to 0s."""
    doc = yaml.safe_load(ALERTS_FILE.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert "for" in rule, f"{ALERT} has no `for:` to shorten"
    rule["for"] = "0s"
    path = dst / "alerts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def test_dead_letter_alert_reaches_the_webhook(stack: Stack, webhook: Webhook, tmp_path: Path) -> None:
    """Catches: the dead-letter alert reading a metric, a label value or a name that accounting
    does not export; an expression blind to the counter's first sample (increase() alone: the
    kind="dead_letter" series appears, at 1, with the first dead letter); a rule file Prometheus
    does not load; alert labels and annotations Alertmanager does not route to a receiver."""
    if missing := binaries_missing():
        pytest.fail(f"{missing} missing: `make test` installs them (scripts/ensure-prometheus.sh)")
    acc = stack.accounting(env={"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2"})
    acc_port: int = acc.port  # type: ignore[attr-defined]
    alertmanager = start_alertmanager(f"http://127.0.0.1:{webhook.port}/alerts")
    prometheus = None
    try:
        prometheus = start_prometheus(
            {"accounting": [f"127.0.0.1:{acc_port}"]},
            rule_files=[rules_copy(tmp_path)],
            alertmanager=alertmanager.address,
        )
        prom_api = prometheus.url + "/api/v1"
        async with httpx.AsyncClient(timeout=5) as http:

            async def query(q: str) -> list[dict[str, Any]]:
                r = await http.get(f"{prom_api}/query", params={"query": q})
                r.raise_for_status()
                return r.json()["data"]["result"]

            # Prometheus sees accounting before the dead letter, as it would in production.
            deadline = time.monotonic() + 20
            while not await query('up{job="accounting"} == 1'):
                assert time.monotonic() < deadline, f"Prometheus never scraped accounting:\n{prometheus.process.tail()}"
                await asyncio.sleep(0.2)
            rules = (await http.get(f"{prom_api}/rules")).json()["data"]["groups"]
            assert ALERT in {r["name"] for g in rules for r in g["rules"]}, rules

            nc = await connect(stack.nats_url, "test-alerting")
            try:  # no service can parse this: accounting dead-letters it
                await nc.jetstream().publish(Topology(stack.namespace).attempt_event_subject, b'{"not": "an event"}')
            finally:
                await nc.close()

            deadline = time.monotonic() + FIRING_WITHIN_S
            while not (fired := webhook.firing(ALERT)):
                if time.monotonic() > deadline:
                    state = {
                        "dead_letter_series": await query('llmlab_accounting_events_total{kind="dead_letter"}'),
                        "alerts": (await http.get(f"{prom_api}/alerts")).json()["data"]["alerts"],
                        "webhook_posts": webhook.posts,
                    }
                    pytest.fail(
                        f"no firing {ALERT} at the webhook within {FIRING_WITHIN_S:.0f}s: {json.dumps(state)[:3000]}\n"
                        f"prometheus log:\n{prometheus.process.tail(15)}\n"
                        f"alertmanager log:\n{alertmanager.process.tail(15)}"
                    )
                await asyncio.sleep(0.2)

        alert = fired[0]
        assert alert["labels"]["severity"] == "warning"
        assert alert["labels"]["job"] == "accounting"
        assert alert["labels"]["kind"] == "dead_letter"
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}
        assert alert["annotations"]["summary"] == f"Accounting dead-lettered events on 127.0.0.1:{acc_port}"
    finally:
        if prometheus is not None:
            prometheus.stop()
        alertmanager.stop()


def _alert_expr(name: str) -> str:
    doc = yaml.safe_load(ALERTS_FILE.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name]
    return str(rule["expr"])


async def test_no_ready_worker_alert_sees_a_pool_that_never_sent_a_heartbeat(stack: Stack) -> None:
    """Catches: a gateway that exports live workers only for pools it has heard a heartbeat from,
    so that a gateway (re)started while a pool is down has no series for it and
    LLMLabPoolNoReadyWorker never fires. Only the gateway is scraped (no router: the rule's
    router-side arm cannot help), and only gpu-vllm has a worker; the catalog's other pools must
    come out of the alert's own expression on a live Prometheus."""
    if missing := binaries_missing():
        pytest.fail(f"{missing} missing: `make test` installs them (scripts/ensure-prometheus.sh)")
    catalog = yaml.safe_load((REPO / "configs" / "catalog.yaml").read_text())
    pools = {d["pool"] for d in catalog["deployments"]}
    assert "gpu-vllm" in pools and len(pools) > 1
    stack.worker("vllm", "gpu-vllm", url(stack.sim("vllm", LLAMA)))
    gw = stack.gateway()
    prometheus = start_prometheus({"gateway": [f"127.0.0.1:{gw.port}"]})  # type: ignore[attr-defined]
    try:
        prometheus.wait_scraped(["gateway"])
        expr = _alert_expr("LLMLabPoolNoReadyWorker")
        deadline = time.monotonic() + 15  # the gauge is set every 0.1 s, scraped every 1 s
        while True:
            down = {s["metric"]["pool"] for s in prometheus.query(expr)["result"]}
            if down == pools - {"gpu-vllm"}:
                break
            assert time.monotonic() < deadline, f"alert expression gave {down}, want {pools - {'gpu-vllm'}}"
            await asyncio.sleep(0.5)
    finally:
        prometheus.stop()
