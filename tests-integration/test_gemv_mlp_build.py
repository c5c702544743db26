"""CPU checks of gemv_mlp.cu, the one-launch decode MLP experiment (tools/gpu/mlp_variant.py rewrites a manifest onto
it; NOTES.md 42 has what it measured): no GPU needed.

- its entries and their ELF parameter tables: the norm_acc and residual_acc forms are gemv.cu's default tables with
  the accumulator pointer added, kern_mlp_m1 (kern_mlp_m1_prewait in the MLP_DOWN_PREWAIT build) is compiled for a
  cluster of 8 CTAs with at most 128 registers (two CTAs per SM); the MLP_RED build keeps the ABI;
- the PDL contract in the PTX of every build: each entry but the embedding executes griddepcontrol.wait, and nothing
  before it writes global memory (st.global, atom, red, cp.reduce); the embedding (launched without PDL) has no wait;
- gemv.cu's GEMV_NO_ENTRIES guard: the including source gets none of gemv.cu's own entries, and gemv.cu's other
  build forms are refused;
- the rewrite: the 4B and 0.6B examples' decode programs onto the module verify against the built kernels (gate_up +
  down become one call per layer, 183 -> 147 and 143 -> 115 decode calls, prefill untouched; the prewait build gets
  its larger shared memory from its entry), and what it cannot rewrite is refused by name, on the command line too.
"""

from __future__ import annotations

import copy
import json
import os
import re
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import nvcc_builds  # noqa: E402  (this folder's helpers)
from ptx_entries import ptx_entries  # noqa: E402

BUILDS = {"default": (), "pre": ("MLP_DOWN_PREWAIT=1",), "red": ("MLP_RED=1",)}
COMMON = {"kern_gemv_norm_acc_m1", "kern_gemv_norm_acc_m1_u5", "kern_gemv_residual_acc_m1", "kern_embedding_acc"}
MLP_ENTRY = {"default": "kern_mlp_m1", "pre": "kern_mlp_m1_prewait", "red": "kern_mlp_m1"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """gemv_mlp.cu's three builds (cubin and PTX) and gemv.cu's default cubin, nvcc runs started together."""
    jobs = {f"{name}.{suffix}": ("gemv_mlp.cu", defines, f"{name}.{suffix}")
            for name, defines in BUILDS.items() for suffix in ("cubin", "ptx")}
    return nvcc_builds(tmp_path_factory.mktemp("gemv_mlp"), {**jobs, "gemv.cubin": ("gemv.cu", (), "gemv.cubin")})


@pytest.mark.parametrize("build", list(BUILDS))
def test_entries_abi_cluster_and_waits(builds, build):
    c = read_cubin(builds[f"{build}.cubin"].read_bytes())
    mlp = MLP_ENTRY[build]
    assert set(c.entries) == COMMON | {mlp}  # none of gemv.cu's own entries (GEMV_NO_ENTRIES)
    g = read_cubin(builds["gemv.cubin"].read_bytes()).entries
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
    assert sizes(e[mlp]) == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4), (44, 4), (48, 4)]
    assert e[mlp].cluster == (8, 1, 1) and e[mlp].grid_dep_wait is True
    assert e[mlp].registers is not None and e[mlp].registers <= 128  # two 256-thread CTAs per SM
    assert [s.size for s in e["kern_embedding_acc"].params] == [8, 8, 8, 8, 4, 4]
    assert e["kern_embedding_acc"].grid_dep_wait is False


