"""A decode-token megakernel probe (issue 9; NOTES.md 46): can one persistent launch per token, whose weight stream does
not stop at op boundaries, run the 4B decode GEMVs faster than the five-launch layer?

Runs on the GPU machine (torch, cuda.bindings, nvcc):

    python3 tools/gpu/megakernel_probe.py [--layers 36] [--iters 30] [--check-layers 2]

tools/gpu/megakernel_probe.cu's kernel runs, per launch, one decode token of a random-weight Qwen3-4B without its
attention (the o GEMV reads the first 4,096 qkv outputs, as the no-attention what-if of NOTES.md 45): the embedding,
36 x [qkv with the norm, o + residual, gate_up with the norm and SiLU-and-mul, down + residual], the final norm,
lm_head and the argmax, whose token feeds the next launch's embedding. Prints:

- numerics: one launch over `--check-layers` layers with a separate output buffer per op, each op checked against
  float64 on the inputs it read (bf16 outputs in ulps of the reference; the token's float64 logit against the
  largest);
- determinism: the tokens of 8 chained launches, twice from the same start;
- ms per token (median of `--iters` back-to-back launches, CUDA events) for the full kernel, without the waits
  between ops (mode 2: what the dependencies cost), and with the consumers doing nothing (mode 1: the weight stream
  alone; mode 6: the math without the waits and the input loads), beside the floor (weight bytes / the measured device-to-device copy bandwidth).

Compare with kern-run's no-attention what-if (tools/manifest_whatif.py --drop attn under tools/gpu/program_sweep.py),
2.339–2.358 ms/token in session 15. Nothing here is a provider kernel.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
try:
    import torch
    from bench_gemv import F32, I32, P, check, copy_bandwidth, cu, launch_function  # noqa: E402
except ImportError:  # the CPU tests use the build and ABI helpers only
    torch = None

HIDDEN, QKV, ATTN, INTER, VOCAB = 2560, 6144, 4096, 9728, 151936  # Qwen3-4B
EPS = 1e-6
DEFAULTS = {"NW": 8, "S": 2, "SLOT_BYTES": 10240, "INFLIGHT": 0, "POLL_NS": 32, "PF_AHEAD": 0}  # 0: INFLIGHT's own default (NW·S)  # megakernel_probe.cu's build macros and their defaults
XS_BYTES = 19456
EMBED, NORM, NORM_SILU, RESID, LM_ARGMAX = range(5)
SOURCE = ROOT / "tools" / "gpu" / "megakernel_probe.cu"
ENTRY = "kern_megakernel_probe"
#: The entry's parameters, as Probe.launch passes them: (name, size in bytes).
LAUNCH_PARAMS = (("ops", 8), ("num_ops", 4), ("counters", 8), ("eps", 4), ("token", 8), ("epoch", 4),
                 ("arg_val", 8), ("arg_idx", 8), ("mode", 4), ("times", 8), ("trace", 8))
TMAXP = 8192  # pieces block 0 traces (megakernel_probe.cu)
OP = np.dtype([("w", "<u8"), ("x", "<u8"), ("norm_w", "<u8"), ("y", "<u8"), ("res", "<u8"),
               ("n", "<i4"), ("k", "<i4"), ("kind", "<i4"), ("unused", "<i4")])
assert OP.itemsize == 56


class Model:
    """Random bf16 Qwen3-4B weights without the attention's own (q/k norms): the tied embedding / lm_head table
    [VOCAB, HIDDEN], per layer qkv [6144, 2560], o [2560, 4096], gate_up pair-interleaved [19456, 2560] (gate row i
    then up row i), down [2560, 9728] and the two RMS norm weights, and the final norm."""

    def __init__(self, layers: int, seed: int = 0):
        g = torch.Generator(device="cuda").manual_seed(seed)

        def w(*shape, std=0.02):
            return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * std).to(torch.bfloat16)

        def nw():
            return (1.0 + 0.1 * torch.randn(HIDDEN, generator=g, device="cuda")).to(torch.bfloat16)

        self.table = w(VOCAB, HIDDEN, std=0.5)
        self.layers = [dict(qkv=w(QKV, HIDDEN), o=w(HIDDEN, ATTN), gate_up=w(2 * INTER, HIDDEN),
                            down=w(HIDDEN, INTER), in_norm=nw(), post_norm=nw()) for _ in range(layers)]
        self.final_norm = nw()

    def weight_bytes(self) -> int:
        per = sum(t.numel() * 2 for l in self.layers for n, t in l.items() if not n.endswith("norm"))
        return per + self.table.numel() * 2


def op_list(m: Model, token_table: torch.Tensor, separate: bool):
    """The op table (numpy OP records) and the buffers it writes: one per op when `separate` (for the numerics
    check), else the decode program's reuse (residual in place, one qkv and one act buffer)."""
    bf = dict(dtype=torch.bfloat16, device="cuda")
    ops, bufs = [], []

    def buf(n):
        t = torch.full((n,), float("nan"), **bf)  # poisoned: every element must be written
        bufs.append(t)
        return t

    def add(kind, w, x, norm_w, y, res, n, k):
        ops.append((w.data_ptr(), 0 if x is None else x.data_ptr(), 0 if norm_w is None else norm_w.data_ptr(),
                    0 if y is None else y.data_ptr(), 0 if res is None else res.data_ptr(), n, k, kind, 0))

    res = buf(HIDDEN)
    add(EMBED, token_table, None, None, res, None, HIDDEN, HIDDEN)
    qkv_s, act_s = (None, None) if separate else (buf(QKV), buf(INTER))
    trace = [("embed", res)]
    for l in m.layers:
        qkv = buf(QKV) if separate else qkv_s
        add(NORM, l["qkv"], res, l["in_norm"], qkv, None, QKV, HIDDEN)
        res2 = buf(HIDDEN) if separate else res
        add(RESID, l["o"], qkv, None, res2, res, HIDDEN, ATTN)
        act = buf(INTER) if separate else act_s
        add(NORM_SILU, l["gate_up"], res2, l["post_norm"], act, None, INTER, HIDDEN)
        res3 = buf(HIDDEN) if separate else res2
        add(RESID, l["down"], act, None, res3, res2, HIDDEN, INTER)
        trace += [("qkv", qkv), ("o", res2), ("gate_up", act), ("down", res3)]
        res = res3
    add(LM_ARGMAX, token_table, res, m.final_norm, None, None, VOCAB, HIDDEN)
    table = np.array(ops, dtype=OP)
    return torch.from_numpy(table.view(np.uint8)).cuda(), len(ops), trace, bufs


