"""Authentication and admission seam.

Every request is *admitted* before routing: the key is authenticated and, with the budget
service, tokens are reserved and ``max_tokens`` possibly clamped (:class:`Admission`). The
gateway depends only on :class:`Admitter`; :class:`StaticKeyAuthenticator` (dev/test, no
budgets) and :class:`llmlab_gateway.budget_client.BudgetAdmitter` implement it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llmlab_common import rules
from llmlab_common.authguard import missing_key
from llmlab_common.errors import AuthenticationFailed
from llmlab_common.expiring import ExpiringMap, ExpiringSet
from llmlab_common.messages import Endpoint, Principal
from llmlab_common.tokens import PromptEstimate


@dataclass(frozen=True)
class AdmissionRequest:
    request_id: str
    endpoint: Endpoint
    model: str
    prompt: PromptEstimate
    requested_max_tokens: int | None
    deadline: float  # Unix time the gateway gives up on the request


@dataclass(frozen=True)
class Admission:
    principal: Principal
    max_tokens: int | None = None  # the output allowance (None: no budget applies)
    reserved_tokens: int = 0


class Admitter(Protocol):
    async def authenticate(self, api_key: str | None) -> Principal: ...

    async def admit(self, api_key: str | None, req: AdmissionRequest) -> Admission: ...


class RefusedKeys(ExpiringSet):
    """SHA-256s of the API keys the budget refused (unknown or revoked) in the last ``ttl_s``:
    the next request with one is refused from its headers, with no budget round trip. Bounded
    (the oldest go first); a key created or restored meanwhile works after ttl_s."""

    def __init__(self, ttl_s: float = 2.0, size: int = 100_000) -> None:
        super().__init__(ttl_s, size)


class AdmittedKeys(ExpiringMap[Principal]):
    """The principal of each API key's (SHA-256's) last admission in the last ``ttl_s``, while
    the admissions since succeeded: the next request of the key is routed on its plan while its
    own reserve is on the way (route-ahead). Only a prediction: that request's admission
    decides, and a decision made on a stale one is made again. Bounded (the oldest go first).
    ``admitting``: the admissions this process awaits now (route-ahead stops past a bound)."""

    def __init__(self, ttl_s: float = 60.0, size: int = 100_000) -> None:
        super().__init__(ttl_s, size)
        self.admitting = 0


def require_key(api_key: str | None) -> str:
    if not api_key:
        raise missing_key("API key")
    return api_key


class StaticKeyAuthenticator:
    """Dev/test only (refused with LLMLAB_ENV=prod): accepts keys whose SHA-256 is configured,
    all on one plan, with no budgets."""

    def __init__(self, key_sha256: list[str], plan: str, enabled: bool = True) -> None:
        self._hashes = [h.lower() for h in key_sha256]
        self._plan = plan
        self._enabled = enabled

    async def authenticate(self, api_key: str | None) -> Principal:
        if not self._enabled:
            return Principal(plan=self._plan, key_id="anonymous")
        api_key = require_key(api_key)
        if not any(rules.key_matches(api_key, h) for h in self._hashes):
            raise AuthenticationFailed("Incorrect API key provided.")
        return Principal(key_id=rules.key_id(api_key), plan=self._plan)

    async def admit(self, api_key: str | None, req: AdmissionRequest) -> Admission:
        return Admission(await self.authenticate(api_key))
