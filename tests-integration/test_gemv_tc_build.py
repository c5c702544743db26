"""CPU checks of gemv_tc.cu, the decode GEMVs on the tensor cores (the GPU numerics are gpu/test_gemv_tc_gpu.py): no
GPU needed.

- the module has gemv.cu's four variants for M = 1 (U = 4 and `_u5`), 2, 4 and 8 under `kern_gemvtc` names, each with
  its gemv.cu twin's ELF parameter table (offsets and sizes): a manifest swaps one for the other without touching its
  calls (tools/gen_qwen3.py does, for every decode GEMV by default); each waits (griddepcontrol.wait) and fits two
  256-thread blocks per SM (≤ 128 registers, no spills but possibly in the M = 1 `_u5` entries);
- in the PTX, each entry executes one griddepcontrol.wait, issues its first two pipeline stages of weight loads (2
  stages × U steps × 2 rows) before it, writes no global memory before it, and computes its dots by
  mma.sync.m16n8k16 bf16 → f32 (none before the wait; per stage U steps × 2 rows, twice over for M = 8);
- the index entries (catalog.py) carry TC_STEP (M = 1: 128, the runs layout, gemv_plan.GEMV_TC_STEP; M > 1: 32) and
  gemv.cu's COLS_PER_WARP and WARPS, so that gemv_plan.gemv_blocks gives ceil_div(n, 16) (norm_silu: ceil_div(n, 8))
  at ksplit 1;
- the runs layout's fragment mapping (gemv_tc.cu tc_tile_runs), simulated in numpy from the PTX ISA's m16n8k16
  fragment layout: the lanes it keeps sum each row's dot product, and the lanes it drops do not.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import ROOT, nvcc_builds  # noqa: E402  (this folder's helpers)
from ptx_entries import ptx_entries  # noqa: E402

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
sys.path.insert(0, str(ROOT / "tools"))
import catalog  # noqa: E402
from gemv_plan import GEMV_TC_STEP, gemv_blocks, gemv_entry_inputs as _inputs, gemv_tc_entry  # noqa: E402

VARIANTS = ("", "_norm", "_norm_silu", "_residual")
TWINS = [f"kern_gemv{v}_m1{u}" for v in VARIANTS for u in ("", "_u5")] + [
    f"kern_gemv{v}_m{m}" for m in (2, 4, 8) for v in VARIANTS]
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemv_tc")
    return nvcc_builds(tmp, {"gemv": ("gemv.cu", (), "gemv.cubin"), "tc": ("gemv_tc.cu", (), "gemv_tc.cubin"),
                             "tc_ptx": ("gemv_tc.cu", (), "gemv_tc.ptx")})


def _unroll(name: str) -> int:
    """gemv_tc.cu's mma steps per pipeline stage of an entry (catalog.GEMV_TC_UNROLL; `_u5`: 5)."""
    return 5 if name.endswith("_u5") else catalog.GEMV_TC_UNROLL[_inputs(name)]


def _table(info) -> list[tuple[int, int, int]]:
    return [(s.index, s.offset, s.size) for s in sorted(info.params, key=lambda s: s.index)]


def test_entries_have_their_gemv_twins_abi(builds):
    base = read_cubin(builds["gemv"].read_bytes(), "gemv.cubin")
    tc = read_cubin(builds["tc"].read_bytes(), "gemv_tc.cubin")
    assert sorted(tc.entries) == sorted(gemv_tc_entry(n) for n in TWINS)
    for twin in TWINS:
        e = tc.entries[gemv_tc_entry(twin)]
        assert _table(e) == _table(base.entries[twin]), twin
        assert e.grid_dep_wait is True, twin
        assert e.registers is not None and e.registers <= 128, (twin, e.registers)


def test_entries_do_not_spill(tmp_path):
    """ptxas -v on gemv_tc.cu: every entry but the M = 1 `_u5` ones (the generator launches `kern_gemvtc_residual_m1`)
    spills nothing at the 128-register cap of two blocks per SM; the `_u5` ones may (the plain and residual `_u5` spill
    8 bytes: they are there for experiments)."""
    import subprocess

    import build_kernels as bk

    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    r = subprocess.run([nvcc, *bk.NVCC_FLAGS, "-Xptxas", "-v", "-o", str(tmp_path / "t.cubin"), "gemv_tc.cu"],
                       capture_output=True, text=True, cwd=ROOT / "tools" / "kernels-src")
    assert r.returncode == 0, r.stderr
    # ptxas prints, per function, "Compiling entry function 'NAME'" then its spill line
    spills = dict(re.findall(r"Compiling entry function '(\w+)'.*?\n.*?(\d+) bytes spill stores", r.stderr, re.S))
    assert sorted(spills) == sorted(gemv_tc_entry(n) for n in TWINS), r.stderr
    assert all(spills[gemv_tc_entry(n)] == "0" for n in TWINS if not n.endswith("_u5")), spills


