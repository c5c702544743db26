"""Step 2: split each window into forward passes.

**Pauses and pass-start kernels** (the method used whenever the host pauses
inside windows). A program that reads a result after each forward pass (the
sampled token, ``.item()``) stops launching until the GPU is done: every pass
is preceded by a *pause*, a gap longer than ``PAUSE_FACTOR`` times the median
gap between launches inside windows. Pauses alone do not delimit passes: the
host also stalls inside a pass (a first call at a new shape, the allocator, the
garbage collector, a compiled graph's guards between its eager prologue and its
kernels). What tells the two apart is what follows: every pass starts with the
same kernel (its first launch: an input copy, an ``arange`` of positions, the
first kernel of the graph), a stall inside a pass is followed by whatever came
next.

- **Cuts**: for a set ``C`` of *start kernels*, a window is cut at every pause
  whose launch is of a kernel in ``C``; if none is, one launch earlier (the
  pass's first kernel was launched before the host paused) or one later (the
  previous pass's last launch came after the pause): ±1 launch of jitter. The
  window's first launch always starts a pass.
- **Regular pass**: every kernel (symbol + parameter layout) has a modal
  number of launches per pass over the capture. A pass is *regular* when at
  most ``REGULAR_TOLERANCE`` of its launches are of kernels at a non-modal count
  (two passes launched back to back double every count; half a pass halves
  them; a kernel that only some token counts launch, such as a split-K reduce,
  keeps its count where it is launched). Irregular passes are reported and
  excluded from the later steps.
- **Choosing ``C``**, once for the whole capture, letting the data speak.
  The modal counts are taken from cutting every window at its own first
  kernel (a window starts with a pass: the host was idle before it). The
  candidates are the kernels launched once per pass (modal count 1) at (±1 of)
  at least two pauses. Starting from no start kernel (each window one pass),
  the candidate that explains the most launches is added: launches at their
  modal count inside regular passes, summed over the windows it cuts (ties:
  fewer launches at non-modal counts, then the kernel launched first). A
  candidate that would cut a pass which is already regular is refused: a
  consistent sub-cycle (the tail of every pass after a stall at the same
  layer) is as regular as the pass it splits, but it is not a pass. Up to
  ``MAX_START_KERNELS`` kernels are added (a prefill graph and a decode graph
  may start differently), only while one explains more. Two cuts are at least
  ``MIN_PASS_LAUNCHES`` apart (a slow first launch after a pause is not a
  pass).

**Bursts of an anchor kernel** (the fallback, for captures whose windows hold
no pause at all: passes launched back to back, replayed graphs). The anchor is
the kernel (by symbol) whose occurrences form the most bursts (a burst ends
where the time to its next occurrence exceeds ``BURST_FACTOR`` times the
median), then present in most windows, then the most frequent: a norm launched
twice per layer forms one burst per pass. Adjacent fragments of a burst are
merged; between two bursts the boundary is the largest time gap, then moved by
±1 launch where that makes per-kernel counts modal. A pass whose anchor count
is not the modal one is irregular.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Anchor", "Pass", "PassSplit", "find_bursts", "choose_anchor", "split_passes", "split_passes_bursts",
    "pause_threshold", "modal_counts", "BURST_FACTOR", "PAUSE_FACTOR", "REGULAR_TOLERANCE", "MAX_START_KERNELS",
]

BURST_FACTOR = 4.0
PAUSE_FACTOR = 4.0
REGULAR_TOLERANCE = 0.1
MAX_START_KERNELS = 3
MIN_PASS_LAUNCHES = 2


@dataclass(frozen=True)
class Anchor:
    """The kernel whose bursts delimit passes (bursts fallback)."""

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
    anchor_count: int | None = None
    regular: bool = True
    note: str | None = None
    tokens: int | None = None
    kind: str = "other"
    shape: int | None = None
    mismatch: int = 0  # launches of kernels at a non-modal count in this pass
    extra: dict = field(default_factory=dict)


@dataclass
class StartKernel:
    """A kernel chosen to start passes, and where."""

    kernel: int
    windows: int = 0
    passes: int = 0


@dataclass
class PassSplit:
    """The passes of every window and how they were found."""

    passes: list[Pass]
    method: str  # "pauses" | "bursts"
    pause_ns: int
    modes: dict[int, int]
    start_kernels: list[StartKernel] = field(default_factory=list)
    anchor: Anchor | None = None
    anchor_per_pass: int | None = None


# ---------------------------------------------------------------------------------------------
# regularity: modal launch counts per kernel


def _segment_counts(kid: np.ndarray, bounds: list[np.ndarray], n_kernels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For segments given as (starts, end) arrays: (segment index, kernel, count) of every pair present."""
    segs, kers = [], []
    base = 0
    for starts_end in bounds:
        starts, end = starts_end[:-1], int(starts_end[-1])
        a = int(starts[0])
        idx = np.arange(a, end)
        seg = np.searchsorted(starts, idx, "right") - 1 + base
        k = kid[a:end]
        keep = k >= 0  # launches not counted (kid -1) are left out
        segs.append(seg[keep])
        kers.append(k[keep])
        base += len(starts)
    if not segs:
        e = np.zeros(0, np.int64)
        return e, e, e
    keys = np.concatenate(segs) * n_kernels + np.concatenate(kers)
    uk, cnt = np.unique(keys, return_counts=True)
    return uk // n_kernels, uk % n_kernels, cnt


