from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from llmlab_common.settings import InfraSettings
from llmlab_gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit
PROD = InfraSettings(env="prod", nats_user="gateway")


def test_dev_key_is_refused_in_prod() -> None:
    dev = hashlib.sha256(b"sk-llmlab-dev").hexdigest()
    for spelled in (dev, dev.upper(), f" {dev} "):
        with pytest.raises(ValueError, match="dev API key"):
            GatewaySettings(infra=PROD, api_key_sha256=[spelled])
    assert GatewaySettings(infra=PROD).api_key_sha256 == []  # no dev key by default
    assert GatewaySettings(infra=InfraSettings(env="dev")).api_key_sha256 == [dev]
    own = hashlib.sha256(b"sk-real-secret").hexdigest()
    assert GatewaySettings(infra=PROD, api_key_sha256=[own]).api_key_sha256 == [own]


def test_a_process_started_without_llmlab_env_is_prod(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches: dev conveniences on by default (dd4f538: env defaulted to dev, so a deployment
    that forgot LLMLAB_ENV accepted the documented dev keys and static auth)."""
    monkeypatch.delenv("LLMLAB_ENV", raising=False)
    assert InfraSettings().env == "prod"
    with pytest.raises(ValueError, match="unauthenticated NATS"):
        GatewaySettings()
    monkeypatch.setenv("LLMLAB_NATS_USER", "gateway")
    with pytest.raises(ValueError, match="static"):
        GatewaySettings(auth="static")


def test_settings_come_from_the_service_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMLAB_GATEWAY_QUEUE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("LLMLAB_NAMESPACE", "abc")
    s = GatewaySettings()
    assert s.queue_timeout_s == 2.5 and s.infra.namespace == "abc"
    monkeypatch.setenv("LLMLAB_NAMESPACE", "bad.namespace")
    with pytest.raises(ValueError):
        GatewaySettings()


def test_each_gateway_process_has_its_own_decision_log(tmp_path: Path) -> None:
    """Catches: copies of a gateway run with processes > 1 appending to (and rotating) one file."""
    log = tmp_path / "gateway-decisions.jsonl"
    assert GatewaySettings(decision_log=log).decision_log_path() == log
    copy = GatewaySettings(decision_log=log, process_index=2)
    assert copy.decision_log_path() == tmp_path / "gateway-decisions-p2.jsonl"
    assert GatewaySettings(decision_log=None, process_index=1).decision_log_path() is None
