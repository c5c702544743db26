"""Where a persistent decode GEMV launch spends its time: a per-warp %globaltimer timeline.

Runs on the GPU machine (torch, cuda.bindings, nvcc):

    python3 tools/gpu/gemvp_timeline.py [--geometry 4b] [--reps 5]

Builds tools/kernels-src/gemv_persist.cu with -DGEMVP_TIMELINE (each warp's lane 0 stamps
%globaltimer, ns, at entry, after issuing its first FIFO fill, once x is in shared memory, when
its first piece has landed, and at exit; the default build has none of it) and, for each GEMV
shape of one decode token, launches it alone after an L2 flush, `--reps` times, and prints the
median over repetitions of: the spread of block entries, each phase measured from the warp's own
entry (median and max over warps), the kernel span (first entry to last exit), the CUDA-event
time and the memory floor (weight bytes / 4.2 TB/s). Then a PDL pair (qkv, then o-proj launched
with programmatic stream serialization): when o's warps enter, issue and see their first bytes,
measured from qkv's last exit. NOTES.md entry 16 asks this question: where do 6–8 µs per
launch go.
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
from bench_gemv import EPS, F32, I32, Gemv, P, check, gemv_cubin, shapes  # noqa: E402
from gemv_plan import plan_gemvp  # noqa: E402

BW = 4.2e12  # bytes/s, the H200's measured copy bandwidth (BENCHMARKS.md), for the floor column
POINTS = ("entry", "issued", "x ready", "first piece", "exit")


def timeline_cubin() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return build_kernels.finish_cuda(build_kernels.start_cuda("gemv_persist.cu", tmp, ("GEMVP_TIMELINE",),
                                                                  "gemv_persist_timeline.cubin"))


class Timeline:
    """One load of the timeline build (its own `gemvp_timeline` global)."""

    def __init__(self, plain: bytes, tl: bytes):
        self.g = Gemv(plain, tl)
        self.ptr, self.size = check(cu.cuModuleGetGlobal(self.g.modules[1], b"gemvp_timeline"))

    def clear(self):
        check(cu.cuMemsetD8(self.ptr, 0, self.size))

    def read(self, grid: int) -> np.ndarray:
        host = np.zeros(self.size // 8, dtype=np.uint64)
        check(cu.cuMemcpyDtoH(host, self.ptr, self.size))
        return host.reshape(256, 8, 5)[:grid].astype(np.int64)


def launch(tl: Timeline, shape: str, n: int, k: int, x, nw, w, y, pdl=False):
    silu = shape == "gate_up"
    nout = n // 2 if silu else n
    plan = plan_gemvp(nout, k, silu)
    if shape in ("o", "down"):
        name, args = "kern_gemvp_residual_m1", [(x.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (nout, I32), (k, I32)]
    else:
        name = "kern_gemvp_norm_silu_m1" if silu else "kern_gemvp_norm_m1"
        args = [(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (nout, I32), (k, I32), (EPS, F32)]
    tl.g.launch(name, plan.grid, plan.smem, args + [(plan.piece_chunks, I32)], pdl)
    return plan.grid


def phases(t: np.ndarray) -> dict[str, float]:
    """µs: entry spread; per phase median/max over warps from each warp's own entry; span."""
    live = t[:, :, 0] > 0
    e = t[:, :, 0][live]
    out = {"entry spread": (e.max() - e.min()) / 1e3}
    for i, name in enumerate(POINTS[1:], 1):
        stamped = live & (t[:, :, i] > 0)  # a warp with no columns stamps no first piece
        d = (t[:, :, i][stamped] - t[:, :, 0][stamped]) / 1e3
        out[f"{name} med"] = float(np.median(d))
        out[f"{name} max"] = float(d.max())
    out["span"] = (t[:, :, 4][live].max() - e.min()) / 1e3
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    plain, tlc = gemv_cubin(None), timeline_cubin()
    a, b = Timeline(plain, tlc), Timeline(plain, tlc)
    sh, _ = shapes(args.geometry)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*s, scale=1.0):
        return (torch.randn(*s, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    bufs = {}
    for name, (n, k) in sh.items():
        bufs[name] = (randn(1, k), (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16),
                      randn(n, k, scale=0.05), randn(1, n))
    print(f"per-warp timeline, µs from each warp's own entry (median over warps / max), median of {args.reps} launches, "
          "L2 flushed before each")
    cols = ["entry spread", "issued med", "x ready med", "x ready max", "first piece med", "first piece max",
            "exit med", "exit max", "span"]
    print(f"{'shape':8s} {'floor':>6s} {'event':>6s} " + " ".join(f"{c:>15s}" for c in cols))
    for name, (n, k) in sh.items():
        x, nw, w, y = bufs[name]
        rows, ev = [], []
        for _ in range(args.reps):
            flush.zero_()
            a.clear()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            grid = launch(a, name, n, k, x, nw, w, y)
            e.record()
            torch.cuda.synchronize()
            ev.append(s.elapsed_time(e) * 1e3)
            rows.append(phases(a.read(grid)))
        med = {c: statistics.median(r[c] for r in rows) for c in cols}
        print(f"{name:8s} {n * k * 2 / BW * 1e6:6.1f} {statistics.median(ev):6.1f} " + " ".join(f"{med[c]:15.2f}" for c in cols))

    # PDL pair: qkv, then o-proj with programmatic stream serialization
    (nq, kq), (no, ko) = sh["qkv"], sh["o"]
    print("\nPDL pair qkv -> o (µs from qkv's last warp exit; negative = before it):")
    res = []
    for _ in range(args.reps):
        flush.zero_()
        a.clear()
        b.clear()
        xq, nwq, wq, yq = bufs["qkv"]
        xo, _, wo, yo = bufs["o"]
        ga = launch(a, "qkv", nq, kq, xq, nwq, wq, yq)
        gb = launch(b, "o", no, ko, xo, None, wo, yo, pdl=True)
        torch.cuda.synchronize()
        ta, tb = a.read(ga), b.read(gb)
        end_a = ta[:, :, 4][ta[:, :, 0] > 0].max()
        live = tb[:, :, 0] > 0
        res.append({p: (np.median(tb[:, :, i][live & (tb[:, :, i] > 0)]) - end_a) / 1e3 for i, p in enumerate(POINTS)}
                   | {"o first entry": (tb[:, :, 0][live].min() - end_a) / 1e3,
                      "qkv span": (end_a - ta[:, :, 0][ta[:, :, 0] > 0].min()) / 1e3,
                      "o span": (tb[:, :, 4][live].max() - tb[:, :, 0][live].min()) / 1e3})
    for key in ("qkv span", "o first entry", *(f"{p}" for p in POINTS), "o span"):
        print(f"  {key:14s} {statistics.median(r[key] for r in res):8.2f}" + ("  (o, median over warps)" if key in POINTS else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
