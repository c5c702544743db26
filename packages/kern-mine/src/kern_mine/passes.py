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
  number of launches per pass over the capture (each window votes once, with
  its own modal count: the hundreds of fragments of one compile or autotune
  window do not outvote the forward passes of the other windows). A pass is *regular* when at
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

Passes launched back to back, with no host pause between them (replayed
graphs, a program that never waits for a result), cannot be separated: they
come out as one irregular pass. (The earlier method, bursts of the densest
kernel, needed the same pauses and is gone: Inductor fuses the norms of a
real model into differently named kernels, so no one kernel is dense in every
pass.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Pass", "PassSplit", "StartKernel", "split_passes", "pause_threshold", "modal_counts",
    "PAUSE_FACTOR", "REGULAR_TOLERANCE", "MAX_START_KERNELS", "MIN_PASS_LAUNCHES",
]

PAUSE_FACTOR = 4.0
REGULAR_TOLERANCE = 0.1
MAX_START_KERNELS = 3
MIN_PASS_LAUNCHES = 2


@dataclass
class Pass:
    """One forward pass: launches ``[start, end)`` of window ``window``."""

    index: int
    window: int
    start: int
    end: int
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
    pause_ns: int
    modes: dict[int, int]
    start_kernels: list[StartKernel] = field(default_factory=list)


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


def modal_counts(seg_kernel_count: tuple[np.ndarray, np.ndarray, np.ndarray], n_kernels: int,
                 seg_window: np.ndarray | None = None) -> np.ndarray:
    """Each kernel's modal launch count per segment, among the segments that launch it (ties: the smaller).

    With ``seg_window`` (each segment's window), every window votes once, with its own modal count:
    the many fragments of one compile or autotune window do not outvote the other windows' passes
    (ties between windows: the count with more segments behind it, then the smaller)."""
    seg, ker, cnt = seg_kernel_count
    modes = np.zeros(n_kernels, np.int64)
    if len(ker) == 0:
        return modes
    if seg_window is None:
        pair, freq = np.unique(np.stack([ker, cnt]), axis=1, return_counts=True)
        order = np.lexsort((pair[1], -freq, pair[0]))
        pk = pair[0][order]
        first = np.ones(len(pk), bool)
        first[1:] = pk[1:] != pk[:-1]
        modes[pk[first]] = pair[1][order][first]
        return modes
    win = seg_window[seg]
    trip, tfreq = np.unique(np.stack([ker, win, cnt]), axis=1, return_counts=True)
    # per (kernel, window): the modal count of that window
    order = np.lexsort((trip[2], -tfreq, trip[1], trip[0]))
    tk, tw = trip[0][order], trip[1][order]
    first = np.ones(len(tk), bool)
    first[1:] = (tk[1:] != tk[:-1]) | (tw[1:] != tw[:-1])
    vk, vc = tk[first], trip[2][order][first]
    # per kernel: the count most windows vote for; ties: more segments behind it, then smaller
    pair, votes = np.unique(np.stack([vk, vc]), axis=1, return_counts=True)
    segs_pair, segs_n = np.unique(np.stack([ker, cnt]), axis=1, return_counts=True)
    lookup = {(int(k), int(c)): int(n) for k, c, n in zip(segs_pair[0], segs_pair[1], segs_n)}
    support = np.array([lookup[(int(k), int(c))] for k, c in zip(pair[0], pair[1])], np.int64)
    order = np.lexsort((pair[1], -support, -votes, pair[0]))
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
    # the pass's first kernel launched just before the pause; not inside a run of it (a reset's fills)
    early = ~exact & (prev > ws) & in_c[kid[prev]] & (kid[np.maximum(prev - 1, ws)] != kid[prev])
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


def split_passes(kid: np.ndarray, t_ns: np.ndarray, windows: list[tuple[int, int]],
                 counted: np.ndarray | None = None) -> PassSplit:
    """Passes of every window, cut at host pauses before start kernels.

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

    # initial cuts: each window at its own first kernel; the modal counts come from them
    first_cut = []
    for ws, _ in windows:
        m = np.zeros(n_kernels, bool)
        m[kid[ws]] = True
        first_cut.append(m)
    all_bounds = [np.append(_cuts(kid, p, ws, we, c)[0], we) for (ws, we), p, c in zip(windows, pauses_w, first_cut)]
    seg_window = np.concatenate([np.full(len(b) - 1, w, np.int64) for w, b in enumerate(all_bounds)])
    modes = modal_counts(_segment_counts(kid_c, all_bounds, n_kernels), n_kernels, seg_window)
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
    return PassSplit(passes, thr, mode_map, sks)


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
