"""py-spy raw profiles (``--format raw``: one ``frame;frame;... count`` line per stack): shares of
samples by the package of the innermost frame and the top leaf functions, for the benchmarks'
reports and ``loadtest/studies/profile_top.py``."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACKAGES = (
    "llmlab_", "vllm", "nats", "aiohttp", "pydantic", "asyncio", "uvloop", "starlette", "fastapi", "uvicorn",
    "transformers", "tokenizers", "zmq", "msgspec", "torch", "prometheus_client", "orjson", "json",
)  # fmt: skip


def stacks(path: str) -> Iterator[tuple[list[str], int]]:
    """(frames, outermost first; samples) of each line of a raw profile."""
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack:
            yield stack.split(";"), int(count)


def package(frame: str) -> str:
    m = re.search(r"\((.*?):\d+\)", frame)
    path = m.group(1) if m else frame
    for key in PACKAGES:
        if key in path:
            return key.rstrip("_") if key != "llmlab_" else "llmlab (ours)"
    return "other"


def summary(path: Path, top: int = 8) -> dict[str, Any]:
    """Samples, the share (%) of each package and of the top leaf functions."""
    packages: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n in stacks(str(path)):
        total += n
        packages[package(frames[-1])] += n
        leaves[re.sub(r" \(.*", "", frames[-1]) + " " + package(frames[-1])] += n
    share = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "by_package": {k: share(v) for k, v in packages.most_common(top)},
        "top_leaves": {k: share(v) for k, v in leaves.most_common(top)},
    }


def py_spy(pid: int, out: Path, seconds: float | None = None, rate_hz: int = 100) -> subprocess.Popen[bytes]:
    """py-spy sampling a process's GIL-held stacks at ``rate_hz`` without pausing it, into a raw profile
    at ``out``: for ``seconds``, or until it gets SIGINT (it writes the profile then)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    duration = [] if seconds is None else ["-d", str(max(1, int(seconds)))]
    cmd = [exe, "record", "--pid", str(pid), *duration, "-r", str(rate_hz), "--format", "raw", "-o", str(out),
           "--nonblocking", "--gil"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
