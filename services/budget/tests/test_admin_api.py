"""The admin API over ASGI against real Redis (127.0.0.1:6379), each test under its own prefix."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi import FastAPI
from llmlab_budget.admin import AdminContext, mount_admin_api
from llmlab_budget.directory import Directory
from llmlab_budget.layout import Layout
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.windows import Windows
from llmlab_common.catalog import load_catalog
from llmlab_common.http import install_error_handlers
from llmlab_common.rules import hash_key
from redis.asyncio import Redis

pytestmark = pytest.mark.integration

CATALOG = load_catalog(Path(__file__).resolve().parents[3] / "configs" / "catalog.yaml")
ROOT_KEY = "sk-root-" + uuid.uuid4().hex
NOW = dt.datetime(2026, 3, 15, 12, 34, 56, tzinfo=dt.UTC).timestamp()
MISSING = {"tenant": "ten_0000000000000000", "team": "team_0000000000000000", "user": "usr_0000000000000000"}
MISSING["key"] = "key_0000000000000000"


@dataclass
class Api:
    client: httpx.AsyncClient
    redis: Redis
    layout: Layout
    directory: Directory

    async def call(self, method: str, path: str, key: str | None = ROOT_KEY, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return await self.client.request(method, "/admin/v1" + path, headers=headers, **kw)

    async def ok(self, method: str, path: str, status: int = 200, key: str | None = ROOT_KEY, **kw: Any) -> Any:
        resp = await self.call(method, path, key, **kw)
        assert resp.status_code == status, resp.text
        return resp.json()

    async def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        async for key in self.redis.scan_iter(match=self.layout.all_keys, count=1000):
            kind = await self.redis.type(key)
            assert isinstance(kind, str)  # decode_responses=True
            if kind == "string":
                out[key] = await self.redis.get(key)
            elif kind == "hash":
                out[key] = await self.redis.hgetall(key)
            elif kind == "set":
                out[key] = sorted(await self.redis.smembers(key))
            else:
                out[key] = f"<{kind}>"
        return out


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    redis = Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)
    layout = Layout(f"test_{uuid.uuid4().hex}:bud")
    directory = Directory(redis, layout, CATALOG)
    settings = BudgetSettings(admin_key_sha256=hash_key(ROOT_KEY), timezone="UTC")
    app = FastAPI(title="budget admin (test)")
    install_error_handlers(app, "budget service")
    mount_admin_api(app, AdminContext(directory, CATALOG, settings, redis, layout, clock=lambda: NOW))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://budget.test") as client:
        yield Api(client, redis, layout, directory)
    keys = [k async for k in redis.scan_iter(match=layout.all_keys, count=1000)]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


def assert_error(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


async def make_org(api: Api, name: str, plan: str = "free") -> dict[str, Any]:
    tenant = await api.ok("POST", "/tenants", 201, json={"name": name, "plan": plan})
    admin = await api.ok("POST", f"/tenants/{tenant['id']}/admin-keys", 201, json={"name": f"{name}-ops"})
    team = await api.ok("POST", f"/tenants/{tenant['id']}/teams", 201, json={"name": f"{name}-team"})
    user = await api.ok("POST", f"/teams/{team['id']}/users", 201, json={"name": f"{name}-user"})
    key = await api.ok("POST", f"/users/{user['id']}/keys", 201, json={"name": f"{name}-key"})
    return {"tenant": tenant, "admin_key": admin["key"], "team": team, "user": user, "key": key}


async def test_happy_path(api: Api) -> None:
    tenant = await api.ok("POST", "/tenants", 201, json={"name": "Acme", "plan": "free"})
    assert tenant["plan"] == "free" and tenant["id"].startswith("ten_")
    assert (await api.ok("GET", "/tenants"))["data"] == [tenant]
    assert await api.ok("GET", f"/tenants/{tenant['id']}") == tenant
    patched = await api.ok("PATCH", f"/tenants/{tenant['id']}", json={"plan": "pro"})
    assert patched["plan"] == "pro" and patched["name"] == "Acme"
    tid = tenant["id"]

    team = await api.ok("POST", f"/tenants/{tid}/teams", 201, json={"name": "research"})
    assert team["plan"] is None and team["effective_plan"] == "pro"
    vip = await api.ok("POST", f"/tenants/{tid}/teams", 201, json={"name": "vip", "plan": "enterprise"})
    assert vip["effective_plan"] == "enterprise"
    teams = (await api.ok("GET", f"/tenants/{tid}/teams"))["data"]
    assert sorted(teams, key=lambda t: t["id"]) == sorted([team, vip], key=lambda t: t["id"])
    assert await api.ok("GET", f"/teams/{team['id']}") == team

    user = await api.ok("POST", f"/teams/{team['id']}/users", 201, json={"name": "ada"})
    assert (user["tenant_id"], user["team_id"]) == (tid, team["id"])
    assert (await api.ok("GET", f"/teams/{team['id']}/users"))["data"] == [user]
    assert await api.ok("GET", f"/users/{user['id']}") == user

    created = await api.ok("POST", f"/users/{user['id']}/keys", 201, json={"name": "laptop"})
    plain = created["key"]
    assert plain.startswith("sk-llm-") and plain.startswith(created["prefix"]) and created["revoked_at"] is None
    assert (created["user_id"], created["team_id"], created["tenant_id"]) == (user["id"], team["id"], tid)
    ident = await api.directory.identity_for_key_hash(hash_key(plain))
    assert ident is not None and ident.key_id == created["id"] and ident.plan == "pro"

    listing = await api.call("GET", f"/users/{user['id']}/keys")
    got = await api.ok("GET", f"/keys/{created['id']}")
    for text in (listing.text, json.dumps(got)):
        assert plain not in text and plain[len(created["prefix"]) :] not in text and hash_key(plain) not in text
        assert "sha256" not in text and '"key":' not in text
    assert [k["id"] for k in listing.json()["data"]] == [created["id"]]

    rotated = await api.ok("POST", f"/keys/{created['id']}/rotate", 201)
    assert rotated["key"] != plain and rotated["name"] == "laptop"
    old = await api.ok("GET", f"/keys/{created['id']}")
    assert old["revoked_at"] is not None and old["replaced_by"] == rotated["id"]
    assert_error(await api.call("POST", f"/keys/{created['id']}/rotate"), 400, "key_revoked")
    revoked = await api.ok("POST", f"/keys/{rotated['id']}/revoke")
    assert revoked["revoked_at"] is not None
    assert (await api.ok("POST", f"/keys/{rotated['id']}/revoke"))["revoked_at"] == revoked["revoked_at"]
    ident = await api.directory.identity_for_key_hash(hash_key(rotated["key"]))
    assert ident is not None and ident.revoked

    # Limits: plan defaults per scope level, overrides on top, "unlimited" lifting a default.
    limits = await api.ok("GET", f"/limits/user/{user['id']}")
    pro_user = CATALOG.plans["pro"].budget.user
    assert limits["plan"] == "pro" and limits["overrides"] == {}
    assert limits["effective"] == pro_user.model_dump()
    assert set(limits["reserve_policy"]) == {"reserve_tokens", "min_output_tokens", "count_tools", "on_short"}
    put = await api.ok("PUT", f"/limits/user/{user['id']}", json={"daily_tokens": 1234, "rpm": "unlimited"})
    assert put["overrides"] == {"daily_tokens": 1234, "rpm": "unlimited"}
    assert put["effective"]["daily_tokens"] == 1234 and put["effective"]["rpm"] is None
    assert put["effective"]["tpm"] == pro_user.tpm
    assert await api.ok("GET", f"/limits/user/{user['id']}") == put
    cleared = await api.ok("DELETE", f"/limits/user/{user['id']}")
    assert cleared["overrides"] == {} and cleared["effective"] == pro_user.model_dump()
    vip_limits = await api.ok("GET", f"/limits/team/{vip['id']}")
    assert vip_limits["plan"] == "enterprise"
    assert (await api.ok("GET", f"/limits/tenant/{tid}"))["effective"]["daily_tokens"] is None

    assert (await api.ok("GET", f"/usage/key/{created['id']}"))["day"]["used"] == 0


async def test_usage_reads_the_ledgers(api: Api) -> None:
    o = await make_org(api, "acme")
    uid, layout, r = o["user"]["id"], api.layout, api.redis
    w = Windows.at(NOW, ZoneInfo("UTC"))
    await api.ok("PUT", f"/limits/user/{uid}", json={"daily_tokens": 1000, "monthly_tokens": "unlimited"})
    # What the reserve/settle scripts would have written.
    await r.hset(layout.day("user", uid, w.day), mapping={"used": 600, "reserved": 300})
    await r.hset(layout.month("user", uid, w.month), mapping={"used": 5000, "reserved": 300})
    await r.hset(layout.minute("user", uid, w.minute), mapping={"req": 3, "tok": 900})
    await r.set(layout.concurrent("user", uid), 2)
    await r.hset(layout.day("user", uid, "2026-03-14"), mapping={"used": 99999})  # yesterday: not counted

    usage = await api.ok("GET", f"/usage/user/{uid}")
    free_user = CATALOG.plans["free"].budget.user
    assert usage["plan"] == "free" and usage["scope"] == "user" and usage["scope_id"] == uid
    assert usage["day"] == {
        "window": "2026-03-15",
        "ends_at": "2026-03-16T00:00:00Z",
        "used": 600,
        "reserved": 300,
        "limit": 1000,
        "remaining": 100,
    }
    assert usage["month"]["window"] == "2026-03" and usage["month"]["ends_at"] == "2026-04-01T00:00:00Z"
    assert usage["month"]["limit"] is None and usage["month"]["remaining"] is None
    assert usage["minute"] == {
        "window": int(NOW // 60),
        "ends_at": "2026-03-15T12:35:00Z",
        "requests": 3,
        "tokens": 900,
        "rpm_limit": free_user.rpm,
        "tpm_limit": free_user.tpm,
    }
    assert usage["concurrent"] == {"current": 2, "limit": free_user.max_concurrent}

    await r.hset(layout.day("user", uid, w.day), mapping={"used": 990})  # over: remaining floors at 0
    assert (await api.ok("GET", f"/usage/user/{uid}"))["day"]["remaining"] == 0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-wrong"},
        {"Authorization": f"Basic {ROOT_KEY}"},
        {"Authorization": "Bearer "},
        {"Authorization": ROOT_KEY},
    ],
)
async def test_missing_or_wrong_admin_key_is_401(api: Api, headers: dict[str, str]) -> None:
    for method, path, body in [
        ("GET", "/tenants", None),
        ("POST", "/tenants", {"name": "x", "plan": "free"}),
        ("GET", f"/usage/user/{MISSING['user']}", None),
    ]:
        resp = await api.client.request(method, "/admin/v1" + path, headers=headers, json=body)
        assert assert_error(resp, 401)["type"] == "authentication_error"
    # Authenticated before the body is parsed (dd4f538 answered a bad body's 422 to anyone).
    resp = await api.client.post("/admin/v1/tenants", headers=headers, content=b"{not json")
    assert assert_error(resp, 401)["type"] == "authentication_error"
    assert await api.dump() == {}


async def test_an_address_failing_to_authenticate_is_refused_from_its_headers(api: Api) -> None:
    """Catches: no limit on admin authentication failures (dd4f538): a client could try keys
    as fast as the service answered, each one a Redis lookup."""
    o = await make_org(api, "acme")  # the root key authenticated from this address
    await api.ok("GET", f"/tenants/{o['tenant']['id']}", 200, key=o["admin_key"])  # and this one
    unused_admin = await api.ok("POST", f"/tenants/{o['tenant']['id']}/admin-keys", 201, json={"name": "spare"})
    limit = BudgetSettings().auth_max_failures
    for i in range(limit):
        assert_error(await api.call("GET", "/tenants", key=f"sk-guess-{i}"), 401)
    err = assert_error(await api.call("GET", "/tenants", key="sk-guess-more"), 429, "too_many_authentication_failures")
    assert "authentication failures" in err["message"]
    # Keys that authenticated here lately still work from the address; any other key waits.
    await api.ok("GET", "/tenants", 200)
    await api.ok("GET", f"/tenants/{o['tenant']['id']}", 200, key=o["admin_key"])
    assert_error(await api.call("GET", f"/tenants/{o['tenant']['id']}", key=unused_admin["key"]), 429)


async def test_api_key_is_not_an_admin_key(api: Api) -> None:
    o = await make_org(api, "acme")
    assert_error(await api.call("GET", "/tenants", key=o["key"]["key"]), 401)


async def test_tenant_admin_isolation(api: Api) -> None:
    a = await make_org(api, "alpha")
    b = await make_org(api, "bravo")
    ka = a["admin_key"]
    b_ids = {"tenant": b["tenant"]["id"], "team": b["team"]["id"], "user": b["user"]["id"], "key": b["key"]["id"]}
    before = await api.dump()

    # A sees only itself.
    assert [t["id"] for t in (await api.ok("GET", "/tenants", key=ka))["data"]] == [a["tenant"]["id"]]

    def probes(ids: dict[str, str]) -> list[tuple[str, str, dict[str, Any] | None]]:
        return [
            ("GET", f"/tenants/{ids['tenant']}", None),
            ("GET", f"/tenants/{ids['tenant']}/teams", None),
            ("POST", f"/tenants/{ids['tenant']}/teams", {"name": "intruder"}),
            ("GET", f"/teams/{ids['team']}", None),
            ("GET", f"/teams/{ids['team']}/users", None),
            ("POST", f"/teams/{ids['team']}/users", {"name": "intruder"}),
            ("GET", f"/users/{ids['user']}", None),
            ("GET", f"/users/{ids['user']}/keys", None),
            ("POST", f"/users/{ids['user']}/keys", {"name": "intruder"}),
            ("GET", f"/keys/{ids['key']}", None),
            ("POST", f"/keys/{ids['key']}/revoke", None),
            ("POST", f"/keys/{ids['key']}/rotate", None),
            *[("GET", f"/limits/{s}/{ids[s]}", None) for s in ("tenant", "team", "user", "key")],
            *[("PUT", f"/limits/{s}/{ids[s]}", {"rpm": 1}) for s in ("team", "user", "key")],
            *[("DELETE", f"/limits/{s}/{ids[s]}", None) for s in ("team", "user", "key")],
            *[("GET", f"/usage/{s}/{ids[s]}", None) for s in ("tenant", "team", "user", "key")],
        ]

    b_data = [b["tenant"]["name"], b["team"]["name"], b["user"]["name"], b["key"]["prefix"], "bravo"]
    for (method, path, body), (_, missing_path, _) in zip(probes(b_ids), probes(MISSING), strict=True):
        resp = await api.call(method, path, key=ka, json=body)
        err = assert_error(resp, 404)
        assert not any(d in resp.text for d in b_data), resp.text
        # Indistinguishable from an id that does not exist (no existence oracle).
        twin = await api.call(method, missing_path, key=ka, json=body)
        assert twin.status_code == 404
        swapped = json.loads(json.dumps(twin.json()).replace(MISSING["tenant"], b_ids["tenant"]))
        for scope in ("team", "user", "key"):
            swapped = json.loads(json.dumps(swapped).replace(MISSING[scope], b_ids[scope]))
        assert swapped == {"error": err}, (path, swapped, err)

    # Root-only operations: 403 (for its own tenant too).
    assert_error(await api.call("POST", "/tenants", key=ka, json={"name": "mine", "plan": "free"}), 403)
    assert_error(await api.call("PATCH", f"/tenants/{a['tenant']['id']}", key=ka, json={"plan": "enterprise"}), 403)
    assert_error(await api.call("PATCH", f"/tenants/{b_ids['tenant']}", key=ka, json={"plan": "free"}), 403)
    assert_error(await api.call("POST", f"/tenants/{a['tenant']['id']}/admin-keys", key=ka, json={"name": "x"}), 403)
    assert await api.dump() == before

    # Within its own tenant A may work, but not escape its plan.
    tid = a["tenant"]["id"]
    team = await api.ok("POST", f"/tenants/{tid}/teams", 201, key=ka, json={"name": "own"})
    assert team["effective_plan"] == "free"
    assert_error(await api.call("POST", f"/tenants/{tid}/teams", key=ka, json={"name": "x", "plan": "enterprise"}), 403)
    assert_error(await api.call("PUT", f"/limits/tenant/{tid}", key=ka, json={"rpm": 1}), 403)
    assert_error(await api.call("DELETE", f"/limits/tenant/{tid}", key=ka), 403)
    uid = a["user"]["id"]
    assert_error(await api.call("PUT", f"/limits/user/{uid}", key=ka, json={"rpm": "unlimited"}), 403)
    assert_error(await api.call("PUT", f"/limits/user/{uid}", key=ka, json={"daily_tokens": 10**9}), 403)
    tightened = await api.ok("PUT", f"/limits/user/{uid}", key=ka, json={"daily_tokens": 10, "rpm": 1})
    assert tightened["effective"]["daily_tokens"] == 10
    # The key level has no plan default: any value there only narrows the user's limits.
    await api.ok("PUT", f"/limits/key/{a['key']['id']}", key=ka, json={"daily_tokens": 10**12})
    new = await api.ok("POST", f"/keys/{a['key']['id']}/rotate", 201, key=ka)
    assert new["tenant_id"] == tid
    assert (await api.ok("GET", f"/usage/user/{uid}", key=ka))["day"]["limit"] == 10


BAD_INPUTS: list[tuple[str, str, dict[str, Any], int, str | None]] = [
    ("GET", "/limits/org/{tenant}", {}, 404, "unknown_scope"),
    ("PUT", "/limits/bogus/{user}", {"json": {"rpm": 1}}, 404, "unknown_scope"),
    ("GET", "/usage/bogus/{user}", {}, 404, "unknown_scope"),
    ("PUT", "/limits/user/{user}", {"json": {"rpm": -1}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"daily_tokens": 10**30}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"daily_tokens": 1.5}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"daily_tokens": 100.5}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"daily_tokens": True}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"daily_tokens": "100"}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"daily_tokens": None}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"max_input_tokens": 0}}, 400, "invalid_value"),
    ("PUT", "/limits/user/{user}", {"json": {"rpm": 1, "bogus": 1}}, 400, "unknown_parameter"),
    ("PUT", "/limits/user/{user}", {"json": [{"rpm": 1}]}, 400, "invalid_json"),
    (
        "PUT",
        "/limits/user/{user}",
        {"content": b'{"rpm": 1', "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
    ),
    (
        "PUT",
        "/limits/user/{user}",
        {"content": b"rpm=1", "headers": {"content-type": "text/plain"}},
        400,
        "invalid_json",
    ),
    ("PUT", "/limits/user/{missing_user}", {"json": {"rpm": 1}}, 404, "user_not_found"),
    ("PUT", "/limits/user/{tenant}", {"json": {"rpm": 1}}, 404, "user_not_found"),
    ("POST", "/tenants", {"json": {"name": "x", "plan": "platinum"}}, 400, "unknown_plan"),
    ("POST", "/tenants", {"json": {"name": "x", "plan": "free", "owner": "me"}}, 400, "unknown_parameter"),
    ("POST", "/tenants", {"json": {"name": "", "plan": "free"}}, 400, "invalid_value"),
    ("POST", "/tenants", {"json": {"name": "x" * 201, "plan": "free"}}, 400, "invalid_value"),
    ("POST", "/tenants", {"json": {"name": 7, "plan": "free"}}, 400, "invalid_value"),
    ("POST", "/tenants", {"json": {"plan": "free"}}, 400, "missing_required_parameter"),
    ("POST", "/tenants", {"json": "Acme"}, 400, "invalid_json"),
    ("POST", "/tenants", {}, 400, "invalid_json"),
    ("PATCH", "/tenants/{tenant}", {"json": {"plan": "platinum"}}, 400, "unknown_plan"),
    ("PATCH", "/tenants/{tenant}", {"json": {"name": None}}, 400, "invalid_value"),
    ("POST", "/tenants/{tenant}/teams", {"json": {"name": "t", "plan": "platinum"}}, 400, "unknown_plan"),
    ("POST", "/teams/{team}/users", {"json": {"name": "u", "role": "admin"}}, 400, "unknown_parameter"),
    ("POST", "/users/{user}/keys", {"json": {"name": "k", "key": "sk-llm-mine"}}, 400, "unknown_parameter"),
    ("GET", "/teams/{tenant}", {}, 404, "team_not_found"),
    ("GET", "/tenants/{tenant}:teams", {}, 404, "tenant_not_found"),
    ("GET", "/nowhere", {}, 404, "not_found"),
    ("DELETE", "/tenants/{tenant}", {}, 405, "method_not_allowed"),
]


@pytest.mark.parametrize(("method", "path", "kw", "status", "code"), BAD_INPUTS)
async def test_bad_input_is_refused_and_changes_nothing(
    api: Api, method: str, path: str, kw: dict[str, Any], status: int, code: str | None
) -> None:
    o = await make_org(api, "acme")
    await api.ok("PUT", f"/limits/user/{o['user']['id']}", json={"monthly_tokens": 77})
    ids = {
        "tenant": o["tenant"]["id"],
        "team": o["team"]["id"],
        "user": o["user"]["id"],
        "missing_user": MISSING["user"],
    }
    before = await api.dump()
    kw = dict(kw)
    headers = {"Authorization": f"Bearer {ROOT_KEY}", **kw.pop("headers", {})}
    resp = await api.client.request(method, "/admin/v1" + path.format(**ids), headers=headers, **kw)
    err = assert_error(resp, status, code)
    if code in ("invalid_value", "unknown_parameter", "missing_required_parameter"):
        assert err["param"] and err["param"] in err["message"]  # names the field
    assert await api.dump() == before


async def test_openapi_documents_the_api(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    ops = [op for path in spec["paths"].values() for op in path.values()]
    assert len(ops) >= 19
    assert all(op.get("summary") and op.get("tags") for op in ops)
    assert "/admin/v1/limits/{scope}/{scope_id}" in spec["paths"]
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    # Each creation links to the operations that take the id it returns (what a stateful fuzzer
    # and client generators follow): every link names an operation and exactly its path parameters.
    by_id = {op["operationId"]: op for op in ops}
    links = {
        (path, name): link
        for path, item in spec["paths"].items()
        for op in item.values()
        for name, link in op["responses"].get("201", {}).get("links", {}).items()
    }
    assert len({path for path, _ in links}) == 5 and len(links) >= 20
    for (path, name), link in links.items():
        target = by_id[link["operationId"]]
        wanted = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
        assert set(link["parameters"]) == wanted, (path, name, link)
    created_user = spec["paths"]["/admin/v1/teams/{team_id}/users"]["post"]["responses"]["201"]["links"]
    assert created_user[by_id_of(spec, "POST", "/admin/v1/users/{user_id}/keys")]["parameters"] == {
        "user_id": "$response.body#/id"
    }


def by_id_of(spec: dict[str, Any], method: str, path: str) -> str:
    return str(spec["paths"][path][method.lower()]["operationId"])


async def test_a_tenant_admin_key_is_revoked_through_the_api(api: Api) -> None:
    """A leaked tenant admin key: listed by id (never the key), revoked by root or an admin of
    the same tenant, refused (401) at once; another tenant cannot see or revoke it; a root limit
    survives the tenant admin's delete."""
    a, b = await make_org(api, "alpha"), await make_org(api, "bravo")
    tid = a["tenant"]["id"]
    second = await api.ok("POST", f"/tenants/{tid}/admin-keys", 201, json={"name": "second"})
    listed = (await api.ok("GET", f"/tenants/{tid}/admin-keys", key=a["admin_key"]))["data"]
    assert {k["id"] for k in listed} >= {second["id"]} and all("key" not in k for k in listed)
    assert_error(await api.call("POST", f"/tenants/{tid}/admin-keys/{second['id']}/revoke", key=b["admin_key"]), 404)
    revoked = await api.ok("POST", f"/tenants/{tid}/admin-keys/{second['id']}/revoke", key=a["admin_key"])
    assert revoked["revoked_at"] is not None
    assert_error(await api.call("GET", f"/tenants/{tid}", key=second["key"]), 401)
    await api.ok("GET", f"/tenants/{tid}", key=a["admin_key"])  # the other admin key still works
    uid = a["user"]["id"]
    await api.ok("PUT", f"/limits/user/{uid}", json={"daily_tokens": 7})  # root
    await api.ok("DELETE", f"/limits/user/{uid}", key=a["admin_key"])
    assert (await api.ok("GET", f"/limits/user/{uid}"))["effective"]["daily_tokens"] == 7
