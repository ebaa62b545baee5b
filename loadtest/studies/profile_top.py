"""Summaries of py-spy raw profiles (``--format raw``: one ``frame;frame;... count`` line per stack).

    python loadtest/studies/profile_top.py PROFILE.txt [...]           # by package, top leaves
    python loadtest/studies/profile_top.py --frames PROFILE.txt [...]  # top self / inclusive frames

The first is results/engine-modes-profile/20261203/top.txt (share of GIL-held samples by the
package of the innermost frame, and the top leaf functions); the second made
results/relay-gpu-check/20261203/profiles/*-top.txt."""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Iterator
from pathlib import Path

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


def by_package(path: str) -> None:
    packages: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n in stacks(path):
        total += n
        packages[package(frames[-1])] += n
        leaves[re.sub(r" \(.*", "", frames[-1]) + " " + package(frames[-1])] += n
    print(f"== {path}: {total} samples")
    print("   by package: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in packages.most_common(8)))
    print("   top leaves: " + "; ".join(f"{k} {100 * v / total:.0f}%" for k, v in leaves.most_common(6)))


def by_frame(path: str) -> None:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n in stacks(path):
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    print(f"== {path}: {total} samples")
    print("-- self")
    for frame, c in own.most_common(25):
        print(f"{100 * c / total:5.1f}% {frame[:150]}")
    print("-- inclusive")
    for frame, c in inclusive.most_common(45):
        print(f"{100 * c / total:5.1f}% {frame[:150]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    report = by_frame if args[:1] == ["--frames"] else by_package
    for p in args[1:] if report is by_frame else args:
        report(p)
