"""Admission through the budget service (authenticate and reserve in one atomic step there).
Requests arriving together go as one batch message (``<ns>.budget.reserve_batch``), a lone one
as a plain request/reply. Fails closed: no budget service, no admission (503)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from llmlab_common import rules
from llmlab_common.coalesce import Coalescer
from llmlab_common.codes import Code
from llmlab_common.errors import LLMLabError, ServiceUnavailable, error_from_info
from llmlab_common.http import new_request_id
from llmlab_common.messages import Principal, ReserveBatch, ReserveBatchReply, ReserveReply, ReserveRequest
from llmlab_common.subjects import Topology
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from llmlab_gateway.auth import Admission, AdmissionRequest, require_key


class BudgetAdmitter:
    def __init__(self, nc: NATS, topo: Topology, timeout_s: float, batch_max: int = 1) -> None:
        self.nc = nc
        self.subject = topo.budget_reserve_subject
        self.batch_subject = topo.budget_reserve_batch_subject
        self.timeout_s = timeout_s
        self._batcher: Coalescer[ReserveRequest, ReserveReply] = Coalescer(self._send, max_batch=batch_max)

    async def authenticate(self, api_key: str | None) -> Principal:
        sha = rules.hash_key(require_key(api_key))
        reply = await self._call(ReserveRequest(request_id=new_request_id(), key_sha256=sha, reserve=False))
        assert reply.principal is not None
        return reply.principal

    async def admit(self, api_key: str | None, req: AdmissionRequest) -> Admission:
        sha = rules.hash_key(require_key(api_key))
        reply = await self._call(
            ReserveRequest(
                request_id=req.request_id,
                key_sha256=sha,
                endpoint=req.endpoint,
                model=req.model,
                input_tokens=req.prompt.text_tokens,
                tool_tokens=req.prompt.tool_tokens,
                requested_max_tokens=req.requested_max_tokens,
                deadline=req.deadline,
                timeout_s=max(0.0, req.deadline - time.time()),
            )
        )
        assert reply.principal is not None
        return Admission(reply.principal, reply.max_tokens, reply.reserved_tokens)

    async def _call(self, req: ReserveRequest) -> ReserveReply:
        reply = await self._batcher.submit(req)
        if reply.error is not None:
            raise error_from_info(reply.error, reply.retry_after_s)
        if reply.principal is None:
            raise LLMLabError("budget service answered without a principal")
        return reply

    async def _send(self, reqs: list[ReserveRequest]) -> Sequence[ReserveReply]:
        try:
            if len(reqs) == 1:
                msg = await self.nc.request(self.subject, reqs[0].model_dump_json().encode(), timeout=self.timeout_s)
                return [ReserveReply.model_validate_json(msg.data)]
            payload = ReserveBatch(requests=reqs).model_dump_json(exclude_defaults=True).encode()
            msg = await self.nc.request(self.batch_subject, payload, timeout=self.timeout_s)
        except NoRespondersError as exc:
            raise ServiceUnavailable("The budget service is not running.", code=Code.BUDGET_UNAVAILABLE) from exc
        except (NatsTimeout, TimeoutError) as exc:
            raise ServiceUnavailable(
                "The budget service did not answer in time.", code=Code.BUDGET_UNAVAILABLE
            ) from exc
        batch = ReserveBatchReply.model_validate_json(msg.data)
        if batch.error is not None:
            raise error_from_info(batch.error, batch.retry_after_s)
        if len(batch.replies) != len(reqs):
            raise ServiceUnavailable("The budget service answered a batch incompletely.", code=Code.BUDGET_UNAVAILABLE)
        return batch.replies
