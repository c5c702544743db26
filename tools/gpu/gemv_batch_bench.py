"""The decode GEMVs for m ≤ 8 inputs (speculative verification, small batches): gemv.cu's M entries (FMA), gemv_tc.cu's
(tensor cores) and cuBLAS side by side, on the GPU machine.

    python3 tools/gpu/gemv_batch_bench.py --kernels KDIR [--tc gemv_tc.cubin] [--geometries 4b 0.6b] [--ms 1 2 4 8]
        [--rounds 3] [--out FILE]

For each geometry, decode GEMM shape (qkv, o, gate_up, down, lm_head; the plain variant y[m, n] = x[m, k]·W[n, k]ᵀ,
bf16 in and out, fp32 accumulation) and m:

1. numerics: every timed form's [m, n] output, row by row, against float64 on fresh random inputs, the output
   NaN-poisoned first (rel. error, 2-norm, bound 1e-2); a failure is printed and makes the exit status 1;
2. standalone µs per launch: a CUDA graph of back-to-back launches rotating over ≥ 8 weight copies (> 256 MB, so
   every launch streams from HBM), median replay / launches: gemv.cu's `kern_gemv_m{M}` at ksplit 1, 2, 4 and 8 (the
   best reported with its ksplit), gemv_tc.cu's `kern_gemvtc_m{M}` (ksplit 1), torch.matmul(x, W.t()) (cuBLAS);
3. one decode token's GEMMs at m inputs (every layer's qkv, o, gate_up, down, then the lm_head; plain GEMVs) as a
   PDL chain in a CUDA graph: gemv.cu at each shape's best standalone ksplit, gemv_tc.cu, each shape on whichever of
   the two was faster alone, and cuBLAS (its own launches, no PDL); median over `--rounds` interleaved rounds of 10
   replays.

Floors: the weight bytes (x and y are < 0.1% of them) / the device-to-device copy bandwidth measured in the same run
(read + write counted, as tools/bench_gemv.py). gemv.cu's and gemv_tc.cu's modules come from the kernels dir of
tools/build_kernels.py (sha256 checked against its index); `--tc` times another build of gemv_tc.cu with the same
entries instead (a what-if, e.g. another U for M = 8). Prints the tables; appends them to --out.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

try:
    import torch
except ImportError:  # the GPU machine's; without it only --help works (main() refuses to run)
    torch = None

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_gemv as bg  # noqa: E402
from bench_gemv import I32, P, cdiv  # noqa: E402

MS = (1, 2, 4, 8)
BOUND = 1e-2


def gemv_fma(g, m, x, w, y, n, k, ks, pdl=False):
    """gemv.cu's plain entry for m inputs: grid ceil_div(n, 16 / ksplit)."""
    g.launch(f"kern_gemv_m{m}", cdiv(n, bg.rows_per_block(ks)), 0,
             [(x.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32), (ks, I32)], pdl)


def gemv_tc(g, m, x, w, y, n, k, pdl=False):
    """gemv_tc.cu's plain entry for m inputs: grid ceil_div(n, 16), ksplit 1."""
    g.launch(f"kern_gemvtc_m{m}", cdiv(n, 16), 0,
             [(x.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32), (k, I32), (1, I32)], pdl)


def cublas(x, w, y):
    torch.matmul(x, w.t(), out=y)  # cuBLAS's GEMM on the transposed view (no copy)


def forms(g, m):
    """{label: fn(x, w, y, n, k, pdl)}: gemv.cu at each ksplit, gemv_tc.cu, cuBLAS (pdl ignored)."""
    out = {f"gemv.cu ks{ks}": (lambda x, w, y, n, k, pdl=False, ks=ks: gemv_fma(g, m, x, w, y, n, k, ks, pdl))
           for ks in bg.KSPLITS}
    out["tc"] = lambda x, w, y, n, k, pdl=False: gemv_tc(g, m, x, w, y, n, k, pdl)
    out["cuBLAS"] = lambda x, w, y, n, k, pdl=False: cublas(x, w, y)
    return out


def numerics(g, geom, ms):
    """[(geom, shape, m, form, worst row's rel. error)] for every form of `forms` on fresh inputs."""
    rows = []
    for name, (n, k) in bg.shapes(geom)[0].items():
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.double() @ w.double().T
            for label, fn in forms(g, m).items():
                y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                fn(x, w, y, n, k)
                torch.cuda.synchronize()
                err = max(bg.rel_err(y[i], ref[i]) for i in range(m))
                rows.append((geom, name, m, label, err))
        del w
    return rows


