#!/usr/bin/env python3
"""The rope-cluster decode attention on two clusters per kv head (decode_attention.cu -DDA_HALVES=2, an experiment;
NOTES.md 63) against the default one-cluster form, kernel against kernel: 36 layers in one CUDA graph, Qwen3-4B geometry.

    python3 tools/gpu/da_halves_probe.py --kernels KDIR --cubin FILE [--context 130 --context 4096] [--replays 30]
        [--rounds 3] [--carveout 0 --carveout 72]

KDIR: a build_kernels.py dir with kern_gemv_norm_m1_nb2_p2 (4B's qkv GEMV, grid 192) and
decode_attention_rope_cluster_pdl. FILE: decode_attention.cu built with -DKERN_PDL -DDA_HALVES=2 (its rope entry takes
two more params: `part`, f32 [NKV, 2, G·D, 3], and `pair_count`, u32 [NKV, 8], zeroed once). Every launch is PDL, as
the decode program launches them. Before timing, at each context, layer 0's output of each form (after the same qkv)
is compared: the forms merge in other orders, so they may differ by bf16 roundings; the token's K|V row each stores is
compared bit for bit. Per context, µs per layer (median of the replays, best of the rounds, forms alternating): the
pair (the qkv GEMV then the attention), the attention alone (36 in a chain), and pair − the GEMV alone (issue 4's
"added"), beside the floors (bytes at 4.25 TB/s). `--carveout` (repeatable; default 0, the default form's): the
two-cluster launch's preferred shared-memory carveout, percent — each one is a column, with the clusters the GPU holds
at once (cuOccupancyMaxActiveClusters) for it: NOTES.md 63 read the form's loss as a second wave of clusters (16
clusters of 8 CTAs of 70 KB, one CTA per SM at carveout 0); 72 or more gives the 164 KB configuration, two CTAs per SM.
A probe: prints a table, appends nothing; `--help` and argument errors need no GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tools" / "kernels-src", ROOT / "tools", ROOT / "tests-integration" / "gpu"):
    sys.path.insert(0, str(p))

from catalog import da_cluster_smem  # noqa: E402
from qkv_attention_bench import context_inputs, layer_weights, raw_launcher, time_pairs  # noqa: E402

NQ, NKV, D, K, LAYERS, EPS, CLUSTER = 32, 8, 128, 2560, 36, 1e-6, 8  # LAYERS: qkv_attention_bench's too
N = (NQ + 2 * NKV) * D
GEMV_GRID = 192  # the row-pass qkv GEMV on 4B's qkv
#: 4B's qkv GEMV as gen_qwen3 launches it since session 29 (the batched norm prologue; kern_gemv_norm_m1_p2 before)
QKV_GEMV = "kern_gemv_norm_m1_nb2_p2"
BW = 4.25e6  # bytes per µs


def halves_launcher(path: Path, carveout: int = 0):
    """launch(args) for the -DDA_HALVES=2 build's decode_attention_rope_cluster: grid [NKV, 16, 1] (two clusters of 8
    per kv head), 128 threads, the default's dynamic shared memory (2-page rings), `carveout` (percent), PDL."""
    return raw_launcher(path, "decode_attention_rope_cluster", (NKV, 2 * CLUSTER, 1), 128, da_cluster_smem(2),
                        carveout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path, required=True, help="a build_kernels.py dir (with its PDL forms)")
    ap.add_argument("--cubin", type=Path, required=True, help="the -DKERN_PDL -DDA_HALVES=2 decode_attention.cu build")
    ap.add_argument("--context", type=int, action="append", help="cached tokens, repeatable (default: 130 and 4096)")
    ap.add_argument("--replays", type=int, default=30, help="graph replays per median (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best is kept (default: %(default)s)")
    ap.add_argument("--carveout", type=int, action="append",
                    help="the two-cluster launch's preferred shared-memory carveout, percent 0..100, repeatable (one "
                         "column each; default: 0)")
    a = ap.parse_args(argv)
    if any(L < 1 for L in a.context or []) or a.replays < 1 or a.rounds < 1:
        ap.error("--context, --replays and --rounds: positive ints")
    if any(not 0 <= c <= 100 for c in a.carveout or []):
        ap.error(f"--carveout {a.carveout}: percents 0..100")
    if not (a.kernels / "index.json").is_file():
        ap.error(f"--kernels {a.kernels}: no index.json (a tools/build_kernels.py dir)")
    if not a.cubin.is_file():
        ap.error(f"--cubin {a.cubin}: no such file")
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error("needs torch (and an NVIDIA GPU): run it on the GPU machine")
    return run(a)


