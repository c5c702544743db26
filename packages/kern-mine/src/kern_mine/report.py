"""The output document (stable JSON for generators) and its readable rendering.

``MineReport`` is encoded with msgspec; ``FORMAT`` names its version. Fields
may be added in a later version, never renamed or removed within one.
Expressions are kern-schema expressions (``int``, ``"tokens"``,
``{"ceil_div": [E, c]}``, ``{"mul": [E, c]}``).
"""

from __future__ import annotations

import msgspec
from kern_capture.checks import CaptureChecks
from kern_schema import to_text

from .fit import Fit

__all__ = [
    "FORMAT", "PassOut", "WindowOut", "StartKernelOut", "PassSplitOut", "ShapeOut", "CandidateOut",
    "ReferenceOut", "ScalarOut", "SiteOut", "PointerOut", "Summary", "Options", "MineReport", "to_json",
    "render_text", "FAILED_CONSEQUENCE",
]

FORMAT = "kern-mine/2"
FAILED_CONSEQUENCE = ("kern-mine keeps their launch indices but leaves the passes holding them out of shapes, "
                      "sites, the token reference, fits and pointers (passes' `failed` in --json)")
"""Ends the failed-launches warning (``kern_capture.checks``): what kern-mine does about them."""
CANDIDATES_SHOWN = 8
"""The readable report lists the best token-reference candidates; the JSON document lists them all."""


class PassOut(msgspec.Struct, omit_defaults=True):
    """``launches``: half-open range of launch indices (0-based line numbers of launches.jsonl).
    ``mismatch``: launches of kernels launched a non-modal number of times in this pass.
    ``shape``: the program the pass ran (regular passes only). ``failed``: launches of the pass with
    a non-zero CUDA result (the pass is then irregular: nothing of it is fitted)."""

    index: int
    kind: str  # prefill | decode | other
    tokens: int | None
    launches: tuple[int, int]
    t_ns: tuple[int, int]
    regular: bool
    shape: int | None = None
    mismatch: int = 0
    note: str | None = None
    start_moved: int | None = None
    failed: int = 0


class WindowOut(msgspec.Struct):
    index: int
    launches: tuple[int, int]
    t_ns: tuple[int, int]
    passes: list[PassOut]


class StartKernelOut(msgspec.Struct):
    symbol: str
    windows: int
    passes: int


class PassSplitOut(msgspec.Struct):
    """How passes were found: cut at host pauses longer than ``pause_ns`` before a start kernel."""

    pause_ns: int
    why: str
    start_kernels: list[StartKernelOut]


class ShapeOut(msgspec.Struct):
    """A program: regular passes whose kernel sets overlap (see ``shapes.py``)."""

    id: int
    passes: int
    token_counts: list[int]
    kernels: int
    sites: int
    flat_sites: int
    flat_sites_grid_fitted: int


class CandidateOut(msgspec.Struct):
    """``values``: the distinct token counts this candidate gives (value / divisor).
    ``field``: ``grid.x|y|z`` or ``param[i]``; ``axis`` is null for a scalar parameter."""

    site: int
    symbol: str
    field: str
    axis: str | None
    param: int | None
    divisor: int
    once_per_pass: bool
    passes: int
    values: list[int]
    unfit: int
    underdetermined: int
    unobserved: int
    complexity: int
    score: int
    pinned: int = 0


class ReferenceOut(msgspec.Struct):
    """tokens of a pass = the kernel's first launch's ``field`` / divisor."""

    site: int
    symbol: str
    field: str
    axis: str | None
    param: int | None
    divisor: int
    why: str
    candidates: list[CandidateOut]


class ScalarOut(msgspec.Struct):
    param: int
    offset: int
    size: int
    fit: Fit


class SiteOut(msgspec.Struct):
    """``token_counts``: the distinct token counts of the passes the site was seen in.
    ``embedded_pointers``: ``[param, within]`` of each pointer found inside a by-value struct
    (``param`` -1: the packed extra buffer). ``call``: for a library call site (aligned by its
    index among the pass's extra-buffer launches, see ``sites.py``), that index; null otherwise."""

    id: int
    symbol: str
    occurrence: int
    shape: int
    flat: bool
    module_ids: list[int]
    passes: int
    token_counts: list[int]
    block: tuple[int, int, int]
    shared_mem: int
    grid: list[Fit]
    scalars: list[ScalarOut]
    pointer_params: list[int]
    host_params: list[int]
    opaque_params: list[int]
    embedded_pointers: list[tuple[int, int]] = []
    call: int | None = None


