#!/usr/bin/env python3
"""gemv.cu's bulk-copy form (-DGEMV_TMA) against the default form, on the H200: bits, timings, program variants.

    python3 tools/gpu/gemv_tma_probe.py --base gemv.cubin --tma LABEL=CUBIN:C:S[:OPS] ... \
        [--geometry 4b --geometry 0.6b | --geometry none] [--rounds 5] [--no-bits] \
        [--manifest M.json --kernels DIR --out-dir D]

A TMA module is gemv.cu built with `-DGEMV_TMA -DGEMV_TMA_C=C -DGEMV_TMA_S=S` (nvcc flags as tools/build_kernels.py
builds gemv.cu): the same entries, params and launch geometry, plus WARPS·S·2·C·16 bytes of dynamic shared memory
for the weight ring, after the norm variants' x (rounded up to 128 bytes). For each geometry this

1. checks every M = 1 variant (norm, norm_silu, residual, plain) at every decode shape and ksplit 1, 2, 4 bit for
   bit against the default form on the same fresh random inputs (outputs poisoned first; skipped by `--no-bits`;
   the M = 2, 4, 8 entries and ksplit 8 are not run);
2. times each decode shape alone (a graph of PDL launches rotating over > 256 MB of weight copies: µs per launch);
3. replays one decode token's GEMVs (tools/bench_gemv.py's token_chain: the manifests' ksplit and entries, PDL) in
   a CUDA graph per module, checks the chains' outputs bit for bit, and times them in alternating rounds.

With `--manifest`, also writes per `--tma` a decode manifest whose GEMV ops OPS (`+`-joined short names: qkv, o,
gate_up, down, lm_head; default every one that launches gemv.cubin: all but 4B's qkv, which runs on the row-pass
module gemv_p2 since session 18; the lm_head is a GEMV only in a `gen_qwen3.py --lm-head dense` manifest, the
default's screened lm_head is lm_head_screen.cu) launch that module (`manifest_variant`; the same entry, so each
launch keeps its `pdl` flag and any `carveout`), for tools/gpu/program_sweep.py
`--manifest-variant LABEL=D/manifest-tma-LABEL.json`. `--geometry none`: only the manifests.

Measured on the H200 (session 13, NOTES.md 39, BENCHMARKS.md "Session 13"): bit-identical wherever checked; alone,
with the best ring (C = 128, S = 2), qkv and o 0.7–0.9 µs per launch faster, down ~7 µs slower (a stage refilled
only once read waits a whole copy); in the 4B program every form loses (o +0.13–0.29 ms/token: o's own share of
the step falls 1.5 µs per layer, the next GEMV's rises 6.2, NOTES.md 41) except qkv with C = 64, S = 2
(−0.010…−0.012, four calls), which costs 0.6B +0.043. Not in the generator. Judge a variant in the program with
tools/gpu/program_sweep.py and see where its time lands with tools/profile_decode.py's per-op split.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

torch = bg = None  # torch and tools/bench_gemv.py: imported by main() (the manifest rewrite needs neither)

from manifest_variants import SHORT as VARIANT_OPS  # noqa: E402  (SHORT: the decode ops' short names)
from manifest_variants import lm_head_note, pin_module, prune  # noqa: E402

WARPS, R = 8, 2
#: The decode GEMV ops by short name: manifest_variants' names for them (the lm_head: the dense GEMV
#: `gemv_norm_lm_head`, which the default manifests, whose lm_head is screened, do not have).
SHORT = {s: VARIANT_OPS[s][0] for s in ("qkv", "o", "gate_up", "down", "lm_head")}
GEMV_OPS = tuple(SHORT.values())


#: sm_90's dynamic shared memory per block at most (bytes): x (rounded up to 128) plus the ring must fit.
SMEM_MAX = 227 * 1024


def ring_bytes(c: int, s: int) -> int:
    """Bytes of the weight ring of a TMA module built with GEMV_TMA_C = c (16-byte vectors per row and slot) and
    GEMV_TMA_S = s (slots per warp): WARPS warps x s slots x R rows x c vectors x 16 bytes."""
    return WARPS * s * R * c * 16


def tma_gemv(cubin: bytes, c: int, s: int):
    """bench_gemv's launcher for a TMA module: every launch's dynamic shared memory rounded up to 128 bytes plus
    the ring."""

    class TmaGemv(bg.Gemv):
        def launch(self, name, grid, smem, args, pdl=False):
            super().launch(name, grid, ((smem + 127) & ~127) + ring_bytes(c, s), args, pdl)

    return TmaGemv(cubin)


def bits(g_base, g_tma, geom) -> list[str]:
    """Every variant at every shape of `geom` and ksplit 1, 2, 4: the TMA module's output == the default's."""
    sh, _ = bg.shapes(geom)
    bad = []
    for name, (n, k) in sh.items():
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        r0 = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
        for ks in (1, 2, 4):
            for variant in ("plain", "norm", "norm_silu", "residual"):
                outs = []
                for g in (g_base, g_tma):
                    if variant == "norm_silu":
                        y = torch.full((1, n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
                        bg.run_norm_silu(g, x, nw, w, y, n // 2, k, ks)
                    elif variant == "residual":
                        y = r0.clone()
                        bg.run_residual(g, x, w, y, n, k, ks)
                    else:
                        y = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                        (bg.run_norm if variant == "norm" else lambda g_, x_, nw_, w_, y_, n_, k_, ks_:
                         bg.run_plain(g_, x_, w_, y_, n_, k_, ks_))(g, x, nw, w, y, n, k, ks)
                    torch.cuda.synchronize()
                    outs.append(y)
                if torch.isnan(outs[1]).any() or not torch.equal(outs[0], outs[1]):
                    diff = (outs[0].float() - outs[1].float()).abs().max().item()
                    bad.append(f"{geom} {name} {n}x{k} ks{ks} {variant}: max |diff| {diff}")
        del w
    return bad


def chains(gs: dict, geom: str, rounds: int) -> tuple[dict[str, float], bool]:
    """One decode token's GEMVs of `geom` (random weights, PDL) in a CUDA graph per launcher of `gs` (label ->
    bench_gemv.Gemv; the first is the reference). Returns (median ms per replay by label, whether every chain's
    residual and logits equal the first's bit for bit)."""
    sh, layers = bg.shapes(geom)
    weights = [{nm: (torch.randn(*sh[nm], device="cuda") * 0.05).to(torch.bfloat16) for nm in ("qkv", "o", "gate_up", "down")}
               for _ in range(layers)]
    lm = (torch.randn(*sh["lm_head"], device="cuda") * 0.05).to(torch.bfloat16)
    h = sh["o"][0]
    resid = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(h, device="cuda")).to(torch.bfloat16)
    qkv = torch.empty(1, sh["qkv"][0], device="cuda", dtype=torch.bfloat16)
    attn = torch.randn(1, sh["o"][1], device="cuda", dtype=torch.bfloat16)
    act = torch.empty(1, sh["down"][1], device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(1, sh["lm_head"][0], device="cuda", dtype=torch.bfloat16)
    ks = {nm: int(bg.rule_ksplit(nm, *sh[nm])) for nm in sh}
    resid0 = resid.clone()
    graphs, outs = {}, {}
    for label, g in gs.items():
        resid.copy_(resid0)
        graphs[label] = bg.capture(bg.token_chain(g, sh, weights, lm, resid, nw, qkv, attn, act, logits, ks, True))
    for label, graph in graphs.items():
        resid.copy_(resid0)
        logits.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        outs[label] = (resid.clone(), logits.clone())
    base = next(iter(outs.values()))
    all_same = True
    for label, (r_, l_) in outs.items():
        same = torch.equal(r_, base[0]) and torch.equal(l_, base[1])
        all_same &= same
        print(f"  {geom} chain {label}: bitwise equal to the default form's: {same}", flush=True)
    times = {label: [] for label in graphs}
    for _ in range(rounds):
        for label, graph in graphs.items():
            resid.copy_(resid0)
            times[label] += bg.event_times(graph.replay, 10, warmup=2)
    total = sum(w.numel() * 2 for lw in weights for w in lw.values()) + lm.numel() * 2
    med = {label: statistics.median(t) for label, t in times.items()}
    for label, t in med.items():
        print(f"  {geom} chain {label}: {t:.4f} ms ({total / t / 1e6:.0f} GB/s), "
              f"{t - next(iter(med.values())):+.4f} vs default", flush=True)
    del weights, graphs
    return med, all_same


def per_shape(gs: dict, geom: str, rounds: int) -> None:
    """Each decode shape alone: a graph of PDL launches of the manifests' variant, rotating over enough weight
    copies (> 256 MB) that every launch streams from HBM; µs per launch per module, modules alternating."""
    sh, _ = bg.shapes(geom)
    for name, (n, k) in sh.items():
        copies = max(8, bg.cdiv(256 << 20, n * k * 2))
        ws = [(torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        ks = int(bg.rule_ksplit(name, n, k))

        def calls(g):
            def fn():
                for i, w in enumerate(ws):
                    bg.run_shape(g, name, x, nw, w, y, n, k, ks, pdl=i > 0)
            return fn
        graphs = {label: bg.capture(calls(g)) for label, g in gs.items()}
        times = {label: [] for label in graphs}
        for _ in range(rounds):
            for label, graph in graphs.items():
                times[label] += bg.event_times(graph.replay, 5, warmup=1)
        floor_us = n * k * 2 / 4.2e12 * 1e6
        line = ", ".join(f"{label} {statistics.median(t) / copies * 1e3:.2f}" for label, t in times.items())
        print(f"  {geom} {name} {n}x{k} ks{ks} (floor {floor_us:.2f} µs at 4.2 TB/s), µs per launch: {line}", flush=True)
        del ws, graphs


def manifest_variant(manifest: Path, kernels: Path, cubin: Path, label: str, ring: int, out: Path,
                     ops=None) -> Path:
    """Writes OUT/manifest-tma-LABEL.json: `manifest` with each of `ops` (manifest op names; None: every decode GEMV
    op that launches module `gemv`: in a `--gemv gemv-fma` manifest every one but 4B's qkv, which runs on the
    row-pass module gemv_p2; the default manifests' GEMVs are on gemv_tc.cu's tensor cores since session 32, and their
    lm_head is screened, not a GEMV) launching the TMA module `cubin` (copied into
    `kernels` as gemv_tma_<stem>.cubin and pinned by its sha256; same entry) with `ring` more bytes of dynamic shared
    memory after its own (rounded up to 128); modules no launch uses any more are dropped (the verifier refuses an
    unused module). Returns the path. Raises ValueError for an op of
    `ops` that the manifest lacks (`gemv_norm_lm_head` in a screened manifest) or that does not launch `gemv`, and
    where `ops` is None and no decode GEMV op does."""
    v = json.loads(manifest.read_text())
    mod = "gemv_tma_" + cubin.stem.removeprefix("gemv_tma_")
    dst = kernels / f"{mod}.cubin"

    def first_launch(op):
        return v["ops"].get(op, {}).get("impl", {}).get("launches", [{}])[0]

    if ops is None:
        ops = [op for op in GEMV_OPS if first_launch(op).get("module") == "gemv"]
        if not ops:
            raise ValueError(f"{manifest}: no decode GEMV op launches module `gemv` (gemv.cu's default form), which "
                             f"a TMA module replaces (a manifest of `gen_qwen3.py --gemv gemv-fma` is needed)")
    for op in ops:
        if op not in v["ops"]:
            raise ValueError(f"{manifest}: no op `{op}`" + lm_head_note(v, op))
        launch = first_launch(op)
        if (got := launch.get("module")) != "gemv":
            raise ValueError(f"{manifest}: op `{op}` does not launch module `gemv` (gemv.cu's default form) first but "
                             f"`{got}`; a TMA module replaces only that"
                             + (" (the TMA form has no row passes: 4B's qkv is on gemv_p2 since session 18)"
                                if str(got).startswith("gemv_p") else
                                " (every decode GEMV runs on gemv_tc.cu's tensor cores by default since session 32: "
                                "for gemv.cu's form there, pass a manifest of `tools/gen_qwen3.py --gemv gemv-fma`)"
                                if got == "gemv_tc" else ""))
        launch["module"] = mod
        launch["shared_mem"] = ((launch.get("shared_mem", 0) + 127) & ~127) + ring
        if launch["shared_mem"] > SMEM_MAX:
            raise ValueError(f"op `{op}`: {launch['shared_mem']} bytes of dynamic shared memory with the ring, more "
                             f"than sm_90's {SMEM_MAX}: build the module with a smaller GEMV_TMA_C or GEMV_TMA_S")
    if not (dst.exists() and dst.samefile(cubin)):
        shutil.copyfile(cubin, dst)
    pin_module(v, mod, kernels, dst.name)
    prune(v)  # the modules no launch uses any more (the verifier refuses them); no op goes unused here
    path = out / f"manifest-tma-{label}.json"
    path.write_text(json.dumps(v, indent=1))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="gemv.cubin, the default form (needed to check or time)")
    ap.add_argument("--tma", action="append", default=[], metavar="LABEL=CUBIN:C:S[:OPS]",
                    help="a TMA module built with GEMV_TMA_C=C, GEMV_TMA_S=S; OPS: the manifest ops to put on it "
                         "(+-joined short names; default every one on gemv.cubin); repeat")
    ap.add_argument("--geometry", action="append", default=[], help="4b, 0.6b (repeat), or none: manifests only")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the chain timing")
    ap.add_argument("--manifest", type=Path, help="a decode manifest to rewrite per --tma")
    ap.add_argument("--kernels", type=Path, help="the manifest's kernels dir (the TMA cubins are copied there)")
    ap.add_argument("--out-dir", type=Path, help="where the rewritten manifests go")
    ap.add_argument("--no-bits", action="store_true", help="skip the bit-for-bit checks")
    a = ap.parse_args(argv)
    tmas = {}
    for spec in a.tma:
        try:
            label, rest = spec.split("=", 1)
            path, c, s, *ops = rest.split(":")
            c, s = int(c), int(s)
        except ValueError:
            ap.error(f"--tma {spec}: expected LABEL=CUBIN:C:S[:OPS] (C and S integers)")
        if not label or label in tmas:
            ap.error(f"--tma {spec}: " + ("an empty LABEL" if not label else f"LABEL `{label}` given twice"))
        if len(ops) > 1 or (ops and not ops[0]):
            ap.error(f"--tma {spec}: expected LABEL=CUBIN:C:S[:OPS] (one non-empty OPS field)")
        names = ops[0].split("+") if ops else None  # None: every decode GEMV op on `gemv` (manifest_variant)
        if bad := [o for o in names or () if o not in SHORT]:
            ap.error(f"--tma {spec}: unknown op `{'+'.join(bad)}` (OPS: +-joined names of {', '.join(SHORT)})")
        if c <= 0 or c % 32 or s < 1 or ring_bytes(c, s) > SMEM_MAX:
            ap.error(f"--tma {spec}: C must be a positive multiple of 32 and S at least 1 (as gemv.cu's "
                     f"static_asserts), the ring {WARPS}*S*{R}*C*16 at most {SMEM_MAX} bytes")
        if not Path(path).is_file():
            ap.error(f"--tma {spec}: no file {path}")
        tmas[label] = (Path(path), c, s, names)
    geometries = [g for g in a.geometry or ["4b"] if g != "none"]
    if a.manifest:
        if not (a.kernels and a.out_dir):
            ap.error("--manifest needs --kernels (where the TMA cubins are copied) and --out-dir")
        for what, p in (("--manifest", a.manifest), ("--kernels", a.kernels), ("--out-dir", a.out_dir)):
            if not (p.is_file() if what == "--manifest" else p.is_dir()):
                ap.error(f"{what} {p}: no such {'file' if what == '--manifest' else 'directory'}")
        if not tmas:
            ap.error("--manifest needs at least one --tma")
        for label, (path, c, s, ops) in tmas.items():
            try:
                out = manifest_variant(a.manifest, a.kernels, path, label, ring_bytes(c, s), a.out_dir,
                                       None if ops is None else [SHORT[o] for o in ops])
            except ValueError as e:
                ap.error(f"--tma {label}: {e}")
            print(f"wrote {out}")
    if not geometries:
        return 0
    if a.base is None or not a.base.is_file():
        ap.error(f"--base {a.base}: gemv.cubin (the default form) is needed to check or time; "
                 "or pass --geometry none to write the manifests only")
    global torch, bg
    import torch
    import bench_gemv as bg
    g_base = bg.Gemv(a.base.read_bytes())
    gs = {"default": g_base}
    seen = set()
    for label, (path, c, s, _) in tmas.items():
        if (path, c, s) not in seen:  # one launcher per module; labels that differ only in ops share it
            seen.add((path, c, s))
            gs[label] = tma_gemv(path.read_bytes(), c, s)
    ok = True
    for geom in geometries:
        if not a.no_bits:
            for label, g in gs.items():
                if g is g_base:
                    continue
                bad = bits(g_base, g, geom)
                print(f"  {geom} bits {label}: {'all equal' if not bad else str(len(bad)) + ' differ'}", flush=True)
                for line in bad[:20]:
                    print("    " + line)
                ok &= not bad
        per_shape(gs, geom, 3)
        ok &= chains(gs, geom, a.rounds)[1]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
