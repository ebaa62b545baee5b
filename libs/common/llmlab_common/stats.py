"""Small statistics shared by the services and the benchmarks."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (q in 0..1) of an already sorted, non-empty sequence: numpy's
    default ``linear`` method, so figures match what users compute from raw records."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))