def modal_counts(seg_kernel_count: tuple[np.ndarray, np.ndarray, np.ndarray], n_kernels: int) -> np.ndarray:
    """Each kernel's most frequent launch count per segment (among segments that launch it; ties: the smaller)."""
    _, ker, cnt = seg_kernel_count
    modes = np.zeros(n_kernels, np.int64)
    if len(ker) == 0:
        return modes
    pair, freq = np.unique(np.stack([ker, cnt]), axis=1, return_counts=True)
    order = np.lexsort((pair[1], -freq, pair[0]))  # per kernel: most frequent first, then smaller count
    pk = pair[0][order]
    first = np.ones(len(pk), bool)
    first[1:] = pk[1:] != pk[:-1]
    modes[pk[first]] = pair[1][order][first]
    return modes


def _mismatch(seg_kernel_count, modes: np.ndarray, n_segs: int) -> np.ndarray:
    seg, ker, cnt = seg_kernel_count
    bad = np.where(cnt != modes[ker], cnt, 0)
    return np.bincount(seg, weights=bad, minlength=n_segs).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# pauses


def pause_threshold(t_ns: np.ndarray, windows: list[tuple[int, int]]) -> int:
    """``PAUSE_FACTOR`` × the median gap between consecutive launches of one window."""
    gaps = [np.diff(t_ns[a:b]) for a, b in windows if b - a >= 2]
    if not gaps:
        return 0
    g = np.concatenate(gaps)
    return max(1, int(PAUSE_FACTOR * float(np.median(g))))


