"""A decode-token megakernel probe (issue 9; NOTES.md 46): can one persistent launch per token, whose weight stream does
not stop at op boundaries, run the 4B decode GEMVs faster than the five-launch layer?

Runs on the GPU machine (torch, cuda.bindings, nvcc):

    python3 tools/gpu/megakernel_probe.py [--layers 36] [--iters 30] [--check-layers 2] \\
        [--config NW=8,S=1,SLOT_BYTES=20480,INFLIGHT=2 ...]

tools/gpu/megakernel_probe.cu's kernel runs, per launch, one decode token of a random-weight Qwen3-4B without its
attention (the o GEMV reads the first 4,096 qkv outputs, as the no-attention what-if of NOTES.md 45): the embedding,
36 x [qkv with the norm, o + residual, gate_up with the norm and SiLU-and-mul, down + residual], the final norm,
lm_head and the argmax, whose token feeds the next launch's embedding. Each `--config` is one build (the .cu's
macros; the default build is not the fastest: NOTES.md 46 reports S=1, SLOT_BYTES=20480, INFLIGHT=2). Prints, per
build:

- numerics: one launch over `--check-layers` layers with a separate output buffer per op, every output of every op
  checked against float64 on the inputs it read (`check_numerics` says what passes); the token's logit (float64,
  rounded to bf16) within one bf16 spacing of the largest;
- determinism: the tokens of 8 chained launches, twice from the same start;
- timelines: per op kind, µs on the critical path and the median block's own time; block 0's pieces around each
  op's dependency;
- ms per token (median of `--iters` back-to-back launches, CUDA events) in four modes: full; without the waits
  between ops (mode 2: what the dependencies cost; wrong values); without the waits and the input loads (mode 6:
  the consumers' math alone); consumers idle (mode 1: the weight stream alone); beside the floor (weight bytes / the
  measured device-to-device copy bandwidth).

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
    from bench_gemv import check, copy_bandwidth, cu, launch_function  # noqa: E402
except ImportError:  # the CPU tests use the build and ABI helpers only
    torch = None

HIDDEN, QKV, ATTN, INTER, VOCAB = 2560, 6144, 4096, 9728, 151936  # Qwen3-4B
EPS = 1e-6
SOURCE = ROOT / "tools" / "gpu" / "megakernel_probe.cu"
ENTRY = "kern_megakernel_probe"
#: megakernel_probe.cu's build macros and their defaults (INFLIGHT None: NW·S, the whole ring).
DEFAULTS = {"NW": 8, "S": 2, "SLOT_BYTES": 10240, "INFLIGHT": None, "POLL_NS": 32, "PF_AHEAD": 0}
#: Constants the script shares with the .cu (tests-integration/test_megakernel_probe.py compares them).
XS_BYTES, TMAXP, MAX_OPS = 19456, 8192, 1024
SHARED_PER_BLOCK = 227 * 1024  # sm_90's dynamic shared memory per block, at most
#: The entry's parameters in order, as Probe.launch passes them: (name, type).
LAUNCH_PARAMS = (("ops", "ptr"), ("num_ops", "i32"), ("counters", "ptr"), ("eps", "f32"), ("token", "ptr"),
                 ("epoch", "u32"), ("arg_val", "ptr"), ("arg_idx", "ptr"), ("mode", "i32"), ("times", "ptr"),
                 ("trace", "ptr"), ("shares", "ptr"))
CTYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int, "u32": ctypes.c_uint, "f32": ctypes.c_float}
EMBED, NORM, NORM_SILU, RESID, LM_ARGMAX = range(5)
OP = np.dtype([("w", "<u8"), ("x", "<u8"), ("norm_w", "<u8"), ("y", "<u8"), ("res", "<u8"),
               ("n", "<i4"), ("k", "<i4"), ("kind", "<i4"), ("unused", "<i4")])
assert OP.itemsize == 56
OP_NAMES = ["embed"] + ["qkv", "o", "gate_up", "down"] * (MAX_OPS // 4)  # an op list's op kinds, in order


class Model:
    """Random bf16 Qwen3-4B weights without the attention's own (q/k norms): the tied embedding / lm_head table
    [VOCAB, HIDDEN] (std `table_std`), per layer qkv [6144, 2560], o [2560, 4096], gate_up pair-interleaved [19456, 2560] (gate row i
    then up row i), down [2560, 9728] and the two RMS norm weights, and the final norm."""

    def __init__(self, layers: int, seed: int = 0, table_std: float = 0.5):
        g = torch.Generator(device="cuda").manual_seed(seed)

        def w(*shape, std=0.02):
            return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * std).to(torch.bfloat16)

        def nw():
            return (1.0 + 0.1 * torch.randn(HIDDEN, generator=g, device="cuda")).to(torch.bfloat16)

        self.table = w(VOCAB, HIDDEN, std=table_std)
        self.layers = [dict(qkv=w(QKV, HIDDEN), o=w(HIDDEN, ATTN), gate_up=w(2 * INTER, HIDDEN),
                            down=w(HIDDEN, INTER), in_norm=nw(), post_norm=nw()) for _ in range(layers)]
        self.final_norm = nw()

    def weight_bytes(self) -> int:
        """Bytes one token streams: every layer's four weights and the table (lm_head), norms excluded."""
        per = sum(t.numel() * 2 for l in self.layers for n, t in l.items() if not n.endswith("norm"))
        return per + self.table.numel() * 2