@pytest.mark.parametrize("build", list(BUILDS))
def test_nothing_is_written_to_global_memory_before_the_wait(builds, build):
    entries = ptx_entries(builds[f"{build}.ptx"].read_text())
    assert set(entries) == COMMON | {MLP_ENTRY[build]}
    for name, lines in entries.items():
        waits = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")]
        if name == "kern_embedding_acc":
            assert not waits
            continue
        assert waits, name
        early = [ln for ln in lines[:waits[0]] if re.search(r"\bst\.global|\batom\.|\bred\.|cp\.reduce", ln)]
        assert not early, (name, early)
    pre = entries[MLP_ENTRY[build]][:min(i for i, ln in enumerate(entries[MLP_ENTRY[build]])
                                         if ln.startswith("griddepcontrol.wait"))]
    assert any(ln.startswith("cp.async.cg.shared.global") for ln in pre) == (build == "pre")


def test_other_gemv_forms_are_refused(builds):
    r = subprocess.run([bk._nvcc(), *bk.NVCC_FLAGS, "-DGEMV_TIMELINE", "-o", os.devnull, "gemv_mlp.cu"], cwd=SRC,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "build it without gemv.cu's GEMV_TIMELINE" in r.stdout + r.stderr


def _kernels_with(built_kernels: Path, tmp: Path, builds: dict) -> Path:
    """The built kernels plus gemv_mlp.cubin (default build) and gemv_mlp_pre.cubin (MLP_DOWN_PREWAIT)."""
    k = tmp / "kernels"
    shutil.copytree(built_kernels, k)
    shutil.copy(builds["default.cubin"], k / "gemv_mlp.cubin")
    shutil.copy(builds["pre.cubin"], k / "gemv_mlp_pre.cubin")
    return k


@pytest.mark.parametrize("geometry", list(EXAMPLES))
def test_rewrite_verifies(builds, built_kernels, dense_examples, tmp_path, geometry):
    """On the examples with the dense lm_head (the rewrite moves the final norm onto the accumulator's norm GEMV)."""
    from kern_verify.verify import verify_text

    kernels = _kernels_with(built_kernels, tmp_path, builds)
    m = json.loads(dense_examples[geometry].read_text())
    out = mlp_variant.rewrite(m, kernels)
    text = json.dumps(out)
    assert not [str(d) for d in verify_text(text, kernels_dir=kernels) if d.severity == "error"]
    layers = sum(c["op"] == "gemv_norm_qkv" for c in m["programs"]["decode"]["calls"])
    calls = out["programs"]["decode"]["calls"]
    assert len(calls) == len(m["programs"]["decode"]["calls"]) - layers
    assert [c["op"] for c in calls].count("gemv_norm_mlp") == layers
    assert out["programs"]["prefill"] == m["programs"]["prefill"]
    assert "gemv_norm_silu_gate_up" not in out["ops"] and "gemv_residual_down_proj" not in out["ops"]
    assert out["buffers"]["mlp_acc"] == {"dtype": "i64", "shape": [m["buffers"]["residual"]["shape"][1]],
                                         "class": "workspace"}
    mlp = out["ops"]["gemv_norm_mlp"]["impl"]["launches"][0]
    gu = m["ops"]["gemv_norm_silu_gate_up"]["impl"]["launches"][0]
    n, k = gu["args"][4]["i32"], gu["args"][5]["i32"]
    assert mlp["grid"] == [n // 8, 1, 1] and mlp["shared_mem"] == 2 * k and mlp["pdl"] is True
    # layer 0's MLP reads layer 0's down weight; the step's embedding clears the accumulator
    first = next(c for c in calls if c["op"] == "gemv_norm_mlp")
    assert first["args"][3] == {"buf": "model.layers.0.mlp.down_proj.weight"}
    assert calls[0]["op"] == "embedding_acc" and calls[0]["args"][-1] == {"buf": "mlp_acc"}
    pre = mlp_variant.rewrite(m, kernels, "gemv_mlp_pre.cubin")
    assert not [str(d) for d in verify_text(json.dumps(pre), kernels_dir=kernels) if d.severity == "error"]
    launch = pre["ops"]["gemv_norm_mlp"]["impl"]["launches"][0]
    assert (launch["entry"], launch["shared_mem"]) == ("kern_mlp_m1_prewait", 18 * k)


def _mutated(m: dict, op: str, arg: int, value) -> dict:
    bad = copy.deepcopy(m)
    bad["ops"][op]["impl"]["launches"][0]["args"][arg] = value
    return bad


def test_rewrite_refuses_what_it_cannot_do(builds, built_kernels, dense_4b, tmp_path):
    m = json.loads(dense_4b.read_text())
    with pytest.raises(ValueError, match="gemv_mlp.cubin: not found"):
        mlp_variant.rewrite(m, tmp_path)
    kernels = _kernels_with(built_kernels, tmp_path, builds)
    gu = "gemv_norm_silu_gate_up"
    for bad, needle in [
        (_mutated(m, gu, 4, {"i32": 9700}), "n % 64 == 0"),
        (_mutated(m, gu, 5, {"i32": 2500}), "k % 256 == 0"),
        (_mutated(m, gu, 5, {"i32": 8448}), "k <= 8192"),
    ]:
        with pytest.raises(ValueError, match=needle):
            mlp_variant.rewrite(bad, kernels)
    bad = copy.deepcopy(m)
    bad["ops"]["gemv_residual_o_proj"]["impl"]["launches"][0]["entry"] = "kern_gemv_residual_m1_u5"
    with pytest.raises(ValueError, match="op `gemv_residual_o_proj` launches `kern_gemv_residual_m1_u5`"):
        mlp_variant.rewrite(bad, kernels)
    bad = copy.deepcopy(m)
    bad["ops"]["embedding"]["impl"]["launches"][0]["pdl"] = True
    with pytest.raises(ValueError, match="kern_embedding_acc never waits"):
        mlp_variant.rewrite(bad, kernels)
    bad = copy.deepcopy(m)
    calls = bad["programs"]["decode"]["calls"]
    i = next(i for i, c in enumerate(calls) if c["op"] == "gemv_residual_down_proj")
    calls[i - 1], calls[i] = calls[i], calls[i - 1]
    with pytest.raises(ValueError, match="not right after its gate_up call"):
        mlp_variant.rewrite(bad, kernels)
    with pytest.raises(ValueError, match="no op `gemv_norm_qkv`"):
        mlp_variant.rewrite(mlp_variant.rewrite(m, kernels), kernels)
    with pytest.raises(ValueError, match="not a gemv_mlp.cu build"):
        mlp_variant.rewrite(m, kernels, "gemv.cubin")
    # the committed example (the screened lm_head: no dense lm_head GEMV to move onto the accumulator) is refused by
    # name, with what to pass instead
    with pytest.raises(ValueError) as e:
        mlp_variant.rewrite(json.loads(EXAMPLES["4b"].read_text()), kernels)
    assert "no op `gemv_norm_lm_head`" in str(e.value) and "--lm-head dense" in str(e.value)


def test_command_line(builds, built_kernels, dense_examples, tmp_path, capsys):
    kernels = _kernels_with(built_kernels, tmp_path, builds)
    out = tmp_path / "m.json"
    assert mlp_variant.main([str(dense_examples["0.6b"]), "--kernels", str(kernels), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["buffers"]["mlp_acc"]["shape"] == [1024]
    for argv, needle in [
        ([str(tmp_path / "none.json"), "--out", str(out)], "cannot read the manifest"),
        ([str(EXAMPLES["4b"]), "--out", str(out), "--cubin", str(kernels / "gemv_mlp.cubin")], "not a path"),
        ([str(out), "--out", str(tmp_path / "again.json")], "no op `gemv_norm_qkv`"),
    ]:
        assert mlp_variant.main([*argv, "--kernels", str(kernels)]) == 1
        assert needle in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's exit 2
        mlp_variant.main([str(EXAMPLES["4b"]), "--kernels", str(kernels), "--out", str(tmp_path / "no" / "m.json")])
    assert "no folder" in capsys.readouterr().err
