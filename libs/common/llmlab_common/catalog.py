"""The one catalog (``configs/catalog.yaml``): deployments, dated prices, SLO classes, plans.

Budget, router, accounting, gateway and the simulator read it from here and keep no copies.
It is validated at load; an error names the file and line of the offending value.
"""

from __future__ import annotations

import datetime as dt
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# vLLM and SGLang (the GPU engines); llama.cpp, Ollama, LM Studio and any other OpenAI-compatible server
# (worker-openai, the local backends).
Engine = Literal["vllm", "sglang", "llamacpp", "ollama", "lmstudio", "openai"]
Pipeline = Literal["throughput", "latency", "long_context", "experimental"]


class CatalogError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Priors(_Strict):
    """Latency priors used until live figures replace them (router issue)."""

    ttft_p95_s: float = Field(gt=0)
    itl_p95_s: float = Field(gt=0)


class Deployment(_Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    model: str = Field(min_length=1)  # the public model id clients send
    served_name: str | None = None  # what the engine serves it as, if different
    engine: Engine
    pool: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    pipeline: Pipeline
    max_context: int = Field(gt=0)
    quality: float = Field(ge=0, le=1)
    gpu: str
    gpu_count: int = Field(default=1, ge=1)
    priors: Priors
    aliases: list[str] = Field(default_factory=list)
    supports_tools: bool = True

    @property
    def engine_model(self) -> str:
        return self.served_name or self.model


class ModelPrice(_Strict):
    model: str
    input_per_mtok_usd: float = Field(ge=0)
    output_per_mtok_usd: float = Field(ge=0)
    cached_input_per_mtok_usd: float | None = Field(default=None, ge=0)
    source: str = Field(min_length=1)
    as_of: dt.date


class GpuPrice(_Strict):
    gpu: str
    usd_per_hour: float = Field(ge=0)
    source: str = Field(min_length=1)
    as_of: dt.date


class Prices(_Strict):
    models: list[ModelPrice]
    gpus: list[GpuPrice]


class SloClass(_Strict):
    ttft_p95_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)
    queue_timeout_s: float = Field(default=10.0, gt=0)  # gateway's bound on NATS queue wait

    @model_validator(mode="after")
    def _some_limit(self) -> SloClass:
        if self.ttft_p95_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError("an SLO class needs at least one of ttft_p95_s, tpot_s, e2e_s")
        return self


# Largest limit accepted anywhere: budgets are counted in Redis/Lua numbers (doubles), exact up
# to 2**53; 10**15 tokens is far beyond any real budget and rejects typos like 1e30.
MAX_LIMIT = 10**15


class LimitSet(_Strict):
    """Limits of one scope (a key, user, team or tenant); ``None`` means unlimited.

    Token budgets count input + output tokens; windows roll over at midnight (day) and on the
    first of the month in the budget service's configured time zone; RPM/TPM are per minute."""

    daily_tokens: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    monthly_tokens: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    max_input_tokens: int | None = Field(default=None, ge=1, le=MAX_LIMIT)  # per request
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_LIMIT)  # per request
    rpm: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    tpm: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    max_concurrent: int | None = Field(default=None, ge=0, le=MAX_LIMIT)

    def merged(self, overrides: LimitSet) -> LimitSet:
        """These limits with every field the overrides set replacing ours."""
        return self.model_copy(update=overrides.model_dump(exclude_unset=True))


ScopeName = Literal["key", "user", "team", "tenant"]
SCOPES: tuple[ScopeName, ...] = ("key", "user", "team", "tenant")


class PlanBudget(_Strict):
    """A plan's budget defaults: limits per scope level plus how requests are reserved."""

    key: LimitSet = Field(default_factory=LimitSet)
    user: LimitSet = Field(default_factory=LimitSet)
    team: LimitSet = Field(default_factory=LimitSet)
    tenant: LimitSet = Field(default_factory=LimitSet)
    # Safety margin kept free on every budget when a request reserves (estimation error).
    reserve_tokens: int = Field(default=256, ge=0, le=MAX_LIMIT)
    # Below this output allowance the request is refused (429 insufficient_quota).
    min_output_tokens: int = Field(default=16, ge=1, le=MAX_LIMIT)
    # Tool definitions (and tool calls in the history) count as input tokens.
    count_tools: bool = True
    # When the allowance is below the requested max_tokens: clamp max_tokens, or refuse.
    on_short: Literal["clamp", "refuse"] = "clamp"

    def limits(self, scope: ScopeName) -> LimitSet:
        return getattr(self, scope)


class Plan(_Strict):
    default_max_tokens: int = Field(gt=0)
    quality_floor: float = Field(ge=0, le=1)
    cost_cap_usd: float = Field(gt=0)
    # Higher is served first when workers are saturated (one queue per priority and pool).
    priority: int = Field(default=0, ge=0, le=3)
    slo_class: str
    budget: PlanBudget = Field(default_factory=PlanBudget)


class PoolSpec(_Strict):
    description: str = ""


