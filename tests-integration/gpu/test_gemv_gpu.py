"""GPU numerical tests of the decode GEMV kernels (tools/kernels-src/gemv.cu) from the built index.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_gemv_gpu.py
Kernels: built into a temp dir by this test, or taken from $KERN_KERNELS_DIR.  Every launch
goes through the cubin with the index's ABI (tools/kernels-src/cubin_launch.py loads the
module); grid and dynamic shared memory come from the index too (`constexprs` COLS_PER_WARP
and WARPS, `shared_mem` + `shared_mem_per`), so the test checks what the manifest generator
relies on.

All four variants (plain, norm, norm_silu, residual), M in 1, 2, 4, 8, the GEMM shapes of the
Qwen3 0.6B and 4B decode plus odd ones (n not a multiple of a block's rows, k not a multiple of
a warp's 256 elements, k = 8), each ksplit in 1, 2, 4, 8.  Each check: fresh random inputs,
the output poisoned with NaN (the residual variant: random values it must add to), guard
elements on both sides of the output that must come back bit-identical (nothing outside the
M×n output is touched), ‖out − ref‖ / ‖ref‖ < 1e-2 against a float64 reference, no NaN.
The M = 1 `_u5` entries (five loads per row per pipeline stage instead of four) must give the
same bits as their U = 4 twins on every shape and ksplit (the summation order does not depend on U).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, DEV, kernels_dir  # noqa: E402
from cubin_launch import KernelSet, allow_dynamic_smem, check, shared_mem_of  # noqa: E402
from gemv_plan import gemv_blocks  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

EPS = 1e-6
TOL = 1e-2
MS = (1, 2, 4, 8)
KSPLITS = (1, 2, 4, 8)
#: Guard elements on each side of the output (128 bytes: keeps the output 16-byte aligned).
GUARD = 64
SENTINEL = 12352.0  # exactly representable in bf16

#: (n, k) per variant: n = output columns (norm_silu: the weight has 2n rows).
SHAPES = {
    "gemv": [(4096, 1024), (1024, 2048), (6144, 2560), (2560, 9728), (1001, 1000), (7, 264), (33, 8)],
    "gemv_norm": [(4096, 1024), (6144, 2560), (151936, 2560), (1001, 1000), (7, 264), (1000, 5120)],
    "gemv_norm_silu": [(3072, 1024), (9728, 2560), (1001, 1000), (7, 264), (1000, 5120)],
    "gemv_residual": [(1024, 2048), (1024, 3072), (2560, 4096), (2560, 9728), (1001, 1000), (7, 264), (33, 8)],
}
CASES = [(v, m, n, k) for v, shapes in SHAPES.items() for m in MS for n, k in shapes]


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels", ["0.6b"])  # $KERN_KERNELS_DIR taken unchecked


_CT = {"i32": ctypes.c_int32, "f32": ctypes.c_float}


def launch(ks: KernelSet, name: str, args: list, n: int, k: int, ksplit: int) -> None:
    """One launch of index kernel `name`, grid and dynamic shared memory from the index's rules."""
    e = ks.kernels[name]
    cx = e["constexprs"]
    smem = shared_mem_of(e, args)
    f = ks.function(name)
    allow_dynamic_smem(f, smem)
    holders = [ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else _CT[t](a)
               for a, t in zip(args, e["params"])]
    assert len(holders) == len(e["params"])
    for a in args:
        if isinstance(a, torch.Tensor):
            assert a.data_ptr() % 16 == 0, "gemv.cu needs 16-byte aligned pointers"
    ptrs = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    grid_x = gemv_blocks(n, cx["COLS_PER_WARP"], cx["WARPS"], ksplit)
    check(cu.cuLaunchKernel(f, grid_x, 1, 1, *e["block"], smem, stream, ctypes.addressof(ptrs), 0))


def guarded(m: int, n: int, fill: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, view): a [m, n] bf16 view with GUARD sentinel elements before and after it."""
    store = torch.full((m * n + 2 * GUARD,), SENTINEL, dtype=BF, device=DEV)
    view = store[GUARD:GUARD + m * n].view(m, n)
    if isinstance(fill, torch.Tensor):
        view.copy_(fill)
    else:
        view.fill_(fill)
    return store, view


def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """HF Qwen3RMSNorm in bf16: weight * (x.float() * rsqrt(mean(x²) + eps)).to(bf16)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(BF)


def relerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    assert not torch.isnan(out).any(), "NaN in the output (an element not written)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def operands(variant: str, m: int, n: int, k: int):
    """Fresh random (x, w, norm_w) for one case: x bf16 [m, k], w bf16 [n or 2n, k] ~ N(0, 0.05²),
    norm_w bf16 [k] ~ 1 + N(0, 0.1²)."""
    rows = 2 * n if variant == "gemv_norm_silu" else n
    x = torch.randn(m, k, device=DEV, dtype=BF)
    w = (torch.randn(rows, k, device=DEV) * 0.05).to(BF)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    return x, w, nw


