#!/usr/bin/env python3
"""What reading a layer's KV pages costs a decode layer at best: a bound for issue 4's figure (NOTES.md 75).

    python3 tools/gpu/kv_read_bound.py --kernels KDIR [--context 130 --context 4096] [--splits 8 --splits 16]
        [--replays 30] [--rounds 3] [--da-cubin LABEL=PATH ...] [--nvcc-flag=-DKR_RING=16 ...]

On the GPU machine (torch, cuda.bindings, pytest — tests-integration/gpu's helpers import it — and nvcc 13.0), with
PYTHONPATH as README.md's GPU section sets it plus `tools`; KDIR from `python3 tools/build_kernels.py --out KDIR`. A
--da-cubin is built from the source with the PDL module's flags and the what-if's, e.g.
`nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DKERN_PDL -DDA_NO_MATH -o nomath.cubin tools/kernels-src/decode_attention.cu`.
--nvcc-flag takes kv_read_bound.cu's macros KR_THREADS (256) and KR_RING (8); write it with `=` (argparse reads a
separate `-D...` as an option).

Issue 4 asks the decode attention at 4,096 cached tokens to run within 2x of its floor (16.8 MB of K|V at the copy
bandwidth, 3.96 µs); in the decode program's order (right after its layer's qkv GEMV, every launch PDL) the default
rope-cluster form adds ~10.1 µs to a layer (BENCHMARKS.md "Session 32, call 5"). This probe measures, in the same
harness and order, a kernel that only reads those bytes (kv_read_bound.cu, compiled here with nvcc): every kv head's
page slices through the block table, S CTAs per kv head, no math and no merge. What it adds to a layer is what any
decode attention reading the same pages must add at least; the default's excess over it is the attention's own
(math, merges, its 64 CTAs), and the bare read's excess over the floor is the launch boundary's and the ramp's.

Per context, µs per layer (median of the replays, best of the rounds, forms alternating): pair (the qkv GEMV as
gen_qwen3 launches it, then the form), alone (36 in a PDL chain) and added (pair - the GEMV alone), beside the floor.
Not bench_kernels' harness: no L2 flush between replays (the 36 layers' pages, 604 MB at 4,096 tokens, do not fit L2
anyway, but the GEMV's weights partly do) and the best of the rounds; its figures for the same kernel read ~0.5 µs
lower than bench_kernels' (the default as a PDL chain at 4,096: 8.8 against 9.4), so compare forms within one run.
The floor is the bytes at a fixed 4.25 TB/s (bench_kernels' measured copy bandwidth on the H200), not measured here.
Forms: `default` (decode_attention_rope_cluster_pdl from KDIR), `read S=s pre` / `wait` / `L2-prefetch, wait`
(kv_read with its copies before / after its griddepcontrol.wait, or after it with every page asked of L2 before it)
for each --splits s, and each --da-cubin: a decode_attention.cu build with -DKERN_PDL (and the what-if defines, e.g.
-DDA_NO_MATH) whose rope entry is launched as the default is (grid [NKV, 8, 1], 128 threads, the index's shared memory
and carveout). The default's output is checked against a float64 reference first (the harness's inputs are right);
a --da-cubin's is compared with the default's bit for bit and reported, not refused (DA_NO_MATH's is wrong by
design). Session 33 also timed decode_attention.cu's DA_L2_AHEAD, DA_HALVES = 4 and DA_ROPE_SPLIT experiments here
(NOTES.md 75; they and this script's `--da-halves` / `--da-split` were removed after the calls: the code is at
271c127). A probe: prints a table, appends nothing; `--help` and argument errors need no GPU.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tools" / "kernels-src", ROOT / "tools", ROOT / "tools" / "gpu", ROOT / "tests-integration" / "gpu"):
    sys.path.insert(0, str(p))

from gemv_plan import GEMV_UNROLL_SUFFIX, gemv_blocks, gemv_tc_entry, gemv_tc_unroll  # noqa: E402
from qkv_attention_bench import (EPS, NKV, NQ, D, K, N, LAYERS, context_inputs, layer_weights,  # noqa: E402
                                 raw_launcher, time_pairs)

ROPE = "decode_attention_rope_cluster_pdl"
QKV_GEMV = gemv_tc_entry("kern_gemv_norm_m1") + GEMV_UNROLL_SUFFIX[gemv_tc_unroll(K, True)]  # as gen_qwen3 (4B)
SRC = Path(__file__).with_name("kv_read_bound.cu")
BW = 4.25e6  # bytes per µs: the copy bandwidth bench_kernels measures on the H200
#: kv_read's `wait_first` modes: its copies before its griddepcontrol.wait, after it, or after it with every page
#: asked of L2 before it
MODES = {0: "pre", 1: "wait", 2: "L2-prefetch, wait"}
#: kv_read_bound.cu's defaults (-DKR_THREADS, -DKR_RING) and its block-table entries per CTA (KR_MAX_PAGES)
KR_DEFAULTS, KR_MAX_PAGES = {"KR_THREADS": 256, "KR_RING": 8}, 1024
#: kv_read's CTAs per kv head without --splits (64, 128 and 264 CTAs)
DEFAULT_SPLITS = [8, 16, 33]


def parse_da(spec: str) -> tuple[str, Path]:
    """LABEL=PATH -> (label, path); raises ValueError naming the spec."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise ValueError(f"--da-cubin {spec!r}: expected LABEL=PATH (a decode_attention.cu -DKERN_PDL build)")
    if not Path(path).is_file():
        raise ValueError(f"--da-cubin {spec!r}: no such file {path}")
    return label, Path(path)


