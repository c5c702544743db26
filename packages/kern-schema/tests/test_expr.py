"""The expression language: evaluate, bounds (exact intervals), variables, to_text."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_schema import Expr, ExprError, ExprNode, bounds, evaluate, to_text, variables

VARS = ("tokens", "seqs", "pages")


def cd(e: Expr, c: int) -> ExprNode:
    return ExprNode(ceil_div=(e, c))


def mul(e: Expr, c: int) -> ExprNode:
    return ExprNode(mul=(e, c))


def test_evaluate_each_form():
    env = {"tokens": 7, "seqs": 3}
    assert evaluate(5, env) == 5
    assert evaluate(-5, env) == -5
    assert evaluate("tokens", env) == 7
    assert evaluate(cd("tokens", 4), env) == 2
    assert evaluate(cd("tokens", 7), env) == 1
    assert evaluate(cd(-7, 2), env) == -3  # ceil(-3.5)
    assert evaluate(mul("seqs", 32), env) == 96
    assert evaluate(mul("seqs", -2), env) == -6
    assert evaluate(cd(mul("tokens", 3), 2), env) == 11
    assert evaluate(2**70, env) == 2**70  # no overflow in the evaluator; the verifier checks ranges


def test_errors():
    with pytest.raises(ExprError, match="unknown var `nope`"):
        evaluate("nope", {})
    with pytest.raises(ExprError, match="unknown var `nope`"):
        bounds(mul("nope", 2), {})
    for c in (0, -3):
        with pytest.raises(ExprError, match="divisor must be a positive integer"):
            evaluate(cd("t", c), {"t": 1})
        with pytest.raises(ExprError, match="divisor must be a positive integer"):
            bounds(cd("t", c), {"t": (1, 2)})
    with pytest.raises(ExprError, match="booleans"):
        evaluate(True, {})
    with pytest.raises(ExprError, match="booleans"):
        bounds(False, {})


def test_node_needs_exactly_one_key():
    with pytest.raises(ValueError, match="exactly one key"):
        ExprNode()
    with pytest.raises(ValueError, match="exactly one key"):
        ExprNode(ceil_div=("t", 2), mul=("t", 2))
    for bad in (b'{}', b'{"ceil_div": ["t", 2], "mul": ["t", 2]}'):
        with pytest.raises(msgspec.ValidationError, match="exactly one key"):
            msgspec.json.decode(bad, type=ExprNode)
    with pytest.raises(msgspec.ValidationError, match="unknown field `div`"):
        msgspec.json.decode(b'{"div": ["t", 2]}', type=ExprNode)
    with pytest.raises(msgspec.ValidationError, match="length 2"):
        msgspec.json.decode(b'{"mul": ["t"]}', type=ExprNode)
    with pytest.raises(msgspec.ValidationError, match="Expected `int`, got `str`"):
        msgspec.json.decode(b'{"mul": ["t", "seqs"]}', type=ExprNode)  # the constant is an int, never a var


def test_decode_expr_forms():
    assert msgspec.json.decode(b'{"ceil_div": [{"mul": ["t", 3]}, 2]}', type=Expr) == cd(mul("t", 3), 2)
    assert msgspec.json.decode(b'"t"', type=Expr) == "t"
    assert msgspec.json.decode(b"12", type=Expr) == 12
    for bad in (b"true", b"1.5", b"null", b"[1, 2]"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=Expr)


def test_bounds_examples():
    r = {"tokens": (1, 2048), "seqs": (2, 256)}
    assert bounds(3, r) == (3, 3)
    assert bounds("tokens", r) == (1, 2048)
    assert bounds(cd("tokens", 64), r) == (1, 32)
    assert bounds(mul("seqs", -4), r) == (-1024, -8)
    assert bounds(mul("seqs", 0), r) == (0, 0)
    assert bounds(cd(mul("tokens", 3), 128), r) == (1, 48)


def test_variables_and_text():
    e = cd(mul("tokens", 3), 2)
    assert list(variables(e)) == ["tokens"]
    assert list(variables(5)) == [] and list(variables("seqs")) == ["seqs"]
    assert to_text(e) == "ceil_div(mul(tokens, 3), 2)"
    assert to_text(7) == "7" and to_text("seqs") == "seqs"


# ------------------------------------------------------------------ property tests

consts = st.integers(min_value=-1000, max_value=1000)
divisors = st.integers(min_value=1, max_value=300)
leaves = st.one_of(consts, st.sampled_from(VARS))
ops = st.one_of(
    st.tuples(st.just("ceil_div"), divisors),
    st.tuples(st.just("mul"), st.integers(min_value=-50, max_value=50)),
)


def _chain(leaf: Expr, steps: list[tuple[str, int]]) -> Expr:
    e = leaf
    for op, c in steps:
        e = ExprNode(**{op: (e, c)})
    return e


# An expression is a chain: one leaf (int or var) under unary nodes, up to 6 deep.
exprs = st.builds(_chain, leaves, st.lists(ops, max_size=6))


@st.composite
def ranges(draw):
    out = {}
    for v in VARS:
        lo = draw(st.integers(min_value=-100, max_value=5000))
        hi = draw(st.integers(min_value=lo, max_value=lo + 5000))
        out[v] = (lo, hi)
    return out


@settings(max_examples=300, deadline=None)
@given(exprs, ranges(), st.data())
def test_bounds_contain_every_value(e, rng, data):
    lo, hi = bounds(e, rng)
    assert lo <= hi
    for _ in range(5):
        env = {v: data.draw(st.integers(min_value=a, max_value=b)) for v, (a, b) in rng.items()}
        assert lo <= evaluate(e, env) <= hi


@settings(max_examples=300, deadline=None)
@given(exprs, ranges())
def test_bounds_are_tight_at_the_corners(e, rng):
    """Every operator is monotone in its one var, so the interval ends are reached at the
    var's ends: the bounds are exact, never merely safe."""
    values = [
        evaluate(e, dict(zip(VARS, corner)))
        for corner in itertools.product(*(rng[v] for v in VARS))
    ]
    assert bounds(e, rng) == (min(values), max(values))


@settings(max_examples=200, deadline=None)
@given(exprs)
def test_expressions_roundtrip_through_json(e):
    assert msgspec.json.decode(msgspec.json.encode(e), type=Expr) == e
