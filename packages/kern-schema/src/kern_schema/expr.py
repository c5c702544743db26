"""The expression language of launch geometry and scalar arguments.

An expression is a fill-in template, never a language (DESIGN §2)::

    E := int | var-name | {"ceil_div": [E, int]} | {"mul": [E, int]}

`evaluate` computes a value from concrete var values; `bounds` computes the
exact [lo, hi] interval of an expression when each var ranges over its
declared [min, max]. Both functions are monotone-exact: `ceil_div` by a
positive constant and `mul` by any constant map intervals to intervals.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Union

import msgspec


class ExprError(ValueError):
    """An expression cannot be evaluated (unknown var, division by a non-positive constant)."""


class ExprNode(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """An operator node: exactly one of `ceil_div` or `mul` is set, each `[E, int]`.

    `{"ceil_div": [E, c]}` is ⌈E / c⌉ (c must be positive: checked by `evaluate`/`bounds`,
    reported by the verifier); `{"mul": [E, c]}` is E × c.

    Raises (on construction and decoding): `ValueError` unless exactly one key is set.
    """

    ceil_div: "tuple[Expr, int] | None" = None
    mul: "tuple[Expr, int] | None" = None

    def __post_init__(self) -> None:
        if (self.ceil_div is None) == (self.mul is None):
            raise ValueError("an expression object has exactly one key: `ceil_div` or `mul`")


Expr = Union[int, str, ExprNode]


def _check_int(e: object) -> None:
    if isinstance(e, bool):
        raise ExprError("booleans are not expressions")


def evaluate(e: Expr, env: Mapping[str, int]) -> int:
    """Value of `e` with each var name replaced by `env[name]`.

    Raises:
        ExprError: a var is missing from `env`, or `ceil_div` by a constant ≤ 0.
    """
    if isinstance(e, int):
        _check_int(e)
        return e
    if isinstance(e, str):
        try:
            return env[e]
        except KeyError:
            raise ExprError(f"unknown var `{e}`") from None
    if e.ceil_div is not None:
        inner, c = e.ceil_div
        if c <= 0:
            raise ExprError(f"ceil_div by {c}: the divisor must be a positive integer")
        return -(-evaluate(inner, env) // c)
    assert e.mul is not None
    inner, c = e.mul
    return evaluate(inner, env) * c


def bounds(e: Expr, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """Exact [lo, hi] of `e` when every var `v` ranges over `ranges[v]` (inclusive).

    Raises:
        ExprError: as `evaluate`.
    """
    if isinstance(e, int):
        _check_int(e)
        return e, e
    if isinstance(e, str):
        try:
            return ranges[e]
        except KeyError:
            raise ExprError(f"unknown var `{e}`") from None
    if e.ceil_div is not None:
        inner, c = e.ceil_div
        if c <= 0:
            raise ExprError(f"ceil_div by {c}: the divisor must be a positive integer")
        lo, hi = bounds(inner, ranges)
        return -(-lo // c), -(-hi // c)
    assert e.mul is not None
    inner, c = e.mul
    lo, hi = bounds(inner, ranges)
    a, b = lo * c, hi * c
    return (a, b) if a <= b else (b, a)


def variables(e: Expr) -> Iterator[str]:
    """Every var name `e` refers to (with repetition)."""
    if isinstance(e, str):
        yield e
    elif isinstance(e, ExprNode):
        node = e.ceil_div if e.ceil_div is not None else e.mul
        assert node is not None
        yield from variables(node[0])


def to_text(e: Expr) -> str:
    """Human-readable form, e.g. `ceil_div(tokens, 4)`."""
    if isinstance(e, (int, str)):
        return str(e)
    if e.ceil_div is not None:
        return f"ceil_div({to_text(e.ceil_div[0])}, {e.ceil_div[1]})"
    assert e.mul is not None
    return f"mul({to_text(e.mul[0])}, {e.mul[1]})"
