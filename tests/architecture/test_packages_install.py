"""Every service package installs into a fresh virtual environment with only what its pyproject
declares (the repository's own libraries come from wheels built here, everything else from the
package index), imports every module it ships and answers ``python -m <package> --help``. A
missing dependency, or a service leaning on another service, fails here before it fails in a
container. The common library alone (no extras) serves pure consumers of the contracts without a
web stack or a NATS client."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
LIBS = ["libs/common", "libs/twin", "libs/routing", "libs/worker"]
SERVICES = {
    "services/gateway": ("llmlab-gateway", "llmlab_gateway"),
    "services/router": ("llmlab-router", "llmlab_router"),
    "services/budget": ("llmlab-budget", "llmlab_budget"),
    "services/accounting": ("llmlab-accounting", "llmlab_accounting"),
    "services/engine-sim": ("llmlab-engine-sim", "llmlab_engine_sim"),
    "services/worker-vllm": ("llmlab-worker-vllm", "llmlab_worker_vllm"),
    "services/worker-sglang": ("llmlab-worker-sglang", "llmlab_worker_sglang"),
    "services/worker-openai": ("llmlab-worker-openai", "llmlab_worker_openai"),
}
# Imports every module of a package (what a forgotten dependency breaks), in the fresh venv.
IMPORT_ALL = """
import importlib, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""
UV = Path(sys.executable).with_name("uv")


def run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    src = tmp_path_factory.mktemp("src")
    for d in [*LIBS, *SERVICES, "loadtest"]:
        # A clean copy: setuptools would pack stale modules left in a source tree's build/.
        copy = shutil.copytree(REPO / d, src / d, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        run(UV, "build", "-q", "--wheel", "--out-dir", out, copy)
    return out


def fresh_venv(where: Path, wheels: Path, requirement: str) -> Path:
    run(UV, "venv", "-q", "--python", sys.executable, where)
    python = where / "bin" / "python"
    run(UV, "pip", "install", "-q", "--python", python, "--find-links", wheels, requirement)
    return python


@pytest.mark.parametrize("path", sorted(SERVICES))
def test_a_service_installs_alone_and_starts(path: str, wheels: Path, tmp_path: Path) -> None:
    dist, module = SERVICES[path]
    python = fresh_venv(tmp_path / "venv", wheels, dist)
    installed = run(UV, "pip", "freeze", "--python", python).stdout
    others = {d for d, _ in SERVICES.values()} - {dist}
    assert not [d for d in others if f"{d}==" in installed], "a service installed another service"
    assert int(run(python, "-c", IMPORT_ALL, module, cwd=tmp_path).stdout) >= 1
    usage = run(python, "-m", module, "--help", cwd=tmp_path).stdout
    assert f"python -m {module}" in usage and "LLMLAB_" in usage


def test_the_contracts_need_no_web_stack(wheels: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv", wheels, "llmlab-twin")
    installed = run(UV, "pip", "freeze", "--python", python).stdout.lower()
    assert not [p for p in ("fastapi", "uvicorn", "nats-py", "prometheus-client") if f"{p}==" in installed]
    code = "import llmlab_common.rules, llmlab_common.messages, llmlab_common.catalog, llmlab_twin.replay"
    run(python, "-c", code, cwd=tmp_path)


def test_the_load_client_needs_no_service(wheels: Path, tmp_path: Path) -> None:
    """Catches: the load client or the benchmark metadata pulling in a service of this repository
    (lab and experiments use them; a user drives any OpenAI-compatible URL with them)."""
    python = fresh_venv(tmp_path / "venv", wheels, "llmlab-loadtest")
    installed = run(UV, "pip", "freeze", "--python", python).stdout.lower()
    services = [d for d, _ in SERVICES.values()] + ["llmlab-testkit", "llmlab-routing"]
    assert not [d for d in services if f"{d}==" in installed], installed
    run(python, "-c", "import llmlab_loadtest.sse_client, llmlab_loadtest.bench_meta", cwd=tmp_path)
    usage = run(python, "-m", "llmlab_loadtest.sse_client", "--help", cwd=tmp_path).stdout
    assert "--url" in usage
