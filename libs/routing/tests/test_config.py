"""The routing config: refused at load with the line of the error; a bad reload keeps the last good."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from llmlab_common.catalog import CatalogError
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_routing.config import CatalogHolder, load_router_catalog

pytestmark = pytest.mark.unit


def _line(text: str, needle: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if needle in s)


def _broken(tmp_path: Path, old: str, new: str) -> tuple[Path, str]:
    text = DEFAULT_CATALOG.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    p = tmp_path / "catalog.yaml"
    p.write_text(text)
    return p, text


def test_the_shipped_catalog_loads() -> None:
    rc = load_router_catalog(DEFAULT_CATALOG)
    assert {"static", "latency-first", "cost-first", "multi-objective"} <= set(rc.routing.policies)
    assert len(rc.version) == 12


def test_unknown_pool_names_its_line(tmp_path: Path) -> None:
    p, text = _broken(tmp_path, "pool: gpu-sglang", "pool: gpu-sglnag")
    with pytest.raises(CatalogError) as exc:
        load_router_catalog(p)
    assert f"catalog.yaml:{_line(text, 'gpu-sglnag')}: deployments.1.pool: unknown pool 'gpu-sglnag'" in str(exc.value)


def test_weights_that_do_not_parse_name_their_line(tmp_path: Path) -> None:
    p, text = _broken(tmp_path, "scorers: {quality: 0.5, latency: 0.3", "scorers: {quality: lots, latency: 0.3")
    with pytest.raises(CatalogError) as exc:
        load_router_catalog(p)
    msg = str(exc.value)
    assert f"catalog.yaml:{_line(text, 'quality: lots')}: routing.policies.multi-objective.scorers.quality" in msg
    p, text = _broken(tmp_path, "scorers: {cost: 1.0}", "scorers: {cost: -1}")
    with pytest.raises(CatalogError, match=r"must be >= 0"):
        load_router_catalog(p)


def test_policy_and_plugin_names_must_exist(tmp_path: Path) -> None:
    p, text = _broken(tmp_path, "default_policy: multi-objective", "default_policy: multi-objectve")
    with pytest.raises(CatalogError) as exc:
        load_router_catalog(p)
    assert f"catalog.yaml:{_line(text, 'multi-objectve')}: routing.default_policy: unknown policy" in str(exc.value)
    p, text = _broken(tmp_path, "fast: {policy: latency-first}", "fast: {policy: speedy}")
    with pytest.raises(CatalogError, match=r"routing.aliases.fast.policy: unknown policy 'speedy'"):
        load_router_catalog(p)
    p, text = _broken(tmp_path, "scorers: {latency: 1.0}", "scorers: {latncy: 1.0}")
    with pytest.raises(CatalogError) as exc:
        load_router_catalog(p)
    assert f"catalog.yaml:{_line(text, 'latncy')}:" in str(exc.value) and "unknown scorer 'latncy'" in str(exc.value)


def test_reload_keeps_the_last_good_catalog(tmp_path: Path) -> None:
    p = tmp_path / "catalog.yaml"
    shutil.copy(DEFAULT_CATALOG, p)
    holder = CatalogHolder(p)
    good = holder.current.version
    assert holder.maybe_reload() is False  # unchanged file
    p.write_text(p.read_text().replace("picker: least-load", "picker: psychic", 1))
    os.utime(p, (1, 1))  # a new mtime even within the file system's timestamp resolution
    assert holder.maybe_reload() is False
    assert holder.current.version == good and holder.failed_reloads == 1
    assert holder.last_error and "unknown picker 'psychic'" in holder.last_error
    p.write_text(DEFAULT_CATALOG.read_text().replace("max_chain: 3", "max_chain: 2"))
    os.utime(p, (2, 2))
    assert holder.maybe_reload() is True
    assert holder.current.routing.max_chain == 2 and holder.last_error is None