class OpList:
    """An op table on the GPU (`ops`: OP records as bytes, `n` of them) and the buffers its ops write (kept alive
    here: the kernel writes them); `trace`: (op kind, output buffer) per op but the last, in order."""

    def __init__(self, records: list[tuple], trace: list, bufs: list):
        if len(records) > MAX_OPS:
            raise SystemExit(f"megakernel_probe: {len(records)} ops, the kernel takes at most {MAX_OPS} (fewer --layers)")
        self.ops = torch.from_numpy(np.array(records, dtype=OP).view(np.uint8)).cuda()
        self.n, self.trace, self.bufs = len(records), trace, bufs


def op_list(m: Model, separate: bool) -> OpList:
    """The ops of one token over `m` and the buffers they write: one per op when `separate` (for the numerics
    check), else the decode program's reuse (residual in place, one qkv and one act buffer). Every buffer starts
    poisoned (NaN), so an element no op writes shows."""
    bf = dict(dtype=torch.bfloat16, device="cuda")
    ops, bufs = [], []

    def buf(n):
        t = torch.full((n,), float("nan"), **bf)
        bufs.append(t)
        return t

    def add(kind, w, x, norm_w, y, res, n, k):
        ops.append((w.data_ptr(), 0 if x is None else x.data_ptr(), 0 if norm_w is None else norm_w.data_ptr(),
                    0 if y is None else y.data_ptr(), 0 if res is None else res.data_ptr(), n, k, kind, 0))

    res = buf(HIDDEN)
    add(EMBED, m.table, None, None, res, None, HIDDEN, HIDDEN)
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
    add(LM_ARGMAX, m.table, res, m.final_norm, None, None, VOCAB, HIDDEN)
    return OpList(ops, trace, bufs)


