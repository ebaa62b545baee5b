"""The role permissions as written (unit); tests/e2e/test_nats_auth.py runs them on a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmlab_common.messages import Heartbeat
from llmlab_common.natsauth import ROLES, main, permissions_for, server_config
from llmlab_common.subjects import Topology
from pydantic import ValidationError

pytestmark = pytest.mark.unit
T = Topology("ns")


def _may(user: str, kind: str, subject: str) -> bool:
    """nats-server's matching: ``*`` one token, ``>`` the rest."""
    for pattern in permissions_for(T, user)[kind]:
        p, s = pattern.split("."), subject.split(".")
        if p[-1] == ">" and len(s) >= len(p) and all(a in ("*", b) for a, b in zip(p[:-1], s, strict=False)):
            return True
        if len(p) == len(s) and all(a in ("*", b) for a, b in zip(p, s, strict=True)):
            return True
    return False


@pytest.mark.parametrize(
    ("role", "kind", "subject", "allowed"),
    [
        ("budget", "subscribe", "ns.budget.reserve", True),
        ("worker", "subscribe", "ns.budget.reserve", False),
        ("gateway", "subscribe", "ns.budget.reserve", False),
        ("worker", "publish", "ns.tok.gw1.r1", True),
        ("gateway", "publish", "ns.tok.gw1.r1", False),
        ("gateway", "publish", "ns.req.pool.gpu", True),
        ("worker", "publish", "ns.req.pool.gpu", False),
        ("gateway", "publish", "ns.ctl.cancel", True),
        ("worker", "publish", "ns.ctl.cancel", False),
        ("gateway", "publish", "ns.evt.request", True),
        ("worker", "publish", "ns.evt.request", False),
        ("worker", "publish", "ns.hb.gpu.w1", True),
        ("router", "publish", "ns.hb.gpu.w1", False),
        ("worker", "publish", "$JS.API.STREAM.DELETE.NS_EVENTS", False),
        ("gateway", "publish", "$JS.API.STREAM.UPDATE.NS_EVENTS", False),
        ("admin", "publish", "$JS.API.STREAM.DELETE.NS_EVENTS", True),
        ("worker", "subscribe", "_INBOX_gateway.abc", False),
        ("worker", "subscribe", "_INBOX_worker.abc", True),
        ("budget", "publish", "$JS.ACK.NS_EVENTS.accounting.1.2.3", False),
        ("accounting", "publish", "$JS.ACK.NS_EVENTS.accounting.1.2.3", True),
        # A process's own user: its role's permissions, narrowed to its id.
        ("gateway.gw1", "subscribe", "ns.tok.gw1.r1", True),
        ("gateway.gw1", "subscribe", "ns.tok.gw2.r1", False),
        ("gateway.gw1", "subscribe", "ns.tok.>", False),
        ("gateway.gw1", "subscribe", "ns.ctl.alive.gw1", True),
        ("gateway.gw1", "subscribe", "ns.ctl.alive.gw2", False),
        ("gateway.gw1", "subscribe", "_INBOX_gateway.gw1.x", True),
        ("gateway.gw1", "subscribe", "_INBOX_gateway.gw2.x", False),
        ("gateway.gw1", "subscribe", "ns.hb.gpu.w1", True),  # routing needs every heartbeat
        ("gateway.gw1", "publish", "ns.req.pool.gpu", True),
        ("worker.w1", "publish", "ns.hb.gpu.w1", True),
        ("worker.w1", "publish", "ns.hb.gpu.w2", False),
        ("worker.w1", "publish", "ns.tok.gw2.r1", True),  # tokens go to every gateway
        ("worker.w1", "subscribe", "_INBOX_worker.w2.x", False),
        # Shared router mode: a gateway publishes its decisions under its own id; everyone routing reads them.
        ("gateway.gw1", "publish", "ns.router.commit.gw1", True),
        ("gateway.gw1", "publish", "ns.router.commit.gw2", False),
        ("gateway.gw1", "subscribe", "ns.router.commit.gw2", True),
        ("router", "subscribe", "ns.router.commit.gw2", True),
        ("router", "publish", "ns.router.commit.gw2", False),
        ("worker", "publish", "ns.router.commit.gw2", False),
        ("budget.b1", "subscribe", "ns.budget.reserve", True),
        ("budget.b1", "subscribe", "_INBOX_budget.b2.x", False),
    ],
)
def test_who_may_do_what(role: str, kind: str, subject: str, allowed: bool) -> None:
    assert _may(role, kind, subject) is allowed


def test_the_config_names_every_role_with_its_password_and_jetstream(tmp_path: Path) -> None:
    pw = {r: f"pw-{r}" for r in ROLES}
    text = server_config(T, pw, port=4333, store_dir=tmp_path)
    assert "port: 4333" in text and str(tmp_path) in text
    # Bodies of up to 4 MiB travel as one message: past nats-server's 1 MiB default.
    assert "max_payload: 8388608" in text
    users = json.loads(text.split("authorization: ", 1)[1])["users"]
    assert sorted(u["user"] for u in users) == sorted(ROLES)
    assert all(u["password"] == f"pw-{u['user']}" for u in users)
    assert main(["--namespace", "ns", "--out", str(tmp_path / "n.conf"), "--passwords", str(tmp_path / "p.json")]) == 0
    assert (tmp_path / "n.conf").stat().st_mode & 0o777 == 0o600
    assert sorted(json.loads((tmp_path / "p.json").read_text())) == sorted(ROLES)
    argv = ["--out", str(tmp_path / "n.conf"), "--passwords", str(tmp_path / "p.json")]
    assert main([*argv, "--user", "gateway.gw-a", "--user", "worker.w-1", "--user", "budget"]) == 0
    assert sorted(json.loads((tmp_path / "p.json").read_text())) == ["budget", "gateway.gw-a", "worker.w-1"]
    with pytest.raises(ValueError, match="unknown NATS role"):
        server_config(T, {"gatway.gw-a": "x"})


def test_a_heartbeat_must_come_on_its_own_subject_and_be_bounded() -> None:
    assert T.heartbeat_matches("ns.hb.gpu.w1", "gpu", "w1")
    assert not T.heartbeat_matches("ns.hb.gpu.w1", "gpu", "w2")
    assert not T.heartbeat_matches("ns.hb.gpu.w1", "gpu.x", "w1")
    beat = {"worker_id": "w", "pool": "p", "engine": "e", "models": [], "max_concurrency": 1, "in_flight": 0}
    beat |= {"ready": True, "interval_s": 1.0, "sent_at": 0.0}
    Heartbeat.model_validate(beat)
    for bad in ({"models": ["m"] * 257}, {"worker_id": "w" * 129}, {"interval_s": 0}, {"in_flight": -1}):
        with pytest.raises(ValidationError):
            Heartbeat.model_validate(beat | bad)