def kr_config(flags: list[str]) -> dict[str, int]:
    """KR_THREADS and KR_RING of a kv_read build: -DNAME=N among the nvcc flags, else the source's default."""
    cfg = dict(KR_DEFAULTS)
    for f in flags:
        name, sep, value = f.removeprefix("-D").partition("=")
        if f.startswith("-D") and sep and name in cfg:
            cfg[name] = int(value)
    return cfg


def nvcc_command(flags: list[str], out: Path, nvcc: str = "nvcc") -> list[str]:
    """nvcc's command line for kv_read_bound.cu with the extra `flags`, writing the cubin `out`."""
    return [nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", *flags, "-o", str(out), str(SRC)]


def kr_smem(cfg: dict[str, int]) -> int:
    """kv_read's dynamic shared memory, bytes: the ring of KR_RING 8 KB page slices, then KR_MAX_PAGES i32 entries."""
    return cfg["KR_RING"] * 8192 + KR_MAX_PAGES * 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, required=True, help="a build_kernels.py dir (the default's kernels)")
    ap.add_argument("--context", type=int, action="append", help="cached tokens, repeatable (default: 130, 4096)")
    ap.add_argument("--splits", type=int, action="append", help="kv_read CTAs per kv head, repeatable (default: "
                    f"{', '.join(map(str, DEFAULT_SPLITS))})")
    ap.add_argument("--replays", type=int, default=30, help="graph replays per median (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best is kept (default: %(default)s)")
    ap.add_argument("--da-cubin", action="append", default=[], metavar="LABEL=PATH",
                    help="a decode_attention.cu -DKERN_PDL what-if build, timed as the default's rope entry")
    ap.add_argument("--nvcc-flag", action="append", default=[],
                    help="extra nvcc flag for kv_read_bound.cu, repeatable; write it --nvcc-flag=-DKR_RING=16 (the "
                         "macros: KR_THREADS, KR_RING)")
    a = ap.parse_args(argv)
    if any(L < 1 for L in a.context or []) or any(s < 1 for s in a.splits or []) or a.replays < 1 or a.rounds < 1:
        ap.error("--context, --splits, --replays and --rounds: positive ints")
    if not (a.kernels / "index.json").is_file():
        ap.error(f"--kernels {a.kernels}: no index.json (a tools/build_kernels.py dir)")
    a.splits = a.splits or DEFAULT_SPLITS
    for L in a.context or []:  # a kv_read CTA holds at most KR_MAX_PAGES block-table entries
        if -(-L // 16) > KR_MAX_PAGES * min(a.splits):
            ap.error(f"--context {L}: more than {KR_MAX_PAGES} pages per kv_read CTA at S = {min(a.splits)}: "
                     "give more --splits")
    try:
        a.da = [parse_da(s) for s in a.da_cubin]
    except ValueError as e:
        ap.error(str(e))
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    return run(a)


def run(a: argparse.Namespace) -> int:
    import torch
    from cubin_launch import KernelSet

    torch.empty(1, device="cuda")
    ks = KernelSet(a.kernels)
    for name in (ROPE, QKV_GEMV):
        if name not in ks.kernels:
            raise SystemExit(f"{a.kernels}/index.json has no `{name}`: a build_kernels.py dir of this tree, please")
    rope_smem, rope_carveout = ks.kernels[ROPE]["shared_mem"], ks.kernels[ROPE].get("carveout") or 0
    cubin = Path(tempfile.mkdtemp()) / "kv_read_bound.cubin"
    subprocess.run(nvcc_command(a.nvcc_flag, cubin), check=True)
    cfg = kr_config(a.nvcc_flag)
    threads, smem = cfg["KR_THREADS"], kr_smem(cfg)
    splits = a.splits
    reads = {(s, w): raw_launcher(cubin, "kv_read", (NKV, s, 1), threads, smem) for s in splits for w in MODES}
    das = {label: raw_launcher(path, "decode_attention_rope_cluster", (NKV, 8, 1), 128, rope_smem, rope_carveout)
           for label, path in a.da}
    cx = ks.kernels[QKV_GEMV]["constexprs"]
    grid = gemv_blocks(N, cx["COLS_PER_WARP"], cx["WARPS"], 1)
    x, ws, nw, qw, kw, cos_sin = layer_weights()
    sink = torch.zeros(NKV * max(splits), dtype=torch.int32, device="cuda")
    print(f"Qwen3-4B geometry, {LAYERS} layers per graph, µs per layer (median of {a.replays} replays, best of "
          f"{a.rounds} alternating rounds); pair = the qkv GEMV ({QKV_GEMV}, grid {grid}) + the form, every launch "
          f"PDL; added = pair - the GEMV alone; kv_read: {threads} threads, a ring of {cfg['KR_RING']} pages, nvcc "
          f"{' '.join(a.nvcc_flag) or '(no flags)'}")
    print("| context | form | pair | alone | added | added / floor | output vs the default's |\n"
          "|---:|---|---:|---:|---:|---:|---|")
    for L in a.context or [130, 4096]:
        c = context_inputs(L)
        kv, bt, layer_elems, page_elems, seq, pos, slot, qkv, out, tail = (c[k] for k in (
            "kv", "bt", "layer_elems", "page_elems", "seq", "pos", "slot", "qkv", "out", "tail"))
        page_bytes = page_elems * 2

        def gemv(layer):
            ks.launch(QKV_GEMV, (grid,), [x, nw, ws[layer], qkv, N, K, EPS, 1], pdl=True)

        def rope_args(layer):
            return [qkv, pos, slot, qw, kw, cos_sin, kv[layer * layer_elems:], bt, seq, out, NQ, NKV, N, *tail]

        def default(layer):
            ks.launch(ROPE, (NKV, 8, 1), rope_args(layer), pdl=True)

        forms = {"default": default}
        for label, launch in das.items():
            forms[label] = lambda layer, launch=launch: launch(rope_args(layer))
        for (s, w), launch in reads.items():
            forms[f"read S={s} {MODES[w]}"] = (
                lambda layer, launch=launch, w=w: launch([kv[layer * layer_elems:], bt, seq, sink, page_bytes, w]))

        # the harness's inputs are right: layer 0's default output against float64 (the rope form's q and row)
        out.fill_(float("nan"))
        gemv(0)
        default(0)
        torch.cuda.synchronize()
        check_default(out, qkv, kv, page_elems, bt, L, qw, kw, cos_sin, pos, slot)
        same = {}  # each --da-cubin's output after the same GEMV, bit for bit against the default's
        ref = out.clone()
        for label in das:
            out.fill_(float("nan"))
            gemv(0)
            forms[label](0)
            torch.cuda.synchronize()
            if torch.equal(out.view(torch.int16), ref.view(torch.int16)):
                same[label] = "identical"
            elif not torch.isfinite(out.float()).all():
                same[label] = "differs: non-finite outputs (unwritten, or NaN)"
            else:
                same[label] = (f"differs: max abs diff {(out.float() - ref.float()).abs().max().item():.2e} "
                               f"(max abs {ref.float().abs().max().item():.2e})")

        floor = L * NKV * 2 * D * 2 / BW
        best, g_alone = time_pairs(gemv, forms, a.rounds, a.replays)
        if int(sink.abs().sum()):
            raise SystemExit(f"context {L}: a kv_read CTA left pages unread (its share exceeded KR_MAX_PAGES)")
        print(f"| {L} | the qkv GEMV alone | — | {g_alone:.2f} | — | — | — |")
        for name, (p, al) in best.items():
            print(f"| {L} | {name} | {p:.2f} | {al:.2f} | {p - g_alone:.2f} | {(p - g_alone) / floor:.2f}x "
                  f"(floor {floor:.2f}) | {same.get(name, '—')} |", flush=True)
        del kv, bt, c
        torch.cuda.empty_cache()
    return 0


def check_default(out, qkv, kv, page_elems, bt, L, qw, kw, cos_sin, pos, slot) -> None:
    """The default's output (layer 0, after the qkv GEMV) within bf16 bounds of gpu_helpers.rope_reference (float64:
    q and the current token's k normed and rotated as HF's Qwen3 does, attention over the cache with that row)."""
    from gpu_helpers import rope_reference

    ref, _ = rope_reference(qkv[0], kv, 0, page_elems, bt, L, NQ, qw, kw, cos_sin[int(pos)], slot)
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    if not math.isfinite(err) or err > 2e-2:
        raise SystemExit(f"context {L}: the default attention's output is off the float64 reference by {err:.2e} "
                         "(relative to its max): the harness's inputs are wrong")


if __name__ == "__main__":
    raise SystemExit(main())