def config(defines: dict[str, int]) -> dict[str, int]:
    """The build macros with the defaults filled in (INFLIGHT: NW·S unless given). Raises SystemExit naming a macro
    outside what megakernel_probe.cu accepts (its static_asserts: 1 ≤ NW ≤ 16, S ≥ 1, SLOT_BYTES a multiple of 16
    and ≥ 10,240 (a gate/up pair of k = 2,560 rows), 1 ≤ INFLIGHT ≤ NW·S, the ring + input within 227 KB)."""
    unknown = set(defines) - set(DEFAULTS)
    if unknown:
        raise SystemExit(f"megakernel_probe: unknown macro(s) {', '.join(sorted(unknown))} (known: {', '.join(DEFAULTS)})")
    cfg = {**DEFAULTS, **defines}
    if cfg["INFLIGHT"] is None:
        cfg["INFLIGHT"] = cfg["NW"] * cfg["S"]
    problems = [name for name, ok in (
        ("NW", 1 <= cfg["NW"] <= 16), ("S", cfg["S"] >= 1),
        ("SLOT_BYTES", cfg["SLOT_BYTES"] % 16 == 0 and cfg["SLOT_BYTES"] >= 2 * 2560 * 2),
        ("INFLIGHT", 1 <= cfg["INFLIGHT"] <= cfg["NW"] * cfg["S"]), ("POLL_NS", cfg["POLL_NS"] >= 0),
        ("PF_AHEAD", cfg["PF_AHEAD"] >= 0)) if not ok]
    if not problems and threads_and_smem(cfg)[1] > SHARED_PER_BLOCK:
        problems = ["NW·S·SLOT_BYTES (the ring and the 19,456-byte input exceed 227 KB)"]
    if problems:
        raise SystemExit(f"megakernel_probe: {', '.join(problems)} out of range in {cfg} (see config's docstring)")
    return cfg


def threads_and_smem(cfg: dict[str, int]) -> tuple[int, int]:
    """Threads per block and dynamic shared memory (bytes) of a build `cfg` (megakernel_probe.cu's layout)."""
    return (cfg["NW"] + 1) * 32, cfg["NW"] * cfg["S"] * cfg["SLOT_BYTES"] + XS_BYTES


def nvcc_command(cfg: dict[str, int], out: Path, nvcc: str | None = None) -> list[str]:
    """The nvcc command that builds `cfg` (every macro given explicitly) into the cubin `out`."""
    nvcc = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return [nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v",
            *(f"-D{k}={v}" for k, v in cfg.items()), "-o", str(out), str(SOURCE)]


class Probe:
    """megakernel_probe.cu built with `defines` (NW consumer warps, S slots each of SLOT_BYTES, ...), loaded; one
    block per SM. Raises SystemExit when the build does not fit an SM (fewer warps or smaller slots)."""

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
            raise SystemExit(f"megakernel_probe: {self.name()}: a {self.threads}-thread block with {self.smem} bytes of "
                             "shared memory does not fit an SM; use fewer consumer warps (NW), slots (S) or smaller "
                             "SLOT_BYTES")
        self.grid = self.sms  # one block per SM: all resident at once (the kernel's waits need it)
        self.counters = torch.zeros(MAX_OPS, dtype=torch.int32, device="cuda")
        self.arg_val = torch.zeros(self.grid, dtype=torch.float32, device="cuda")
        self.arg_idx = torch.zeros(self.grid, dtype=torch.int32, device="cuda")
        self.current: OpList | None = None  # the op list the counters count for
        self.epoch = 0  # its launches that advanced the counters

    def name(self) -> str:
        """The build's macros, for tables."""
        c = self.cfg
        return (f"NW={c['NW']} S={c['S']} SLOT={c['SLOT_BYTES']} INFLIGHT={c['INFLIGHT']} POLL={c['POLL_NS']} "
                f"PF_AHEAD={c['PF_AHEAD']}")

    def launch(self, ol: OpList, token: torch.Tensor, mode: int = 0, times: int = 0, trace: int = 0,
               shares: int = 0) -> None:
        """Enqueue one token over op list `ol` on torch's current stream. token: i64[1] on the GPU, read by the
        embedding and overwritten by the argmax. mode: the kernel's bits (1: consumers idle, 2: no dependency
        waits, 4: no input loads). times, trace: device addresses of the optional stamp buffers (0: none); shares:
        of a u32[grid + 1] prefix of per-block weights (0: equal shares). A new op list starts from zeroed counters."""
        if ol is not self.current:
            self.counters.zero_()
            self.current, self.epoch = ol, 0
        if not mode & 1:
            self.epoch += 1
        values = {"ops": ol.ops.data_ptr(), "num_ops": ol.n, "counters": self.counters.data_ptr(), "eps": EPS,
                  "token": token.data_ptr(), "epoch": max(self.epoch, 1), "arg_val": self.arg_val.data_ptr(),
                  "arg_idx": self.arg_idx.data_ptr(), "mode": mode, "times": times, "trace": trace, "shares": shares}
        kp = (tuple(values[name] for name, _ in LAUNCH_PARAMS), tuple(CTYPES[t] for _, t in LAUNCH_PARAMS))
        launch_function(self.f, (self.grid, 1, 1), (self.threads, 1, 1), self.smem,
                        cu.CUstream(torch.cuda.current_stream().cuda_stream), kp)


