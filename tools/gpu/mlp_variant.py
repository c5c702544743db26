#!/usr/bin/env python3
"""Rewrite a Qwen3 decode program onto the one-launch MLP of tools/kernels-src/gemv_mlp.cu (experiment; NOTES.md 42).

    python3 tools/gpu/mlp_variant.py MANIFEST --kernels KDIR --out OUT.json [--cubin gemv_mlp.cubin]

MANIFEST: a decode program with the dense lm_head (`tools/gen_qwen3.py --lm-head dense`: the rewrite moves its final
norm GEMV onto the accumulator; the default screened head is refused by name). KDIR holds the manifest's modules and
the gemv_mlp.cu build named by --cubin (a file name in KDIR; nvcc -cubin
-arch=sm_90 -O3 -std=c++17 [-DMLP_DOWN_PREWAIT=1] [-DMLP_RED=1] gemv_mlp.cu). Per decode layer, `norm_gate_up_silu`
+ `down_proj_add` become one `gemv_norm_mlp` call (kern_mlp_m1, or kern_mlp_m1_prewait in a -DMLP_DOWN_PREWAIT=1
build, whose larger dynamic shared memory is set from the entry the cubin has), whose down output lands in the
fixed-point accumulator buffer `mlp_acc` (i64 [hidden]); the next layer's `norm_qkv` (kern_gemv_norm_acc_m1{,_u5})
and the final `norm_lm_head` normalize residual + that output, the next `o_proj_add` (kern_gemv_residual_acc_m1) adds
both to the residual and clears the accumulator, and the step's embedding (kern_embedding_acc) clears it for layer
0. The qkv, o_proj and lm_head launches keep the manifest's grids, ksplits, `pdl` flags and carveouts (none in the
generator's); the MLP launch takes gate_up's `pdl` flag, grid n/8 (8 columns per CTA, ksplit 1) and 2·k bytes of
dynamic shared memory (18·k for the prewait build), and no carveout (its entry is in no kernel index). The result is verified with kern-verify against KDIR before it is written; what the rewrite does not
know (other entries, a PDL embedding, shapes the kernel refuses) is refused by name.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from manifest_variants import (VariantError, known_launch, merge_pairs, pin_module, prune,  # noqa: E402
                               rewrite_main, rewrite_parser)

ACC = "mlp_acc"
MODULE = "gemv_mlp"
#: The ops the rewrite replaces, and the gemv.cu entries it knows for each.
KNOWN = {
    "embedding": ("embedding",),
    "gemv_norm_qkv": ("kern_gemv_norm_m1", "kern_gemv_norm_m1_u5"),
    "gemv_norm_lm_head": ("kern_gemv_norm_m1", "kern_gemv_norm_m1_u5"),
    "gemv_residual_o_proj": ("kern_gemv_residual_m1",),
    "gemv_norm_silu_gate_up": ("kern_gemv_norm_silu_m1", "kern_gemv_norm_silu_m1_u5"),
    "gemv_residual_down_proj": ("kern_gemv_residual_m1",),
}


def _launch(m: dict, op: str) -> dict:
    return known_launch(m, op, KNOWN[op])


def _mlp_entry(kernels: Path, cubin_name: str) -> str:
    from kern_verify.cubin import CubinError, read_cubin

    try:
        entries = read_cubin((kernels / cubin_name).read_bytes()).entries
    except (OSError, CubinError) as e:
        raise VariantError(f"{kernels / cubin_name}: {e}") from None
    found = [e for e in ("kern_mlp_m1", "kern_mlp_m1_prewait") if e in entries]
    if len(found) != 1:
        raise VariantError(f"{kernels / cubin_name}: not a gemv_mlp.cu build (entries: {', '.join(sorted(entries))})")
    return found[0]


def rewrite(m: dict, kernels: Path, cubin_name: str = f"{MODULE}.cubin") -> dict:
    """The decode program of manifest `m` on the one-launch MLP of KDIR/cubin_name; raises VariantError naming what
    does not fit."""
    out = copy.deepcopy(m)
    pin_module(out, MODULE, kernels, cubin_name, how="build it from tools/kernels-src/gemv_mlp.cu")
    mlp_entry = _mlp_entry(Path(kernels), cubin_name)
    hidden = m["buffers"]["residual"]["shape"][1]
    out["buffers"][ACC] = {"dtype": "i64", "shape": [hidden], "class": "workspace"}
    acc_in, acc_io, acc_out = "in buffer<i64>", "inout buffer<i64>", "out buffer<i64>"
    qkv, lm, o = _launch(m, "gemv_norm_qkv"), _launch(m, "gemv_norm_lm_head"), _launch(m, "gemv_residual_o_proj")
    gu, emb = _launch(m, "gemv_norm_silu_gate_up"), _launch(m, "embedding")
    _launch(m, "gemv_residual_down_proj")
    if emb.get("pdl"):
        raise VariantError("op `embedding` is a `pdl` launch: kern_embedding_acc never waits for its predecessor, "
                           "so it must launch without it")

    def retarget(ln: dict, entry: str, acc_type: str, at: int) -> dict:
        """`ln` on gemv_mlp's `entry`, with the accumulator inserted as kernel param `at` (forwarded from the op's
        interface param `at`)."""
        ln = copy.deepcopy(ln)
        ln.update(module=MODULE, entry=entry)
        ln["params"] = [*ln["params"][:at], acc_type, *ln["params"][at:]]
        fwd = [a for a in ln["args"] if "param" in a]
        ln["args"] = [{"param": i} for i in range(len(fwd) + 1)] + ln["args"][len(fwd):]
        return ln

    def op(params: list[str], ln: dict) -> dict:
        return {"params": params, "impl": {"launches": [ln]}}

    bf = "in buffer<bf16>"
    norm_params = [bf, acc_in, bf, bf, "out buffer<bf16>"]
    out["ops"]["gemv_norm_acc_qkv"] = op(norm_params, retarget(qkv, qkv["entry"].replace("norm", "norm_acc"), acc_in, 1))
    out["ops"]["gemv_norm_acc_lm_head"] = op(norm_params, retarget(lm, lm["entry"].replace("norm", "norm_acc"), acc_in, 1))
    out["ops"]["gemv_residual_acc_o_proj"] = op([bf, bf, "inout buffer<bf16>", acc_io],
                                                retarget(o, "kern_gemv_residual_acc_m1", acc_io, 3))
    out["ops"]["embedding_acc"] = op([*m["ops"]["embedding"]["params"], acc_out],
                                     retarget(emb, "kern_embedding_acc", acc_out, 3))
    n, k, eps = gu["args"][4]["i32"], gu["args"][5]["i32"], gu["args"][6]["f32"]
    if n % 64 or k % 256 or k > 8192:
        raise VariantError(f"gate_up n={n}, k={k}: kern_mlp_m1 needs n % 64 == 0, k % 256 == 0, k <= 8192")
    mlp = {"module": MODULE, "entry": mlp_entry, "params": [bf, bf, bf, bf, acc_io, "i32", "i32", "f32"],
           "block": [256, 1, 1], "grid": [n // 8, 1, 1],
           "shared_mem": (18 if mlp_entry.endswith("_prewait") else 2) * k,
           "args": [{"param": i} for i in range(5)] + [{"i32": n}, {"i32": k}, {"f32": eps}]}
    if gu.get("pdl"):
        mlp["pdl"] = True
    out["ops"]["gemv_norm_mlp"] = op([bf, bf, bf, bf, acc_io], mlp)

    acc = {"buf": ACC}

    def merge(c: dict, d: dict) -> dict:
        """A layer's gate_up call `c` and its down_proj call `d` -> the one mlp call."""
        x, nw, wgu = c["args"][:3]
        return {"label": c["label"].rsplit(".", 1)[0] + ".mlp", "op": "gemv_norm_mlp",
                "args": [x, nw, wgu, d["args"][1], acc]}

    def with_acc(c: dict) -> dict:
        """Call `c` on its accumulator form (the embedding, the norm GEMVs, the o_proj), other calls as they are."""
        if c["op"] == "embedding":
            return {**c, "op": "embedding_acc", "args": [*c["args"], acc]}
        if c["op"] in ("gemv_norm_qkv", "gemv_norm_lm_head"):
            return {**c, "op": c["op"].replace("norm", "norm_acc"), "args": [c["args"][0], acc, *c["args"][1:]]}
        if c["op"] == "gemv_residual_o_proj":
            return {**c, "op": "gemv_residual_acc_o_proj", "args": [*c["args"], acc]}
        return c

    calls = merge_pairs(m["programs"]["decode"]["calls"], "gemv_norm_silu_gate_up", "gemv_residual_down_proj", merge,
                        "not followed by a down_proj call", "a down_proj call not right after its gate_up call")
    out["programs"]["decode"] = {**m["programs"]["decode"], "calls": [with_acc(c) for c in calls]}
    prune(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the manifest's kernels dir, with the gemv_mlp.cu build in it")
    ap.add_argument("--cubin", default=f"{MODULE}.cubin", help="the gemv_mlp.cu build's file name in KDIR "
                    "(default: %(default)s)")
    a = ap.parse_args(argv)
    return rewrite_main(ap, a.manifest, a.kernels, a.out, lambda m: rewrite(m, a.kernels, a.cubin),
                        f"the one-launch MLP of {a.cubin}")


if __name__ == "__main__":
    raise SystemExit(main())
