"""Step 2: split each window into forward passes by bursts of the anchor kernel.

The anchor is the densest kernel: every forward pass launches it many times
in quick succession (an RMS norm: twice per layer), so its occurrences form
one tight burst per pass, separated by the host's pause between passes.

- **Bursts** of a kernel inside a window: its occurrences, cut where the time
  between two consecutive occurrences exceeds ``BURST_FACTOR`` times the median
  such time. A kernel launched once per pass forms one burst per window; a
  kernel launched many times per pass forms one burst per pass.
- **Anchor**: the kernel (by symbol) with the most bursts over all windows,
  then present in the most windows, then the most launches. Adjacent bursts
  that are both smaller than the modal burst size and together no larger are
  merged (a host stall inside a pass splits a burst in two).
- **Boundaries**: between two consecutive bursts the pass boundary is the
  largest time gap between the last anchor launch of one burst and the first
  of the next (the host waiting for the previous pass), its midpoint when the
  timestamps do not tell. Launches before the first burst of a window belong
  to its first pass, those after the last burst to its last pass.
- **Jitter repair**: a launch near a boundary may land on the wrong side (a
  sampling kernel launched after the host resumed). Each boundary is moved by
  -1, 0 or +1 launch, whichever makes the two passes' per-kernel launch counts
  agree best with each kernel's modal count per pass.
- **Regular passes**: a pass whose anchor count differs from the modal anchor
  count (two passes launched back to back, a fragment, a window without the
  anchor) is kept in the report but excluded from the later steps.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Anchor", "Pass", "find_bursts", "choose_anchor", "split_passes", "BURST_FACTOR"]

BURST_FACTOR = 4.0


@dataclass(frozen=True)
class Anchor:
    """The kernel whose bursts delimit passes."""

    symbol: str
    count: int
    bursts: int
    windows: int
    burst_size: int
    why: str


@dataclass
class Pass:
    """One forward pass: launches ``[start, end)`` of window ``window``."""

    index: int
    window: int
    start: int
    end: int
    anchor_count: int
    regular: bool = True
    note: str | None = None
    tokens: int | None = None
    kind: str = "other"
    extra: dict = field(default_factory=dict)


def find_bursts(times: np.ndarray) -> list[tuple[int, int]]:
    """Bursts of one kernel's sorted occurrence times, as index ranges into ``times``."""
    n = len(times)
    if n < 3:
        return [(0, n)] if n else []
    gaps = np.diff(times)
    thr = BURST_FACTOR * float(np.median(gaps))
    cuts = (np.nonzero(gaps > thr)[0] + 1).tolist()
    b = [0, *cuts, n]
    return [(b[i], b[i + 1]) for i in range(len(b) - 1)]


