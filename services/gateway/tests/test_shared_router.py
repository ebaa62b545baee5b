"""The shared router mode's adapter (unit): each decision goes out as a commit naming the chosen
target and the prompt's blocks, and a commit NATS cannot take leaves the decision standing."""

from __future__ import annotations

from typing import Any, cast

import pytest
from llmlab_common.messages import RouteCommit, RouteQuery
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_gateway.routing import SharedRouter
from llmlab_routing.config import load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.state import LiveState
from llmlab_testkit.routing import heartbeat

pytestmark = pytest.mark.unit
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class _Nats:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.closed = False

    async def publish(self, subject: str, payload: bytes) -> None:
        if self.closed:
            raise ConnectionError("connection closed")
        self.sent.append((subject, payload))


async def test_a_decision_is_published_as_its_commit_and_a_failed_publish_keeps_it() -> None:
    live = LiveState()
    for i in (1, 2):
        live.on_heartbeat(heartbeat(f"w{i}", "gpu-vllm", interval=60))
    nc = _Nats()
    router = SharedRouter(RouterCore(load_router_catalog(DEFAULT_CATALOG), live), cast(Any, nc), "ns.router.commit.gw1")
    q = RouteQuery(request_id="r1", model=MODEL, prompt_tokens=5, max_output_tokens=4, prefix_hashes=["h1", "h2"])
    reply = await router.route(q)
    ((subject, payload),) = nc.sent
    c, first = RouteCommit.model_validate_json(payload), reply.targets[0]
    assert subject == "ns.router.commit.gw1"
    assert (c.deployment, c.worker_id, c.prefix_hashes) == (first.deployment, first.worker_id, ["h1", "h2"])
    assert first.worker_id in ("w1", "w2")
    nc.closed = True
    again = await router.route(q.model_copy(update={"request_id": "r2"}))
    assert again.error is None and again.targets
