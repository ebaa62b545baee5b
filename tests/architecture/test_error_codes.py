"""Every error code a package raises or compares is a member of llmlab_common.codes.Code: no
service or library spells a code as a string literal (a typo would be a new, undocumented code)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from llmlab_common.codes import Code

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(REPO.glob("services/*/llmlab_*")) + sorted(REPO.glob("libs/*/llmlab_*"))


def _is_code(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "code"


def _literals(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [v for e in node.elts for v in _literals(e)]
    return []


def literal_codes(source: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "code":
            found += [(node.value.lineno, v) for v in _literals(node.value)]
        elif isinstance(node, ast.Compare) and (_is_code(node.left) or any(_is_code(c) for c in node.comparators)):
            for side in (node.left, *node.comparators):
                found += [(side.lineno, v) for v in _literals(side)]
    return found


def test_the_scanner_finds_literal_codes() -> None:
    sample = 'raise X("m", code="oops")\nif err.code == "a" or e.code in ("b", "c"): pass\nY(code=Code.NO_ROUTE)\n'
    assert [v for _, v in literal_codes(sample)] == ["oops", "a", "b", "c"]


def test_no_package_spells_an_error_code() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {code!r}"
        for pkg in PACKAGES
        for path in sorted(pkg.rglob("*.py"))
        if path.name != "codes.py"
        for line, code in literal_codes(path.read_text())
    ]
    assert offenders == []


def test_codes_are_unique_snake_case() -> None:
    values = [c.value for c in Code]
    assert len(values) == len(set(values))
    assert all(v.replace("_", "").isalpha() and v == v.lower() for v in values)
