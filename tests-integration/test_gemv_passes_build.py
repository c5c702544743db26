"""CPU checks of gemv.cu's row-pass build (-DGEMV_PASSES=P, P = 2..8: each block of the plain, residual and norm
entries owns P consecutive 16-row units, ksplit 1, grid.x = ceil_div(n, 16·P); NOTES.md 54; the GPU bit check is
gpu/test_gemv_passes_gpu.py): no GPU needed.

- gemv.cu's default cubin (P = 1) is unchanged by the build's code: the sha256 every example pins;
- the P = 2 and P = 3 modules have exactly the default module's entries with the same ELF parameter tables (offsets
  and sizes), every entry waits (griddepcontrol.wait), and every M = 1 entry fits two 256-thread blocks per SM: a
  manifest can load either for an op without touching its calls (tools/manifest_whatif.py --op-module, with --op-grid for the grid);
- in the P = 2 PTX, each entry of the pass form (every M) executes one griddepcontrol.wait, issues its first two
  weight stages (2 stages × 2 rows × U 16-byte loads per lane) before it, and writes no global memory before it;
- P = 0, P = 9, and P = 2 with the bulk-copy form (GEMV_TMA) do not compile, each with gemv.cu's message.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import SRC, bk, nvcc_builds  # noqa: E402  (this folder's helpers)
from ptx_entries import ptx_entries  # noqa: E402

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin

#: the entries the pass form replaces (the SiLU entries keep the default form), every M and unroll
PASS_ENTRY = re.compile(r"^kern_gemv(_norm|_residual)?_m\d(_u5)?(_nb2)?$")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """gemv.cu's default cubin, its P = 2 and P = 3 cubins and the P = 2 PTX: nvcc runs started together."""
    tmp = tmp_path_factory.mktemp("gemv_passes")
    return nvcc_builds(tmp, {
        "default": ("gemv.cu", (), "gemv.cubin"), "p2": ("gemv.cu", ("GEMV_PASSES=2",), "gemv_p2.cubin"),
        "p3": ("gemv.cu", ("GEMV_PASSES=3",), "gemv_p3.cubin"),
        "p2_ptx": ("gemv.cu", ("GEMV_PASSES=2",), "gemv_p2.ptx")}) | {"tmp": tmp}


def _table(info) -> list[tuple[int, int, int]]:
    return [(s.index, s.offset, s.size) for s in sorted(info.params, key=lambda s: s.index)]


def test_default_cubin_unchanged(builds, pinned_modules):
    assert hashlib.sha256(builds["default"].read_bytes()).hexdigest() == pinned_modules["gemv.cubin"]


@pytest.mark.parametrize("build", ["p2", "p3"])
def test_passes_module_has_the_default_abi(builds, build):
    base = read_cubin(builds["default"].read_bytes(), "gemv.cubin")
    passes = read_cubin(builds[build].read_bytes(), builds[build].name)
    assert passes.arch == base.arch
    assert set(passes.entries) == set(base.entries) and len(base.entries) == 24  # 20 + the four `_nb2` forms
    assert sum(bool(PASS_ENTRY.match(name)) for name in base.entries) == 17
    assert builds[build].read_bytes() != builds["default"].read_bytes()
    for name, info in base.entries.items():
        e = passes.entries[name]
        assert _table(e) == _table(info), name
        assert e.grid_dep_wait is True, name
        if "_m1" in name:  # the decode entries: two 256-thread blocks per SM (M = 8's default already has 134)
            assert e.registers is not None and e.registers <= 128, name


def test_passes_ptx_loads_before_the_wait_and_stores_after(builds):
    entries = ptx_entries(builds["p2_ptx"].read_text())
    passes = {n: lines for n, lines in entries.items() if PASS_ENTRY.match(n)}
    assert len(passes) == 17 and {"kern_gemv_norm_m1", "kern_gemv_norm_m1_nb2"} <= set(passes)
    for name, lines in passes.items():
        waits = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")]
        assert len(waits) == 1, name
        before = lines[:waits[0]]
        assert not [ln for ln in before if re.search(r"\bst\.global|\batom\.|\bred\.", ln)], name
        unroll = 5 if "_u5" in name else 4 if "_m1" in name else 2  # catalog.GEMV_UNROLL, GEMV_M1_UNROLLS
        assert sum("ld.global.nc.L1::no_allocate" in ln for ln in before) == 2 * 2 * unroll, name
        assert [ln for ln in lines[waits[0]:] if re.match(r"st\.global", ln)], name


@pytest.mark.parametrize("defines, message", [
    (("GEMV_PASSES=0",), "GEMV_PASSES: 1 (the default form) to 8"),
    (("GEMV_PASSES=9",), "GEMV_PASSES: 1 (the default form) to 8"),
    (("GEMV_PASSES=2", "GEMV_TMA"), "GEMV_PASSES: only with the register-pipeline form's default entries"),
])
def test_passes_refuses_bad_builds(builds, defines, message):
    """A pass count outside 1..8 (static_assert) and the pass form with the bulk-copy form (#error) do not compile,
    with gemv.cu's message."""
    cmd = [bk._nvcc(), *bk.NVCC_FLAGS, *(f"-D{d}" for d in defines), "-o", str(builds["tmp"] / "bad.cubin"),
           "gemv.cu"]
    with pytest.raises(subprocess.CalledProcessError) as e:
        subprocess.run(cmd, cwd=SRC, check=True, capture_output=True)
    assert message in e.value.stderr.decode(), e.value.stderr.decode()[-2000:]


def test_nb2_entries_batch_the_norm_prologue(builds):
    """The `_nb2` entries are the batched prologue, not aliases of the plain entries: after griddepcontrol.wait a plain
    norm entry loads x and norm_w through the loop (3 read-only vector loads: x for the sum, then norm_w and x again
    after the barrier), its `_nb2` form 4 more (NB = 2 vectors of x and of norm_w, held in registers through the
    barrier), the weight loads (L1::no_allocate) aside. Read from the row-pass build's PTX, which holds both."""
    entries = ptx_entries(builds["p2_ptx"].read_text())
    for plain in ("kern_gemv_norm_m1", "kern_gemv_norm_m1_u5", "kern_gemv_norm_silu_m1", "kern_gemv_norm_silu_m1_u5"):
        counts = []
        for name in (plain, plain + "_nb2"):
            lines = entries[name]
            wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
            counts.append(sum(ln.startswith("ld.global.nc.v4") and "no_allocate" not in ln for ln in lines[wait:]))
        assert counts == [3, 7], (plain, counts)