def run(a: argparse.Namespace) -> int:
    import torch
    from cubin_launch import KernelSet
    from gpu_helpers import row_offsets

    torch.empty(1, device="cuda")
    ks = KernelSet(a.kernels)
    carveouts = a.carveout or [0]
    halves = {c: halves_launcher(a.cubin, c) for c in carveouts}
    x, ws, nw, qw, kw, cos_sin = layer_weights()
    part = torch.empty(NKV * 2 * (NQ // NKV) * D * 3, dtype=torch.float32, device="cuda")
    pair_count = torch.zeros(NKV * CLUSTER, dtype=torch.int32, device="cuda")
    print(f"Qwen3-4B geometry, {LAYERS} layers per graph, µs per layer (median of {a.replays} replays, best of "
          f"{a.rounds} alternating rounds); pair = the qkv GEMV (grid {GEMV_GRID}) + the attention, every launch PDL; "
          "added = pair − the GEMV alone")
    # each launcher loads its own copy of the module, so each CUfunction keeps its own carveout
    print("two clusters, clusters the GPU holds at once (cuOccupancyMaxActiveClusters; 16 launched): " +
          ", ".join(f"carveout {c}: {h.max_active_clusters()}" for c, h in halves.items()))
    forms = ["one"] + [f"two@{c}" for c in carveouts]
    print("| context | one cluster: pair / alone / added | " +
          " | ".join(f"two clusters, carveout {c}: pair / alone / added" for c in carveouts) +
          " | GEMV alone | out max abs diff (max abs out) | added floor |")
    print("|---:|---|" + "---|" * len(carveouts) + "---:|---|---:|")
    for L in a.context or [130, 4096]:
        c = context_inputs(L)
        kv, bt, layer_elems, page_elems, seq, pos, slot, qkv, out, tail = (c[k] for k in (
            "kv", "bt", "layer_elems", "page_elems", "seq", "pos", "slot", "qkv", "out", "tail"))

        def gemv(layer):
            ks.launch(QKV_GEMV, (GEMV_GRID,), [x, nw, ws[layer], qkv, N, K, EPS, 1], pdl=True)

        def one(layer):
            ks.launch("decode_attention_rope_cluster_pdl", (NKV, CLUSTER, 1),
                      [qkv, pos, slot, qw, kw, cos_sin, kv[layer * layer_elems:], bt, seq, out, NQ, NKV, N, *tail],
                      pdl=True)

        def two_at(c):
            def two(layer):
                halves[c]([qkv, pos, slot, qw, kw, cos_sin, kv[layer * layer_elems:], bt, seq, out, NQ, NKV, N, *tail,
                           part, pair_count])
            return two
        atts = {"one": one, **{f"two@{c}": two_at(c) for c in carveouts}}

        row = row_offsets(int(slot), page_elems)  # the current token's k|v in layer 0, every head
        row_bytes = {}
        results = {}
        for name, att in atts.items():
            out.fill_(float("nan"))
            gemv(0)
            att(0)
            torch.cuda.synchronize()
            results[name] = out.clone()
            row_bytes[name] = kv[row].clone()
        for name in forms[1:]:
            if not torch.isfinite(results[name].float()).all():
                raise SystemExit(f"context {L}: the two-cluster form ({name}) left non-finite outputs (unwritten or wrong)")
            if not torch.equal(row_bytes["one"].view(torch.int16), row_bytes[name].view(torch.int16)):
                raise SystemExit(f"context {L}: the two forms ({name}) stored different K|V rows for the current token")
            if not torch.equal(results[forms[1]], results[name]):
                raise SystemExit(f"context {L}: the two-cluster form differs between carveouts ({name})")
        if int(pair_count.abs().sum()) != 0:
            raise SystemExit(f"context {L}: pair_count not back to zero after a launch: {pair_count.tolist()}")
        diff = (results["one"].float() - results[forms[1]].float()).abs().max().item()
        ref = results["one"].float().abs().max().item()

        best, g_alone = time_pairs(gemv, atts, a.rounds, a.replays)
        if int(pair_count.abs().sum()) != 0:
            raise SystemExit(f"context {L}: pair_count not back to zero after the timed graphs: {pair_count.tolist()}")
        cells = [f"{best[c][0]:.2f} / {best[c][1]:.2f} / {best[c][0] - g_alone:.2f}" for c in forms]
        print(f"| {L} | " + " | ".join(cells) + f" | {g_alone:.2f} | {diff:.2e} ({ref:.2e}) | "
              f"{L * NKV * 512 / BW:.2f} |", flush=True)
        del kv, bt, c
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
