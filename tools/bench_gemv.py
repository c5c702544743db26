"""Decode GEMV kernels (tools/kernels-src/gemv.cu, gemv_tc.cu) against cuBLAS and the bandwidth floor.

Runs on the GPU machine (torch for allocation, references and the cuBLAS peer;
cuda.bindings for module load and launches):

    python3 tools/bench_gemv.py [--geometries 0.6b 4b] [--out BENCHMARKS.md] [--kernels DIR]

The kernels are the modules the manifests pin: `gemv.cubin` (`--gemv gemv-fma` manifests) and `gemv_tc.cubin` (the
default's tensor-core entries, every decode GEMV since session 32) from a kernels dir built by tools/build_kernels.py
(`--kernels DIR`, its index's sha256 checked), or, by default, gemv.cu compiled here exactly as tools/build_kernels.py
compiles it (same nvcc flags; no tensor-core rows then).

For every GEMM shape of one decode token of each geometry (qkv, o, gate_up, down,
lm_head; m = 1) it

1. checks each kernel variant against a float64 reference on fresh random inputs,
   output poisoned before the run (‖out − ref‖ / ‖ref‖ must stay under 1e-2, NaN fails);
2. times it standalone (median of CUDA-event timings, rotating over enough weight
   copies that every run streams from HBM, not L2) — gemv.cu at its best ksplit, gemv_tc.cu's
   entry, the persistent form — beside torch.matmul (cuBLAS);
3. replays the whole GEMM sequence of one decode token (all layers, fused variants as
   the decode program uses them, lm_head) in a CUDA graph — as the manifests launch them (gemv_tc.cu
   where gemv_plan.gemv_tensor_core says so), gemv.cu without and with programmatic dependent
   launch (`--gemv gemv-fma`), the persistent
   forms (gemv_persist.cu) — beside the same sequence through cuBLAS, and reports time, GB/s
   and % of the floor: weight bytes / measured device-to-device copy bandwidth (bytes read
   + written).

Prints a table and appends it to BENCHMARKS.md (date, commit, machine).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import hashlib
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

try:
    import torch
except ImportError:  # the GPU machine's; without it only --help works (main() refuses to run)
    torch = None
from cuda.bindings import driver as cu

ROOT = Path(__file__).resolve().parent.parent
from benchinfo import commit  # noqa: E402  (tools/ is the script's own directory)
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
from cubin_launch import allow_dynamic_smem, launch_function  # noqa: E402
from gemv_plan import (GEMV_TC_PREFIX, GEMV_TC_STEP, GEMV_UNROLL_SUFFIX, PIECE_CHUNKS, THREADS as GEMVP_THREADS,  # noqa: E402
                       gemv_entry_unroll, gemv_norm_entry_name, gemv_tc_entry, gemv_tc_unroll, gemv_tensor_core,
                       plan_gemvp)
from gen_qwen3 import GEMV_OPS, GEMV_OPS_BEFORE_ATTENTION  # noqa: E402

GEOMETRIES = {
    # hidden, heads, kv_heads, head_dim, intermediate, layers, vocab (HF config values)
    "0.6b": (1024, 16, 8, 128, 3072, 28, 151936),
    "4b": (2560, 32, 8, 128, 9728, 36, 151936),
}
EPS = 1e-6


def check(res):
    """Raise on a CUDA driver error; return the call's value(s) (cuda.bindings returns
    `(CUresult, *values)`)."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        _, name = cu.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {name.decode() if isinstance(name, bytes) else name}")
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


def threads_of(name: str) -> int:
    """Block size of a GEMV entry: gemv_plan.THREADS for gemv_persist.cu, 256 for gemv.cu."""
    return GEMVP_THREADS if name.startswith("kern_gemvp") else 256


