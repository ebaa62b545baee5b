"""Every NATS subject, stream and consumer name, in one place.

Layout (``<ns>`` is :attr:`InfraSettings.namespace`):

* ``<NS>_REQUESTS`` work-queue stream over ``<ns>.req.>``:
  - ``<ns>.req.pool.<pool>``          any worker of a pool (shared durable consumer ``pool-<pool>``)
  - ``<ns>.req.worker.<pool>.<id>``   one chosen worker (its own consumer ``worker-<id>``)
  The two filters never overlap, as a work-queue stream requires.
* ``<ns>.tok.<gateway_id>.<request_id>`` core NATS: tokens back to the gateway that owns the request
  (one wildcard subscription per gateway instance).
* ``<ns>.tok.<gateway_id>._batch``   core NATS: several requests' stream messages to that gateway in
  one message, newline-separated (:func:`llmlab_common.messages.join_batch`); each carries its own
  ``request_id``. A worker sends one when it has more than one message for that gateway at once.
* ``<ns>.ctl.cancel``                 core NATS broadcast: stop an attempt wherever it is.
* ``<ns>.ctl.alive.<gateway_id>``     request/reply: "is this attempt still wanted?" (redeliveries).
* ``<ns>.hb.<pool>.<worker_id>``      core NATS worker heartbeats with engine load.
* ``<NS>_EVENTS`` interest-retention stream over ``<ns>.evt.>`` (kept until both durable
  consumers, budget-settle and accounting, have acked; full: new events refused):
  - ``<ns>.evt.attempt``  one per attempt (usage, timings, outcome)
  - ``<ns>.evt.request``  one per refused or failed request
* ``<NS>_DEADLETTERS`` over ``<ns>.dlq``: messages no service could use (kept for inspection,
  never retried)
* ``<ns>.budget.reserve``             request/reply gateway → budget (queue group ``budget``):
  authenticate + reserve, before routing. Settlement reads ``<NS>_EVENTS`` through the durable
  consumer ``budget-settle`` shared by every budget replica.
* ``<ns>.budget.reserve_batch``       the same for several requests in one message
  (:class:`~llmlab_common.messages.ReserveBatch`, replies in order): a gateway sends one when
  requests arrive together (:mod:`llmlab_common.coalesce`).
* ``<ns>.router.route``              request/reply gateway → router (queue group ``router``): the
  target chain of one request. Routers read heartbeats and ``<ns>.evt.attempt`` for live state.
* ``<ns>.router.route_batch``        the same for several requests (:class:`~llmlab_common.messages.RouteBatch`).
* ``<ns>.router.commit.<gateway>``   fire-and-forget, from a gateway deciding itself in ``shared`` router
  mode: the target it chose (:class:`~llmlab_common.messages.RouteCommit`), so every other gateway
  and the router service count that work and that prefix as theirs would have been.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PRIORITY_RE = re.compile(r"^p[1-9][0-9]*$")
TOKEN_BATCH = "_batch"  # the last token of a batch subject; never a request id
# Plan priorities 0..PRIORITY_LEVELS-1 (the catalog refuses others): each has its own queue per
# pool, and workers take the higher ones first (priority 0 is the pool's plain subject).
PRIORITY_LEVELS = 4


def check_token(value: str, what: str) -> str:
    """A subject token must not contain '.', '*', '>' or whitespace."""
    if not _TOKEN_RE.match(value):
        raise ValueError(f"{what} {value!r} is not a valid NATS subject token ([A-Za-z0-9_-]{{1,64}})")
    return value


def check_priority(priority: int) -> int:
    if not 0 <= priority < PRIORITY_LEVELS:
        raise ValueError(f"priority {priority} is outside 0..{PRIORITY_LEVELS - 1}")
    return priority


@dataclass(frozen=True)
class Topology:
    namespace: str

    # -- streams -----------------------------------------------------------------------------
    @property
    def requests_stream(self) -> str:
        return f"{self.namespace.upper()}_REQUESTS"

    @property
    def events_stream(self) -> str:
        return f"{self.namespace.upper()}_EVENTS"

    @property
    def requests_wildcard(self) -> str:
        return f"{self.namespace}.req.>"

    @property
    def events_wildcard(self) -> str:
        return f"{self.namespace}.evt.>"

    # -- requests ----------------------------------------------------------------------------
    def pool_subject(self, pool: str, priority: int = 0) -> str:
        """The pool's queue for one plan priority (0: ``<ns>.req.pool.<pool>``, k: ``....p<k>``)."""
        base = f"{self.namespace}.req.pool.{check_token(pool, 'pool')}"
        return base if priority == 0 else f"{base}.p{check_priority(priority)}"

    def worker_subject(self, pool: str, worker_id: str, priority: int = 0) -> str:
        """One worker's own queue (the router addressed the attempt to it), per plan priority."""
        base = f"{self.namespace}.req.worker.{check_token(pool, 'pool')}.{check_token(worker_id, 'worker id')}"
        return base if priority == 0 else f"{base}.p{check_priority(priority)}"

    @staticmethod
    def pool_consumer(pool: str, priority: int = 0) -> str:
        base = f"pool-{check_token(pool, 'pool')}"
        return base if priority == 0 else f"{base}-p{check_priority(priority)}"

    @staticmethod
    def worker_consumer(worker_id: str, priority: int = 0) -> str:
        base = f"worker-{check_token(worker_id, 'worker id')}"
        return base if priority == 0 else f"{base}-p{check_priority(priority)}"

    def request_subject_pool(self, subject: str) -> str | None:
        """The pool of a request subject of this namespace (:meth:`pool_subject` or
        :meth:`worker_subject`, as a consumer's filter names it); None for any other subject."""
        prefix = f"{self.namespace}.req."
        if not subject.startswith(prefix):
            return None
        parts = subject[len(prefix) :].split(".")
        plain = {"pool": 2, "worker": 3}.get(parts[0])
        if plain is not None and len(parts) == plain + 1 and _PRIORITY_RE.match(parts[-1]):
            parts = parts[:-1]  # a priority's queue counts toward its pool
        if (parts[0], len(parts)) in (("pool", 2), ("worker", 3)):
            pool = parts[1]
            return pool if _TOKEN_RE.match(pool) else None
        return None

    def request_subject_worker(self, subject: str) -> str | None:
        """The worker a request subject addresses (:meth:`worker_subject`); None for a pool's."""
        prefix = f"{self.namespace}.req.worker."
        if not subject.startswith(prefix) or self.request_subject_pool(subject) is None:
            return None
        return subject[len(prefix) :].split(".")[1]

    # -- tokens back, control ------------------------------------------------------------------
    def token_subject(self, gateway_id: str, request_id: str) -> str:
        if request_id == TOKEN_BATCH:
            raise ValueError(f"request id {request_id!r} is reserved for batches")
        return f"{self.namespace}.tok.{check_token(gateway_id, 'gateway id')}.{check_token(request_id, 'request id')}"

    def token_batch_subject(self, gateway_id: str) -> str:
        return f"{self.namespace}.tok.{check_token(gateway_id, 'gateway id')}.{TOKEN_BATCH}"

    def batch_subject_for(self, reply_subject: str) -> str | None:
        """The batch subject of the gateway a reply subject belongs to; None when the subject is
        not a token subject of this namespace (then it is published on its own)."""
        prefix = f"{self.namespace}.tok."
        if not reply_subject.startswith(prefix):
            return None
        gateway, dot, request = reply_subject[len(prefix) :].partition(".")
        if not dot or not gateway or not request or "." in request:
            return None
        return f"{prefix}{gateway}.{TOKEN_BATCH}"

    def token_wildcard(self, gateway_id: str) -> str:
        return f"{self.namespace}.tok.{check_token(gateway_id, 'gateway id')}.*"

    @property
    def every_token_wildcard(self) -> str:
        """Every gateway's stream messages (an observer's view: tests find who serves a stream)."""
        return f"{self.namespace}.tok.>"

    @property
    def cancel_subject(self) -> str:
        return f"{self.namespace}.ctl.cancel"

    def alive_subject(self, gateway_id: str) -> str:
        return f"{self.namespace}.ctl.alive.{check_token(gateway_id, 'gateway id')}"

    # -- heartbeats --------------------------------------------------------------------------
    def heartbeat_subject(self, pool: str, worker_id: str) -> str:
        return f"{self.namespace}.hb.{check_token(pool, 'pool')}.{check_token(worker_id, 'worker id')}"

    def heartbeat_matches(self, subject: str, pool: str, worker_id: str) -> bool:
        """Whether a heartbeat came on its own worker's subject (one that names another worker or
        pool than its body is dropped: it would speak for someone else)."""
        try:
            return subject == self.heartbeat_subject(pool, worker_id)
        except ValueError:
            return False

    @property
    def heartbeat_wildcard(self) -> str:
        return f"{self.namespace}.hb.>"

    # -- events ------------------------------------------------------------------------------
    @property
    def attempt_event_subject(self) -> str:
        return f"{self.namespace}.evt.attempt"

    @property
    def request_event_subject(self) -> str:
        return f"{self.namespace}.evt.request"

    @property
    def dead_letter_subject(self) -> str:
        return f"{self.namespace}.dlq"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.namespace.upper()}_DEADLETTERS"

    # -- budget ------------------------------------------------------------------------------
    @property
    def budget_reserve_subject(self) -> str:
        return f"{self.namespace}.budget.reserve"

    @property
    def budget_reserve_batch_subject(self) -> str:
        return f"{self.namespace}.budget.reserve_batch"

    BUDGET_QUEUE_GROUP = "budget"

    # -- router ------------------------------------------------------------------------------
    @property
    def router_route_subject(self) -> str:
        return f"{self.namespace}.router.route"

    @property
    def router_route_batch_subject(self) -> str:
        return f"{self.namespace}.router.route_batch"

    def router_commit_subject(self, gateway_id: str) -> str:
        return f"{self.namespace}.router.commit.{check_token(gateway_id, 'gateway id')}"

    @property
    def router_commit_wildcard(self) -> str:
        return f"{self.namespace}.router.commit.*"

    ROUTER_QUEUE_GROUP = "router"
    BUDGET_SETTLE_CONSUMER = "budget-settle"
    # Durable consumer of the accounting service on the events stream (one writer process).
    ACCOUNTING_CONSUMER = "accounting"


def attempt_event_msg_id(request_id: str, attempt: int, source: str) -> str:
    """Dedup id of an attempt's event: one per (request, attempt) from each source (worker, gateway)."""
    return f"evt:{request_id}:{attempt}:{source}"


def request_event_msg_id(request_id: str) -> str:
    return f"req:{request_id}"


def attempt_msg_id(request_id: str, attempt: int) -> str:
    """JetStream dedup id: a retry (new attempt) is a new message, a re-publish of one attempt is not."""
    return f"{request_id}:{attempt}"