def test_ptx_loads_before_the_wait_and_mma_after(builds):
    entries = ptx_entries(builds["tc_ptx"].read_text())
    assert sorted(entries) == sorted(gemv_tc_entry(n) for n in TWINS)
    for name, lines in entries.items():
        waits = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")]
        assert len(waits) == 1, name
        before, after = lines[:waits[0]], lines[waits[0]:]
        unroll, groups = _unroll(name), 2 if _inputs(name) == 8 else 1  # M = 8: two mma per loaded row
        assert sum("ld.global.nc.L1::no_allocate" in ln for ln in before) == 2 * unroll * 2, name
        assert not [ln for ln in before if re.search(r"\bst\.global|\batom\.|\bred\.|\bmma\.", ln)], name
        # nothing an earlier launch writes (x, the residual) is read before the wait: its only loads are the params
        # and the weight stages
        assert not [ln for ln in before if re.search(r"\bld\.", ln)
                    and not re.search(r"\bld\.param\.|ld\.global\.nc\.L1::no_allocate", ln)], name
        # the loop body holds two stages' mma (each stage: U steps × two rows × groups); unrolled stages may repeat it
        mma = sum(ln.startswith(MMA) for ln in after)
        per_stage = 2 * unroll * groups
        assert mma >= 2 * per_stage and mma % per_stage == 0, (name, mma)
        assert [ln for ln in after if re.match(r"st\.global", ln)], name


def test_index_entries():
    kerns = {k.name: k for k in catalog._gemv_tc_kernels()}
    assert sorted(kerns) == sorted(gemv_tc_entry(n) for n in TWINS)
    base = {k.name: k for k in catalog._gemv_kernels()}
    for twin in TWINS:
        k, b = kerns[gemv_tc_entry(twin)], base[twin]
        assert (k.source, k.module, k.entry, k.block) == ("gemv_tc.cu", "gemv_tc.cubin", k.name, [256, 1, 1])
        assert k.params == b.params and k.shared_mem_per == b.shared_mem_per
        # the M = 1 norm entries' batched prologue (gemv.cu's `_nb2`'s); M > 1 the loop
        nb = {"NORM_NB": 2} if "_norm" in twin and _inputs(twin) == 1 else {}
        step = catalog.GEMV_TC_STEPS[_inputs(twin)]
        assert k.constexprs == {**b.constexprs, "UNROLL": _unroll(twin), "TC_STEP": step, **nb}
        cols, warps = k.constexprs["COLS_PER_WARP"], k.constexprs["WARPS"]
        assert gemv_blocks(2560, cols, warps, 1) == (2560 // 8 if "silu" in twin else 2560 // 16)
        assert "ksplit must be 1" in k.grid and f"k: multiple of {step}" in k.doc
    assert catalog.CUDA_FLAGS["gemv_tc.cu"] == ()
    assert GEMV_TC_STEP == catalog.GEMV_TC_STEPS[1]  # what the generator launches: the M = 1 entries


def _runs_warp_sums(w, x, keep):
    """One warp of gemv_tc.cu's runs layout over weight rows w[0..1] (the half-warps' rows) and x, k a multiple of
    128, simulated from the PTX ISA's mma.m16n8k16 .bf16 fragments (A: a0a1 = (g, 2t..), a2a3 = (g+8, 2t..), a4a5 =
    (g, 2t+8..), a6a7 = (g+8, 2t+8..); B: b0b1 = (2t.., col g), b2b3 = (2t+8.., col g); C: c0c1 = (g, 2t..), c2c3 =
    (g+8, 2t..)): each step, lane l loads the row's elements 128·j + 8·(l & 15) … + 7 (row l >> 4) and the lanes of
    B column g x's chunk g >> 1 (X.x, X.z for even g, X.y, X.w for odd g); each lane accumulates c0 + c3. Returns the
    two rows' sums over the lanes `keep(g, t)` picks."""
    import numpy as np

    acc = np.zeros(32)
    for j in range(x.size // 128):
        a, b = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            e = w[lane >> 4, 128 * j + 8 * (lane & 15):][:8]
            a[g, 2 * t:2 * t + 2], a[g + 8, 2 * t:2 * t + 2] = e[0:2], e[2:4]
            a[g, 2 * t + 8:2 * t + 10], a[g + 8, 2 * t + 8:2 * t + 10] = e[4:6], e[6:8]
            xv = x[128 * j + 32 * (g >> 1) + 8 * t:][:8]
            b[2 * t:2 * t + 2, g], b[2 * t + 8:2 * t + 10, g] = (xv[0:2], xv[4:6]) if g % 2 == 0 else (xv[2:4], xv[6:8])
        assert not (np.isnan(a).any() or np.isnan(b).any())  # every fragment element written once per step
        c = a @ b
        acc += [c[lane >> 2, 2 * (lane & 3)] + c[(lane >> 2) + 8, 2 * (lane & 3) + 1] for lane in range(32)]
    return [sum(acc[lane] for lane in range(16 * h, 16 * h + 16) if keep(lane >> 2, lane & 3)) for h in (0, 1)]


def test_runs_layout_mapping():
    """The lanes tc_tile_runs keeps (t == g & 3: lanes 0, 5, 10, 15 of each half-warp) hold exactly the half-warp row's
    dot product, chunk by chunk; a wrong pick (the first four lanes) does not."""
    import numpy as np

    rng = np.random.default_rng(7)
    w, x = rng.standard_normal((2, 384)), rng.standard_normal(384)
    assert np.allclose(_runs_warp_sums(w, x, lambda g, t: t == (g & 3)), w @ x)
    assert not np.allclose(_runs_warp_sums(w, x, lambda g, t: g % 4 == 0), w @ x)
