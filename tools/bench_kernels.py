#!/usr/bin/env python3
"""Micro-benchmark of the provider kernels on the GPU (Qwen3-4B geometry).

    uv run python tools/bench_kernels.py [--kernels DIR] [--reps 200] [--graph-reps 50] [--md BENCHMARKS.md]
                                         [--fused-attention] [--only SUBSTRING]
    python3 tools/bench_kernels.py --dry-run      # list the cases (no GPU, no torch needed)

For each kernel at decode (tokens = 1) and prefill (tokens = 2048) sizes, two times
next to its floor: max(bytes / measured copy bandwidth, flops / measured bf16 matmul
rate), both measured in the same run.  Bytes count each input read once and each
output written once.

- standalone: the median of many CUDA-event-timed launches through the cubin (L2
  flushed before every launch by a 512 MiB memset, which also keeps the GPU busy
  while the host enqueues the launch, so host launch overhead is not counted).  Each
  time still carries the launch latency and ramp-up of one isolated launch (~4-5 µs).
- in-graph (decode cases only): a torch CUDA graph of L = 36 (the 4B layer count)
  back-to-back calls over L distinct input/output sets (decode attention: the L
  layers' blocks of one layer-interleaved KV pool, as the decode program addresses
  them; per-op scratch shared, as in the program), replayed with L2 flushed before
  each replay; the median replay time / L is what one call costs inside the decode
  program's graph.  The launches are the standalone ones (cubin_launch launches on
  torch's current stream, which is the capture stream inside ``torch.cuda.graph``).

Decode attention runs every impl of the op at 512 .. 32,768 cached tokens: the Triton pair
(``paged_decode_attention+reduce``, S = 16, 32, 64), the CUDA C split + merge
(``decode_attention_split+merge``, S = 32, 64; ns = the splits it uses) and the CUDA C one-launch
``decode_attention_cluster``; each case's floor counts its own scratch traffic (none for the cluster
form, whose floor is K + V + q + out + block table). The cluster form also runs as the --pdl decode program
launches it (``decode_attention_cluster_pdl``, programmatic dependent launch): back to back (``PDL chain``),
and right after its layer's ``qk_norm_rope_kv_pdl`` (``pair``) beside the prologue alone, whose difference
(``added to a layer``) is what the attention costs a decode layer; it issues its first pages before its
griddepcontrol.wait, so under PDL they stream while the launch before it finishes. The default decode
attention of the generator, ``decode_attention_rope_cluster_pdl`` (the prologue's decode work and the
attention in one launch), runs back to back with PDL (its time per call is a whole layer's attention), and right
after its layer's qkv GEMV (as gen_qwen3 launches it: gemv_tc.cu's ``kern_gemvtc_norm_m1`` since session 32, the
rows still labelled ``kern_gemv_norm_m1``; on an index without it gemv.cu's, on 4B in two row passes with the
batched norm prologue, ``kern_gemv_norm_m1_nb2_p2``; PDL, its own 31.5 MB weight per layer; it writes the qkv the
attention reads) beside the GEMV chain alone: the difference is what the default attention costs a decode layer.

`--fused-attention` adds the one-launch decode attention (``paged_decode_attention_fused``,
built by ``build_kernels.py --fused-attention``; refused when the index lacks it) at the same
contexts and splits as the two-launch cases; each call gets its layer's own counters (one
i32 per kv head, zeroed once: the kernel resets them).  ``--only`` keeps the cases whose
kernel name contains the substring (e.g. ``--only decode_attention``).

Prints a table and appends it to BENCHMARKS.md (or --md) and writes it to
$OUT/bench_kernels.md when $OUT is set, with date, commit and machine.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
from benchinfo import commit  # noqa: E402  (tools/ is the script's own directory)
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
sys.path.insert(0, str(ROOT / "tools"))

from gemv_plan import (GEMV_TC_STEP, GEMV_UNROLL_SUFFIX, gemv_blocks, gemv_norm_entry_name,  # noqa: E402
                       gemv_pass_entry, gemv_passes, gemv_tc_entry, gemv_tc_unroll, gemv_tensor_core)
from geometries import PRESETS  # noqa: E402

# torch and cubin_launch (cuda.bindings) are imported in main(), after --dry-run.
torch = None

D = 128
DEV = "cuda"
GRAPH_MAX_BYTES = 40 * 2**30  # per case, all L sets together
#: Cached tokens of the decode attention cases.
DECODE_CONTEXTS = (512, 1024, 4096, 16384, 32768)
#: The PDL cases of the default decode attention (notes of their rows; see build_cases).
CLUSTER_PDL, ROPE_PDL = "decode_attention_cluster_pdl", "decode_attention_rope_cluster_pdl"
PDL_CHAIN, PDL_PAIR, PDL_PROLOGUE = "PDL chain", "PDL, after qk_norm_rope_kv_pdl (pair)", "PDL chain (prologue alone)"
PDL_ADDED = "PDL, added to a layer after its prologue (pair - prologue)"
#: The default decode attention as the program launches it: right after the layer's qkv GEMV (which writes its qkv).
QKV_GEMV = "kern_gemv_norm_m1"
ROPE_PAIR, QKV_ALONE = "PDL, after the qkv GEMV (pair)", "PDL chain (qkv GEMV alone)"
ROPE_ADDED = "PDL, added to a layer after the qkv GEMV (pair - GEMV)"
#: (pair kernel, pair note, base kernel, base note, note of the difference row): main() adds pair - base per context.
ADDED_ROWS = ((CLUSTER_PDL, PDL_PAIR, "qk_norm_rope_kv_pdl", PDL_PROLOGUE, PDL_ADDED),
              (ROPE_PDL, ROPE_PAIR, QKV_GEMV, QKV_ALONE, ROPE_ADDED))


def cuda_splits(ctx: int, S: int) -> int:
    """The splits decode_attention_split uses at ctx cached tokens with grid.y = S (its splits_for)."""
    return max(1, min(S, 64, -(-(-(-ctx // 16)) // 4)))


class Timer:
    def __init__(self, reps: int, graph_reps: int):
        self.reps = reps
        self.graph_reps = max(20, graph_reps)
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

    def graph_us_per_call(self, fns: list[Callable[[], None]]) -> float:
        """Capture fns back to back in one CUDA graph; median replay time / len(fns)."""
        for f in fns:  # eager once: loads modules / functions outside the capture
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # makes its capture stream current: cubin_launch launches there
            for f in fns:
                f()
        torch.cuda.synchronize()
        for _ in range(3):
            g.replay()
        times = []
        for _ in range(self.graph_reps):
            self.flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            times.append((s, e))
        torch.cuda.synchronize()
        t = statistics.median(s.elapsed_time(e) for s, e in times) * 1e3
        del g
        return t / len(fns)


def copy_bandwidth(timer: Timer) -> float:
    """bytes/s of a 1 GiB device-to-device copy, counting read + write."""
    n = 2**30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_(0, 255)
    b = torch.empty_like(a)
    t = timer.median_us(lambda: b.copy_(a), reps=30)
    return 2 * n / (t * 1e-6)


def matmul_rate(timer: Timer) -> float:
    n = 8192
    a = torch.randn(n, n, device=DEV).to(torch.bfloat16)
    b = torch.randn(n, n, device=DEV).to(torch.bfloat16)
    t = timer.median_us(lambda: a @ b, reps=20)
    return 2 * n**3 / (t * 1e-6)


@dataclass
class Case:
    name: str
    T: int
    note: str
    nbytes: float
    flops: float
    # setup(n) allocates n distinct input/output sets and returns one zero-arg launcher per set
    # (set 0 is the standalone one).  Called only on the GPU path.
    setup: Callable[[int], list[Callable[[], None]]]
    graph: bool  # also timed in-graph (decode sizes)
    set_bytes: int = 0  # device memory one extra set needs (the in-graph memory cap)
    fixed_bytes: int = 0  # device memory shared by all sets


def build_cases(g, ks, L: int, fused_attention: bool = False) -> list[Case]:
    """Every case, in table order.  ks (a KernelSet) is used only inside the setups.
    `fused_attention`: also the one-launch decode attention cases."""
    H, NQ, NKV, I, V, NL = (g.hidden_size, g.num_attention_heads, g.num_key_value_heads, g.intermediate_size,
                            g.vocab_size, g.num_hidden_layers)
    eps, scale = g.rms_norm_eps, 1 / math.sqrt(D)
    layer_bytes = 16 * NKV * 2 * D * 2  # one layer's 16-token block inside a page
    page_elems = NL * 16 * NKV * 2 * D  # [page][layer][kv_heads][16 tokens][k|v][head_dim], rows swizzled (head-major)
    page_bytes = 2 * page_elems
    QS = (NQ + 2 * NKV) * D
    assert L <= NL, f"in-graph sets use the KV pool's {NL} layer blocks; L={L} > {NL}"
    shared: dict[str, object] = {}

    def bf(*s):
        return torch.randn(*s, device=DEV).to(torch.bfloat16)

    def once(key, make):
        if key not in shared:
            shared[key] = make()
        return shared[key]

    def table():
        return once("table", lambda: bf(V, H))

    def cos_sin():
        return once("cos_sin", lambda: torch.randn(40960, D, device=DEV))

    cases: list[Case] = []

    def add(name, T, note, setup, nbytes, flops=0.0, set_bytes=0, fixed_bytes=0):
        cases.append(Case(name, T, note, nbytes, flops, setup, T == 1, set_bytes, fixed_bytes))

    for T in (1, 2048):
        def emb(n, T=T):
            tb, out = table(), []
            for _ in range(n):
                ids, o = torch.randint(0, V, (T,), device=DEV), bf(T, H)
                out.append(lambda ids=ids, o=o: ks.launch("embedding", (T,), [ids, tb, o, H, V]))
            return out
        add("embedding", T, "", emb, T * H * 4 + T * 8, set_bytes=T * (8 + 2 * H), fixed_bytes=V * H * 2)

        def rms(n, T=T):
            out = []
            for _ in range(n):
                x, w, o = bf(T, H), bf(H), bf(T, H)
                out.append(lambda x=x, w=w, o=o: ks.launch(f"rms_norm_h{H}", (T,), [x, w, o, eps]))
            return out
        add(f"rms_norm_h{H}", T, "", rms, T * H * 4 + 2 * H, set_bytes=T * H * 4 + 2 * H)

        def add_rms(n, T=T):
            out = []
            for _ in range(n):
                res, x, w, o = bf(T, H), bf(T, H), bf(H), bf(T, H)
                out.append(lambda res=res, x=x, w=w, o=o: ks.launch(
                    f"add_rms_norm_h{H}", (T,), [res, x, w, o, eps]))
            return out
        add(f"add_rms_norm_h{H}", T, "", add_rms, T * H * 8 + 2 * H, set_bytes=T * H * 6 + 2 * H)

        def silu(n, T=T):
            out = []
            for _ in range(n):
                gu, act = bf(T, 2 * I), bf(T, I)
                out.append(lambda gu=gu, act=act: ks.launch("silu_and_mul", (T, -(-I // 1024)), [gu, act, I]))
            return out
        add("silu_and_mul", T, "", silu, T * I * 6, set_bytes=T * I * 6)

        def qk(n, T=T):
            # positions (= slot mapping) and cos/sin shared, per-layer q/k weights and qkv,
            # KV written at layer l's block of one interleaved pool (pages only written)
            pos = torch.arange(30000, 30000 + T, device=DEV)
            kv = torch.empty((30000 + T) // 16 + 1, page_elems, dtype=torch.bfloat16, device=DEV)
            cs, out = cos_sin(), []
            for l in range(n):
                qkv, qn, kn = bf(T, QS), bf(D), bf(D)
                out.append(lambda qkv=qkv, qn=qn, kn=kn, kvp=kv.data_ptr() + l * layer_bytes, kv=kv: ks.launch(
                    "qk_norm_rope_kv", (T, NKV), [qkv, pos, pos, qn, kn, cs, kvp, NQ, NKV, eps, page_bytes]))
            return out
        add("qk_norm_rope_kv", T, "", qk, T * (QS * 2 + NQ * D * 2 + 2 * NKV * D * 2 + D * 4 + 16),
            set_bytes=T * QS * 2 + 4 * D, fixed_bytes=((30000 + T) // 16 + 1) * page_bytes)

    parts = -(-V // 2048)

    def argmax(n):
        partial = torch.empty(parts, dtype=torch.int64, device=DEV)  # the op's scratch: shared
        out = []
        for _ in range(n):
            logits, nt = bf(1, V), torch.empty(1, dtype=torch.int64, device=DEV)

            def f(logits=logits, nt=nt):
                ks.launch("argmax_partial", (parts, 1), [logits, partial, V, parts])
                ks.launch("argmax_reduce", (1,), [partial, nt, parts])
            out.append(f)
        return out
    add("argmax (2 launches)", 1, f"V={V}", argmax, V * 2 + 8, set_bytes=V * 2 + 8)

    # decode attention: one token, 36-layer interleaved pages, random page order.  In-graph:
    # call l reads layer l's blocks of the same pool (state + layer offset, as the decode
    # program does), so the L calls touch L distinct KV regions; block table and seq_lens
    # shared, split-KV scratch (acc, ml) shared per op, qkv and output per call.  Each impl of
    # the op runs at every context: the Triton pair (attention.py) at S = 16, 32, 64, the CUDA C
    # split + merge (decode_attention.cu) at S = 32, 64 (it uses ns = splits_for(ctx, S) of them),
    # the CUDA C one-launch cluster form, and with --fused-attention the Triton one-launch form.
    # Bytes: K and V once, q read and out written (bf16), the block table, and the op's own scratch
    # written and read back (none for the cluster form).
    kv_bytes = NKV * D * 4  # K + V bf16 per cached token

    def pool(ctx):
        npages = -(-ctx // 16)
        if shared.get("ctx") != ctx:  # one pool (+ block table) alive at a time, reused across impls and S
            for k in ("kv", "bt", "seq"):
                shared.pop(k, None)
            torch.cuda.empty_cache()
            shared.update(ctx=ctx, kv=bf(npages, page_elems),
                          bt=torch.randperm(npages, device=DEV).to(torch.int32),
                          seq=torch.tensor([ctx], dtype=torch.int32, device=DEV))
        return shared["kv"], shared["bt"], shared["seq"], npages

    def attn_setup(ctx, launch, scratch_splits=0):
        """n per-layer launchers of one impl: launch(qkv, kvp, bt, seq, npages, acc, ml, o, l) enqueues it."""
        def setup(n):
            kv, bt, seq, npages = pool(ctx)
            acc = torch.empty(max(1, NQ * scratch_splits * D), device=DEV)
            ml = torch.empty(max(1, NQ * scratch_splits * 2), device=DEV)
            counters = torch.zeros(NL * NKV, dtype=torch.int32, device=DEV)  # the fused form's state
            out = []
            for l in range(n):
                qkv, o = bf(1, QS), bf(1, NQ * D)
                out.append(lambda qkv=qkv, o=o, l=l, kv=kv, acc=acc, ml=ml, counters=counters: launch(
                    qkv, kv.data_ptr() + l * layer_bytes, bt, seq, npages, acc, ml, o,
                    counters.data_ptr() + l * NKV * 4))
            return out
        return setup

    def qkv_gemv():
        """The qkv GEMV as gen_qwen3 plans it for the qkv shape (n = QS, k = H): gemv_tc.cu's entry where
        gemv_plan.gemv_tensor_core says so and the index has it (every Qwen3 geometry since session 32; U = 4, the
        launch before the attention: gemv_plan.gemv_tc_unroll), at ksplit 1; else the index kernel (QKV_GEMV, or its
        row-pass instance `QKV_GEMV_p2` where gemv_plan.gemv_passes says so: 4B's qkv in sessions 18–31; first its
        batched-prologue form `QKV_GEMV_nb2` where gemv_plan.gemv_norm_batched says so and the index has it: 4B's
        since session 29), grid, ksplit."""
        from gen_qwen3 import GEMV_SMS, gemv_ksplit  # the generator's rules (imports kern-schema: only when this runs)

        tc = gemv_tc_entry(QKV_GEMV) + GEMV_UNROLL_SUFFIX[gemv_tc_unroll(H, True)] if H % GEMV_TC_STEP == 0 else None
        if tc in ks.kernels and gemv_tensor_core("gemv_norm", H):
            cx = ks.kernels[tc]["constexprs"]
            return tc, (gemv_blocks(QS, cx["COLS_PER_WARP"], cx["WARPS"], 1),), 1
        cx = ks.kernels[QKV_GEMV]["constexprs"]
        ksplit = gemv_ksplit(-(-QS // cx["COLS_PER_WARP"]), H)
        passes = gemv_passes(QS, cx["COLS_PER_WARP"], cx["WARPS"], ksplit, sms=GEMV_SMS)
        base = gemv_norm_entry_name(QKV_GEMV, H, lambda name: name in ks.kernels, 32 * cx["WARPS"])
        try:  # the entry gen_qwen3 launches, checked as it checks it
            name = gemv_pass_entry(base, passes, lambda nm: ks.kernels[nm]["constexprs"] if nm in ks.kernels
                                   else None, who="the qkv GEMV (as gen_qwen3 launches it)")
        except ValueError as e:
            raise SystemExit(f"bench_kernels: {e}") from None
        return name, (gemv_blocks(QS, cx["COLS_PER_WARP"], cx["WARPS"], ksplit, passes),), ksplit

    def pdl_setup(ctx, what):
        """n per-layer launchers, each launch with programmatic dependent launch except the first of set 0 (a
        graph's first node): what = "attention" (decode_attention_cluster_pdl), "prologue" (qk_norm_rope_kv_pdl at
        position ctx-1, writing that token's row of the layer's KV), "pair" (the prologue, then the attention),
        "rope" (decode_attention_rope_cluster_pdl: both in one launch), "qkv" (the qkv GEMV, writing the layer's
        qkv from its own weight) or "qkv+rope" (the qkv GEMV, then the rope form)."""
        def setup(n):
            kv, bt, seq, npages = pool(ctx)
            pos = torch.tensor([ctx - 1], dtype=torch.int64, device=DEV)
            slot = (bt[(ctx - 1) // 16].long() * 16 + (ctx - 1) % 16).reshape(1)
            cs, out = cos_sin(), []
            x, nw = once("x", lambda: bf(H)), once("norm_w", lambda: bf(H))
            qname, grid, ksplit = qkv_gemv() if what.startswith("qkv") else (None, None, None)
            for l in range(n):
                qkv, o, qn, kn = bf(1, QS), bf(1, NQ * D), bf(D), bf(D)
                w = once(f"w_qkv{l}", lambda: bf(QS, H)) if what.startswith("qkv") else None

                def f(qkv=qkv, o=o, qn=qn, kn=kn, kvp=kv.data_ptr() + l * layer_bytes, first=l == 0, kv=kv, w=w):
                    if what.startswith("qkv"):
                        ks.launch(qname, grid, [x, nw, w, qkv, QS, H, eps, ksplit], pdl=not first)
                        if what == "qkv":
                            return
                    if what in ("rope", "qkv+rope"):
                        ks.launch(ROPE_PDL, (NKV, 8, 1), [qkv, pos, slot, qn, kn, cs, kvp, bt, seq, o, NQ, NKV, QS,
                                                          npages, page_bytes, scale, eps],
                                  pdl=what != "rope" or not first)
                        return
                    if what != "attention":
                        ks.launch("qk_norm_rope_kv_pdl", (1, NKV), [qkv, pos, slot, qn, kn, cs, kvp, NQ, NKV, eps,
                                                                    page_bytes], pdl=not first)
                    if what != "prologue":
                        ks.launch(CLUSTER_PDL, (NKV, 8, 1), [qkv, kvp, bt, seq, o, NQ, NKV, QS, npages, page_bytes,
                                                             scale], pdl=what == "pair" or not first)
                out.append(f)
            return out
        return setup

    def add_attn(name, ctx, note, setup, scratch_splits, weight_bytes=0, before_bytes=0):
        """before_bytes: what the launch before it in a pair reads and writes (its floor counts both launches')."""
        nbytes = ctx * kv_bytes + NQ * D * 4 + ctx // 16 * 4 + 2 * NQ * scratch_splits * (D + 2) * 4 + before_bytes
        add(name, 1, f"ctx={ctx} {note}".rstrip(), setup, nbytes, 4 * NQ * D * ctx,
            set_bytes=QS * 2 + NQ * D * 2 + weight_bytes, fixed_bytes=-(-ctx // 16) * page_bytes)

    for ctx in DECODE_CONTEXTS:
        for S in (16, 32, 64):
            def tri(qkv, kvp, bt, seq, npages, acc, ml, o, cnt, S=S):
                ks.launch("paged_decode_attention", (NKV, S, 1),
                          [qkv, kvp, bt, seq, acc, ml, NQ, NKV, QS, npages, page_bytes, scale])
                ks.launch("paged_decode_reduce", (NQ, 1), [acc, ml, o, NQ, S])
            add_attn("paged_decode_attention+reduce", ctx, f"S={S}", attn_setup(ctx, tri, S), S)
            if fused_attention:
                def fus(qkv, kvp, bt, seq, npages, acc, ml, o, cnt, S=S):
                    ks.launch("paged_decode_attention_fused", (NKV, S, 1),
                              [qkv, kvp, bt, seq, acc, ml, cnt, o, NQ, NKV, QS, npages, page_bytes, scale])
                add_attn("paged_decode_attention_fused", ctx, f"S={S}", attn_setup(ctx, fus, S), S)
        for S in (32, 64):
            ns = cuda_splits(ctx, S)

            def cud(qkv, kvp, bt, seq, npages, acc, ml, o, cnt, S=S):
                ks.launch("decode_attention_split", (NKV, S, 1),
                          [qkv, kvp, bt, seq, acc, ml, NQ, NKV, QS, npages, page_bytes, scale])
                ks.launch("decode_attention_merge", (NQ, 1), [acc, ml, seq, o, NQ, S])
            add_attn("decode_attention_split+merge", ctx, f"S={S} (ns={ns})", attn_setup(ctx, cud, S), ns)

        def clu(qkv, kvp, bt, seq, npages, acc, ml, o, cnt):
            ks.launch("decode_attention_cluster", (NKV, 8, 1),
                      [qkv, kvp, bt, seq, o, NQ, NKV, QS, npages, page_bytes, scale])
        add_attn("decode_attention_cluster", ctx, "", attn_setup(ctx, clu), 0)
        # As the --pdl decode program launches it: the PDL form with programmatic dependent launch, back to back
        # (PDL_CHAIN), and right after its layer's qk_norm_rope_kv_pdl (PDL_PAIR, beside the prologue alone,
        # PDL_PROLOGUE: main() adds the difference, what the attention adds to a layer).
        add_attn(CLUSTER_PDL, ctx, PDL_CHAIN, pdl_setup(ctx, "attention"), 0)
        prologue_bytes = QS * 2 + NQ * D * 2 + 2 * NKV * D * 2 + D * 4 + 16
        add_attn(CLUSTER_PDL, ctx, PDL_PAIR, pdl_setup(ctx, "pair"), 0, before_bytes=prologue_bytes)
        add("qk_norm_rope_kv_pdl", 1, f"ctx={ctx} {PDL_PROLOGUE}", pdl_setup(ctx, "prologue"),
            prologue_bytes, set_bytes=QS * 2 + 4 * D)
        # gen_qwen3's default decode attention: the prologue's decode work and the attention in one launch
        add_attn(ROPE_PDL, ctx, PDL_CHAIN, pdl_setup(ctx, "rope"), 0)
        # ... as the program launches it, right after its layer's qkv GEMV, beside the GEMV chain alone (main adds
        # the difference: what the default attention costs a decode layer)
        gemv_bytes = QS * H * 2 + H * 4 + QS * 2
        add_attn(ROPE_PDL, ctx, ROPE_PAIR, pdl_setup(ctx, "qkv+rope"), 0, weight_bytes=QS * H * 2,
                 before_bytes=gemv_bytes)
        add(QKV_GEMV, 1, f"ctx={ctx} {QKV_ALONE}", pdl_setup(ctx, "qkv"), gemv_bytes, 2 * QS * H,
            set_bytes=QS * H * 2 + QS * 2, fixed_bytes=-(-ctx // 16) * page_bytes)

    # prefill attention: a 2048-token chunk, with and without earlier context (standalone only)
    T = 2048
    for ctx in (2048, 8192):
        npages = -(-ctx // 16)

        def pre(n, ctx=ctx, npages=npages):
            shared.clear()  # the decode cases' pool, table, cos/sin
            torch.cuda.empty_cache()
            kv = bf(npages, page_elems)
            bt = torch.arange(npages, dtype=torch.int32, device=DEV)
            seq = torch.tensor([ctx], dtype=torch.int32, device=DEV)
            cu = torch.tensor([0, T], dtype=torch.int32, device=DEV)
            qkv, o = bf(T, QS), bf(T, NQ * D)
            return [lambda: ks.launch("paged_prefill_attention", (-(-T // 128), NQ, 1),
                                      [qkv, kv, bt, seq, cu, o, NQ, NKV, QS, npages, page_bytes, scale])]
        pairs = sum(ctx - T + i + 1 for i in range(T))
        cases.append(Case("paged_prefill_attention", T, f"ctx={ctx}", T * NQ * D * 4 + ctx * NKV * D * 4,
                          4 * NQ * D * pairs, pre, False))
    return cases


def graph_sets(c: Case, L: int) -> int:
    """Distinct sets for the in-graph run: L, fewer only if they would not fit GRAPH_MAX_BYTES."""
    if c.set_bytes <= 0:
        return L
    return max(1, min(L, (GRAPH_MAX_BYTES - c.fixed_bytes) // c.set_bytes))


def main(argv=None) -> int:
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, help="prebuilt kernels dir (default: $KERN_KERNELS_DIR, else build the 4b "
                    "set to a temp dir)")
    ap.add_argument("--reps", type=int, default=200, help="standalone launches per case (median)")
    ap.add_argument("--graph-reps", type=int, default=50, help="graph replays per case (median; at least 20)")
    ap.add_argument("--md", type=Path, default=ROOT / "BENCHMARKS.md",
                    help="the markdown file the table is appended to (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="list the cases and exit (no GPU, no torch)")
    ap.add_argument("--fused-attention", action="store_true",
                    help="also the one-launch decode attention (paged_decode_attention_fused; the index must have it)")
    ap.add_argument("--only", default=None, help="only the cases whose kernel name contains this substring")
    a = ap.parse_args(argv)

    def selected(cases):
        # the rows main() subtracts (the prologue alone, the qkv GEMV alone) go with their pair's kernel
        def base_of_selected_pair(c):
            return any(c.name == base and c.note.endswith(base_note) and a.only in pair
                       for pair, _, base, base_note, _ in ADDED_ROWS)
        return [c for c in cases if a.only is None or a.only in c.name or base_of_selected_pair(c)]
    g = PRESETS["4b"]
    L = g.num_hidden_layers  # 36 back-to-back calls per graph, as in the 4B decode program

    if a.dry_run:
        cases = selected(build_cases(g, None, L, a.fused_attention))
        print(f"{len(cases)} cases; in-graph: L={L} calls per graph, sets capped at {GRAPH_MAX_BYTES / 2**30:.0f} GiB")
        for c in cases:
            mem = c.fixed_bytes + graph_sets(c, L) * c.set_bytes
            ing = f"in-graph {graph_sets(c, L)} sets, {mem / 2**20:9.1f} MiB" if c.graph else "standalone only"
            print(f"  {c.name:30s} T={c.T:<5d} {c.note:16s} {c.nbytes / 1e6:10.3f} MB {c.flops / 1e9:9.2f} GFLOP  {ing}")
        return 0

    try:
        import torch as _torch
    except ImportError:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine (--dry-run lists the cases without)")

    torch = _torch
    from cubin_launch import KernelSet

    kdir = a.kernels or os.environ.get("KERN_KERNELS_DIR")
    if not kdir:
        import build_kernels

        kdir = Path(tempfile.mkdtemp(prefix="kern-bench-"))
        build_kernels.build(kdir, ["4b"], quiet=True, fused_attention=a.fused_attention)
    torch.cuda.init()
    torch.empty(1, device=DEV)
    ks = KernelSet(kdir)
    if a.fused_attention and "paged_decode_attention_fused" not in ks.kernels:
        raise SystemExit(f"{kdir}/index.json has no paged_decode_attention_fused: rebuild it with "
                         f"tools/build_kernels.py --fused-attention")
    timer = Timer(a.reps, a.graph_reps)
    bw = copy_bandwidth(timer)
    mm = matmul_rate(timer)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)

    rows = []  # (kernel, tokens, note, us, floor_us, graph_us_per_call or None, graph sets)
    for c in selected(build_cases(g, ks, L, a.fused_attention)):
        n = graph_sets(c, L) if c.graph else 1
        fns = c.setup(n)
        t = timer.median_us(fns[0])
        tg = timer.graph_us_per_call(fns) if c.graph else None
        del fns
        torch.cuda.empty_cache()
        floor = max(c.nbytes / bw, c.flops / mm) * 1e6
        rows.append((c.name, c.T, c.note, t, floor, tg, n))
        gtxt = f"  in-graph {tg:8.2f} us/call {100 * floor / tg:5.1f}%" if tg is not None else ""
        print(f"  {c.name:28s} T={c.T:<5d} {c.note:18s} {t:9.2f} us  floor {floor:8.2f} us  "
              f"{100 * floor / t:5.1f}%{gtxt}", flush=True)

    # what a PDL attention adds to a layer after the launch before it: the pair's in-graph time minus that launch's
    # alone (ADDED_ROWS: the cluster form after its prologue, the rope form after the qkv GEMV)
    for pair, pair_note, base, base_note, added_note in ADDED_ROWS:
        for name, T, note, us, fl, tg, n in list(rows):
            if name == pair and note.endswith(pair_note):
                ctx = note.split()[0]
                pro = next(r for r in rows if r[0] == base and r[2] == f"{ctx} {base_note}")
                # the difference's floor: the pair's (both launches' bytes) minus the launch before's
                added = (pair, T, f"{ctx} {added_note}", float("nan"), fl - pro[4], tg - pro[5], n)
                rows.insert(rows.index(pro) + 1, added)
                print(f"  {pair:28s} T={T:<5d} {added[2]}  in-graph {added[5]:8.2f} us/call "
                      f"{100 * added[4] / added[5]:5.1f}%", flush=True)
    dev = torch.cuda.get_device_name()
    head = (f"\n## Provider kernels (tools/bench_kernels.py), Qwen3-4B geometry\n\n"
            f"{datetime.date.today().isoformat()}, commit {commit()}, {dev}, torch {torch.__version__}; "
            f"floor = max(bytes / {bw / 1e12:.2f} TB/s measured D2D copy, flops / {mm / 1e12:.0f} TFLOP/s "
            f"measured bf16 matmul).\n\n"
            "| kernel | tokens | case | floor µs | standalone µs | standalone % of floor "
            "| in-graph µs/call | in-graph % of floor |\n|---|---:|---|---:|---:|---:|---:|---:|\n")
    body = "".join(
        f"| {n} | {t} | {note} | {fl:.3f} | "
        + (f"{us:.2f} | {100 * fl / us:.1f}% | " if us == us else "— | — | ")
        + (f"{tg:.2f} | {100 * fl / tg:.1f}% |" if tg is not None else "— | — |") + "\n"
        for n, t, note, us, fl, tg, _ in rows)
    sets = sorted({k for *_, tg, k in rows if tg is not None})
    note = (f"\nStandalone: median of {a.reps} CUDA-event-timed single launches, L2 flushed before each, so each "
            f"carries one isolated launch's latency and ramp-up (~4–5 µs). In-graph (decode sizes): one CUDA graph "
            f"of {L} back-to-back calls over {'/'.join(map(str, sets))} distinct input/output sets (decode "
            f"attention: the {L} layers' blocks of one layer-interleaved KV pool, as the decode program addresses "
            f"them; per-op scratch shared), median of {timer.graph_reps} replays with L2 flushed before each, "
            f"divided by {L}: the per-call cost inside the decode program's graph.\n")
    print(head + body + note)
    with open(a.md, "a") as f:
        f.write(head + body + note)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_kernels.md").write_text(head + body + note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