def config(defines: dict[str, int]) -> dict[str, int]:
    """The build macros with the defaults filled in."""
    return {**DEFAULTS, **defines}


def threads_and_smem(cfg: dict[str, int]) -> tuple[int, int]:
    """Threads per block and dynamic shared memory (bytes) of a build `cfg` (megakernel_probe.cu's layout)."""
    return (cfg["NW"] + 1) * 32, cfg["NW"] * cfg["S"] * cfg["SLOT_BYTES"] + XS_BYTES


def nvcc_command(cfg: dict[str, int], out: Path, nvcc: str | None = None) -> list[str]:
    """The nvcc command that builds `cfg` into the cubin `out`."""
    nvcc = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return [nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v",
            *(f"-D{k}={v}" for k, v in cfg.items() if v), "-o", str(out), str(SOURCE)]


class Probe:
    """megakernel_probe.cu built with `defines` (NW consumer warps, S slots each of SLOT_BYTES), loaded, one block
    per SM."""

    def __init__(self, defines: dict[str, int]):
        check(cu.cuInit(0))
        torch.zeros(1, device="cuda")
        self.cfg = config(defines)
        self.threads, self.smem = threads_and_smem(self.cfg)
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "mk.cubin"
            subprocess.run(nvcc_command(self.cfg, out), check=True)
            self.module = check(cu.cuModuleLoadData(out.read_bytes()))
        self.f = check(cu.cuModuleGetFunction(self.module, ENTRY.encode()))
        check(cu.cuFuncSetAttribute(self.f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    self.smem))
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        per_sm = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.f, self.threads, self.smem))
        if per_sm < 1:
            raise SystemExit(f"megakernel_probe: a {self.threads}-thread block with {self.smem} bytes of shared memory "
                             "does not fit an SM")
        self.grid = self.sms  # one block per SM: all resident at once (the kernel's waits need it)
        self.counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
        self.arg_val = torch.zeros(self.grid, dtype=torch.float32, device="cuda")
        self.arg_idx = torch.zeros(self.grid, dtype=torch.int32, device="cuda")
        self.epoch = 0  # launches of the current op list that advanced the counters
        self.ops_ptr = 0

    def name(self) -> str:
        c = self.cfg
        return (f"NW={c['NW']} S={c['S']} SLOT={c['SLOT_BYTES']} INFLIGHT={c['INFLIGHT'] or c['NW'] * c['S']} "
                f"POLL={c['POLL_NS']} PF_AHEAD={c['PF_AHEAD']}")

    def launch(self, ops: torch.Tensor, num_ops: int, token: torch.Tensor, mode: int = 0, times: int = 0,
               trace: int = 0):
        if ops.data_ptr() != self.ops_ptr:  # another op list: its counters start from zero
            self.counters.zero_()
            self.epoch, self.ops_ptr = 0, ops.data_ptr()
        if not mode & 1:
            self.epoch += 1
        args = ((ops.data_ptr(), P), (num_ops, I32), (self.counters.data_ptr(), P), (EPS, F32), (token.data_ptr(), P),
                (max(self.epoch, 1), ctypes.c_uint), (self.arg_val.data_ptr(), P), (self.arg_idx.data_ptr(), P),
                (mode, I32), (times, P), (trace, P))
        kp = (tuple(a for a, _ in args), tuple(t for _, t in args))
        launch_function(self.f, (self.grid, 1, 1), (self.threads, 1, 1), self.smem,
                        cu.CUstream(torch.cuda.current_stream().cuda_stream), kp)


