"""The router's command line: ``explain`` recomputes a logged decision, ``check`` validates a catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_common.messages import RouteQuery
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_router.__main__ import main
from llmlab_routing.config import load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.records import DecisionLog
from llmlab_testkit.routing import heartbeat

pytestmark = pytest.mark.unit


def test_explain_recomputes_a_logged_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_path = tmp_path / "decisions.jsonl"
    dlog = DecisionLog(log_path)
    core = RouterCore(load_router_catalog(DEFAULT_CATALOG), decision_log=dlog)
    core.state.on_heartbeat(heartbeat("w0", "gpu-vllm", in_flight=0, interval=60, slots=4))
    core.route(RouteQuery(request_id="r5", model="auto", prompt_tokens=80, max_output_tokens=64, policy="cache-aware"))
    dlog.flush()
    assert main(["explain", "r5", "--log", str(log_path)]) == 0
    out = capsys.readouterr().out
    assert "IDENTICAL" in out and "cache-aware" in out
    assert main(["explain", "nope", "--log", str(log_path)]) == 1


def test_check_names_the_line_of_a_bad_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--catalog", str(DEFAULT_CATALOG)]) == 0
    bad = tmp_path / "catalog.yaml"
    bad.write_text(DEFAULT_CATALOG.read_text().replace("default_policy: multi-objective", "default_policy: nope"))
    assert main(["check", "--catalog", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "unknown policy 'nope'" in err
