"""The ``routing:`` section of the one catalog, validated with the line of every error, plus a
holder that reloads the catalog and keeps the last good one when a reload fails."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmlab_common.catalog import Catalog, CatalogError, format_problems, load_catalog_with_lines, problem_line
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmlab_routing.plugins import FILTERS, PICKERS, SCORERS

log = logging.getLogger(__name__)

DEFAULT_FILTERS = ["healthy", "context", "tools", "quality-floor", "cost-cap", "difficulty", "slo"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicySpec(_Strict):
    filters: list[str] = Field(default_factory=lambda: list(DEFAULT_FILTERS))
    # scorer name -> weight; weights are normalised over the scorers used (their sum need not be 1)
    scorers: dict[str, float] = Field(default_factory=dict)
    # per SLO class, replacement weights (e.g. batch traffic cares little about latency)
    slo_weights: dict[str, dict[str, float]] = Field(default_factory=dict)
    picker: str = "least-load"

    @field_validator("scorers")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        for name, w in v.items():
            if w < 0:
                raise ValueError(f"weight of {name!r} must be >= 0, got {w}")
        return v

    def weights_for(self, slo_class: str) -> dict[str, float]:
        return self.slo_weights.get(slo_class, self.scorers)


class AliasSpec(_Strict):
    policy: str


class RoutingConfig(_Strict):
    default_policy: str
    max_chain: int = Field(default=3, ge=1, le=8)
    replica_retries: int = Field(default=1, ge=0, le=4)
    prefix_block_chars: int = Field(default=256, ge=16, le=65536)
    prefix_max_blocks: int = Field(default=8, ge=0, le=64)
    load_bound: float = Field(default=0.25, ge=0, le=10)
    stats_window_s: float = Field(default=60.0, gt=0)
    min_samples: int = Field(default=5, ge=1)
    difficulty_floors: dict[str, float] = Field(default_factory=lambda: {"easy": 0.0, "medium": 0.3, "hard": 0.6})
    # Request classes (llmlab_routing.features.request_class; the ``pipeline`` filter): a prompt this long
    # is long-context; an interactive request asking at most this many output tokens is latency.
    class_long_prompt_tokens: int = Field(default=1024, ge=1)
    class_latency_max_output: int = Field(default=512, ge=1)
    aliases: dict[str, AliasSpec] = Field(default_factory=dict)
    policies: dict[str, PolicySpec] = Field(min_length=1)

    def located_problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """Names that must exist: policies and plug-ins (the registry is the router's)."""
        out: list[tuple[tuple[Any, ...], str]] = []
        known = sorted(self.policies)
        if self.default_policy not in self.policies:
            out.append((("default_policy",), f"unknown policy {self.default_policy!r} (policies: {known})"))
        for alias, spec in self.aliases.items():
            if spec.policy not in self.policies:
                out.append((("aliases", alias, "policy"), f"unknown policy {spec.policy!r} (policies: {known})"))
        for name, p in self.policies.items():
            for i, f in enumerate(p.filters):
                if f not in FILTERS:
                    out.append((("policies", name, "filters", i), f"unknown filter {f!r} (filters: {sorted(FILTERS)})"))
            weight_maps = [(("policies", name, "scorers"), p.scorers)] + [
                (("policies", name, "slo_weights", cls), w) for cls, w in p.slo_weights.items()
            ]
            for loc, weights in weight_maps:
                for s in weights:
                    if s not in SCORERS:
                        out.append(((*loc, s), f"unknown scorer {s!r} (scorers: {sorted(SCORERS)})"))
            if p.picker not in PICKERS:
                out.append((("policies", name, "picker"), f"unknown picker {p.picker!r} (pickers: {sorted(PICKERS)})"))
        for cls in ("easy", "medium", "hard"):
            if cls not in self.difficulty_floors:
                out.append((("difficulty_floors",), f"missing difficulty class {cls!r}"))
        return out


def policy_version(catalog: Catalog) -> str:
    """Content hash of what a decision depends on in the catalog (deployments, prices, plans, SLOs, routing)."""
    blob = json.dumps(catalog.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class RouterCatalog:
    """A validated catalog with its routing config (immutable; reload builds a new one)."""

    def __init__(self, catalog: Catalog, routing: RoutingConfig, source: str) -> None:
        self.catalog = catalog
        self.routing = routing
        self.source = source
        self.version = policy_version(catalog)


def load_router_catalog(path: str | Path) -> RouterCatalog:
    """Load and validate; every error names ``file:line``. Raises :class:`CatalogError`."""
    path = Path(path)
    catalog, lines = load_catalog_with_lines(path)
    if catalog.routing is None:
        raise CatalogError(f"{path}: the catalog has no 'routing:' section")
    try:
        routing = RoutingConfig.model_validate(catalog.routing)
    except ValidationError as exc:
        raise CatalogError("invalid routing config:\n  " + format_problems(path, exc, lines, ("routing",))) from exc
    problems = [problem_line(path, ("routing", *loc), lines, msg) for loc, msg in routing.located_problems()]
    for cls_name in {c for p in routing.policies.values() for c in p.slo_weights}:
        if cls_name not in catalog.slo_classes:
            problems.append(f"{path}: routing: slo_weights names unknown SLO class {cls_name!r}")
    if problems:
        raise CatalogError("invalid routing config:\n  " + "\n  ".join(problems))
    return RouterCatalog(catalog, routing, str(path))


class CatalogHolder:
    """The current catalog; :meth:`maybe_reload` swaps in a changed file only when it is valid."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.current = load_router_catalog(self.path)  # the first load must succeed
        self._mtime = self._stat()
        self.last_error: str | None = None
        self.reloads = 0
        self.failed_reloads = 0

    def _stat(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return -1.0

    def maybe_reload(self, force: bool = False) -> bool:
        """Reload if the file changed; on error keep the last good catalog and remember why."""
        mtime = self._stat()
        if not force and mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            new = load_router_catalog(self.path)
        except CatalogError as exc:
            self.failed_reloads += 1
            self.last_error = str(exc)
            log.error("catalog reload refused, keeping version %s: %s", self.current.version, exc)
            return False
        changed = new.version != self.current.version
        self.current = new
        self.last_error = None
        self.reloads += 1
        if changed:
            log.info("catalog reloaded: version %s", new.version)
        return changed


async def watch_catalog(
    holder: CatalogHolder, interval_s: float, on_result: Callable[[str], None] | None = None
) -> None:
    """Poll the catalog file every ``interval_s``: a valid change is swapped in, an invalid one
    keeps the last good. ``on_result`` hears ``"ok"`` for each swap and ``"refused"`` for each
    invalid file (the router counts them)."""
    while True:
        await asyncio.sleep(interval_s)
        before = holder.failed_reloads
        if holder.maybe_reload() and on_result is not None:
            on_result("ok")
        if holder.failed_reloads != before and on_result is not None:
            on_result("refused")
