"""Every message that crosses NATS, as a pydantic model (one place for contracts).

Each carries ``schema_version``; per-request messages carry ``request_id`` and ``attempt``.
Times are Unix epoch seconds (``time.time()``) when they cross process boundaries, and
durations are seconds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from llmlab_common import SCHEMA_VERSION

Endpoint = Literal["chat", "completions"]
# The most requests one batched admission message (reserve, route) may carry.
MAX_ADMISSION_BATCH = 256
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "cancelled", "error"]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)
    schema_version: int = SCHEMA_VERSION


class _RequestMsg(_Msg):
    request_id: str


class Principal(BaseModel):
    """Who is calling; ids only, never raw keys."""

    model_config = ConfigDict(extra="forbid")
    tenant_id: str = "dev"
    team_id: str = "dev"
    user_id: str = "dev"
    key_id: str = "dev"
    plan: str = "free"


class SamplingParams(BaseModel):
    """What the engine needs besides the prompt; passed through to engines that support it."""

    model_config = ConfigDict(extra="forbid")
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class RouteInfo(BaseModel):
    """Why this attempt went where it went (the router's decision), carried to the worker and into
    the attempt's event so accounting can join cost to routing."""

    model_config = ConfigDict(extra="forbid")
    policy: str
    policy_version: str
    position: int = Field(default=1, ge=1)  # 1 = first choice; 2.. = fallbacks of the chain
    reason: str = ""
    fallback_from: str | None = None  # deployment id of the attempt this one replaces
    slo_class: str | None = None
    # blake2b of the whole prompt (not reversible): accounting counts identical prompts with it
    prompt_hash: str | None = None


class Resume(BaseModel):
    """Mid-stream failover: this attempt continues a stream whose answering attempt failed after
    tokens had reached the client. The engine is asked to continue ``text`` (chat: as a final
    assistant message it continues; completions: appended to the prompt); ``params.max_tokens``
    is already reduced by ``tokens``."""

    model_config = ConfigDict(extra="forbid")
    from_attempt: int = Field(ge=1)  # the attempt whose stream this one continues
    text: str  # everything the client has received so far, in order
    tokens: int = Field(ge=0)  # those tokens, as the engines counted them


class InferenceRequest(_RequestMsg):
    """Gateway → worker, on a pool or per-worker subject of the requests stream."""

    attempt: int = Field(ge=1)
    gateway_id: str
    reply_subject: str
    endpoint: Endpoint
    model: str  # the name the engine serves (``--served-model-name``)
    deployment: str
    pool: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    params: SamplingParams
    principal: Principal = Field(default_factory=Principal)
    priority: int = 0
    created_at: float  # when the gateway accepted the HTTP request
    dispatched_at: float  # when this attempt was published
    start_deadline: float  # a worker that takes it later discards it (nobody waits any more)
    deadline: float  # generation stops at this time even if running
    route: RouteInfo | None = None
    # The gateway's admission steps for this request (the same on every attempt), copied by the
    # worker into the attempt's Timings so that one row explains where the time went.
    parse_s: float | None = None  # accepted → admission started (read, parse, validate the body)
    auth_s: float | None = None  # authenticate + reserve (budget round trip)
    route_s: float | None = None  # the router's decision (round trip, or in-process)
    prep_s: float | None = None  # routing decided → the first attempt published (build, publish)
    first_dispatch_offset_s: float | None = None  # accepted → the first attempt published
    resume: Resume | None = None  # set on an attempt that continues an interrupted stream


# -- token stream back to the gateway (core NATS, per request) -------------------------------


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = None


class Timings(BaseModel):
    """Queue phases kept apart. ``None`` where the engine does not report the figure."""

    model_config = ConfigDict(extra="forbid")
    nats_queue_s: float  # dispatch → worker took it
    engine_queue_s: float | None = None  # inside the engine before scheduling (see engine_queue_method)
    ttft_s: float | None = None  # engine call → first token (engine queue + prefill)
    prefill_s: float | None = None  # ttft - engine queue, when the latter is known
    decode_s: float | None = None  # first token → last token
    e2e_s: float  # worker took it → terminal message
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    tpot_s: float | None = None  # (e2e_engine - ttft) / (completion_tokens - 1)
    auth_s: float | None = None  # gateway: authenticate + reserve
    route_s: float | None = None  # gateway: routing decision
    dispatch_offset_s: float | None = None  # gateway accepted → this attempt published (admission, earlier attempts)
    parse_s: float | None = None  # gateway: accepted → admission started
    prep_s: float | None = None  # gateway: routing decided → the first attempt published
    first_dispatch_offset_s: float | None = None  # gateway: accepted → the first attempt published
    intake_s: float | None = None  # worker: took it → engine call sent
    finish_s: float | None = None  # worker: last token (engine call, if none) → terminal message
    # How engine_queue_s was obtained: "engine" (reported for this request by the engine),
    # "window_mean" (the engine's mean queue time over the last heartbeat window: an estimate,
    # for engines that do not report it per request), None when unknown.
    engine_queue_method: Literal["engine", "window_mean"] | None = None


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: int
    type: str
    code: str | None = None
    message: str


class StreamStarted(_RequestMsg):
    kind: Literal["started"] = "started"
    attempt: int
    seq: int
    worker_id: str
    engine: str
    nats_queue_s: float
    instance_id: str = ""  # the worker process that took it (see Heartbeat.instance_id)


class TokenChunk(_RequestMsg):
    """One or more engine chunks coalesced; ``token_times`` keeps each chunk's arrival offset
    (seconds since the engine call started) so ITL survives coalescing. ``tokens``: the tokens
    these chunks carry, as the engine counted them (an engine chunk may hold several: vLLM merges
    output deltas when its consumer lags); None from an older worker: one per chunk."""

    kind: Literal["tokens"] = "tokens"
    attempt: int
    seq: int
    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    token_times: list[float] = Field(default_factory=list)
    tokens: int | None = Field(default=None, ge=0)

    def token_count(self) -> int:
        """Tokens this message delivers to the client."""
        if self.tokens is not None:
            return self.tokens
        return len(self.token_times) or (1 if self.text or self.tool_calls else 0)


def token_chunk_json(
    request_id: str,
    attempt: int,
    seq: int,
    text: str,
    token_times: list[float],
    tokens: int,
    tool_calls: list[dict[str, Any]] | None = None,
) -> bytes:
    """A :class:`TokenChunk` on the wire, written without building the model: the worker's hot
    path (one per token at a GPU's pace), where ``model_construct`` + ``model_dump_json`` cost
    about ten times orjson's write of the same object. Parses back to the same TokenChunk."""
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "request_id": request_id,
        "kind": "tokens",
        "attempt": attempt,
        "seq": seq,
        "text": text,
        "token_times": token_times,
        "tokens": tokens,
    }
    if tool_calls:
        out["tool_calls"] = tool_calls
    return orjson.dumps(out)


