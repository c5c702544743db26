"""tools/profile_decode.py's split of decode time, on synthetic kernel timelines (no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import profile_decode as pd  # noqa: E402


def step(t0: float) -> list[tuple[str, float, float]]:
    """One decode step starting at t0 µs: embedding 2, gemv 10, attention 3 + reduce 1, argmax 2, 1 µs gaps."""
    out, t = [], t0
    for name, dur in (("embedding", 2), ("kern_gemv_norm_m1", 10), ("paged_decode_attention", 3),
                      ("paged_decode_reduce", 1), ("argmax_partial", 2)):
        out.append((name, t, t + dur))
        t += dur + 1
    return out


def test_breakdown_splits_kernels_groups_and_gaps():
    ev = [("paged_prefill_attention", 0.0, 50.0), ("nvjet_sm90_gemm", 50.0, 90.0)]
    for s in range(4):
        ev += step(100.0 + 30 * s)
    r = pd.breakdown(ev, steps_hint=99)
    assert r["steps"] == 4
    assert r["by_group"]["GEMV (decode GEMMs)"] == pytest.approx(10)
    assert r["by_group"]["decode attention"] == pytest.approx(4)
    assert r["by_group"]["argmax"] == pytest.approx(2)
    assert r["busy"] == pytest.approx(18)
    # wall: first decode kernel start (100) to last end (100 + 90 + 22) over 4 steps
    assert r["wall"] == pytest.approx((212 - 100) / 4)
    assert r["gap"] == pytest.approx(r["wall"] - 18) and r["overlap"] == pytest.approx(0)
    assert r["launches"]["paged_decode_reduce"] == pytest.approx(1)
    text = pd.table(r, "synthetic", "no GPU")
    assert "| GEMV (decode GEMMs) | 10.0 |" in text and "gaps" in text


def test_breakdown_without_decode_kernels_is_a_clear_error():
    with pytest.raises(SystemExit, match="no decode kernels after the prefill kernels"):
        pd.breakdown([("paged_prefill_attention", 0.0, 5.0)], steps_hint=1)


def test_overlapping_kernels_count_once_in_the_gaps():
    # PDL: the second kernel starts 4 µs before the first ends and waits
    ev = [("paged_prefill_attention", 0.0, 5.0), ("embedding", 10.0, 20.0), ("kern_gemv_m1", 16.0, 30.0),
          ("argmax_partial", 32.0, 34.0)]
    r = pd.breakdown(ev, steps_hint=1)
    assert r["busy"] == pytest.approx(26) and r["covered"] == pytest.approx(22)
    assert r["overlap"] == pytest.approx(4) and r["gap"] == pytest.approx(24 - 22)
    assert "overlap" in pd.table(r, "pdl", "no GPU")


def test_rope_cluster_attention_has_its_own_group():
    """gen_qwen3's default decode attention does the prologue's work too: its own group, not "decode attention"."""
    assert pd.group_of("decode_attention_rope_cluster") == "decode attention + qk-norm, rotary, KV write (one launch)"
    assert pd.group_of("decode_attention_cluster") == "decode attention"
    assert pd.group_of("qk_norm_rope_kv") == "qk-norm + rotary + KV write"
