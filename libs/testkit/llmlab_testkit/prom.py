"""A real Prometheus (and Alertmanager) for tests: Debian's binaries (``scripts/ensure-prometheus.sh``),
scraping the stack's processes every second with the project's rule files, each run in its own
temporary directory and ports."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llmlab_testkit.procs import ManagedProcess, free_port

REPO = Path(__file__).resolve().parents[3]
RULES_DIR = REPO / "infra" / "prometheus" / "rules"


def binaries_missing() -> list[str]:
    return [b for b in ("prometheus", "promtool", "prometheus-alertmanager", "amtool") if shutil.which(b) is None]


@dataclass
class Prometheus:
    process: ManagedProcess
    url: str
    workdir: Path

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """The ``data`` of an instant query (``resultType`` and ``result``); a query error raises."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = httpx.get(self.url + "/api/v1/query", params=params, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {r.status_code} {body.get('error', r.text)}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1.0) -> dict[str, Any]:
        """The ``data`` of a range query (what a time-series panel reads); a query error raises."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        r = httpx.get(self.url + "/api/v1/query_range", params=params, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"range query {expr!r} failed: {r.status_code} {body.get('error', r.text)}")
        return body["data"]

    def value(self, expr: str) -> float | None:
        """One number: the single sample of a vector or scalar result, None when it is empty."""
        data = self.query(expr)
        if data["resultType"] == "scalar":
            return float(data["result"][1])
        result = data["result"]
        if not result:
            return None
        if len(result) != 1:
            raise AssertionError(f"{expr!r}: {len(result)} series, expected one: {result}")
        return float(result[0]["value"][1])

    def rules(self) -> list[dict[str, Any]]:
        groups = httpx.get(self.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    def wait_scraped(self, jobs: Sequence[str], timeout: float = 30.0) -> None:
        """Until every target of ``jobs`` has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        while True:
            up = self.query("up")["result"]
            ok = {s["metric"]["job"] for s in up if s["value"][1] == "1"}
            if set(jobs) <= ok and all(s["value"][1] == "1" for s in up):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"targets not up after {timeout}s: {json.dumps(up)[:2000]}")
            time.sleep(0.3)

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_prometheus(
    targets: Mapping[str, Sequence[str]],
    *,
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
    interval_s: float = 1.0,
) -> Prometheus:
    """Prometheus scraping ``targets`` (job → ``host:port`` list) every ``interval_s``, evaluating
    ``rule_files`` on the same period."""
    workdir = Path(tempfile.mkdtemp(prefix="llmlab-prom-"))
    port = free_port()
    iv = f"{round(interval_s * 1000)}ms"  # Prometheus durations take no fractions ("0.5s" is refused)
    config: dict[str, Any] = {
        "global": {"scrape_interval": iv, "scrape_timeout": iv, "evaluation_interval": iv},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(t)}]} for job, t in targets.items()],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    proc = _start(
        port,
        "prometheus",
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
    )
    return Prometheus(proc, f"http://127.0.0.1:{port}", workdir)


def _start(port: int, binary: str, *args: str) -> ManagedProcess:
    """Start a Prometheus-family binary on ``port`` and wait until it says it is ready."""
    proc = ManagedProcess(
        binary,
        [binary, *args, f"--web.listen-address=127.0.0.1:{port}"],
        {},
        ready_url=f"http://127.0.0.1:{port}/-/ready",
    ).start()
    try:
        proc.wait_ready(30)
    except BaseException:
        proc.stop()
        raise
    return proc


@dataclass
class Alertmanager:
    process: ManagedProcess
    address: str  # host:port, for Prometheus' alerting config
    workdir: Path

    def stop(self) -> None:
        self.process.stop(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_alertmanager(webhook_url: str) -> Alertmanager:
    """An Alertmanager that sends every alert to ``webhook_url`` at once (group_wait 1 s)."""
    workdir = Path(tempfile.mkdtemp(prefix="llmlab-am-"))
    port = free_port()
    config = {
        "route": {
            "receiver": "test",
            "group_by": ["alertname"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "test", "webhook_configs": [{"url": webhook_url}]}],
    }
    (workdir / "alertmanager.yml").write_text(json.dumps(config))
    proc = _start(
        port,
        "prometheus-alertmanager",
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        "--cluster.listen-address=",
    )
    return Alertmanager(proc, f"127.0.0.1:{port}", workdir)
