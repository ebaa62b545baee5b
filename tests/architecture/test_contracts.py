"""The architecture, enforced: import-linter's contracts (pyproject.toml [tool.importlinter]: no
service imports another, libraries import no service, domain modules import no web framework or
network client) and deptry on every package (each imports only what its pyproject declares).
``make lint`` runs the same two tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACKAGES = [
    *sorted(p.parent for p in [*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("services/*/pyproject.toml")]),
    REPO / "lab",
    REPO / "loadtest",
    REPO / "experiments",
]


def test_import_contracts_are_kept() -> None:
    proc = subprocess.run([BIN / "lint-imports"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_each_package_declares_what_it_imports(package: Path) -> None:
    proc = subprocess.run([BIN / "deptry", "."], cwd=package, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
