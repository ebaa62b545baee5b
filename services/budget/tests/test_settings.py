"""What a prod budget service refuses to start with."""

from __future__ import annotations

import hashlib

import pytest
from llmlab_budget.settings import DEV_ADMIN_KEY, BudgetSettings
from llmlab_common.settings import InfraSettings

pytestmark = pytest.mark.unit
OWN = hashlib.sha256(b"sk-admin-real").hexdigest()


def _prod(redis_url: str) -> InfraSettings:
    return InfraSettings(env="prod", nats_user="budget", redis_url=redis_url)


def test_prod_refuses_an_unauthenticated_redis() -> None:
    """Catches: a prod budget on a Redis without a password (dd4f538 ran it so and did not
    check): whoever reaches Redis edits keys and ledgers."""
    with pytest.raises(ValueError, match="no password"):
        BudgetSettings(infra=_prod("redis://10.0.0.5:6379/0"), admin_key_sha256=OWN)
    ok = BudgetSettings(infra=_prod("redis://:s3cret@10.0.0.5:6379/0"), admin_key_sha256=OWN)
    assert ok.infra.redis_url.startswith("redis://:s3cret@")
    BudgetSettings(infra=InfraSettings(env="dev"))  # dev: the local Redis as it is


def test_prod_refuses_the_dev_admin_key_in_any_case() -> None:
    dev = hashlib.sha256(DEV_ADMIN_KEY.encode()).hexdigest()
    for spelled in (dev, dev.upper()):
        with pytest.raises(ValueError, match="ADMIN_KEY_SHA256"):
            BudgetSettings(infra=_prod("redis://:pw@h:6379/0"), admin_key_sha256=spelled)
