"""Authentication seam. The budget issue replaces :class:`StaticKeyAuthenticator` with keys,
plans and limits kept in Redis; the gateway only depends on :class:`Authenticator`."""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from llmlab_common.errors import AuthenticationFailed
from llmlab_common.messages import Principal


class Authenticator(Protocol):
    async def authenticate(self, api_key: str | None) -> Principal: ...


def key_id(api_key: str) -> str:
    """A stable, non-secret id for logs and events: a short prefix of the key's hash."""
    return "key_" + hashlib.sha256(api_key.encode()).hexdigest()[:12]


class StaticKeyAuthenticator:
    """Accepts keys whose SHA-256 is configured; keys themselves are never stored."""

    def __init__(self, key_sha256: list[str], plan: str, enabled: bool = True) -> None:
        self._hashes = [h.lower() for h in key_sha256]
        self._plan = plan
        self._enabled = enabled

    async def authenticate(self, api_key: str | None) -> Principal:
        if not self._enabled:
            return Principal(plan=self._plan, key_id="anonymous")
        if not api_key:
            raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.", code="missing_api_key")
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        if not any(hmac.compare_digest(digest, h) for h in self._hashes):
            raise AuthenticationFailed("Incorrect API key provided.")
        return Principal(key_id=key_id(api_key), plan=self._plan)