class PointerOut(msgspec.Struct, omit_defaults=True):
    """``param``: the parameter index, -1 for the packed extra buffer; ``within``: for a pointer
    embedded in a by-value struct or the extra buffer, its byte offset there. ``address``: of a
    persistent pointer (``alloc_*`` too when the capture annotated its allocation)."""

    site: int
    param: int
    offset: int
    class_: str = msgspec.field(name="class")
    reason: str = ""
    passes: int = 0
    distinct: int = 0
    alloc_base: int | None = None
    alloc_size: int | None = None
    alloc_offset: int | None = None
    kernels: list[str] = []
    within: int | None = None
    address: int | None = None


class Summary(msgspec.Struct):
    """``flat_sites_multi_count``: flat sites of shapes seen at two or more token counts (their grids can
    be fitted as functions of tokens); ``flat_sites_single_count``: of shapes seen at one token count only
    (a program specialised to it: constants by construction); ``flat_sites_no_count``: of shapes never seen
    with a known token count. ``flat_sites_request_shapes``: flat sites of the shapes the requests' passes ran
    (``request_shapes``: the model's forward program(s), whatever token counts they were seen at); the
    fitted share over them is the one that says how much of a served model's launches a generator can
    emit from the fits (sites that never ran in a pass with a known token count, such as the model's
    initialisation and cache resets, are not in it). ``truncated_last_line``: the launches file's last
    line was cut short (the target crashed or was still writing) and dropped. ``failed_launches``:
    launches with a non-zero CUDA result (``MineReport.checks`` names the first few)."""

    launches: int
    flat_launches: int
    windows: int
    requests: int
    passes: int
    regular_passes: int
    shapes: int
    sites: int
    flat_sites: int
    flat_sites_grid_fitted: int
    flat_sites_multi_count: int
    flat_sites_multi_count_grid_fitted: int
    flat_sites_single_count: int
    flat_sites_no_count: int
    fields: dict[str, int]
    pointers: dict[str, int]
    flat_sites_request_shapes: int = 0
    flat_sites_request_shapes_grid_fitted: int = 0
    request_shapes: list[int] = []
    truncated_last_line: bool = False
    failed_launches: int = 0


class Options(msgspec.Struct):
    gap_ns: int
    gap_rule: str
    tokens_max: int | None
    pause_ns: int = 0


class MineReport(msgspec.Struct):
    format: str
    capture: str
    options: Options
    summary: Summary
    pass_split: PassSplitOut
    reference: ReferenceOut | None
    shapes: list[ShapeOut]
    requests: list[WindowOut]
    other_windows: list[WindowOut]
    sites: list[SiteOut]
    pointers: list[PointerOut]
    checks: CaptureChecks = msgspec.field(default_factory=CaptureChecks)
    """What reading the launches file noticed (``kern_capture.checks``): failed launches, records
    whose seq does not increase, of a second pid, whose time goes back within a thread."""


def to_json(report: MineReport) -> bytes:
    """The report as indented JSON."""
    return msgspec.json.format(msgspec.json.encode(report), indent=1)


def _fit_text(f: Fit) -> str:
    if f.status == "fit":
        return to_text(f.expr)  # type: ignore[arg-type]
    vals = sorted({v for _, v in f.samples})
    shown = ",".join(map(str, vals[:4])) + (",…" if len(vals) > 4 else "")
    if f.status == "underdetermined":
        c = " | ".join(to_text(e) for e in (f.candidates or [])[:3])
        return f"?{{{c}}}" if c and f.samples else "?(unobserved)"
    return f"!{{{shown}}}"


def _short(sym: str, n: int = 44) -> str:
    return sym if len(sym) <= n else sym[: n - 1] + "…"


