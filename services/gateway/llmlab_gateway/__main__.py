"""``python -m llmlab_gateway``: the OpenAI-compatible gateway (settings from LLMLAB_GATEWAY_*)."""

from llmlab_common.runtime import serve

from llmlab_gateway.app import create_app
from llmlab_gateway.settings import GatewaySettings

if __name__ == "__main__":
    settings = GatewaySettings()
    serve(create_app(settings), settings, "gateway")
