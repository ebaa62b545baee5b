"""Gateway domain logic: turn a validated OpenAI request into attempts, wait for a worker,
retry before the first token, and relay the token stream. Imports neither FastAPI nor NATS:
the NATS side is behind :class:`Dispatcher`."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from llmlab_common import rules
from llmlab_common.catalog import Catalog, Deployment
from llmlab_common.codes import Code
from llmlab_common.errors import (
    EngineError,
    LLMLabError,
    RateLimited,
    ServiceUnavailable,
    UpstreamTimeout,
    error_from_info,
)
from llmlab_common.messages import (
    AttemptEvent,
    AttemptOutcome,
    Endpoint,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    Principal,
    RequestEvent,
    Resume,
    RouteInfo,
    RouteQuery,
    RouteReply,
    RouteTarget,
    SamplingParams,
    StreamEnd,
    StreamError,
    StreamStarted,
    Timings,
    TokenChunk,
    Usage,
)
from llmlab_common.subjects import PRIORITY_LEVELS
from llmlab_common.tokens import PromptEstimate, estimate_chat
from llmlab_common.tokens import estimate_prompt as estimate_completion_prompt
from llmlab_routing.config import CatalogHolder, RouterCatalog
from llmlab_routing.features import chat_prefix_text, chat_task, difficulty, prefix_hashes

from llmlab_gateway.schemas import ChatCompletionRequest, CompletionRequest
from llmlab_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLost:
    """The worker that took the attempt stopped sending heartbeats."""

    attempt: int
    worker_id: str


@dataclass(frozen=True)
class StreamGap:
    """A token message went missing (sequence gap): the stream can no longer be trusted."""

    attempt: int
    expected: int
    got: int


AttemptMessage: TypeAlias = StreamStarted | TokenChunk | StreamEnd | StreamError | WorkerLost | StreamGap
# What ended an answering attempt early: one of its messages, or None for silence past the idle timeout.
Interruption: TypeAlias = StreamStarted | StreamError | WorkerLost | StreamGap | None


class AttemptHandle(Protocol):
    attempt: int

    async def next(self, timeout: float) -> AttemptMessage | None:
        """The attempt's next message in order, or None after ``timeout`` seconds of silence."""
        ...

    def next_nowait(self) -> AttemptMessage | None:
        """The next message if one is already waiting, else None."""
        ...

    @property
    def taken(self) -> bool:
        """A worker has taken the attempt."""
        ...


class Router(Protocol):
    """Where a request's target chain comes from (the router service, or the same core in-process)."""

    async def route(self, query: RouteQuery) -> RouteReply: ...


class Dispatcher(Protocol):
    def live_workers(self, pool: str, excluding: str | None = None) -> int: ...

    def predicted_wait(self, pool: str, priority: int = 0) -> float | None:
        """Seconds a request of plan ``priority`` sent to ``pool`` now would wait for a worker; None: unknown."""
        ...

    async def wait_discovery(self) -> None: ...

    async def dispatch(self, req: InferenceRequest, target: RouteTarget) -> AttemptHandle: ...

    def cancel(self, request_id: str, attempt: int | None, reason: str) -> None: ...

    def release(self, request_id: str) -> None: ...

    def record_attempt(self, event: AttemptEvent) -> None: ...

    def record_request(self, event: RequestEvent) -> None: ...


def estimate_prompt(body: ChatCompletionRequest | CompletionRequest) -> PromptEstimate:
    """Prompt tokens for the budget reservation (system prompt included, tools apart)."""
    if isinstance(body, ChatCompletionRequest):
        return estimate_chat([m.model_dump(exclude_none=True) for m in body.messages], body.tools)
    return estimate_completion_prompt(body.prompt_text())


@dataclass(frozen=True)
class RouteHints:
    """What a request may ask of the router (``x-llmlab-*`` headers): only ever stricter than its plan."""

    slo_class: str | None = None
    quality_floor: float | None = None
    max_cost_usd: float | None = None
    policy: str | None = None


