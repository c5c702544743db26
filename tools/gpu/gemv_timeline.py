"""Where one decode token's GEMV chain spends its time: a per-block %globaltimer timeline.

Runs on the GPU machine (torch, cuda.bindings, nvcc):

    python3 tools/gpu/gemv_timeline.py [--geometry 4b] [--reps 5] [--define GEMV_PRE_STAGES=1]

Builds tools/kernels-src/gemv.cu twice, as build_kernels.py does and with -DGEMV_TIMELINE (thread 0 of
every block records its weight pointer, n, block and SM, and %globaltimer at entry, after the pre-wait
weight stages, when griddepcontrol.wait returned, after the prologue, after the last FMA and before the
stores; the default module has none of it), captures one decode token's GEMVs (tools/bench_gemv.py's
token_chain: per layer norm+qkv, o + residual, norm+gate_up+SiLU, down + residual, then norm+lm_head) as a
PDL chain in a CUDA graph for each, and prints

- both chains' median replay time (what the stamps cost) and the floor (weight bytes / measured copy
  bandwidth);
- per launch (the first two layers and the last, median of --reps replays; µs from the chain's first
  block entry): first and last block entry, first and median wait return, first and last exit, the span
  (last exit − the previous launch's last exit) next to its floor, the median prologue and dot loop of a
  block, the gap (first wait return − the previous launch's last exit: grid completion and the PDL
  release, plus the previous launch's stores) and how many blocks entered before the previous launch's
  last exit;
- per shape, means over the layers of the same.

It answers NOTES.md entry 26's question: of the chain's excess over its floor, how much is the kernel
boundary (the gap), and how much each launch's own ramp and tail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from cuda.bindings import driver as cu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import build_kernels  # noqa: E402
from bench_gemv import Gemv, capture, check, copy_bandwidth, event_times, gemv_cubin, rule_ksplit, token_chain  # noqa: E402
from bench_pdl import token_buffers  # noqa: E402

RECORD = 10  # u64 per block record (gemv.cu's header: w, n << 32 | block, smid, 6 stamps, 1 spare)
ORDER = {"qkv": 0, "o": 1, "gate_up": 2, "down": 3, "lm_head": 4}


def cubins(defines: list[str]) -> tuple[bytes, bytes]:
    """(default gemv.cu module, the -DGEMV_TIMELINE module), both with the extra `defines`."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = build_kernels.finish_cuda(build_kernels.start_cuda("gemv.cu", tmp, tuple(defines), "plain.cubin"))
        timed = build_kernels.finish_cuda(build_kernels.start_cuda("gemv.cu", tmp, ("GEMV_TIMELINE", *defines), "tl.cubin"))
    return plain, timed


