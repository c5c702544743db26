"""Build variants of the cluster decode attention and time them side by side, as the decode program launches it.

Runs on the GPU machine (torch, cuda.bindings, nvcc); `--dry-run` only builds the variants (no GPU):

    python3 tools/gpu/da_variants.py --kernels DIR --variant base=GIT=HEAD --variant four=DA_PRE_PAGES=4 \\
        [--lengths 130 1024 4096 16384] [--rounds 6]

Each `--variant NAME=SPEC[,SPEC...]` is one build of tools/kernels-src/decode_attention.cu (PDL form, -DKERN_PDL)
with its SPECs: `M=V` a macro (-DM=V; `DA_CLUSTER=N`, N in 8, 16 (non-portable), sets the CTAs per kv head, and the
launch's grid.y and shared memory follow; `DA_WARPS` and `DA_CLUSTER_SLOTS` set the block and the shared memory too:
cluster_smem), `NOPDL` the plain form (timed in mode A only: it has no griddepcontrol.wait), `SRC=path` another
source file, `GIT=rev` the source at a git revision. The first variant is the reference of the bitwise comparison.
`--kernels` is a built kernels dir (tools/build_kernels.py) for qk_norm_rope_kv_pdl.

Every build reads the KV cache in its one layout, head-major and swizzled, one bulk copy per page (tools/README.md
"KV layout", NOTES.md 58), and gets the shared memory that layout needs (512-byte rows after the slots' mbarriers);
`DA_BULK`, the macro that made it an experiment, is gone and a SPEC naming it is refused. A `SRC=` or `GIT=` source
from before the switch reads the old token-major layout (and needs other shared memory): do not compare against it.

Per context length L, 36 layer calls of `decode_attention_cluster` (32 q / 8 kv heads, the 4B shape) per CUDA graph,
L2 flushed before each replay, variants alternating over `--rounds` rounds; µs per call (median):
  A  back to back, no PDL attribute
  B  back to back, PDL attribute (calls 1..35)
  C  each after its layer's qk_norm_rope_kv_pdl, both PDL (the order of `gen_qwen3.py --decode-attention cluster`;
     the prologue writes the current token's row of every layer, so a pre-wait copy of that page is stale)
  D  the prologues alone; C - D is what the attention adds to a decode layer.
Correctness (mode A, fresh state per variant, and mode C for the PDL variants): the relative error against float64
(tests-integration/gpu's reference, gpu_helpers' head-major addressing) and whether the output equals the first
variant's bit for bit. Sessions 8-9 ran this as ad-hoc probes (NOTES.md 29-30); this is that probe, kept.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tools" / "kernels-src" / "decode_attention.cu"
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
from catalog import da_cluster_smem  # noqa: E402  (the shared-memory formula of the catalog's instances)
NVCC = ["nvcc", "-cubin", "-arch=sm_90", "-O3", "-std=c++17"]
LAYERS, NQ, NKV, D = 36, 32, 8, 128


#: The macro that made the head-major KV layout an experiment (NOTES.md 52, 58): that layout is now the only one.
GONE = "DA_BULK"


def refuse_gone(specs: list[str]) -> None:
    """Raises ValueError when a SPEC names DA_BULK (alone or `DA_BULK=V`): the head-major KV layout it selected is
    decode_attention.cu's only one now, so every build has it and the macro means nothing."""
    for s in specs:
        if s.partition("=")[0] == GONE:
            raise ValueError(f"{s!r}: {GONE} is gone: the head-major KV layout (one bulk copy per page) is "
                             "decode_attention.cu's only layout now, every build has it; drop the spec")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'NAME=SPEC[,SPEC...]' -> (NAME, [SPEC, ...]); NAME alone is the default build. Raises ValueError on an
    empty name, a SPEC that is none of M=V, NOPDL, SRC=path, GIT=rev, or one naming DA_BULK (refuse_gone)."""
    name, _, specs = text.partition("=")
    if not name:
        raise ValueError(f"--variant {text!r}: NAME=SPEC[,SPEC...], e.g. four=DA_PRE_PAGES=4")
    out = [s for s in specs.split(",") if s] if specs else []
    for s in out:
        if s != "NOPDL" and "=" not in s and s != GONE:
            raise ValueError(f"--variant {text!r}: {s!r} is not M=V, NOPDL, SRC=path or GIT=rev")
    try:
        refuse_gone(out)
    except ValueError as e:
        raise ValueError(f"--variant {text!r}: {e}") from None
    return name, out


def cluster_size(specs: list[str]) -> int:
    """CTAs per (kv head, sequence) of a build: its DA_CLUSTER macro, else 8 (decode_attention.cu's default); the
    launch's grid.y. Raises ValueError unless it is 8 or 16 (sm_90's non-portable maximum: the function gets
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED): the cluster merge gives each thread one of its CTA's
    DA_MAX_G·128/DA_CLUSTER outputs, so fewer than 8 CTAs do not fit 8 q heads per kv head (decode_attention.cu
    refuses such a build; session 11 found that a 2-CTA build had left half its outputs unwritten)."""
    c = next((s.split("=", 1)[1] for s in specs if s.startswith("DA_CLUSTER=")), "8")
    if c not in ("8", "16"):
        raise ValueError(f"DA_CLUSTER={c}: 8 or 16 CTAs per cluster (the merge needs at least 8; 16 is sm_90's "
                         "non-portable maximum)")
    return int(c)


def macro(specs: list[str], name: str, default: int) -> int:
    """The integer value of macro `name` in a build's SPECs (`name=V`), else `default`. Raises ValueError naming the
    SPEC when V is not an integer."""
    for s in specs:
        if s.startswith(name + "="):
            try:
                return int(s.split("=", 1)[1])
            except ValueError:
                raise ValueError(f"{s!r}: {name} must be an integer") from None
    return default


def cluster_warps(specs: list[str]) -> int:
    """Warps per CTA of a build: its DA_WARPS macro, else 4 (the launch's block is 32 × this)."""
    return macro(specs, "DA_WARPS", 4)


def cluster_smem(specs: list[str]) -> int:
    """decode_attention_cluster's dynamic shared memory (bytes) for a build (decode_attention.cu DA_CLUSTER_SMEM): the
    slots' mbarriers (64 bytes per warp: one per slot, up to 8 slots), the DA_WARPS warps' rings of DA_CLUSTER_SLOTS
    pages (16 unpadded 512-byte rows each: the head-major layout's page of one kv head, one bulk copy) and the
    cluster's partials pushed to each CTA (DA_RECV_FLOATS: DA_CLUSTER × (2·8 + 8·128/DA_CLUSTER) floats). Raises
    ValueError for a SPEC naming DA_BULK (refuse_gone) or a bad DA_CLUSTER, DA_WARPS or DA_CLUSTER_SLOTS."""
    refuse_gone(specs)
    slots, warps, c = macro(specs, "DA_CLUSTER_SLOTS", 4), cluster_warps(specs), cluster_size(specs)
    return da_cluster_smem(slots, warps, c)


def build_variant(name: str, specs: list[str], out_dir: Path) -> Path:
    """Compile one variant to out_dir/NAME.cubin and return its path. Raises RuntimeError with nvcc's or git's
    message when the build fails, ValueError for a SPEC naming DA_BULK (refuse_gone)."""
    refuse_gone(specs)
    src = SOURCE
    defines = ["-DKERN_PDL"] if "NOPDL" not in specs else []
    for s in specs:
        key, _, val = s.partition("=")
        if key == "SRC":
            src = Path(val)
        elif key == "GIT":
            r = subprocess.run(["git", "-C", str(ROOT), "show", f"{val}:tools/kernels-src/decode_attention.cu"],
                               capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"variant {name}: git show {val}: {r.stderr.strip()}")
            src = out_dir / f"{name}.cu"
            src.write_text(r.stdout)
        elif s != "NOPDL":
            defines.append(f"-D{s}")
    out = out_dir / f"{name}.cubin"
    r = subprocess.run([*NVCC, *defines, "-o", str(out), str(src)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"variant {name}: nvcc failed:\n{r.stderr}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=Path,
                    help="built kernels dir (for qk_norm_rope_kv_pdl); not needed with --dry-run")
    ap.add_argument("--variant", action="append", default=[], help="NAME=SPEC[,SPEC...] (see the module docstring)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[130, 1024, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of 8 replays per graph, variants alternating")
    ap.add_argument("--dry-run", action="store_true", help="build the variants and exit (no GPU)")
    a = ap.parse_args(argv)
    try:
        variants = dict(parse_variant(v) for v in (a.variant or ["base"]))
        for specs in variants.values():
            cluster_smem(specs)  # checks DA_CLUSTER, DA_WARPS, DA_CLUSTER_SLOTS (and no DA_BULK) before any build
    except ValueError as e:
        ap.error(str(e))
    tmp = Path(tempfile.mkdtemp())
    cubins = {n: build_variant(n, s, tmp) for n, s in variants.items()}
    for n, p in cubins.items():
        print(f"built {n}: {' '.join(variants[n]) or '(default)'} -> {p} ({p.stat().st_size} bytes)", flush=True)
    if a.dry_run:
        return 0
    if a.kernels is None:
        ap.error("--kernels DIR is needed to time (qk_norm_rope_kv_pdl)")
    return run(a, variants, cubins)


def run(a, variants, cubins) -> int:
    sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests-integration" / "gpu"), str(ROOT / "tools" / "kernels-src")]
    import ctypes

    import torch
    from cuda.bindings import driver as cu

    import bench_gemv as bg
    from cubin_launch import KernelSet, check, launch_function
    from gpu_helpers import BF, DEV, pool, ref_attention, rope_table

    torch.zeros(1, device=DEV)
    ks = KernelSet(a.kernels)
    fns, smems = {}, {}
    clusters = {n: cluster_size(s) for n, s in variants.items()}  # the launch's grid.y
    threads = {n: 32 * cluster_warps(s) for n, s in variants.items()}  # the launch's block.x
    for n, path in cubins.items():
        f = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData(path.read_bytes())), b"decode_attention_cluster"))
        smems[n] = cluster_smem(variants[n])
        check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    smems[n]))
        if clusters[n] > 8:  # CUDA programming guide: cluster sizes above 8 are non-portable and need the opt-in
            check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
        fns[n] = f
    plain = {n for n, s in variants.items() if "NOPDL" in s}
    ref_name = next(iter(variants))
    P, I32, F32, I64 = bg.P, bg.I32, bg.F32, ctypes.c_int64
    QS = (NQ + 2 * NKV) * D
    cos_sin = rope_table(40960)
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device=DEV)

    def launch(f, grid, block, smem, args, pdl):
        kp = (tuple(x.data_ptr() if torch.is_tensor(x) else x for x, _ in args), tuple(t for _, t in args))
        launch_function(f, grid, block, smem, cu.CUstream(torch.cuda.current_stream().cuda_stream), kp, pdl)

    def per_call(g, n):  # µs per layer call of n replays, L2 flushed before each
        return [t * 1e3 / LAYERS for t in bg.event_times(g.replay, n, warmup=0, before=flush.zero_)]

    for L in a.lengths:
        kv, bt, layer_elems, page_elems = pool(L, LAYERS)
        kv0 = kv.clone()
        seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        qkv0 = torch.randn(LAYERS, QS, device=DEV).to(BF)
        qkv = qkv0.clone()
        pos = torch.tensor([L - 1 + 7], dtype=torch.int64, device=DEV)  # a rotary position far from 0
        slot = torch.tensor([int(bt[(L - 1) // 16]) * 16 + (L - 1) % 16], dtype=torch.int64, device=DEV)
        qw = (1 + 0.1 * torch.randn(LAYERS, D, device=DEV)).to(BF)
        kw = (1 + 0.1 * torch.randn(LAYERS, D, device=DEV)).to(BF)
        outs = {n: torch.full((LAYERS, NQ * D), float("nan"), device=DEV, dtype=BF) for n in variants}

        def attn(n, layer, pdl):
            launch(fns[n], (NKV, clusters[n], 1), (threads[n], 1, 1), smems[n],
                   [(qkv[layer], P), (kv[layer * layer_elems:], P), (bt, P), (seq, P), (outs[n][layer], P), (NQ, I32),
                    (NKV, I32), (QS, I32), (bt.numel(), I32), (page_elems * 2, I32), (1 / math.sqrt(D), F32)], pdl)

        def prologue(layer, pdl):
            ks.launch("qk_norm_rope_kv_pdl", (1, NKV, 1), [qkv[layer], pos, slot, qw[layer], kw[layer], cos_sin,
                                                           kv[layer * layer_elems:], NQ, NKV, 1e-6, page_elems * 2],
                      pdl=pdl)

        graphs = {}
        for n in variants:
            graphs[("A", n)] = bg.capture(lambda n=n: [attn(n, layer, False) for layer in range(LAYERS)])
            if n in plain:
                continue
            graphs[("B", n)] = bg.capture(lambda n=n: [attn(n, layer, layer > 0) for layer in range(LAYERS)])
            graphs[("C", n)] = bg.capture(lambda n=n: [(prologue(layer, layer > 0), attn(n, layer, True))
                                                       for layer in range(LAYERS)])
        graphs[("D", "-")] = bg.capture(lambda: [prologue(layer, layer > 0) for layer in range(LAYERS)])

        def check_mode(n, mode):  # (max relative error over 3 layers, the outputs), from the same fresh state
            qkv.copy_(qkv0)
            kv.copy_(kv0)
            outs[n].fill_(float("nan"))
            graphs[(mode, n)].replay()
            torch.cuda.synchronize()
            err = 0.0
            for layer in (0, LAYERS // 2, LAYERS - 1):
                ref = ref_attention(qkv[layer], kv[layer * layer_elems:], page_elems, bt, L, NQ)
                e = ((outs[n][layer:layer + 1].double() - ref).norm() / ref.norm()).item()
                err = max(err, e) if math.isfinite(e) else math.inf  # NaN: an output left unwritten (poisoned)
            return err, outs[n].clone()

        checks = {n: {"A": check_mode(n, "A")} for n in variants}
        for n in variants:  # mode C: after the prologue, which writes the current token's row of every layer
            if n not in plain:
                checks[n]["C"] = check_mode(n, "C")
        times = {k: [] for k in graphs}
        for _ in range(a.rounds):
            for k, g in graphs.items():
                times[k] += per_call(g, 8)
        med = {k: statistics.median(v) for k, v in times.items()}
        floor = L * NKV * 512 / 4.2e12 * 1e6

        def verdict(n, mode):
            e, o = checks[n][mode]
            ref = checks[ref_name].get(mode)
            same = "" if ref is None or n == ref_name else (
                " =" if torch.equal(o.view(torch.int16), ref[1].view(torch.int16)) else " !=") + ref_name
            return f"{mode} err {e:.1e}{same}"

        print(f"L={L} K+V floor {floor:.2f} us (4.2 TB/s) | " + "  ".join(
            f"{n}: " + ", ".join(verdict(n, m) for m in checks[n]) for n in variants), flush=True)
        for mode in "ABC":
            row = "  ".join(f"{n} {med[(mode, n)]:.2f}" for n in variants if (mode, n) in med)
            if mode == "C":
                row += f"   (D {med[('D', '-')]:.2f}; C-D: " + "  ".join(
                    f"{n} {med[('C', n)] - med[('D', '-')]:.2f}" for n in variants if ("C", n) in med) + ")"
            print(f"  {mode}: {row}", flush=True)
        del graphs, kv, kv0
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