class StreamEnd(_RequestMsg):
    kind: Literal["end"] = "end"
    attempt: int
    seq: int
    finish_reason: FinishReason
    usage: Usage
    timings: Timings


class StreamError(_RequestMsg):
    kind: Literal["error"] = "error"
    attempt: int
    seq: int
    error: ErrorInfo
    before_first_token: bool
    retryable: bool


StreamMessage = Annotated[StreamStarted | TokenChunk | StreamEnd | StreamError, Field(discriminator="kind")]
STREAM_MESSAGE: TypeAdapter[StreamStarted | TokenChunk | StreamEnd | StreamError] = TypeAdapter(StreamMessage)


def join_batch(payloads: list[bytes]) -> bytes:
    """Several stream messages (JSON, which never holds a raw newline) as one batch payload."""
    return b"\n".join(payloads)


def split_batch(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\n") if line]


# -- control ----------------------------------------------------------------------------------


class CancelRequest(_RequestMsg):
    attempt: int | None = None  # None: every attempt of the request
    reason: str = "client_disconnected"


class AliveProbe(_RequestMsg):
    attempt: int


class AliveReply(_RequestMsg):
    attempt: int
    wanted: bool


# -- heartbeats -------------------------------------------------------------------------------


class EngineLoad(BaseModel):
    """Load read from the engine's Prometheus metrics (names differ per engine; values do not)."""

    model_config = ConfigDict(extra="forbid")
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    prefix_cache_hit_rate: float | None = None  # 0..1
    mean_queue_time_s: float | None = None  # windowed, from the engine's queue-time histogram
    preemptions_total: float | None = None  # the engine's own cumulative counter (resets when it restarts)
    batch_size: float | None = None  # windowed mean tokens per engine step where exposed, else running


# A worker silent for this many of its heartbeat intervals is gone (gateway and router alike).
HEARTBEAT_MISSES = 3


class Heartbeat(_Msg):
    # Bounded: every gateway, the router and accounting hold one per worker.
    worker_id: str = Field(max_length=128)
    pool: str = Field(max_length=128)
    engine: str = Field(max_length=64)
    models: list[str] = Field(max_length=256)
    max_concurrency: int = Field(ge=0, le=1_000_000)
    in_flight: int = Field(ge=0, le=1_000_000)
    ready: bool
    draining: bool = False
    load: EngineLoad = Field(default_factory=EngineLoad)
    interval_s: float = Field(gt=0, le=3600)
    sent_at: float
    # New for each start of the worker process: a worker restarted under the same id (a
    # StatefulSet pod) beats again at once, yet the attempts its previous process took are lost.
    instance_id: str = ""
    # Admission's inputs (the gateway predicts a new request's wait from them): attempts waiting in
    # the pool's queues and in this worker's own, per plan priority (index = priority; the
    # JetStream consumers' pending counts), and the mean time an attempt held a slot lately (taken
    # to terminal message); None until known.
    queued_by_priority: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=16)
    addressed_by_priority: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=16)
    mean_service_s: float | None = Field(default=None, ge=0)


