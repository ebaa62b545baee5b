"""Provision tenants, keys and limits through the budget service's admin API (as a user would)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

DEV_ADMIN_KEY = "sk-admin-dev"


@dataclass(frozen=True)
class Provisioned:
    api_key: str
    tenant_id: str
    team_id: str
    user_id: str
    key_id: str

    def scope_id(self, scope: str) -> str:
        return {"key": self.key_id, "user": self.user_id, "team": self.team_id, "tenant": self.tenant_id}[scope]


class BudgetAdmin:
    def __init__(self, base_url: str, admin_key: str = DEV_ADMIN_KEY) -> None:
        self.client = httpx.Client(
            base_url=base_url.rstrip("/") + "/admin/v1",
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=10,
        )

    def close(self) -> None:
        self.client.close()

    def _ok(self, r: httpx.Response) -> Any:
        if r.status_code >= 400:
            raise AssertionError(f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text}")
        return r.json() if r.content else None

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._ok(self.client.post(path, json=body or {}))

    def get(self, path: str) -> Any:
        return self._ok(self.client.get(path))

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._ok(self.client.put(path, json=body))

    def provision(self, plan: str = "pro", limits: dict[str, dict[str, Any]] | None = None) -> Provisioned:
        """One tenant → team → user → key, with limit overrides per scope (``{"key": {...}}``)."""
        tenant = self.post("/tenants", {"name": "test tenant", "plan": plan})
        team = self.post(f"/tenants/{tenant['id']}/teams", {"name": "test team"})
        user = self.post(f"/teams/{team['id']}/users", {"name": "test user"})
        key = self.post(f"/users/{user['id']}/keys", {"name": "test key"})
        p = Provisioned(key["key"], tenant["id"], team["id"], user["id"], key["id"])
        for scope, values in (limits or {}).items():
            self.put(f"/limits/{scope}/{p.scope_id(scope)}", values)
        return p

    def usage(self, scope: str, scope_id: str) -> Any:
        return self.get(f"/usage/{scope}/{scope_id}")

    def day(self, p: Provisioned, scope: str = "key") -> dict[str, Any]:
        """The scope's daily ledger: ``used``, ``reserved``, ``limit``, ``remaining``."""
        return self.usage(scope, p.scope_id(scope))["day"]

    def concurrent(self, p: Provisioned, scope: str = "key") -> int:
        """Requests of the scope holding a reservation now."""
        return int(self.usage(scope, p.scope_id(scope))["concurrent"]["current"])


class Stream:
    """One streamed chat completion that a test holds open: :meth:`open` returns once the
    headers are in and, when admitted (200), the first content token too; :meth:`read` reads up
    to a number of tokens, :meth:`finish_all` to ``[DONE]``; :meth:`close` drops the connection
    (a client disconnect when the stream is not finished). ``tokens`` counts content chunks: one
    token each while the engine's inter-token time is longer than the worker's coalescing."""

    def __init__(
        self,
        h: httpx.AsyncClient,
        gateway_url: str,
        key: str,
        max_tokens: int,
        text: str = "hello there",
        model: str = "meta-llama/Llama-3.1-8B-Instruct",
    ) -> None:
        self.h, self.url, self.key = h, gateway_url, key
        self.max_tokens, self.text, self.model = max_tokens, text, model
        self.status = 0
        self.error: dict[str, Any] = {}  # the OpenAI error object of a refused request
        self.headers = httpx.Headers()
        self.tokens = 0  # content chunks received (one token each unless the engine merges them)
        self.received = ""  # the content received
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False  # saw [DONE]
        self._cm: AbstractAsyncContextManager[httpx.Response] | None = None
        self._lines: AsyncIterator[str] | None = None

    async def open(self) -> Stream:
        self._cm = self.h.stream(
            "POST",
            self.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {self.key}"},
            json={
                "model": self.model,
                "messages": [{"role": "user", "content": self.text}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": self.max_tokens,
            },
        )
        r = await self._cm.__aenter__()
        self.status, self.headers = r.status_code, r.headers
        if r.status_code != 200:
            self.error = json.loads(await r.aread())["error"]
            await self.close()
            return self
        self._lines = r.aiter_lines()
        await self.read(1)
        return self

    async def _next(self) -> None:
        assert self._lines is not None
        line = await anext(self._lines)
        if not line.startswith("data: "):
            return
        if line == "data: [DONE]":
            self.done = True
            return
        obj = json.loads(line[6:])
        assert "error" not in obj, obj
        if obj.get("usage"):
            self.usage = obj["usage"]
        for c in obj["choices"]:
            if c["delta"].get("content"):
                self.tokens += 1
                self.received += c["delta"]["content"]
            self.finish = c.get("finish_reason") or self.finish

    async def read(self, tokens: int) -> None:
        while self._cm is not None and self._lines is not None and self.tokens < tokens and not self.done:
            await self._next()

    async def finish_all(self) -> Stream:
        while self._cm is not None and self._lines is not None and not self.done:
            await self._next()
        await self.close()
        return self

    async def close(self) -> None:
        if self._cm is not None:
            cm, self._cm = self._cm, None
            await cm.__aexit__(None, None, None)


@dataclass
class Peak:
    """The largest value seen by :func:`watch_peak`, and how many samples it took."""

    value: int = 0
    samples: int = 0
    errors: list[str] = field(default_factory=list)


@contextmanager
def watch_peak(
    base_url: str, scope: str, scope_id: str, window: str = "day", interval_s: float = 0.02
) -> Iterator[Peak]:
    """Sample a scope's ledger in a thread while the block runs and keep the largest value of
    ``used + reserved`` (``window="day"``/``"month"``) or of the minute's tokens
    (``window="minute"``): what the reserve script's admission check bounds at every instant.
    Each sample is one atomic read of the ledger (``/usage`` reads it in one MULTI), so any
    sample above a bound is a real violation; a sample can only miss a peak, never invent one."""
    peak = Peak()
    stop = threading.Event()
    admin = BudgetAdmin(base_url)

    def loop() -> None:
        while not stop.is_set():
            try:
                u = admin.usage(scope, scope_id)
            except (AssertionError, httpx.HTTPError) as exc:  # overloaded: skip the sample
                peak.errors.append(str(exc)[:200])
            else:
                w = u[window]
                v = w["tokens"] if window == "minute" else w["used"] + w["reserved"]
                peak.value = max(peak.value, int(v))
                peak.samples += 1
            time.sleep(interval_s)

    t = threading.Thread(target=loop, name="watch-peak", daemon=True)
    t.start()
    try:
        yield peak
    finally:
        stop.set()
        t.join(10)
        admin.close()
