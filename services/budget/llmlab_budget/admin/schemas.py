"""The admin API's request bodies and responses (pydantic models, hence its OpenAPI document),
and the conversions from the directory's records."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from llmlab_common.catalog import MAX_LIMIT, LimitSet, ScopeName
from llmlab_common.errors import error_responses
from llmlab_common.jsontypes import Integral
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator
from pydantic.json_schema import SkipJsonSchema

from llmlab_budget.directory import KeyRecord, TeamRecord, TenantRecord, UserRecord

T = TypeVar("T")

# -- request bodies ------------------------------------------------------------------------------

Name = Annotated[StrictStr, Field(min_length=1, max_length=200)]
# Strict: 1.0, true and "5" are refused rather than coerced; bounds per field come from LimitSet
# (checked again by validate_overrides, e.g. max_input_tokens >= 1).
# An integral float (100.0) is the whole number it is, as JSON Schema's integer says.
LimitValue = Annotated[StrictInt, Field(ge=0, le=MAX_LIMIT), Integral] | Literal["unlimited"]
PerRequestLimit = Annotated[StrictInt, Field(ge=1, le=MAX_LIMIT), Integral] | Literal["unlimited"]
# A field that may be left out but not sent as null (_NoNulls): null is not in its schema either.
Absent = SkipJsonSchema[None]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantCreate(_Body):
    name: Name
    plan: StrictStr


class _NoNulls(_Body):
    """Optional fields that may be left out but not sent as null: an explicit null would read
    as "unset", which is never what a caller who typed it meant."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("null is not allowed; leave the field out instead")
        return value


class TenantPatch(_NoNulls):
    name: Name | Absent = None
    plan: StrictStr | Absent = None


class TeamCreate(_Body):
    name: Name
    plan: StrictStr | None = Field(default=None, description='Plan override; null or "" = the tenant\'s plan.')


class NameBody(_Body):
    name: Name


class LimitsPut(_NoNulls):
    """Any LimitSet field: a whole number, or "unlimited" to lift a plan default. Fields left
    out follow the plan. The body replaces the whole override set."""

    daily_tokens: LimitValue | Absent = None
    monthly_tokens: LimitValue | Absent = None
    max_input_tokens: PerRequestLimit | Absent = None
    max_output_tokens: PerRequestLimit | Absent = None
    rpm: LimitValue | Absent = None
    tpm: LimitValue | Absent = None
    max_concurrent: LimitValue | Absent = None


# -- responses -----------------------------------------------------------------------------------


class Page(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]


class TenantOut(BaseModel):
    id: str
    name: str
    plan: str
    created_at: int


class TeamOut(BaseModel):
    id: str
    tenant_id: str
    name: str
    plan: str | None = Field(description="The team's own plan; null = the tenant's.")
    effective_plan: str
    created_at: int


class UserOut(BaseModel):
    id: str
    tenant_id: str
    team_id: str
    name: str
    created_at: int


class KeyOut(BaseModel):
    id: str
    tenant_id: str
    team_id: str
    user_id: str
    name: str
    prefix: str = Field(description="The key's first characters, for recognising it; never usable.")
    created_at: int
    revoked_at: int | None
    replaced_by: str | None


class KeyCreatedOut(KeyOut):
    key: str = Field(description="The API key. Shown once: only its SHA-256 is stored.")


class AdminKeyOut(BaseModel):
    id: str = Field(description="What the key is listed and revoked by (the key itself is never stored)")
    tenant_id: str
    name: str
    created_at: int
    revoked_at: int | None = None


class AdminKeyCreatedOut(AdminKeyOut):
    key: str = Field(description="The tenant admin key. Shown once: only its SHA-256 is stored.")


class AdminKeyList(BaseModel):
    data: list[AdminKeyOut]


class ReservePolicyOut(BaseModel):
    reserve_tokens: int
    min_output_tokens: int
    count_tools: bool
    on_short: Literal["clamp", "refuse"]


class LimitsOut(BaseModel):
    scope: ScopeName
    scope_id: str
    plan: str
    overrides: dict[str, int | Literal["unlimited"]]
    effective: LimitSet = Field(
        description="The plan's defaults for this scope level with the overrides; null = unlimited."
    )
    reserve_policy: ReservePolicyOut


class BudgetWindowOut(BaseModel):
    window: str
    ends_at: str
    used: int
    reserved: int
    limit: int | None
    remaining: int | None


class MinuteOut(BaseModel):
    window: int
    ends_at: str
    requests: int
    tokens: int
    rpm_limit: int | None
    tpm_limit: int | None


class ConcurrentOut(BaseModel):
    current: int
    limit: int | None


class UsageOut(BaseModel):
    scope: ScopeName
    scope_id: str
    plan: str
    day: BudgetWindowOut
    month: BudgetWindowOut
    minute: MinuteOut
    concurrent: ConcurrentOut


def tenant_out(t: TenantRecord) -> TenantOut:
    return TenantOut(id=t.id, name=t.name, plan=t.plan, created_at=t.created_at)


def team_out(t: TeamRecord, tenant_plan: str) -> TeamOut:
    return TeamOut(
        id=t.id,
        tenant_id=t.tenant_id,
        name=t.name,
        plan=t.plan or None,
        effective_plan=t.plan or tenant_plan,
        created_at=t.created_at,
    )


def user_out(u: UserRecord) -> UserOut:
    return UserOut(id=u.id, tenant_id=u.tenant_id, team_id=u.team_id, name=u.name, created_at=u.created_at)


def key_fields(k: KeyRecord) -> dict[str, Any]:
    return {
        "id": k.id,
        "tenant_id": k.tenant_id,
        "team_id": k.team_id,
        "user_id": k.user_id,
        "name": k.name,
        "prefix": k.prefix,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
        "replaced_by": k.replaced_by,
    }


ERROR_RESPONSES = error_responses(
    {
        400: "Invalid request",
        401: "Missing or invalid admin key",
        403: "Not allowed for a tenant admin",
        404: "No such object (or another tenant's)",
        429: "Too many authentication failures from this address (Retry-After)",
    }
)
