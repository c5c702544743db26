"""gemv.cu's row-pass build (-DGEMV_PASSES=P; NOTES.md 54) on the GPU, against the default build, bit for bit.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_gemv_passes_gpu.py -q

The build (P = 2 is tools/build_kernels.py's gemv_p2.cubin, 4B's qkv since session 18; tools/manifest_whatif.py
--op-module with --op-grid puts another op on it): the plain, residual and norm entries with each block owning P consecutive 16-row units (ksplit 1,
grid.x = ceil_div(n, 16·P)), the warp's stages one register pipeline over its P row pairs. Its outputs must equal the
default entries' (grid ceil_div(n, 16), ksplit 1) bit for bit: kern_gemv_norm_m1, kern_gemv_m1, kern_gemv_residual_m1
and their `_u5` twins, kern_gemv_norm_m1's batched-prologue forms `_nb2` and `_u5_nb2`, P = 2 and 3, over the 4B decode shapes (qkv, o, gate_up's k in down, the lm_head), n not a
multiple of 16·P (1,000; 24; 7; 33; 264), k of one or a few 16-byte loads per lane, and odd and even stage counts per
row pair (a pair's last stage in either register buffer). Fresh random inputs per case; the
output NaN-poisoned (the residual: the same random residual) between sentinel guards that must come back unchanged;
the default's output also within 2e-2 of a float32 reference, so that two equal wrong answers cannot pass.
The three modules are built here with nvcc (tools/build_kernels.py's flags); no kernels dir is needed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, DEV, bits, built_cubins, launch_gemv, module_functions  # noqa: E402

EPS = 1e-6
PASSES = (2, 3)
GUARD = 64  # elements of sentinel on each side of the output (128 bytes: y stays 16-byte aligned)
SENTINEL = 12352.0
ENTRIES = [f"kern_gemv{v}_m1{u}" for v in ("_norm", "", "_residual") for u in ("", "_u5")] + \
    ["kern_gemv_norm_m1_nb2", "kern_gemv_norm_m1_u5_nb2"]  # the batched norm prologue (4B's qkv since session 29)
#: The m > 1 entries of the same module (speculative verification's rows; unused by the generator today): a row of x
#: per m, each normalized on its own, y [M, n]
MULTI = [f"kern_gemv{v}_m{m}" for v in ("_norm", "", "_residual") for m in (2, 4, 8)]
MULTI_SHAPES = [(6144, 2560), (1000, 1024), (33, 8), (264, 2816)]
#: (n, k): the 4B qkv, o, down, lm_head and 0.6B-sized shapes; n not a multiple of 16·P; k of 1, 33 and 352 loads per
#: row (lane 0: 1, 2, 11 loads; stages per row pair S = 1, 1, 3 at U = 4 and 5; 2,560's S is 3 at U = 4, 2 at U = 5)
SHAPES = [(6144, 2560), (2560, 4096), (2560, 9728), (151936, 2560), (4096, 1024), (1000, 1024), (24, 2560),
          (7, 264), (33, 8), (264, 2816)]


@pytest.fixture(scope="module")
def fns():
    """{P: {entry: CUfunction}} of gemv.cu built with -DGEMV_PASSES=P (P = 1: the default build)."""
    from cuda.bindings import driver as cu
    from cubin_launch import check

    data = built_cubins({P: ("gemv.cu", () if P == 1 else (f"GEMV_PASSES={P}",), f"gemv_p{P}.cubin")
                         for P in (1, *PASSES)})
    assert len(set(data.values())) == len(data)  # three different modules
    return {P: module_functions(check(cu.cuModuleLoadData(cubin)), ENTRIES + MULTI) for P, cubin in data.items()}


def launch(f, grid: int, args: list, smem: int) -> None:
    launch_gemv(f, grid, args, smem)


def reference(entry: str, x, nw, w, res) -> torch.Tensor:
    """The entry's output in float32 from the bf16 operands (the norm rounded where the kernel rounds); x [k] or
    [M, k] (each row normalized on its own), the result [n] or [M, n]."""
    xf = x.float()
    if "_norm" in entry:
        xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(BF).float()
        xf = (nw.float() * xn).to(BF).float()
    y = xf @ w.float().t()
    return res.float() + y.to(BF).float() if "_residual" in entry else y


def check_against_default(fns, entry: str, n: int, k: int, m: int = 1) -> None:
    """`entry` of each PASSES module on m rows of x (each normalized on its own; y [m, n]) equal to the default
    module's bit for bit, and the default within 2e-2 of the float32 reference; the output NaN-poisoned (the residual:
    the same random residual) between sentinel guards that must come back unchanged."""
    x = torch.randn(m, k, device=DEV).to(BF)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    w = (torch.randn(n, k, device=DEV) * 0.02).to(BF)
    res = torch.randn(m, n, device=DEV).to(BF)
    size = m * n
    store0 = torch.full((size + 2 * GUARD,), SENTINEL, dtype=BF, device=DEV)
    store0[GUARD:GUARD + size] = res.reshape(-1) if "_residual" in entry else float("nan")
    smem = 2 * m * k if "_norm" in entry else 0

    def run(P: int) -> torch.Tensor:
        store = store0.clone()
        y = store[GUARD:GUARD + size]
        if "_residual" in entry or "_norm" not in entry:
            args = [x, w, y, n, k, 1]
        else:
            args = [x, nw, w, y, n, k, EPS, 1]
        launch(fns[P][entry], math.ceil(n / (16 * P)), args, smem)
        torch.cuda.synchronize()
        assert bool((store[:GUARD] == SENTINEL).all() and (store[GUARD + size:] == SENTINEL).all()), (entry, P)
        assert not torch.isnan(store.float()).any(), (entry, P, "NaN left in the output")
        return store[GUARD:GUARD + size].reshape(m, n)

    base = run(1)
    ref = reference(entry, x, nw, w, res)
    assert ((base.float() - ref).norm() / ref.norm()).item() < 2e-2, entry
    for P in PASSES:
        assert torch.equal(bits(run(P)), bits(base)), (entry, n, k, P)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("n", "k"), SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_passes_entry_is_the_default_bit_for_bit(fns, entry: str, n: int, k: int) -> None:
    check_against_default(fns, entry, n, k)


@pytest.mark.parametrize("entry", MULTI)
@pytest.mark.parametrize(("n", "k"), MULTI_SHAPES, ids=[f"{n}x{k}" for n, k in MULTI_SHAPES])
def test_passes_multi_row_entry_is_the_default_bit_for_bit(fns, entry: str, n: int, k: int) -> None:
    """The m = 2, 4, 8 entries of the row-pass module: y [M, n] equal to the default module's bit for bit."""
    check_against_default(fns, entry, n, k, int(entry.rsplit("_m", 1)[1]))
