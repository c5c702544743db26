"""CPU checks of gemv.cu's flag-dependency build (-DGEMV_FLAG_DEP; tools/gpu/flag_variant.py rewrites a decode
program onto it; NOTES.md 49): no GPU needed.

- gemv.cu's default cubin is unchanged by the build's hooks (the pinned sha256 of every example);
- the build's entries and their ELF parameter tables: each is gemv.cu's default entry of the same arithmetic with its
  counter pointers (8 bytes) and target (4 bytes) appended; the waiting entries never execute griddepcontrol.wait,
  the signalling gate_up still does;
- in the PTX: a waiting entry polls with ld.acquire.gpu before anything it reads of its producer (no global load but
  the weight stream and the norm weight before the poll; x through generic loads, not the read-only path), writes
  no global memory before it, and every signal (atom.add) follows the block's stores and a membar;
- the rewrite: both modes on the 4B and 0.6B examples verify against the built kernels (E0088 warnings only on the
  waiting entries), with the counters in a `carry` buffer, layer 0's qkv and the lm_head left on griddepcontrol.wait
  and the last down not signalling; what it cannot rewrite is refused by name, on the command line too.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "kernels-src"
EXAMPLES = {g: ROOT / "examples" / f"qwen3-{g}.json" for g in ("4b", "0.6b")}
GEMV_SHA256 = "c7b152ab36394c8014321816a3d303779312b21d885f2b195ca30e3df753bd3e"

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import flag_variant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import nvcc_builds  # noqa: E402  (this folder's helpers)
from ptx_entries import ptx_entries  # noqa: E402

WAITING = {"kern_gemv_residual_m1_flagwait": "kern_gemv_residual_m1",
           "kern_gemv_residual_m1_flagwait_signal": "kern_gemv_residual_m1",
           "kern_gemv_norm_m1_flagwait": "kern_gemv_norm_m1"}
SIGNAL = {"kern_gemv_norm_silu_m1_u5_signal": "kern_gemv_norm_silu_m1_u5",
          "kern_gemv_norm_silu_m1_signal": "kern_gemv_norm_silu_m1"}
#: the tagged forms: the tag (4 bytes) appended; gate_up still waits, down never does
TAGGED = {"kern_gemv_norm_silu_m1_tagged": "kern_gemv_norm_silu_m1",
          "kern_gemv_norm_silu_m1_u5_tagged": "kern_gemv_norm_silu_m1_u5",
          "kern_gemv_residual_m1_tagged": "kern_gemv_residual_m1"}
#: param sizes each flag entry appends to its default twin's: pointers 8, the target 4
EXTRA = {"kern_gemv_norm_silu_m1_u5_signal": [8], "kern_gemv_norm_silu_m1_signal": [8],
         "kern_gemv_residual_m1_flagwait": [8, 4],
         "kern_gemv_residual_m1_flagwait_signal": [8, 4, 8], "kern_gemv_norm_m1_flagwait": [8, 4],
         **{name: [4] for name in TAGGED}}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """gemv.cu's default cubin, and its flag build's cubin and PTX, nvcc runs started together."""
    flag = ("GEMV_FLAG_DEP",)
    return nvcc_builds(tmp_path_factory.mktemp("gemv_flag"), {
        name: ("gemv.cu", defines, name) for name, defines in
        (("gemv.cubin", ()), ("flag.cubin", flag), ("flag.ptx", flag))})


def test_default_cubin_unchanged(builds):
    import hashlib

    assert hashlib.sha256(builds["gemv.cubin"].read_bytes()).hexdigest() == GEMV_SHA256


def test_entries_abi_and_waits(builds):
    e = read_cubin(builds["flag.cubin"].read_bytes()).entries
    g = read_cubin(builds["gemv.cubin"].read_bytes()).entries
    assert set(e) == set(WAITING) | set(SIGNAL) | set(TAGGED)
    for name, twin in {**WAITING, **SIGNAL, **TAGGED}.items():
        assert [s.size for s in e[name].params] == [s.size for s in g[twin].params] + EXTRA[name], name
        assert e[name].grid_dep_wait is (name in SIGNAL or "silu" in name), name
        assert e[name].registers is not None and e[name].registers <= 128, name  # two 256-thread blocks per SM


def test_poll_before_reads_and_signal_after_stores(builds):
    entries = ptx_entries(builds["flag.ptx"].read_text())
    for name in WAITING:
        lines = entries[name]
        poll = next(i for i, ln in enumerate(lines) if ln.startswith("ld.relaxed.gpu.global.u32"))
        acquire = next(i for i, ln in enumerate(lines) if ln.startswith("ld.acquire.gpu.global.u32"))
        assert poll < acquire, name
        before = lines[:poll]
        assert not [ln for ln in before if re.search(r"\bst\.global|\batom\.|\bred\.", ln)], name
        # before the poll only the weight stream: every global load is an L1::no_allocate weight load
        loads = [ln for ln in before if re.search(r"\bld\.(global|v\d|u|b)", ln) and "ld.param" not in ln]
        assert all("L1::no_allocate" in ln for ln in loads), (name, [ln for ln in loads if "no_allocate" not in ln])
        assert not any(ln.startswith("griddepcontrol.wait") for ln in lines), name
        after = lines[acquire:]
        assert not [ln for ln in lines[poll:acquire] if re.search(r"\bld\.(global|v\d)", ln)
                    and "no_allocate" not in ln], name
        nc = [ln for ln in after if ln.startswith("ld.global.nc.v4") and "no_allocate" not in ln]
        # x through generic loads; the only read-only load left is the norm weight's (qkv), which no kernel writes
        # (the flag forms take norm_to_smem's loop, as the plain entries do)
        assert len(nc) == (1 if "norm" in name else 0), (name, nc)
    for name in (*SIGNAL, "kern_gemv_residual_m1_flagwait_signal"):
        lines = entries[name]
        add = max(i for i, ln in enumerate(lines) if ln.startswith("red.release.gpu.global.add.u32"))
        stores = [i for i, ln in enumerate(lines) if re.match(r"st\.global", ln)]
        barriers = [i for i, ln in enumerate(lines) if ln.startswith("bar.sync")]
        assert stores and max(stores) < add, name
        assert barriers and max(stores) < max(barriers) < add, name  # every thread's stores, then the release add


def test_tagged_down_reads_through_l2_and_never_waits(builds):
    """The tagged down: no griddepcontrol.wait, no global write before its stores; its x words are loaded plainly,
    then re-read with ld.global.cg (L2) in the tag loop; its residual read goes through L2 (no wait: this SM's L1 may
    hold lines from before the previous GEMV wrote them). The tagged gate_up stores 32-bit words after its wait."""
    entries = ptx_entries(builds["flag.ptx"].read_text())
    down = entries["kern_gemv_residual_m1_tagged"]
    assert not any(ln.startswith("griddepcontrol.wait") for ln in down)
    assert any(ln.startswith("griddepcontrol.launch_dependents") for ln in down)
    assert sum(ln.startswith("ld.global.cg.v4.u32") for ln in down) >= 2
    assert any(ln.startswith("ld.global.cg.u16") for ln in down)
    assert not any(re.match(r"ld\.global\.u16", ln) for ln in down)  # the residual only through .cg
    for name in ("kern_gemv_norm_silu_m1_tagged", "kern_gemv_norm_silu_m1_u5_tagged"):
        lines = entries[name]
        wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
        stores = [i for i, ln in enumerate(lines) if re.match(r"st\.global", ln)]
        assert stores and min(stores) > wait and all(re.match(r"st\.global\.(u32|b32)", lines[i]) for i in stores)


def _kernels_with(built_kernels: Path, tmp: Path, builds: dict) -> Path:
    k = tmp / "kernels"
    shutil.copytree(built_kernels, k)
    shutil.copy(builds["flag.cubin"], k / "gemv_flag.cubin")
    return k


@pytest.mark.parametrize("geometry", list(EXAMPLES))
@pytest.mark.parametrize("mode", flag_variant.MODES)
def test_rewrite_verifies(builds, built_kernels, tmp_path, geometry, mode):
    from kern_verify.verify import verify_text

    kernels = _kernels_with(built_kernels, tmp_path, builds)
    m = json.loads(EXAMPLES[geometry].read_text())
    out = flag_variant.rewrite(m, kernels, mode)
    diags = verify_text(json.dumps(out), kernels_dir=kernels)
    assert not [str(d) for d in diags if d.severity == "error"]
    waiting = {"gemv_residual_down_proj_flagwait", "gemv_residual_down_proj_flagwait_signal", "gemv_norm_qkv_flagwait",
               "gemv_residual_down_proj_tagged"}
    warned = {d.location.split(".")[1] for d in diags if d.code == "E0088"}
    assert warned <= waiting and bool(warned) == (mode != "signal-only")
    if mode != "tagged":
        assert out["buffers"]["gemv_flags"] == {"dtype": "u32", "shape": [4], "class": "carry"}
    assert out["programs"]["prefill"] == m["programs"]["prefill"]
    src, calls = m["programs"]["decode"]["calls"], out["programs"]["decode"]["calls"]
    assert [c["label"] for c in calls] == [c["label"] for c in src]
    ops = [c["op"] for c in calls]
    layers = sum(c["op"] == "gemv_norm_silu_gate_up" for c in src)
    assert ops.count("gemv_norm_silu_gate_up_tagged" if mode == "tagged" else "gemv_norm_silu_gate_up_signal") == layers
    assert "gemv_norm_silu_gate_up" not in ops
    gu = m["ops"]["gemv_norm_silu_gate_up"]["impl"]["launches"][0]["grid"][0]
    down = m["ops"]["gemv_residual_down_proj"]["impl"]["launches"][0]["grid"][0]
    downs = [c for c in calls if c["op"].startswith("gemv_residual_down_proj")]
    qkvs = [c for c in calls if c["op"].startswith("gemv_norm_qkv")]
    if mode == "tagged":
        assert warned == {"gemv_residual_down_proj_tagged"}
        assert out["buffers"]["act_tagged"] == {"dtype": "u32", "shape": [m["buffers"]["act"]["shape"][1]],
                                                "class": "carry"}
        assert "gemv_flags" not in out["buffers"] and out["buffers"]["act"] == m["buffers"]["act"]  # prefill's still
        gus = [c for c in calls if c["op"] == "gemv_norm_silu_gate_up_tagged"]
        assert [c["args"][-1] for c in gus] == [{"i32": i + 1} for i in range(layers)]
        assert [c["args"][-1] for c in downs] == [{"i32": i + 1} for i in range(layers)]
        assert all(c["args"][3] == {"buf": "act_tagged"} for c in gus)
        assert all(c["args"][0] == {"buf": "act_tagged"} for c in downs)
        ln = out["ops"]["gemv_residual_down_proj_tagged"]["impl"]["launches"][0]
        assert (ln["entry"], ln["params"][0], ln["args"][-1], ln["pdl"]) == (
            "kern_gemv_residual_m1_tagged", "in buffer<u32>", {"param": 3}, True)
        return
    if mode == "signal-only":
        assert {c["op"] for c in downs} == {"gemv_residual_down_proj"} and {c["op"] for c in qkvs} == {"gemv_norm_qkv"}
        assert "gemv_residual_down_proj_flagwait" not in out["ops"] and not warned
        return
    if mode == "down":
        assert {c["op"] for c in downs} == {"gemv_residual_down_proj_flagwait"}
        assert {c["op"] for c in qkvs} == {"gemv_norm_qkv"}
    else:
        assert [c["op"] for c in downs] == ["gemv_residual_down_proj_flagwait_signal"] * (layers - 1) + [
            "gemv_residual_down_proj_flagwait"]
        assert [c["op"] for c in qkvs] == ["gemv_norm_qkv"] + ["gemv_norm_qkv_flagwait"] * (layers - 1)
        assert downs[0]["args"][-2:] == [{"buf": "gemv_flags"}, {"buf": "gemv_flags", "offset": 8}]
        assert qkvs[1]["args"][-1] == {"buf": "gemv_flags", "offset": 8}
        ln = out["ops"]["gemv_norm_qkv_flagwait"]["impl"]["launches"][0]
        assert ln["args"][-1] == {"i32": down} and ln["pdl"] is True
        # the flag form is one 16-row unit per block: 4B's qkv (row-pass module gemv_p2, 192 blocks) gets the default
        # form's grid back, every row covered
        n_qkv = m["ops"]["gemv_norm_qkv"]["impl"]["launches"][0]["args"][4]["i32"]
        assert ln["grid"] == [-(-n_qkv // 16), 1, 1] and ln["module"] == "gemv_flag"
    ln = out["ops"]["gemv_residual_down_proj_flagwait"]["impl"]["launches"][0]
    assert (ln["module"], ln["args"][-1], ln["pdl"]) == ("gemv_flag", {"i32": gu}, True)
    base = m["ops"]["gemv_residual_down_proj"]["impl"]["launches"][0]
    assert (ln["grid"], ln["block"], ln["params"][:len(base["params"])]) == (base["grid"], base["block"],
                                                                             base["params"])


def test_rewrite_refuses_what_it_cannot_do(builds, built_kernels, tmp_path, capsys):
    m = json.loads(EXAMPLES["4b"].read_text())
    with pytest.raises(ValueError, match="gemv_flag.cubin: not found; build it"):
        flag_variant.rewrite(m, tmp_path)
    kernels = _kernels_with(built_kernels, tmp_path, builds)
    with pytest.raises(ValueError, match="not a -DGEMV_FLAG_DEP build of gemv.cu"):
        flag_variant.rewrite(m, kernels, cubin_name="gemv.cubin")
    with pytest.raises(ValueError, match="--mode all: expected one of down, down-qkv, signal-only, tagged"):
        flag_variant.rewrite(m, kernels, "all")
    bad = copy.deepcopy(m)
    bad["ops"]["gemv_residual_down_proj"]["impl"]["launches"][0]["entry"] = "kern_gemv_residual_m1_u5"
    with pytest.raises(ValueError, match="op `gemv_residual_down_proj` launches kern_gemv_residual_m1_u5; this "
                                         "rewrite knows one launch of `kern_gemv_residual_m1` \\(or gemv_tc.cu's "
                                         "`kern_gemvtc` forms of them\\)$"):
        flag_variant.rewrite(bad, kernels)
    bad = copy.deepcopy(m)
    bad["ops"]["gemv_norm_qkv"]["impl"]["launches"][0]["pdl"] = False
    with pytest.raises(ValueError, match="op `gemv_norm_qkv` is not a `pdl` launch"):
        flag_variant.rewrite(bad, kernels)
    with pytest.raises(ValueError, match="no op `gemv_norm_silu_gate_up`"):
        flag_variant.rewrite(flag_variant.rewrite(m, kernels), kernels)
    out = tmp_path / "flag.json"
    assert flag_variant.main([str(EXAMPLES["4b"]), "--kernels", str(kernels), "--mode", "down-qkv",
                              "--out", str(out)]) == 0
    assert "GEMV dependencies by down-qkv (not griddepcontrol.wait)" in capsys.readouterr().out
    assert json.loads(out.read_text())["modules"]["gemv_flag"]["source"] == "gemv_flag.cubin"


def test_rewrite_refuses_a_grid_that_is_not_one_dimensional(tmp_path, monkeypatch):
    """FlagGate resets a counter when gridDim.x blocks have passed and the targets are the producers' block counts: a
    waiting op with a y extent would reset the count while its other blocks still poll (a hang), so a grid other
    than [N, 1, 1] is refused by name (no nvcc: the cubin check is stubbed)."""
    (tmp_path / "gemv_flag.cubin").write_bytes(b"stub")
    monkeypatch.setattr(flag_variant, "_check_cubin", lambda kernels, name: None)
    m = json.loads(EXAMPLES["4b"].read_text())
    assert "gemv_norm_qkv_flagwait" in flag_variant.rewrite(m, tmp_path, "down-qkv")["ops"]
    for op in ("gemv_norm_silu_gate_up", "gemv_residual_down_proj", "gemv_norm_qkv"):
        bad = copy.deepcopy(m)
        ln = bad["ops"][op]["impl"]["launches"][0]
        ln["grid"] = [ln["grid"][0] // 2, 2, 1]
        with pytest.raises(ValueError, match=rf"op `{op}`'s grid is \[\d+, 2, 1\]; the flag build needs \[N, 1, 1\]"):
            flag_variant.rewrite(bad, tmp_path, "down-qkv")
