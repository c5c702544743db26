"""gemv_tc.cu, the decode GEMVs on the tensor cores (NOTES.md 72, 74), on the GPU: against float64 and beside gemv.cu.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_gemv_tc_gpu.py -q

Every entry (kern_gemvtc_m{M}, _norm, _norm_silu, _residual for M = 1, 2, 4, 8; M = 1 with U = 4 and `_u5`) at grid
ceil_div(n, 16) (norm_silu: ceil_div(n, 8) output columns), ksplit 1, over the 4B and 0.6B decode shapes, n not a
multiple of 16 (1,000; 24; 7; 33), and small k of whole steps (M = 1, the runs layout: 1, 2 and 9 steps of 128
elements, so that a block's second k half has no step or one step fewer; M > 1, the tile layout: 1, 2 and 9 steps of
32, so that some of a block's 8 warps have none) and a last partial pipeline stage. Fresh random inputs per case (M
different x rows, each normalized on its own by the norm variants); the [M, n] output NaN-poisoned (the residual: a
random residual) between sentinel guards that must come back unchanged; each of the M output rows within 1e-2
(relative, 2-norm) of float64 on the same bf16 operands (the norm rounded where HF rounds), within 5e-3 of gemv.cu's
entry for the same M on the same inputs (another summation order: not bitwise), the same bits on a second run
(deterministic), and, for M > 1, each output row the same bits as every row of the same entry run with that input row
in all M rows (the inputs share B's columns, never a sum, and a column pair computes what any other would).
gemv_tc.cu and gemv.cu are built here with nvcc (tools/build_kernels.py's flags); no kernels dir is needed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed: conftest.py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, DEV, bits, built_modules, launch_gemv, module_functions  # noqa: E402
from gemv_plan import gemv_entry_inputs as inputs  # noqa: E402

EPS = 1e-6
GUARD = 64  # elements of sentinel on each side of the output (128 bytes: y stays 16-byte aligned)
SENTINEL = 12352.0
VARIANTS = ("", "_norm", "_norm_silu", "_residual")
ENTRIES = [f"kern_gemvtc{v}_m1{u}" for v in VARIANTS for u in ("", "_u5")] + [
    f"kern_gemvtc{v}_m{m}" for m in (2, 4, 8) for v in VARIANTS]
#: (n, k): 4B qkv, o, gate_up (as n output columns of 2n rows for norm_silu), down, lm_head; 0.6B qkv, o, down; n not
#: a multiple of 16; k of 1, 2 and 9 steps of each layout (M = 1: 128 elements, the runs layout; M > 1: 32) and 24
SHAPES = [(6144, 2560), (2560, 4096), (9728, 2560), (2560, 9728), (151936, 2560), (4096, 1024), (1024, 2048),
          (1024, 3072), (1000, 1024), (24, 2560), (7, 32), (33, 64), (264, 288), (7, 128), (33, 256), (264, 1152),
          (40, 3072)]
#: gemv_tc.cu's elements of k per step for M inputs (catalog.py GEMV_TC_STEPS): k must be a multiple (else it traps)
STEP = {1: 128, 2: 32, 4: 32, 8: 32}
CASES = [(e, n, k) for e in ENTRIES for n, k in SHAPES if k % STEP[inputs(e)] == 0]


@pytest.fixture(scope="module")
def fns():
    """{"tc" | "gemv": {entry: CUfunction}}: gemv_tc.cu's entries and their gemv.cu twins."""
    mods = built_modules({"tc": ("gemv_tc.cu", (), "gemv_tc.cubin"), "gemv": ("gemv.cu", (), "gemv.cubin")})
    return {"tc": module_functions(mods["tc"], ENTRIES),
            "gemv": dict(zip(ENTRIES, module_functions(mods["gemv"], [twin(e) for e in ENTRIES]).values()))}


def twin(entry: str) -> str:
    return "kern_gemv" + entry[len("kern_gemvtc"):]


def launch(f, grid: int, args: list, smem: int) -> None:
    launch_gemv(f, grid, args, smem)


def reference(entry: str, x, nw, w, res, n: int) -> torch.Tensor:
    """The entry's output in float64 from the bf16 operands (x: [M, k]), each row's norm and the SiLU variant's gate
    and up rounded where the kernels (and HF) round; [M, n]."""
    xd = x.double()
    if "_norm" in entry:
        xn = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)).to(BF)
        xd = (nw.float() * xn.float()).to(BF).double()
    y = xd @ w.double().T
    if "_silu" in entry:
        g, u = y[:, :n].to(BF).double(), y[:, n:].to(BF).double()
        return (g * torch.sigmoid(g)).to(BF).double() * u
    return res.double() + y.to(BF).double() if "_residual" in entry else y


@pytest.mark.parametrize(("entry", "n", "k"), CASES, ids=[f"{e}-{n}x{k}" for e, n, k in CASES])
def test_tc_entry(fns, entry: str, n: int, k: int) -> None:
    silu, m = "_silu" in entry, inputs(entry)
    rows, size = 2 * n if silu else n, m * n
    x = torch.randn(m, k, device=DEV).to(BF)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    w = (torch.randn(rows, k, device=DEV) * 0.02).to(BF)
    res = torch.randn(m, n, device=DEV).to(BF)
    store0 = torch.full((size + 2 * GUARD,), SENTINEL, dtype=BF, device=DEV)
    store0[GUARD:GUARD + size] = res.flatten() if "_residual" in entry else float("nan")
    grid = math.ceil(n / (8 if silu else 16))

    def run(form: str, entry: str = entry, x=x, store0=store0, m: int = m) -> torch.Tensor:
        size = m * n
        smem = 2 * m * k if "_norm" in entry else 0
        store = store0.clone()
        y = store[GUARD:GUARD + size]
        args = [x, nw, w, y, n, k, EPS, 1] if "_norm" in entry else [x, w, y, n, k, 1]
        launch(fns[form][entry], grid, args, smem)
        torch.cuda.synchronize()
        assert bool((store[:GUARD] == SENTINEL).all() and (store[GUARD + size:] == SENTINEL).all()), (entry, form)
        assert not torch.isnan(store.float()).any(), (entry, form, "NaN left in the output")
        return store[GUARD:GUARD + size].view(m, n)

    out, again, fma = run("tc"), run("tc"), run("gemv")
    ref = reference(entry, x, nw, w, res, n)
    for i in range(m):  # every input row on its own: one row's error must not hide in another's norm
        assert ((out[i].double() - ref[i]).norm() / ref[i].norm()).item() < 1e-2, (entry, i)
        assert ((out[i].double() - fma[i].double()).norm() / ref[i].norm()).item() < 5e-3, (entry, i)
    assert torch.equal(bits(out), bits(again)), (entry, "not deterministic")
    for i in range(m if m > 1 else 0):  # input row i in every row: each output row must be out[i]'s bits
        same0 = torch.full((size + 2 * GUARD,), SENTINEL, dtype=BF, device=DEV)
        same0[GUARD:GUARD + size] = res[i].repeat(m) if "_residual" in entry else float("nan")
        same = run("tc", entry, x[i:i + 1].expand(m, k).contiguous(), same0)
        for j in range(m):
            assert torch.equal(bits(out[i]), bits(same[j])), (entry, i, j, "row j differs from row i's own result")
