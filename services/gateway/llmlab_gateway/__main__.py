"""``python -m llmlab_gateway``: the OpenAI-compatible gateway (settings from ``LLMLAB_GATEWAY_*`` / ``LLMLAB_*``)."""

from __future__ import annotations

from llmlab_common.runtime import run_service

from llmlab_gateway.app import create_app
from llmlab_gateway.settings import GatewaySettings

if __name__ == "__main__":
    run_service("gateway", GatewaySettings, create_app, description="The OpenAI-compatible API over NATS workers.")