# -- events (JetStream, every consumer reads all) -----------------------------------------------

AttemptOutcome = Literal[
    "completed",  # terminal message with usage sent
    "cancelled",  # client went away / gateway cancelled
    "expired",  # taken after its start deadline: discarded, never generated
    "stale",  # redelivery of an attempt the gateway no longer waits for: dropped
    "engine_error",
    "worker_lost",  # published by the gateway when the worker vanished mid-attempt
    "abandoned",  # published by the gateway when it gave up waiting for the attempt
]


class AttemptEvent(_RequestMsg):
    attempt: int
    outcome: AttemptOutcome
    source: Literal["worker", "gateway"]
    worker_id: str | None = None
    pool: str
    deployment: str
    model: str
    engine: str | None = None
    endpoint: Endpoint
    principal: Principal
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    error: ErrorInfo | None = None
    route: RouteInfo | None = None
    created_at: float
    ended_at: float
    # Mid-stream failover (see :class:`Resume`). On the attempt that continued a stream: the
    # output tokens delivered before it, which it bills (:func:`llmlab_common.rules.charge_for`).
    # On an attempt that was interrupted: the tokens it delivered, which a later attempt bills.
    resumed_tokens: int = Field(default=0, ge=0)
    carried_tokens: int = Field(default=0, ge=0)


class RequestEvent(_RequestMsg):
    """A request that was refused or failed as a whole (4xx/429/503/5xx), with the reason."""

    status: int
    error: ErrorInfo
    model: str | None = None
    deployment: str | None = None
    principal: Principal | None = None
    attempts: int = 0
    created_at: float
    ended_at: float


# -- router (request/reply between gateway and router service) ----------------------------------


