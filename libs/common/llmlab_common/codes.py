"""Every error code a component of llm-inference-lab puts in OpenAI's ``error.code`` (HTTP) or in
``ErrorInfo.code`` (NATS), in one place. Services raise :mod:`llmlab_common.errors` classes with
these codes and compare codes against these members, never against string literals; a test scans
the packages for stray literals.

:class:`Code` is a ``StrEnum``: a member *is* its string, so it serialises as the plain code.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    # -- 400 invalid_request_error ---------------------------------------------------------------
    INVALID_REQUEST = "invalid_request"
    INVALID_JSON = "invalid_json"  # the body is not JSON, or not a JSON object
    INVALID_VALUE = "invalid_value"  # a parameter with a bad value (``param`` names it)
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    UNKNOWN_PARAMETER = "unknown_parameter"  # strict admin bodies only; the OpenAI API ignores unknown fields
    INVALID_HEADER = "invalid_header"  # an ``x-llmlab-*`` routing header with a bad value
    INVALID_ROUTE_POLICY = "invalid_route_policy"
    INVALID_SLO_CLASS = "invalid_slo_class"
    INVALID_PLAN = "invalid_plan"
    INVALID_ROUTE_QUERY = "invalid_route_query"  # a malformed RouteQuery on NATS
    BAD_RESERVE = "bad_reserve"  # a malformed ReserveRequest on NATS
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # prompt + max_tokens fit no candidate
    INPUT_TOKENS_EXCEEDED = "input_tokens_exceeded"  # a budget scope's per-request input cap
    ENGINE_REJECTED = "engine_rejected"  # the engine refused the request itself
    KEY_REVOKED = "key_revoked"  # admin: a revoked key cannot be rotated
    MULTIPLE_STATEMENTS = "multiple_statements"  # accounting's query endpoint: one statement only
    READ_ONLY = "read_only"  # accounting's query endpoint: SELECT only
    QUERY_FAILED = "query_failed"  # ClickHouse refused the query (its message says why)
    # -- 401 authentication_error ----------------------------------------------------------------
    INVALID_API_KEY = "invalid_api_key"
    MISSING_API_KEY = "missing_api_key"
    API_KEY_REVOKED = "api_key_revoked"
    # -- 403 permission_error --------------------------------------------------------------------
    PERMISSION_DENIED = "permission_denied"
    # -- 404 -------------------------------------------------------------------------------------
    NOT_FOUND = "not_found"  # an unknown path
    MODEL_NOT_FOUND = "model_not_found"
    UNKNOWN_SCOPE = "unknown_scope"
    TENANT_NOT_FOUND = "tenant_not_found"
    TEAM_NOT_FOUND = "team_not_found"
    USER_NOT_FOUND = "user_not_found"
    KEY_NOT_FOUND = "key_not_found"
    # -- 405 / 413 / 422 -------------------------------------------------------------------------
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TOO_LARGE = "request_too_large"
    NO_ROUTE = "no_route"  # no deployment meets the quality floor or the cost cap
    # -- 429 -------------------------------------------------------------------------------------
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # requests per minute
    TOKENS_PER_MINUTE_EXCEEDED = "tokens_per_minute_exceeded"
    CONCURRENCY_LIMIT_EXCEEDED = "concurrency_limit_exceeded"
    INSUFFICIENT_QUOTA = "insufficient_quota"  # a daily or monthly token budget
    QUEUE_TIMEOUT = "queue_timeout"  # no worker took the request within the queue timeout
    OVERLOADED = "overloaded"  # the budget service sheds load
    # Admission: the predicted wait for a worker exceeds the request's SLO class bound (refused at once).
    QUEUE_WAIT_PREDICTED = "queue_wait_predicted"
    AUTHENTICATION_FAILURES = "too_many_authentication_failures"  # per client address (authguard)
    # -- 5xx -------------------------------------------------------------------------------------
    INTERNAL_ERROR = "internal_error"
    HTTP_ERROR = "http_error"  # any other HTTP status the web framework raised
    UNKNOWN_PLAN = "unknown_plan"  # the catalog lost a plan still in use (an operator must fix it)
    NO_WORKERS = "no_workers"
    ALL_ROUTES_FAILED = "all_routes_failed"
    BUDGET_UNAVAILABLE = "budget_unavailable"
    ENGINE_ERROR = "engine_error"
    WORKER_ERROR = "worker_error"
    WORKER_LOST = "worker_lost"
    STREAM_GAP = "stream_gap"  # a token message went missing; the stream cannot be trusted
    TIMEOUT = "timeout"  # a deadline or an idle stream
    # -- why an attempt was cancelled (CancelRequest.reason, and the code of its event) ----------
    CLIENT_DISCONNECTED = "client_disconnected"
    GATEWAY_ABORT = "gateway_abort"
    RETRY = "retry"  # the gateway moved the request to another target
    STALE_STREAM = "stale_stream"  # its stream still came, unread: the earlier cancel was lost