def _merge_fragments(bursts: list[tuple[int, int]], mode: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in bursts:
        if out:
            ps, pe = out[-1]
            if pe - ps < mode and e - s < mode and (pe - ps) + (e - s) <= mode:
                out[-1] = (ps, e)
                continue
        out.append((s, e))
    return out


def choose_anchor(sym: np.ndarray, t_ns: np.ndarray, windows: list[tuple[int, int]],
                  symbols: list[str]) -> tuple[int, Anchor]:
    """Pick the anchor symbol id (``sym`` holds one symbol id per launch)."""
    order = np.argsort(sym, kind="stable")
    ssym = sym[order]
    starts = np.searchsorted(ssym, np.arange(len(symbols)), "left")
    ends = np.searchsorted(ssym, np.arange(len(symbols)), "right")
    wstart = np.array([w[0] for w in windows], dtype=np.int64)
    best = None
    for s in range(len(symbols)):
        idx = order[starts[s]:ends[s]]  # launch indices of this symbol, ascending
        if len(idx) == 0:
            continue
        win = np.searchsorted(wstart, idx, "right") - 1
        n_bursts = 0
        n_windows = 0
        for w in np.unique(win):
            n_windows += 1
            n_bursts += len(find_bursts(t_ns[idx[win == w]]))
        key = (n_bursts, n_windows, len(idx), -s)
        if best is None or key > best[0]:
            best = (key, s)
    assert best is not None, "no launches"
    (n_bursts, n_windows, count, _), s = best
    return s, Anchor(symbols[s], count, n_bursts, n_windows, 0,
                     f"most bursts ({n_bursts}) over {n_windows} window(s); {count} launches")


def split_passes(sym: np.ndarray, kid: np.ndarray, t_ns: np.ndarray, windows: list[tuple[int, int]],
                 anchor: int) -> tuple[list[Pass], int]:
    """Passes of every window, boundaries repaired; returns (passes, modal anchor count)."""
    per_window: list[list[tuple[int, int]]] = []  # bursts as (first, last) launch index
    sizes: list[int] = []
    anchor_idx = np.nonzero(sym == anchor)[0]
    for (ws, we) in windows:
        idx = anchor_idx[(anchor_idx >= ws) & (anchor_idx < we)]
        bursts = [(int(idx[a]), int(idx[b - 1])) for a, b in find_bursts(t_ns[idx])]
        per_window.append(bursts)
        sizes += [int(np.count_nonzero((idx >= f) & (idx <= l))) for f, l in bursts]
    mode = Counter(sizes).most_common(1)[0][0] if sizes else 0
    passes: list[Pass] = []
    for w, ((ws, we), bursts) in enumerate(zip(windows, per_window)):
        idx = anchor_idx[(anchor_idx >= ws) & (anchor_idx < we)]
        if bursts:
            # merge fragments, counting anchor launches per burst
            counted = [(int(np.searchsorted(idx, f)), int(np.searchsorted(idx, l)) + 1) for f, l in bursts]
            counted = _merge_fragments(counted, mode)
            bursts = [(int(idx[a]), int(idx[b - 1])) for a, b in counted]
        if not bursts:
            passes.append(Pass(len(passes), w, ws, we, 0, False, "no anchor launch in this window"))
            continue
        cuts = [ws]
        for (_, l0), (f1, _) in zip(bursts, bursts[1:]):
            lo, hi = l0 + 1, f1  # candidate first launches of the next pass: lo..hi
            gaps = np.diff(t_ns[lo - 1:hi + 1])
            if len(gaps) and gaps.max() > gaps.min():
                cuts.append(lo + int(np.argmax(gaps)))
            else:
                cuts.append((lo + hi + 1) // 2)
        cuts.append(we)
        for a, b in zip(cuts, cuts[1:]):
            passes.append(Pass(len(passes), w, a, b, 0))
    _repair(passes, kid)
    for p in passes:
        p.anchor_count = int(np.count_nonzero(sym[p.start:p.end] == anchor))
    amode = Counter(p.anchor_count for p in passes if p.anchor_count).most_common(1)
    amode_n = amode[0][0] if amode else 0
    for p in passes:
        if p.regular and p.anchor_count != amode_n:
            p.regular = False
            p.note = f"anchor launched {p.anchor_count} times, the usual is {amode_n}"
    return passes, amode_n


def _repair(passes: list[Pass], kid: np.ndarray) -> None:
    """Move each boundary by ±1 launch where that makes per-kernel counts modal."""
    counts = [Counter(kid[p.start:p.end].tolist()) for p in passes]
    per_kernel: dict[int, Counter] = {}
    for c in counts:
        for k, n in c.items():
            per_kernel.setdefault(k, Counter())[n] += 1
    mode = {k: c.most_common(1)[0][0] for k, c in per_kernel.items()}

    def bad(c: Counter, k: int) -> int:
        n = c.get(k, 0)
        return int(n > 0 and n != mode[k])

    for i in range(len(passes) - 1):
        p, q = passes[i], passes[i + 1]
        if p.window != q.window:
            continue
        cp, cq = counts[i], counts[i + 1]
        options = [(0, 0)]
        if p.end - p.start > 1:  # last launch of p moves to q
            k = int(kid[p.end - 1])
            before = bad(cp, k) + bad(cq, k)
            cp[k] -= 1; cq[k] += 1
            after = bad(cp, k) + bad(cq, k)
            cp[k] += 1; cq[k] -= 1
            options.append((after - before, -1))
        if q.end - q.start > 1:  # first launch of q moves to p
            k = int(kid[q.start])
            before = bad(cp, k) + bad(cq, k)
            cp[k] += 1; cq[k] -= 1
            after = bad(cp, k) + bad(cq, k)
            cp[k] -= 1; cq[k] += 1
            options.append((after - before, +1))
        delta, move = min(options)
        if delta >= 0 or move == 0:
            continue
        if move == -1:
            k = int(kid[p.end - 1]); cp[k] -= 1; cq[k] += 1
            p.end -= 1; q.start -= 1
        else:
            k = int(kid[q.start]); cp[k] += 1; cq[k] -= 1
            p.end += 1; q.start += 1
        for c in (cp, cq):
            if c[k] == 0:
                del c[k]
        q.extra["start_moved"] = move
