"""CPU checks of gemv_mlp.cu, the one-launch decode MLP experiment (tools/gpu/mlp_variant.py rewrites a manifest onto
it; NOTES.md 42 has what it measured): no GPU needed.

- its entries and their ELF parameter tables: the norm_acc and residual_acc forms are gemv.cu's default tables with
  the accumulator pointer added, kern_mlp_m1 is compiled for a cluster of 8 CTAs with at most 128 registers (two
  CTAs per SM), every PDL entry waits (griddepcontrol.wait); the MLP_DOWN_PREWAIT and MLP_RED builds keep the ABI;
- gemv.cu's GEMV_NO_ENTRIES guard: the including source gets none of gemv.cu's own entries;
- the rewrite: the 4B and 0.6B examples' decode programs onto the module verify against the built kernels (gate_up +
  down become one call per layer, 183 -> 147 and 143 -> 115 decode calls, prefill untouched), and what it cannot
  rewrite is refused by name.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "kernels-src"
EXAMPLES = {g: ROOT / "examples" / f"qwen3-{g}.json" for g in ("4b", "0.6b")}

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import build_kernels as bk  # noqa: E402
import mlp_variant  # noqa: E402

BUILDS = {"default": (), "pre": ("MLP_DOWN_PREWAIT=1",), "red": ("MLP_RED=1",)}
ENTRIES = {"kern_mlp_m1", "kern_gemv_norm_acc_m1", "kern_gemv_norm_acc_m1_u5", "kern_gemv_residual_acc_m1",
           "kern_embedding_acc"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """gemv_mlp.cu's three builds and gemv.cu's default cubin, nvcc runs started together."""
    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    tmp = tmp_path_factory.mktemp("gemv_mlp")
    jobs = {}
    for name, defines in [*BUILDS.items(), ("gemv", ())]:
        src = "gemv.cu" if name == "gemv" else "gemv_mlp.cu"
        out = tmp / f"{name}.cubin"
        cmd = [nvcc, *bk.NVCC_FLAGS, *(f"-D{d}" for d in defines), "-o", str(out), src]
        jobs[name] = (subprocess.Popen(cmd, cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), out)
    for name, (p, _) in jobs.items():
        log = p.communicate()[0].decode()
        assert p.returncode == 0, f"{name}: {log}"
    return {name: out for name, (_, out) in jobs.items()}


@pytest.mark.parametrize("build", list(BUILDS))
def test_entries_abi_cluster_and_waits(builds, build):
    c = read_cubin(builds[build].read_bytes())
    assert set(c.entries) == ENTRIES  # none of gemv.cu's own entries (GEMV_NO_ENTRIES)
    g = read_cubin(builds["gemv"].read_bytes()).entries
    e = c.entries

    def sizes(info):
        return [(s.offset, s.size) for s in info.params]

    # (x, acc, norm_w, w, y, n, k, eps, ksplit): kern_gemv_norm_m1's (x, norm_w, w, y, n, k, eps, ksplit) + acc
    norm = [s.size for s in g["kern_gemv_norm_m1"].params]
    for name in ("kern_gemv_norm_acc_m1", "kern_gemv_norm_acc_m1_u5"):
        assert [s.size for s in e[name].params] == [norm[0], 8, *norm[1:]]
        assert e[name].grid_dep_wait is True
    res = [s.size for s in g["kern_gemv_residual_m1"].params]  # (x, w, residual, n, k, ksplit)
    assert [s.size for s in e["kern_gemv_residual_acc_m1"].params] == [*res[:3], 8, *res[3:]]
    assert e["kern_gemv_residual_acc_m1"].grid_dep_wait is True
    assert sizes(e["kern_mlp_m1"]) == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4), (44, 4), (48, 4)]
    assert e["kern_mlp_m1"].cluster == (8, 1, 1) and e["kern_mlp_m1"].grid_dep_wait is True
    assert e["kern_mlp_m1"].registers is not None and e["kern_mlp_m1"].registers <= 128  # two 256-thread CTAs per SM
    assert [s.size for s in e["kern_embedding_acc"].params] == [8, 8, 8, 8, 4, 4]


def _kernels_with(built_kernels: Path, tmp: Path, cubin: Path) -> Path:
    k = tmp / "kernels"
    shutil.copytree(built_kernels, k)
    shutil.copy(cubin, k / "gemv_mlp.cubin")
    return k


@pytest.mark.parametrize("geometry", list(EXAMPLES))
def test_rewrite_verifies(builds, built_kernels, tmp_path, geometry):
    from kern_verify.verify import verify_text

    kernels = _kernels_with(built_kernels, tmp_path, builds["default"])
    m = json.loads(EXAMPLES[geometry].read_text())
    out = mlp_variant.rewrite(m, kernels)
    text = json.dumps(out)
    assert not [str(d) for d in verify_text(text, kernels_dir=kernels) if d.severity == "error"]
    layers = sum(c["op"] == "gemv_norm_qkv" for c in m["programs"]["decode"]["calls"])
    calls = out["programs"]["decode"]["calls"]
    assert len(calls) == len(m["programs"]["decode"]["calls"]) - layers
    assert [c["op"] for c in calls].count("mlp_fused") == layers
    assert out["programs"]["prefill"] == m["programs"]["prefill"]
    assert "gemv_norm_silu_gate_up" not in out["ops"] and "gemv_residual_down_proj" not in out["ops"]
    assert out["buffers"]["mlp_acc"] == {"dtype": "i64", "shape": [m["buffers"]["residual"]["shape"][1]],
                                         "class": "workspace"}
    mlp = out["ops"]["mlp_fused"]["impl"]["launches"][0]
    gu = m["ops"]["gemv_norm_silu_gate_up"]["impl"]["launches"][0]
    n, k = gu["args"][4]["i32"], gu["args"][5]["i32"]
    assert mlp["grid"] == [n // 8, 1, 1] and mlp["shared_mem"] == 2 * k
    # layer 0's MLP reads layer 0's down weight; the step's embedding clears the accumulator
    first = next(c for c in calls if c["op"] == "mlp_fused")
    assert first["args"][3] == {"buf": "model.layers.0.mlp.down_proj.weight"}
    assert calls[0]["op"] == "embedding_acc" and calls[0]["args"][-1] == {"buf": "mlp_acc"}
    pre = mlp_variant.rewrite(m, _kernels_with(built_kernels, tmp_path / "pre", builds["pre"]), down_prewait=True)
    assert pre["ops"]["mlp_fused"]["impl"]["launches"][0]["shared_mem"] == 18 * k


def test_rewrite_refuses_what_it_cannot_do(builds, built_kernels, tmp_path):
    m = json.loads(EXAMPLES["4b"].read_text())
    with pytest.raises(ValueError, match="gemv_mlp.cubin: not found"):
        mlp_variant.rewrite(m, tmp_path)
    kernels = _kernels_with(built_kernels, tmp_path, builds["default"])
    bad = copy.deepcopy(m)
    bad["ops"]["gemv_norm_silu_gate_up"]["impl"]["launches"][0]["args"][4] = {"i32": 9700}
    with pytest.raises(ValueError, match="n % 64 == 0"):
        mlp_variant.rewrite(bad, kernels)
    bad = copy.deepcopy(m)
    bad["ops"]["gemv_residual_o_proj"]["impl"]["launches"][0]["entry"] = "kern_gemv_residual_m1_u5"
    with pytest.raises(ValueError, match="o_proj launches kern_gemv_residual_m1_u5"):
        mlp_variant.rewrite(bad, kernels)
