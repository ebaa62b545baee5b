"""The frames with the most self and inclusive samples in py-spy raw profiles. Made
results/relay-gpu-check/20261203/profiles/*-top.txt.

    python loadtest/studies/profile_frames.py PROFILE.txt [...]"""

from __future__ import annotations

import collections
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    for path in paths:
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        total = 0
        for line in Path(path).read_text().splitlines():
            line = line.rstrip()
            if not line:
                continue
            stack, count = line.rsplit(" ", 1)
            n = int(count)
            total += n
            frames = stack.split(";")
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
    main(sys.argv[1:])
