"""Step 1: split the launch stream into time windows (requests, warm-up bursts).

A window ends where the host stopped launching for longer than a threshold:
between requests the program waits, inside a forward pass it launches every
few microseconds. The threshold is either given (``gap_ms``) or ``auto``:
``AUTO_FACTOR`` times the median inter-launch gap, and never below
``AUTO_FLOOR_NS`` (5 ms, the value that separated vLLM's requests in the
seed). Passes inside a window are found later (``passes.py``) from the
shorter pauses before each pass and the kernel that starts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["WindowSplit", "split_windows", "AUTO_FACTOR", "AUTO_FLOOR_NS"]

AUTO_FACTOR = 1000
AUTO_FLOOR_NS = 5_000_000


@dataclass(frozen=True)
class WindowSplit:
    """Windows as half-open launch index ranges, and the threshold used."""

    ranges: list[tuple[int, int]]
    gap_ns: int
    rule: str  # "auto" | "fixed"


def split_windows(t_ns: np.ndarray, gap_ms: float | None = None) -> WindowSplit:
    """Cut ``t_ns`` (launch timestamps, record order) at gaps longer than the threshold."""
    n = len(t_ns)
    if n == 0:
        return WindowSplit([], AUTO_FLOOR_NS if gap_ms is None else int(gap_ms * 1e6), "auto" if gap_ms is None else "fixed")
    gaps = np.diff(t_ns.astype(np.int64))
    if gap_ms is None:
        med = float(np.median(gaps)) if len(gaps) else 0.0
        thr = max(AUTO_FLOOR_NS, int(AUTO_FACTOR * med))
        rule = "auto"
    else:
        thr = int(gap_ms * 1_000_000)
        rule = "fixed"
    cuts = (np.nonzero(gaps > thr)[0] + 1).tolist()
    bounds = [0, *cuts, n]
    return WindowSplit([(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)], thr, rule)
