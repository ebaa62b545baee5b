"""Provision tenants, keys and limits through the budget service's admin API (as a user would)."""

from __future__ import annotations

from dataclasses import dataclass
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