def standalone(g, geom, ms, bw):
    """[(geom, shape, n×k, floor µs, m, {form: µs})] per launch, rotating over > 256 MB of weight copies."""
    out = []
    for name, (n, k) in bg.shapes(geom)[0].items():
        copies = max(8, cdiv(256 << 20, n * k * 2))
        ws = [(torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16) for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            times = {}
            for label, fn in forms(g, m).items():
                it = [0]

                def step(fn=fn):
                    fn(x, ws[it[0] % copies], y, n, k)
                    it[0] += 1
                times[label] = bg.graph_ms(step, copies) / copies * 1e3
            out.append((geom, name, f"{n}x{k}", n * k * 2 / bw * 1e6, m, times))
        del ws
    return out


def chains(g, b, m, best_ks, tc_faster, bw, rounds):
    """[(label, floor ms, ms)]: one token's plain GEMVs at m inputs as a chain in a graph over the weights of `b`
    (bench_gemv.token_buffers; gemv.cu at `best_ks` {shape: ksplit}, tc, each shape on tc where `tc_faster[shape]`
    else gemv.cu, cuBLAS)."""
    sh, weights, lm = b.sh, b.weights, b.lm
    act = {nm: torch.randn(m, sh[nm][1], device="cuda").to(torch.bfloat16) for nm in sh}  # each op's x
    outs = {nm: torch.empty(m, sh[nm][0], device="cuda", dtype=torch.bfloat16) for nm in sh}
    fs = forms(g, m)

    def chain(op):
        def fn():
            first = True
            for lw in weights:
                for nm in ("qkv", "o", "gate_up", "down"):
                    op(nm, act[nm], lw[nm], outs[nm], not first)
                    first = False
            op("lm_head", act["lm_head"], lm, outs["lm_head"], True)
        return fn

    def fma(nm, x, w, y, pdl):
        fs[f"gemv.cu ks{best_ks[nm]}"](x, w, y, *sh[nm], pdl)

    def tc(nm, x, w, y, pdl):
        fs["tc"](x, w, y, *sh[nm], pdl)

    on_tc = ", ".join(nm for nm in sh if tc_faster[nm]) or "none"
    variants = [("gemv.cu (best standalone ksplit per shape)", fma), ("tc", tc),
                (f"the faster alone per shape (tc: {on_tc})",
                 lambda nm, x, w, y, pdl: (tc if tc_faster[nm] else fma)(nm, x, w, y, pdl)),
                ("cuBLAS", lambda nm, x, w, y, pdl: fs["cuBLAS"](x, w, y, *sh[nm]))]
    graphs = [bg.capture(chain(op)) for _, op in variants]
    times = [[] for _ in variants]
    for _ in range(rounds):
        for i, gr in enumerate(graphs):
            times[i] += bg.event_times(gr.replay, 10, warmup=2)
    return [(label, b.total_bytes / bw * 1e3, statistics.median(ts)) for (label, _), ts in zip(variants, times)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", required=True, help="kernels dir of tools/build_kernels.py (its gemv.cubin and "
                    "gemv_tc.cubin are timed)")
    ap.add_argument("--tc", default=None, help="a gemv_tc.cubin to time instead of the kernels dir's (same entries)")
    ap.add_argument("--geometries", nargs="+", default=["4b", "0.6b"], choices=sorted(bg.GEOMETRIES))
    ap.add_argument("--ms", nargs="+", type=int, default=list(MS), choices=MS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if torch is None:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    torch.manual_seed(0)
    tc = Path(args.tc).read_bytes() if args.tc else bg.gemv_cubin(args.kernels, "gemv_tc.cu", "kern_gemvtc_m8",
                                                                   missing_ok=True)
    if tc is None:
        ap.error(f"{args.kernels}/index.json has no kern_gemvtc_m8 (gemv_tc.cu's M > 1 entries, session 31): rebuild "
                 "the kernels with tools/build_kernels.py")
    g = bg.Gemv(bg.gemv_cubin(args.kernels), tc=tc)
    for m in args.ms:  # a --tc build without an entry fails here, by name, not at its first launch
        for name in (f"kern_gemvtc_m{m}", f"kern_gemv_m{m}"):
            try:
                g.fn(name, 0)
            except RuntimeError as e:
                ap.error(f"{args.tc or args.kernels}: no entry `{name}` ({e}); build gemv_tc.cu of session 31 or later")

    bad = 0
    lines = ["| geometry | shape | m | form | worst row's rel. error |", "|---|---|---|---|---|"]
    for geom in args.geometries:
        for geom_, name, m, label, err in numerics(g, geom, args.ms):
            fail = not err < BOUND  # NaN fails
            bad += fail
            lines.append(f"| {geom_} | {name} | {m} | {label} | {err:.2e}{' FAIL' if fail else ''} |")
    bw = bg.copy_bandwidth()
    lines += ["", f"Copy bandwidth {bw / 1e12:.3f} TB/s (read + write); floor = weight bytes / it.", "",
              "| geometry | shape | n×k | floor µs | m | gemv.cu µs (best ksplit) | tc µs | cuBLAS µs | tc % floor | "
              "gemv.cu % floor | cuBLAS % floor |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    best, tc_faster = {}, {}
    for geom in args.geometries:
        for geom_, name, nk, floor, m, t in standalone(g, geom, args.ms, bw):
            ks, fma = min(((ks, t[f"gemv.cu ks{ks}"]) for ks in bg.KSPLITS), key=lambda p: p[1])
            best[(geom_, name, m)] = ks
            tc_faster[(geom_, name, m)] = t["tc"] < fma
            lines.append(f"| {geom_} | {name} | {nk} | {floor:.1f} | {m} | {fma:.2f} ({ks}) | {t['tc']:.2f} | "
                         f"{t['cuBLAS']:.2f} | {100 * floor / t['tc']:.0f}% | {100 * floor / fma:.0f}% | "
                         f"{100 * floor / t['cuBLAS']:.0f}% |")
    lines += ["", "| geometry | m | one token's GEMMs in a graph | floor ms | ms | % floor |", "|---|---|---|---|---|---|"]
    for geom in args.geometries:
        b = bg.token_buffers(geom)  # one geometry's weights (4B: 8 GB) at a time, shared by every m
        for m in args.ms:
            for label, floor, ms in chains(g, b, m, {nm: best[(geom, nm, m)] for nm in b.sh},
                                           {nm: tc_faster[(geom, nm, m)] for nm in b.sh}, bw, args.rounds):
                lines.append(f"| {geom} | {m} | {label} | {floor:.3f} | {ms:.3f} | {100 * floor / ms:.0f}% |")
        del b
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            tcs = f", gemv_tc.cubin from {args.tc}" if args.tc else ""
            f.write(f"\n### gemv_batch_bench ({torch.cuda.get_device_name()}, commit {bg.commit()}{tcs})\n\n{table}\n")
    if bad:
        print(f"{bad} numerics case(s) over the bound", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