def render_text(r: MineReport) -> str:
    """A readable report: windows and passes, pass split, reference, shapes, sites, pointers."""
    s = r.summary
    out = [
        f"kern-mine report: {r.capture}",
        f"  {s.launches} launches ({s.flat_launches} flat), {s.windows} windows "
        f"(gap > {r.options.gap_ns / 1e6:.3g} ms, {r.options.gap_rule}), {s.requests} requests, "
        f"{s.passes} passes ({s.regular_passes} regular), {s.shapes} pass shapes",
        f"  passes: {r.pass_split.why}",
    ]
    if s.truncated_last_line:
        out.insert(2, "  note: the launches file's last line was cut short (the target crashed or was still "
                      "writing?) and dropped")
    for w in msgspec.structs.replace(r.checks, truncated_line=None).warnings("mining", FAILED_CONSEQUENCE):
        out.insert(len(out) - 1, f"  warning: {w}")
    if r.reference:
        ref = r.reference
        div = f" / {ref.divisor}" if ref.divisor > 1 else ""
        out.append(f"  token reference: site {ref.site} {_short(ref.symbol, 60)} {ref.field}{div} — {ref.why}")
        out.append("    candidates (score = unfit + underdetermined + unobserved fields; fields seen at one token "
               "count only are not counted):")
        for c in ref.candidates[:CANDIDATES_SHOWN]:
            div = f"/{c.divisor}" if c.divisor > 1 else ""
            out.append(f"      site {c.site:>4} {c.field + div:<14} score {c.score:>4} (unfit {c.unfit}, "
                       f"under {c.underdetermined}, unobs {c.unobserved}, complexity {c.complexity}) "
                       f"{_short(c.symbol, 50)}")
        if len(ref.candidates) > CANDIDATES_SHOWN:
            out.append(f"      ({len(ref.candidates) - CANDIDATES_SHOWN} more in --json)")
    for title, wins in (("requests", r.requests), ("other windows", r.other_windows)):
        out.append(f"\n{title}:")
        for w in wins:
            passes = ", ".join(
                f"{p.kind}:{p.tokens if p.tokens is not None else '?'}" + ("" if p.regular else "*")
                for p in w.passes
            )
            out.append(f"  window {w.index:>3} launches [{w.launches[0]}, {w.launches[1]}) "
                       f"{(w.t_ns[1] - w.t_ns[0]) / 1e6:8.2f} ms  passes: {passes}")
    out.append("  (* irregular pass, excluded from fitting)")
    out.append("\nshapes (programs; sites are aligned per shape):")
    for sh in r.shapes:
        tc = ",".join(map(str, sh.token_counts[:12])) + (",…" if len(sh.token_counts) > 12 else "")
        out.append(f"  shape {sh.id}: {sh.passes} passes at tokens {{{tc or '?'}}}, {sh.kernels} kernels, "
                   f"{sh.flat_sites} flat sites ({sh.flat_sites_grid_fitted} with a fitted grid)")
    f = s.fields
    multi = s.flat_sites_multi_count
    pct = f" ({100.0 * s.flat_sites_multi_count_grid_fitted / multi:.1f}%)" if multi else ""
    out.append(f"\nsites: {s.sites} ({s.flat_sites} flat, {s.flat_sites_grid_fitted} of them with a fitted grid); "
               f"fields: {f.get('fit', 0)} fit, {f.get('underdetermined', 0)} underdetermined, "
               f"{f.get('unobserved', 0)} unobserved, {f.get('unfit', 0)} unfit")
    req = s.flat_sites_request_shapes
    if s.request_shapes:
        rpct = f" ({100.0 * s.flat_sites_request_shapes_grid_fitted / req:.1f}%)" if req else ""
        names = ", ".join(f"shape {i}" for i in s.request_shapes)
        out.append(f"  flat sites of the requests' pass shapes ({names}): {s.flat_sites_request_shapes_grid_fitted} "
                   f"of {req} with a fitted grid{rpct}")
    out.append(f"  flat sites of shapes seen at >= 2 token counts: {s.flat_sites_multi_count_grid_fitted} of {multi} "
               f"with a fitted grid{pct}; of shapes seen at one token count: {s.flat_sites_single_count} "
               f"(constants by construction); never with a token count: {s.flat_sites_no_count}")
    out.append("  legend: expr = fitted, ?{a | b} = underdetermined (candidates that disagree), "
               "?(unobserved) = never seen in a pass with a known token count, !{values} = unfit; "
               "#n = the kernel's n-th launch in the pass, cn = the pass's n-th library call")
    ptr_by_site: dict[int, list[PointerOut]] = {}
    for p in r.pointers:
        ptr_by_site.setdefault(p.site, []).append(p)
    letter = {"weight": "W", "state": "S", "workspace": "w", "unknown": "?"}
    for site in r.sites:
        grid = "[" + ", ".join(_fit_text(g) for g in site.grid) + "]"
        scal = " ".join(f"p{x.param}={_fit_text(x.fit)}" for x in site.scalars if x.fit.status != "fit" or not isinstance(x.fit.expr, int))
        ptrs = "".join(letter[p.class_] for p in ptr_by_site.get(site.id, []))
        where = f"#{site.occurrence:<3}" if site.call is None else f"c{site.call:<3}"
        out.append(f"  {site.id:>4} {_short(site.symbol):<44} s{site.shape} {where} ×{site.passes:<3} grid {grid}"
                   + (f" ptr {ptrs}" if ptrs else "") + (f" {scal}" if scal else "")
                   + ("" if site.flat else " (params via extra)"))
    pc = s.pointers
    out.append("\npointers: " + ", ".join(f"{pc.get(k, 0)} {k}" for k in ("weight", "state", "workspace", "unknown"))
               + "  (W weight, S state, w workspace, ? unknown; scalars shown only when not constant)")
    return "\n".join(out) + "\n"
