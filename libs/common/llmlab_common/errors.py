"""The error hierarchy, mapped once to OpenAI's error shape and HTTP status.

An error is complete when it is constructed and immutable afterwards: its class fixes the status
and type, the caller gives the message, the code (a :class:`~llmlab_common.codes.Code`), the
``param``, extra headers and whether another attempt could succeed (``retryable``). Rebuilding an
error that crossed NATS (:func:`error_from_info`) picks the class by status, so nothing is patched
after the fact. :func:`llmlab_common.http.install_error_handlers` answers every error of a web app
in this shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import BaseModel

from llmlab_common.codes import Code
from llmlab_common.messages import ErrorInfo


class ErrorDetail(BaseModel):
    """OpenAI's error object: what every error response of every service carries."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_responses(descriptions: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route's error statuses, each with the OpenAI error body."""
    return {status: {"model": ErrorResponse, "description": text} for status, text in descriptions.items()}


class LLMLabError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[Code] = Code.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = code if code is not None else self.default_code
        self.param = param
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers or {}))
        # Set on errors of one attempt: may another attempt (another worker) succeed?
        self.retryable = retryable
        self._frozen = True

    def __setattr__(self, name: str, value: object) -> None:
        # Python itself sets dunder attributes on exceptions (__traceback__, __notes__, ...).
        if getattr(self, "_frozen", False) and not name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} is immutable; build the error complete instead")
        super().__setattr__(name, value)

    def to_openai(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, type=self.type, code=self.code, message=self.message)


class InvalidRequest(LLMLabError):
    status = 400
    type = "invalid_request_error"
    default_code = Code.INVALID_REQUEST


class AuthenticationFailed(LLMLabError):
    status = 401
    type = "authentication_error"
    default_code = Code.INVALID_API_KEY


class PermissionDenied(LLMLabError):
    status = 403
    type = "permission_error"
    default_code = Code.PERMISSION_DENIED


class NotFound(LLMLabError):
    status = 404
    type = "invalid_request_error"
    default_code = Code.NOT_FOUND


class ModelNotFound(NotFound):
    default_code = Code.MODEL_NOT_FOUND


class MethodNotAllowed(LLMLabError):
    status = 405
    type = "invalid_request_error"
    default_code = Code.METHOD_NOT_ALLOWED


class PayloadTooLarge(LLMLabError):
    status = 413
    type = "invalid_request_error"
    default_code = Code.REQUEST_TOO_LARGE


class Unprocessable(LLMLabError):
    """422: a valid request nothing can serve under its constraints (quality floor, cost cap)."""

    status = 422
    type = "invalid_request_error"
    default_code = Code.NO_ROUTE


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, round(seconds)))}


class RateLimited(LLMLabError):
    """429: the queue is full or slow, or a rate limit; always sent with Retry-After."""

    status = 429
    type = "rate_limit_error"
    default_code = Code.RATE_LIMIT_EXCEEDED

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None, retryable: bool = False) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, code=code, headers=_retry_after(retry_after_s), retryable=retryable)


class InsufficientQuota(LLMLabError):
    """429: a token budget is spent; Retry-After says when its window rolls over."""

    status = 429
    type = "insufficient_quota"
    default_code = Code.INSUFFICIENT_QUOTA

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, code: str | None = None, retryable: bool = False
    ) -> None:
        self.retry_after_s = retry_after_s
        headers = _retry_after(retry_after_s) if retry_after_s is not None else None
        super().__init__(message, code=code, headers=headers, retryable=retryable)


class ServiceUnavailable(LLMLabError):
    """503: nothing can serve this at all (no worker of the pool exists)."""

    status = 503
    type = "service_unavailable"
    default_code = Code.NO_WORKERS


class EngineError(LLMLabError):
    status = 502
    type = "server_error"
    default_code = Code.ENGINE_ERROR


class UpstreamTimeout(LLMLabError):
    status = 504
    type = "server_error"
    default_code = Code.TIMEOUT


class HttpError(LLMLabError):
    """Any other HTTP status raised by the web framework itself; the status is the instance's."""

    default_code = Code.HTTP_ERROR

    def __init__(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None, retryable: bool = False
    ) -> None:
        self.status = status  # type: ignore[misc]  # an instance attribute, set before the freeze
        self.type = "invalid_request_error" if status < 500 else "server_error"  # type: ignore[misc]
        super().__init__(message, headers=headers, retryable=retryable)


