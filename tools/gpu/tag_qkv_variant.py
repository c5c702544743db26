#!/usr/bin/env python3
"""Rewrite a Qwen3 decode program so that each qkv GEMV takes its x from the down GEMV before it as tagged words
instead of waiting for down's grid to complete (experiment; gemv.cu's -DGEMV_TAG_QKV build; NOTES.md 61).

    python3 tools/gpu/tag_qkv_variant.py MANIFEST --kernels KDIR --out OUT.json \\
        [--cubin gemv_tagq.cubin] [--cubin-p2 gemv_tagq_p2.cubin]

KDIR holds the manifest's modules and the tagged builds named by --cubin (every down_proj, and a qkv GEMV on the
default module) and --cubin-p2 (a qkv GEMV on the row-pass module `gemv_p2`, 4B's), file names in KDIR:

    cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_TAG_QKV -o KDIR/gemv_tagq.cubin gemv.cu
    cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_TAG_QKV -DGEMV_PASSES=2 \\
        -o KDIR/gemv_tagq_p2.cubin gemv.cu

A new `carry` buffer `residual_tagged` (u32 [hidden]) holds the residual as words bf16 | tag << 16. Every down_proj
(kern_gemv_residual_m1_tagout) also writes it, with the tag d + 1 for the program's d-th down_proj call (a call
literal: consecutive writers differ, a zeroed buffer matches none); every qkv GEMV right after a down_proj
(kern_gemv_norm_m1_tagin) reads its x from it, expecting that down_proj's tag, with no griddepcontrol.wait before its
norm prologue and one after its stores. Layer 0's qkv (after the embedding) and the lm_head are the manifest's.
Everything else (grids, ksplits, `pdl` flags, the other ops) is the manifest's, so the program must compute the
default's tokens (program_sweep compares them). Refused by name: a manifest whose down_proj or qkv ops launch other
entries than gemv.cu's plain ones, a qkv GEMV not right after a down_proj (but the first), fewer than 2 layers, a
cubin without the tagged entries.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from manifest_variants import VariantError, known_launch, pin_module, prune, rewrite_main, rewrite_parser  # noqa: E402

MODULE, MODULE_P2 = "gemv_tagq", "gemv_tagq_p2"
TAGGED = "residual_tagged"
DOWN, QKV = "gemv_residual_down_proj", "gemv_norm_qkv"
BUILD = "cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_TAG_QKV {extra}-o {out} gemv.cu"


def _check_cubin(kernels: Path, name: str, entries: tuple[str, ...]) -> None:
    from kern_verify.cubin import CubinError, read_cubin

    try:
        got = read_cubin((kernels / name).read_bytes(), name).entries
    except (OSError, CubinError) as e:
        raise VariantError(f"{kernels / name}: {e}") from None
    if missing := [e for e in entries if e not in got]:
        raise VariantError(f"{kernels / name}: not a -DGEMV_TAG_QKV build of gemv.cu (no {', '.join(missing)})")


def rewrite(m: dict, kernels: Path, cubin: str = f"{MODULE}.cubin", cubin_p2: str = f"{MODULE_P2}.cubin") -> dict:
    """Manifest `m` with its decode program's down -> qkv dependencies on tagged words (see the module docstring);
    raises VariantError naming what does not fit."""
    out = copy.deepcopy(m)
    down = known_launch(m, DOWN, ("kern_gemv_residual_m1",))
    qkv = known_launch(m, QKV, ("kern_gemv_norm_m1",))
    pin_module(out, MODULE, kernels, cubin, how="build it: " + BUILD.format(extra="", out=f"{kernels}/{cubin}"))
    _check_cubin(Path(kernels), cubin, ("kern_gemv_residual_m1_tagout", "kern_gemv_norm_m1_tagin"))
    qkv_module = MODULE
    if qkv["module"] == "gemv_p2":
        pin_module(out, MODULE_P2, kernels, cubin_p2,
                   how="build it: " + BUILD.format(extra="-DGEMV_PASSES=2 ", out=f"{kernels}/{cubin_p2}"))
        _check_cubin(Path(kernels), cubin_p2, ("kern_gemv_norm_m1_tagin",))
        qkv_module = MODULE_P2
    elif qkv["module"] != "gemv":
        raise VariantError(f"op `{QKV}` launches module `{qkv['module']}`; this rewrite knows `gemv` and `gemv_p2`")
    hidden = down["args"][3].get("i32")
    if not isinstance(hidden, int):
        raise VariantError(f"op `{DOWN}`'s n (launch arg 3) is {down['args'][3]}, not an integer literal")
    out["buffers"][TAGGED] = {"dtype": "u32", "shape": [hidden], "class": "carry"}

    ln = copy.deepcopy(down)
    ln.update(module=MODULE, entry="kern_gemv_residual_m1_tagout")
    ln["params"] = [*ln["params"], "out buffer<u32>", "i32"]
    ln["args"] = [*ln["args"], {"param": 3}, {"param": 4}]
    out["ops"][DOWN + "_tagout"] = {"params": [*m["ops"][DOWN]["params"], "out buffer<u32>", "i32"],
                                   "impl": {"launches": [ln]}}
    ln = copy.deepcopy(qkv)
    ln.update(module=qkv_module, entry="kern_gemv_norm_m1_tagin")
    ln["params"] = ["in buffer<u32>", *ln["params"][1:], "i32"]
    ln["args"] = [*ln["args"], {"param": 4}]
    out["ops"][QKV + "_tagin"] = {"params": ["in buffer<u32>", *m["ops"][QKV]["params"][1:], "i32"],
                                  "impl": {"launches": [ln]}}

    calls, tag, src = [], 0, m["programs"]["decode"]["calls"]
    first_qkv = next((i for i, c in enumerate(src) if c["op"] == QKV), None)
    for i, c in enumerate(src):
        if c["op"] == DOWN:
            tag += 1
            c = {**c, "op": DOWN + "_tagout", "args": [*c["args"], {"buf": TAGGED}, {"i32": tag}]}
        elif c["op"] == QKV and i != first_qkv:
            if src[i - 1]["op"] != DOWN:
                raise VariantError(f"call `{c['label']}`: the qkv GEMV does not follow a down_proj call")
            c = {**c, "op": QKV + "_tagin", "args": [{"buf": TAGGED}, *c["args"][1:], {"i32": tag}]}
        calls.append(c)
    if tag < 2:
        raise VariantError(f"{tag} down_proj call(s): the tags need at least 2 layers (a layer's words must differ "
                           "from the previous writer's)")
    out["programs"]["decode"] = {**m["programs"]["decode"], "calls": calls}
    prune(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the manifest's kernels dir, with the tagged gemv.cu builds in it")
    ap.add_argument("--cubin", default=f"{MODULE}.cubin", help="the -DGEMV_TAG_QKV build's file name in KDIR")
    ap.add_argument("--cubin-p2", default=f"{MODULE_P2}.cubin",
                    help="the -DGEMV_TAG_QKV -DGEMV_PASSES=2 build's file name in KDIR (a qkv on module gemv_p2)")
    a = ap.parse_args(argv)
    return rewrite_main(ap, a.manifest, a.kernels, a.out, lambda m: rewrite(m, a.kernels, a.cubin, a.cubin_p2),
                        f"down -> qkv on tagged words ({a.cubin}, {a.cubin_p2})")


if __name__ == "__main__":
    raise SystemExit(main())
