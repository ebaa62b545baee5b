"""``LLMLAB_KEY=VALUE`` arguments of the benchmarks (cost_bench's --env-ab, relay_bench's --setting)."""

from __future__ import annotations

import argparse


def parse_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE``: a setting of the services (``LLMLAB_*``), never anything else
    the processes would read (PATH, PYTHONPATH: the variants must run the same code)."""
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("LLMLAB_") or not key[7:] or not all(c.isalnum() or c == "_" for c in key):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LLMLAB_<NAME>=<value>")
    return key, value
