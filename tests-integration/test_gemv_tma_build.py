"""CPU checks of gemv.cu's opt-in bulk-copy form (-DGEMV_TMA; tools/gpu/gemv_tma_probe.py times it): no GPU needed.

- the form has exactly the default module's entries with the same ELF parameter tables (offsets and sizes), and
  every entry waits (griddepcontrol.wait): a manifest can swap the module without touching its calls;
- its PTX: each M = 1 entry issues its first bulk copies (cp.async.bulk ... mbarrier::complete_tx) before
  griddepcontrol.wait, loads no weight through ld.global.nc.L1::no_allocate (the default form's weight loads), and
  stores nothing to global memory before the wait; the default module has no bulk copy;
- a ring width that is not a multiple of 32 vectors, a ring over 227 KB and the form combined with the L2-prefetch
  forms do not compile, each with its message;
- the probe's manifest rewrite: the 4B example with qkv on the TMA module verifies against the built kernels,
  with the ring added to the launch's dynamic shared memory, the cubin pinned by its sha256, the other ops as they
  were.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import nvcc_builds  # noqa: E402  (this folder's helpers)
from ptx_entries import ptx_entries  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "kernels-src"
EXAMPLE = ROOT / "examples" / "qwen3-4b.json"

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin

sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import build_kernels as bk  # noqa: E402
import gemv_tma_probe as probe  # noqa: E402


def _cmd(out: Path, defines: tuple[str, ...], ptx: bool) -> list[str]:
    flags = ([f for f in bk.NVCC_FLAGS if f != "-cubin"] + ["-ptx"]) if ptx else list(bk.NVCC_FLAGS)
    return [bk._nvcc(), *flags, *(f"-D{d}" for d in defines), "-o", str(out), "gemv.cu"]


def _nvcc(tmp: Path, name: str, *defines: str, ptx: bool = False) -> Path:
    out = tmp / (name + (".ptx" if ptx else ".cubin"))
    subprocess.run(_cmd(out, defines, ptx), cwd=SRC, check=True, capture_output=True)
    return out


TMA = ("GEMV_TMA", "GEMV_TMA_C=64", "GEMV_TMA_S=2")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """gemv.cu's default cubin, its TMA cubin (C = 64, S = 2, the ring NOTES.md 39 measured best in the program),
    the TMA build at its defaults, and the PTX of the default and TMA forms: nvcc runs started together."""
    tmp = tmp_path_factory.mktemp("gemv_tma")
    return nvcc_builds(tmp, {
        "default": ("gemv.cu", (), "gemv.cubin"), "tma": ("gemv.cu", TMA, "gemv_tma_c64_s2.cubin"),
        "tma_defaults": ("gemv.cu", ("GEMV_TMA",), "gemv_tma.cubin"), "default_ptx": ("gemv.cu", (), "gemv.ptx"),
        "tma_ptx": ("gemv.cu", TMA, "gemv_tma.ptx")}) | {"tmp": tmp}


def _table(info) -> list[tuple[int, int, int]]:
    return [(s.index, s.offset, s.size) for s in sorted(info.params, key=lambda s: s.index)]


@pytest.mark.parametrize("build", ["tma", "tma_defaults"])
def test_tma_module_has_the_default_abi(builds, build):
    base = read_cubin(builds["default"].read_bytes(), "gemv.cubin")
    tma = read_cubin(builds[build].read_bytes(), builds[build].name)
    assert set(tma.entries) == set(base.entries) and len(base.entries) == 24  # 20 + the four `_nb2` forms
    for name, info in base.entries.items():
        assert _table(tma.entries[name]) == _table(info), name
        assert tma.entries[name].grid_dep_wait is True, name


def test_tma_ptx_copies_before_the_wait(builds):
    tma = ptx_entries(builds["tma_ptx"].read_text())
    m1 = {n: lines for n, lines in tma.items() if re.search(r"_m1(_u5)?(_nb2)?$", n)}
    assert len(m1) == 12
    for name, lines in m1.items():
        wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
        copies = [i for i, ln in enumerate(lines) if ln.startswith("cp.async.bulk.shared::cluster.global.mbarrier")]
        assert copies and min(copies) < wait and max(copies) > wait, name  # first stages before, refills after
        assert not [ln for ln in lines if "ld.global.nc.L1::no_allocate" in ln], name
        assert not [ln for ln in lines[:wait] if re.search(r"\bst\.global|\batom\.|\bred\.", ln)], name
    base = builds["default_ptx"].read_text()
    assert "cp.async.bulk" not in base and "mbarrier" not in base


@pytest.mark.parametrize("defines, message", [
    (("GEMV_TMA", "GEMV_TMA_C=48"), "GEMV_TMA_C: a multiple of 32"),
    (("GEMV_TMA", "GEMV_TMA_C=512", "GEMV_TMA_S=4"), "exceeds sm_90's 227 KB"),
    (("GEMV_TMA", "GEMV_L2_PREFETCH"), "GEMV_TMA: not with GEMV_L2_PREFETCH"),
])
def test_tma_refuses_bad_builds(builds, defines, message):
    """A ring width that is not whole warp loads, a ring larger than shared memory, and the TMA form with the
    L2-prefetch forms (whose norm variants would put the ring over x) do not compile, with gemv.cu's message."""
    with pytest.raises(subprocess.CalledProcessError) as e:
        _nvcc(builds["tmp"], "bad", *defines)
    assert message in e.value.stderr.decode(), e.value.stderr.decode()[-2000:]