def launches(records: np.ndarray, names: dict[int, tuple[int, str, int]]) -> list[dict]:
    """Per launch in chain order: the blocks' stamps (µs from the first entry) and its identity."""
    t0 = records[:, 3].min()
    by = {}
    for r in records:
        layer, shape, _ = names[int(r[0])]
        by.setdefault((layer, ORDER[shape]), []).append(r)
    out = []
    for key in sorted(by):
        a = np.array(by[key])
        t = (a[:, 3:9] - t0) / 1e3  # entry, issued, wait returned, prologue done, loop done, before stores
        layer, shape, nbytes = names[int(a[0, 0])]
        out.append(dict(layer=layer, shape=shape, bytes=nbytes, blocks=len(a), entry=t[:, 0], wait=t[:, 2],
                        exit=t[:, 5], prologue=np.median(t[:, 3] - t[:, 2]), loop=np.median(t[:, 4] - t[:, 3])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--define", action="append", default=[], help="an extra gemv.cu build macro, e.g. GEMV_PRE_STAGES=1")
    args = ap.parse_args(argv)
    plain, timed = cubins(args.define)
    persist = gemv_cubin(None, "gemv_persist.cu", "kern_gemvp_m1")
    gs = {"default": Gemv(plain, persist), "timeline": Gemv(timed, persist)}
    bw = copy_bandwidth()
    sh, layers, weights, lm, h, resid0, resid, nw, qkv, attn, act = token_buffers(args.geometry)
    logits = torch.empty(1, sh["lm_head"][0], device="cuda", dtype=torch.bfloat16)
    # the manifests' ksplit: since session 10 o runs at 2 (it follows the attention in the program, not here), so
    # o's rows are not comparable with session 6's records (ksplit 1)
    ks = {nm: int(rule_ksplit(nm, *sh[nm])) for nm in sh}
    graphs = {}
    for name, g in gs.items():
        resid.copy_(resid0)
        graphs[name] = capture(token_chain(g, sh, weights, lm, resid, nw, qkv, attn, act, logits, ks, True))
    times = {name: [] for name in graphs}
    for _ in range(5):
        for name, graph in graphs.items():
            times[name] += event_times(graph.replay, 10, warmup=2)
    total = sum(w.numel() * 2 for lw in weights for w in lw.values()) + lm.numel() * 2
    print(f"{args.geometry}: copy bandwidth {bw / 1e12:.3f} TB/s, floor {total / bw * 1e3:.3f} ms; PDL chain "
          f"{statistics.median(times['default']):.3f} ms, timeline build {statistics.median(times['timeline']):.3f} ms")

    module = gs["timeline"].modules[0]
    tl_ptr, tl_size = check(cu.cuModuleGetGlobal(module, b"gemv_tl"))
    next_ptr, _ = check(cu.cuModuleGetGlobal(module, b"gemv_tl_next"))
    names = {w.data_ptr(): (i, nm, w.numel() * 2) for i, lw in enumerate(weights) for nm, w in lw.items()}
    names[lm.data_ptr()] = (layers, "lm_head", lm.numel() * 2)
    host = np.zeros(tl_size // 8, dtype=np.uint64)
    count = np.zeros(1, dtype=np.uint32)
    reps = []
    for _ in range(args.reps):
        check(cu.cuMemsetD32(next_ptr, 0, 1))
        resid.copy_(resid0)
        graphs["timeline"].replay()
        torch.cuda.synchronize()
        check(cu.cuMemcpyDtoH(host.ctypes.data, tl_ptr, tl_size))
        check(cu.cuMemcpyDtoH(count.ctypes.data, next_ptr, 4))
        if count[0] * RECORD > host.size:
            raise SystemExit(f"{count[0]} blocks > the build's GEMV_TL_MAX records: rebuild with a larger one")
        reps.append(launches(host[: int(count[0]) * RECORD].reshape(-1, RECORD).astype(np.int64), names))

    def med(i, fn):
        return statistics.median(fn(rep, i) for rep in reps)

    rows = []
    for i, first in enumerate(reps[0]):
        prev_exit = med(i - 1, lambda r, j: r[j]["exit"].max()) if i else 0.0
        row = dict(
            name=f"{first['layer']}:{first['shape']}", shape=first["shape"], mb=first["bytes"] / 1e6, blocks=first["blocks"],
            first=med(i, lambda r, j: r[j]["entry"].min()), last_entry=med(i, lambda r, j: r[j]["entry"].max()),
            wait_first=med(i, lambda r, j: r[j]["wait"].min()), wait_med=med(i, lambda r, j: np.median(r[j]["wait"])),
            exit_first=med(i, lambda r, j: r[j]["exit"].min()), exit_last=med(i, lambda r, j: r[j]["exit"].max()),
            prologue=med(i, lambda r, j: r[j]["prologue"]), loop=med(i, lambda r, j: r[j]["loop"]),
            floor=first["bytes"] / bw * 1e6,
            early=med(i, lambda r, j: int((r[j]["entry"] < r[j - 1]["exit"].max()).sum()) if j else 0))
        row["span"] = row["exit_last"] - (prev_exit if i else row["first"])
        row["gap"] = row["wait_first"] - prev_exit if i else 0.0
        rows.append(row)
    print(f"\nper launch, µs from the chain's first block entry (median of {args.reps} replays)")
    cols = ("first", "last_entry", "wait_first", "wait_med", "exit_first", "exit_last", "span", "floor", "prologue", "loop", "gap")
    print(f"{'launch':>12} {'MB':>6} {'blocks':>6} " + " ".join(f"{c:>10}" for c in cols) + f" {'early':>6}")
    shown = [r for r in rows if r["name"].split(":")[0] in ("0", "1", str(layers - 1), str(layers))]
    for r in shown:
        print(f"{r['name']:>12} {r['mb']:6.1f} {r['blocks']:6d} " + " ".join(f"{r[c]:10.2f}" for c in cols) + f" {r['early']:6.0f}")
    print("\nper shape, mean over layers (excess = span − floor; early = blocks entered before the previous launch's last exit)")
    for shape in ORDER:
        rs = [r for r in rows if r["shape"] == shape]
        if not rs:
            continue
        mean = {c: float(np.mean([r[c] for r in rs])) for c in ("span", "floor", "gap", "prologue", "loop")}
        early = float(np.mean([r["early"] / r["blocks"] for r in rs]))
        print(f"  {shape:8s} x{len(rs):3d}: span {mean['span']:7.2f}  floor {mean['floor']:7.2f}  "
              f"excess {mean['span'] - mean['floor']:6.2f}  gap {mean['gap']:5.2f}  prologue {mean['prologue']:5.2f}  "
              f"loop {mean['loop']:6.2f}  early {100 * early:4.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