class Catalog(_Strict):
    version: Literal[1]
    # When given, every deployment's pool must be declared here (a typo is refused, not a new pool).
    pools: dict[str, PoolSpec] | None = None
    deployments: list[Deployment] = Field(min_length=1)
    prices: Prices
    slo_classes: dict[str, SloClass]
    plans: dict[str, Plan]
    # Routing policies: validated by the router (llmlab_routing.config), which owns the plug-in names.
    routing: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _cross_checks(self) -> Catalog:
        ids = [d.id for d in self.deployments]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"duplicate deployment ids: {sorted(dup)}")
        gpus = {g.gpu for g in self.prices.gpus}
        for d in self.deployments:
            if d.gpu not in gpus:
                raise ValueError(f"deployment {d.id!r} uses gpu {d.gpu!r} which has no entry in prices.gpus")
        priced = {p.model for p in self.prices.models}
        for d in self.deployments:
            if d.model not in priced:
                raise ValueError(f"deployment {d.id!r} serves model {d.model!r} which has no entry in prices.models")
        for name, plan in self.plans.items():
            if plan.slo_class not in self.slo_classes:
                raise ValueError(f"plan {name!r} names unknown slo_class {plan.slo_class!r}")
        names: dict[str, str] = {}
        for d in self.deployments:
            for alias in d.aliases:
                if alias in names and names[alias] != d.model:
                    raise ValueError(f"alias {alias!r} points at both {names[alias]!r} and {d.model!r}")
                names[alias] = d.model
        return self

    def located_problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """Cross-references whose error should name a line: (location in the YAML, message)."""
        out: list[tuple[tuple[Any, ...], str]] = []
        if self.pools is not None:
            for i, d in enumerate(self.deployments):
                if d.pool not in self.pools:
                    out.append((("deployments", i, "pool"), f"unknown pool {d.pool!r} (pools: {sorted(self.pools)})"))
        return out

    # -- lookups -----------------------------------------------------------------------------
    @cached_property
    def deployment_pools(self) -> frozenset[str]:
        """The pools some deployment runs in: the ones a gauge per pool has a series for from the
        start, so a pool that never sent a heartbeat reads 0, not missing."""
        return frozenset(d.pool for d in self.deployments)

    @cached_property
    def _by_name(self) -> dict[str, list[Deployment]]:
        out: dict[str, list[Deployment]] = {}
        for d in self.deployments:
            for name in {d.id, d.model, *d.aliases}:
                out.setdefault(name, []).append(d)
        return out

    @cached_property
    def _by_id(self) -> dict[str, Deployment]:
        return {d.id: d for d in self.deployments}

    def deployment(self, deployment_id: str) -> Deployment | None:
        return self._by_id.get(deployment_id)

    def resolve(self, name: str) -> list[Deployment]:
        """Deployments that can serve a public model id, deployment id or alias (catalog order)."""
        return list(self._by_name.get(name, []))

    def require(self, name: str) -> list[Deployment]:
        """:meth:`resolve`, or the OpenAI-shaped 404 for a name nothing serves."""
        from llmlab_common.errors import ModelNotFound  # errors imports messages; keep catalog light

        found = self.resolve(name)
        if not found:
            raise ModelNotFound(f"The model '{name}' does not exist. Available: {', '.join(self.public_models())}.")
        return found

    def public_models(self) -> list[str]:
        seen: dict[str, None] = {}
        for d in self.deployments:
            seen.setdefault(d.model, None)
        return list(seen)

    def model_price(self, model: str) -> ModelPrice | None:
        return next((p for p in self.prices.models if p.model == model), None)

    def gpu_price(self, gpu: str) -> GpuPrice | None:
        return next((g for g in self.prices.gpus if g.gpu == gpu), None)


# -- loading with line numbers ---------------------------------------------------------------


def _construct(
    node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int], loader: yaml.SafeLoader
) -> Any:
    """Build plain Python data from a YAML node tree, recording each value's line by its path."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            out[key] = _construct(value_node, (*path, key), lines, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, (*path, i), lines, loader) for i, child in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def parse_with_lines(text: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[tuple[Any, ...], int] = {}
    if node is None:
        return None, lines
    return _construct(node, (), lines, yaml.SafeLoader("")), lines


def _line_for(loc: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> int | None:
    # pydantic's loc may go deeper than the YAML (a missing field): use the nearest parent.
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def format_problems(
    path: Path, exc: ValidationError, lines: dict[tuple[Any, ...], int], prefix: tuple[Any, ...] = ()
) -> str:
    """One line per pydantic error: ``file:line: dotted.location: message``."""
    problems = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        problems.append(problem_line(path, loc, lines, err["msg"]))
    return "\n  ".join(problems)


def problem_line(path: Path, loc: tuple[Any, ...], lines: dict[tuple[Any, ...], int], msg: str) -> str:
    line = _line_for(loc, lines)
    where = ".".join(str(p) for p in loc) or "<root>"
    return f"{path}:{line or '?'}: {where}: {msg}"


def load_catalog_with_lines(path: str | Path) -> tuple[Catalog, dict[tuple[Any, ...], int]]:
    """The validated catalog and the line of every value (for checks made by other services)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read catalog: {exc}") from exc
    try:
        data, lines = parse_with_lines(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: invalid YAML: {exc}") from exc
    try:
        catalog = Catalog.model_validate(data)
    except ValidationError as exc:
        raise CatalogError("invalid catalog:\n  " + format_problems(path, exc, lines)) from exc
    problems = [problem_line(path, loc, lines, msg) for loc, msg in catalog.located_problems()]
    if problems:
        raise CatalogError("invalid catalog:\n  " + "\n  ".join(problems))
    return catalog, lines


def load_catalog(path: str | Path) -> Catalog:
    return load_catalog_with_lines(path)[0]
