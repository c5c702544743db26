"""The tensor-core decode GEMVs (tools/kernels-src/gemv_tc.cu) against gemv.cu's, on the GPU machine.

    python3 tools/gpu/gemv_tc_probe.py --kernels KDIR [--tc gemv_tc.cubin] [--geometries 4b 0.6b] [--rounds 5]
        [--out FILE]

1. Numerics: every tc entry (plain, norm, norm_silu, residual; U = 4 and `_u5`) at every decode shape of each
   geometry against float64 on fresh random inputs, outputs poisoned with NaN first (rel. error bound 1e-2), beside
   gemv.cu's error on the same inputs; and bit-for-bit determinism (two runs).
2. Standalone: each shape, gemv.cu's entry as a `--gemv gemv-fma` manifest launches it vs the tc entries, a graph of back-to-back
   launches rotating over > 256 MB of weight copies (median replay / launches).
3. The GEMM set of one decode token in a CUDA graph as a PDL chain (bench_gemv.token_chain's order): gemv.cu as a
   `--gemv gemv-fma` manifest launches it (session 29's manifests), against chains with the tc entries on every op or on some ops; rounds interleaved,
   medians. Floors from the device-to-device copy bandwidth of the same run.

Prints the tables and appends them to --out (default: none).
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
from bench_gemv import cdiv  # noqa: E402

TC_VARIANTS = ("", "_u5")


def _unroll(u):
    """Steps per stage of the tc entry suffix `u` (TC_VARIANTS: "" is U = 4, "_u5" U = 5)."""
    return 5 if u == "_u5" else 4


# gemv_tc.cu's M = 1 entries at ksplit 1, grid ceil_div(n, 16) (norm_silu: ceil_div(n, 8) output columns): bench_gemv's
# run_tc at the unroll of suffix `u`
def tc_norm(g, x, nw, w, y, n, k, u="_u5", pdl=False):
    bg.run_tc(g, "gemv_norm", x, nw, w, y, n, k, pdl, unroll=_unroll(u))


def tc_norm_silu(g, x, nw, w, y, n, k, u="_u5", pdl=False):
    bg.run_tc(g, "gemv_norm_silu", x, nw, w, y, n, k, pdl, unroll=_unroll(u))


def tc_residual(g, x, w, r, n, k, u="_u5", pdl=False):
    bg.run_tc(g, "gemv_residual", x, None, w, r, n, k, pdl, unroll=_unroll(u))


def tc_plain(g, x, w, y, n, k, u="_u5", pdl=False):
    bg.run_tc(g, "gemv", x, None, w, y, n, k, pdl, unroll=_unroll(u))


def numerics(g, geom):
    """Rel. errors vs float64 of every tc entry and of gemv.cu's ksplit-1 entry on the same inputs."""
    rows = []
    for name, (n, k) in bg.shapes(geom)[0].items():
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        r0 = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
        xn = bg.rmsnorm_ref(x, nw).double()
        half = n // 2
        gu = xn @ w.double().T
        refs = {"plain": x.double() @ w.double().T, "norm": gu,
                "norm_silu": torch.nn.functional.silu(gu[:, :half]) * gu[:, half:],
                "residual": r0.double() + x.double() @ w.double().T}

        def run(kind, form):
            out = torch.full((1, half if kind == "norm_silu" else n), float("nan"), device="cuda",
                             dtype=torch.bfloat16)
            if kind == "residual":
                out.copy_(r0)
            if form == "gemv":
                {"plain": lambda: bg.run_plain(g, x, w, out, n, k),
                 "norm": lambda: bg.run_norm(g, x, nw, w, out, n, k),
                 "norm_silu": lambda: bg.run_norm_silu(g, x, nw, w, out, half, k),
                 "residual": lambda: bg.run_residual(g, x, w, out, n, k)}[kind]()
            else:
                {"plain": lambda: tc_plain(g, x, w, out, n, k, form),
                 "norm": lambda: tc_norm(g, x, nw, w, out, n, k, form),
                 "norm_silu": lambda: tc_norm_silu(g, x, nw, w, out, half, k, form),
                 "residual": lambda: tc_residual(g, x, w, out, n, k, form)}[kind]()
            torch.cuda.synchronize()
            return out

        for kind, ref in refs.items():
            e_gemv = bg.rel_err(run(kind, "gemv"), ref)
            for u in TC_VARIANTS:
                a, b = run(kind, u), run(kind, u)
                rows.append((geom, name, kind, u or "_u4", bg.rel_err(a, ref), e_gemv, torch.equal(a, b)))
    return rows


