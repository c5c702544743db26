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


MANIFEST = {  # a decode program of two layers of one GEMV and a two-launch attention, and an argmax (the extern
    # gemm op is not called by it: test_per_op_split_refuses_a_profile_that_does_not_match adds a call)
    "ops": {"embedding": {"impl": {"launches": [{"entry": "embedding"}]}},
            "gemv": {"impl": {"launches": [{"entry": "kern_gemv_norm_m1"}]}},
            "attn": {"impl": {"launches": [{"entry": "paged_decode_attention"}, {"entry": "paged_decode_reduce"}]}},
            "gemm": {"impl": {"launches": [{"extern": "cublaslt.gemm_bf16_tn"}]}},
            "argmax": {"impl": {"launches": [{"entry": "argmax_partial"}]}}},
    "programs": {"decode": {"calls": [{"label": "embed", "op": "embedding"}, {"label": "l0.gemv", "op": "gemv"},
                                      {"label": "l0.attn", "op": "attn"}, {"label": "l1.gemv", "op": "gemv"},
                                      {"label": "l1.attn", "op": "attn"}, {"label": "argmax", "op": "argmax"}]}},
}


def pdl_step(t0: float) -> list[tuple[str, float, float]]:
    """One step of MANIFEST's decode program from t0 µs, each kernel starting 1 µs before its predecessor ends
    (PDL), with a read-back copy at the end."""
    out, t = [], t0
    for name, dur in (("embedding", 2), ("kern_gemv_norm_m1", 10), ("paged_decode_attention", 3),
                      ("paged_decode_reduce", 2), ("kern_gemv_norm_m1", 12), ("paged_decode_attention", 3),
                      ("paged_decode_reduce", 2), ("argmax_partial", 2)):
        out.append((name, t, t + dur))
        t += dur - 1
    out.append(("Memcpy DtoH (Device -> Pinned)", t + 1, t + 2))
    return out


def test_per_op_increments_sum_to_the_wall():
    """Each kernel's increment is how far it moves the latest end of the kernels before it; per call, per op; the
    increments sum to the decode kernels' span (breakdown's wall less the trailing read-back copy), the durations
    (which include the PDL overlap) do not; a prefill tail kernel before the first decode launch is left out of
    both."""
    launches = pd.decode_launches(MANIFEST)
    assert launches == [("embed", "embedding"), ("l0.gemv", "kern_gemv_norm_m1"), ("l0.attn", "paged_decode_attention"),
                        ("l0.attn", "paged_decode_reduce"), ("l1.gemv", "kern_gemv_norm_m1"),
                        ("l1.attn", "paged_decode_attention"), ("l1.attn", "paged_decode_reduce"),
                        ("argmax", "argmax_partial")]
    ev = [("nvjet_sm90_gemm", 0.0, 90.0), ("qk_norm_rope_kv", 90.0, 94.0)] + pdl_step(100.0) + pdl_step(200.0)
    calls, why = pd.per_call(ev, launches)
    assert why is None
    # the first kernel counts from its own start; step 2's embedding from step 1's end (129): the host gap is in it
    assert calls["embed"] == pytest.approx((2, (2 + 202 - 129) / 2))
    assert calls["l0.gemv"] == pytest.approx((10, 9)) and calls["l1.gemv"] == pytest.approx((12, 11))
    assert calls["l0.attn"] == pytest.approx((5, 3)) and calls["argmax"] == pytest.approx((2, 1))
    ops = pd.by_op(calls, MANIFEST)
    assert ops["gemv"] == pytest.approx((2, 22, 20)) and ops["attn"] == pytest.approx((2, 10, 6))
    total = sum(i for _, i in calls.values())
    assert total == pytest.approx((229 - 100) / 2)  # step 2's argmax end minus step 1's embedding start
    r = pd.breakdown(ev, steps_hint=2, first_entry="embedding")
    assert r["wall"] == pytest.approx((230 - 100) / 2)  # to the read-back copy's end: 0.5 µs per token more
    assert "qk_norm_rope_kv" not in r["by_kernel"]
    assert "qk_norm_rope_kv" in pd.breakdown(ev, steps_hint=2)["by_kernel"]  # without the manifest: kept
    r["ops"] = ops
    text = pd.table(r, "pdl", "no GPU")
    assert "| `gemv` | 2 | 22.0 | 20.0 | 10.00 | 31.0% |" in text
    assert f"| **{total:.1f}** | | 100% |" in text