class Gemv:
    """CUDA modules (gemv.cu, then gemv_persist.cu when given; gemv_tc.cu as `tc`), loaded once; `launch(name, grid,
    smem, args, pdl)` enqueues on torch's stream, with pdl=True through cuLaunchKernelEx with
    the programmatic-stream-serialization attribute (CUDA driver API, sm_90). Entries named `kern_gemvp*` come from
    the second module, `kern_gemvtc*` from `tc`, the others from the first."""

    def __init__(self, *cubins: bytes, tc: bytes | None = None):
        check(cu.cuInit(0))
        torch.zeros(1, device="cuda")  # makes torch's primary context current
        self.modules = [check(cu.cuModuleLoadData(c)) for c in cubins]
        self.tc = check(cu.cuModuleLoadData(tc)) if tc is not None else None
        self.fns: dict[str, object] = {}

    def fn(self, name: str, smem: int):
        f = self.fns.get(name)
        if f is None:
            if name.startswith(GEMV_TC_PREFIX) and self.tc is None:
                raise RuntimeError(f"{name}: no gemv_tc.cu module was given (Gemv(..., tc=cubin))")
            module = self.tc if name.startswith(GEMV_TC_PREFIX) else \
                self.modules[1] if name.startswith("kern_gemvp") else self.modules[0]
            f = check(cu.cuModuleGetFunction(module, name.encode()))
            self.fns[name] = f
        allow_dynamic_smem(f, smem)
        return f

    def launch(self, name: str, grid: int, smem: int, args: list[tuple[int, type]], pdl: bool = False):
        f = self.fn(name, smem)
        stream = torch.cuda.current_stream().cuda_stream
        kp = (tuple(a for a, _ in args), tuple(t for _, t in args))
        launch_function(f, (grid, 1, 1), (threads_of(name), 1, 1), smem, cu.CUstream(stream), kp, pdl)


P = ctypes.c_void_p
I32 = ctypes.c_int
F32 = ctypes.c_float


