"""Fit one observed integer (a grid axis, a scalar argument) to the expression set.

The family is the manifest's expression language restricted to one var,
``tokens`` (written ``t`` below):

====================================  =====================================
form                                  as a function of t
====================================  =====================================
``c``                                 constant
``"tokens"``                          t
``{"mul": ["tokens", a]}``            a·t               (a ≥ 2)
``{"ceil_div": ["tokens", c]}``       ⌈t / c⌉           (c ≥ 2)
``{"ceil_div": [{"mul": ["tokens", a]}, b]}``  ⌈a·t / b⌉  (a ≥ 3 odd, b = 2^k ≤ min(4096, R/2))
====================================  =====================================

The last form is Triton's ``cdiv(numel, BLOCK)`` with ``numel = a·t`` and a
power-of-two block; its divisor is kept to powers of two no larger than half
of the fitted range ``R`` on purpose (with any divisor every sparse sample set
would be ambiguous, and a divisor near ``R`` can imitate ``t + 1`` on
``[1, R]``).

Every non-constant form is ``⌈x·t⌉`` for a positive rational ``x``. A sample
``(t, v)`` holds iff ``(v-1)/t < x ≤ v/t``, so the samples leave an interval
``(L, U]`` of admissible ``x`` and, per form, a contiguous range of admissible
constants. Two ``x`` give the same function on ``[1, R]`` iff no fraction
``k/t`` with ``t ≤ R`` lies in ``[x_lo, x_hi)``; since ``⌈x·t⌉`` is monotone in
``x``, the admissible members of the family agree on ``[1, R]`` iff the
smallest and the largest do. That is the whole test:

- ``fit``: every admissible member gives the same values on ``[1, R]``; the
  simplest one is reported (const < tokens < mul < ceil_div < composition,
  then smaller constants, powers of two first).
- ``underdetermined``: admissible members disagree somewhere on ``[1, R]``
  (e.g. only ``t ∈ {1, 2}`` observed, ``v = 1`` both times: ``1`` and
  ``ceil_div(tokens, 2)`` differ at ``t = 3``); ``candidates`` lists the
  simplest representatives.
- ``unfit``: one token count gives two values (not a function of tokens), or no
  member matches every sample.

``R`` (``tokens_max``) is the range the fit is claimed on: by default the
largest token count of the capture; a generator should pass its own ``tokens``
maximum.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import ceil, floor

import msgspec
from kern_schema import Expr, ExprNode, evaluate

__all__ = ["Fit", "fit_samples", "fit_pairs", "expr_complexity", "COMPOSITION_LOG2_MAX"]

COMPOSITION_LOG2_MAX = 12
"""Largest composition divisor is ``2**COMPOSITION_LOG2_MAX`` (Triton blocks are ≤ 4096)."""

MAX_CANDIDATES = 6


class Fit(msgspec.Struct, omit_defaults=True):
    """The fit of one observed quantity.

    ``status`` is ``fit`` (``expr`` set), ``underdetermined`` (``candidates``
    set, simplest first) or ``unfit`` (``reason`` set). ``samples`` are the
    distinct ``[tokens, value]`` pairs, sorted.
    """

    status: str
    samples: list[tuple[int, int]]
    expr: Expr | None = None
    candidates: list[Expr] | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "fit"


def _expr_of(x: Fraction) -> Expr:
    p, q = x.numerator, x.denominator
    if q == 1:
        return "tokens" if p == 1 else ExprNode(mul=("tokens", p))
    if p == 1:
        return ExprNode(ceil_div=("tokens", q))
    return ExprNode(ceil_div=(ExprNode(mul=("tokens", p)), q))


def expr_complexity(e: Expr) -> int:
    """0 for a constant, 1 for ``tokens``, +1 per operator node."""
    if isinstance(e, int):
        return 0
    if isinstance(e, str):
        return 1
    inner = e.ceil_div if e.ceil_div is not None else e.mul
    assert inner is not None
    return 1 + expr_complexity(inner[0])


def _simplest_between(lo: Fraction, hi: Fraction | None) -> Fraction:
    """The fraction of smallest denominator strictly inside ``(lo, hi)``; ``hi=None`` is +∞.

    Stern–Brocot descent; requires ``0 ≤ lo < hi``.
    """
    fl = floor(lo)
    if hi is None or fl + 1 < hi:
        return Fraction(fl + 1)
    lo_f, hi_f = lo - fl, hi - fl  # 0 ≤ lo_f < hi_f ≤ 1
    inv_hi = 1 / hi_f
    inv_lo = None if lo_f == 0 else 1 / lo_f
    y = _simplest_between(inv_hi, inv_lo)
    return fl + 1 / y


def _same_function(x_lo: Fraction, x_hi: Fraction, r: int) -> bool:
    """``⌈x_lo·t⌉ == ⌈x_hi·t⌉`` for every integer ``t`` in ``[1, r]`` (``x_lo ≤ x_hi``)."""
    if x_lo == x_hi:
        return True
    if x_lo.denominator <= r:  # t = denominator: x_lo·t is an integer k < x_hi·t
        return False
    return _simplest_between(x_lo, x_hi).denominator > r


def _members(lo: Fraction, hi: Fraction, r: int) -> list[Fraction]:
    """Admissible x in (lo, hi], per form: its smallest and largest member, simplest first."""
    out: list[Fraction] = []
    # tokens / mul(tokens, a)
    n_lo, n_hi = floor(lo) + 1, floor(hi)
    if n_lo <= n_hi:
        out += [Fraction(n_lo), Fraction(n_hi)]
    # ceil_div(tokens, c): 1/c in (lo, hi]
    c_lo = max(2, ceil(1 / hi))
    c_hi = ceil(1 / lo) - 1 if lo > 0 else max(c_lo, r)
    c_hi = min(c_hi, max(c_lo, r))  # every c ≥ r is the same function on [1, r]
    if c_lo <= c_hi:
        pow2 = 1 << (c_lo - 1).bit_length()
        if pow2 <= c_hi and pow2 != c_lo:
            out.append(Fraction(1, pow2))
        out += [Fraction(1, c_lo), Fraction(1, c_hi)]
    # ceil_div(mul(tokens, a), 2^k), a odd ≥ 3
    for k in range(1, COMPOSITION_LOG2_MAX + 1):
        b = 1 << k
        if 2 * b > r:
            break
        a_lo = max(3, floor(lo * b) + 1)
        a_hi = floor(hi * b)
        a_lo += 1 - a_lo % 2
        a_hi -= 1 - a_hi % 2
        if a_lo <= a_hi:
            out += [Fraction(a_lo, b), Fraction(a_hi, b)]
    return out


@lru_cache(maxsize=65536)
def _fit_cached(pairs: tuple[tuple[int, int], ...], r: int) -> Fit:
    samples = list(pairs)
    by_t: dict[int, int] = {}
    for t, v in pairs:
        if t in by_t and by_t[t] != v:
            return Fit("unfit", samples, reason=f"not a function of tokens: tokens={t} gives {by_t[t]} and {v}")
        by_t[t] = v
    ts = list(by_t)
    vs = set(by_t.values())
    r = max(r, max(ts))
    const = next(iter(vs)) if len(vs) == 1 else None

    xs: list[Fraction] = []
    if min(ts) >= 1 and min(vs) >= 1:
        lo = max(Fraction(v - 1, t) for t, v in by_t.items())
        hi = min(Fraction(v, t) for t, v in by_t.items())
        if lo < hi:
            xs = _members(lo, hi, r)

    if const is None and not xs:
        return Fit("unfit", samples, reason="no expression of the family matches every sample")
    # Distinct functions on [1, r]: the const (if admissible) and the x range.
    distinct: bool
    if xs:
        x_lo, x_hi = min(xs), max(xs)
        distinct = not _same_function(x_lo, x_hi, r)
        if const is not None and not distinct:
            distinct = not (const == 1 and x_hi * r <= 1)
    else:
        distinct = False
    if not distinct:
        expr: Expr = const if const is not None else _expr_of(xs[0])
        assert all(evaluate(expr, {"tokens": t}) == v for t, v in pairs), (expr, pairs)  # self-check
        return Fit("fit", samples, expr=expr)
    cands: list[Expr] = [] if const is None else [const]
    seen: set[Fraction] = set()
    for x in xs:
        if x not in seen:
            seen.add(x)
            cands.append(_expr_of(x))
    reason = (
        f"a single token count ({ts[0]}) observed" if len(ts) == 1
        else f"admissible expressions differ on tokens in [1, {r}]"
    )
    return Fit("underdetermined", samples, candidates=cands[:MAX_CANDIDATES], reason=reason)


def field_status(f: Fit) -> str:
    """``f.status``, except that an ``underdetermined`` fit without any sample (the field
    was never observed with a known token count) is ``unobserved``: the report's
    summary counts those separately."""
    return "unobserved" if f.status == "underdetermined" and not f.samples else f.status


def fit_samples(samples, tokens_max: int = 1) -> Fit:
    """Fit ``(tokens, value)`` samples; the fit is claimed on ``tokens ∈ [1, tokens_max]``.

    ``tokens_max`` is raised to the largest sampled token count. Duplicate
    samples are ignored. An empty sample set is ``underdetermined``.
    """
    return fit_pairs(tuple(sorted(set((int(t), int(v)) for t, v in samples))), int(tokens_max))


def fit_pairs(pairs: tuple[tuple[int, int], ...], tokens_max: int) -> Fit:
    """``fit_samples`` for samples already distinct and sorted (memoised)."""
    if not pairs:
        return Fit("underdetermined", [], candidates=[], reason="never observed with a known token count")
    return _fit_cached(pairs, tokens_max)
