"""The persistent decode GEMVs without a GPU: tools/gemv_plan.py's launch plans, and
tools/kernels-src/gemv_persist.cu as nvcc builds it (reproducible, its four entries' ABI in the
cubin's own ELF parameter tables, registers low enough for two blocks per SM).

The kernels' numerics and speed are checked on the H200 by tools/bench_gemv.py (BENCHMARKS.md).
"""

from __future__ import annotations

import hashlib
import math
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from gemv_plan import BLOCK_SMEM, CHUNK, MAX_SLOTS, SMS, WARPS, plan_gemvp  # noqa: E402

# (name, n output columns, k, silu) of one decode token, Qwen3 0.6B / 4B / 8B / 14B (HF configs)
SHAPES = [
    ("0.6b qkv", 4096, 1024, False), ("0.6b o", 1024, 2048, False), ("0.6b gate_up", 3072, 1024, True),
    ("0.6b down", 1024, 3072, False), ("0.6b lm_head", 151936, 1024, False),
    ("4b qkv", 6144, 2560, False), ("4b o", 2560, 4096, False), ("4b gate_up", 9728, 2560, True),
    ("4b down", 2560, 9728, False), ("4b lm_head", 151936, 2560, False),
    ("8b gate_up", 12288, 4096, True), ("8b down", 4096, 12288, False),
    ("14b gate_up", 17408, 5120, True), ("14b down", 5120, 17408, False),
]


@pytest.mark.parametrize("name,n,k,silu", SHAPES, ids=[s[0] for s in SHAPES])
def test_plan_fits_the_kernels_rules(name, n, k, silu):
    p = plan_gemvp(n, k, silu)
    assert p is not None, name
    slot = p.piece_chunks * CHUNK * 2
    # what gemv_persist.cu derives from the launch: slots = min(64, (smem - 2k) / slot), fifo = slots / 8
    kernel_slots = min(MAX_SLOTS, (p.smem - 2 * k) // slot)
    assert kernel_slots == p.slots and p.slots % WARPS == 0 and p.slots // WARPS >= 2, p
    assert p.smem <= BLOCK_SMEM and p.smem == 2 * k + p.slots * slot, p
    assert p.grid == min(SMS, n)
    # pieces of a row: equal but the last, each at most the target of 8 chunks unless a row needs more
    cpr = k // CHUNK
    pieces = math.ceil(cpr / p.piece_chunks)
    assert (pieces - 1) * p.piece_chunks < cpr <= pieces * p.piece_chunks
    assert p.piece_chunks <= 8


def test_plan_falls_back_where_the_form_does_not_apply():
    assert plan_gemvp(5120, 25600) is None  # Qwen3-32B down: one 51 KB row of x leaves < 2 slots per warp
    assert plan_gemvp(1024, 1000) is None  # k not a multiple of 256
    assert plan_gemvp(64, 256) is not None


@pytest.mark.parametrize("n,k", [(0, 1024), (1024, 0), (1024, 12), (-1, 1024)])
def test_plan_rejects_bad_shapes(n, k):
    with pytest.raises(ValueError, match=f"n = {n}, k = {k}"):
        plan_gemvp(n, k)


# ------------------------------------------------------------------ the cubin

ENTRIES = {  # entry -> params (sizes in bytes, in order): pointers 8, ints and floats 4
    "kern_gemvp_m1": (8, 8, 8, 4, 4, 4),
    "kern_gemvp_residual_m1": (8, 8, 8, 4, 4, 4),
    "kern_gemvp_norm_m1": (8, 8, 8, 8, 4, 4, 4, 4),
    "kern_gemvp_norm_silu_m1": (8, 8, 8, 8, 4, 4, 4, 4),
}


@pytest.fixture(scope="module")
def cubins():
    build_kernels = pytest.importorskip("build_kernels")
    try:
        build_kernels._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, pytest.MonkeyPatch.context() as mp:
        mp.delenv("KERN_BUILD_CACHE", raising=False)  # two real compiles: test_cubin_reproducible compares them
        return build_kernels.compile_cuda("gemv_persist.cu", a), build_kernels.compile_cuda("gemv_persist.cu", b)


def test_cubin_reproducible(cubins):
    a, b = cubins
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()


def test_entries_abi(cubins):
    read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin
    cub = read_cubin(cubins[0], "gemv_persist.cubin")
    assert cub.arch == 90
    assert set(ENTRIES) <= set(cub.entries), list(cub.entries)
    for entry, sizes in ENTRIES.items():
        slots = sorted(cub.entries[entry].params, key=lambda s: s.index)
        off, want = 0, []
        for size in sizes:
            off = (off + size - 1) // size * size
            want.append((off, size))
            off += size
        assert [(s.offset, s.size) for s in slots] == want, entry
        info = cub.entries[entry]
        if info.max_threads is not None:  # __launch_bounds__(256, 1)
            assert info.max_threads[0] * info.max_threads[1] * info.max_threads[2] >= 256


def test_timeline_build_is_separate(cubins):
    """-DGEMVP_TIMELINE (tools/gpu/gemvp_timeline.py) exports the unmangled `gemvp_timeline` global the
    script reads with cuModuleGetGlobal; the default build holds no trace of it."""
    import build_kernels

    assert b"gemvp_timeline" not in cubins[0]
    with tempfile.TemporaryDirectory() as t:
        tl = build_kernels.finish_cuda(build_kernels.start_cuda("gemv_persist.cu", t, ("GEMVP_TIMELINE",), "tl.cubin"))
    assert b"gemvp_timeline\x00" in tl