def bf16_neighbors(t: torch.Tensor) -> list[torch.Tensor]:
    """bf16 tensor `t` and its two neighbouring bf16 values elementwise (one step down and up in magnitude)."""
    bits = t.contiguous().view(torch.int16)
    return [t, (bits - 1).view(torch.bfloat16), (bits + 1).view(torch.bfloat16)]


def rounding_matches(y: torch.Tensor, candidates: list[torch.Tensor]) -> torch.Tensor:
    """Elementwise: bf16 output `y` equals one of the bf16 `candidates` (bool)."""
    hit = torch.zeros_like(y, dtype=torch.bool)
    for c in candidates:
        hit |= y == c
    return hit


def norm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """HF Qwen3RMSNorm in bf16: weight · bf16(x · rsqrt(mean(x²) + eps)), as float64."""
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean() + EPS)).to(torch.bfloat16)
    return (w * h).double()


def op_candidates(name: str, dot: torch.Tensor, res: torch.Tensor | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The bf16 values an op may output given its float64 dot products `dot` (gate_up: [gate, up] interleaved) and,
    for o/down, the residual it read; and the float64 result with no rounding inside. The kernel sums in fp32 in
    another order, so each bf16 rounding inside may land one step either side of float64's: the result's own
    rounding (qkv), the dot's before the residual add, and g, u and SiLU(g) before their product (SiLU in fp32
    with __expf)."""
    if name == "qkv":
        return bf16_neighbors(dot.to(torch.bfloat16)), dot
    if name in ("o", "down"):
        return ([(res.float() + inner.float()).to(torch.bfloat16) for inner in bf16_neighbors(dot.to(torch.bfloat16))],
                res.double() + dot)
    gs, us = bf16_neighbors(dot[0::2].to(torch.bfloat16)), bf16_neighbors(dot[1::2].to(torch.bfloat16))
    out = []
    for g in gs:
        gf = g.float()
        for sv in bf16_neighbors((gf / (1 + torch.exp(-gf))).to(torch.bfloat16)):
            out += [(sv.float() * u.float()).to(torch.bfloat16) for u in us]
    g64, u64 = dot[0::2], dot[1::2]
    return out, g64 / (1 + torch.exp(-g64)) * u64


def spacing(t: torch.Tensor) -> torch.Tensor:
    """The bf16 spacing at |t| (float64)."""
    return torch.pow(2.0, torch.floor(torch.log2(t.double().abs().clamp_min(1e-30))) - 7)


#: A dot product's summation-order error, relative to Σ|w·x|: fp32 sums of 2,560–9,728 terms in another order land
#: within ~2^-18 of float64 typically and 2^-12 at worst; a stale or misplaced slot is off by O(1).
DOT_TOL = 2.0 ** -14


def op_bound(name: str, dot: torch.Tensor, absdot: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """How far from `exact` (float64) an output may be where its dot cancels (|dot| ≪ Σ|w·x| = `absdot`): the dot's
    summation-order error DOT_TOL·Σ|w·x| carried through the op, plus a bf16 spacing at each rounding."""
    if name == "qkv":
        return spacing(exact) + DOT_TOL * absdot
    if name in ("o", "down"):
        return spacing(exact) + spacing(dot) + DOT_TOL * absdot
    g, u = dot[0::2], dot[1::2]
    dg = spacing(g) + DOT_TOL * absdot[0::2]
    du = spacing(u) + DOT_TOL * absdot[1::2]
    silu = g / (1 + torch.exp(-g))
    return spacing(exact) + 1.1 * u.abs() * dg + (silu.abs() + spacing(silu)) * du + u.abs() * spacing(silu)


def ulps(y: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|y − exact| in bf16 spacings at |exact| (float64)."""
    return (y.double() - exact).abs() / spacing(exact)


