"""Share of GIL-held samples by the package of the innermost frame, and the top leaf functions, per
py-spy raw profile. Used by results/engine-modes-profile/20261203 (its top.txt).

    python loadtest/studies/profile_top.py results/engine-modes-profile/20261203/profiles/*.txt"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

PACKAGES = (
    "llmlab_", "vllm", "nats", "aiohttp", "pydantic", "asyncio", "uvloop", "starlette", "fastapi", "uvicorn",
    "transformers", "tokenizers", "zmq", "msgspec", "torch", "prometheus_client", "orjson", "json",
)  # fmt: skip


def package(frame: str) -> str:
    m = re.search(r"\((.*?):\d+\)", frame)
    path = m.group(1) if m else frame
    for key in PACKAGES:
        if key in path:
            return key.rstrip("_") if key != "llmlab_" else "llmlab (ours)"
    return "other"


def main(paths: list[str]) -> None:
    for path in paths:
        by_package: collections.Counter[str] = collections.Counter()
        leaves: collections.Counter[str] = collections.Counter()
        total = 0
        for line in Path(path).read_text().splitlines():
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            by_package[package(frames[-1])] += n
            leaves[re.sub(r" \(.*", "", frames[-1]) + " " + package(frames[-1])] += n
        print(f"== {path}: {total} samples")
        print("   by package: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in by_package.most_common(8)))
        print("   top leaves: " + "; ".join(f"{k} {100 * v / total:.0f}%" for k, v in leaves.most_common(6)))


if __name__ == "__main__":
    main(sys.argv[1:])