@dataclass
class CallContext:
    request_id: str
    endpoint: Endpoint
    body: ChatCompletionRequest | CompletionRequest
    principal: Principal
    created_at: float = field(default_factory=time.time)
    # The budget's output allowance: sent to the engine as max_tokens when set.
    max_tokens: int | None = None
    hints: RouteHints = field(default_factory=RouteHints)
    prompt_hash: str | None = None  # set when the request is routed
    prompt_tokens: int = 0  # the gateway's estimate, set when the request is routed
    # Admission steps (seconds): carried to the worker and into the accounting rows.
    parse_s: float | None = None  # accepted → admission started
    auth_s: float | None = None  # authenticate + reserve
    route_s: float | None = None  # the routing decision (set by CompletionService.open)
    routed_at: float | None = None  # wall clock: the routing decision made
    first_dispatched_at: float | None = None  # wall clock: the first attempt built and published


@dataclass
class RouteAhead:
    """A routing decision started before the request's admission answered
    (:meth:`CompletionService.route_ahead`), with the inputs it was made on."""

    plan: str
    max_output_tokens: int
    reply: asyncio.Future[RouteReply]
    prompt_tokens: int  # what route_query set on the context it was made with
    prompt_hash: str | None
    used: bool | None = None  # set by fits(): whether the admission confirmed the inputs

    def fits(self, plan: str, max_output_tokens: int) -> bool:
        self.used = plan == self.plan and max_output_tokens == self.max_output_tokens
        return self.used


# Continues an interrupted stream on another target: the next attempt's first message, or None
# when it cannot (see CompletionService.resume).
Resumer: TypeAlias = Callable[["OpenedStream", Interruption], Awaitable["TokenChunk | StreamEnd | None"]]


@dataclass
class OpenedStream:
    """A request whose first token (or whole answer) has arrived from some attempt."""

    ctx: CallContext
    deployment: Deployment
    handle: AttemptHandle
    first: TokenChunk | StreamEnd
    idle_timeout_s: float
    req: InferenceRequest | None = None  # the answering attempt
    worker_id: str | None = None  # the answering attempt's worker, where it said (StreamStarted)
    finished: bool = False
    end: StreamEnd | None = None
    attempts: int = 1
    delivered_tokens: int = 0  # tokens handed to the transport (what a cancelled request pays)
    route: RouteReply | None = None
    # Mid-stream failover: what the client received (a continuation continues it), whether it
    # held tool calls (not resumable), the tokens delivered before the answering attempt, and
    # how many times the stream moved.
    parts: list[str] = field(default_factory=list)
    tool_calls_delivered: bool = False
    resumed_tokens: int = 0
    resumes: int = 0
    resumer: Resumer | None = None

    async def __aiter__(self) -> AsyncIterator[TokenChunk | StreamEnd]:
        async for batch in self.batches():
            for m in batch:
                yield m

    async def batches(self) -> AsyncIterator[list[TokenChunk | StreamEnd]]:
        """Messages in order, grouped by what is already waiting: a client that fell behind gets
        its backlog in one write instead of one write per message."""
        msg: AttemptMessage | None = self.first
        while True:
            batch: list[TokenChunk | StreamEnd] = []
            cut: Interruption = None
            while msg is not None:
                if isinstance(msg, TokenChunk):
                    self.delivered_tokens += msg.token_count()
                    self.parts.append(msg.text)
                    if msg.tool_calls:
                        self.tool_calls_delivered = True
                    batch.append(msg)
                elif isinstance(msg, StreamEnd):
                    self.finished = True
                    if self.resumed_tokens:  # the client's usage covers every attempt's tokens
                        msg.usage = rules.resumed_usage(msg.usage, self.resumed_tokens)
                    self.end = msg
                    batch.append(msg)
                    yield batch
                    return
                else:
                    cut = msg
                    break
                msg = self.handle.next_nowait()
            if batch:
                yield batch  # what arrived before a failure still reaches the client
            if cut is None:
                msg = await self.handle.next(self.idle_timeout_s)
                if msg is not None:
                    continue
            msg = await self._continue(cut)

    async def _continue(self, cut: Interruption) -> TokenChunk | StreamEnd:
        """The answering attempt failed (``cut``) or went silent (None): the next attempt's first
        message when another target continues the stream, else the failure is raised."""
        err = (
            UpstreamTimeout(f"no tokens for {self.idle_timeout_s:.0f}s; giving up on the stream")
            if cut is None
            else self._failure(cut)
        )
        resumable = (
            cut is None
            or isinstance(cut, WorkerLost | StreamGap)
            or (isinstance(cut, StreamError) and not cut.before_first_token and rules.engine_failed(cut.error.status))
        )
        if not resumable or self.resumer is None:
            raise err
        first = await self.resumer(self, cut)
        if first is None:
            raise err
        self.finished = False
        return first

    def _failure(self, msg: StreamStarted | StreamError | WorkerLost | StreamGap) -> LLMLabError:
        if isinstance(msg, StreamError):
            self.finished = True
            return error_from_info(msg.error)
        if isinstance(msg, WorkerLost):
            return EngineError(
                f"worker {msg.worker_id} was lost mid-generation and no other target continued the answer",
                code=Code.WORKER_LOST,
            )
        if isinstance(msg, StreamGap):
            return EngineError(
                f"token stream lost messages (expected {msg.expected}, got {msg.got})", code=Code.STREAM_GAP
            )
        return EngineError("protocol error: a second 'started' message in one attempt", code=Code.STREAM_GAP)


