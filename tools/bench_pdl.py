"""Programmatic dependent launch (PDL) for the decode GEMVs (tools/kernels-src/gemv.cu).

Runs on the GPU machine (torch for allocation, the cuBLAS peer and CUDA graphs;
cuda.bindings for module load and launches):

    python3 tools/bench_pdl.py [--geometries 4b 0.6b] [--ksplit o=2,down=2] [--out BENCHMARKS.md]
    python3 tools/bench_pdl.py --l2-prefetch [--kernels DIR] [--geometries 4b 0.6b] [--out FILE.md]

For one decode token's GEMV sequence (every layer: qkv with the input norm, o with the
residual add, gate_up with the norm and SiLU-and-mul, down with the residual add; then
lm_head with the final norm — the sequence of tools/bench_gemv.py's token graph) it
captures one CUDA graph per variant:

- `no PDL`: plain `cuLaunchKernel` (griddepcontrol.* are no-ops without the attribute);
- `PDL, trigger T` for T = 0, 1, 2: every launch after the first through
  `cuLaunchKernelEx` with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1, the
  cubin built with -DGEMV_PDL_TRIGGER=T (0: no launch_dependents, the next kernel launches
  as blocks exit; 1: right after the pre-wait weight stages are issued; 2: after the dot loop);
- cuBLAS (torch.matmul) for reference;

then (1) checks numerics: from the same initial residual, one replay of every variant
must give bit-identical final residual, logits, qkv and activations (a PDL ordering bug
shows up as a difference), and (2) times each graph's replay (median of CUDA-event
timings, variants interleaved in rounds) against the floor: weight bytes / measured
device-to-device copy bandwidth (read + write). Prints a table and appends it to
BENCHMARKS.md (date, commit — from git, else env KERN_COMMIT —, machine).

With `--l2-prefetch` it runs the L2-prefetch study instead (gemv.cu's `_pf` forms,
`build_kernels.py --l2-prefetch`; kernels from `--kernels DIR` — its gemv.cubin and gemv_pf.cubin,
sha256 checked against its index — else compiled here as build_kernels.py compiles them), every
graph a PDL chain (trigger 1, the default build):

- `prefetch P`: every GEMV is its `_pf` form and prefetches the first min(P, next weight) bytes
  of the next GEMV's weight into L2 (qkv → o → gate_up → down → next layer's qkv → … → lm_head;
  lm_head prefetches nothing), P in `--pf-mb` (default 0 2 4 8 16 all; all = the whole next
  weight, capped at 24 MB), beside the plain kernels' chain (gemv.cubin, no prefetch);
- the same at P = 8 MB and all with gemv_pf.cubin compiled here with other build options
  (`-DGEMV_PF_AT=0`: issued at kernel start, before the wait; `-DGEMV_PF_AT=2`: after the dot
  loop; `-DGEMV_PF_EVICT_FIRST=0`: plain loads);
- `idle gap`: a kernel spinning `--gap-us` µs (4 CTAs, griddepcontrol.wait then launch_dependents
  then a %globaltimer loop: qk-norm/rope + attention's place) between qkv and o of every layer,
  with no prefetch, with qkv prefetching all of o (others nothing), and with every GEMV
  prefetching all of its next weight (≤ 24 MB);
- `exit check`: whether a prefetch issued by blocks that then exit lands in L2: one o-proj GEMV
  timed after a 256 MB L2 flush and a 20 µs spin, cold vs after a `_pf` kernel with no work of
  its own (132 blocks, k = 8) prefetched its whole weight before the spin vs after a full read
  of it (L2-warm bound).

Numerics as above: every chain (plain, each `_pf` variant, with or without the gap) must give
bit-identical final residual, logits, qkv and activations. The table goes to `--out`.

Exit status 1 when a numerics check fails.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
except ImportError:  # the GPU machine's; without it only --help works (main() refuses to run)
    torch = None
from cuda.bindings import driver as cu

from bench_gemv import (  # shared with the GEMV bench (Gemv: module load, PDL launches; gemv.cu's launchers)
    GEOMETRIES, Gemv, capture, cdiv, check, commit, copy_bandwidth, event_times, machine, rows_per_block, shapes,
    token_chain)

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tools" / "kernels-src" / "gemv.cu"

EPS = 1e-6
TRIGGERS = (0, 1, 2)

P = ctypes.c_void_p
I32 = ctypes.c_int
F32 = ctypes.c_float


def build(trigger: int, out: Path) -> bytes:
    """gemv.cu → sm_90 cubin with -DGEMV_PDL_TRIGGER=trigger."""
    nvcc = os.environ.get("NVCC", "nvcc")
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", f"-DGEMV_PDL_TRIGGER={trigger}", "-o", str(out), str(SRC)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed (trigger {trigger}):\n{r.stdout}\n{r.stderr}")
    return out.read_bytes()


def token_buffers(geom):
    """One decode token's GEMV operands on the GPU, drawn from a seeded generator (seed 0):
    (shapes, layers, per-layer weights {qkv, o, gate_up, down}, lm_head weight, hidden size,
    initial residual, residual, norm weight, qkv out, attention out (random), MLP activation out);
    bf16, weights N(0, 0.05²)."""
    sh, layers = shapes(geom)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    weights = [{nm: randn(*sh[nm], scale=0.05) for nm in ("qkv", "o", "gate_up", "down")} for _ in range(layers)]
    lm = randn(*sh["lm_head"], scale=0.05)
    h = sh["o"][0]
    resid0 = randn(1, h)
    resid = resid0.clone()
    nw = (1 + 0.1 * torch.randn(h, device="cuda", generator=gen)).to(torch.bfloat16)
    qkv = torch.empty(1, sh["qkv"][0], device="cuda", dtype=torch.bfloat16)
    attn = randn(1, sh["o"][1])
    act = torch.empty(1, sh["down"][1], device="cuda", dtype=torch.bfloat16)
    return sh, layers, weights, lm, h, resid0, resid, nw, qkv, attn, act


def token(geom, builds, bw, ks, rounds, iters):
    """One decode token's GEMV sequence in a CUDA graph per variant: numerics and timing.
    Returns (rows, ok): rows (geometry, variant, bytes, floor ms, median ms, launches)."""
    sh, layers, weights, lm, h, resid0, resid, nw, qkv, attn, act = token_buffers(geom)
    gu = torch.empty(1, sh["gate_up"][0], device="cuda", dtype=torch.bfloat16)
    o = torch.empty(1, h, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(1, sh["lm_head"][0], device="cuda", dtype=torch.bfloat16)
    total_bytes = sum(w.numel() * 2 for lw in weights for w in lw.values()) + lm.numel() * 2
    launches = 4 * layers + 1

    def ours(g, pdl):
        return token_chain(g, sh, weights, lm, resid, nw, qkv, attn, act, logits, ks, pdl)

    def cublas():
        for lw in weights:
            torch.matmul(resid, lw["qkv"].T, out=qkv)
            torch.matmul(attn, lw["o"].T, out=o)
            torch.matmul(resid, lw["gate_up"].T, out=gu)
            torch.matmul(act, lw["down"].T, out=o)
        torch.matmul(resid, lm.T, out=logits)

    variants = [("kern gemv, no PDL", ours(builds[2], False), True)]
    variants += [(f"kern gemv, PDL, trigger {t}", ours(builds[t], True), True) for t in TRIGGERS]
    variants.append(("cuBLAS (torch.matmul), no PDL", cublas, False))
    graphs = []
    for label, fn, _ in variants:
        resid.copy_(resid0)
        graphs.append(capture(fn))

    # numerics: same start, one replay each, bit-identical outputs among our variants
    ok = True
    ref = None
    for (label, _, mine), graph in zip(variants, graphs):
        if not mine:
            continue
        resid.copy_(resid0)
        for t in (qkv, act, logits):
            t.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        outs = [t.clone() for t in (resid, logits, qkv, act)]
        bad = [name for name, t in zip(("residual", "logits", "qkv", "act"), outs) if torch.isnan(t.float()).any()]
        if ref is None:
            ref = outs
            status = "reference" + (f"; NaN in {', '.join(bad)}" if bad else "")
            ok &= not bad
        else:
            diff = [name for name, a, b in zip(("residual", "logits", "qkv", "act"), outs, ref) if not torch.equal(a, b)]
            status = "bit-identical to no PDL" if not diff else f"DIFFERS from no PDL in {', '.join(diff)}"
            ok &= not diff and not bad
        print(f"  {geom:5s} {label:32s} {status}")

    # timing: variants interleaved in rounds (drift and clocks hit all alike)
    times: list[list[float]] = [[] for _ in variants]
    resid.copy_(resid0)
    for _ in range(rounds):
        for i, graph in enumerate(graphs):
            times[i] += event_times(graph.replay, iters, warmup=3)
    floor = total_bytes / bw * 1e3
    rows = [(geom, label, total_bytes, floor, statistics.median(ts), launches)
            for (label, _, _), ts in zip(variants, times)]
    del graphs, weights
    torch.cuda.synchronize()
    return rows, ok


# ------------------------------------------------------------------ L2 prefetch study (--l2-prefetch)

U64 = ctypes.c_uint64
MB = 1 << 20
#: "all" in the sweep: the whole next weight, at most this many bytes.
PF_CAP = 24 * MB
PF_SWEEP = ("0", "2", "4", "8", "16", "all")
#: gemv_pf.cubin compiled here with other build options, run at these P (label, extra -D).
PF_BUILDS = (("issued at kernel start, -DGEMV_PF_AT=0", ("GEMV_PF_AT=0",)),
             ("issued after the dot loop, -DGEMV_PF_AT=2", ("GEMV_PF_AT=2",)),
             ("plain weight loads, -DGEMV_PF_EVICT_FIRST=0", ("GEMV_PF_EVICT_FIRST=0",)))
PF_BUILD_SWEEP = ("8", "all")
SPIN_CTAS = 4
#: The idle-gap stand-in: waits for its predecessor (PDL), lets its successor launch, spins.
SPIN_SRC = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


def pf_cubins(kernels_dir: str | None, tmp: str) -> tuple[bytes, bytes, dict[str, bytes], bytes]:
    """(gemv.cubin, gemv_pf.cubin, {label: gemv_pf.cubin of a PF_BUILDS option}, the spin kernel's cubin).
    The first two from `kernels_dir` (sha256 checked against its index), else compiled here the way
    tools/build_kernels.py compiles them; the others always compiled here (in parallel)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_kernels as bk

    jobs = {}
    if not kernels_dir:
        jobs["plain"] = bk.start_cuda("gemv.cu", tmp, (), "gemv.cubin")
        jobs["pf"] = bk.start_cuda("gemv.cu", tmp, ("GEMV_L2_PREFETCH",), "gemv_pf.cubin")
    for i, (label, defines) in enumerate(PF_BUILDS):
        jobs[label] = bk.start_cuda("gemv.cu", tmp, ("GEMV_L2_PREFETCH",) + defines, f"gemv_pf_{i}.cubin")
    src = Path(tmp) / "spin.cu"
    src.write_text(SPIN_SRC)
    spin_out = Path(tmp) / "spin.cubin"
    jobs["spin"] = (subprocess.Popen([bk._nvcc(), "-cubin", "-arch=sm_90", "-O3", "-o", str(spin_out), str(src)]),
                    spin_out)
    try:
        built = {label: bk.finish_cuda(job) for label, job in jobs.items()}
    finally:
        for proc, _ in jobs.values():
            proc.wait()
    if kernels_dir:
        d = Path(kernels_dir)
        index = json.loads((d / "index.json").read_text())["kernels"]
        for label, name in (("plain", "kern_gemv_m1"), ("pf", "kern_gemv_m1_pf")):
            if name not in index:
                raise SystemExit(f"{d}/index.json has no {name}: build it with tools/build_kernels.py --l2-prefetch")
            data = (d / index[name]["module"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != index[name]["sha256"]:
                raise SystemExit(f"{d / index[name]['module']}: sha256 differs from {d / 'index.json'} (stale build?)")
            built[label] = data
    extra = {label: built[label] for label, _ in PF_BUILDS}
    return built["plain"], built["pf"], extra, built["spin"]


def pf_bytes(p: str, next_bytes: int) -> int:
    """Bytes of the next weight a GEMV prefetches for sweep value `p` (MB, or "all" capped at PF_CAP)."""
    return min(next_bytes, PF_CAP) if p == "all" else min(next_bytes, int(p) * MB)


def prefetch_study(geom, plain, pf, extra, spin, bw, ks, rounds, iters, sweep, gap_us):
    """One decode token's GEMV chain (PDL, trigger 1) in CUDA graphs: plain kernels, `_pf` forms at each
    prefetch size, the extra builds, and the idle-gap chains, then `exit_check`. Returns (rows, exit
    rows, ms of one spin kernel, ok); rows (geometry, label, bytes, floor ms, ms, launches, label of
    the row it is compared with)."""
    sh, layers, weights, lm, h, resid0, resid, nw, qkv, attn, act = token_buffers(geom)
    logits = torch.empty(1, sh["lm_head"][0], device="cuda", dtype=torch.bfloat16)
    total_bytes = sum(w.numel() * 2 for lw in weights for w in lw.values()) + lm.numel() * 2
    inter = sh["down"][1]

    def norm(role, x, w, y, n, k):
        return dict(role=role, w=w, name="kern_gemv_norm_m1", grid=cdiv(n, rows_per_block(ks[role])), smem=k * 2,
                    args=[(x.data_ptr(), P), (nw.data_ptr(), P), (w.data_ptr(), P), (y.data_ptr(), P), (n, I32),
                          (k, I32), (EPS, F32), (ks[role], I32)])

    steps = []
    for lw in weights:
        steps.append(norm("qkv", resid, lw["qkv"], qkv, sh["qkv"][0], h))
        steps.append(dict(role="o", w=lw["o"], name="kern_gemv_residual_m1", grid=cdiv(h, rows_per_block(ks["o"])),
                          smem=0, args=[(attn.data_ptr(), P), (lw["o"].data_ptr(), P), (resid.data_ptr(), P),
                                        (h, I32), (sh["o"][1], I32), (ks["o"], I32)]))
        steps.append(dict(role="gate_up", w=lw["gate_up"], name="kern_gemv_norm_silu_m1",
                          grid=cdiv(inter, rows_per_block(ks["gate_up"]) // 2), smem=h * 2,
                          args=[(resid.data_ptr(), P), (nw.data_ptr(), P), (lw["gate_up"].data_ptr(), P),
                                (act.data_ptr(), P), (inter, I32), (h, I32), (EPS, F32), (ks["gate_up"], I32)]))
        steps.append(dict(role="down", w=lw["down"], name="kern_gemv_residual_m1",
                          grid=cdiv(h, rows_per_block(ks["down"])), smem=0,
                          args=[(act.data_ptr(), P), (lw["down"].data_ptr(), P), (resid.data_ptr(), P), (h, I32),
                                (inter, I32), (ks["down"], I32)]))
    steps.append(norm("lm_head", resid, lm, logits, sh["lm_head"][0], h))
    nxt = [steps[i + 1]["w"].numel() * 2 if i + 1 < len(steps) else 0 for i in range(len(steps))]
    launches = len(steps)

    def chain(g, amounts=None, gap=False):
        """The chain as one function: `g` the plain module (amounts None) or a `_pf` module, step i
        prefetching amounts[i] bytes of step i+1's weight; `gap`: the spin kernel after every qkv."""
        def fn():
            for i, st in enumerate(steps):
                pdl = i > 0  # the graph's first launch has no kernel before it
                if amounts is None:
                    g.launch(st["name"], st["grid"], st["smem"], st["args"], pdl)
                else:
                    nb = amounts[i]
                    ptr = steps[i + 1]["w"].data_ptr() if nb else 0
                    g.launch(st["name"] + "_pf", st["grid"], st["smem"], st["args"] + [(ptr, P), (nb, U64)], pdl)
                if gap and st["role"] == "qkv":
                    spin.launch("spin_ns", SPIN_CTAS, 0, [(int(gap_us * 1000), U64)], True)
        return fn

    def sweep_amounts(p):
        return [pf_bytes(p, b) for b in nxt]

    def mb(p):
        return "all of the next weight (≤ 24 MB)" if p == "all" else f"{p} MB of the next weight"

    only_o = [nxt[i] if st["role"] == "qkv" else 0 for i, st in enumerate(steps)]
    plain_label = "plain kernels (gemv.cubin), no prefetch"
    gap_label = f"idle gap {gap_us:g} µs after qkv, plain kernels"
    variants = [(plain_label, chain(plain), plain_label)]
    variants += [(f"_pf, prefetch {mb(p)}", chain(pf, sweep_amounts(p)), plain_label) for p in sweep]
    variants += [(f"_pf {label}, prefetch {mb(p)}", chain(g, sweep_amounts(p)), plain_label)
                 for label, g in extra.items() for p in PF_BUILD_SWEEP]
    variants += [(gap_label, chain(plain, gap=True), gap_label),
                 ("idle gap, _pf, no prefetch", chain(pf, [0] * len(steps), gap=True), gap_label),
                 ("idle gap, _pf, qkv prefetches all of o", chain(pf, only_o, gap=True), gap_label),
                 ("idle gap, _pf, prefetch all of the next weight (≤ 24 MB)", chain(pf, sweep_amounts("all"), gap=True),
                  gap_label)]
    graphs = []
    for _, fn, _ in variants:
        resid.copy_(resid0)
        graphs.append(capture(fn))

    ok, ref = True, None
    names = ("residual", "logits", "qkv", "act")
    for (label, _, _), graph in zip(variants, graphs):
        resid.copy_(resid0)
        for t in (qkv, act, logits):
            t.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        outs = [t.clone() for t in (resid, logits, qkv, act)]
        bad = [nm for nm, t in zip(names, outs) if torch.isnan(t.float()).any()]
        if ref is None:
            ref = outs
            status = "reference" + (f"; NaN in {', '.join(bad)}" if bad else "")
        else:
            diff = [nm for nm, a, b in zip(names, outs, ref) if not torch.equal(a, b)]
            status = "bit-identical to the plain chain" if not diff else f"DIFFERS from the plain chain in {', '.join(diff)}"
            ok &= not diff
        ok &= not bad
        print(f"  {geom:5s} {label:72s} {status}")

    # the gap kernel alone: L spins back to back in a graph (no PDL), per spin
    spin_graph = capture(lambda: [spin.launch("spin_ns", SPIN_CTAS, 0, [(int(gap_us * 1000), U64)], False)
                                  for _ in range(layers)])
    times: list[list[float]] = [[] for _ in variants]
    spin_times: list[float] = []
    resid.copy_(resid0)
    for _ in range(rounds):
        for i, graph in enumerate(graphs):
            times[i] += event_times(graph.replay, iters, warmup=3)
        spin_times += event_times(spin_graph.replay, 5, warmup=1)
    spin_ms = statistics.median(spin_times) / layers
    floor = total_bytes / bw * 1e3
    rows = []
    for (label, _, ref_label), ts in zip(variants, times):
        f = floor + (layers * spin_ms if label.startswith("idle gap") else 0.0)
        rows.append((geom, label, total_bytes, f, statistics.median(ts), launches + (layers if f > floor else 0), ref_label))
    del graphs, spin_graph
    exit_rows = exit_check(geom, weights[0]["o"], attn, resid, plain, pf, spin, ks["o"], rounds * iters // 2)
    torch.cuda.synchronize()
    return rows, exit_rows, spin_ms, ok


def exit_check(geom, w, x, resid, plain, pf, spin, ks_o, reps):
    """Does a prefetch issued by blocks that then exit land in L2? The o-proj GEMV (weight `w`) timed
    after a 256 MB L2 flush and a 20 µs spin: cold; after a `_pf` kernel with no work of its own
    (132 blocks of kern_gemv_m1_pf, k = 8, exiting right after they issue) prefetched all of `w`
    before the spin; after a full read of `w` (an o-proj GEMV) before the spin (the L2-warm bound).
    Returns rows (geometry, case, MB, median µs)."""
    n, k = w.shape
    nbytes = w.numel() * 2
    flush = torch.empty(256 * MB, dtype=torch.uint8, device="cuda")
    dn = 132 * rows_per_block(1)
    dx = torch.zeros(1, 8, device="cuda", dtype=torch.bfloat16)
    dw = torch.zeros(dn, 8, device="cuda", dtype=torch.bfloat16)
    dy = torch.empty(1, dn, device="cuda", dtype=torch.bfloat16)

    def o_proj():
        plain.launch("kern_gemv_residual_m1", cdiv(n, rows_per_block(ks_o)), 0,
                     [(x.data_ptr(), P), (w.data_ptr(), P), (resid.data_ptr(), P), (n, I32), (k, I32), (ks_o, I32)],
                     False)

    def prefetcher():
        pf.launch("kern_gemv_m1_pf", cdiv(dn, rows_per_block(1)), 0,
                  [(dx.data_ptr(), P), (dw.data_ptr(), P), (dy.data_ptr(), P), (dn, I32), (8, I32), (1, I32),
                   (w.data_ptr(), P), (nbytes, U64)], False)

    cases = [("cold (flush, spin)", None), ("after an exited _pf kernel prefetched all of it (flush, prefetch, spin)",
                                            prefetcher), ("L2-warm bound (flush, full read, spin)", o_proj)]
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(reps):
        for i, (_, before) in enumerate(cases):
            flush.zero_()
            if before is not None:
                before()
            spin.launch("spin_ns", 1, 0, [(20_000, U64)], False)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            o_proj()
            e.record()
            e.synchronize()
            times[i].append(s.elapsed_time(e))
    del flush
    return [(geom, label, nbytes / 1e6, statistics.median(ts) * 1e3) for (label, _), ts in zip(cases, times)]


def main_prefetch(args, ks) -> int:
    sweep = tuple(args.pf_mb)
    for p in sweep:
        if p != "all" and not p.isdigit():
            raise SystemExit(f"--pf-mb: {p!r} is neither a number of MB nor 'all'")
    check(cu.cuInit(0))
    torch.zeros(1, device="cuda")  # makes torch's primary context current
    with tempfile.TemporaryDirectory() as d:
        plain_c, pf_c, extra_c, spin_c = pf_cubins(args.kernels, d)
    plain, pf, spin = Gemv(plain_c), Gemv(pf_c), Gemv(spin_c)
    extra = {label: Gemv(c) for label, c in extra_c.items()}
    bw = copy_bandwidth()
    print(f"== device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s")
    print("== numerics (one replay from the same residual; every chain must agree bit for bit)")
    rows, exits, spins, ok = [], [], {}, True
    for geom in args.geometries:
        r, x, spin_ms, good = prefetch_study(geom, plain, pf, extra, spin, bw, ks, args.rounds, args.iters, sweep,
                                             args.gap_us)
        rows += r
        exits += x
        spins[geom] = spin_ms
        ok &= good
    lines = ["| geometry | one decode token's GEMVs, PDL chain in a CUDA graph | launches | GB | floor ms | ms | "
             "% floor | vs reference |", "|---|---|---|---|---|---|---|---|"]
    ms_of = {(g, label): ms for g, label, _, _, ms, _, _ in rows}
    for geom, label, nbytes, floor, ms, n, ref_label in rows:
        base = ms_of[(geom, ref_label)]
        rel = "reference" if label == ref_label else f"{1e3 * (ms - base):+.1f} µs ({100 * (ms / base - 1):+.1f}%)"
        lines.append(f"| {geom} | {label} | {n} | {nbytes / 1e9:.2f} | {floor:.3f} | {ms:.3f} | {100 * floor / ms:.0f}% "
                     f"| {rel} |")
    lines += ["", "| geometry | exit check: one o-proj GEMV after a 256 MB flush and a 20 µs spin | MB | µs |",
              "|---|---|---|---|"]
    lines += [f"| {g} | {label} | {mbytes:.1f} | {us:.1f} |" for g, label, mbytes, us in exits]
    table = "\n".join(lines)
    print()
    print(table)
    if not ok:
        print("\nNUMERICS CHECK FAILED: see above (table not appended)")
        return 1
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    src = f"kernels dir {args.kernels}" if args.kernels else "gemv.cu compiled here as build_kernels.py does"
    with open(args.out, "a") as f:
        f.write(f"\n## Decode GEMV with L2 prefetch of the next weight (tools/bench_pdl.py --l2-prefetch) — {stamp}, "
                f"commit {commit()}, {machine()}\n\n")
        f.write(f"Copy bandwidth {bw / 1e12:.3f} TB/s (read+write); floor = weight bytes / copy bandwidth (idle-gap rows: "
                f"+ layers × the spin kernel's own time, "
                + ", ".join(f"{g} {1e3 * v:.1f} µs" for g, v in spins.items())
                + f"); m = 1; ksplit {', '.join(f'{k}={v}' for k, v in ks.items())}; median of {args.rounds}×{args.iters} "
                f"replays, variants interleaved; {src}. Every chain a PDL chain (trigger 1); `_pf` = gemv_pf.cubin "
                "(default build: prefetch issued when each block's warp 0 has its last weight stage in flight, "
                "weight loads L2::evict_first); each GEMV prefetches the first P bytes of the next GEMV's weight "
                "(lm_head: none). Final residual, logits, qkv and activations of every chain bit-identical to the "
                "plain chain.\n\n")
        f.write(table + "\n")
    return 0


def parse_ksplit(text: str) -> dict[str, int]:
    out = {nm: 1 for nm in ("qkv", "o", "gate_up", "down", "lm_head")}
    for part in filter(None, (text or "").split(",")):
        name, _, val = part.partition("=")
        if name not in out or not val.isdigit() or int(val) not in (1, 2, 4, 8):
            raise SystemExit(f"--ksplit: bad entry {part!r} (shape=1|2|4|8, shapes {', '.join(out)})")
        out[name] = int(val)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometries", nargs="+", default=["4b"], choices=sorted(GEOMETRIES))
    ap.add_argument("--ksplit", default="", help="per-shape ksplit, e.g. o=2,down=2 (default 1 everywhere)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--l2-prefetch", action="store_true",
                    help="the L2-prefetch study (gemv.cu _pf forms) instead of the trigger comparison")
    ap.add_argument("--kernels", default=None,
                    help="--l2-prefetch: kernels dir of tools/build_kernels.py --l2-prefetch (default: compile here)")
    ap.add_argument("--pf-mb", nargs="+", default=list(PF_SWEEP),
                    help="--l2-prefetch: prefetch sizes, MB of the next weight or 'all' (default: %(default)s)")
    ap.add_argument("--gap-us", type=float, default=8.0, help="--l2-prefetch: the idle gap after each qkv, µs")
    args = ap.parse_args(argv)
    if torch is None:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    ks = parse_ksplit(args.ksplit)
    if args.l2_prefetch:
        return main_prefetch(args, ks)

    check(cu.cuInit(0))
    torch.zeros(1, device="cuda")  # makes torch's primary context current
    with tempfile.TemporaryDirectory() as d:
        builds = {t: Gemv(build(t, Path(d) / f"gemv_t{t}.cubin")) for t in TRIGGERS}
    bw = copy_bandwidth()
    print(f"== device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s")
    print("== numerics (one replay from the same residual; our variants must agree bit for bit)")
    rows, ok = [], True
    for geom in args.geometries:
        r, good = token(geom, builds, bw, ks, args.rounds, args.iters)
        rows += r
        ok &= good
    lines = ["| geometry | one decode token's GEMVs in a CUDA graph | launches | GB | floor ms | ms | % floor | vs no PDL |",
             "|---|---|---|---|---|---|---|---|"]
    base = {g: ms for g, label, _, _, ms, _ in rows if label == "kern gemv, no PDL"}
    for geom, label, nbytes, floor, ms, n in rows:
        rel = f"{100 * (ms / base[geom] - 1):+.1f}%" if geom in base else ""
        lines.append(f"| {geom} | {label} | {n} | {nbytes / 1e9:.2f} | {floor:.3f} | {ms:.3f} | {100 * floor / ms:.0f}% | {rel} |")
    table = "\n".join(lines)
    print()
    print(table)
    if not ok:
        print("\nNUMERICS CHECK FAILED: see above (table not appended)")
        return 1
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(args.out, "a") as f:
        f.write(f"\n## Decode GEMV with programmatic dependent launch (tools/bench_pdl.py) — {stamp}, commit {commit()}, "
                f"{machine()}\n\n")
        f.write(f"Copy bandwidth {bw / 1e12:.3f} TB/s (read+write); floor = weight bytes / copy bandwidth; m = 1; "
                f"ksplit {', '.join(f'{k}={v}' for k, v in ks.items())}; median of {args.rounds}×{args.iters} replays, "
                "variants interleaved. PDL: every launch but the graph's first with "
                "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; trigger = where gemv.cu executes "
                "griddepcontrol.launch_dependents (0 never, 1 after the pre-wait weight stages, 2 after the dot loop). "
                "Final residual, logits, qkv and activations bit-identical to the no-PDL graph.\n\n")
        f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