def cdiv(a, b):
    return -(-a // b)


def rows_per_block(ksplit):
    """Rows a 256-thread block covers: 8 warps of 2 rows, ksplit warps per row pair."""
    return 2 * 8 // ksplit


# gemv.cu's m = 1 entries (pdl: launched with programmatic stream serialization; tools/bench_pdl.py too);
# each launches the entry a decode manifest uses at its (k, ksplit) (`gemv_entry`), or the one with `unroll`
# loads per row per stage (4 or 5) where given
#: The decode program's op of each shape (tools/gen_qwen3.py), and whether its next launch is the decode attention
#: (gen_qwen3.GEMV_OPS_BEFORE_ATTENTION: the entry rule the manifests follow).
SHAPE_OPS = {"qkv": "gemv_norm_qkv", "o": "gemv_residual_o_proj", "gate_up": "gemv_norm_silu_gate_up",
             "down": "gemv_residual_down_proj", "lm_head": "gemv_norm_lm_head"}
assert set(SHAPE_OPS.values()) == set(GEMV_OPS), "bench_gemv's shapes are the generator's decode GEMV ops"
BEFORE_ATTENTION = {shape: op in GEMV_OPS_BEFORE_ATTENTION for shape, op in SHAPE_OPS.items()}


def gemv_entry(base, k, ks, unroll=None, before_attention=False):
    """gemv.cu's m = 1 entry for variant `base` (e.g. "kern_gemv_norm_m1") over k at ksplit ks: its `_u5`
    twin where tools/gemv_plan.py's gemv_entry_unroll picks 5 loads per row per stage for a launch followed
    by the decode attention or not (`before_attention`), as tools/gen_qwen3.py does, unless `unroll` forces 4
    or 5; for the norm variants, then its batched-prologue form (`_nb2`) where gemv_norm_batched picks it."""
    name = base + GEMV_UNROLL_SUFFIX[gemv_entry_unroll(k, ks, before_attention) if unroll is None else unroll]
    return gemv_norm_entry_name(name, k) if "_norm" in base else name


def run_plain(g, x, w, y, n, k, ks=1, pdl=False, unroll=None, before_attention=False):
    g.launch(gemv_entry("kern_gemv_m1", k, ks, unroll, before_attention), cdiv(n, rows_per_block(ks)), 0,
             [(x.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32), (ks, I32)], pdl)


def run_norm(g, x, nw, w, y, n, k, ks=1, pdl=False, unroll=None, before_attention=False):
    g.launch(gemv_entry("kern_gemv_norm_m1", k, ks, unroll, before_attention), cdiv(n, rows_per_block(ks)), k * 2,
             [(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32), (EPS, F32), (ks, I32)],
             pdl)


def run_norm_silu(g, x, nw, w, y, n, k, ks=1, pdl=False, unroll=None, before_attention=False):
    g.launch(gemv_entry("kern_gemv_norm_silu_m1", k, ks, unroll, before_attention), cdiv(n, rows_per_block(ks) // 2), k * 2,
             [(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32), (EPS, F32), (ks, I32)],
             pdl)


def run_residual(g, x, w, r, n, k, ks=1, pdl=False, unroll=None, before_attention=False):
    g.launch(gemv_entry("kern_gemv_residual_m1", k, ks, unroll, before_attention), cdiv(n, rows_per_block(ks)), 0,
             [(x.data_ptr(), P), (w.data_ptr(), P), (r.data_ptr(), P), (n, I32), (k, I32), (ks, I32)], pdl)


#: The gemv.cu variant (tools/gen_qwen3.py GEMV_OPS) of each shape's decode op.
SHAPE_VARIANTS = {"qkv": "gemv_norm", "o": "gemv_residual", "gate_up": "gemv_norm_silu", "down": "gemv_residual",
                  "lm_head": "gemv_norm"}


def run_tc(g, variant, x, nw, w, y, n, k, pdl=False, unroll=None, before_attention=False):
    """gemv_tc.cu's M = 1 entry of gemv.cu variant `variant` ("gemv", "gemv_norm", "gemv_norm_silu", "gemv_residual";
    the tensor cores, tools/gemv_plan.py gemv_tensor_core): grid ceil_div(n, 16) (norm_silu: n output columns,
    ceil_div(n, 8)), ksplit 1, k a multiple of GEMV_TC_STEP; its `_u5` entry where gemv_plan.gemv_tc_unroll picks it
    (as tools/gen_qwen3.py does), unless `unroll` forces 4 or 5. y: the output (plain and norm variants) or the
    residual; nw: the norm weight (norm variants only)."""
    u = gemv_tc_unroll(k, before_attention) if unroll is None else unroll
    name = gemv_tc_entry(f"kern_{variant}_m1") + GEMV_UNROLL_SUFFIX[u]
    if variant in ("gemv", "gemv_residual"):
        g.launch(name, cdiv(n, 16), 0, [(x.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32),
                                        (1, I32)], pdl)
    else:
        g.launch(name, cdiv(n, 8 if variant == "gemv_norm_silu" else 16), k * 2,
                 [(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32),
                  (EPS, F32), (1, I32)], pdl)


def run_shape(g, name, x, nw, w, y, n, k, ks=1, pdl=False):
    """The variant the decode program launches for shape `name` of `shapes()` (qkv, lm_head: norm; gate_up: norm +
    SiLU-and-mul over its n/2 output columns; o, down: residual add into y), with the manifests' entry
    (`gemv_entry`, BEFORE_ATTENTION); w [n, k], x [1, k], nw [k], y [1, n] bf16."""
    before = BEFORE_ATTENTION[name]
    if name in ("qkv", "lm_head"):
        run_norm(g, x, nw, w, y, n, k, ks, pdl=pdl, before_attention=before)
    elif name == "gate_up":
        run_norm_silu(g, x, nw, w, y, n // 2, k, ks, pdl=pdl, before_attention=before)
    elif name in ("o", "down"):
        run_residual(g, x, w, y, n, k, ks, pdl=pdl, before_attention=before)
    else:
        raise ValueError(f"run_shape: no decode shape `{name}` (one of {', '.join(SHAPE_OPS)})")


# The persistent forms (gemv_persist.cu): grid, rows_per_job and shared memory from tools/gemv_plan.py.
#: Target chunks per ring slot of the persistent forms (tools/gemv_plan.py PIECE_CHUNKS unless swept).
GEMVP_PIECE = [PIECE_CHUNKS]


def _gemvp(g, name, n, k, silu, args, pdl):
    plan = plan_gemvp(n, k, silu, piece_target=GEMVP_PIECE[0]) or plan_gemvp(n, k, silu)
    g.launch(name, plan.grid, plan.smem, args + [(plan.piece_chunks, I32)], pdl)


def runp_plain(g, x, w, y, n, k, pdl=False):
    _gemvp(g, "kern_gemvp_m1", n, k, False, [(x.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32)], pdl)


def runp_norm(g, x, nw, w, y, n, k, pdl=False):
    _gemvp(g, "kern_gemvp_norm_m1", n, k, False, [(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P),
                                                  (y.data_ptr(), P), (n, I32), (k, I32), (EPS, F32)], pdl)


def runp_norm_silu(g, x, nw, w, y, n, k, pdl=False):
    _gemvp(g, "kern_gemvp_norm_silu_m1", n, k, True, [(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P),
                                                      (y.data_ptr(), P), (n, I32), (k, I32), (EPS, F32)], pdl)


def runp_residual(g, x, w, r, n, k, pdl=False):
    _gemvp(g, "kern_gemvp_residual_m1", n, k, False, [(x.data_ptr(), P), (w.data_ptr(), P), (r.data_ptr(), P),
                                                      (n, I32), (k, I32)], pdl)


def token_chain(g, sh, weights, lm, resid, nw, qkv, attn, act, logits, ks=None, pdl=False, unroll=None, tc=False):
    """A function that enqueues one decode token's GEMVs in program order: per layer norm + qkv into `qkv`,
    o + residual add (x = `attn`), norm + gate_up + SiLU-and-mul into `act`, down + residual add; then
    norm + lm_head into `logits`. `ks` (ksplit per shape name): gemv.cu's forms; None: the persistent forms
    (gemv_persist.cu). `pdl`: every launch but the first (no kernel before it in a graph) with programmatic
    stream serialization. gemv.cu's entries: `unroll` None: each shape's `gemv_entry` as the manifests launch
    them (the `_u5` entries except where the program's next launch is the attention, BEFORE_ATTENTION); "fit": `_u5` wherever
    gemv_plan.gemv_unroll allows (in this chain every launch is followed by a GEMV); 4 or 5: those entries
    everywhere. `tc`: each op on gemv_tc.cu's tensor-core entry where gemv_plan.gemv_tensor_core picks it (its
    unroll gemv_plan.gemv_tc_unroll's), as the manifests of tools/gen_qwen3.py's default `--gemv gemv` launch them (a
    dense lm_head as `--lm-head dense` does). `sh`: `shapes()`; `weights`: per layer {qkv,
    o, gate_up, down}; bf16 [1, ·] buffers."""
    h = sh["o"][0]
    if ks is None:
        norm, norm_silu, residual = runp_norm, runp_norm_silu, runp_residual
        launch_kw = dict.fromkeys(sh, {})
    else:
        u = None if unroll == "fit" else unroll
        norm, norm_silu, residual = run_norm, run_norm_silu, run_residual
        launch_kw = {nm: dict(ks=ks[nm], unroll=u, before_attention=unroll != "fit" and BEFORE_ATTENTION[nm]) for nm in sh}

    def kw(nm, p):
        return dict(launch_kw[nm], pdl=p)

    def on_tc(nm):
        return tc and ks is not None and gemv_tensor_core(SHAPE_VARIANTS[nm], sh[nm][1])

    def op(nm, x, w, y, n, k, first=False):
        p = pdl and not first
        if on_tc(nm):
            run_tc(g, SHAPE_VARIANTS[nm], x, nw, w, y, n, k, pdl=p, before_attention=BEFORE_ATTENTION[nm])
        else:
            {"gemv_norm": norm, "gemv_norm_silu": norm_silu, "gemv_residual": residual}[SHAPE_VARIANTS[nm]](
                g, x, *(() if SHAPE_VARIANTS[nm] == "gemv_residual" else (nw,)), w, y, n, k, **kw(nm, p))

    def fn():
        for i, lw in enumerate(weights):
            op("qkv", resid, lw["qkv"], qkv, sh["qkv"][0], h, first=i == 0)
            op("o", attn, lw["o"], resid, h, sh["o"][1])
            op("gate_up", resid, lw["gate_up"], act, sh["down"][1], h)
            op("down", act, lw["down"], resid, h, sh["down"][1])
        op("lm_head", resid, lm, logits, sh["lm_head"][0], h)
    return fn


def rmsnorm_ref(x, w):
    """HF Qwen3RMSNorm in bf16: weight * (x.float() * rsqrt(mean(x²)+eps)).to(bf16)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(torch.bfloat16)


def rel_err(out, ref):
    out = out.double()
    ref = ref.double()
    if torch.isnan(out).any():
        return float("inf")
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def correctness(g, k, n, ks=1):
    """All four variants at (n, k), m = 1, vs float64 references. Returns rel. errors.
    ks = "p": the persistent forms (gemv_persist.cu) instead of gemv.cu's at that ksplit."""
    if ks == "p":
        plain, norm, silu, resid = runp_plain, runp_norm, runp_norm_silu, runp_residual
    else:
        plain, norm, silu, resid = (lambda *a, f=f: f(*a, ks) for f in (run_plain, run_norm, run_norm_silu, run_residual))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
    errs = {}
    y = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    plain(g, x, w, y, n, k)
    errs["plain"] = rel_err(y, x.double() @ w.double().T)
    y.fill_(float("nan"))
    norm(g, x, nw, w, y, n, k)
    torch.cuda.synchronize()
    errs["norm"] = rel_err(y, rmsnorm_ref(x, nw).double() @ w.double().T)
    if n % 2 == 0 and (ks != "p" or plan_gemvp(n // 2, k, True)):
        half = n // 2
        y2 = torch.full((1, half), float("nan"), device="cuda", dtype=torch.bfloat16)
        silu(g, x, nw, w, y2, half, k)
        gu = rmsnorm_ref(x, nw).double() @ w.double().T
        ref = torch.nn.functional.silu(gu[:, :half]) * gu[:, half:]
        errs["norm_silu"] = rel_err(y2, ref)
    r = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
    r0 = r.clone()
    resid(g, x, w, r, n, k)
    errs["residual"] = rel_err(r, r0.double() + x.double() @ w.double().T)
    if ks == 1 and k % GEMV_TC_STEP == 0 and g.tc is not None:  # gemv_tc.cu's forms (where the index has them)
        r = r0.clone()
        run_tc(g, "gemv_residual", x, None, w, r, n, k)
        errs["residual_tc"] = rel_err(r, r0.double() + x.double() @ w.double().T)
        y.fill_(float("nan"))
        run_tc(g, "gemv_norm", x, nw, w, y, n, k)
        torch.cuda.synchronize()
        errs["norm_tc"] = rel_err(y, rmsnorm_ref(x, nw).double() @ w.double().T)
        if n % 2 == 0:
            y2 = torch.full((1, n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
            run_tc(g, "gemv_norm_silu", x, nw, w, y2, n // 2, k)
            gu = rmsnorm_ref(x, nw).double() @ w.double().T
            errs["norm_silu_tc"] = rel_err(y2, torch.nn.functional.silu(gu[:, :n // 2]) * gu[:, n // 2:])
    torch.cuda.synchronize()
    return errs


def event_times(fn, iters=50, warmup=5, before=None):
    """Per-run CUDA-event timings (ms) of `fn` over `iters` runs, after `warmup` runs; `before` (e.g. an L2 flush)
    is enqueued ahead of each timed run, outside its events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return times


def time_ms(fn, iters=50):
    """Median ms of `fn` over `iters` CUDA-event-timed runs (after 5 warm-up runs)."""
    return statistics.median(event_times(fn, iters))


def capture(fn):
    """A torch CUDA graph of `fn` (run once eagerly first, on the capture's side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return graph


def graph_ms(fn, count):
    """Median ms of one replay of a graph holding `count` back-to-back calls of `fn`."""
    graph = capture(lambda: [fn() for _ in range(count)])
    return time_ms(graph.replay, 20)


def copy_bandwidth():
    """Device-to-device copy bandwidth, bytes/s (read + write counted), 1 GiB buffers."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), 20)
    return 2 * a.numel() / (ms * 1e-3)


def shapes(geom):
    h, nq, nkv, d, inter, layers, vocab = GEOMETRIES[geom]
    return {
        "qkv": (nq * d + 2 * nkv * d, h),
        "o": (h, nq * d),
        "gate_up": (2 * inter, h),
        "down": (h, inter),
        "lm_head": (vocab, h),
    }, layers


KSPLITS = (1, 2, 4, 8)
KSPLIT_BEST: dict[tuple[str, str], int] = {}


def standalone(g, geom, bw):
    """Per-shape standalone medians: ours (gemv.cu's variant as decode uses it, at its best ksplit), the persistent
    form, cuBLAS, and gemv_tc.cu's M = 1 entry (the tensor cores, the unroll gemv_plan.gemv_tc_unroll picks; NaN where
    the index has none or k is not a multiple of GEMV_TC_STEP)."""
    rows = []
    sh, _ = shapes(geom)
    for name, (n, k) in sh.items():
        copies = max(8, cdiv(256 << 20, n * k * 2))  # > 256 MB rotating: never L2-resident
        ws = [(torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        nw = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        it = [0]
        cur_ks = [1]

        def ours():
            w = ws[it[0] % copies]
            it[0] += 1
            run_shape(g, name, x, nw, w, y, n, k, cur_ks[0])

        def cublas():
            w = ws[it[0] % copies]
            it[0] += 1
            torch.matmul(x, w.T, out=y)

        def persistent():
            w = ws[it[0] % copies]
            it[0] += 1
            if name in ("qkv", "lm_head"):
                runp_norm(g, x, nw, w, y, n, k)
            elif name == "gate_up":
                runp_norm_silu(g, x, nw, w, y, n // 2, k)
            elif name in ("o", "down"):
                runp_residual(g, x, w, y, n, k)

        best = None
        for ks in KSPLITS:
            cur_ks[0] = ks
            t = graph_ms(ours, copies) / copies
            if best is None or t < best[0]:
                best = (t, ks)
        t_ours, ks_best = best
        KSPLIT_BEST[(geom, name)] = ks_best
        def tensor_cores():
            w = ws[it[0] % copies]
            it[0] += 1
            nn = n // 2 if name == "gate_up" else n
            run_tc(g, SHAPE_VARIANTS[name], x, nw, w, y, nn, k, before_attention=BEFORE_ATTENTION[name])

        t_cub = graph_ms(cublas, copies) / copies
        t_p = graph_ms(persistent, copies) / copies if plan_gemvp(n // 2 if name == "gate_up" else n, k, name == "gate_up") else float("nan")
        t_tc = graph_ms(tensor_cores, copies) / copies if g.tc is not None and k % GEMV_TC_STEP == 0 else float("nan")
        floor = n * k * 2 / bw * 1e3
        rows.append((geom, name, f"{n}x{k}", n * k * 2, floor, t_ours, t_cub, ks_best, t_p, t_tc))
        del ws
    return rows


def token_buffers(geom):
    """The operands of one decode token's GEMMs for `geom` (token_chain's): a namespace of sh, layers (`shapes()`),
    weights (per layer {qkv, o, gate_up, down}: bf16, fresh random), lm (the lm_head weight), h (hidden size), resid
    (random), nw (ones), qkv, attn (random), act, logits (bf16 [1, ·]) and total_bytes (all weight bytes)."""
    sh, layers = shapes(geom)
    weights = [{nm: (torch.randn(*sh[nm], device="cuda") * 0.05).to(torch.bfloat16)
                for nm in ("qkv", "o", "gate_up", "down")} for _ in range(layers)]
    lm = (torch.randn(*sh["lm_head"], device="cuda") * 0.05).to(torch.bfloat16)
    h = sh["o"][0]
    return SimpleNamespace(
        sh=sh, layers=layers, weights=weights, lm=lm, h=h,
        resid=torch.randn(1, h, device="cuda", dtype=torch.bfloat16),
        nw=torch.ones(h, device="cuda", dtype=torch.bfloat16),
        qkv=torch.empty(1, sh["qkv"][0], device="cuda", dtype=torch.bfloat16),
        attn=torch.randn(1, sh["o"][1], device="cuda", dtype=torch.bfloat16),
        act=torch.empty(1, sh["down"][1], device="cuda", dtype=torch.bfloat16),
        logits=torch.empty(1, sh["lm_head"][0], device="cuda", dtype=torch.bfloat16),
        total_bytes=sum(w.numel() * 2 for lw in weights for w in lw.values()) + lm.numel() * 2)


def token_graph(g, geom, bw):
    """One decode token's GEMMs (all layers + lm_head) in a CUDA graph: ours vs cuBLAS."""
    b = token_buffers(geom)
    sh, weights, lm, h, resid, nw = b.sh, b.weights, b.lm, b.h, b.resid, b.nw
    qkv, attn, act, logits, total_bytes = b.qkv, b.attn, b.act, b.logits, b.total_bytes
    gu = torch.empty(1, sh["gate_up"][0], device="cuda", dtype=torch.bfloat16)
    o = torch.empty(1, h, device="cuda", dtype=torch.bfloat16)

    ks = {nm: KSPLIT_BEST.get((geom, nm), 1) for nm in sh}

    # the manifests' ksplit (tools/gen_qwen3.py's rule): o at 2 since session 10, where the program launches it
    # after the attention; `ks` is each shape's best standalone ksplit
    ks_manifest = {nm: int(r) if (r := rule_ksplit(nm, *sh[nm])) != "-" else ks[nm] for nm in sh}

    def ours(pdl=False, unroll=None, ksplits=None, tc=False):
        return token_chain(g, sh, weights, lm, resid, nw, qkv, attn, act, logits, ksplits or ks, pdl, unroll, tc)

    def cublas():
        for lw in weights:
            torch.matmul(resid, lw["qkv"].T, out=qkv)
            torch.matmul(attn, lw["o"].T, out=o)
            torch.matmul(resid, lw["gate_up"].T, out=gu)
            torch.matmul(act, lw["down"].T, out=o)
        torch.matmul(resid, lm.T, out=logits)

    def persistent(pdl):
        return token_chain(g, sh, weights, lm, resid, nw, qkv, attn, act, logits, None, pdl)

    def staged(chunks, pdl):
        fn = persistent(pdl)

        def run():
            GEMVP_PIECE[0] = chunks
            fn()
            GEMVP_PIECE[0] = PIECE_CHUNKS
        return run

    variants = [("kern gemv", ours()), ("kern gemv, PDL", ours(True)),
                *([("kern gemv, PDL, as the manifests launch them (gemv_tc.cu's tensor cores where "
                    "gemv_plan.gemv_tensor_core picks them)", ours(True, ksplits=ks_manifest, tc=True))]
                  if g.tc is not None else []),
                ("kern gemv, PDL, gemv.cu for every op (--gemv gemv-fma; ksplit " + ", ".join(
                    f"{nm} {v}" for nm, v in ks_manifest.items()) + ")", ours(True, ksplits=ks_manifest)),
                ("kern gemv, PDL, 4 loads per stage everywhere (no _u5)", ours(True, 4)),
                ("kern gemv, PDL, _u5 wherever 5 loads fit (qkv, lm_head too)", ours(True, "fit")),
                ("kern gemv persistent", persistent(False)),
                ("kern gemv persistent, PDL", persistent(True)),
                ("kern gemv persistent, PDL, ≤ 8 KB slots", staged(16, True)),
                ("kern gemv persistent, PDL, ≤ 20 KB slots", staged(40, True)), ("cuBLAS", cublas)]
    # numerics: from one start, the persistent chains must agree bit for bit with each other and
    # stay close to gemv.cu's (another summation order: not bitwise)
    resid0 = resid.clone()
    outs = {}
    graphs = []
    for label, fn in variants:
        resid.copy_(resid0)
        graphs.append(capture(fn))
    for (label, _), graph in zip(variants, graphs):
        resid.copy_(resid0)
        logits.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        outs[label] = (resid.clone(), logits.clone())
    a, b = outs["kern gemv persistent"], outs["kern gemv persistent, PDL"]
    same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ref = outs["kern gemv"]
    print(f"  {geom}: persistent == persistent+PDL bitwise: {same}; logits rel. diff vs gemv.cu "
          f"{rel_err(a[1], ref[1]):.2e}, residual {rel_err(a[0], ref[0]):.2e}")
    # the persistent chain must equal itself under PDL bit for bit; against gemv.cu's (another summation
    # order) 1-ulp bf16 differences grow through the layers of random weights (4B: ~3e-2 after 36), so that
    # distance is reported, not judged: each op's error against float64 is the correctness check above
    NUMERICS_OK.append(same)
    # gemv.cu's chains: with and without PDL, with and without the _u5 entries, bit for bit the same
    plain = [outs[lb] for lb in ("kern gemv, PDL", "kern gemv, PDL, 4 loads per stage everywhere (no _u5)",
                                 "kern gemv, PDL, _u5 wherever 5 loads fit (qkv, lm_head too)")]
    same_gemv = all(torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1]) for o in plain)
    print(f"  {geom}: gemv.cu chains (plain, PDL, PDL without / with every _u5) bitwise equal: {same_gemv}")
    NUMERICS_OK.append(same_gemv)
    out = []
    times: list[list[float]] = [[] for _ in variants]
    for _ in range(5):  # variants interleaved in rounds
        for i, graph in enumerate(graphs):
            resid.copy_(resid0)
            times[i] += event_times(graph.replay, 10, warmup=2)
    for (label, _), ts in zip(variants, times):
        out.append((geom, label, total_bytes, total_bytes / bw * 1e3, statistics.median(ts)))
    del b, weights, graphs  # b holds the weights too
    return out


NUMERICS_OK: list[bool] = []


def gemv_cubin(kernels_dir: str | None, source: str = "gemv.cu", kernel: str = "kern_gemv_m1",
               missing_ok: bool = False) -> bytes | None:
    """The module of `kernel` (built from `source`) from a built kernels dir (sha256 checked
    against its index), else `source` built now the way tools/build_kernels.py builds it. `missing_ok`: None where
    the kernels dir's index has no `kernel` (an older build), instead of SystemExit."""
    if kernels_dir:
        d = Path(kernels_dir)
        kernels = json.loads((d / "index.json").read_text())["kernels"]
        if kernel not in kernels:
            if missing_ok:
                return None
            raise SystemExit(f"{d / 'index.json'}: no kernel `{kernel}` ({source}); rebuild with tools/build_kernels.py")
        entry = kernels[kernel]
        data = (d / entry["module"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise SystemExit(f"{d / entry['module']}: sha256 differs from {d / 'index.json'} (stale build?)")
        return data
    sys.path.insert(0, str(ROOT / "tools"))
    import build_kernels

    with tempfile.TemporaryDirectory() as tmp:
        return build_kernels.compile_cuda(source, tmp)


def rule_ksplit(shape: str, n: int, k: int) -> str:
    """The ksplit tools/gen_qwen3.py writes into a `--gemv gemv-fma` manifest for this shape ('-' if it cannot be
    imported)."""
    try:
        sys.path.insert(0, str(ROOT / "tools"))
        from gen_qwen3 import gemv_ksplit
    except ImportError:
        return "-"
    warps = n // 2 if shape == "gate_up" else -(-n // 2)  # gate_up: n/2 output columns, one per warp group
    return str(gemv_ksplit(warps, k, after_attention=shape == "o"))  # o follows the attention


def machine() -> str:
    name = torch.cuda.get_device_name()
    return f"{name}, {platform.node()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometries", nargs="+", default=["0.6b", "4b"], choices=sorted(GEOMETRIES))
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--kernels", default=None,
                    help="kernels dir of tools/build_kernels.py (default: compile gemv.cu the same way now)")
    args = ap.parse_args(argv)
    if torch is None:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")

    torch.manual_seed(0)
    tc = gemv_cubin(args.kernels, "gemv_tc.cu", "kern_gemvtc_m1", missing_ok=True)
    if tc is None:
        print(f"note: {args.kernels}/index.json has no gemv_tc.cu entries (built before session 30): the chain as "
              "the manifests launch it is gemv.cu's alone, and no tensor-core row is timed", file=sys.stderr)
    g = Gemv(gemv_cubin(args.kernels), gemv_cubin(args.kernels, "gemv_persist.cu", "kern_gemvp_m1"), tc=tc)
    print("== correctness (m=1, rel. error vs float64; bound 1e-2)")
    bad = 0
    for geom in args.geometries:
        for name, (n, k) in shapes(geom)[0].items():
            errs = {}
            for ks in (*KSPLITS, "p"):
                errs.update({f"{v}/ks{ks}": e for v, e in correctness(g, k, n, ks).items()})
            ok = all(e < 1e-2 for e in errs.values())
            bad += not ok
            print(f"{geom:5s} {name:8s} {n:7d}x{k:<6d} " + f"max over variants × ksplit {max(errs.values()):.2e}" + ("" if ok else "  FAIL"))
    bw = copy_bandwidth()
    print(f"\n== device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s")
    lines = []
    lines.append("| geometry | shape | n×k | MB | floor µs | kern µs (best ksplit) | gemv-fma ksplit | kern GB/s | kern % floor "
                 "| tensor cores µs | tensor cores GB/s | tensor cores % floor | persistent µs | persistent GB/s "
                 "| persistent % floor | cuBLAS µs | cuBLAS GB/s | cuBLAS % floor |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for geom in args.geometries:
        for geom_, name, nk, nbytes, floor, t_o, t_c, ks, t_p, t_tc in standalone(g, geom, bw):
            n, k = map(int, nk.split("x"))
            cells = [f"{t * 1e3:.1f} | {nbytes / (t * 1e-3) / 1e9:,.0f} | {100 * floor / t:.0f}%"  # weight bytes/s
                     for t in (t_tc, t_p, t_c)]
            lines.append(f"| {geom_} | {name} | {nk} | {nbytes / 1e6:.1f} | {floor * 1e3:.1f} | {t_o * 1e3:.1f} ({ks}) | "
                         f"{rule_ksplit(name, n, k)} | {nbytes / (t_o * 1e-3) / 1e9:,.0f} | {100 * floor / t_o:.0f}% | "
                         + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| geometry | one decode token's GEMMs in a CUDA graph | GB | floor ms | ms | GB/s | % floor |")
    lines.append("|---|---|---|---|---|---|---|")
    for geom in args.geometries:
        for geom_, label, nbytes, floor, ms in token_graph(g, geom, bw):
            lines.append(f"| {geom_} | {label} | {nbytes / 1e9:.2f} | {floor:.3f} | {ms:.3f} | {nbytes / (ms * 1e-3) / 1e9:,.0f} | "
                         f"{100 * floor / ms:.0f}% |")
    table = "\n".join(lines)
    print()
    print(table)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(args.out, "a") as f:
        f.write(f"\n## Decode GEMV vs cuBLAS (tools/bench_gemv.py) — {stamp}, commit {commit()}, {machine()}\n\n")
        f.write(f"Copy bandwidth {bw / 1e12:.3f} TB/s (read+write); floor = weight bytes / copy bandwidth; m = 1; "
                "standalone = one graph of back-to-back launches rotating over ≥ 8 weight copies (> 256 MB), median replay / launches.\n\n")
        f.write(table + "\n")
    return 1 if bad or not all(NUMERICS_OK) else 0


if __name__ == "__main__":
    sys.exit(main())
