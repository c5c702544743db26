#!/usr/bin/env python3
"""Rewrite decode GEMV ops of a Qwen3 manifest onto gemv.cu's L2-prefetch forms, prefetching chosen weight rows into L2
before the PDL wait (experiment; NOTES.md 43 has what it measured).

    python3 tools/gpu/l2_prefetch_variant.py MANIFEST --kernels KDIR --out OUT.json --prefetch OP:TARGET:FIRST_ROW:ROWS ...

KDIR must hold gemv_pf0.cubin: gemv.cu built with `-DGEMV_L2_PREFETCH -DGEMV_PF_AT=0` (the `_pf` forms issue their
prefetch right after their first weight stages, before griddepcontrol.wait; their own weight loads carry an
L2::evict_first policy unless also built with -DGEMV_PF_EVICT_FIRST=0). Each `--prefetch` moves every decode call
of one op onto its `_pf` entry (same arithmetic, bit for bit) with the range [FIRST_ROW, FIRST_ROW + ROWS) of a
weight as the range to prefetch, split evenly over all the launch's blocks (gemv.cu's header), so the blocks that
start late issue their share late too; the launch keeps the rest of its configuration (`pdl`, shared memory, a
`carveout` where it has one), and the grid where its module is `gemv`. ROWS = 0 is the control: the `_pf` form with nothing to prefetch.

- OP: `qkv` (gemv_norm_qkv on kern_gemv_norm_m1, or its batched-prologue form kern_gemv_norm_m1_nb2, whose `_pf`
  form is the plain entry's: the same bits, the loop prologue) or `o` (gemv_residual_o_proj on kern_gemv_residual_m1);
- TARGET: `self` (the op's own weight in that layer) or `gate_up` (the same layer's gate_up weight).

The result is verified with kern-verify against KDIR before it is written.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemv_plan import gemv_blocks  # noqa: E402
from manifest_variants import VariantError, pin_module, prune, rewrite_main, rewrite_parser, twin_entry  # noqa: E402

MODULE = "gemv_pf0"
OPS = {"qkv": ("gemv_norm_qkv", "kern_gemv_norm_m1", "kern_gemv_norm_m1_pf"),
       "o": ("gemv_residual_o_proj", "kern_gemv_residual_m1", "kern_gemv_residual_m1_pf")}
WEIGHTS = {"qkv": "self_attn.qkv_proj.weight", "o": "self_attn.o_proj.weight", "gate_up": "mlp.gate_up_proj.weight"}


def parse_spec(spec: str) -> tuple[str, str, int, int]:
    """`OP:TARGET:FIRST_ROW:ROWS` -> its parts; raises ValueError naming what is wrong."""
    parts = spec.split(":")
    if len(parts) != 4:
        raise ValueError(f"`{spec}`: expected OP:TARGET:FIRST_ROW:ROWS")
    op, target, first, rows = parts
    if op not in OPS:
        raise ValueError(f"`{spec}`: OP is one of {', '.join(OPS)}")
    if target not in ("self", "gate_up"):
        raise ValueError(f"`{spec}`: TARGET is `self` or `gate_up`")
    if not (first.isdigit() and rows.isdigit()):
        raise ValueError(f"`{spec}`: FIRST_ROW and ROWS are integers (ROWS = 0: the control, nothing prefetched)")
    return op, target, int(first), int(rows)


def rewrite(m: dict, kernels: Path, specs: list[str]) -> dict:
    """Manifest `m` with each spec's op on the `_pf` entry of KDIR/gemv_pf0.cubin; raises ValueError (VariantError)
    naming what is wrong."""
    out = copy.deepcopy(m)
    pin_module(out, MODULE, kernels, f"{MODULE}.cubin", how="build gemv.cu with -DGEMV_L2_PREFETCH -DGEMV_PF_AT=0")
    seen = set()
    for spec in specs:
        key, target, first, rows = parse_spec(spec)
        if key in seen:
            raise ValueError(f"`{spec}`: op `{key}` is given twice")
        seen.add(key)
        op, base, entry = OPS[key]
        if op not in m["ops"]:
            raise ValueError(f"`{spec}`: the manifest has no op `{op}` (a generated Qwen3 manifest is expected)")
        ln = copy.deepcopy(m["ops"][op]["impl"]["launches"][0])
        if twin_entry(str(ln.get("entry"))) != base:
            raise ValueError(f"`{spec}`: op `{op}` launches {ln.get('entry')}, which has no `_pf` form here ({base} does)")
        weight = WEIGHTS[key if target == "self" else target]
        n_rows, k = m["buffers"][f"model.layers.0.{weight}"]["shape"]
        if first + rows > n_rows:
            raise ValueError(f"`{spec}`: rows {first}..{first + rows - 1} are past the weight's {n_rows} rows")
        n_params = len(m["ops"][op]["params"])
        if ln.get("module") != "gemv":
            # a row-pass module (4B's qkv on gemv_p2 since session 18): the `_pf` entry is the default form, whose
            # grid is the default's (ksplit the launch's last literal; 2 rows per warp group, 8 warps per block)
            n_out, ksplit = ln["args"][4 if "norm" in base else 3]["i32"], ln["args"][-1]["i32"]
            ln["grid"] = [gemv_blocks(n_out, 2, 8, ksplit), 1, 1]
        ln.update(module=MODULE, entry=entry)
        ln["params"] = [*ln["params"], "in buffer<bf16>", "u64"]
        ln["args"] = [*ln["args"], {"param": n_params}, {"u64": rows * k * 2}]
        new = f"{op}_pf"
        out["ops"][new] = {"params": [*m["ops"][op]["params"], "in buffer<bf16>"], "impl": {"launches": [ln]}}
        del out["ops"][op]
        for c in out["programs"]["decode"]["calls"]:
            if c["op"] == op:
                layer = c["args"][2 if key == "qkv" else 1]["buf"].split(".")[2]  # the op's own weight names the layer
                c["op"] = new
                c["args"] = [*c["args"], {"buf": f"model.layers.{layer}.{weight}", "offset": first * k * 2}]
    prune(out)  # e.g. gemv_p2, once 4B's qkv has moved to the `_pf` entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the manifest's kernels dir, with gemv_pf0.cubin in it")
    ap.add_argument("--prefetch", action="append", required=True, metavar="OP:TARGET:FIRST_ROW:ROWS")
    a = ap.parse_args(argv)
    return rewrite_main(ap, a.manifest, a.kernels, a.out, lambda m: rewrite(m, a.kernels, a.prefetch),
                        "prefetch " + ", ".join(a.prefetch))


if __name__ == "__main__":
    raise SystemExit(main())
