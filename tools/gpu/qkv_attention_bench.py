#!/usr/bin/env python3
"""The fused qkv GEMV + rope-cluster attention (tools/kernels-src/qkv_attention.cu, an experiment; NOTES.md 56)
against the two launches it replaces, kernel against kernel: 36 layers in one CUDA graph, Qwen3-4B geometry.

    python3 tools/gpu/qkv_attention_bench.py --kernels KDIR --cubin NAME=FILE[:SLOTS:SLOT_BYTES[:THREADS]] ...
        [--context 130 --context 4096] [--replays 30]

KDIR: a build_kernels.py dir with kern_gemv_norm_m1 and decode_attention_rope_cluster_pdl (the pair, launched as the
decode program launches them: 192-block row-pass grid where KDIR has kern_gemv_norm_m1_p2, PDL on every launch).
Each --cubin: a -DKERN_PDL qkv_attention.cu build, its slot count and bytes as built with -DQA_SLOTS/-DQA_SLOT_BYTES
(default 4 and 20480) and THREADS 128, or 256 for a -DDA_WARPS=8 -DDA_ROPE_SLOTS=1 build (the launch's dynamic shared
memory starts with the attention's, rope_smem: 70,400 bytes for the default 4 warps' 2-page rings, 70,656 for that
8-warp build's 1-page rings, both with the slots' mbarriers and 512-byte rows of the head-major KV layout; a build
that needs more traps). Per context: µs per layer of the pair and of each build, median of the replays (each replay:
36 layers over 36 distinct weight sets and KV layers, x shared), and the floor (the layer's qkv weight + K|V bytes at 4.25
TB/s). A probe: prints a table, appends nothing; `--help` and argument errors need no GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tools" / "kernels-src", ROOT / "tools", ROOT / "tests-integration" / "gpu"):
    sys.path.insert(0, str(p))

from catalog import da_cluster_smem  # noqa: E402

NQ, NKV, D, K, LAYERS, EPS = 32, 8, 128, 2560, 36, 1e-6
N = (NQ + 2 * NKV) * D


def rope_smem(threads: int) -> int:
    """decode_attention_rope_cluster's dynamic shared memory (decode_attention.cu DA_ROPE_SMEM) in a -DKERN_PDL
    qkv_attention.cu build of `threads` (128 or 256), where qkv_attention.cu's own layout starts (QA_BARS_OFF): the
    slots' mbarriers (64 bytes per warp), the warps' rings of pages of 16 unpadded 512-byte rows (the head-major KV
    layout's page of one kv head: 2 pages per warp with 4 warps, the PDL module's DA_ROPE_SLOTS; 1 with 8 warps, the
    -DDA_WARPS=8 -DDA_ROPE_SLOTS=1 build), then the cluster's 4,608 bytes of partials: 70,400 or 70,656 bytes."""
    warps = threads // 32
    slots = 2 if warps == 4 else 1
    return da_cluster_smem(slots, warps)


def parse_cubin(spec: str) -> tuple[str, Path, int, int, int]:
    """A --cubin NAME=FILE[:SLOTS:SLOT_BYTES[:THREADS]] -> (name, file, slots, slot bytes, threads); raises
    ValueError naming what is wrong."""
    name, eq, rest = spec.partition("=")
    f, *geo = rest.split(":")
    if not (eq and name and f) or len(geo) not in (0, 2, 3) or not all(g.isdigit() for g in geo):
        raise ValueError(f"--cubin {spec}: NAME=FILE[:SLOTS:SLOT_BYTES[:THREADS]] (e.g. qa=qa.cubin:4:20480)")
    slots, slot_bytes, threads = (int(geo[0]), int(geo[1]), int(geo[2]) if len(geo) > 2 else 128) if geo \
        else (4, 20480, 128)
    if threads not in (128, 256):
        raise ValueError(f"--cubin {spec}: THREADS is 128 (the default build) or 256 (-DDA_WARPS=8)")
    if not Path(f).is_file():
        raise ValueError(f"--cubin {spec}: no file {f}")
    return name, Path(f), slots, slot_bytes, threads


