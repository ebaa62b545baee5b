"""The twin's step scheduler: vLLM-v1-style continuous batching with chunked prefill, paged KV,
recompute preemption and prefix caching, one synchronous ``step(now)`` loop over plain data.

Each step (vLLM v1 ``Scheduler.schedule``):

1. every running decode sequence gets one token; one that needs a new KV block and finds none
   free preempts the lowest-priority, latest-arrived running request (possibly itself), which
   frees its blocks and goes back to the waiting queue with its generated tokens as prompt to
   recompute (vLLM's recompute mode);
2. partially prefilled running requests get their next prefill chunk, then waiting requests (by
   priority, lower first, FIFO among equals; none if something was preempted this step) get
   chunks, within ``max_num_batched_tokens`` and up to ``max_num_seqs`` running; a new request
   first takes its cached prefix from the prefix cache;
3. the step lasts ``cost_model.step_seconds(StepBatch(...))``; all its tokens are emitted at its
   end (a request whose prefill completes emits its first token then).

Speed: decode sequences are not touched per step. A decode sequence's context and token count
follow from the step index (``c0 + (k - j)``), the batch's context sum is kept as
``S + n·k``, and the only per-sequence work is at events scheduled by step index: a new KV block
every ``block_size`` steps and the last token. A one-hour 20 req/s trace (72,000 requests) replays
in well under a minute (``results/twin-replay-speed.json``).

Time comes from the caller: :meth:`StepScheduler.step` in a tight loop for virtual-time replay
(:mod:`llmlab_twin.replay`), or :class:`RealtimeTwinScheduler` on the event loop for the
server (``python -m llmlab_engine_sim --mode twin``), which sleeps until each step's end.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

from llmlab_twin.kvcache import KVCacheManager, KVConfig
from llmlab_twin.roofline import RooflineCostModel, StepBatch, StepCostModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FixedStepCost:
    """Every step lasts ``seconds`` (pins decode ITL, e.g. 50 ms for the lag measurement)."""

    seconds: float

    def step_seconds(self, batch: StepBatch) -> float:
        return self.seconds


@dataclass(frozen=True)
class LinearCost:
    """A tiny affine cost model for tests and experiments without the roofline:
    ``base + per_prefill_token·prefill + per_decode_seq·decode + per_context_token·(contexts)``."""

    base_s: float = 0.005
    per_prefill_token_s: float = 2e-5
    per_decode_seq_s: float = 5e-5
    per_context_token_s: float = 0.0

    def step_seconds(self, batch: StepBatch) -> float:
        return (
            self.base_s
            + self.per_prefill_token_s * batch.prefill_tokens
            + self.per_decode_seq_s * batch.decode_seqs
            + self.per_context_token_s * (batch.decode_context_tokens + batch.prefill_context_tokens)
        )


@dataclass(frozen=True)
class ScaledCost:
    """Another cost model made ``factor`` times slower (the gate's "worse model" check)."""

    inner: StepCostModel
    factor: float

    def step_seconds(self, batch: StepBatch) -> float:
        return self.inner.step_seconds(batch) * self.factor


# -- sequences ------------------------------------------------------------------------------------


class SeqState(IntEnum):
    WAITING = 0
    PREFILL = 1  # running, prompt (or recompute) not fully computed
    DECODE = 2
    DONE = 3
    ABORTED = 4
    REJECTED = 5  # can never fit in the KV cache


class TwinSeq:
    """One request inside the twin. ``keys``: block keys of its shareable prompt prefix (see
    :mod:`llmlab_twin.prefix`)."""

    __slots__ = (
        "admitted_at",
        "arrival",
        "blocks",
        "broken",
        "c0",
        "cached_tokens",
        "computed",
        "ev",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "g0",
        "gap_max",
        "generated",
        "held",
        "id",
        "j",
        "keys",
        "last_token_at",
        "num_tokens",
        "order",
        "output",
        "own",
        "own_key",
        "payload",
        "preemptions",
        "priority",
        "prompt",
        "run_token",
        "slo_class",
        "state",
        "tenant",
        "worker",
    )

    def __init__(
        self,
        id: str,
        prompt_tokens: int,
        output_tokens: int,
        *,
        arrival: float | None = None,
        priority: int = 0,
        keys: Sequence[Hashable] = (),
        tenant: str = "",
        slo_class: str = "",
        payload: Any = None,
    ) -> None:
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        self.id = id
        self.prompt = prompt_tokens
        self.output = output_tokens
        self.arrival = arrival
        self.priority = priority
        self.keys = keys
        self.own_key: Hashable = ("own", id)
        self.tenant = tenant
        self.slo_class = slo_class
        self.payload = payload
        self.order = 0
        self.state = SeqState.WAITING
        self.computed = 0
        self.generated = 0
        self.num_tokens = prompt_tokens
        self.blocks = 0
        self.held: list[Any] = []
        self.own: Any = None
        self.broken = False
        self.run_token = 0
        self.ev = 0
        self.j = self.c0 = self.g0 = 0
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        self.finish_reason: str | None = None
        self.preemptions = 0
        self.cached_tokens = 0
        self.gap_max = 0.0  # longest gap between two of its tokens caused by a preemption
        self.worker = 0

    @property
    def queue_time(self) -> float | None:
        return None if self.admitted_at is None or self.arrival is None else self.admitted_at - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None or self.arrival is None else self.first_token_at - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None or self.arrival is None else self.finished_at - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.finished_at is None or self.first_token_at is None or self.generated < 2:
            return None
        return (self.finished_at - self.first_token_at) / (self.generated - 1)

    def __repr__(self) -> str:
        return f"TwinSeq({self.id!r}, {self.state.name}, computed={self.computed}, generated={self.generated})"


# -- configuration and stats -----------------------------------------------------------------------


@dataclass(frozen=True)
class TwinConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv: KVConfig = field(default_factory=KVConfig)
    # vLLM's long_prefill_token_threshold: cap on one request's chunk per step (0: none).
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")


@dataclass
class TwinStats:
    received: int = 0
    finished: int = 0
    aborted: int = 0
    rejected: int = 0
    preemptions: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache (vLLM prefix_cache_queries)
    prefix_hits: int = 0  # of which cached (vLLM prefix_cache_hits)
    prefill_tokens: int = 0  # prompt tokens computed (recomputes included, cache hits excluded)
    generation_tokens: int = 0
    steps: int = 0
    busy_s: float = 0.0
    kv_usage_integral: float = 0.0  # sum of usage x step duration
    kv_usage_max: float = 0.0
    batch_seqs_integral: float = 0.0
    waiting_max: int = 0


class StepListener(Protocol):
    def admitted(self, seqs: list[TwinSeq], t: float) -> None: ...

    def step_done(
        self, t: float, dur: float, first: list[TwinSeq], decoded: list[TwinSeq], finished: list[TwinSeq]
    ) -> None: ...


# -- the scheduler ------------------------------------------------------------------------------------


class StepScheduler:
    """One engine. Not thread-safe; all times are the caller's clock."""

    def __init__(
        self,
        config: TwinConfig,
        cost_model: StepCostModel,
        *,
        listener: StepListener | None = None,
        keep_finished: bool = True,
        record_steps: bool = True,
    ) -> None:
        self.config = config
        self.cost = cost_model
        self.kv = KVCacheManager(config.kv)
        self.bs = config.kv.block_size
        self.listener = listener
        self.stats = TwinStats()
        self.finished: list[TwinSeq] | None = [] if keep_finished else None
        self.record_steps = record_steps
        self.step_durations: list[float] = []  # per step with decodes: its duration ...
        self.step_decodes: list[int] = []  # ... and how many sequences decoded (ITL samples)
        self.gap_itls: list[float] = []  # ITLs stretched by a preemption (recompute)
        self.k = 0  # index of the step in flight / next step
        self.step_end: float | None = None
        self.step_start = 0.0
        self._waiting: list[tuple[int, int, TwinSeq]] = []
        self.num_waiting = 0
        self.prefilling: list[TwinSeq] = []
        self.decoding: dict[str, TwinSeq] = {}
        self.num_running = 0
        self._dec_s = 0  # sum over decode seqs of (c0 - j + 1): context sum at step k = S + n*k
        self._block_ev: dict[int, list[tuple[TwinSeq, int]]] = {}
        self._fin_ev: dict[int, list[tuple[TwinSeq, int]]] = {}
        self._victims: list[tuple[int, int, int, TwinSeq]] = []
        self._tokens = itertools.count(1)
        self._order = itertools.count()
        self._chunks: list[tuple[TwinSeq, int, int]] = []
        self._step_decodes = 0

    # -- queries -------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.step_end is not None

    @property
    def has_work(self) -> bool:
        return self.num_running > 0 or self.num_waiting > 0

    def running(self) -> Iterator[TwinSeq]:
        yield from self.prefilling
        yield from self.decoding.values()

    def waiting(self) -> Iterator[TwinSeq]:
        """Sequences waiting for admission (an aborted one may linger in the heap: skipped)."""
        yield from (s for _, _, s in self._waiting if s.state is SeqState.WAITING)

    # -- requests ------------------------------------------------------------------------------

    def add(self, s: TwinSeq, now: float) -> None:
        if s.arrival is None:
            s.arrival = now
        s.order = next(self._order)
        self.stats.received += 1
        if self.kv.blocks_for(s.prompt + s.output) > self.kv.total:
            self._end(s, now, "rejected", SeqState.REJECTED)
            self.stats.rejected += 1
            return
        s.state = SeqState.WAITING
        heapq.heappush(self._waiting, (s.priority, s.order, s))
        self.num_waiting += 1
        if self.num_waiting > self.stats.waiting_max:
            self.stats.waiting_max = self.num_waiting

    def abort(self, s: TwinSeq, now: float) -> bool:
        st = s.state
        if st is SeqState.WAITING:
            self.num_waiting -= 1
        elif st is SeqState.PREFILL or st is SeqState.DECODE:
            self._leave_running(s, now)
            self.kv.release(s, now)
        else:
            return False
        self._end(s, now, "abort", SeqState.ABORTED)
        self.stats.aborted += 1
        return True

    # -- the loop --------------------------------------------------------------------------------

    def step(self, now: float) -> float | None:
        """Finish the step in flight if it ends by ``now`` (its tokens are emitted at its end),
        then start the next one if there is work: at the previous step's end (no drift when the
        caller wakes late) or at ``now`` after idling. Returns the end of the step in flight,
        None when idle."""
        end = self.step_end
        if end is not None:
            if end > now + 1e-9:
                return end
            self._finish_step()
            return self._start_step(end)
        return self._start_step(now)

    def run_until_idle(self, now: float, limit: float = math.inf) -> float:
        """Step until nothing is left (virtual time, no arrivals); returns the time it ends."""
        t = now
        end = self.step(t)
        while end is not None and end <= limit:
            t = end
            end = self.step(t)
        return t

    # -- internals ---------------------------------------------------------------------------------

    def _push_victim(self, s: TwinSeq) -> None:
        s.run_token = tok = next(self._tokens)
        heapq.heappush(self._victims, (-s.priority, -s.order, tok, s))
        if len(self._victims) > 4 * self.num_running + 256:
            self._victims = [v for v in self._victims if v[3].run_token == v[2] and v[3].state in _RUNNING]
            heapq.heapify(self._victims)

    def _pick_victim(self) -> TwinSeq:
        victims = self._victims
        while victims:
            _, _, tok, s = heapq.heappop(victims)
            if s.run_token == tok and s.state in _RUNNING:
                return s
        raise RuntimeError("no running request to preempt")  # pragma: no cover - accounting bug

    def _leave_running(self, s: TwinSeq, now: float) -> None:
        """Take a running request out of the running structures (its blocks are still held)."""
        if s.state is SeqState.DECODE:
            d = self.k - s.j  # tokens out so far (a step in flight has not emitted yet)
            s.generated = s.g0 + d
            s.computed = s.c0 + d
            self._dec_s -= s.c0 - s.j + 1
            del self.decoding[s.id]
            s.ev += 1
        else:
            with contextlib.suppress(ValueError):
                self.prefilling.remove(s)
            chunks = self._chunks
            for i, c in enumerate(chunks):
                if c[0] is s:
                    del chunks[i]
                    break
        s.run_token = 0
        self.num_running -= 1

    def _preempt(self, s: TwinSeq, now: float) -> None:
        self._leave_running(s, now)
        self.kv.release(s, now)
        s.computed = 0
        s.num_tokens = s.prompt + s.generated
        s.state = SeqState.WAITING
        s.preemptions += 1
        s.broken = False
        heapq.heappush(self._waiting, (s.priority, s.order, s))
        self.num_waiting += 1
        self.stats.preemptions += 1
        log.debug("preempted", extra={"request_id": s.id, "generated": s.generated})

    def _end(self, s: TwinSeq, now: float, reason: str, state: SeqState) -> None:
        s.state = state
        s.finish_reason = reason
        s.finished_at = now
        if self.finished is not None:
            self.finished.append(s)

    def _cache_blocks(self, s: TwinSeq, tokens: int, t: float) -> None:
        """Enter ``s``'s full blocks up to ``tokens`` into the prefix cache (each one's key chained on the last)."""
        cache = self.kv.cache
        if cache is None or s.broken or s.own is not None:
            return
        keys = s.keys
        held = s.held
        i = len(held)
        full = tokens // self.bs
        parent = held[-1] if held else None
        while i < full and i < len(keys):
            e = cache.insert(keys[i], parent, i, t, s.priority)
            if e is None:
                s.broken = True
                return
            held.append(e)
            parent = e
            i += 1

    def _start_step(self, t: float) -> float | None:
        if not self.num_running and not self.num_waiting:
            return None
        k = self.k
        kv = self.kv
        bs = self.bs
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold or budget
        preempted = False
        self._chunks = chunks = []

        # 1. decode sequences that cross a block boundary this step need one more block.
        evs = self._block_ev.pop(k, None)
        if evs:
            for s, ev in evs:
                if s.ev != ev or s.state is not SeqState.DECODE:
                    continue
                while not kv.allocate(1):
                    victim = self._pick_victim()
                    self._preempt(victim, t)
                    preempted = True
                    if victim is s:
                        break
                else:
                    s.blocks += 1
                    nxt = k + bs
                    if nxt <= s.j + s.output - s.g0 - 1:
                        self._block_ev.setdefault(nxt, []).append((s, s.ev))
        budget -= len(self.decoding)

        # 2. running requests still in prefill get their next chunk.
        if self.prefilling and budget > 0:
            for s in list(self.prefilling):
                if budget <= 0:
                    break
                if s.state is not SeqState.PREFILL:
                    continue
                n = min(s.num_tokens - s.computed, budget, threshold)
                need = kv.blocks_for(s.computed + n) - s.blocks
                ok = True
                while need > 0 and not kv.allocate(need):
                    victim = self._pick_victim()
                    self._preempt(victim, t)
                    preempted = True
                    if victim is s:
                        ok = False
                        break
                if not ok:
                    break
                if need > 0:
                    s.blocks += need
                chunks.append((s, n, s.computed))
                budget -= n

        # vLLM V1 registers a request's full blocks in its prefix cache when it schedules them, not when they are
        # computed: a request admitted later in the same step already hits them (its attention reads the blocks
        # the same forward pass writes). SGLang's radix cache takes a prefill's tokens after the forward.
        at_schedule = kv.cache is not None and kv.cache.style == "vllm"
        if at_schedule:
            for s, n, c in chunks:
                if s.state is SeqState.PREFILL:
                    self._cache_blocks(s, c + n, t)

        # 3. waiting requests, by priority, while budget, slots and blocks last.
        admitted: list[TwinSeq] = []
        if not preempted:
            waiting = self._waiting
            cache = kv.cache
            max_seqs = cfg.max_num_seqs
            stats = self.stats
            while waiting and budget > 0 and self.num_running < max_seqs:
                s = waiting[0][2]
                if s.state is not SeqState.WAITING:
                    heapq.heappop(waiting)
                    continue
                held: list[Any] = []
                own = None
                hit_blocks = 0
                if cache is not None:
                    held, own = cache.match(s.keys, s.own_key, (s.num_tokens - 1) // bs, t, s.priority)
                    hit_blocks = len(held) + (own.blocks if own is not None else 0)
                computed = hit_blocks * bs
                n = min(s.num_tokens - computed, budget, threshold)
                need = kv.blocks_for(computed + n) - hit_blocks
                if not kv.allocate(need):
                    if cache is not None and (held or own is not None):
                        cache.release(held, own, s.own_key, 0, t)
                    break
                heapq.heappop(waiting)
                self.num_waiting -= 1
                stats.prefix_queries += s.num_tokens
                stats.prefix_hits += computed
                if s.admitted_at is None:
                    s.admitted_at = t if s.arrival is None or t >= s.arrival else s.arrival
                    s.cached_tokens = computed
                s.held = held
                s.own = own
                s.blocks = hit_blocks + need
                s.computed = computed
                s.state = SeqState.PREFILL
                self.prefilling.append(s)
                self.num_running += 1
                self._push_victim(s)
                chunks.append((s, n, computed))
                budget -= n
                admitted.append(s)
                if at_schedule:
                    self._cache_blocks(s, computed + n, t)

        n_dec = len(self.decoding)
        if not chunks and not n_dec:
            if self.num_waiting and not self.num_running:
                log.warning("twin: waiting requests cannot be scheduled (KV cache too small?)")
            return None
        prefill_tokens = 0
        prefill_ctx = 0
        for _, n, c in chunks:
            prefill_tokens += n
            # Attention work: the chunk against the KV before it, plus its own causal half.
            prefill_ctx += c * n + n * n // 2
        dur = self.cost.step_seconds(StepBatch(prefill_tokens, prefill_ctx, n_dec, self._dec_s + n_dec * k))
        if not dur > 0:
            dur = 1e-6
        self._step_decodes = n_dec
        self.step_start = t
        self.step_end = end = t + dur
        st = self.stats
        st.steps += 1
        st.busy_s += dur
        st.prefill_tokens += prefill_tokens
        usage = kv.usage
        st.kv_usage_integral += usage * dur
        if usage > st.kv_usage_max:
            st.kv_usage_max = usage
        st.batch_seqs_integral += (n_dec + len(chunks)) * dur
        if admitted and self.listener is not None:
            self.listener.admitted(admitted, t)
        return end

    def _finish_step(self) -> None:
        t = self.step_end
        assert t is not None
        k = self.k
        bs = self.bs
        listener = self.listener
        decoded = list(self.decoding.values()) if listener is not None else []
        first: list[TwinSeq] = []
        finished: list[TwinSeq] = []
        done_prefill = False
        for s, n, c in self._chunks:
            if s.state is not SeqState.PREFILL:
                continue
            s.computed = computed = c + n
            self._cache_blocks(s, computed, t)  # (the vllm style entered them when it scheduled them)
            if computed < s.num_tokens:
                continue
            # prefill (or recompute) complete: one token is sampled.
            done_prefill = True
            s.generated += 1
            s.num_tokens += 1
            if s.first_token_at is None:
                s.first_token_at = t
            elif s.last_token_at is not None:
                gap = t - s.last_token_at
                self.gap_itls.append(gap)
                if gap > s.gap_max:
                    s.gap_max = gap
            s.last_token_at = t
            first.append(s)
            if s.generated >= s.output:
                s.state = SeqState.DONE
                finished.append(s)
                continue
            # join the decode batch from the next step on
            s.state = SeqState.DECODE
            j = k + 1
            s.j, s.c0, s.g0 = j, computed, s.generated
            self.decoding[s.id] = s
            self._dec_s += computed - j + 1
            ev = s.ev
            fin = j + s.output - s.generated - 1
            self._fin_ev.setdefault(fin, []).append((s, ev))
            kb = j + s.blocks * bs - computed
            if kb <= fin:
                self._block_ev.setdefault(kb, []).append((s, ev))
        if done_prefill:
            self.prefilling = [s for s in self.prefilling if s.state is SeqState.PREFILL]
        n_dec = self._step_decodes
        dur = t - self.step_start
        if n_dec and self.record_steps:
            self.step_durations.append(dur)
            self.step_decodes.append(n_dec)
        stats = self.stats
        stats.generation_tokens += n_dec + len(first)
        evs = self._fin_ev.pop(k, None)
        if evs:
            for s, ev in evs:
                if s.ev != ev or s.state is not SeqState.DECODE:
                    continue
                d = k - s.j + 1
                s.generated = s.g0 + d
                s.computed = s.c0 + d
                s.last_token_at = t
                self._dec_s -= s.c0 - s.j + 1
                del self.decoding[s.id]
                s.ev += 1
                s.state = SeqState.DONE
                finished.append(s)
        for s in finished:
            s.run_token = 0
            self.num_running -= 1
            self.kv.release(s, t)
            reason = "length"
            self._end(s, t, reason, SeqState.DONE)
            stats.finished += 1
        self.step_end = None
        self.k = k + 1
        if listener is not None:
            listener.step_done(t, dur, first, decoded, finished)


_RUNNING = (SeqState.PREFILL, SeqState.DECODE)


# -- block keys ----------------------------------------------------------------------------------------

_GROUP_KEYS: dict[tuple[str, int, int], list[tuple[str, int]]] = {}


def group_keys(group: str, shared_tokens: int, block_size: int) -> list[tuple[str, int]]:
    """Block keys of a trace's shared prefix: every request of ``group`` starts with the same
    ``shared_tokens`` tokens, so its full blocks are ``(group, i)`` (one list per group, shared)."""
    key = (group, shared_tokens, block_size)
    keys = _GROUP_KEYS.get(key)
    if keys is None:
        keys = _GROUP_KEYS[key] = [(group, i) for i in range(shared_tokens // block_size)]
    return keys


def text_token_ids(data: bytes, piece: int = 4) -> list[int]:
    """A cheap deterministic stand-in for a tokenizer: ``piece``-byte pieces, hashed to ints
    (identical prefixes give identical ids)."""
    return [int.from_bytes(data[i : i + piece], "little") for i in range(0, len(data), piece)]


def chain_keys(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[int]:
    """vLLM-style hash chain over the full blocks of ``token_ids``."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    keys: list[int] = []
    h = 0
    for i in range(n):
        h = hash((h, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        keys.append(h)
    return keys


def prompt_block_keys(prompt_key: bytes, prompt_tokens: int, block_size: int) -> list[int]:
    """Block keys of a served request: the canonical prompt bytes cut into 4-byte "tokens"
    (:func:`text_token_ids`), chained per full block, at most ``prompt_tokens // block_size`` of
    them; identical prompt prefixes share blocks."""
    return chain_keys(text_token_ids(prompt_key), block_size, prompt_tokens // block_size)


def make_cost_model(model: str, device: str, dtype: str = "bf16", engine: str | None = None) -> StepCostModel:
    """The roofline cost model with the engine's calibrated per-step overhead when ``engine`` has one
    (hardware.yaml ``engines``)."""
    cost: StepCostModel = RooflineCostModel.from_names(model, device, dtype=dtype, engine=engine)
    return cost
