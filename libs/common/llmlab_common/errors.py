"""The error hierarchy, mapped once to OpenAI's error shape and HTTP status."""

from __future__ import annotations

from typing import Any

from llmlab_common.messages import ErrorInfo


class LLMLabError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"
    # Set on errors of one attempt: may another attempt (another worker) succeed?
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.headers = headers or {}

    def to_openai(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(status=self.status, type=self.type, code=self.code, message=self.message)


class InvalidRequest(LLMLabError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(LLMLabError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(LLMLabError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFound(LLMLabError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class PayloadTooLarge(LLMLabError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(LLMLabError):
    """429: the queue is full or slow, or a rate limit; always sent with Retry-After."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(max(1, round(retry_after_s)))})
        self.retry_after_s = retry_after_s


class InsufficientQuota(LLMLabError):
    """429: a token budget is spent; Retry-After says when its window rolls over."""

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"

    def __init__(self, message: str, *, retry_after_s: float | None = None, code: str | None = None) -> None:
        headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s is not None else None
        super().__init__(message, code=code, headers=headers)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(LLMLabError):
    """503: nothing can serve this at all (no worker of the pool exists)."""

    status = 503
    type = "service_unavailable"
    code = "no_workers"


class EngineError(LLMLabError):
    status = 502
    type = "server_error"
    code = "engine_error"


class UpstreamTimeout(LLMLabError):
    status = 504
    type = "server_error"
    code = "timeout"


def error_from_info(info: ErrorInfo, retry_after_s: float | None = None) -> LLMLabError:
    """Rebuild an error that crossed NATS as :class:`ErrorInfo` (429s keep their Retry-After)."""
    if info.status == 429:
        if info.type == InsufficientQuota.type:
            return InsufficientQuota(info.message, retry_after_s=retry_after_s, code=info.code)
        return RateLimited(info.message, retry_after_s=retry_after_s or 1.0, code=info.code)
    if info.status == 404 and info.code == ModelNotFound.code:
        return ModelNotFound(info.message)
    for cls in (
        InvalidRequest,
        AuthenticationFailed,
        PermissionDenied,
        NotFound,
        PayloadTooLarge,
        ServiceUnavailable,
        EngineError,
        UpstreamTimeout,
    ):
        if cls.status == info.status:
            return cls(info.message, code=info.code)
    err = LLMLabError(info.message, code=info.code)
    err.status, err.type = info.status, info.type
    return err
