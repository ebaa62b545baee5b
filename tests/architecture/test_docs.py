"""The docs describe what exists: every repository path, ``python -m`` module and ``make`` target
named in the README, in docs/ and in each package's README is there."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    {
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("libs/*/*.md"),
        *REPO.glob("services/*/*.md"),
        *REPO.glob("lab/*.md"),
        *REPO.glob("loadtest/*.md"),
        *REPO.glob("experiments/*.md"),
        *REPO.glob("infra/*.md"),
        *REPO.glob("configs/**/*.md"),
    }
)
# Top-level names a path in the docs starts with (anything else in backticks is not a path).
ROOTS = ("libs/", "services/", "lab/", "loadtest/", "experiments/", "docs/", "configs/", "scripts/", "infra/", "tests/")
ROOTS += ("results/",)  # committed runs are cited by path: a moved or deleted run fails here
ROOTS += ("reports/sql", "Makefile", "Dockerfile", "docker-compose.yml", "pyproject.toml", "requirements-dev.txt")
GENERATED = ("reports/out", ".run/")  # written by commands, not committed
OUTPUT_FLAGS = ("--out", "--out-dir", ">")  # the path after one is what a command will write
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)  # fenced blocks and code spans: commands live there
PYTHON_M = re.compile(r"python -m ([A-Za-z_][\w.]*\w)(?![\w.*])")
MAKE = re.compile(r"\bmake ([a-z][a-z0-9-]*)")


def _targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.M))


def _missing_paths(doc: Path, text: str) -> list[str]:
    """Links (relative to the doc) and paths in code (relative to the doc's folder or the root)."""
    missing = []
    for link in LINK.findall(text):
        if not link.startswith(("http://", "https://", "mailto:")) and not (doc.parent / link).exists():
            missing.append(link)
    for code in CODE.findall(text):
        previous = ""
        for raw in code.split():
            word = raw.strip("`'\",;:()").split(":")[0]
            written, previous = previous in OUTPUT_FLAGS, raw
            if written or not word.startswith(ROOTS) or any(ch in word for ch in "*<>{}$|[]"):
                continue
            if not (REPO / word).exists() and not (doc.parent / word).exists():
                missing.append(word)
    return missing


def test_the_docs_exist_and_the_readme_is_short() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    for name in ("nats-contract", "api", "configuration", "budgets", "routing", "accounting", "twin"):
        assert (REPO / "docs" / f"{name}.md").is_file(), name


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_module_and_target_a_doc_names_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = [p for p in _missing_paths(doc, text) if not p.startswith(GENERATED)]
    code = "\n".join(CODE.findall(text))
    modules = PYTHON_M.findall(code)
    missing += [f"python -m {m}" for m in modules if not m.startswith(("vllm", "sglang")) and not _module(m)]
    targets = _targets()
    missing += [f"make {t}" for t in MAKE.findall(code) if t not in targets]
    assert missing == [], f"{doc.relative_to(REPO)} names what does not exist"


def _module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