# By status, the class that rebuilds an error that crossed NATS (429 has two: see error_from_info).
_BY_STATUS: dict[int, type[LLMLabError]] = {
    cls.status: cls
    for cls in (
        InvalidRequest,
        AuthenticationFailed,
        PermissionDenied,
        NotFound,
        MethodNotAllowed,
        PayloadTooLarge,
        Unprocessable,
        ServiceUnavailable,
        EngineError,
        UpstreamTimeout,
    )
}


def error_from_info(info: ErrorInfo, retry_after_s: float | None = None, *, retryable: bool = False) -> LLMLabError:
    """Rebuild an error that crossed NATS as :class:`ErrorInfo` (429s keep their Retry-After)."""
    if info.status == 429:
        if info.type == InsufficientQuota.type:
            return InsufficientQuota(info.message, retry_after_s=retry_after_s, code=info.code, retryable=retryable)
        return RateLimited(info.message, retry_after_s=retry_after_s or 1.0, code=info.code, retryable=retryable)
    if info.status == 404 and info.code == Code.MODEL_NOT_FOUND:
        return ModelNotFound(info.message, retryable=retryable)
    cls = _BY_STATUS.get(info.status)
    if cls is not None:
        return cls(info.message, code=info.code, retryable=retryable)
    if info.status == 500:
        return LLMLabError(info.message, code=info.code, retryable=retryable)
    return HttpError(info.status, info.message, retryable=retryable)


def invalid_request(errors: Sequence[Mapping[str, Any]]) -> InvalidRequest:
    """A pydantic validation failure (of a request body) as one clear 400 naming the parameter.

    ``errors`` is pydantic's ``errors()`` list, from the body model itself or from FastAPI (whose
    locations start with ``"body"``). A union field fails once per member of the union: the
    parameter is the location all of its errors share, and the message lists each reason once."""
    first = errors[0]
    kind = first.get("type", "")
    loc = _body_loc(first)
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return InvalidRequest(f"Request body is not valid JSON: {detail}.", code=Code.INVALID_JSON)
    if not loc:
        if kind == "missing":
            return InvalidRequest("A JSON object request body is required.", code=Code.INVALID_JSON)
        return InvalidRequest(
            "Request body must be a JSON object (with Content-Type: application/json).", code=Code.INVALID_JSON
        )
    same = [e for e in errors if _body_loc(e)[:1] == loc[:1]]
    shared = loc
    for e in same[1:]:
        other = _body_loc(e)
        n = 0
        while n < min(len(shared), len(other)) and shared[n] == other[n]:
            n += 1
        shared = shared[:n]
    param = ".".join(str(p) for p in shared)
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unknown parameter: '{param}'.", param=param, code=Code.UNKNOWN_PARAMETER)
    if kind == "missing":
        return InvalidRequest(
            f"Missing required parameter: '{param}'.", param=param, code=Code.MISSING_REQUIRED_PARAMETER
        )
    msgs = list(dict.fromkeys(str(e.get("msg", "")).removeprefix("Value error, ") for e in same))
    reason = "; or ".join(msgs).rstrip(".")
    return InvalidRequest(f"Invalid value for '{param}': {reason}.", param=param, code=Code.INVALID_VALUE)


def _body_loc(error: Mapping[str, Any]) -> tuple[Any, ...]:
    loc = tuple(error.get("loc", ()))
    return loc[1:] if loc[:1] == ("body",) else loc