def check_numerics(probe: Probe, m: Model) -> bool:
    """One launch over model `m` with an output buffer per op, each op checked on the inputs it read (teacher
    forced): the embedding exactly; every output of qkv, o, gate_up and down either one of `op_candidates` (one
    bf16 step either side at each rounding) or, where its dot cancels, within `op_bound` of float64; the token's logit
    (float64, rounded to bf16) within one bf16 spacing of the largest. Prints per op kind how many outputs pass each
    way and the worst distance in ulps; returns whether every output passed."""
    token = torch.tensor([12345], dtype=torch.int64, device="cuda")
    ol = op_list(m, separate=True)
    probe.launch(ol, token)
    torch.cuda.synchronize()
    ok, res_in, report = True, None, {}
    for i, (name, y) in enumerate(ol.trace):
        if name == "embed":
            rounded, bounded, bad, worst = int((y == m.table[12345]).sum()), 0, int((y != m.table[12345]).sum()), 0.0
        else:
            l = m.layers[(i - 1) // 4]
            if name == "qkv":
                w, x, res = l["qkv"].double(), norm_ref(res_in, l["in_norm"]), None
                qkv = y
            elif name == "o":
                w, x, res = l["o"].double(), qkv[:ATTN].double(), res_in
                res_mid = y
            elif name == "gate_up":
                w, x, res = l["gate_up"].double(), norm_ref(res_mid, l["post_norm"]), None
                act = y
            else:
                w, x, res = l["down"].double(), act.double(), res_mid
            dot, absdot = w @ x, w.abs() @ x.abs()
            cands, exact = op_candidates(name, dot, res)
            is_rounding = rounding_matches(y, cands)
            within = (y.double() - exact).abs() <= op_bound(name, dot, absdot, exact)
            rounded, bounded = int(is_rounding.sum()), int((~is_rounding & within).sum())
            bad, worst = int((~is_rounding & ~within).sum()), float(ulps(y, exact).max())
        if name in ("embed", "o", "down"):
            res_in = y
        r = report.setdefault(name, [0, 0, 0, 0.0])
        r[0], r[1], r[2], r[3] = r[0] + rounded, r[1] + bounded, r[2] + bad, max(r[3], worst)
        ok &= bad == 0
    for name, (rounded, bounded, bad, worst) in report.items():
        print(f"  {name:8s} {rounded} outputs a rounding of float64 (one bf16 step at each rounding), {bounded} within "
              f"the cancellation bound, {bad} outside; largest distance from float64 {worst:.2f} ulp")
    logits = (m.table.double() @ norm_ref(res_in, m.final_norm)).to(torch.bfloat16).double()
    tok, top = int(token.item()), float(logits.max())
    space = 2.0 ** (np.floor(np.log2(abs(top))) - 7)
    gap = top - float(logits[tok])
    print(f"  argmax   token {tok}: its logit {float(logits[tok]):.5f}, the largest {top:.5f} (token "
          f"{int(logits.argmax())}), gap {gap:.3g} (one bf16 spacing there: {space:.3g})")
    return ok and gap <= space


def chained_tokens(probe: Probe, ol: OpList, steps: int = 8) -> list[int]:
    """The tokens of `steps` launches, each fed the previous one's token (from 777)."""
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    out = []
    for _ in range(steps):
        probe.launch(ol, token)
        out.append(token.clone())
    torch.cuda.synchronize()
    return [int(t.item()) for t in out]


def per_launch_ms(probe: Probe, ol: OpList, mode: int, iters: int, shares: int = 0) -> float:
    """Median ms per launch (one token) of `iters` back-to-back launches in `mode` (with per-block `shares`, a
    device address, or 0: equal), between CUDA events, after 3."""
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    for _ in range(3):
        probe.launch(ol, token, mode, 0, 0, shares)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        probe.launch(ol, token, mode, 0, 0, shares)
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))


