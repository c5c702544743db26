"""Step 4: choose the token-count reference by letting the data speak.

The token count of a pass is some quantity of a kernel launched once per pass
that varies from pass to pass: a grid axis (a final norm, an embedding
gather: one block per token) or a scalar argument (the element count a
Triton kernel or an ``arange`` is given). Which one is not assumed: every
grid axis and every scalar parameter of the first launch of every kernel is
tried, the kernel's launches gathered over *all* regular passes whatever
their shape (a kernel outside a compiled graph, such as the ``arange`` of
positions before it, is the only one that also counts the tokens of a graph
specialised to one token count). Kernels launched once per pass come first
(the seed's rule), then the first launch of every other kernel. For each
candidate every field of every site is fitted (``fit.py``) against it, and the
candidate leaving the fewest fields ``unfit``, ``underdetermined`` or
unobserved wins. A candidate whose values share a common factor ``g`` (a grid
of 4 blocks per token, an element count of 1024 per token) is also tried
divided by ``g``. A wrong reference (one that counts tiles of 64 tokens, or
stays 1 for both 1- and 2-token passes) leaves many fields unfit. Ties go to
the candidate whose fits are simplest (a reference counting ``2·tokens``
explains as much as ``tokens`` but needs ``ceil_div(…, 2)`` everywhere), then
to the one present in more passes, then to a once-per-pass kernel, then to a
grid axis over a scalar. Candidates giving every pass the same count as an
earlier one are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

from kern_capture.records import LaunchRecord

from .fields import AXES, Field
from .fit import Fit, expr_complexity, fit_pairs, fit_samples
from .passes import Pass
from .sites import Site, scalar_value

__all__ = ["Candidate", "FieldGroups", "reference_candidates", "score_candidate", "choose_reference",
           "TokensMaxError"]


class TokensMaxError(ValueError):
    """``tokens_max`` is below the largest token count of the capture (fits cannot be claimed on a
    range narrower than their samples). ``largest``: that count."""

    def __init__(self, tokens_max: int, largest: int):
        super().__init__(f"--tokens-max {tokens_max} is below the largest token count in the capture ({largest}): "
                         f"the fits cover every pass seen; pass --tokens-max {largest} or more, or omit it")
        self.tokens_max = tokens_max
        self.largest = largest


@dataclass
class Candidate:
    """A (site, field) tried as the token-count reference, and its score.

    ``axis`` is 0..2 for a grid axis, ``None`` for a scalar parameter ``param``."""

    site: int
    symbol: str
    axis: int | None
    tokens: dict[int, int]  # pass index -> token count
    divisor: int = 1  # token count = value / divisor
    once_per_pass: bool = True
    param: int | None = None
    unfit: int = 0
    underdetermined: int = 0
    unobserved: int = 0
    pinned: int = 0  # underdetermined, but seen at a single token count: no reference could do better
    complexity: int = 0
    fits: list[Fit] = field(default_factory=list, repr=False)

    @property
    def score(self) -> int:
        """Fields the candidate leaves unexplained (lower is better)."""
        return self.unfit + self.underdetermined + self.unobserved

    @property
    def axis_name(self) -> str | None:
        return None if self.axis is None else AXES[self.axis]

    @property
    def field_name(self) -> str:
        return f"grid.{AXES[self.axis]}" if self.axis is not None else f"param[{self.param}]"

    def rank_key(self) -> tuple:
        return (self.score, self.complexity, -len(self.tokens), not self.once_per_pass, self.axis is None,
                min(self.tokens.values()), self.site, self.axis or 0, self.param or 0, self.divisor)


def reference_candidates(launches: list[LaunchRecord], sites: list[Site], passes: list[Pass]) -> list[Candidate]:
    """Every grid axis and scalar of a kernel's first launch per pass that varies across the regular passes.

    Kernels launched once per pass come first (the seed's rule); the first
    launch of every other kernel is tried too, in case no once-per-pass kernel
    counts tokens exactly. Candidates giving the same token count to every
    pass as an earlier one are dropped.
    """
    # a kernel's first launch in every regular pass, whatever the pass's shape (taken from the
    # launches: a library call site holds a kernel's launches at one call, not its first ones)
    first: dict[int, dict[int, int]] = {}
    owner: dict[tuple[int, int], Site] = {}
    count: dict[tuple[int, int], int] = {}
    for s in sites:
        k = s.kernel.id
        d = first.setdefault(k, {})
        for p, i in s.launches.items():
            count[(k, p)] = count.get((k, p), 0) + 1
            if p not in d or i < d[p]:
                d[p] = i
                owner[(k, p)] = s
    multi = {k for (k, _), n in count.items() if n >= 2}
    first_site: dict[int, Site] = {}
    for (k, _), s in owner.items():
        if k not in first_site or s.id < first_site[k].id:
            first_site[k] = s
    ordered = sorted((k for k, ls in first.items() if len(ls) >= 2),
                     key=lambda k: (k in multi, first_site[k].id))
    out: list[Candidate] = []
    seen: set[tuple] = set()

    def add(c: Candidate) -> None:
        key = tuple(sorted(c.tokens.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)

    def try_values(s: Site, vals: dict[int, int], axis: int | None, param: int | None, once: bool) -> None:
        if len(set(vals.values())) < 2 or min(vals.values()) < 1:
            return
        add(Candidate(s.id, s.kernel.symbol, axis, vals, 1, once, param))
        g = 0
        for v in vals.values():
            g = gcd(g, v)
        if g > 1:  # a grid of (say) 4 blocks per token: also try it divided
            add(Candidate(s.id, s.kernel.symbol, axis, {p: v // g for p, v in vals.items()}, g, once, param))

    for k in ordered:
        s, ls = first_site[k], first[k]
        once = k not in multi
        for a in range(3):
            try_values(s, {p: launches[i].grid[a] for p, i in ls.items()}, a, None, once)
        for prm in s.params:
            if prm.kind == "scalar":
                try_values(s, {p: scalar_value(launches[i], prm.index) for p, i in ls.items()}, None, prm.index, once)
    return out


class FieldGroups:
    """Fields grouped by what their fit depends on: the passes they were seen in and their values there.

    The 28 layers of a model launch the same kernel with the same grid and scalars: their fields are
    fitted once per candidate, not 28 times."""

    def __init__(self, fields: list[Field]):
        self.n = len(fields)
        index: dict[tuple, int] = {}
        self.passes: list[tuple[int, ...]] = []
        self.values: list[tuple[int, ...]] = []
        self.members: list[list[int]] = []
        for i, f in enumerate(fields):
            ps = tuple(p for p, _ in f.values)
            vs = (f.const,) if f.const is not None else tuple(v for _, v in f.values)
            key = (ps, vs)
            g = index.get(key)
            if g is None:
                g = index[key] = len(self.passes)
                self.passes.append(ps)
                self.values.append(vs)
                self.members.append([])
            self.members[g].append(i)


def _fit_group(ps: tuple[int, ...], vs: tuple[int, ...], tokens: dict[int, int], r: int,
               ts_cache: dict[tuple[int, ...], tuple[int, ...]]) -> Fit:
    if len(vs) == 1:  # constant: depends only on the distinct token counts of its passes
        ts = ts_cache.get(ps)
        if ts is None:
            ts = ts_cache[ps] = tuple(sorted({t for p in ps if (t := tokens.get(p)) is not None}))
        return fit_pairs(tuple((t, vs[0]) for t in ts), r)
    return fit_samples([(t, v) for p, v in zip(ps, vs) if (t := tokens.get(p)) is not None], r)


def score_candidate(c: Candidate, fields: list[Field] | FieldGroups, tokens_max: int | None,
                    keep_fits: bool = True) -> Candidate:
    """Fit every field against ``c.tokens`` and count the outcomes (``c.fits``: one per field)."""
    groups = fields if isinstance(fields, FieldGroups) else FieldGroups(fields)
    r = tokens_max if tokens_max is not None else max(c.tokens.values())
    c.unfit = c.underdetermined = c.unobserved = c.pinned = c.complexity = 0
    fits: list[Fit | None] = [None] * groups.n if keep_fits else []
    ts_cache: dict[tuple[int, ...], tuple[int, ...]] = {}
    for ps, vs, members in zip(groups.passes, groups.values, groups.members):
        fit = _fit_group(ps, vs, c.tokens, r, ts_cache)
        n = len(members)
        if fit.status == "fit":
            c.complexity += n * expr_complexity(fit.expr)  # type: ignore[arg-type]
        elif fit.status == "unfit":
            c.unfit += n
        elif not fit.samples:
            c.unobserved += n
        elif fit.samples[0][0] == fit.samples[-1][0]:
            c.pinned += n
        else:
            c.underdetermined += n
        if keep_fits:
            for i in members:
                fits[i] = fit
    c.fits = fits  # type: ignore[assignment]
    return c


def choose_reference(candidates: list[Candidate], fields: list[Field], tokens_max: int | None) -> Candidate | None:
    """Score every candidate and return the best (None when there is no candidate).

    Each candidate is scored on its own range, ``[1, its largest value]``: a given ``tokens_max`` is in
    real tokens, and only the winner is known to count them (a candidate counting 384 elements per token
    would otherwise be judged on a range 384 times narrower than its own). The winner's fits are then
    redone on ``[1, tokens_max]``.

    Raises:
        TokensMaxError: ``tokens_max`` is below the winner's largest token count."""
    groups = FieldGroups(fields)
    for c in candidates:
        score_candidate(c, groups, None, keep_fits=False)
    candidates.sort(key=Candidate.rank_key)
    if not candidates:
        return None
    best = candidates[0]
    largest = max(best.tokens.values())
    if tokens_max is not None and tokens_max < largest:
        raise TokensMaxError(tokens_max, largest)
    scored = Candidate(best.site, best.symbol, best.axis, best.tokens, best.divisor, best.once_per_pass, best.param)
    best.fits = score_candidate(scored, groups, tokens_max).fits
    return best