def raw_launcher(path: Path, entry: str, grid: tuple[int, int, int], threads: int, smem: int, carveout: int = 0):
    """launch(args) for `entry` of the cubin at `path`, outside any kernel index: a PDL launch of grid and `threads`
    threads with `smem` bytes of dynamic shared memory (its limit raised to that) and the preferred shared-memory
    `carveout` (percent, default 0), on torch's current stream. args: torch tensors (their data pointers), floats
    (f32) and ints (i32), in the entry's order. `launch.max_active_clusters()`: cuOccupancyMaxActiveClusters for
    this launch (the most clusters of the kernel's compile-time cluster shape the GPU holds at once)."""
    import torch
    from cuda.bindings import driver as cu
    from cubin_launch import check, launch_function, pdl_config

    f = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData(path.read_bytes())), entry.encode()))
    check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                carveout))

    def launch(args):
        hold = [ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else
                ctypes.c_float(a) if isinstance(a, float) else ctypes.c_int32(a) for a in args]
        ptrs = (ctypes.c_void_p * len(hold))(*[ctypes.addressof(h) for h in hold])
        launch_function(f, grid, (threads, 1, 1), smem, cu.CUstream(torch.cuda.current_stream().cuda_stream),
                        ctypes.addressof(ptrs), pdl=True)

    def max_active_clusters() -> int:
        cfg = pdl_config(grid, (threads, 1, 1), smem, cu.CUstream(torch.cuda.current_stream().cuda_stream))
        return int(check(cu.cuOccupancyMaxActiveClusters(f, cfg)))
    launch.max_active_clusters = max_active_clusters
    return launch


def fused_launcher(path: Path, slots: int, slot_bytes: int, threads: int):
    smem = rope_smem(threads) + 128 + slots * slot_bytes + (8 + 2) * D * 2 + 2 * K  # qkv_attention.cu's QA_XN_OFF + 2k
    return raw_launcher(path, "qkv_attention_rope_cluster", (NKV, 8, 1), threads, smem)


def layer_weights():
    """Seeded (torch.manual_seed(0)) random inputs of the pairs: x (bf16 [1, K], ×3), one qkv weight per layer (bf16
    [N, K] / √K, LAYERS of them), the input norm's weight, q_norm's and k_norm's (bf16, uniform in [0.5, 1.5)), and
    the rotary table (gpu_helpers.rope_table). Returns (x, ws, nw, qw, kw, cos_sin)."""
    import torch
    from gpu_helpers import rope_table

    BF = torch.bfloat16
    cos_sin = rope_table()
    torch.manual_seed(0)
    x = (torch.randn(1, K, device="cuda") * 3).to(BF)
    ws = [(torch.randn(N, K, device="cuda") / math.sqrt(K)).to(BF) for _ in range(LAYERS)]
    nw = (torch.rand(K, device="cuda") + 0.5).to(BF)
    qw, kw = (torch.rand(D, device="cuda") + 0.5).to(BF), (torch.rand(D, device="cuda") + 0.5).to(BF)
    return x, ws, nw, qw, kw, cos_sin