def op_stamps(probe: Probe, ol: OpList, mode: int, shares: int = 0) -> torch.Tensor:
    """Per block and op, µs (from the launch's first stamp) when the block finished the op, in one launch in `mode`
    after an unstamped one: float64 [grid, ops] on the host."""
    times = torch.zeros(probe.grid * ol.n, dtype=torch.int64, device="cuda")
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    probe.launch(ol, token, mode, 0, 0, shares)
    probe.launch(ol, token, mode, times.data_ptr(), 0, shares)
    torch.cuda.synchronize()
    return ((times.view(probe.grid, ol.n).double() - float(times.min())) / 1e3).cpu()


def block_spans(probe: Probe, ol: OpList, mode: int, shares: int = 0) -> torch.Tensor:
    """µs from each block's embedding to its last layer's finish in one launch, float64 [grid] on the host."""
    t = op_stamps(probe, ol, mode, shares)
    return t[:, -2] - t[:, 0]


def timeline(probe: Probe, ol: OpList) -> None:
    """Per-block, per-op finish stamps (mode 0, then mode 2): per op kind, µs per op on the critical path (the last
    block's finish to the last block's finish), the median block's own time for it (from the previous op's last
    finish), and the spread of the blocks' spans when nothing waits."""
    t = op_stamps(probe, ol, 0)
    last = t.max(dim=0).values
    crit, own = {}, {}
    for j in range(1, ol.n - 1):
        name = OP_NAMES[j]
        crit.setdefault(name, []).append(float(last[j] - last[j - 1]))
        own.setdefault(name, []).append(float((t[:, j] - last[j - 1]).median()))
    print("  timeline, waits on (µs per op): " + ", ".join(
        f"{k} {statistics.mean(crit[k]):.2f} (median block {statistics.mean(own[k]):.2f})" for k in crit)
          + f"; lm_head+argmax {float(last[-1] - last[-2]):.1f}; total {float(last[-1]):.0f}")
    tot = block_spans(probe, ol, 2)
    print(f"  timeline, no waits: blocks finish the last layer after {float(tot.min()):.0f}–"
          f"{float(tot.max()):.0f} µs (median {float(tot.median()):.0f})")


def balanced(probe: Probe, ol: OpList, iters: int) -> tuple[float, float]:
    """Rows per block in proportion to each block's speed, measured with no waits (its span over the layers):
    prints the blocks' spans before and after, and returns ms per token (full, no waits) with those shares."""
    span = block_spans(probe, ol, 2)
    speed = 1.0 / span
    prefix = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(speed / speed.sum(), 0)]) * (1 << 20)
    shares = prefix.round().to(torch.int64).to(torch.int32).cuda()
    after = block_spans(probe, ol, 2, shares.data_ptr())
    print(f"  shares by measured speed: block spans without waits {float(span.min()):.0f}–{float(span.max()):.0f} µs "
          f"→ {float(after.min()):.0f}–{float(after.max()):.0f} µs (shares {float(speed.min() / speed.mean()):.3f}–"
          f"{float(speed.max() / speed.mean()):.3f} of the mean)")
    out = [per_launch_ms(probe, ol, mode, iters, shares.data_ptr()) for mode in (0, 2)]
    print(f"  with those shares: full {out[0]:.3f}, no waits {out[1]:.3f} ms per token")
    return out[0], out[1]


