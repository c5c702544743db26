"""CPU checks of tools/gpu/l2_prefetch_variant.py (NOTES.md 43): the 4B example's o and qkv GEMVs rewritten onto
gemv.cu's `_pf` forms built with -DGEMV_PF_AT=0 verify against the built kernels, each call prefetching the given rows
of its own layer's weight; bad specs are refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import build_kernels as bk  # noqa: E402
import l2_prefetch_variant as l2  # noqa: E402

EXAMPLE = ROOT / "examples" / "qwen3-4b.json"


@pytest.fixture(scope="module")
def kernels(built_kernels, tmp_path_factory):
    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    k = tmp_path_factory.mktemp("l2pf") / "kernels"
    shutil.copytree(built_kernels, k)
    subprocess.run([nvcc, *bk.NVCC_FLAGS, "-DGEMV_L2_PREFETCH", "-DGEMV_PF_AT=0", "-o", str(k / "gemv_pf0.cubin"),
                    "gemv.cu"], cwd=ROOT / "tools" / "kernels-src", check=True, capture_output=True)
    return k


def test_rewrite_verifies(kernels, fma_4b):
    """On the 4B example's `--gemv gemv-fma` form, whose qkv is gemv.cu's row-pass launch (the example's GEMVs are
    gemv_tc.cu's: their `_pf` twins are gemv.cu's, known_launch's note names the fair control)."""
    from kern_verify.verify import verify_text

    m = json.loads(fma_4b.read_text())
    out = l2.rewrite(m, kernels, ["o:self:2048:512", "qkv:gate_up:0:100"])
    assert not [str(d) for d in verify_text(json.dumps(out), kernels_dir=kernels) if d.severity == "error"]
    o = out["ops"]["gemv_residual_o_proj_pf"]["impl"]["launches"][0]
    assert o["entry"] == "kern_gemv_residual_m1_pf" and o["args"][-1] == {"u64": 512 * 4096 * 2}
    calls = [c for c in out["programs"]["decode"]["calls"] if c["op"] == "gemv_residual_o_proj_pf"]
    assert len(calls) == 36
    assert calls[7]["args"][-1] == {"buf": "model.layers.7.self_attn.o_proj.weight", "offset": 2048 * 4096 * 2}
    q = [c for c in out["programs"]["decode"]["calls"] if c["op"] == "gemv_norm_qkv_pf"]
    assert q[35]["args"][-1] == {"buf": "model.layers.35.mlp.gate_up_proj.weight", "offset": 0}
    # 4B's qkv came from the row-pass module (gemv_p2, 192 blocks): the `_pf` entry is the default form, 384 blocks,
    # and gemv_p2, used by no launch any more, is gone
    assert m["ops"]["gemv_norm_qkv"]["impl"]["launches"][0]["module"] == "gemv_p2"
    assert out["ops"]["gemv_norm_qkv_pf"]["impl"]["launches"][0]["grid"] == [6144 // 16, 1, 1]
    assert "gemv_p2" not in out["modules"] and "gemv" in out["modules"]
    assert out["programs"]["prefill"] == m["programs"]["prefill"]


@pytest.mark.parametrize("spec,needle", [
    ("o:self:2500:100", "past the weight's 2560 rows"), ("down:self:0:1", "OP is one of"),
    ("o:lm_head:0:1", "TARGET is"), ("o:self:0", "expected OP:TARGET"), ("o:self:x:1", "are integers"),
])
def test_bad_specs_are_refused(kernels, spec, needle):
    with pytest.raises(ValueError, match=needle):
        l2.rewrite(json.loads(EXAMPLE.read_text()), kernels, [spec])


def test_an_op_twice_and_a_missing_cubin_are_refused(kernels, tmp_path):
    m = json.loads(EXAMPLE.read_text())
    with pytest.raises(ValueError, match="given twice"):
        l2.rewrite(m, kernels, ["o:self:0:1", "o:self:1:1"])
    with pytest.raises(ValueError, match="gemv_pf0.cubin: not found"):
        l2.rewrite(m, tmp_path, ["o:self:0:1"])


def test_the_control_and_the_command_line(kernels, tmp_path, capsys):
    """ROWS = 0: the `_pf` form prefetching nothing (pf_bytes 0), the control of the experiment; the command line
    writes what verifies and refuses bad input with exit status 1 (an --out without a folder: argparse's 2) and a message."""
    out = tmp_path / "m.json"
    assert l2.main([str(EXAMPLE), "--kernels", str(kernels), "--out", str(out), "--prefetch", "o:self:0:0"]) == 0
    ln = json.loads(out.read_text())["ops"]["gemv_residual_o_proj_pf"]["impl"]["launches"][0]
    assert ln["args"][-1] == {"u64": 0}
    for argv, needle in [
        ([str(tmp_path / "none.json"), "--out", str(out)], "cannot read the manifest"),
        ([str(out), "--out", str(tmp_path / "again.json")], "no op `gemv_residual_o_proj`"),
    ]:
        assert l2.main([*argv, "--kernels", str(kernels), "--prefetch", "o:self:0:1"]) == 1
        assert needle in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's exit 2
        l2.main([str(EXAMPLE), "--kernels", str(kernels), "--out", str(tmp_path / "no" / "m.json"), "--prefetch",
                 "o:self:0:1"])
    assert "no folder" in capsys.readouterr().err
