#!/usr/bin/env python3
"""The qkv GEMV asking L2 for its layer's KV pages (gemv.cu -DGEMV_KV_PREFETCH, an experiment; NOTES.md 61) against
the default GEMV, each followed by the default decode attention, kernel against kernel: 36 layers in one CUDA graph,
Qwen3-4B geometry.

    python3 tools/gpu/kv_prefetch_probe.py --kernels KDIR --cubin NAME=FILE[:MAX_PAGES] ... \\
        [--context 130 --context 4096] [--replays 30] [--rounds 3]

KDIR: a build_kernels.py dir with kern_gemv_norm_m1_p2 (4B's qkv GEMV, grid 192) and
decode_attention_rope_cluster_pdl. Each --cubin: gemv.cu built with -DGEMV_PASSES=2 -DGEMV_KV_PREFETCH (and any
-DGEMV_KVPF_AT / -DGEMV_KVPF_EVICT_FIRST), entry kern_gemv_norm_m1_kvpf; MAX_PAGES caps the pages it prefetches
(default: all). Every launch is PDL, as the decode program launches them. Per context, µs per layer (median of the
replays, the best of the rounds, builds alternating within a round): the pair (GEMV + attention), the GEMV alone (36
GEMVs in a chain), and pair − default GEMV alone (what the attention adds to a layer: issue 4's figure), then the
attention alone (36 in a chain), beside the floors (the layer's bytes at 4.25 TB/s). --same-kv: every layer reads
layer 0's KV (a diagnostic: pages that can stay in L2). Before timing, each build's qkv output and the attention's output after
it are checked bit for bit against the default pair's. A probe: prints a table, appends nothing; `--help` and
argument errors need no GPU.
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

NQ, NKV, D, K, LAYERS, EPS = 32, 8, 128, 2560, 36, 1e-6
N = (NQ + 2 * NKV) * D
GEMV_GRID = 192  # kern_gemv_norm_m1_p2 on 4B's qkv: ceil(6144 / 32)
BW = 4.25e6  # bytes per µs: the copy floor used by bench_kernels


def parse_cubin(spec: str) -> tuple[str, Path, int]:
    """A --cubin NAME=FILE[:MAX_PAGES] -> (name, file, max pages); raises ValueError naming what is wrong."""
    name, eq, rest = spec.partition("=")
    f, colon, mp = rest.partition(":")
    if not (eq and name and f) or (colon and not mp.isdigit()):
        raise ValueError(f"--cubin {spec}: NAME=FILE[:MAX_PAGES] (e.g. at0=kvpf_at0.cubin or at0cap=kvpf.cubin:384)")
    if not Path(f).is_file():
        raise ValueError(f"--cubin {spec}: no file {f}")
    return name, Path(f), int(mp) if colon else 1 << 30


def kvpf_launcher(path: Path):
    """launch(args, pdl) for kern_gemv_norm_m1_kvpf in the module at path (block 256, grid 192, 5,120 bytes of
    dynamic shared memory: x normalized)."""
    import torch
    from cuda.bindings import driver as cu
    from cubin_launch import check, launch_function

    f = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData(path.read_bytes())), b"kern_gemv_norm_m1_kvpf"))

    def launch(args):
        hold = [ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else
                ctypes.c_float(a) if isinstance(a, float) else ctypes.c_int32(a) for a in args]
        ptrs = (ctypes.c_void_p * len(hold))(*[ctypes.addressof(h) for h in hold])
        launch_function(f, (GEMV_GRID, 1, 1), (256, 1, 1), K * 2,
                        cu.CUstream(torch.cuda.current_stream().cuda_stream), ctypes.addressof(ptrs), pdl=True)
    return launch


def time_graph(body, replays: int) -> float:
    """µs per layer: body() captured once into a CUDA graph, replayed; median over the replays."""
    import torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        body()  # warm (module loads)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, required=True, help="a build_kernels.py dir (with its PDL forms)")
    ap.add_argument("--cubin", action="append", default=[], metavar="NAME=FILE[:MAX_PAGES]",
                    help="a -DGEMV_PASSES=2 -DGEMV_KV_PREFETCH gemv.cu build to time (repeatable)")
    ap.add_argument("--context", type=int, action="append", help="cached tokens, repeatable (default: 130 and 4096)")
    ap.add_argument("--replays", type=int, default=30, help="graph replays per median (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best is kept (default: %(default)s)")
    ap.add_argument("--same-kv", action="store_true",
                    help="every layer's attention (and prefetch) reads layer 0's KV: 16.8 MB at 4,096 tokens, so it"
                         " can stay in L2 from one layer to the next (a diagnostic: the attention with its pages"
                         " resident in L2)")
    a = ap.parse_args(argv)
    try:
        specs = [parse_cubin(spec) for spec in a.cubin]
    except ValueError as e:
        ap.error(str(e))
    if any(L < 1 for L in a.context or []) or a.replays < 1 or a.rounds < 1:
        ap.error("--context, --replays and --rounds: positive ints")
    if not (a.kernels / "index.json").is_file():
        ap.error(f"--kernels {a.kernels}: no index.json (a tools/build_kernels.py dir)")
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    return run(a, specs)


def run(a: argparse.Namespace, specs: list[tuple[str, Path, int]]) -> int:
    import torch
    from cubin_launch import KernelSet
    from gpu_helpers import pool, rope_table

    BF = torch.bfloat16
    torch.empty(1, device="cuda")
    ks = KernelSet(a.kernels)
    if "kern_gemv_norm_m1_p2" not in ks.kernels:
        raise SystemExit(f"--kernels {a.kernels}: no kern_gemv_norm_m1_p2 (4B's qkv GEMV)")
    builds = {name: (kvpf_launcher(f), mp) for name, f, mp in specs}
    cos_sin = rope_table()
    torch.manual_seed(0)
    x = (torch.randn(1, K, device="cuda") * 3).to(BF)
    ws = [(torch.randn(N, K, device="cuda") / math.sqrt(K)).to(BF) for _ in range(LAYERS)]
    nw = (torch.rand(K, device="cuda") + 0.5).to(BF)
    qw, kw = (torch.rand(D, device="cuda") + 0.5).to(BF), (torch.rand(D, device="cuda") + 0.5).to(BF)
    print(f"Qwen3-4B geometry, {LAYERS} layers per graph, µs per layer (median of {a.replays} replays, best of "
          f"{a.rounds} alternating rounds); pair = the qkv GEMV (grid {GEMV_GRID}) + decode_attention_rope_cluster_pdl,"
          " every launch PDL; added = pair − the default GEMV alone (floor: the KV bytes)")
    cols = ["default"] + list(builds)
    print("| context | " + " | ".join(f"{c} pair | {c} GEMV | {c} added" for c in cols) +
          " | attention alone | pair floor | added floor |")
    print("|---:|" + "---:|---:|---:|" * len(cols) + "---:|---:|---:|")
    for L in a.context or [130, 4096]:
        kv, bt, layer_elems, page_elems = pool(L, LAYERS)
        seq = torch.tensor([L], dtype=torch.int32, device="cuda")
        pos = torch.tensor([L - 1], dtype=torch.int64, device="cuda")
        slot = (bt[(L - 1) // 16].long() * 16 + (L - 1) % 16).view(1)
        qkv = torch.empty(1, N, dtype=BF, device="cuda")
        out = torch.empty(1, NQ * D, dtype=BF, device="cuda")
        page_bytes, slab_bytes = page_elems * 2, layer_elems * 2
        kv_of = (lambda layer: kv) if a.same_kv else (lambda layer: kv[layer * layer_elems:])
        tail = [bt.numel(), page_bytes, 1 / math.sqrt(D), EPS]

        def gemv_default(layer):
            ks.launch("kern_gemv_norm_m1_p2", (GEMV_GRID,), [x, nw, ws[layer], qkv, N, K, EPS, 1], pdl=True)

        def gemv_build(name):
            launch, mp = builds[name]
            return lambda layer: launch([x, nw, ws[layer], qkv, N, K, EPS, 1, kv_of(layer), bt, seq,
                                         page_bytes, slab_bytes, mp])

        gemvs = {"default": gemv_default, **{name: gemv_build(name) for name in builds}}

        def attention(layer):
            ks.launch("decode_attention_rope_cluster_pdl", (NKV, 8, 1),
                      [qkv, pos, slot, qw, kw, cos_sin, kv_of(layer), bt, seq, out, NQ, NKV, N, *tail],
                      pdl=True)

        # bits: each build's qkv and the attention's output after it, layer 0 (the attention writes the current
        # token's row into the cache, the same bytes every time, so the runs read the same cache)
        ref = None
        for name, g in gemvs.items():
            qkv.fill_(float("nan"))
            out.fill_(float("nan"))
            g(0)
            attention(0)
            torch.cuda.synchronize()
            got = (qkv.clone(), out.clone())
            if ref is None:
                ref = got
            elif not (torch.equal(got[0].view(torch.int16), ref[0].view(torch.int16))
                      and torch.equal(got[1].view(torch.int16), ref[1].view(torch.int16))):
                raise SystemExit(f"{name}: qkv or attention output differs from the default pair's at context {L}")

        best = {c: [math.inf, math.inf] for c in cols}
        for _ in range(a.rounds):
            for c in cols:
                g = gemvs[c]

                def pair(g=g):
                    for layer in range(LAYERS):
                        g(layer)
                        attention(layer)

                def alone(g=g):
                    for layer in range(LAYERS):
                        g(layer)

                best[c][0] = min(best[c][0], time_graph(pair, a.replays))
                best[c][1] = min(best[c][1], time_graph(alone, a.replays))
        def attn_alone():
            for layer in range(LAYERS):
                attention(layer)

        att = min(time_graph(attn_alone, a.replays) for _ in range(a.rounds))
        base_gemv = best["default"][1]
        kv_bytes = L * NKV * 512
        cells = [f"{p:.2f} | {gm:.2f} | {p - base_gemv:.2f}" for p, gm in (best[c] for c in cols)]
        print(f"| {L} | " + " | ".join(cells) + f" | {att:.2f} | {(N * K * 2 + kv_bytes) / BW:.2f} | "
              f"{kv_bytes / BW:.2f} |", flush=True)
        del kv, bt
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