def piece_timeline(probe: Probe, ol: OpList) -> None:
    """Block 0's pieces in one launch (mode 0): per op kind, averaged over the layers, how many of the op's pieces
    were issued before its dependency was met (the ring's fill at the boundary), the input load (µs), and the op's
    span from its dependency to its last piece released and to the next op's dependency (µs)."""
    n = ol.n
    trace = torch.zeros(4 * TMAXP + 2 * MAX_OPS, dtype=torch.int64, device="cuda")
    token = torch.tensor([777], dtype=torch.int64, device="cuda")
    probe.launch(ol, token)
    probe.launch(ol, token, 0, 0, trace.data_ptr())
    torch.cuda.synchronize()
    t = trace.cpu().double()
    issue, done, op_of = t[:TMAXP], t[2 * TMAXP:3 * TMAXP], t[3 * TMAXP:4 * TMAXP]
    dep, inp = t[4 * TMAXP:4 * TMAXP + MAX_OPS], t[4 * TMAXP + MAX_OPS:4 * TMAXP + 2 * MAX_OPS]
    npieces = int((issue > 0).sum())
    rows = {}
    for j in range(1, n - 1):
        sel = (op_of[:npieces] == j).nonzero().flatten()
        if len(sel) == 0:
            continue
        rows.setdefault(OP_NAMES[j], []).append((
            len(sel), int((issue[sel] < dep[j]).sum()), float(inp[j] - dep[j]) / 1e3,
            float(done[sel].max() - dep[j]) / 1e3, float(dep[j + 1] - dep[j]) / 1e3))
    print("  block 0's pieces per op (mean over layers): pieces | issued before the dependency was met | input "
          "load µs | dependency → last release µs | dependency → next op's µs")
    for k, r in rows.items():
        m = [statistics.mean(x[i] for x in r) for i in range(5)]
        print(f"    {k:8s} {m[0]:5.1f} | {m[1]:5.1f} | {m[2]:5.2f} | {m[3]:6.2f} | {m[4]:6.2f}")


def parse_config(text: str) -> dict[str, int]:
    """`NW=8,S=2,SLOT_BYTES=10240` -> a dict of build macros. Raises SystemExit naming a part that is not
    NAME=INT with a known NAME (the values are checked by `config`)."""
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
    configs = [config(parse_config(c)) for c in a.config] or [config({})]
    for what, layers in (("--layers", a.layers), ("--check-layers", a.check_layers)):
        if not 1 <= layers <= (MAX_OPS - 2) // 4:
            ap.error(f"{what} {layers}: 1..{(MAX_OPS - 2) // 4} (the kernel takes at most {MAX_OPS} ops)")
    small = Model(a.check_layers, seed=1, table_std=0.02)  # a small table: the token's own row does not win the argmax
    m = Model(a.layers, seed=2)
    ol = op_list(m, separate=False)
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
        t1, t2 = chained_tokens(probe, ol), chained_tokens(probe, ol)
        print(f"  numerics ({a.check_layers} layers): {'ok' if ok else 'FAILED'}; tokens of 8 chained launches: {t1} "
              f"({'the same' if t1 == t2 else 'DIFFER: ' + str(t2)} twice)")
        ok_all &= ok and t1 == t2
        timeline(probe, ol)
        piece_timeline(probe, ol)
        balanced(probe, ol, a.iters)
        rows.append((probe.name(), [per_launch_ms(probe, ol, mode, a.iters) for mode, _ in modes]))
    print(f"\nms per token (median of {a.iters} back-to-back launches; in brackets % of the floor)\n")
    print("| build | " + " | ".join(w for _, w in modes) + " |")
    print("|---|" + "---:|" * len(modes))
    for name, ms in rows:
        print(f"| {name} | " + " | ".join(f"{t:.3f} ({100 * floor / t:.0f}%)" for t in ms) + " |")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