class CompletionService:
    def __init__(
        self,
        settings: GatewaySettings,
        catalog: CatalogHolder | RouterCatalog,
        router: Router,
        dispatcher: Dispatcher,
    ) -> None:
        self.settings = settings
        self._catalog = catalog  # a holder follows reloads; the router reads the same file
        self.router = router
        self.dispatcher = dispatcher

    @property
    def current(self) -> RouterCatalog:
        c = self._catalog
        return c.current if isinstance(c, CatalogHolder) else c

    @property
    def catalog(self) -> Catalog:
        return self.current.catalog

    def _queue_timeout(self, principal: Principal) -> float:
        if self.settings.queue_timeout_s is not None:
            return self.settings.queue_timeout_s
        plan = self.catalog.plans.get(principal.plan)
        slo = self.catalog.slo_classes.get(plan.slo_class) if plan else None
        return slo.queue_timeout_s if slo else 10.0

    def _max_tokens(self, ctx: CallContext) -> int:
        if ctx.max_tokens is not None:
            return ctx.max_tokens
        requested = ctx.body.requested_max_tokens()
        if requested is not None:
            return requested
        plan = self.catalog.plans.get(ctx.principal.plan)
        return plan.default_max_tokens if plan else 256

    def _build(
        self, ctx: CallContext, dep: Deployment, route: RouteInfo, attempt: int, queue_timeout: float
    ) -> InferenceRequest:
        body = ctx.body
        params = SamplingParams(
            max_tokens=self._max_tokens(ctx),
            temperature=body.temperature,
            top_p=body.top_p,
            stop=body.stop_list(),
            seed=body.seed,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias=body.logit_bias,
            user=body.user,
        )
        messages = prompt = None
        if isinstance(body, ChatCompletionRequest):
            messages = [m.model_dump(exclude_none=True) for m in body.messages]
            if dep.supports_tools:
                params.tools = body.tools
                params.tool_choice = body.tool_choice
                params.parallel_tool_calls = body.parallel_tool_calls
            params.response_format = body.response_format
        else:
            prompt = body.prompt_text()
        now = time.time()
        if ctx.first_dispatched_at is None:
            ctx.first_dispatched_at = now
        plan = self.catalog.plans.get(ctx.principal.plan)
        return InferenceRequest(
            request_id=ctx.request_id,
            attempt=attempt,
            gateway_id=self.settings.gateway_id,
            reply_subject="",  # the dispatcher owns reply subjects
            endpoint=ctx.endpoint,
            model=dep.engine_model,
            deployment=dep.id,
            pool=dep.pool,
            messages=messages,
            prompt=prompt,
            params=params,
            principal=ctx.principal,
            priority=plan.priority if plan else 0,
            created_at=ctx.created_at,
            dispatched_at=now,
            start_deadline=now + queue_timeout,
            deadline=ctx.created_at + self.settings.request_timeout_s,
            route=route,
            parse_s=ctx.parse_s,
            auth_s=ctx.auth_s,
            route_s=ctx.route_s,
            prep_s=None if ctx.routed_at is None else ctx.first_dispatched_at - ctx.routed_at,
            first_dispatch_offset_s=ctx.first_dispatched_at - ctx.created_at,
        )

    def route_query(self, ctx: CallContext) -> RouteQuery:
        """The request as the router sees it: sizes, difficulty, prefix hashes; never the prompt."""
        body = ctx.body
        routing = self.current.routing
        if isinstance(body, ChatCompletionRequest):
            messages = [m.model_dump(exclude_none=True) for m in body.messages]
            task, text = chat_task(messages), chat_prefix_text(messages)
        else:
            task = text = body.prompt_text()
        prompt = estimate_prompt(body)
        ctx.prompt_tokens = prompt.total
        max_out = self._max_tokens(ctx)
        ctx.prompt_hash = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        h = ctx.hints
        return RouteQuery(
            request_id=ctx.request_id,
            model=body.model,
            endpoint=ctx.endpoint,
            plan=ctx.principal.plan,
            prompt_tokens=prompt.total,
            max_output_tokens=max_out,
            difficulty=difficulty(task, prompt.total, max_out),
            needs_tools=bool(isinstance(body, ChatCompletionRequest) and body.tools),
            slo_class=h.slo_class,
            quality_floor=h.quality_floor,
            max_cost_usd=h.max_cost_usd,
            policy=h.policy,
            prefix_hashes=prefix_hashes(text, routing.prefix_block_chars, routing.prefix_max_blocks),
        )

    async def _route(self, ctx: CallContext) -> RouteReply:
        return await self._decide(self.route_query(ctx))

    async def _decide(self, query: RouteQuery) -> RouteReply:
        reply = await self.router.route(query)
        if reply.error is not None and reply.error.code == Code.NO_WORKERS:
            # Just started: heartbeats may not have arrived yet. Wait out discovery once.
            await self.dispatcher.wait_discovery()
            reply = await self.router.route(query)
        if reply.error is not None:
            raise error_from_info(reply.error)
        return reply

    def route_ahead(self, ctx: CallContext) -> RouteAhead:
        """Start the routing decision now, while the budget's reserve is on its way: ``ctx``
        carries the principal and output allowance its key's last admission had. :meth:`open`
        uses the decision only when the request's own admission gives the route the same inputs
        (plan, max_tokens); otherwise it routes again, and the unused decision counts as pending
        work in the router until the workers' next heartbeat."""
        query = self.route_query(ctx)
        task = asyncio.ensure_future(self._decide(query))
        # A decision that is never awaited (the admission refused, a stale prediction) keeps
        # its error to itself instead of "exception was never retrieved".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return RouteAhead(query.plan, query.max_output_tokens, task, ctx.prompt_tokens, ctx.prompt_hash)

    async def open(self, ctx: CallContext, ahead: RouteAhead | None = None) -> OpenedStream:
        """Try the router's chain in order until one target produces its first token.

        The chain never repeats a (deployment, worker), is bounded by the catalog's ``max_chain``
        and by ``max_attempts``, and every attempt reuses the request's one budget reservation, so
        a fallback can neither loop nor charge twice. Errors are :class:`LLMLabError`.

        Whatever ends it without a stream (a 429 queue timeout, an engine's 400 before the first
        token, all routes failed, a publish error, the client leaving while it waits) releases the
        request's entry in the dispatcher's attempt table here: only an opened stream is released
        by :meth:`close`."""
        try:
            return await self._open_chain(ctx, ahead)
        except asyncio.CancelledError:
            self.dispatcher.cancel(ctx.request_id, None, Code.CLIENT_DISCONNECTED)
            self.dispatcher.release(ctx.request_id)
            raise
        except BaseException:
            self.dispatcher.release(ctx.request_id)
            raise

    async def _open_chain(self, ctx: CallContext, ahead: RouteAhead | None) -> OpenedStream:
        t0 = time.perf_counter()
        try:
            if ahead is not None and ahead.fits(ctx.principal.plan, self._max_tokens(ctx)):
                # route_s is then what the decision took past the budget's answer.
                ctx.prompt_tokens, ctx.prompt_hash = ahead.prompt_tokens, ahead.prompt_hash
                reply = await ahead.reply
            else:
                reply = await self._route(ctx)
        finally:
            ctx.route_s = time.perf_counter() - t0
            ctx.routed_at = time.time()
        queue_timeout = self._queue_timeout(ctx.principal)
        targets = self._admit(ctx, reply.targets[: self.settings.max_attempts], queue_timeout)
        failures: list[str] = []
        previous: str | None = None
        attempt = 0
        moved: str | None = None  # why the last attempt moved to its pool, when it did
        routes = len(targets)  # the chain's; a move to the pool adds an attempt, not a route
        i = 0
        while i < len(targets):
            target = targets[i]
            i += 1
            dep = self.catalog.deployment(target.deployment)
            if dep is None:  # the router knows a newer catalog than this gateway: skip, do not guess
                failures.append(f"{target.deployment}: not in this gateway's catalog")
                continue
            attempt += 1
            wait = self._fallback_wait(target, queue_timeout) if attempt > 1 else queue_timeout
            if attempt == 1:
                # The decision log keeps every decision; an INFO line per request would cost the
                # hot path a JSON log record each.
                log.debug("route: %s", reply.reason)
                if isinstance(ctx.body, ChatCompletionRequest) and ctx.body.tools and not dep.supports_tools:
                    log.info("tools dropped: deployment %s does not support them", dep.id)
            info = RouteInfo(
                policy=reply.policy,
                policy_version=reply.policy_version,
                position=attempt,
                reason=reply.reason if attempt == 1 else moved or f"fallback after {previous}: {failures[-1]}",
                fallback_from=previous,
                slo_class=reply.slo_class,
                prompt_hash=ctx.prompt_hash,
            )
            req = self._build(ctx, dep, info, attempt, wait)
            handle = await self.dispatcher.dispatch(req, target)
            opened, err = await self._await_first_token(ctx, req, dep, handle, wait)
            if opened is not None:
                opened.attempts = attempt
                opened.route = reply
                return opened
            assert err is not None
            if not err.retryable:
                raise err
            moved = None
            if (
                err.code == Code.WORKER_LOST
                and target.worker_id is not None
                and not handle.taken
                and self.dispatcher.live_workers(target.pool) > 0
            ):
                # Addressed to a worker that drained or died before taking it: nothing ran, so the
                # same deployment's pool gets it next, before any fallback, while the pool has a
                # live worker (a scale-down drains several workers at once, and a chain of them
                # would otherwise all fail: 503). Not a route of the chain: not counted as one.
                moved = f"moved to pool {target.pool}: worker {target.worker_id} left before taking it"
                log.info("attempt %d %s", attempt, moved)
                targets.insert(i, RouteTarget(deployment=target.deployment, pool=target.pool))
                continue
            # The client's message names deployments (public: X-LLMLab-Deployment), never workers.
            failures.append(f"{target.deployment}: {err.message}")
            previous = target.deployment
            log.warning(
                "attempt %d on %s/%s failed before the first token (%s); trying the next route",
                attempt,
                target.deployment,
                target.worker_id or "pool",
                err.message,
            )
        raise ServiceUnavailable(
            f"All {routes} routes failed before the first token: " + "; ".join(failures),
            code=Code.ALL_ROUTES_FAILED,
        )

    def _fallback_wait(self, target: RouteTarget, queue_timeout: float, failed_worker: str | None = None) -> float:
        """How long a fallback (or a stream's continuation) waits for a worker of ``target``: a
        pool whose workers are gone gets a short wait for a replacement (a restart), then the next
        target goes, instead of sitting out the queue timeout. ``failed_worker`` (the one whose
        stream broke) does not count: its heartbeat can still say ready while its engine is dead,
        and a continuation queued for it alone would wait for the engine's restart (seen in make
        local-demo: 10 s, the queue bound 30)."""
        if target.worker_id is None and self.dispatcher.live_workers(target.pool, excluding=failed_worker) == 0:
            return min(queue_timeout, self.settings.empty_pool_wait_s)
        return queue_timeout

    def _admit(self, ctx: CallContext, targets: list[RouteTarget], bound: float) -> list[RouteTarget]:
        """Admission by predicted wait (:mod:`llmlab_routing.admission`): the chain's targets whose
        pool would take the request within ``bound`` (its SLO class's queue bound), or whose wait
        is unknown. None left: 429 at once, with the shortest predicted wait as Retry-After, where
        waiting would have ended in the same 429 after ``bound`` seconds."""
        if not self.settings.admission or not targets:
            return targets
        kept: list[RouteTarget] = []
        shortest = float("inf")
        plan = self.catalog.plans.get(ctx.principal.plan)
        priority = plan.priority if plan else 0
        waits: dict[str, float | None] = {}  # one prediction per pool of the chain
        for t in targets:
            if t.pool not in waits:
                waits[t.pool] = self.dispatcher.predicted_wait(t.pool, priority)
            wait = waits[t.pool]
            if wait is None or wait <= bound:
                kept.append(t)
            else:
                shortest = min(shortest, wait)
        if kept:
            return kept
        raise RateLimited(
            f"No capacity for '{ctx.body.model}': the predicted wait for a worker is {shortest:.1f}s, over the "
            f"{bound:.1f}s bound of its SLO class; retry later.",
            retry_after_s=shortest,
            code=Code.QUEUE_WAIT_PREDICTED,
        )

    async def _await_first_token(
        self,
        ctx: CallContext,
        req: InferenceRequest,
        route_dep: Deployment,
        handle: AttemptHandle,
        queue_timeout: float,
    ) -> tuple[OpenedStream | None, LLMLabError | None]:
        msg = await handle.next(queue_timeout)
        if msg is None:
            # Nobody took it in time: tell workers to drop it if they take it later (its start
            # deadline says the same). A first choice answers 429 so the client backs off; a
            # fallback gives way to the next target of the chain.
            self.dispatcher.cancel(req.request_id, req.attempt, Code.QUEUE_TIMEOUT)
            self._gateway_attempt_event(
                ctx, req, route_dep, "abandoned", None, "queue wait exceeded", code=Code.QUEUE_TIMEOUT
            )
            if req.attempt > 1:
                return None, EngineError(
                    f"attempt {req.attempt}: no worker took it in {queue_timeout:.1f}s",
                    code=Code.QUEUE_TIMEOUT,
                    retryable=True,
                )
            raise RateLimited(
                f"No capacity for '{route_dep.model}' within {queue_timeout:.1f}s (all workers busy); retry later.",
                retry_after_s=queue_timeout,
                code=Code.QUEUE_TIMEOUT,
            )
        worker_id = None
        if isinstance(msg, StreamStarted):
            worker_id = msg.worker_id
            msg = await handle.next(self.settings.first_token_timeout_s)
        if isinstance(msg, TokenChunk | StreamEnd):
            opened = OpenedStream(ctx, route_dep, handle, msg, self.settings.stream_idle_timeout_s, req, worker_id)
            if self.settings.max_resumes > 0:
                opened.resumer = self.resume
            return opened, None
        if isinstance(msg, StreamError):
            return None, error_from_info(msg.error, retryable=msg.retryable)
        # Worker lost, timed out or the stream broke before the first token: retry elsewhere.
        self.dispatcher.cancel(req.request_id, req.attempt, Code.RETRY)
        why = "worker lost" if isinstance(msg, WorkerLost) else "no first token in time"
        self._gateway_attempt_event(
            ctx, req, route_dep, "worker_lost" if isinstance(msg, WorkerLost) else "abandoned", worker_id, why
        )
        return None, EngineError(f"attempt {req.attempt}: {why}", code=Code.WORKER_LOST, retryable=True)

    # -- mid-stream failover ----------------------------------------------------------------------
    def _unresumable(self, opened: OpenedStream) -> str | None:
        """Why ``opened`` cannot be continued on another target, or None."""
        ctx, body = opened.ctx, opened.ctx.body
        if opened.resumes >= self.settings.max_resumes:
            return f"resumed {opened.resumes} times already (max_resumes)"
        if opened.tool_calls_delivered:
            return "tool calls were streamed (an engine cannot continue a partial tool call)"
        fmt = body.response_format if isinstance(body, ChatCompletionRequest) else None
        if fmt is not None and fmt.get("type", "text") != "text":
            return "structured output (a continuation would restart the grammar)"
        if time.time() >= ctx.created_at + self.settings.request_timeout_s:
            return "past the request deadline"
        return None

    def _resume_targets(self, opened: OpenedStream) -> list[tuple[Deployment, RouteTarget]]:
        """Where a stream may continue: any worker of its deployment's pool, then the chain's other
        deployments of the same model (the response names one model throughout)."""
        dep = opened.deployment
        out = [(dep, RouteTarget(deployment=dep.id, pool=dep.pool))]
        for t in opened.route.targets if opened.route is not None else []:
            other = self.catalog.deployment(t.deployment)
            if other is not None and other.model == dep.model and all(d.id != other.id for d, _ in out):
                out.append((other, RouteTarget(deployment=other.id, pool=other.pool)))
        return out

    async def resume(self, opened: OpenedStream, cut: Interruption) -> TokenChunk | StreamEnd | None:
        """Continue ``opened`` after its answering attempt was interrupted past its first token:
        the next attempt asks an engine to go on from the prompt plus everything the client has
        received, with ``max_tokens`` reduced by it. The client's stream goes on under the same
        id; its usage and the charge count each delivered token once
        (:func:`llmlab_common.rules.resumed_usage`). Returns the continuation's first message, or
        None when the stream cannot go on (then it ends with the in-band error, as before)."""
        ctx, old = opened.ctx, opened.req
        if old is not None and self._max_tokens(ctx) - opened.delivered_tokens <= 0:
            return self._end_at_length(opened, old)
        route = old.route if old is not None else None  # _build gives every attempt its route
        why_not = self._unresumable(opened)
        if old is None or route is None or why_not is not None:
            log.warning("stream of attempt %d interrupted and not resumed: %s", opened.handle.attempt, why_not)
            return None
        outcome: AttemptOutcome = "abandoned"  # silent, or a broken stream
        cause = "no tokens in time" if cut is None else "stream gap"
        if isinstance(cut, WorkerLost):
            outcome, cause = "worker_lost", "worker lost"
        elif isinstance(cut, StreamError):
            outcome, cause = "engine_error", f"engine failed: {cut.error.message}"
        self.dispatcher.cancel(ctx.request_id, old.attempt, Code.RETRY)
        carried = opened.delivered_tokens - opened.resumed_tokens
        self._gateway_attempt_event(
            ctx,
            old,
            opened.deployment,
            outcome,
            None,
            f"interrupted after {carried} tokens ({cause}); resumed",
            # The engine's counts died with the attempt: the prompt is the gateway's estimate.
            usage=Usage(
                prompt_tokens=ctx.prompt_tokens, completion_tokens=carried, total_tokens=ctx.prompt_tokens + carried
            ),
            carried_tokens=carried,
        )
        opened.resumes += 1
        opened.resumed_tokens = opened.delivered_tokens
        resume = Resume(from_attempt=old.attempt, text="".join(opened.parts), tokens=opened.delivered_tokens)
        queue_timeout = self._queue_timeout(ctx.principal)
        previous = opened.deployment.id
        for dep, target in self._resume_targets(opened):
            attempt = opened.attempts + 1
            opened.attempts = attempt
            wait = self._fallback_wait(target, queue_timeout, failed_worker=opened.worker_id)
            # The routing decision the stream was answered by, moved on to this position.
            info = route.model_copy(
                update={
                    "position": attempt,
                    "reason": f"resume of attempt {old.attempt} after {resume.tokens} tokens: {cause}",
                    "fallback_from": previous,
                }
            )
            req = self._build(ctx, dep, info, attempt, wait)
            req.params.max_tokens = self._max_tokens(ctx) - resume.tokens
            req.resume = resume
            # One priority up: its client is mid-stream. At its own priority a continuation sent to a
            # pool waits behind every request addressed to that pool's workers (a worker takes those
            # first), for as long as they keep coming (make local-demo: 13 s behind the other backend's
            # traffic while the first was down).
            req.priority = min(req.priority + 1, PRIORITY_LEVELS - 1)
            handle = await self.dispatcher.dispatch(req, target)
            got, err = await self._await_first_token(ctx, req, dep, handle, wait)
            if got is not None:
                log.info("attempt %d continues the stream on %s (%s)", attempt, dep.id, cause)
                opened.handle, opened.req, opened.worker_id = got.handle, req, got.worker_id
                return got.first
            assert err is not None
            log.warning("resume attempt %d on %s failed: %s", attempt, dep.id, err.message)
            if not err.retryable:
                return None
            previous = dep.id
        return None

    def _end_at_length(self, opened: OpenedStream, old: InferenceRequest) -> StreamEnd:
        """The answering attempt failed after delivering every token the request allows, before its
        engine's last message (a stall or a crash in between, seen by the chaos suite): nothing is
        left to generate, so the stream ends as the engine would have ended it, ``length``, and the
        request pays for what its client received (this event bills it: the worker's reports a
        failure). The prompt is the gateway's estimate: the engine's count died with the attempt."""
        ctx = opened.ctx
        self.dispatcher.cancel(ctx.request_id, old.attempt, Code.RETRY)
        # In this attempt's own terms (rules.resumed_usage turns them into the request's).
        prompt, own = ctx.prompt_tokens + opened.resumed_tokens, opened.delivered_tokens - opened.resumed_tokens
        usage = Usage(prompt_tokens=prompt, completion_tokens=own, total_tokens=prompt + own)
        self._gateway_attempt_event(
            ctx, old, opened.deployment, "completed", None, None, usage=usage, finish_reason="length"
        )
        log.warning("attempt %d failed after every allowed token was delivered: the stream ends at length", old.attempt)
        timings = Timings(nats_queue_s=0.0, e2e_s=max(0.0, time.time() - old.dispatched_at))
        return StreamEnd(
            request_id=ctx.request_id, attempt=old.attempt, seq=0, finish_reason="length", usage=usage, timings=timings
        )

    def _gateway_attempt_event(
        self,
        ctx: CallContext,
        req: InferenceRequest,
        dep: Deployment,
        outcome: AttemptOutcome,
        worker_id: str | None,
        why: str | None,
        code: str | None = None,
        usage: Usage | None = None,
        carried_tokens: int = 0,
        finish_reason: FinishReason | None = None,
    ) -> None:
        self.dispatcher.record_attempt(
            AttemptEvent(
                request_id=req.request_id,
                attempt=req.attempt,
                outcome=outcome,
                source="gateway",
                worker_id=worker_id,
                pool=req.pool,
                deployment=req.deployment,
                model=dep.model,
                endpoint=req.endpoint,
                principal=ctx.principal,
                error=None if why is None else ErrorInfo(status=0, type="attempt", code=code or outcome, message=why),
                route=req.route,
                usage=usage,
                created_at=ctx.created_at,
                ended_at=time.time(),
                resumed_tokens=req.resume.tokens if req.resume is not None else 0,
                carried_tokens=carried_tokens,
                finish_reason=finish_reason,
            )
        )

    def close(self, opened: OpenedStream | None, ctx: CallContext, client_gone: bool) -> None:
        """Always called when the HTTP exchange ends: cancels unfinished work, frees routing state.

        A client that went away mid-answer is recorded as the answering attempt's cancellation,
        with the tokens delivered so far: the budget charges the request by that event."""
        if opened is not None and not opened.finished:
            reason = Code.CLIENT_DISCONNECTED if client_gone else Code.GATEWAY_ABORT
            self.dispatcher.cancel(ctx.request_id, None, reason)
            if client_gone:
                self.dispatcher.record_attempt(
                    AttemptEvent(
                        request_id=ctx.request_id,
                        attempt=opened.handle.attempt,
                        outcome="cancelled",
                        source="gateway",
                        pool=opened.deployment.pool,
                        deployment=opened.deployment.id,
                        model=opened.deployment.model,
                        endpoint=ctx.endpoint,
                        principal=ctx.principal,
                        finish_reason="cancelled",
                        usage=Usage(completion_tokens=opened.delivered_tokens, total_tokens=opened.delivered_tokens),
                        error=ErrorInfo(status=499, type="client", code=reason, message="client went away"),
                        created_at=ctx.created_at,
                        ended_at=time.time(),
                    )
                )
        self.dispatcher.release(ctx.request_id)

    def record_failure(
        self, request_id: str, err: LLMLabError, created_at: float, model: str | None, principal: Principal | None
    ) -> None:
        """One RequestEvent per refused or failed request (before or after its first token)."""
        self.dispatcher.record_request(
            RequestEvent(
                request_id=request_id,
                status=err.status,
                error=err.to_info(),
                model=model,
                principal=principal,
                created_at=created_at,
                ended_at=time.time(),
            )
        )
