"""Step 4: choose the token-count reference by letting the data speak.

The token count of a pass is the grid of some kernel launched exactly once
per pass whose grid varies from pass to pass (a final norm, an embedding
gather, ...). Which one is not assumed: every such (kernel, axis) is tried,
and so is the first launch of every other kernel (a norm launched 57 times
per pass may be the only one whose grid is exactly the token count);
for each, every field of every site is fitted (``fit.py``) against it, and the
candidate leaving the fewest fields ``unfit``, ``underdetermined`` or
unobserved wins. A candidate whose values share a common factor ``g`` (a
grid of 4 blocks per token) is also tried divided by ``g``. A wrong reference (one that counts tiles of 64 tokens, or
stays 1 for both 1- and 2-token passes) leaves many fields unfit. Ties go to
the candidate whose fits are simplest (a reference counting ``2·tokens``
explains as much as ``tokens`` but needs ``ceil_div(…, 2)`` everywhere), then
to the one present in more passes, then to a once-per-pass kernel.
"""

from __future__ import annotations

from collections import Counter
from math import gcd
from dataclasses import dataclass, field

from kern_capture.records import LaunchRecord

from .fields import AXES, Field, fit_field, site_token_counts
from .fit import Fit, expr_complexity
from .passes import Pass
from .sites import Site

__all__ = ["Candidate", "reference_candidates", "score_candidate", "choose_reference"]


@dataclass
class Candidate:
    """A (site, grid axis) tried as the token-count reference, and its score."""

    site: int
    symbol: str
    axis: int
    tokens: dict[int, int]  # pass index -> token count
    divisor: int = 1  # token count = grid value / divisor
    once_per_pass: bool = True
    unfit: int = 0
    underdetermined: int = 0
    unobserved: int = 0
    complexity: int = 0
    fits: list[Fit] = field(default_factory=list, repr=False)

    @property
    def score(self) -> int:
        """Fields the candidate leaves unexplained (lower is better)."""
        return self.unfit + self.underdetermined + self.unobserved

    @property
    def axis_name(self) -> str:
        return AXES[self.axis]

    def rank_key(self) -> tuple:
        return (self.score, self.complexity, -len(self.tokens), not self.once_per_pass, min(self.tokens.values()),
                self.site, self.axis, self.divisor)


def reference_candidates(launches: list[LaunchRecord], sites: list[Site], passes: list[Pass]) -> list[Candidate]:
    """Every (site, grid axis) whose grid varies across the regular passes.

    Kernels launched once per pass come first (the seed's rule); the first
    launch of every other kernel is tried too, in case no once-per-pass kernel
    counts tokens exactly. Candidates giving the same token count to every
    pass as an earlier one are dropped.
    """
    occurrences = Counter(s.kernel.id for s in sites)
    ordered = sorted((s for s in sites if s.occurrence == 0 and len(s.launches) >= 2),
                     key=lambda s: (occurrences[s.kernel.id] != 1, s.id))
    out: list[Candidate] = []
    seen: set[tuple] = set()

    def add(c: Candidate) -> None:
        key = tuple(sorted(c.tokens.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)

    for s in ordered:
        once = occurrences[s.kernel.id] == 1
        for a in range(3):
            vals = {p: launches[i].grid[a] for p, i in s.launches.items()}
            if len(set(vals.values())) >= 2 and min(vals.values()) >= 1:
                add(Candidate(s.id, s.kernel.symbol, a, vals, once_per_pass=once))
                g = gcd(*vals.values())
                if g > 1:  # a grid of (say) 4 blocks per token: also try it divided
                    add(Candidate(s.id, s.kernel.symbol, a, {p: v // g for p, v in vals.items()}, g, once))
    return out


def score_candidate(c: Candidate, fields: list[Field], tokens_max: int | None) -> Candidate:
    """Fit every field against ``c.tokens`` and count the outcomes."""
    r = tokens_max if tokens_max is not None else max(c.tokens.values())
    c.unfit = c.underdetermined = c.unobserved = c.complexity = 0
    c.fits = []
    site_ts: dict[int, tuple[int, ...]] = {}
    for f in fields:
        ts = site_ts.get(f.site)
        if ts is None:
            ts = site_ts[f.site] = site_token_counts(f, c.tokens)
        fit = fit_field(f, c.tokens, r, ts)
        c.fits.append(fit)
        if fit.status == "fit":
            c.complexity += expr_complexity(fit.expr)  # type: ignore[arg-type]
        elif fit.status == "unfit":
            c.unfit += 1
        elif not fit.samples:
            c.unobserved += 1
        else:
            c.underdetermined += 1
    return c


def choose_reference(candidates: list[Candidate], fields: list[Field], tokens_max: int | None) -> Candidate | None:
    """Score every candidate and return the best (None when there is no candidate)."""
    for c in candidates:
        score_candidate(c, fields, tokens_max)
    candidates.sort(key=Candidate.rank_key)
    return candidates[0] if candidates else None
