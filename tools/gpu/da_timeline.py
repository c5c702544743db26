"""Where a decode_attention_cluster call spends its time: a per-warp %globaltimer timeline.

Runs on the GPU machine (torch, cuda.bindings, nvcc):

    python3 tools/gpu/da_timeline.py [--lengths 512 4096] [--reps 5]

Builds tools/kernels-src/decode_attention.cu with -DDA_TIMELINE (lane 0 of every warp of the cluster form
stamps %globaltimer, ns, at 8 points: entry, seq_lens and block table loaded, its first pages' copies issued (the
PDL build: the DA_PRE_PAGES issued before its wait),
first page in shared memory, page loop done, CTA merge done, the cluster's partials in (its receive mbarrier's
bytes landed; with DA_MERGE_BARRIER the cluster barrier passed), exit; the default build has none of it) and,
per context length, replays a CUDA graph of 36 back-to-back calls (one per layer of a 36-layer pool, 32 q
heads over 8 kv heads: the 4B shape) and reads the last call's stamps. Prints, median over `--reps` replays,
each point measured from the grid's first entry (median and max over the 256 warps; 512 with DA_WARPS=8), and the span (first
entry to last exit) beside the K+V floor (bytes / 4.2 TB/s). `--define M=V`: an extra build macro (e.g.
DA_CLUSTER_SLOTS=3; the launch's block and shared memory follow da_variants.cluster_smem, which refuses the gone
DA_BULK: the head-major KV layout is every build's). NOTES.md 21 asks the question: where are the ~4.6 µs of every call
that are not streaming.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from cuda.bindings import driver as cu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests-integration" / "gpu"))

import build_kernels  # noqa: E402
from bench_gemv import F32, I32, P, capture, check  # noqa: E402
from da_variants import cluster_smem, cluster_warps  # noqa: E402
from gpu_helpers import BF, D, DEV, NKV, pool  # noqa: E402

POINTS = ("entry", "seq_lens+bt", "pages issued", "first page", "loop done", "CTA merge", "partials in", "exit")
NQ, LAYERS, CLUSTER = 32, 36, 8


def timeline_function(defines=()):
    """(function, device pointer of da_timeline, its bytes) of the -DDA_TIMELINE build (and -D`defines`)."""
    with tempfile.TemporaryDirectory() as tmp:  # as build_kernels.py builds the shipped module, plus the macros
        data = build_kernels.finish_cuda(build_kernels.start_cuda("decode_attention.cu", tmp, ("DA_TIMELINE", *defines),
                                                                  "decode_attention_timeline.cubin"))
    mod = check(cu.cuModuleLoadData(data))
    f = check(cu.cuModuleGetFunction(mod, b"decode_attention_cluster"))
    check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                cluster_smem(list(defines))))
    ptr, size = check(cu.cuModuleGetGlobal(mod, b"da_timeline"))
    return f, ptr, size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--define", action="append", default=[], help="an extra build macro, e.g. DA_CLUSTER_SLOTS=3")
    args = ap.parse_args(argv)
    try:
        cluster_smem(args.define)  # checks the macros (DA_CLUSTER_SLOTS, DA_WARPS; no DA_BULK) before the build
    except ValueError as e:
        ap.error(str(e))
    torch.zeros(1, device=DEV)
    f, ptr, size = timeline_function(args.define)
    smem = cluster_smem(args.define)  # this build's dynamic shared memory (the catalog's for the default build)
    warps = cluster_warps(args.define)
    host = np.zeros(size // 8, dtype=np.uint64)
    q_stride = (NQ + 2 * NKV) * D
    for L in args.lengths:
        kv, bt, layer_elems, page_elems = pool(L, LAYERS)
        seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        qkv = torch.randn(LAYERS, q_stride, device=DEV).to(BF)
        out = torch.empty(LAYERS, NQ * D, device=DEV, dtype=BF)

        def calls():
            stream = torch.cuda.current_stream().cuda_stream
            for l in range(LAYERS):
                vals = (qkv[l].data_ptr(), kv[l * layer_elems:].data_ptr(), bt.data_ptr(), seq.data_ptr(),
                        out[l].data_ptr(), NQ, NKV, q_stride, bt.numel(), page_elems * 2, 1 / math.sqrt(D))
                check(cu.cuLaunchKernel(f, NKV, CLUSTER, 1, 32 * warps, 1, 1, smem, stream,
                                        (vals, (P, P, P, P, P, I32, I32, I32, I32, I32, F32)), 0))

        graph = capture(calls)
        rows = []
        for _ in range(args.reps):
            graph.replay()
            torch.cuda.synchronize()
            check(cu.cuMemcpyDtoH(host.ctypes.data, ptr, size))
            t = host.reshape(NKV * CLUSTER * warps, len(POINTS)).astype(np.int64)
            rows.append((t - t[:, 0].min()) / 1e3)  # µs from the grid's first entry
        med = np.median(np.stack(rows), axis=0)  # [warps, points]
        floor = L * NKV * 512 / 4.2e12 * 1e6
        print(f"\nL = {L}: span {med[:, -1].max():.2f} µs (first entry to last exit), K+V floor {floor:.2f} µs")
        print(f"  {'point':<16} {'median µs':>10} {'max µs':>8}")
        for i, name in enumerate(POINTS):
            print(f"  {name:<16} {statistics.median(med[:, i]):>10.2f} {med[:, i].max():>8.2f}")
        del kv, graph
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
