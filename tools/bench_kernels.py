#!/usr/bin/env python3
"""Micro-benchmark of the provider kernels on the GPU (Qwen3-4B geometry).

    uv run python tools/bench_kernels.py [--kernels DIR] [--reps 200] [--md BENCHMARKS.md]

For each kernel at decode (tokens = 1) and prefill (tokens = 2048) sizes: the median
of many CUDA-event-timed launches through the cubin (L2 flushed before every
launch by a 512 MiB memset, which also keeps the GPU busy while the host enqueues
the launch, so host launch overhead is not counted), next to its floor:
max(bytes / measured copy bandwidth, flops / measured bf16 matmul rate), both
measured in the same run.  Bytes count each input read once and each output written
once.  Prints a table and appends it to BENCHMARKS.md (and $OUT/bench_kernels.md
when $OUT is set) with date, commit and machine.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402

from cubin_launch import KernelSet  # noqa: E402
from geometries import PRESETS  # noqa: E402

D = 128
BF = torch.bfloat16
DEV = "cuda"


class Timer:
    def __init__(self, reps: int):
        self.reps = reps
        self.flush = torch.empty(512 * 2**20, dtype=torch.uint8, device=DEV)

    def median_us(self, fn, reps: int | None = None) -> float:
        reps = reps or self.reps
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            self.flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            times.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times) * 1e3


def copy_bandwidth(timer: Timer) -> float:
    """bytes/s of a 1 GiB device-to-device copy, counting read + write."""
    n = 2**30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_(0, 255)
    b = torch.empty_like(a)
    t = timer.median_us(lambda: b.copy_(a), reps=30)
    return 2 * n / (t * 1e-6)


def matmul_rate(timer: Timer) -> float:
    n = 8192
    a = torch.randn(n, n, device=DEV).to(BF)
    b = torch.randn(n, n, device=DEV).to(BF)
    t = timer.median_us(lambda: a @ b, reps=20)
    return 2 * n**3 / (t * 1e-6)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return os.environ.get("KERN_COMMIT", "unknown")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, help="prebuilt kernels dir (default: build the 4b set to a temp dir)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--md", type=Path, default=ROOT / "BENCHMARKS.md")
    a = ap.parse_args(argv)
    kdir = a.kernels or os.environ.get("KERN_KERNELS_DIR")
    if not kdir:
        import build_kernels

        kdir = Path(tempfile.mkdtemp(prefix="kern-bench-"))
        build_kernels.build(kdir, ["4b"], quiet=True)
    torch.cuda.init()
    torch.empty(1, device=DEV)
    ks = KernelSet(kdir)
    g = PRESETS["4b"]
    H, NQ, NKV, I, V, NL = (g.hidden_size, g.num_attention_heads, g.num_key_value_heads, g.intermediate_size,
                            g.vocab_size, g.num_hidden_layers)
    eps, scale = g.rms_norm_eps, 1 / math.sqrt(D)
    page_elems = NL * 16 * NKV * 2 * D
    page_bytes = 2 * page_elems
    QS = (NQ + 2 * NKV) * D
    timer = Timer(a.reps)
    bw = copy_bandwidth(timer)
    mm = matmul_rate(timer)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)

    rows = []  # (kernel, tokens, note, us, floor_us)

    def add(name, T, note, fn, nbytes, flops=0.0):
        t = timer.median_us(fn)
        floor = max(nbytes / bw, flops / mm) * 1e6
        rows.append((name, T, note, t, floor))
        print(f"  {name:28s} T={T:<5d} {note:18s} {t:9.2f} us  floor {floor:8.2f} us  {100 * floor / t:5.1f}%",
              flush=True)

    rnd = lambda *s: torch.randn(*s, device=DEV).to(BF)  # noqa: E731
    table = rnd(V, H)
    cos_sin = torch.randn(40960, D, device=DEV)
    w = rnd(H)
    for T in (1, 2048):
        ids = torch.randint(0, V, (T,), device=DEV)
        x, res, out = rnd(T, H), rnd(T, H), rnd(T, H)
        add("embedding", T, "", lambda: ks.launch("embedding", (T,), [ids, table, out, H, V]), T * H * 4 + T * 8)
        add(f"rms_norm_h{H}", T, "", lambda: ks.launch(f"rms_norm_h{H}", (T,), [x, w, out, eps]), T * H * 4 + 2 * H)
        add(f"add_rms_norm_h{H}", T, "",
            lambda: ks.launch(f"add_rms_norm_h{H}", (T,), [res, x, w, out, eps]), T * H * 8 + 2 * H)
        gu, act = rnd(T, 2 * I), rnd(T, I)
        add("silu_and_mul", T, "", lambda: ks.launch("silu_and_mul", (T, -(-I // 1024)), [gu, act, I]), T * I * 6)
        qkv = rnd(T, QS)
        pos = torch.arange(30000, 30000 + T, device=DEV)
        kv = torch.empty((30000 + T) // 16 + 1, page_elems, dtype=BF, device=DEV)  # written only
        qn, kn = rnd(D), rnd(D)
        add("qk_norm_rope_kv", T, "", lambda: ks.launch(
            "qk_norm_rope_kv", (T, NKV), [qkv, pos, pos, qn, kn, cos_sin, kv, NQ, NKV, eps, page_bytes]),
            T * (QS * 2 + NQ * D * 2 + 2 * NKV * D * 2 + D * 4 + 16))
        del kv
    logits = rnd(1, V)
    parts = -(-V // 2048)
    partial = torch.empty(parts, dtype=torch.int64, device=DEV)
    nt = torch.empty(1, dtype=torch.int64, device=DEV)

    def argmax():
        ks.launch("argmax_partial", (parts, 1), [logits, partial, V, parts])
        ks.launch("argmax_reduce", (1,), [partial, nt, parts])
    add("argmax (2 launches)", 1, f"V={V}", argmax, V * 2 + 8)

    # decode attention: one token, 36-layer interleaved pages, random page order
    for ctx in (512, 4096, 32768):
        npages = -(-ctx // 16)
        kv = rnd(npages, page_elems)
        bt = torch.randperm(npages, device=DEV).to(torch.int32)
        seq = torch.tensor([ctx], dtype=torch.int32, device=DEV)
        qkv = rnd(1, QS)
        o = rnd(1, NQ * D)
        for S in (16, 32, 64):
            acc = torch.empty(NQ * S * D, device=DEV)
            ml = torch.empty(NQ * S * 2, device=DEV)

            def dec(S=S, acc=acc, ml=ml):
                ks.launch("paged_decode_attention", (NKV, S, 1),
                          [qkv, kv, bt, seq, acc, ml, NQ, NKV, QS, npages, page_bytes, scale])
                ks.launch("paged_decode_reduce", (NQ, 1), [acc, ml, o, NQ, S])
            nbytes = ctx * NKV * D * 4 + NQ * D * 4 + ctx // 16 * 4 + 2 * NQ * S * (D + 2) * 4
            add("paged_decode_attention+reduce", 1, f"ctx={ctx} S={S}", dec, nbytes,
                4 * NQ * D * ctx)
        del kv

    # prefill attention: a 2048-token chunk, with and without earlier context
    T = 2048
    for ctx in (2048, 8192):
        npages = -(-ctx // 16)
        kv = rnd(npages, page_elems)
        bt = torch.arange(npages, dtype=torch.int32, device=DEV)
        seq = torch.tensor([ctx], dtype=torch.int32, device=DEV)
        cu = torch.tensor([0, T], dtype=torch.int32, device=DEV)
        qkv = rnd(T, QS)
        o = rnd(T, NQ * D)
        pairs = sum(ctx - T + i + 1 for i in range(T))
        add("paged_prefill_attention", T, f"ctx={ctx}", lambda: ks.launch(
            "paged_prefill_attention", (-(-T // 128), NQ, 1),
            [qkv, kv, bt, seq, cu, o, NQ, NKV, QS, npages, page_bytes, scale]),
            T * NQ * D * 4 + ctx * NKV * D * 4, 4 * NQ * D * pairs)
        del kv

    dev = torch.cuda.get_device_name()
    head = (f"\n## Provider kernels (tools/bench_kernels.py), Qwen3-4B geometry\n\n"
            f"{datetime.date.today().isoformat()}, commit {commit()}, {dev}, torch {torch.__version__}; "
            f"median of {a.reps} CUDA-event-timed launches, L2 flushed before each; floor = max(bytes / "
            f"{bw / 1e12:.2f} TB/s measured D2D copy, flops / {mm / 1e12:.0f} TFLOP/s measured bf16 matmul).\n\n"
            "| kernel | tokens | case | time µs | floor µs | % of floor |\n|---|---:|---|---:|---:|---:|\n")
    body = "".join(f"| {n} | {t} | {note} | {us:.2f} | {fl:.2f} | {100 * fl / us:.1f}% |\n"
                   for n, t, note, us, fl in rows)
    print(head + body)
    with open(a.md, "a") as f:
        f.write(head + body)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_kernels.md").write_text(head + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
