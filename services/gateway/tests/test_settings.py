from __future__ import annotations

import hashlib

import pytest
from llmlab_common.settings import InfraSettings
from llmlab_gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit


def test_dev_key_is_refused_in_prod() -> None:
    with pytest.raises(ValueError, match="dev API key"):
        GatewaySettings(infra=InfraSettings(env="prod"))
    own = hashlib.sha256(b"sk-real-secret").hexdigest()
    assert GatewaySettings(infra=InfraSettings(env="prod"), api_key_sha256=[own]).api_key_sha256 == [own]


def test_settings_come_from_the_service_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMLAB_GATEWAY_QUEUE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("LLMLAB_NAMESPACE", "abc")
    s = GatewaySettings()
    assert s.queue_timeout_s == 2.5 and s.infra.namespace == "abc"
    monkeypatch.setenv("LLMLAB_NAMESPACE", "bad.namespace")
    with pytest.raises(ValueError):
        GatewaySettings()