def test_probe_manifest_variant_verifies(builds, built_kernels, dense_fma_4b, dense_4b, tmp_path):
    """The TMA module given to chosen GEMV ops of a manifest: the lm_head GEMV of the 4B example's `--lm-head dense
    --gemv gemv-fma` form; by default every op on `gemv`. The example's lm_head is screened (not a GEMV): naming it is refused with
    the way to a dense manifest, and the default moves o, gate_up and down."""
    from kern_verify.verify import verify_text

    kernels = tmp_path / "kernels"
    shutil.copytree(built_kernels, kernels)
    path = probe.manifest_variant(dense_fma_4b, kernels, builds["tma"], "q64s2", probe.ring_bytes(64, 2), tmp_path,
                                  [probe.SHORT["lm_head"]])
    text = path.read_text()
    assert not [d for d in verify_text(text, kernels_dir=kernels) if d.severity == "error"]
    base, v = json.loads(dense_fma_4b.read_text()), json.loads(text)
    launch = v["ops"]["gemv_norm_lm_head"]["impl"]["launches"][0]
    assert launch["module"] == "gemv_tma_c64_s2" and launch["entry"] == "kern_gemv_norm_m1_u5_nb2"
    assert launch["shared_mem"] == 5120 + 8 * 2 * 2 * 64 * 16  # x (k = 2,560 bf16) + the ring
    assert v["modules"]["gemv_tma_c64_s2"] == {
        "source": "gemv_tma_c64_s2.cubin", "sha256": hashlib.sha256(builds["tma"].read_bytes()).hexdigest()}
    assert v["modules"]["gemv"] == base["modules"]["gemv"]  # o, gate_up and down still launch it
    assert {k: o for k, o in v["ops"].items() if k != "gemv_norm_lm_head"} == \
        {k: o for k, o in base["ops"].items() if k != "gemv_norm_lm_head"}
    assert v["programs"] == base["programs"]
    with pytest.raises(ValueError, match="op `gemv_norm_lm_head` does not launch module `gemv`"):  # already moved
        probe.manifest_variant(path, kernels, builds["tma"], "again", probe.ring_bytes(64, 2), tmp_path,
                               [probe.SHORT["lm_head"]])
    # 4B's qkv is on the row-pass module: named, it is refused; by default every op on `gemv` moves, qkv stays
    with pytest.raises(ValueError,
                       match=r"op `gemv_norm_qkv` does not launch module `gemv` \(gemv.cu.s default form\) first but "
                             r"`gemv_p2`; a TMA module replaces only that \(the TMA form has no row passes"):
        probe.manifest_variant(dense_fma_4b, kernels, builds["tma"], "qkv", probe.ring_bytes(64, 2), tmp_path,
                               [probe.SHORT["qkv"]])
    text = probe.manifest_variant(dense_fma_4b, kernels, builds["tma"], "all", probe.ring_bytes(64, 2), tmp_path).read_text()
    assert not [d for d in verify_text(text, kernels_dir=kernels) if d.severity == "error"]
    v = json.loads(text)
    assert {op: v["ops"][op]["impl"]["launches"][0]["module"] for op in probe.GEMV_OPS} == {
        op: "gemv_p2" if op == "gemv_norm_qkv" else "gemv_tma_c64_s2" for op in probe.GEMV_OPS}
    # the default manifests' GEMVs are gemv_tc.cu's (session 32): refused with the way to gemv.cu's form
    with pytest.raises(ValueError, match=r"op `gemv_residual_o_proj` does not launch module `gemv` \(gemv.cu.s default "
                                         r"form\) first but `gemv_tc`.* pass a manifest of `tools/gen_qwen3.py --gemv "
                                         r"gemv-fma`"):
        probe.manifest_variant(dense_4b, kernels, builds["tma"], "o", probe.ring_bytes(64, 2), tmp_path,
                               [probe.SHORT["o"]])
    # the example (screened lm_head): no lm_head GEMV to name; and every GEMV on gemv_tc.cu, so nothing on `gemv` to
    # move by default either
    with pytest.raises(ValueError, match=rf"{EXAMPLE}: no op `gemv_norm_lm_head`; this manifest has the screened "
                                         r"lm_head \(tools/gen_qwen3.py's default\).* for those, pass a manifest of "
                                         r"`tools/gen_qwen3.py --lm-head dense`"):
        probe.manifest_variant(EXAMPLE, kernels, builds["tma"], "lm", probe.ring_bytes(64, 2), tmp_path,
                               [probe.SHORT["lm_head"]])
    assert not (tmp_path / "manifest-tma-lm.json").exists()
    with pytest.raises(ValueError, match=r"no decode GEMV op launches module `gemv` \(gemv.cu.s default form\).*"
                                         r"`gen_qwen3.py --gemv gemv-fma`"):
        probe.manifest_variant(EXAMPLE, kernels, builds["tma"], "ex", probe.ring_bytes(64, 2), tmp_path)
    # by default, a manifest with no GEMV op on `gemv` any more is refused, not written unchanged
    with pytest.raises(ValueError, match=r"no decode GEMV op launches module `gemv` \(gemv.cu.s default form\)"):
        probe.manifest_variant(tmp_path / "manifest-tma-all.json", kernels, builds["tma"], "none",
                               probe.ring_bytes(64, 2), tmp_path)
    assert not (tmp_path / "manifest-tma-none.json").exists()


def test_probe_refuses_bad_specs(capsys):
    for spec, msg in (("a=b:1", "expected LABEL=CUBIN:C:S"), ("a=x.cubin:64:2:qkv+foo", "unknown op `foo`"),
                      ("=x.cubin:64:2", "an empty LABEL"), ("a=x.cubin:48:2", "a positive multiple of 32"),
                      ("a=/nonexistent.cubin:64:2", "no file /nonexistent.cubin")):
        with pytest.raises(SystemExit):
            probe.main(["--tma", spec, "--geometry", "none"])
        assert msg in capsys.readouterr().err, spec
