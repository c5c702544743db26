"""What a kernel boundary costs in a weight-streaming chain, piece by piece (issue 9; NOTES.md entry 27).

Runs on the GPU machine (torch, cuda.bindings, nvcc):

    python3 tools/gpu/boundary_probe.py [--reps 7]

Streams the weight bytes of one Qwen3-4B decode token (36 x [qkv, o, gate_up, down] + lm_head, 8.04 GB, a
random bf16 buffer) with tools/gpu/boundary_probe.cu's kernels, each chain captured in a CUDA graph:

- a PDL chain of 145 launches with gemv.cu's grid shape (16 rows per block) and load pipeline, first with loads
  only, then with each piece of a GEMV's other work added (x prologue after the wait, the FMAs, a residual
  read-add-write or a plain store at the end), and with the mix gemv.cu has (norm GEMVs: prologue + FMAs +
  store; o / down: FMAs + residual);
- the same bytes in persistent launches with a software grid barrier between GEMVs (one launch per layer, or one
  for the whole token; 264 blocks, two per SM);
- one launch streaming all of it (the bound).

Prints ms per token (median replay), % of the copy floor (bytes / measured device-to-device copy bandwidth) and
the cost per launch over the loads-only chain. Nothing here is a provider kernel: it answers where a real GEMV
chain's time over the floor goes, without the real kernels' numerics.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from bench_gemv import I32, Gemv, P, capture, copy_bandwidth, event_times  # noqa: E402

I64 = ctypes.c_int64
LINE = 512  # bytes per warp-load
SMEM = 80 * 1024  # dynamic shared memory per block: at most two blocks per SM, as gemv.cu's 120-register blocks
GRID = 264  # persistent launches: two blocks on each of the H200's 132 SMs
#: one 4B decode token's GEMVs: (name, weight bytes, 512-byte lines per block of gemv.cu's launch, MODE as gemv.cu)
LAYER = [("qkv", 6144 * 2560 * 2, 160, 11), ("o", 2560 * 4096 * 2, 256, 6), ("gate_up", 19456 * 2560 * 2, 160, 11),
         ("down", 2560 * 9728 * 2, 608, 6)]
LM_HEAD = ("lm_head", 151936 * 2560 * 2, 160, 11)
LAYERS = 36
MODES = {0: "loads only", 1: "+ x prologue", 2: "+ FMAs", 4: "+ residual read-add-write", 8: "+ store",
         11: "prologue + FMAs + store (a norm GEMV)", 6: "FMAs + residual (o, down)",
         16: "+ tensor-core dots (mma) instead of FMAs", 25: "prologue + mma + store", 20: "mma + residual"}


class Probe:
    """The probe module and one token's weight stream; `launch` enqueues on torch's current stream."""

    def __init__(self):
        out = Path(tempfile.mkdtemp()) / "boundary_probe.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-o", str(out),
                        str(ROOT / "tools" / "gpu" / "boundary_probe.cu")], check=True)
        self.g = Gemv(out.read_bytes())  # module load and launches (PDL: programmatic stream serialization)
        self.segs = [s for _ in range(LAYERS) for s in LAYER] + [LM_HEAD]
        self.offs = [0]
        for _, nbytes, _, _ in self.segs:
            self.offs.append(self.offs[-1] + nbytes // LINE)
        self.bytes = self.offs[-1] * LINE
        self.w = torch.empty(self.bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        self.x = torch.randn(2560, device="cuda").to(torch.bfloat16)
        self.resid = torch.randn(1 << 17, device="cuda").to(torch.bfloat16)
        self.sink = torch.zeros(1 << 16, device="cuda")
        self.ctr = torch.zeros(4096, dtype=torch.int32, device="cuda")
        self.layer_seg = torch.tensor(self.offs[:5], dtype=torch.int64, device="cuda")  # every layer's, from its start
        self.all_seg = torch.tensor(self.offs, dtype=torch.int64, device="cuda")

    def launch(self, name, grid, args, pdl, smem=SMEM):
        self.g.launch(name, grid, smem, args, pdl)

    def stream(self, mode, first_line, lines, lpb, grid, pdl):
        self.launch(f"stream_mode{mode}", grid, [(self.w.data_ptr() + first_line * LINE, P), (lines, I64), (lpb, I32),
                                                 (self.x.data_ptr(), P), (320, I32), (self.resid.data_ptr(), P),
                                                 (self.sink.data_ptr(), P)], pdl)

    def chain(self, mode=None):
        """145 PDL launches with gemv.cu's grids; mode None: each GEMV's own mix (LAYER's MODE column); "mma": that
        mix with the tensor-core dots instead of the FMAs."""
        def fn():
            for i, (_, _, lpb, own) in enumerate(self.segs):
                lines = self.offs[i + 1] - self.offs[i]
                m = own if mode is None else (own ^ 2 | 16) if mode == "mma" else mode
                self.stream(m, self.offs[i], lines, lpb, -(-lines // lpb), i > 0)
        return fn

    def persistent(self, per_layer):
        def fn():
            self.launch("zero_counters", 1, [(self.ctr.data_ptr(), P), (4096, I32)], False, 0)
            if per_layer:
                for layer in range(LAYERS):
                    self.launch("stream_phases", GRID, [(self.w.data_ptr() + self.offs[4 * layer] * LINE, P),
                                                        (self.layer_seg.data_ptr(), P), (4, I32),
                                                        (self.ctr.data_ptr() + 16 * layer, P), (self.sink.data_ptr(), P)], True)
                i = len(self.segs) - 1
                lines = self.offs[i + 1] - self.offs[i]
                self.stream(0, self.offs[i], lines, LM_HEAD[2], -(-lines // LM_HEAD[2]), True)
            else:
                self.launch("stream_phases", GRID, [(self.w.data_ptr(), P), (self.all_seg.data_ptr(), P),
                                                    (len(self.segs), I32), (self.ctr.data_ptr(), P),
                                                    (self.sink.data_ptr(), P)], True)
        return fn

    def one_launch(self):
        lines = self.offs[-1]
        return lambda: self.stream(0, 0, lines, -(-lines // GRID), GRID, False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    pr = Probe()
    bw = copy_bandwidth()
    floor = pr.bytes / bw * 1e3
    cases = {f"PDL chain, 145 launches: {label}": pr.chain(m) for m, label in MODES.items()}
    cases["PDL chain, 145 launches: gemv.cu's mix (norm GEMVs 11, o / down 6)"] = pr.chain(None)
    cases["PDL chain, 145 launches: the mix with mma (norm GEMVs 25, o / down 20)"] = pr.chain("mma")
    cases[f"persistent, one launch per layer ({GRID} blocks, grid barriers), loads only"] = pr.persistent(True)
    cases[f"persistent, one launch per token ({GRID} blocks, 144 grid barriers), loads only"] = pr.persistent(False)
    cases["one launch, loads only (the bound)"] = pr.one_launch()
    graphs = {k: capture(fn) for k, fn in cases.items()}
    times = {k: [] for k in graphs}
    for _ in range(args.reps):
        for k, g in graphs.items():
            times[k] += event_times(g.replay, 5, warmup=2)
    base = statistics.median(times[next(iter(times))])
    print(f"one 4B token's GEMV bytes: {pr.bytes / 1e9:.2f} GB; copy bandwidth {bw / 1e12:.3f} TB/s, floor {floor:.3f} ms\n")
    print("| chain | ms | % of copy floor | µs per launch over loads only |")
    print("|---|---:|---:|---:|")
    for k, ts in times.items():
        m = statistics.median(ts)
        extra = (m - base) * 1e3 / 145 if k.startswith("PDL") else float("nan")
        print(f"| {k} | {m:.3f} | {100 * floor / m:.1f}% | {'' if extra != extra else f'{extra:+.2f}'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
