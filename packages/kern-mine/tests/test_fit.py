import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kern_schema import ExprNode, evaluate, to_text

from kern_mine.fit import expr_complexity, fit_samples

TS = [1, 34, 85, 175, 2048]


def texts(f):
    return [to_text(c) for c in f.candidates]


@pytest.mark.parametrize("fn, expect", [
    (lambda t: t, "tokens"),
    (lambda t: 3 * t, "mul(tokens, 3)"),
    (lambda t: -(-t // 8), "ceil_div(tokens, 8)"),
    (lambda t: -(-3 * t // 4), "ceil_div(mul(tokens, 3), 4)"),
    (lambda t: -(-3 * t // 2), "ceil_div(mul(tokens, 3), 2)"),
    (lambda t: 1, "1"),
    (lambda t: 16, "16"),
    (lambda t: 0, "0"),
])
def test_fits_up_to_the_largest_sample(fn, expect):
    f = fit_samples([(t, fn(t)) for t in TS])
    assert f.status == "fit" and to_text(f.expr) == expect
    assert f.samples == [(t, fn(t)) for t in TS]


def test_tokens_plus_one_is_unfit():
    f = fit_samples([(t, t + 1) for t in TS])
    assert f.status == "unfit" and f.reason == "no expression of the family matches every sample"


def test_not_a_function_of_tokens():
    f = fit_samples([(1, 4), (1, 5), (3, 7)])
    assert f.status == "unfit" and f.reason == "not a function of tokens: tokens=1 gives 4 and 5"


def test_tokens_1_and_2_cannot_separate_const_from_ceil_div():
    # On [1, 2] the two agree: a fit claimed on that range only is determined.
    assert to_text(fit_samples([(1, 1), (2, 1)]).expr) == "1"
    f = fit_samples([(1, 1), (2, 1)], tokens_max=64)
    assert f.status == "underdetermined"
    assert texts(f)[:3] == ["1", "ceil_div(tokens, 2)", "ceil_div(tokens, 64)"]
    assert f.reason == "admissible expressions differ on tokens in [1, 64]"


def test_tokens_1_and_2_cannot_separate_tokens_from_a_composition():
    f = fit_samples([(1, 1), (2, 2)], tokens_max=64)
    assert f.status == "underdetermined"
    assert texts(f)[:2] == ["tokens", "ceil_div(mul(tokens, 3), 4)"]


def test_constant_one_needs_samples_up_to_the_range():
    f = fit_samples([(t, 1) for t in TS[:4]], tokens_max=2048)
    assert f.status == "underdetermined"
    assert texts(f)[:2] == ["1", "ceil_div(tokens, 256)"]
    assert fit_samples([(t, 1) for t in TS], tokens_max=2048).expr == 1


def test_divisors_the_samples_cannot_pin_are_reported():
    f = fit_samples([(t, -(-t // 128)) for t in TS])
    assert f.status == "underdetermined"
    assert texts(f) == ["ceil_div(tokens, 128)", "ceil_div(tokens, 136)"]


def test_single_token_count():
    f = fit_samples([(1, 4)], tokens_max=175)
    assert f.status == "underdetermined" and f.reason == "a single token count (1) observed"
    assert texts(f)[:2] == ["4", "mul(tokens, 4)"]


def test_empty_samples():
    f = fit_samples([])
    assert f.status == "underdetermined" and f.samples == [] and f.candidates == []


def test_complexity():
    assert expr_complexity(7) == 0
    assert expr_complexity("tokens") == 1
    assert expr_complexity(ExprNode(ceil_div=(ExprNode(mul=("tokens", 3)), 4))) == 3


FAMILY = st.one_of(
    st.integers(0, 100_000),
    st.just("tokens"),
    st.integers(2, 5000).map(lambda a: ExprNode(mul=("tokens", a))),
    st.integers(2, 5000).map(lambda c: ExprNode(ceil_div=("tokens", c))),
    st.tuples(st.integers(1, 200).map(lambda a: 2 * a + 1), st.integers(1, 6)).map(
        lambda ak: ExprNode(ceil_div=(ExprNode(mul=("tokens", ak[0])), 1 << ak[1]))),
)


@settings(max_examples=80, deadline=None)
@given(FAMILY, st.integers(128, 256))
def test_every_token_count_sampled_gives_a_fit_that_agrees(e, r):
    samples = [(t, evaluate(e, {"tokens": t})) for t in range(1, r + 1)]
    f = fit_samples(samples, r)
    assert f.status == "fit"
    assert all(evaluate(f.expr, {"tokens": t}) == v for t, v in samples)


@settings(max_examples=80, deadline=None)
@given(FAMILY, st.lists(st.integers(1, 300), min_size=1, max_size=6))
def test_never_unfit_on_own_samples_and_candidates_match(e, ts):
    samples = [(t, evaluate(e, {"tokens": t})) for t in ts]
    f = fit_samples(samples, 300)
    assert f.status in ("fit", "underdetermined")
    for c in ([f.expr] if f.expr is not None else f.candidates):
        assert all(evaluate(c, {"tokens": t}) == v for t, v in samples), to_text(c)