def _cuts(kid: np.ndarray, pauses: np.ndarray, ws: int, we: int, in_c: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """Pass starts of window [ws, we) for the start-kernel mask ``in_c``; and the ±1 moves."""
    if len(pauses) == 0:
        return np.array([ws], np.int64), {}
    exact = in_c[kid[pauses]]
    prev = pauses - 1
    early = ~exact & (prev > ws) & in_c[kid[prev]]
    nxt = np.minimum(pauses + 1, we - 1)
    late = ~exact & ~early & (pauses + 1 < we) & in_c[kid[nxt]]
    cuts = np.concatenate([[ws], pauses[exact], prev[early], nxt[late]]).astype(np.int64)
    moved = {int(c): -1 for c in prev[early]}
    moved.update({int(c): 1 for c in nxt[late]})
    cuts = np.unique(cuts)
    if len(cuts) > 1:  # a pause right after a cut (a slow first launch) does not start another pass
        keep = [0]
        for i in range(1, len(cuts)):
            if cuts[i] - cuts[keep[-1]] >= MIN_PASS_LAUNCHES:
                keep.append(i)
        cuts = cuts[keep]
    return cuts, moved


def _regular(skc, modes: np.ndarray, n_segs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counted launches, launches at non-modal counts, regular?) per segment."""
    seg, _, cnt = skc
    lens = np.bincount(seg, weights=cnt, minlength=n_segs).astype(np.int64)
    mm = _mismatch(skc, modes, n_segs)
    return lens, mm, (mm <= REGULAR_TOLERANCE * lens) & (lens > 0)


def split_passes(sym: np.ndarray, kid: np.ndarray, t_ns: np.ndarray, windows: list[tuple[int, int]],
                 symbols: list[str], counted: np.ndarray | None = None) -> PassSplit:
    """Passes of every window: by pauses and start kernels, or by anchor bursts when no window pauses.

    ``counted``: the launches whose kernels' counts decide regularity (default all; the pipeline
    passes the flat launches: a library's GEMM kernel choice and count depend on the problem size)."""
    n_kernels = int(kid.max()) + 1 if len(kid) else 1
    kid_c = kid if counted is None or not counted.any() else np.where(counted, kid, -1)
    thr = pause_threshold(t_ns, windows)
    pauses_w: list[np.ndarray] = []
    for ws, we in windows:
        if we - ws < 2 or thr == 0:
            pauses_w.append(np.zeros(0, np.int64))
            continue
        g = np.diff(t_ns[ws:we])
        pauses_w.append((np.nonzero(g > thr)[0] + 1 + ws).astype(np.int64))
    if not any(len(p) for p in pauses_w):
        return split_passes_bursts(sym, kid, t_ns, windows, symbols, thr)

    # initial cuts: each window at its own first kernel; the modal counts come from them
    first_cut = []
    for ws, _ in windows:
        m = np.zeros(n_kernels, bool)
        m[kid[ws]] = True
        first_cut.append(m)
    all_bounds = [np.append(_cuts(kid, p, ws, we, c)[0], we) for (ws, we), p, c in zip(windows, pauses_w, first_cut)]
    modes = modal_counts(_segment_counts(kid_c, all_bounds, n_kernels), n_kernels)
    mask = _choose_start_kernels(kid, kid_c, pauses_w, windows, modes, n_kernels)

    passes: list[Pass] = []
    bounds_all = []
    starts_used: dict[int, StartKernel] = {}
    for w, ((ws, we), p) in enumerate(zip(windows, pauses_w)):
        cuts, moved = _cuts(kid, p, ws, we, mask)
        bounds_all.append(np.append(cuts, we))
        seen_here = set()
        for a, b in zip(cuts.tolist(), cuts[1:].tolist() + [we]):
            ps = Pass(len(passes), w, a, b)
            if a in moved:
                ps.extra["start_moved"] = moved[a]
            k = int(kid[a])
            if mask[k]:
                sk = starts_used.setdefault(k, StartKernel(k))
                sk.passes += 1
                if k not in seen_here:
                    seen_here.add(k)
                    sk.windows += 1
            passes.append(ps)
    lens, mm, regular = _regular(_segment_counts(kid_c, bounds_all, n_kernels), modes, len(passes))
    for p, n, m, ok in zip(passes, lens.tolist(), mm.tolist(), regular.tolist()):
        p.mismatch = m
        if not ok:
            p.regular = False
            p.note = (f"{m} of {n} counted launches are of kernels launched a non-modal number of times" if n
                      else "no counted launch")
    mode_map = {k: int(v) for k, v in enumerate(modes.tolist()) if v}
    sks = sorted(starts_used.values(), key=lambda s: (-s.passes, s.kernel))
    return PassSplit(passes, "pauses", thr, mode_map, sks)


def _choose_start_kernels(kid: np.ndarray, kid_c: np.ndarray, pauses_w: list[np.ndarray],
                          windows: list[tuple[int, int]], modes: np.ndarray, n_kernels: int) -> np.ndarray:
    """The start-kernel mask (greedy over the whole capture, see the module docstring)."""
    near_w: dict[int, list[int]] = {}  # kernel -> windows where it is launched at (±1 of) a pause
    near_n: dict[int, int] = {}
    first_at: dict[int, int] = {}
    for w, ((ws, we), p) in enumerate(zip(windows, pauses_w)):
        if not len(p):
            continue
        near = np.concatenate([kid[p], kid[p - 1], kid[np.minimum(p + 1, we - 1)]])
        ks, cnt = np.unique(near, return_counts=True)
        for k, c in zip(ks.tolist(), cnt.tolist()):
            near_w.setdefault(k, []).append(w)
            near_n[k] = near_n.get(k, 0) + c
            first_at.setdefault(k, ws)
    cands = sorted((k for k, c in near_n.items() if c >= 2 and modes[k] == 1), key=lambda k: (first_at[k], k))
    mask = np.zeros(n_kernels, bool)

    def state(w: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """(launches at modal counts in regular passes, non-modal launches, cuts, regular?) of window w."""
        (ws, we), p = windows[w], pauses_w[w]
        cuts = _cuts(kid, p, ws, we, mask)[0]
        lens, mm, reg = _regular(_segment_counts(kid_c, [np.append(cuts, we)], n_kernels), modes, len(cuts))
        return int((lens - mm)[reg].sum()), int(mm.sum()), cuts, reg

    def splits_regular(old: tuple, new_cuts: np.ndarray) -> bool:
        cuts, reg = old[2], old[3]
        added = np.setdiff1d(new_cuts, cuts)
        if not len(added):
            return False
        seg = np.searchsorted(cuts, added, "right") - 1
        return bool(reg[seg].any())

    cur = {w: state(w) for w in range(len(windows)) if len(pauses_w[w])}
    for _ in range(MAX_START_KERNELS):
        pick, best = None, (0, 0)
        for k in cands:
            if mask[k]:
                continue
            mask[k] = True
            gain_r = gain_m = 0
            for w in near_w[k]:
                st = state(w)
                if splits_regular(cur[w], st[2]):  # never cut a pass that is already regular
                    gain_r = -1
                    break
                gain_r += st[0] - cur[w][0]
                gain_m += cur[w][1] - st[1]
            mask[k] = False
            if gain_r > 0 and (gain_r, gain_m) > best:
                pick, best = k, (gain_r, gain_m)
        if pick is None:
            break
        mask[pick] = True
        for w in near_w[pick]:
            cur[w] = state(w)
    return mask


# ---------------------------------------------------------------------------------------------
# bursts (fallback)


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


def split_passes_bursts(sym: np.ndarray, kid: np.ndarray, t_ns: np.ndarray, windows: list[tuple[int, int]],
                        symbols: list[str], pause_ns: int = 0) -> PassSplit:
    """Passes of every window by anchor bursts, boundaries repaired."""
    anchor, anc = choose_anchor(sym, t_ns, windows, symbols)
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
    n_kernels = int(kid.max()) + 1 if len(kid) else 1
    bounds = []
    for w, (ws, we) in enumerate(windows):
        st = [p.start for p in passes if p.window == w]
        bounds.append(np.array(st + [we], np.int64))
    skc = _segment_counts(kid, bounds, n_kernels)
    modes = modal_counts(skc, n_kernels)
    for p, m in zip(passes, _mismatch(skc, modes, len(passes)).tolist()):
        p.mismatch = m
    return PassSplit(passes, "bursts", pause_ns, {k: int(v) for k, v in enumerate(modes.tolist()) if v},
                     anchor=anc, anchor_per_pass=amode_n)


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
