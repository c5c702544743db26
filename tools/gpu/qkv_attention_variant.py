#!/usr/bin/env python3
"""Rewrite a Qwen3 decode program onto the qkv GEMV + decode attention in one launch of
tools/kernels-src/qkv_attention.cu (experiment; NOTES.md 56).

    python3 tools/gpu/qkv_attention_variant.py MANIFEST --kernels KDIR --out OUT.json [--cubin qkv_attention.cubin]
        [--slots 4] [--slot-bytes 20480]

KDIR holds the manifest's modules and the qkv_attention.cu build named by --cubin (a file name in KDIR; nvcc -cubin
-arch=sm_90 -O3 -std=c++17 -DKERN_PDL [-DQA_SLOTS=S] [-DQA_SLOT_BYTES=B] qkv_attention.cu). Per decode layer,
`norm_qkv` (gemv_norm_qkv on gemv.cu's kern_gemv_norm_m1{,_u5}, module gemv or gemv_p2) + `attn`
(attention_decode_rope on decode_attention_rope_cluster) become one `qkv_attn` call of op `qkv_attention_decode`
(qkv_attention_rope_cluster): the input norm and the qkv GEMV, the q/k norms, rotary and KV write, and the attention,
with (residual, input_layernorm, qkv_proj, positions, slot_mapping, q_norm, k_norm, rope.cos_sin, the layer's KV state
argument with its offset, block_table, seq_lens, attn) from the two calls; qkv never leaves the kernel. The launch
takes the attention launch's grid, scalars (num_q_heads, num_kv_heads, bt_stride, page_bytes, sm_scale, eps) and `pdl`
flag, the GEMV's k (hidden) as K, block 128 (a 4-warp build: a -DDA_WARPS=8 one needs 256), carveout 0, and dynamic
shared memory = the attention launch's + 128 (the ring's mbarriers) + slots·slot_bytes (the weight ring: --slots and
--slot-bytes must match the build's -DQA_SLOTS and -DQA_SLOT_BYTES) + 2560 (the q|k|v copy) + 2·K (x), at most 232448
bytes (227 KB). Prefill, and the `qkv` buffer it uses, are untouched. The result is verified with kern-verify against
KDIR before it is written; what the rewrite does not know (other entries, calls out of order, a GEMV whose n is not
(num_q_heads + 2·num_kv_heads)·128 or whose eps is not the attention's: the kernel uses one eps for both norms) is
refused by name.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from manifest_variants import (VariantError, known_launch, merge_pairs, pin_module, prune,  # noqa: E402
                               rewrite_main, rewrite_parser)

MODULE = "qkv_attention"
ENTRY = "qkv_attention_rope_cluster"
OP = "qkv_attention_decode"
HEAD_DIM = 128
MAX_SHARED = 232448  # sm_90's dynamic shared memory per block (227 KB)
#: The ops the rewrite replaces, the entries it knows for each and, for the GEMV, the modules (gemv.cu's builds).
KNOWN = {
    "gemv_norm_qkv": ("kern_gemv_norm_m1", "kern_gemv_norm_m1_u5"),
    "attention_decode_rope": ("decode_attention_rope_cluster",),
}
GEMV_MODULES = ("gemv", "gemv_p2")
#: The scalars after the 10 params of decode_attention_rope_cluster, and after the 4 of kern_gemv_norm_m1{,_u5}.
ATTN_SCALARS = (("num_q_heads", "i32"), ("num_kv_heads", "i32"), ("q_stride", "i32"), ("bt_stride", "i32"),
                ("page_bytes", "i32"), ("sm_scale", "f32"), ("eps", "f32"))
GEMV_SCALARS = (("n", "i32"), ("k", "i32"), ("eps", "f32"), ("ksplit", "i32"))


def _launch(m: dict, op: str) -> dict:
    return known_launch(m, op, KNOWN[op])


def _scalars(op: str, ln: dict, names: tuple[tuple[str, str], ...], first: int) -> dict:
    """The launch's literal scalar args from arg `first` on, by name; raises VariantError naming the op when one is
    missing or of another type."""
    args = ln.get("args", [])[first:]
    if len(args) != len(names) or any(set(a) != {t} for a, (_, t) in zip(args, names)):
        raise VariantError(f"op `{op}`: launch args after its {first} params are not the literals "
                           f"{', '.join(f'{n}: {t}' for n, t in names)} this rewrite knows")
    return {n: a[t] for a, (n, t) in zip(args, names)}


def rewrite(m: dict, kernels: Path, cubin_name: str = f"{MODULE}.cubin", slots: int = 4,
            slot_bytes: int = 20480) -> dict:
    """The decode program of manifest `m` on the one-launch qkv + attention of KDIR/cubin_name (built with
    -DQA_SLOTS=slots -DQA_SLOT_BYTES=slot_bytes); raises VariantError naming what does not fit."""
    out = copy.deepcopy(m)
    pin_module(out, MODULE, kernels, cubin_name, how="build it from tools/kernels-src/qkv_attention.cu with -DKERN_PDL")
    qkv, attn = _launch(m, "gemv_norm_qkv"), _launch(m, "attention_decode_rope")
    if qkv.get("module") not in GEMV_MODULES:
        raise VariantError(f"op `gemv_norm_qkv` launches from module `{qkv.get('module')}`; this rewrite knows "
                           f"gemv.cu's {', '.join(GEMV_MODULES)}")
    g = _scalars("gemv_norm_qkv", qkv, GEMV_SCALARS, 4)
    a = _scalars("attention_decode_rope", attn, ATTN_SCALARS, 10)
    nq, nkv, k = a["num_q_heads"], a["num_kv_heads"], g["k"]
    if g["n"] != (nq + 2 * nkv) * HEAD_DIM:
        raise VariantError(f"op `gemv_norm_qkv`: n={g['n']} is not (num_q_heads {nq} + 2·num_kv_heads {nkv})·"
                           f"{HEAD_DIM} of op `attention_decode_rope`")
    if g["eps"] != a["eps"]:
        raise VariantError(f"op `gemv_norm_qkv`'s eps {g['eps']} is not op `attention_decode_rope`'s {a['eps']}: "
                           f"{ENTRY} uses one eps for the input norm and the q/k norms")
    attn_smem = attn.get("shared_mem")
    if not isinstance(attn_smem, int):
        raise VariantError("op `attention_decode_rope` launches with no (literal) shared_mem: the kernel's dynamic "
                           "shared memory starts with the attention's")
    if not 2 <= slots <= 16 or slot_bytes % 16 or slot_bytes < 1024:
        raise VariantError(f"--slots {slots}, --slot-bytes {slot_bytes}: the build's -DQA_SLOTS is 2 to 16 and its "
                           "-DQA_SLOT_BYTES a multiple of 16, at least 1024 (qkv_attention.cu's static_asserts)")
    smem = attn_smem + 128 + slots * slot_bytes + 2560 + 2 * k
    if smem > MAX_SHARED:
        raise VariantError(f"op `{OP}`: {smem} bytes of dynamic shared memory ({attn_smem} of the attention + 128 + "
                           f"{slots}·{slot_bytes} of the weight ring + 2560 + 2·{k}) is over sm_90's {MAX_SHARED} "
                           "(227 KB): build with fewer -DQA_SLOTS or smaller -DQA_SLOT_BYTES")

    bf, i64, i32 = "in buffer<bf16>", "in buffer<i64>", "in buffer<i32>"
    params = [bf, bf, bf, i64, i64, bf, bf, "in buffer<f32>", "inout ptr", i32, i32, "out buffer<bf16>"]
    ln = {"module": MODULE, "entry": ENTRY, "params": [*params, "i32", "i32", "i32", "i32", "i32", "f32", "f32"],
          "block": [HEAD_DIM, 1, 1], "grid": copy.deepcopy(attn["grid"]), "shared_mem": smem, "carveout": 0,
          "args": [{"param": i} for i in range(len(params))]
          + [{"i32": nq}, {"i32": nkv}, {"i32": k}, {"i32": a["bt_stride"]}, {"i32": a["page_bytes"]},
             {"f32": a["sm_scale"]}, {"f32": a["eps"]}]}
    if attn.get("pdl"):
        ln["pdl"] = True
    out["ops"][OP] = {"params": params, "impl": {"launches": [ln]}}

    def merge(c: dict, d: dict) -> dict:
        """A layer's norm_qkv call `c` and its attention call `d` -> the one qkv_attn call."""
        if d["args"][0] != c["args"][3]:
            raise VariantError(f"call `{d['label']}`: reads qkv from {d['args'][0]}, not from `{c['label']}`'s "
                               f"output {c['args'][3]}")
        x, nw, wqkv = c["args"][:3]
        return {"label": c["label"].rsplit(".", 1)[0] + ".qkv_attn", "op": OP, "args": [x, nw, wqkv, *d["args"][1:]]}

    calls = merge_pairs(m["programs"]["decode"]["calls"], "gemv_norm_qkv", "attention_decode_rope", merge,
                        "not followed by its attention call (attention_decode_rope)",
                        "an attention call not right after its norm_qkv call")
    out["programs"]["decode"] = {**m["programs"]["decode"], "calls": calls}
    prune(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the manifest's kernels dir, with the qkv_attention.cu build in it")
    ap.add_argument("--cubin", default=f"{MODULE}.cubin", help="the qkv_attention.cu build's file name in KDIR, built "
                    "with -DKERN_PDL (default: %(default)s)")
    ap.add_argument("--slots", type=int, default=4, help="the weight ring's slots: must match the build's -DQA_SLOTS "
                    "(default: %(default)s)")
    ap.add_argument("--slot-bytes", type=int, default=20480, help="bytes per slot: must match the build's "
                    "-DQA_SLOT_BYTES (default: %(default)s)")
    a = ap.parse_args(argv)
    return rewrite_main(ap, a.manifest, a.kernels, a.out,
                        lambda m: rewrite(m, a.kernels, a.cubin, a.slots, a.slot_bytes),
                        f"the one-launch qkv + attention of {a.cubin} ({a.slots} slots of {a.slot_bytes} bytes)")


if __name__ == "__main__":
    raise SystemExit(main())
