"""The pipeline: capture → windows → passes → sites → reference → fits → pointers → report.

>>> report = mine("capture_dir")                     # doctest: +SKIP
>>> [p.tokens for w in report.requests for p in w.passes if p.kind == "prefill"]  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import math
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
from kern_capture.checks import CaptureChecks, check_launches
from kern_capture.records import LaunchRecord

from .capture import load_capture
from .fields import AXES, fit_field, site_fields
from .fit import Fit, field_status
from .passes import Pass, split_passes
from .pointers import classify_pointers
from .reference import choose_reference, reference_candidates
from .report import (
    FORMAT, CandidateOut, MineReport, Options, PassOut, PassSplitOut, PointerOut, ReferenceOut,
    ScalarOut, ShapeOut, SiteOut, StartKernelOut, Summary, WindowOut,
)
from .shapes import assign_shapes
from .sites import AllocIndex, Words, align_sites, kernel_keys
from .windows import split_windows

__all__ = ["MineOptions", "mine", "mine_launches"]


@dataclass(frozen=True)
class MineOptions:
    """``gap_ms``: request-split threshold (None: auto, see ``windows``).
    ``tokens_max``: range ``[1, tokens_max]`` the fits are claimed on (None: the
    largest token count of the capture)."""

    gap_ms: float | None = None
    tokens_max: int | None = None

    def __post_init__(self) -> None:
        if self.gap_ms is not None and not (math.isfinite(self.gap_ms) and self.gap_ms > 0):
            raise ValueError(f"gap_ms must be > 0 ms (None: auto), got {self.gap_ms}")
        if self.tokens_max is not None and self.tokens_max < 1:
            raise ValueError(f"tokens_max must be >= 1 (None: the largest token count of the capture), "
                             f"got {self.tokens_max}")


def mine(dir: str | os.PathLike[str], options: MineOptions = MineOptions()) -> MineReport:
    """Mine a capture directory (``launches.jsonl`` or ``launches.jsonl.gz``, or a path to either file).

    A truncated last line is dropped and flagged (``summary.truncated_last_line``); what reading
    the file noticed is in ``checks`` (failed launches, seq, pid, time: ``kern_capture.checks``); see
    ``capture.load_capture`` for the errors, ``reference.choose_reference`` for ``tokens_max``."""
    cap = load_capture(dir)
    return mine_launches(cap.launches, str(dir), options, truncated_last_line=cap.truncated_line is not None,
                         checks=cap.checks)


def _set_aside_failed(launches: list[LaunchRecord], passes: list[Pass]) -> None:
    """A pass holding a failed launch (non-zero ``result``: the kernel did not run) is made
    irregular, so nothing it launched reaches the shapes, sites, token reference, fits or
    pointers; its count goes in ``Pass.extra["failed"]`` and its note names the first one."""
    failed = [i for i, r in enumerate(launches) if r.result]
    if not failed or not passes:
        return
    starts = [p.start for p in passes]
    by_pass: dict[int, list[int]] = {}
    for i in failed:
        k = bisect.bisect_right(starts, i) - 1
        if k >= 0 and passes[k].start <= i < passes[k].end:
            by_pass.setdefault(k, []).append(i)
    for k, idx in by_pass.items():
        p = passes[k]
        r = launches[idx[0]]
        p.extra["failed"] = len(idx)
        p.regular = False
        why = (f"{len(idx)} failed launch{'es' if len(idx) > 1 else ''} (non-zero CUDA result; the first: launch "
               f"{idx[0]} {_short(r.symbol)}, result {r.result}): left out of fitting")
        p.note = why if p.note is None else f"{why}; {p.note}"


def _classify_windows(passes: list[Pass], n_windows: int) -> list[bool]:
    """A window is a generation request when its passes are all regular, their
    token counts known, and every pass after the first has 1 token."""
    by_w: dict[int, list[Pass]] = {}
    for p in passes:
        by_w.setdefault(p.window, []).append(p)
    is_req = []
    for w in range(n_windows):
        ps = by_w.get(w, [])
        ok = (len(ps) >= 2 and all(p.regular and p.tokens is not None for p in ps)
              and all(p.tokens == 1 for p in ps[1:]))
        is_req.append(ok)
        if ok:
            ps[0].kind = "prefill"
            for p in ps[1:]:
                p.kind = "decode"
    return is_req


def mine_launches(launches: list[LaunchRecord], name: str, options: MineOptions = MineOptions(),
                  truncated_last_line: bool = False, checks: CaptureChecks | None = None) -> MineReport:
    """Mine launches already in memory (record order). ``truncated_last_line``: the capture's last
    line was cut short and dropped (reported in the summary). ``checks``: what reading the file
    noticed (``CaptureData.checks``); None: checked here, each launch's line taken as its index + 1.

    A failed launch (non-zero ``result``) keeps its index (the launch ranges stay line numbers),
    but the pass holding it is irregular: left out of shapes, sites, reference, fits, pointers."""
    n = len(launches)
    if checks is None:
        checks = check_launches(launches, name)
    truncated_last_line = truncated_last_line or checks.truncated_line is not None
    t = np.fromiter((r.t_ns for r in launches), np.int64, n)
    ws = split_windows(t, options.gap_ms)
    kid_list, kernels = kernel_keys(launches)
    kid = np.asarray(kid_list, dtype=np.int64)

    passes: list[Pass] = []
    split = None
    if n:
        flat = np.fromiter((r.params is not None for r in launches), bool, n)
        split = split_passes(kid, t, ws.ranges, flat)
        passes = split.passes
        _set_aside_failed(launches, passes)
    shapes = assign_shapes(passes, kid)

    words = Words(launches, AllocIndex(launches))
    sites = align_sites(launches, kid_list, kernels, passes, words)
    fields = site_fields(launches, sites)
    cands = reference_candidates(launches, sites, passes)
    best = choose_reference(cands, fields, options.tokens_max)
    tokens: dict[int, int] = dict(best.tokens) if best else {}
    for p in passes:
        p.tokens = tokens.get(p.index)
    r_max = options.tokens_max if options.tokens_max is not None else (max(tokens.values()) if tokens else 1)
    fits: list[Fit] = best.fits if best else [fit_field(f, tokens, r_max) for f in fields]
    is_req = _classify_windows(passes, len(ws.ranges))
    for sh in shapes:
        sh.token_counts = sorted({tokens[p] for p in sh.passes if p in tokens})
    shape_counts = {sh.id: len(sh.token_counts) for sh in shapes}
    # the programs the requests ran (their passes' shapes): the model's forward pass(es)
    request_shapes = {p.shape for p in passes if p.kind in ("prefill", "decode") and p.shape is not None}

    ref_out = None
    if best:
        cand_out = [
            CandidateOut(c.site, c.symbol, c.field_name, c.axis_name, c.param, c.divisor, c.once_per_pass,
                         len(c.tokens), sorted(set(c.tokens.values())),
                         c.unfit, c.underdetermined, c.unobserved, c.complexity, c.score, c.pinned)
            for c in cands
        ]
        runner = f"; next best scores {cands[1].score}" if len(cands) > 1 else "; the only candidate"
        scaled = f" / {best.divisor}" if best.divisor > 1 else ""
        launched = "launched once per pass" if best.once_per_pass else "first launch per pass"
        ref_out = ReferenceOut(
            best.site, best.symbol, best.field_name, best.axis_name, best.param, best.divisor,
            f"{launched}, varying {best.field_name}{scaled}, in {len(best.tokens)} passes; leaves {best.score} of "
            f"{len(fields)} fields unexplained ({best.unfit} unfit, {best.underdetermined} underdetermined, "
            f"{best.unobserved} unobserved; {best.pinned} seen at one token count){runner}",
            cand_out,
        )

    # windows
    req_out, other_out = [], []
    by_w: dict[int, list[Pass]] = {}
    for p in passes:
        by_w.setdefault(p.window, []).append(p)
    for w, (a, b) in enumerate(ws.ranges):
        pouts = [
            PassOut(p.index, p.kind, p.tokens, (p.start, p.end), (int(t[p.start]), int(t[p.end - 1])),
                    p.regular, p.shape, p.mismatch, p.note, p.extra.get("start_moved"), p.extra.get("failed", 0))
            for p in by_w.get(w, [])
        ]
        wo = WindowOut(w, (a, b), (int(t[a]), int(t[b - 1])), pouts)
        (req_out if is_req[w] else other_out).append(wo)

    # sites
    fits_by_site: dict[int, dict[tuple[str, int], Fit]] = {}
    for f, fit in zip(fields, fits):
        fits_by_site.setdefault(f.site, {})[(f.kind, f.index)] = fit
    site_out = []
    grid_fitted = 0
    cover = Counter()  # (flat site coverage class) -> count
    per_shape: dict[int, list[int]] = {sh.id: [0, 0, 0] for sh in shapes}  # sites, flat, flat fitted
    for s in sites:
        sf = fits_by_site[s.id]
        recs = [launches[i] for i in s.launches.values()]
        block = Counter(r.block for r in recs).most_common(1)[0][0]
        smem = Counter(r.shared_mem for r in recs).most_common(1)[0][0]
        grid = [sf[("grid", a)] for a in range(len(AXES))]
        fitted = all(g.status == "fit" for g in grid)
        st = per_shape.setdefault(s.shape, [0, 0, 0])
        st[0] += 1
        if s.kernel.flat:
            st[1] += 1
            nc = shape_counts.get(s.shape, 0)
            cls = "multi" if nc >= 2 else "single" if nc == 1 else "none"
            cover[cls] += 1
            if s.shape in request_shapes:
                cover["request"] += 1
            if fitted:
                grid_fitted += 1
                st[2] += 1
                if cls == "multi":
                    cover["multi_fitted"] += 1
                if s.shape in request_shapes:
                    cover["request_fitted"] += 1
        site_out.append(SiteOut(
            s.id, s.kernel.symbol, s.occurrence, s.shape, s.kernel.flat, sorted(s.kernel.module_ids), len(s.launches),
            sorted({tokens[p] for p in s.launches if p in tokens}),
            tuple(block), smem, grid,
            [ScalarOut(p.index, p.offset, p.size, sf[("scalar", p.index)]) for p in s.params if p.kind == "scalar"],
            [p.index for p in s.params if p.kind == "pointer"],
            [p.index for p in s.params if p.kind == "host"],
            [p.index for p in s.params if p.kind == "opaque"],
            [(e.param, e.within) for e in s.embedded],
            s.call,
        ))
    shape_out = [ShapeOut(sh.id, len(sh.passes), sh.token_counts, len(sh.kernels), *per_shape.get(sh.id, [0, 0, 0]))
                 for sh in shapes]

    ptrs = classify_pointers(launches, sites, tokens, words)
    ptr_out = [PointerOut(p.site, p.param, p.offset, p.cls, p.reason, p.passes, p.distinct,
                          p.alloc_base, p.alloc_size, p.alloc_offset, p.kernels, p.within, p.address) for p in ptrs]

    if split is None:
        split_out = PassSplitOut(0, "no launches", [])
    else:
        sk = [StartKernelOut(kernels[k.kernel].symbol, k.windows, k.passes) for k in split.start_kernels]
        names = "; ".join(f"{_short(k.symbol)} ({k.passes} passes)" for k in sk[:4]) or "none found"
        split_out = PassSplitOut(split.pause_ns,
                                 f"cut at host pauses (> {split.pause_ns / 1e3:.3g} µs) before a start kernel: {names}", sk)

    summary = Summary(
        launches=n,
        flat_launches=sum(1 for r in launches if r.params is not None),
        windows=len(ws.ranges),
        requests=sum(is_req),
        passes=len(passes),
        regular_passes=sum(p.regular for p in passes),
        shapes=len(shapes),
        sites=len(sites),
        flat_sites=sum(s.kernel.flat for s in sites),
        flat_sites_grid_fitted=grid_fitted,
        flat_sites_multi_count=cover["multi"],
        flat_sites_multi_count_grid_fitted=cover["multi_fitted"],
        flat_sites_single_count=cover["single"],
        flat_sites_no_count=cover["none"],
        fields=dict(Counter(field_status(f) for f in fits)),
        pointers=dict(Counter(p.cls for p in ptrs)),
        flat_sites_request_shapes=cover["request"],
        flat_sites_request_shapes_grid_fitted=cover["request_fitted"],
        request_shapes=sorted(request_shapes),
        truncated_last_line=truncated_last_line,
        failed_launches=checks.failed_launches.count,
    )
    return MineReport(FORMAT, name, Options(ws.gap_ns, ws.rule, options.tokens_max, split.pause_ns if split else 0),
                      summary, split_out, ref_out, shape_out, req_out, other_out, site_out, ptr_out, checks)


def _short(sym: str, n: int = 48) -> str:
    return sym if len(sym) <= n else sym[: n - 1] + "…"