def run(ks: KernelSet, name: str, variant: str, x, w, nw, n: int, k: int, ksplit: int, r0=None) -> torch.Tensor:
    """One launch of `name` on a guarded, poisoned output (the residual form: a copy of r0); returns
    the [m, n] output after checking that nothing outside it was written."""
    m = x.shape[0]
    if variant == "gemv_residual":
        store, y = guarded(m, n, r0)
        args = [x, w, y, n, k, ksplit]
    else:
        store, y = guarded(m, n, float("nan"))
        args = [x, w, y, n, k, ksplit] if variant == "gemv" else [x, nw, w, y, n, k, EPS, ksplit]
    launch(ks, name, args, n, k, ksplit)
    torch.cuda.synchronize()
    head, tail = store[:GUARD], store[GUARD + m * n:]
    assert bool((head == SENTINEL).all() and (tail == SENTINEL).all()), \
        f"ksplit {ksplit}: {name} wrote outside its [{m}, {n}] output"
    return y


@pytest.mark.parametrize(("variant", "m", "n", "k"), CASES, ids=[f"{v}-m{m}-{n}x{k}" for v, m, n, k in CASES])
def test_gemv(ks, variant: str, m: int, n: int, k: int) -> None:
    name = f"kern_{variant}_m{m}"
    x, w, nw = operands(variant, m, n, k)

    if variant == "gemv":
        ref = x.double() @ w.double().T
    elif variant == "gemv_residual":
        r0 = torch.randn(m, n, device=DEV, dtype=BF)
        ref = r0.double() + x.double() @ w.double().T
    else:
        gu = rmsnorm_ref(x, nw).double() @ w.double().T
        ref = torch.nn.functional.silu(gu[:, :n]) * gu[:, n:] if variant == "gemv_norm_silu" else gu

    errs = {ksplit: relerr(run(ks, name, variant, x, w, nw, n, k, ksplit, r0 if variant == "gemv_residual" else None),
                           ref) for ksplit in KSPLITS}
    assert max(errs.values()) < TOL, f"{name} n={n} k={k}: rel. error by ksplit {errs}"


#: M = 1 shapes of every variant for the `_u5` entries: the variants' own, plus k where a lane has
#: 9 or 10 loads per row (2304, 2560: the two stages of 5 hold them all) and 11 (2816: a third stage).
U5_CASES = [(v, n, k) for v, shapes in SHAPES.items() for n, k in shapes + [(1000, 2304), (264, 2816)]]


@pytest.mark.parametrize(("variant", "n", "k"), U5_CASES, ids=[f"{v}-{n}x{k}" for v, n, k in U5_CASES])
def test_gemv_u5_bitwise(ks, variant: str, n: int, k: int) -> None:
    """kern_*_m1_u5 == kern_*_m1 bit for bit, at every ksplit, on the same fresh inputs."""
    assert_twins_bitwise(ks, variant, f"kern_{variant}_m1", f"kern_{variant}_m1_u5", n, k)


def assert_twins_bitwise(ks, variant: str, base: str, twin: str, n: int, k: int) -> None:
    """Entry `twin` gives `base`'s output bit for bit at every ksplit, on the same fresh inputs (m = 1)."""
    x, w, nw = operands(variant, 1, n, k)
    r0 = torch.randn(1, n, device=DEV, dtype=BF) if variant == "gemv_residual" else None
    for ksplit in KSPLITS:
        y = run(ks, base, variant, x, w, nw, n, k, ksplit, r0)
        yt = run(ks, twin, variant, x, w, nw, n, k, ksplit, r0)
        assert not torch.isnan(yt).any(), f"{twin} ksplit {ksplit}: NaN (an output not written)"
        assert torch.equal(y, yt), (f"{twin} n={n} k={k} ksplit {ksplit}: differs from {base} "
                                    f"(max |diff| {(y.double() - yt.double()).abs().max().item():.3g})")


#: The norm variants' shapes for the batched-prologue entries (`_nb2`): k/8 in (256, 512] takes the batched path
#: (2,056: thread 0 alone holds two vectors; 2,560; 4,096: every thread two), other k the loop (1,024: one vector per
#: thread; 2,048: the edge; 4,104: three for thread 0; 9,728).
NB2_CASES = [(v, u, n, k) for v in ("gemv_norm", "gemv_norm_silu") for u in ("", "_u5")
             for n, k in ((1000, 2056), (2560, 2560), (264, 4096), (1000, 1024), (1000, 2048), (264, 4104), (64, 9728))]


@pytest.mark.parametrize(("variant", "u", "n", "k"), NB2_CASES, ids=[f"{v}{u}-{n}x{k}" for v, u, n, k in NB2_CASES])
def test_gemv_norm_nb2_bitwise(ks, variant: str, u: str, n: int, k: int) -> None:
    """kern_*_m1{,_u5}_nb2 == kern_*_m1{,_u5} bit for bit (the same sums in the same order), at every ksplit, on the
    same fresh inputs, inside and outside the batched path's k."""
    assert_twins_bitwise(ks, variant, f"kern_{variant}_m1{u}", f"kern_{variant}_m1{u}_nb2", n, k)


def test_ksplit_results_agree(ks) -> None:
    """Only the summation order changes with ksplit: results agree to a few bf16 ulps."""
    n, k = 2560, 9728
    x = torch.randn(1, k, device=DEV, dtype=BF)
    w = (torch.randn(n, k, device=DEV) * 0.05).to(BF)
    outs = []
    for ksplit in KSPLITS:
        y = torch.full((1, n), float("nan"), dtype=BF, device=DEV)
        launch(ks, "kern_gemv_m1", [x, w, y, n, k, ksplit], n, k, ksplit)
        outs.append(y.double())
    torch.cuda.synchronize()
    for ksplit, o in zip(KSPLITS[1:], outs[1:]):
        assert relerr(o, outs[0]) < 4e-3, f"ksplit {ksplit} vs 1"
