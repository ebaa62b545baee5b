"""Authentication before the body, and a limit on authentication failures per client address.

Shared by the gateway (its routes) and the admin APIs (budget, accounting, through
:class:`llmlab_common.http.AuthFirst`). A client without a valid key gets its 401 before its
body is read or parsed, and an address that keeps failing gets 429 before its key is even
looked up. Framework-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llmlab_common.codes import Code
from llmlab_common.errors import AuthenticationFailed, RateLimited
from llmlab_common.expiring import ExpiringSet


def client_address(client_host: str | None, forwarded_for: str | None, trusted_hops: int) -> str:
    """The address authentication failures are counted against. Behind ``trusted_hops`` proxies
    that each append to ``X-Forwarded-For``, it is the entry that many places from the right
    (what the first trusted proxy saw); entries further left are the client's own claims and are
    never used. Without trusted proxies, the TCP peer."""
    if trusted_hops > 0 and forwarded_for:
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        if len(hops) >= trusted_hops:
            return hops[-trusted_hops]
    return client_host or "unknown"


class AuthFailures:
    """Authentication failures per client address, counted in fixed windows of ``window_s``.

    Past ``max_failures`` in a window the address is refused (429, until the window ends)
    before any key lookup, unless it presents a key that authenticated in this process in the
    last ``known_ttl_s``: one client behind a shared address (NAT, a proxy not declared
    trusted) sending bad keys does not lock out the others there. Both maps are bounded
    (``size``; the oldest entries go first). ``max_failures`` <= 0 turns the limit off."""

    def __init__(
        self,
        max_failures: int = 30,
        window_s: float = 60.0,
        known_ttl_s: float = 60.0,
        size: int = 100_000,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.max_failures, self.window_s, self.size = max_failures, window_s, size
        self.clock = clock or (lambda: time.monotonic())
        self.known = ExpiringSet(known_ttl_s, size, clock=lambda: self.clock())
        self._windows: dict[str, tuple[float, int]] = {}  # address -> (window start, failures)

    def is_known(self, key_sha256: str | None) -> bool:
        return key_sha256 is not None and len(self.known) > 0 and key_sha256 in self.known

    def check(self, address: str) -> None:
        """Raise the 429 when ``address`` is past its failures in the current window."""
        if self.max_failures <= 0:
            return
        entry = self._windows.get(address)
        if entry is None:
            return
        start, count = entry
        left = start + self.window_s - self.clock()
        if left <= 0:
            del self._windows[address]
        elif count >= self.max_failures:
            raise RateLimited(
                f"Too many authentication failures from this address: at most {self.max_failures} "
                f"per {self.window_s:g} s.",
                retry_after_s=left,
                code=Code.AUTHENTICATION_FAILURES,
            )

    def failed(self, address: str, key_sha256: str | None = None) -> None:
        """One failure from ``address``; the key (if any) is no longer known good."""
        if key_sha256 is not None:
            self.known.discard(key_sha256)
        if self.max_failures <= 0:
            return
        now = self.clock()
        start, count = self._windows.get(address, (now, 0))
        if start + self.window_s <= now:
            start, count = now, 0
        elif address not in self._windows:
            while len(self._windows) >= self.size:
                del self._windows[next(iter(self._windows))]
        self._windows[address] = (start, count + 1)

    def succeeded(self, key_sha256: str) -> None:
        self.known.add(key_sha256)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when absent or malformed)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def missing_key(what: str = "API key") -> AuthenticationFailed:
    return AuthenticationFailed(f"Missing {what}: send 'Authorization: Bearer <{what}>'.", code=Code.MISSING_API_KEY)
