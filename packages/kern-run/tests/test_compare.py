"""The near-tie judge of kern_run.compare on synthetic logits."""

from __future__ import annotations

import numpy as np
import pytest

from kern_run.compare import bf16_to_f32, first_difference, judge_divergence, top2_gap

V = 1000


def row(best: int, second: int, gap: float, seed: int = 0) -> np.ndarray:
    """Random logits in [-1, 1] with `best` at 3.0 and `second` at 3.0 - gap."""
    r = np.random.default_rng(seed).uniform(-1, 1, V).astype(np.float32)
    r[best], r[second] = 3.0, 3.0 - gap
    return r


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact for these values


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([], [1]) is None
    assert first_difference([7, 2], [7, 2, 9]) is None  # only the common length is compared


def test_identical_sequences_are_not_judged():
    assert judge_divergence([1, 2, 3], [1, 2, 3], 0.1, {"a": ("a", row(1, 2, 0.0))}) is None


def test_near_tie_in_both_runs_own_logits():
    a, b = [5, 6, 7, 8], [5, 6, 9, 10]
    d = judge_divergence(a, b, 0.05, {"chunk 512": ("a", row(7, 9, 0.0156)), "chunk 64": ("b", row(9, 7, 0.0078, 1))})
    assert d.step == 2 and (d.a_token, d.b_token) == (7, 9)
    assert d.gaps == pytest.approx({"chunk 512": 0.0156, "chunk 64": 0.0078}, abs=1e-6)
    assert d.near_tie is True and not d.real
    assert "near-tie" in d.describe() and "step 2" in d.describe()
    rec = d.record()
    assert rec["step"] == 2 and rec["near_tie"] is True and set(rec["gaps"]) == {"chunk 512", "chunk 64"}


def test_exact_tie_is_a_near_tie():
    d = judge_divergence([1], [2], 0.01, {"x": ("a", row(1, 2, 0.0)), "y": ("b", row(2, 1, 0.0))})
    assert d.near_tie is True and d.gaps == {"x": 0.0, "y": 0.0}


def test_a_clear_winner_in_either_run_is_a_real_divergence():
    # run b's own logits say its token beats a's by far more than the noise: b computed something else
    d = judge_divergence([1, 4], [1, 3], 0.05, {"a": ("a", row(4, 3, 0.01)), "b": ("b", row(3, 4, 0.8))})
    assert d.step == 1 and d.near_tie is False and d.real
    assert "REAL" in d.describe()
    d = judge_divergence([1, 4], [1, 3], 0.05, {"a": ("a", row(4, 3, 0.8)), "b": ("b", row(3, 4, 0.01))})
    assert d.near_tie is False


def test_gap_equal_to_the_bound_is_a_near_tie():
    d = judge_divergence([4], [3], 0.25, {"a": ("a", row(4, 3, 0.25))})
    assert d.near_tie is True


def test_one_sided_judge_is_hf_style():
    # kern vs HF: only HF's logits on the shared context; HF's own token is side "a"
    d = judge_divergence([4, 4], [4, 3], 0.1, {"hf": ("a", row(4, 3, 0.05))})
    assert d.near_tie is True and list(d.gaps) == ["hf"]
    d = judge_divergence([4, 4], [4, 3], 0.1, {"hf": ("a", row(4, 3, 0.5))})
    assert d.near_tie is False


def test_no_logits_cannot_be_judged_and_counts_as_real():
    d = judge_divergence([1, 2], [1, 3], 0.1)
    assert d.near_tie is None and d.real and "cannot judge" in d.describe()


def test_bf16_bits_are_decoded():
    r = row(4, 3, 0.015625)  # a bf16-exact gap at 3.0 (ulp 2**-6)
    bits = to_bf16_bits(r)
    assert bf16_to_f32(bits)[4] == 3.0 and bf16_to_f32(bits)[3] == 3.0 - 0.015625
    d = judge_divergence([4], [3], 0.02, {"a": ("a", bits)})
    assert d.gaps["a"] == pytest.approx(0.015625) and d.near_tie is True
    assert top2_gap(bits) == pytest.approx(0.015625)


def test_bad_side_is_refused():
    with pytest.raises(ValueError):
        judge_divergence([1], [2], 0.1, {"x": ("c", row(1, 2, 0.0))})