def context_inputs(L: int) -> dict:
    """The tensors and params a pair runs with at L cached tokens (Qwen3-4B geometry): `kv`, `bt`, `layer_elems`,
    `page_elems` (gpu_helpers.pool for LAYERS layers), `seq` (seq_lens, i32 [1]), `pos` (i64 [1], L - 1), `slot`
    (slot_mapping of position L - 1), `qkv` and `out` (bf16 rows [1, N] and [1, NQ·D], uninitialized) and `tail`
    (decode_attention_rope_cluster's trailing params: bt_stride, page_bytes, sm_scale, eps)."""
    import torch
    from gpu_helpers import pool

    kv, bt, layer_elems, page_elems = pool(L, LAYERS)
    return dict(kv=kv, bt=bt, layer_elems=layer_elems, page_elems=page_elems,
                seq=torch.tensor([L], dtype=torch.int32, device="cuda"),
                pos=torch.tensor([L - 1], dtype=torch.int64, device="cuda"),
                slot=(bt[(L - 1) // 16].long() * 16 + (L - 1) % 16).view(1),
                qkv=torch.empty(1, N, dtype=torch.bfloat16, device="cuda"),
                out=torch.empty(1, NQ * D, dtype=torch.bfloat16, device="cuda"),
                tail=[bt.numel(), page_elems * 2, 1 / math.sqrt(D), EPS])


def time_graph(body, replays: int) -> float:
    """µs per layer: body() captured once into a CUDA graph, replayed; median over the replays."""
    import torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        body()  # warm (module loads, smem attributes)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        body()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / LAYERS)
    return statistics.median(ts)


def time_pairs(gemv, forms: dict, rounds: int, replays: int) -> tuple[dict[str, tuple[float, float]], float]:
    """Issue 4's timings of attention forms in the decode program's order, µs per layer (time_graph: LAYERS layers
    per graph), the forms alternating, the best of `rounds` rounds: per form, the pair (gemv(layer), then
    form(layer), for every layer) and the form alone (form(layer) for every layer); and the GEMV alone. gemv and each
    form: callables enqueueing layer `layer`'s launch. Returns ({name: (pair, alone)}, gemv alone); a form's "added"
    is its pair minus the GEMV alone."""
    best = {name: [math.inf, math.inf] for name in forms}
    g_alone = math.inf
    for _ in range(rounds):
        for name, form in forms.items():
            def pair(form=form):
                for layer in range(LAYERS):
                    gemv(layer)
                    form(layer)

            def alone(form=form):
                for layer in range(LAYERS):
                    form(layer)
            best[name][0] = min(best[name][0], time_graph(pair, replays))
            best[name][1] = min(best[name][1], time_graph(alone, replays))

        def gemvs():
            for layer in range(LAYERS):
                gemv(layer)
        g_alone = min(g_alone, time_graph(gemvs, replays))
    return {name: (p, al) for name, (p, al) in best.items()}, g_alone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, required=True, help="a build_kernels.py dir (with its PDL forms)")
    ap.add_argument("--cubin", action="append", default=[], metavar="NAME=FILE[:SLOTS:SLOT_BYTES[:THREADS]]",
                    help="a -DKERN_PDL qkv_attention.cu build to time (repeatable; default ring 4:20480, 128 threads)")
    ap.add_argument("--context", type=int, action="append", help="cached tokens, repeatable (default: 130 and 4096)")
    ap.add_argument("--replays", type=int, default=30, help="graph replays per median (default: %(default)s)")
    a = ap.parse_args(argv)
    try:
        specs = [parse_cubin(spec) for spec in a.cubin]
    except ValueError as e:
        ap.error(str(e))
    if any(L < 1 for L in a.context or []) or a.replays < 1:
        ap.error("--context and --replays: positive ints")
    if not (a.kernels / "index.json").is_file():
        ap.error(f"--kernels {a.kernels}: no index.json (a tools/build_kernels.py dir)")
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    return run(a, specs)


def run(a: argparse.Namespace, specs: list[tuple[str, Path, int, int, int]]) -> int:
    import torch
    from cubin_launch import KernelSet

    torch.empty(1, device="cuda")
    ks = KernelSet(a.kernels)
    # 4B's qkv as gen_qwen3 launches it: the row-pass module, with the batched norm prologue where the index has it
    gemv = next((g for g in ("kern_gemv_norm_m1_nb2_p2", "kern_gemv_norm_m1_p2") if g in ks.kernels), "kern_gemv_norm_m1")
    p2 = gemv.endswith("_p2")
    grid = (192,) if p2 else (-(-N // 16),)
    builds = {name: fused_launcher(f, slots, slot_bytes, threads) for name, f, slots, slot_bytes, threads in specs}
    x, ws, nw, qw, kw, cos_sin = layer_weights()
    print(f"Qwen3-4B geometry, {LAYERS} layers per graph, µs per layer (median of {a.replays} replays); "
          f"pair = {gemv} (grid {grid[0]}) + decode_attention_rope_cluster_pdl, every launch PDL")
    print("| context | floor µs | pair | " + " | ".join(builds) + " |")
    print("|---:|---:|---:|" + "---:|" * len(builds))
    for L in a.context or [130, 4096]:
        c = context_inputs(L)
        kv, bt, layer_elems, seq, pos, slot, qkv, out, tail = (c[k] for k in (
            "kv", "bt", "layer_elems", "seq", "pos", "slot", "qkv", "out", "tail"))

        def pair():
            for layer in range(LAYERS):
                ks.launch(gemv, grid, [x, nw, ws[layer], qkv, N, K, EPS, 1], pdl=True)
                ks.launch("decode_attention_rope_cluster_pdl", (NKV, 8, 1),
                          [qkv, pos, slot, qw, kw, cos_sin, kv[layer * layer_elems:], bt, seq, out, NQ, NKV, N, *tail],
                          pdl=True)

        row = [time_graph(pair, a.replays)]
        for launch in builds.values():
            def fused(launch=launch):
                for layer in range(LAYERS):
                    launch([x, nw, ws[layer], pos, slot, qw, kw, cos_sin, kv[layer * layer_elems:], bt, seq, out,
                            NQ, NKV, K, *tail])
            row.append(time_graph(fused, a.replays))
        floor = (N * K * 2 + L * NKV * 512) / 4.25e6
        print(f"| {L} | {floor:.2f} | " + " | ".join(f"{t:.2f}" for t in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
