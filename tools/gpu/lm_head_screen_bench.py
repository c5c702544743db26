#!/usr/bin/env python3
"""The decode program's last step, dense against screened, kernel against kernel (tools/kernels-src/lm_head_screen.cu).

    python3 tools/gpu/lm_head_screen_bench.py --kernels KDIR [--hidden 2560 --hidden 1024] [--reps 20] [--replays 30]

KDIR: a build_kernels.py dir. Per hidden size (the Qwen3 vocabulary, 151,936 rows; a seeded random head with
log-normal row scales as tools/make_random_checkpoint.py draws it, its int8 table from tools/export_weights.py's
`screen_head_rows`), one CUDA graph of `--reps` repetitions of each form, every launch a PDL launch as the decode
program makes them:
- dense: kern_gemv_norm_m1 (the `_u5` entry where gemv_plan.gemv_entry_unroll gives it for lm_head) + argmax_partial_pdl
  + argmax_reduce_pdl (the ops `gemv_norm_lm_head` and `argmax`);
- screened: kern_lmhead_screen_m1 (its `_r8` entry for k ≤ 1,024; gen_qwen3 picks their `_pP` form below) +
  kern_lmhead_pick_m1 + argmax_reduce_pdl;
- screen alone: that screen entry repeated;
- the same two for each `_pP` form of that entry (P row groups per block; the same pick and reduce after it).
Prints µs per repetition (median of the replays), the bytes each form must read (the head's bf16 or int8 bytes,
its row table) and their floor at 4.2 TB/s, and checks that both forms give the same token. A probe: prints a table,
appends nothing; `--help` needs no GPU.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tools" / "kernels-src", ROOT / "tools"):
    sys.path.insert(0, str(p))

V, EPS, BW = 151936, 1e-6, 4.2e12


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, required=True, help="a build_kernels.py dir (with its PDL forms)")
    ap.add_argument("--hidden", type=int, action="append", help="hidden sizes (default 2560 and 1024)")
    ap.add_argument("--reps", type=int, default=20, help="repetitions per graph")
    ap.add_argument("--replays", type=int, default=30)
    a = ap.parse_args(argv)
    if a.reps < 1 or a.replays < 1:
        ap.error("--reps and --replays must be at least 1")
    import numpy as np
    import torch
    from cubin_launch import KernelSet
    from export_weights import screen_head_rows
    from gemv_plan import GEMV_UNROLL_SUFFIX, gemv_entry_unroll, gemv_norm_entry_name

    torch.cuda.init()
    torch.empty(1, device="cuda")
    ks = KernelSet(a.kernels)
    BF = torch.bfloat16

    def launcher(name: str, grid: int, args: list):
        return lambda: ks.launch(name, (grid,), args, pdl=True)

    def time_graph(body) -> float:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            body()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            body()
        ts = []
        for _ in range(a.replays):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            g.replay()
            t1.record()
            torch.cuda.synchronize()
            ts.append(t0.elapsed_time(t1) * 1000 / a.reps)
        return statistics.median(ts)

    print(f"| hidden | form | µs per rep | bytes read (MB) | floor µs at 4.2 TB/s | × floor |")
    print("|---:|---|---:|---:|---:|---:|")
    for H in a.hidden or [2560, 1024]:
        torch.manual_seed(0)
        w = (torch.randn(V, H, device="cuda") * (4.0 / math.sqrt(H))
             * torch.exp(0.5 * torch.randn(V, 1, device="cuda") - 0.25)).to(BF)
        q, sc = screen_head_rows(w.view(torch.int16).cpu().numpy().view(np.uint16))
        q8, rows = torch.from_numpy(q).cuda(), torch.from_numpy(sc).cuda()
        x = (torch.randn(H, device="cuda") * 2).to(BF)
        nw = (1 + 0.1 * torch.randn(H, device="cuda")).to(BF)
        logits = torch.empty(V, dtype=BF, device="cuda")
        parts_d = math.ceil(V / 2048)
        partial_d = torch.empty(parts_d, dtype=torch.int64, device="cuda")
        out_d, out_s = (torch.full((1,), -1, dtype=torch.int64, device="cuda") for _ in range(2))
        # gen_qwen3.lm_screen_entry's rule: the 8-rows-per-warp entry where one stage holds a lane's whole row
        sname = "kern_lmhead_screen_m1_r8" if H <= 16 * 32 * ks.kernels["kern_lmhead_screen_m1_r8"]["constexprs"][
            "LOADS_PER_STAGE"] else "kern_lmhead_screen_m1"
        cx = ks.kernels[sname]["constexprs"]
        nb1, parts_s = math.ceil(V / (cx["WARPS"] * cx["ROWS_PER_WARP"])), math.ceil(V / cx["PICK_ROWS"])
        xn = torch.empty(H, dtype=BF, device="cuda")
        keys = torch.empty(V, dtype=torch.int16, device="cuda")
        bpart = torch.empty(nb1, dtype=torch.int32, device="cuda")
        partial_s = torch.empty(parts_s, dtype=torch.int64, device="cuda")
        gemv = gemv_norm_entry_name("kern_gemv_norm_m1" + GEMV_UNROLL_SUFFIX[gemv_entry_unroll(H, 1, False)], H,
                                    lambda name: name in ks.kernels)  # as gen_qwen3 --lm-head dense launches it
        dense = [launcher(gemv, math.ceil(V / 16), [x, nw, w, logits, V, H, EPS, 1]),
                 launcher("argmax_partial_pdl", parts_d, [logits, partial_d, V, parts_d]),
                 launcher("argmax_reduce_pdl", 1, [partial_d, out_d, parts_d])]
        pick = launcher("kern_lmhead_pick_m1", parts_s, [xn, w, keys, bpart, nb1, partial_s, V, H])
        reduce = launcher("argmax_reduce_pdl", 1, [partial_s, out_s, parts_s])
        # the rule's entry, then its row-group forms (`_pP`: P groups per block, ceil_div(nb1, P) blocks; the same
        # keys and bpart)
        entries = [sname] + sorted((e for e in ks.kernels if e.startswith(sname + "_p")),
                                   key=lambda e: ks.kernels[e]["constexprs"]["PASSES"])
        res: dict[str, float] = {"dense": time_graph(lambda: [f() for _ in range(a.reps) for f in dense])}
        torch.cuda.synchronize()
        dense_token = int(out_d.item())
        b = {"dense": V * H * 2}
        tokens = {}
        for e in entries:
            npass = ks.kernels[e]["constexprs"].get("PASSES", 1)
            screen = launcher(e, math.ceil(nb1 / npass), [x, nw, q8, rows, xn, keys, bpart, V, H, EPS])
            for name, seq in ((f"screened ({e})", [screen, pick, reduce]), (f"screen alone ({e})", [screen])):
                out_s.fill_(-1)
                res[name] = time_graph(lambda seq=seq: [f() for _ in range(a.reps) for f in seq])
                b[name] = V * H + V * 16
                if name.startswith("screened"):
                    torch.cuda.synchronize()
                    tokens[e] = int(out_s.item())
        for name, us in res.items():
            floor = b[name] / BW * 1e6
            print(f"| {H} | {name} | {us:.1f} | {b[name] / 1e6:.0f} | {floor:.1f} | {us / floor:.2f} |")
        cand = int((keys.to(torch.int64) & 0xFFFF).ge(int((bpart.to(torch.int64) & 0xFFFFFFFF).max())).sum())
        same = all(t == dense_token for t in tokens.values())
        print(f"| {H} | tokens {'identical' if same else 'DIFFER: ' + str(tokens)} ({dense_token}); candidates {cand} "
              "| | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