def bf16_ulps(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|y − ref| in units of the bf16 spacing at |ref| (float64)."""
    r = ref.double().abs().clamp_min(1e-30)
    ulp = torch.pow(2.0, torch.floor(torch.log2(r)) - 7)
    return (y.double() - ref.double()).abs() / ulp


def norm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """HF Qwen3RMSNorm in bf16: weight · bf16(x · rsqrt(mean(x²) + eps)), as float64."""
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean() + EPS)).to(torch.bfloat16)
    return (w * h).double()


def check_numerics(probe: Probe, m: Model) -> bool:
    token = torch.tensor([12345], dtype=torch.int64, device="cuda")
    ops, n, trace, _ = op_list(m, m.table, separate=True)
    probe.launch(ops, n, token)
    torch.cuda.synchronize()
    ok = True
    res_in = None
    worst = {}
    for i, (name, y) in enumerate(trace):
        if name == "embed":
            ref = m.table[12345].double()
        else:
            l = m.layers[(i - 1) // 4]
            if name == "qkv":
                ref = l["qkv"].double() @ norm_ref(res_in, l["in_norm"])
                qkv = y
            elif name == "o":
                ref = (res_in.double() + (l["o"].double() @ qkv[:ATTN].double()).to(torch.bfloat16).double())
                res_mid = y
            elif name == "gate_up":
                gu = (l["gate_up"].double() @ norm_ref(res_mid, l["post_norm"])).to(torch.bfloat16)
                g, u = gu[0::2].float(), gu[1::2].float()
                ref = ((g / (1 + torch.exp(-g))).to(torch.bfloat16).double() * u.double())
                act = y
            else:
                ref = (res_mid.double() + (l["down"].double() @ act.double()).to(torch.bfloat16).double())
        if name in ("embed", "o", "down"):
            res_in = y
        ulps = bf16_ulps(y, ref)
        bad = int(torch.isnan(y).sum())
        w = worst.setdefault(name, [0.0, 0.0, 0.0, 0])
        w[0] = max(w[0], float(ulps.max()))
        w[1] = max(w[1], float((ulps > 0.51).double().mean()))
        w[2] = max(w[2], float((ulps > 1.01).double().mean()))
        w[3] += bad
        # a flipped bf16 rounding inside (the dot before the residual add, g before SiLU) costs an ulp of the
        # inner value: rare, but more than an ulp of the result where they cancel
        if bad or float((ulps > 1.01).double().mean()) > 0.005:
            ok = False
    for name, (mx, half, one, bad) in worst.items():
        print(f"  {name:8s} max {mx:.2f} ulp of the float64 reference; over half an ulp {100 * half:.2f}%, over one "
              f"{100 * one:.3f}%; {bad} NaN")
    logits = (m.table.double() @ norm_ref(res_in, m.final_norm)).to(torch.bfloat16).double()
    tok = int(token.item())
    top = float(logits.max())
    gap = top - float(logits[tok])
    print(f"  argmax   token {tok}: its logit {float(logits[tok]):.5f}, the largest {top:.5f} (token "
          f"{int(logits.argmax())}), gap {gap:.2g}")
    if gap > 0.01 * abs(top):
        ok = False
    return ok


def chained_tokens(probe: Probe, ops, n, steps=8):
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    out = []
    for _ in range(steps):
        probe.launch(ops, n, token)
        out.append(token.clone())
    torch.cuda.synchronize()
    return [int(t.item()) for t in out]


def per_launch_ms(probe: Probe, ops, n, mode, iters):
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    for _ in range(3):
        probe.launch(ops, n, token, mode)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        probe.launch(ops, n, token, mode)
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))


OP_NAMES = ["embed"] + ["qkv", "o", "gate_up", "down"] * 1000


def timeline(probe: Probe, ops, n, layers: int) -> None:
    """One launch with per-block, per-op finish stamps (mode 0, then mode 2): per op kind, µs per op on the critical
    path (the last block's finish to the last block's finish), the median block's own time for it (from the previous
    op's last finish), and the spread of the blocks' totals when nothing waits."""
    times = torch.zeros(probe.grid * n, dtype=torch.int64, device="cuda")
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    for mode in (0, 2):
        probe.launch(ops, n, token, mode)
        probe.launch(ops, n, token, mode, times.data_ptr())
        torch.cuda.synchronize()
        t = (times.view(probe.grid, n).double() - float(times.min())) / 1e3  # µs
        last = t.max(dim=0).values
        if mode == 0:
            crit, own = {}, {}
            for j in range(1, n - 1):
                name = OP_NAMES[j]
                crit.setdefault(name, []).append(float(last[j] - last[j - 1]))
                own.setdefault(name, []).append(float((t[:, j] - last[j - 1]).median()))
            print("  timeline, waits on (µs per op): " + ", ".join(
                f"{k} {statistics.mean(crit[k]):.2f} (median block {statistics.mean(own[k]):.2f})" for k in crit)
                  + f"; lm_head+argmax {float(last[-1] - last[-2]):.1f}; total {float(last[-1]):.0f}")
        else:
            tot = t[:, -2] - t[:, 0]
            print(f"  timeline, no waits: blocks finish the last layer after {float(tot.min()):.0f}–{float(tot.max()):.0f} µs "
                  f"(median {float(tot.median()):.0f})")


def piece_timeline(probe: Probe, ops, n) -> None:
    """Block 0's pieces in one launch (mode 0): per op kind, averaged over the layers, how many of the op's pieces
    were issued before its dependency was met and how many were ready when its consumers came to them, the input
    load, and the op's span (dependency met → last piece released) against the block's share of the stream."""
    trace = torch.zeros(4 * TMAXP + 2048, dtype=torch.int64, device="cuda")
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    probe.launch(ops, n, token)
    probe.launch(ops, n, token, 0, 0, trace.data_ptr())
    torch.cuda.synchronize()
    t = trace.cpu().double()
    issue, ready, done, op_of = t[:TMAXP], t[TMAXP:2 * TMAXP], t[2 * TMAXP:3 * TMAXP], t[3 * TMAXP:4 * TMAXP]
    dep, inp = t[4 * TMAXP:4 * TMAXP + 1024], t[4 * TMAXP + 1024:4 * TMAXP + 2048]
    npieces = int((issue > 0).sum())
    rows = {}
    for j in range(1, n - 1):
        sel = (op_of[:npieces] == j).nonzero().flatten()
        if len(sel) == 0:
            continue
        r = rows.setdefault(OP_NAMES[j], [])
        r.append((len(sel), int((issue[sel] < dep[j]).sum()), int((ready[sel] <= inp[j] + 50).sum()),
                  float(inp[j] - dep[j]) / 1e3, float(done[sel].max() - dep[j]) / 1e3,
                  float(dep[j + 1] - dep[j]) / 1e3))
    print("  block 0's pieces per op (mean over layers): pieces | issued before the dependency was met | ready "
          "when the consumers came | input load µs | dependency → last release µs | dependency → next op's µs")
    for k, r in rows.items():
        m = [statistics.mean(x[i] for x in r) for i in range(6)]
        print(f"    {k:8s} {m[0]:5.1f} | {m[1]:5.1f} | {m[2]:5.1f} | {m[3]:5.2f} | {m[4]:6.2f} | {m[5]:6.2f}")


def parse_config(text: str) -> dict[str, int]:
    """`NW=8,S=2,SLOT_BYTES=10240` -> a dict of build macros (unknown names refused)."""
    cfg = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name not in DEFAULTS or not value.isdigit():
            raise SystemExit(f"megakernel_probe: `{part}`: expected NAME=INT with NAME in {', '.join(DEFAULTS)}")
        cfg[name] = int(value)
    return cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--check-layers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--config", action="append", default=[], metavar="NW=8,S=2,SLOT_BYTES=10240",
                    help="a build of the kernel to time (repeatable; default: the defaults)")
    a = ap.parse_args(argv)
    configs = [parse_config(c) for c in a.config] or [{}]
    small = Model(a.check_layers, seed=1)
    m = Model(a.layers, seed=2)
    bw = copy_bandwidth()
    floor = m.weight_bytes() / bw * 1e3
    print(f"{a.layers} layers, {m.weight_bytes() / 1e9:.3f} GB of weights; copy bandwidth {bw / 1e12:.3f} TB/s, "
          f"floor {floor:.3f} ms")
    modes = ((0, "full"), (2, "no waits"), (6, "math alone"), (1, "stream alone"))
    rows, ok_all = [], True
    for cfg in configs:
        probe = Probe(cfg)
        print(f"{probe.name()}: grid {probe.grid} x {probe.threads} threads, {probe.smem} bytes of shared memory")
        ok = check_numerics(probe, small)
        ops, n, _, _ = op_list(m, m.table, separate=False)
        t1, t2 = chained_tokens(probe, ops, n), chained_tokens(probe, ops, n)
        print(f"  numerics ({a.check_layers} layers): {'ok' if ok else 'FAILED'}; tokens of 8 chained launches: {t1} "
              f"({'the same' if t1 == t2 else 'DIFFER: ' + str(t2)} twice)")
        ok_all &= ok and t1 == t2
        timeline(probe, ops, n, a.layers)
        piece_timeline(probe, ops, n)
        rows.append((probe.name(), [per_launch_ms(probe, ops, n, mode, a.iters) for mode, _ in modes]))
    print("\nms per token (median of back-to-back launches; in brackets % of the floor)\n")
    print("| build | " + " | ".join(w for _, w in modes) + " |")
    print("|---|" + "---:|" * len(modes))
    for name, ms in rows:
        print(f"| {name} | " + " | ".join(f"{t:.3f} ({100 * floor / t:.0f}%)" for t in ms) + " |")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
