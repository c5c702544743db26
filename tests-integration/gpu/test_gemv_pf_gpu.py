"""The L2-prefetch forms of the decode GEMVs (build_kernels.py --l2-prefetch, `kern_gemv*_m1_pf`) on the GPU.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_gemv_pf_gpu.py -q

1. Twins: each `NAME_pf` equals its plain twin `NAME` bit for bit on fresh random inputs, the output
   poisoned identically (NaN; the residual variant: the same random residual) with guard elements on
   both sides that must come back unchanged, over decode and odd shapes, every ksplit, and prefetch
   ranges: none (pf_ptr NULL, pf_bytes 0); a real 32 MB buffer, whole; a size that is not a multiple
   of 16 (nor of 16·grid: unequal shares, the tail dropped); fewer 16-byte units than blocks; the
   kernel's own weight. Small-n shapes (one block) prefetch 32 MB from one block (many chunks).
2. Chain: three 0.6B layers' GEMVs plus a head, the `_pf` forms launched as a PDL chain
   (programmatic stream serialization), each prefetching the whole next weight, eager and in a CUDA
   graph, equal bit for bit to the plain forms launched without PDL.

Kernels: $KERN_KERNELS_DIR if its index has the `_pf` entries, else built here (0.6b, --l2-prefetch).
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, DEV, bits, kernels_dir  # noqa: E402
from cubin_launch import allow_dynamic_smem, launch_function, shared_mem_of  # noqa: E402
from gemv_plan import gemv_blocks  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

EPS = 1e-6
KSPLITS = (1, 2, 4, 8)
GUARD = 64
SENTINEL = 12352.0
MB = 1 << 20
PF_BUF = 32 * MB
VARIANTS = ("gemv", "gemv_norm", "gemv_norm_silu", "gemv_residual")

#: (n, k) per variant: n = output columns (norm_silu: the weight has 2n rows).
SHAPES = {
    "gemv": [(4096, 1024), (6144, 2560), (1001, 1000), (7, 264), (33, 8)],
    "gemv_norm": [(4096, 1024), (6144, 2560), (151936, 2560), (1001, 1000), (7, 264)],
    "gemv_norm_silu": [(3072, 1024), (9728, 2560), (1001, 1000), (7, 264)],
    "gemv_residual": [(1024, 2048), (2560, 4096), (2560, 9728), (1001, 1000), (7, 264), (33, 8)],
}
CASES = [(v, n, k) for v, shapes in SHAPES.items() for n, k in shapes]

_CT = {"i32": ctypes.c_int, "f32": ctypes.c_float, "u64": ctypes.c_uint64}
_PTR = re.compile(r"^(in|out|inout) (buffer<\w+>|ptr)$")


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels-pf", ["0.6b"], ["kern_gemv_m1_pf"], l2_prefetch=True)


@pytest.fixture(scope="session")
def pf_buf():
    return torch.randint(0, 255, (PF_BUF,), dtype=torch.uint8, device=DEV)


def grid_of(ks, name: str, n: int, ksplit: int) -> int:
    cx = ks.kernels[name]["constexprs"]
    return gemv_blocks(n, cx["COLS_PER_WARP"], cx["WARPS"], ksplit)


def launch(ks, name: str, args: list, n: int, ksplit: int, pdl: bool = False) -> None:
    """One launch of index kernel `name` (grid and dynamic shared memory from the index's rules) on
    torch's current stream; `pdl`: with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION."""
    e = ks.kernels[name]
    assert len(args) == len(e["params"]), (name, e["param_names"])
    smem = shared_mem_of(e, args)
    f = ks.function(name)
    allow_dynamic_smem(f, smem)
    vals, types = [], []
    for a, t in zip(args, e["params"]):
        if _PTR.match(t):
            p = a if isinstance(a, int) else a.data_ptr()
            assert p % 16 == 0, f"{name}: gemv.cu needs 16-byte aligned pointers"
            vals.append(p)
            types.append(ctypes.c_void_p)
        else:
            vals.append(a)
            types.append(_CT[t])
    kp = (tuple(vals), tuple(types))
    grid = grid_of(ks, name, n, ksplit)
    launch_function(f, (grid, 1, 1), tuple(e["block"]), smem, cu.CUstream(torch.cuda.current_stream().cuda_stream),
                    kp, pdl)


def test_pf_entries_are_twins(ks):
    for v in VARIANTS:
        t, e = ks.kernels[f"kern_{v}_m1"], ks.kernels[f"kern_{v}_m1_pf"]
        assert e["params"] == t["params"] + ["in buffer<bf16>", "u64"], v
        assert e["param_names"] == t["param_names"] + ["pf_ptr", "pf_bytes"], v
        for f in ("block", "shared_mem", "shared_mem_per", "constexprs"):
            assert e[f] == t[f], (v, f)


@pytest.mark.parametrize(("variant", "n", "k"), CASES, ids=[f"{v}-{n}x{k}" for v, n, k in CASES])
def test_pf_twin(ks, pf_buf, variant: str, n: int, k: int) -> None:
    name = f"kern_{variant}_m1"
    rows = 2 * n if variant == "gemv_norm_silu" else n
    x = torch.randn(1, k, device=DEV, dtype=BF)
    w = (torch.randn(rows, k, device=DEV) * 0.05).to(BF)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    store0 = torch.full((n + 2 * GUARD,), SENTINEL, dtype=BF, device=DEV)
    store0[GUARD:GUARD + n] = torch.randn(n, device=DEV).to(BF) if variant == "gemv_residual" else float("nan")

    def run(kname, extra, ksplit):
        store = store0.clone()
        y = store[GUARD:GUARD + n].view(1, n)
        if variant in ("gemv", "gemv_residual"):
            args = [x, w, y, n, k, ksplit]
        else:
            args = [x, nw, w, y, n, k, EPS, ksplit]
        launch(ks, kname, args + extra, n, ksplit)
        torch.cuda.synchronize()
        return store

    for ksplit in KSPLITS:
        ref = run(name, [], ksplit)
        assert bool((ref[:GUARD] == SENTINEL).all() and (ref[GUARD + n:] == SENTINEL).all()), (name, ksplit)
        assert not torch.isnan(ref[GUARD:GUARD + n].float()).any(), (name, ksplit)
        g = grid_of(ks, name, n, ksplit)
        ranges = {
            "none": [0, 0],
            "32 MB": [pf_buf, PF_BUF],
            "odd size": [pf_buf, PF_BUF - 16 * g - 5],
            "fewer units than blocks": [pf_buf, 16 * (g // 2) + 8],
            "own weight": [w, w.numel() * 2],
        }
        for label, extra in ranges.items():
            out = run(name + "_pf", extra, ksplit)
            assert torch.equal(bits(out), bits(ref)), f"{name}_pf (ksplit {ksplit}, prefetch {label}) differs from {name}"


def test_pf_pdl_chain_equals_plain(ks):
    """Three 0.6B layers (qkv + norm, o + residual, gate_up + norm + SiLU, down + residual) and a head: the
    `_pf` forms as a PDL chain, each prefetching all of the next weight, eager and replayed from a CUDA graph,
    give the plain forms' results bit for bit (launched one after the other without PDL)."""
    h, nq, nkv, d, inter, layers, head = 1024, 16, 8, 128, 3072, 3, 32000
    nqkv = (nq + 2 * nkv) * d
    ws = [{"qkv": (torch.randn(nqkv, h, device=DEV) * 0.05).to(BF),
           "o": (torch.randn(h, nq * d, device=DEV) * 0.05).to(BF),
           "gate_up": (torch.randn(2 * inter, h, device=DEV) * 0.05).to(BF),
           "down": (torch.randn(h, inter, device=DEV) * 0.05).to(BF)} for _ in range(layers)]
    lm = (torch.randn(head, h, device=DEV) * 0.05).to(BF)
    nw = (1 + 0.1 * torch.randn(h, device=DEV)).to(BF)
    resid0 = torch.randn(1, h, device=DEV).to(BF)
    attn = torch.randn(1, nq * d, device=DEV).to(BF)
    resid = resid0.clone()
    qkv = torch.empty(1, nqkv, device=DEV, dtype=BF)
    act = torch.empty(1, inter, device=DEV, dtype=BF)
    logits = torch.empty(1, head, device=DEV, dtype=BF)
    steps = []  # (kernel, args, n, weight)
    for lw in ws:
        steps += [("kern_gemv_norm_m1", [resid, nw, lw["qkv"], qkv, nqkv, h, EPS, 1], nqkv, lw["qkv"]),
                  ("kern_gemv_residual_m1", [attn, lw["o"], resid, h, nq * d, 1], h, lw["o"]),
                  ("kern_gemv_norm_silu_m1", [resid, nw, lw["gate_up"], act, inter, h, EPS, 1], inter, lw["gate_up"]),
                  ("kern_gemv_residual_m1", [act, lw["down"], resid, h, inter, 1], h, lw["down"])]
    steps.append(("kern_gemv_norm_m1", [resid, nw, lm, logits, head, h, EPS, 1], head, lm))

    def plain():
        for name, args, n, _ in steps:
            launch(ks, name, args, n, 1)

    def pf():
        for i, (name, args, n, _) in enumerate(steps):
            nxt = steps[i + 1][3] if i + 1 < len(steps) else None
            extra = [nxt, nxt.numel() * 2] if nxt is not None else [0, 0]
            launch(ks, name + "_pf", args + extra, n, 1, pdl=i > 0)

    def run(fn):
        resid.copy_(resid0)
        for t in (qkv, act, logits):
            t.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        return [t.clone() for t in (resid, qkv, act, logits)]

    ref = run(plain)
    assert not any(torch.isnan(t.float()).any() for t in ref)
    for _ in range(3):
        out = run(pf)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(out, ref)), "eager PDL _pf chain differs"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        pf()
    torch.cuda.synchronize()
    for _ in range(3):
        out = run(graph.replay)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(out, ref)), "graph-replayed PDL _pf chain differs"
