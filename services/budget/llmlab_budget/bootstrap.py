"""``python -m llmlab_budget.bootstrap --tenant demo --plan enterprise --key-file .run/api-key``

Creates a tenant → team → user → API key straight in Redis (no running service needed) and
writes the key, once, to ``--key-file`` (mode 0600). Idempotent: if the file holds a key that
still authenticates, nothing is created. For first-time setup and the local stack; everything
else goes through the admin API.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from llmlab_common import rules
from llmlab_common.catalog import load_catalog
from llmlab_common.settings import InfraSettings
from redis.asyncio import Redis

from llmlab_budget.directory import Directory
from llmlab_budget.layout import Layout

log = logging.getLogger("llmlab_budget.bootstrap")


async def bootstrap(
    infra: InfraSettings, tenant: str, plan: str, existing_key: str | None, limits: dict[str, int]
) -> str | None:
    """A new API key for a new tenant, or None when ``existing_key`` still authenticates."""
    redis = Redis.from_url(infra.redis_url)
    try:
        directory = Directory(redis, Layout.for_namespace(infra.namespace), load_catalog(infra.catalog_path))
        if existing_key:
            ident = await directory.identity_for_key_hash(rules.hash_key(existing_key))
            if ident is not None and not ident.revoked:
                log.info("existing key still valid (tenant %s); nothing to do", ident.tenant_id)
                return None
        t = await directory.create_tenant(tenant, plan)
        team = await directory.create_team(t.id, f"{tenant}-team")
        user = await directory.create_user(team.id, f"{tenant}-user")
        key, plaintext = await directory.create_key(user.id, f"{tenant}-key")
        if limits:
            await directory.set_overrides("key", key.id, limits)
        log.info("tenant %s (plan %s): key %s created", t.id, plan, key.id)
        return plaintext
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llmlab_budget.bootstrap", description=__doc__.split("\n\n")[1])
    p.add_argument("--tenant", default="demo")
    p.add_argument("--plan", default="enterprise")
    p.add_argument("--key-file", type=Path, required=True)
    p.add_argument("--limit", action="append", default=[], help="key-scope limit override, e.g. daily_tokens=100000")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    limits = {k: int(v) for k, v in (item.split("=", 1) for item in args.limit)}
    path: Path = args.key_file
    existing = path.read_text().strip() if path.exists() else None
    plaintext = asyncio.run(bootstrap(InfraSettings(), args.tenant, args.plan, existing, limits))
    if plaintext is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(plaintext + "\n")
        log.info("key written to %s (shown nowhere else)", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