class RouteQuery(_RequestMsg):
    """What the router needs to know about a request: sizes, difficulty and constraints, never the prompt
    (only hashes of its leading blocks, for prefix affinity)."""

    model: str
    endpoint: Endpoint = "chat"
    plan: str = "free"
    prompt_tokens: int = Field(ge=0)
    max_output_tokens: int = Field(ge=1)
    difficulty: float = Field(default=0.0, ge=0, le=1)
    needs_tools: bool = False
    slo_class: str | None = None  # a stricter class asked by the request; default: the plan's
    quality_floor: float | None = Field(default=None, ge=0, le=1)  # only raises the plan's floor
    max_cost_usd: float | None = Field(default=None, gt=0)  # only lowers the plan's cap
    policy: str | None = None  # a named routing policy; default: the alias's or the catalog's
    prefix_hashes: list[str] = Field(default_factory=list)


class RouteTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deployment: str
    pool: str
    worker_id: str | None = None  # None: any worker of the pool


class RouteReply(_RequestMsg):
    """The ordered chain: first target, then fallbacks (no (deployment, worker) twice, bounded length)."""

    targets: list[RouteTarget] = Field(default_factory=list)
    policy: str = ""
    policy_version: str = ""
    slo_class: str | None = None
    reason: str = ""
    error: ErrorInfo | None = None


class RouteCommit(_Msg):
    """A decision made in a gateway (``shared`` router mode), for the other routing states: one more
    attempt sent to ``worker_id`` since its heartbeat, and the prompt's leading blocks now at home
    there (the same update :meth:`llmlab_routing.state.LiveState.commit` makes for a local decision)."""

    deployment: str = Field(max_length=256)
    worker_id: str | None = Field(default=None, max_length=64)
    prefix_hashes: list[str] = Field(default_factory=list, max_length=64)
    policy: str = Field(default="", max_length=64)  # the routing policy that decided (for metrics)


class RouteBatch(_Msg):
    queries: list[RouteQuery] = Field(min_length=1, max_length=MAX_ADMISSION_BATCH)


class RouteBatchReply(_Msg):
    replies: list[RouteReply] = Field(default_factory=list)
    error: ErrorInfo | None = None


# -- budget (request/reply between gateway and budget service) ---------------------------------


class ReserveRequest(_RequestMsg):
    """Authenticate a key and reserve tokens for one request, before routing.

    Carries the key's SHA-256, never the key. ``reserve=False`` only authenticates (listing models)."""

    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    reserve: bool = True
    endpoint: Endpoint = "chat"
    model: str = ""
    # Estimated prompt tokens (llmlab_common.tokens), tool definitions and tool calls apart.
    input_tokens: int = Field(default=0, ge=0)
    tool_tokens: int = Field(default=0, ge=0)
    requested_max_tokens: int | None = Field(default=None, ge=1)
    # When the gateway gives up on the request (its clock); an unsettled reservation is reaped after it.
    deadline: float = 0.0
    # The same as a duration from sending: the budget counts it on Redis's clock, so no
    # gateway's or replica's clock is compared with another's. 0: fall back to the deadline.
    timeout_s: float = Field(default=0.0, ge=0, le=86400)


class ReserveReply(_RequestMsg):
    principal: Principal | None = None
    error: ErrorInfo | None = None
    retry_after_s: float | None = None
    # The output allowance: the gateway sends this as max_tokens (clamped when the budget is short).
    max_tokens: int | None = None
    reserved_tokens: int = 0


# Batched admission: one message carries the requests of one gateway arriving together (a burst);
# the answer has one reply per request, in order. ``error`` set: the whole batch was refused.
class ReserveBatch(_Msg):
    requests: list[ReserveRequest] = Field(min_length=1, max_length=MAX_ADMISSION_BATCH)


class ReserveBatchReply(_Msg):
    replies: list[ReserveReply] = Field(default_factory=list)
    error: ErrorInfo | None = None
    retry_after_s: float | None = None