def standalone(g, geom, bw):
    """µs per launch: gemv.cu as a gemv-fma manifest launches it (run_shape at its ksplit) vs tc U4 / U5."""
    out = []
    sh, _ = bg.shapes(geom)
    for name, (n, k) in sh.items():
        copies = max(8, cdiv(256 << 20, n * k * 2))
        ws = [(torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        nw = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        it = [0]
        ks = int(r) if (r := bg.rule_ksplit(name, n, k)) != "-" else 1

        def nxt():
            w = ws[it[0] % copies]
            it[0] += 1
            return w

        def ours():
            bg.run_shape(g, name, x, nw, nxt(), y, n, k, ks)

        def tc(u):
            def f():
                w = nxt()
                if name in ("qkv", "lm_head"):
                    tc_norm(g, x, nw, w, y, n, k, u)
                elif name == "gate_up":
                    tc_norm_silu(g, x, nw, w, y, n // 2, k, u)
                else:
                    tc_residual(g, x, w, y, n, k, u)
            return f

        t = [bg.graph_ms(f, copies) / copies for f in (ours, tc(""), tc("_u5"))]
        out.append((geom, name, f"{n}x{k}", n * k * 2 / bw * 1e3, ks, *t))
        del ws
    return out


def chains(g, geom, bw, rounds):
    """The GEMM set of one token as PDL chains in graphs: gemv.cu (a gemv-fma manifest's entries and ksplits) and tc
    forms."""
    b = bg.token_buffers(geom)
    sh, weights, lm, h, resid, nw = b.sh, b.weights, b.lm, b.h, b.resid, b.nw
    qkv, attn, act, logits, total = b.qkv, b.attn, b.act, b.logits, b.total_bytes
    ks = {nm: int(r) if (r := bg.rule_ksplit(nm, *sh[nm])) != "-" else 1 for nm in sh}

    def gemv_op(nm):
        kw = dict(ks=ks[nm], before_attention=bg.BEFORE_ATTENTION[nm])
        return {"qkv": lambda x, w, y, n, kk, pdl: bg.run_norm(g, x, nw, w, y, n, kk, pdl=pdl, **kw),
                "lm_head": lambda x, w, y, n, kk, pdl: bg.run_norm(g, x, nw, w, y, n, kk, pdl=pdl, **kw),
                "gate_up": lambda x, w, y, n, kk, pdl: bg.run_norm_silu(g, x, nw, w, y, n, kk, pdl=pdl, **kw),
                "o": lambda x, w, y, n, kk, pdl: bg.run_residual(g, x, w, y, n, kk, pdl=pdl, **kw),
                "down": lambda x, w, y, n, kk, pdl: bg.run_residual(g, x, w, y, n, kk, pdl=pdl, **kw)}[nm]

    def tc_op(nm, u):
        return {"qkv": lambda x, w, y, n, kk, pdl: tc_norm(g, x, nw, w, y, n, kk, u, pdl),
                "lm_head": lambda x, w, y, n, kk, pdl: tc_norm(g, x, nw, w, y, n, kk, u, pdl),
                "gate_up": lambda x, w, y, n, kk, pdl: tc_norm_silu(g, x, nw, w, y, n, kk, u, pdl),
                "o": lambda x, w, y, n, kk, pdl: tc_residual(g, x, w, y, n, kk, u, pdl),
                "down": lambda x, w, y, n, kk, pdl: tc_residual(g, x, w, y, n, kk, u, pdl)}[nm]

    def chain(ops):
        def fn():
            for i, lw in enumerate(weights):
                ops["qkv"](resid, lw["qkv"], qkv, sh["qkv"][0], h, i > 0)
                ops["o"](attn, lw["o"], resid, h, sh["o"][1], True)
                ops["gate_up"](resid, lw["gate_up"], act, sh["down"][1], h, True)
                ops["down"](act, lw["down"], resid, h, sh["down"][1], True)
            ops["lm_head"](resid, lm, logits, sh["lm_head"][0], h, True)
        return fn

    base = {nm: gemv_op(nm) for nm in sh}
    variants = [("gemv.cu (`--gemv gemv-fma`: session 29's manifests)", base),
                ("tc _u5 on every op", {nm: tc_op(nm, "_u5") for nm in sh}),
                ("tc U4 on every op", {nm: tc_op(nm, "") for nm in sh}),
                ("tc _u5 on the layer ops, lm_head gemv.cu", {**{nm: tc_op(nm, "_u5") for nm in sh}, "lm_head": base["lm_head"]})]
    for one in ("qkv", "o", "gate_up", "down"):
        variants.append((f"tc _u5 on {one} only", {**base, one: tc_op(one, "_u5")}))
    variants.append(("tc _u5 on o and down", {**base, "o": tc_op("o", "_u5"), "down": tc_op("down", "_u5")}))
    variants.append(("tc U4 on o and down (session 30's default)", {**base, "o": tc_op("o", ""),
                                                                             "down": tc_op("down", "")}))
    resid0 = resid.clone()
    graphs = []
    for _, ops in variants:
        resid.copy_(resid0)
        graphs.append(bg.capture(chain(ops)))
    times = [[] for _ in variants]
    for _ in range(rounds):
        for i, gr in enumerate(graphs):
            resid.copy_(resid0)
            times[i] += bg.event_times(gr.replay, 10, warmup=2)
    out = []
    for (label, _), ts in zip(variants, times):
        out.append((geom, label, total, total / bw * 1e3, statistics.median(ts)))
    del b, weights, graphs  # b holds the weights too
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", required=True, help="kernels dir (gemv.cubin, sha256 checked)")
    ap.add_argument("--tc", default=None, help="a gemv_tc.cubin to use instead of the kernels dir's")
    ap.add_argument("--geometries", nargs="+", default=["4b", "0.6b"], choices=sorted(bg.GEOMETRIES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if torch is None:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    torch.manual_seed(0)
    g = bg.Gemv(bg.gemv_cubin(args.kernels),
                tc=Path(args.tc).read_bytes() if args.tc else bg.gemv_cubin(args.kernels, "gemv_tc.cu", "kern_gemvtc_m1"))
    lines = ["| geometry | shape | op | tc form | tc rel. err | gemv.cu rel. err | tc deterministic |",
             "|---|---|---|---|---|---|---|"]
    bad = 0
    for geom in args.geometries:
        for geom_, name, kind, u, e, e0, det in numerics(g, geom):
            ok = e < 1e-2 and det
            bad += not ok
            lines.append(f"| {geom_} | {name} | {kind} | {u} | {e:.2e} | {e0:.2e} | {det}{'' if ok else ' FAIL'} |")
    bw = bg.copy_bandwidth()
    lines += ["", f"Copy bandwidth {bw / 1e12:.3f} TB/s.", "",
              "| geometry | shape | n×k | floor µs | manifest ksplit | gemv.cu µs | tc U4 µs | tc _u5 µs |",
              "|---|---|---|---|---|---|---|---|"]
    for geom in args.geometries:
        for geom_, name, nk, floor, ks, t0, t4, t5 in standalone(g, geom, bw):
            lines.append(f"| {geom_} | {name} | {nk} | {floor * 1e3:.1f} | {ks} | {t0 * 1e3:.2f} | {t4 * 1e3:.2f} | "
                         f"{t5 * 1e3:.2f} |")
    lines += ["", "| geometry | one token's GEMMs, PDL chain in a graph | floor ms | ms | % floor |", "|---|---|---|---|---|"]
    for geom in args.geometries:
        for geom_, label, nbytes, floor, ms in chains(g, geom, bw, args.rounds):
            lines.append(f"| {geom_} | {label} | {floor:.3f} | {ms:.3f} | {100 * floor / ms:.0f}% |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(f"\n### gemv_tc_probe ({torch.cuda.get_device_name()}, commit {bg.commit()})\n\n{table}\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
