"""Summaries of py-spy raw profiles (``--format raw``: one ``frame;frame;... count`` line per stack).

    python loadtest/studies/profile_top.py PROFILE.txt [...]           # by package, top leaves
    python loadtest/studies/profile_top.py --frames PROFILE.txt [...]  # top self / inclusive frames

The first is results/engine-modes-profile/20261203/top.txt (share of GIL-held samples by the
package of the innermost frame, and the top leaf functions); the second made
results/relay-gpu-check/20261203/profiles/*-top.txt."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

from llmlab_loadtest.profiles import stacks, summary


def by_package(path: str) -> None:
    s = summary(Path(path), top=8)
    print(f"== {path}: {s['samples']} samples")
    print("   by package: " + ", ".join(f"{k} {v:.0f}%" for k, v in s["by_package"].items()))
    print("   top leaves: " + "; ".join(f"{k} {v:.0f}%" for k, v in list(s["top_leaves"].items())[:6]))


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