def test_per_op_split_refuses_a_profile_that_does_not_match():
    """Each way the profile and the program can disagree is refused with its reason (no table of wrong numbers)."""
    launches = pd.decode_launches(MANIFEST)
    calls, why = pd.per_call(pdl_step(0.0)[:-3], launches)
    assert calls is None and "6 decode kernels are 0 steps of 8 launches and 6 more: the profile ends mid-step" in why
    ev = pdl_step(0.0)
    ev[4] = ("kern_gemv_norm_m1_u5", ev[4][1], ev[4][2])  # another entry whose name contains the expected one
    calls, why = pd.per_call(ev, launches)
    assert calls is None and "program kernel 4 (in start order, the runtime's own kernels left out) is `kern_gemv_norm_m1_u5`" in why and "(l1.gemv)" in why
    r = pd.breakdown(ev, steps_hint=1)
    r["ops_skipped"] = why
    assert "no per-op split" in pd.table(r, "x", "no GPU")
    calls, why = pd.per_call(pdl_step(0.0)[1:], launches)  # no kernel named as the first launch
    assert calls is None and "no kernel named `embedding` (the decode program's first launch, embed)" in why
    assert pd.per_call([], launches)[0] is None
    calls, why = pd.per_call(pdl_step(0.0), [])
    assert calls is None and "launches no kernel" in why
    with_gemm = {"ops": MANIFEST["ops"], "programs": {"decode": {"calls": MANIFEST["programs"]["decode"]["calls"]
                                                                 + [{"label": "lm_head", "op": "gemm"}]}}}
    calls, why = pd.per_call(pdl_step(0.0), pd.decode_launches(with_gemm))
    assert calls is None and "extern (cuBLASLt) launches" in why
    with pytest.raises(SystemExit, match="no `decode` program"):
        pd.decode_launches({"ops": {}, "programs": {}})
    with pytest.raises(SystemExit, match="none named `embedding`"):
        pd.breakdown([("nvjet_sm90_gemm", 0.0, 1.0), ("kern_gemv_m1", 2.0, 3.0)], 1, first_entry="embedding")
    assert pd.is_copy("memset (Device)") and pd.is_copy("Memcpy DtoH (Device -> Pinned)")


def test_runtime_stage_kernels_are_not_program_launches():
    """kern-driver's stage kernel runs before every step's first launch (from the second step on, in the profile):
    the program's launches are matched without it, its time and increment get a row of their own, and the
    increments still sum to the span."""
    launches = pd.decode_launches(MANIFEST)
    ev = pdl_step(100.0) + [("kern_runtime_stage", 196.0, 198.0)] + pdl_step(200.0)
    ev.sort(key=lambda e: e[1])
    calls, why = pd.per_call(ev, launches)
    assert why is None
    # steps = 2: the stage kernel's 2 µs once over two tokens; its increment from step 1's end (129) to 198
    assert calls[pd.RUNTIME_LABEL] == pytest.approx((1, (198 - 129) / 2))
    assert calls["embed"] == pytest.approx((2, (2 + 202 - 198) / 2))  # step 2's embedding now counts from 198
    assert sum(i for _, i in calls.values()) == pytest.approx((229 - 100) / 2)
    ops = pd.by_op(calls, MANIFEST)
    assert ops[pd.RUNTIME_LABEL] == pytest.approx((1, 1, (198 - 129) / 2))
    assert pd.group_of("kern_runtime_stage").startswith("staging")
    assert pd.breakdown(ev, steps_hint=2, first_entry="embedding")["by_group"][pd.group_of("kern_runtime_stage")] \
        == pytest.approx((2 + 1 + 1) / 2)  # the stage kernel (2 µs) and the two steps' read-back copies (1 µs each)
    # a profile cut mid-step names the runtime's kernels it set aside
    calls, why = pd.per_call(ev[:-2], launches)
    assert calls is None and "besides 1 of the runtime's kern_runtime_stage" in why


def test_runtime_kernel_name_is_kern_drivers():
    stage_kernel = pytest.importorskip("kern_driver.stage_kernel")
    assert stage_kernel.ENTRY in pd.RUNTIME_KERNELS
