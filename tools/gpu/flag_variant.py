#!/usr/bin/env python3
"""Rewrite a Qwen3 decode program so that some GEMVs wait for their producer's blocks through counters instead of
for the producer grid to complete (experiment; gemv.cu's -DGEMV_FLAG_DEP build; NOTES.md 49).

    python3 tools/gpu/flag_variant.py MANIFEST --kernels KDIR --out OUT.json [--mode down|down-qkv|signal-only|tagged]
        [--cubin gemv_flag.cubin]

KDIR holds the manifest's modules and the flag build named by --cubin (a file name in KDIR):

    cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_FLAG_DEP -o KDIR/gemv_flag.cubin gemv.cu

A new `carry` buffer `gemv_flags` (u32 [4], zeroed at load; every counter returns to 0 after each use) holds two
counter pairs: words 0-1 for gate_up -> down, words 2-3 for down -> qkv.

- `--mode down` (default): every decode layer's gate_up (kern_gemv_norm_silu_m1{,_u5}_signal) counts its finished
  blocks in word 0, and its down_proj (kern_gemv_residual_m1_flagwait) waits for that count to reach gate_up's grid
  instead of executing griddepcontrol.wait.
- `--mode down-qkv`: also every down_proj but the last layer's counts its blocks in word 2
  (kern_gemv_residual_m1_flagwait_signal), and the qkv GEMV of every layer but the first
  (kern_gemv_norm_m1_flagwait) waits for it; layer 0's qkv follows the embedding and the lm_head the last down, as
  before (griddepcontrol.wait), so no count is left behind.

- `--mode tagged` (no counters; NOTES.md 51): every decode layer's gate_up (kern_gemv_norm_silu_m1{,_u5}_tagged)
  writes its output into a new `carry` buffer `act_tagged` (u32 [intermediate]) as words bf16 | tag << 16, the tag
  its layer + 1 (a call literal), and its down_proj (kern_gemv_residual_m1_tagged) executes no wait at all: it
  re-reads each word through L2 until the word carries its layer's tag. `gemv_flags` is not used.
- `--mode signal-only` (a diagnostic: what the signals alone cost): gate_up signals as in `down`, every other op is
  the manifest's; nothing waits on the count or resets it, so it only grows (it wraps after 2^32 signals: ~98,000
  4B tokens).

Everything else (grids, ksplits, `pdl` flags, carveouts, the other ops) is the manifest's. Timing experiment: the program must
compute the default's tokens (program_sweep compares them); kern-verify warns E0088 for each waiting entry (a `pdl`
launch whose code never executes griddepcontrol.wait: its dependency is the counter). Refused by name: a manifest
whose GEMV ops launch other entries than the ones this rewrite knows, a cubin without the flag entries.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemv_plan import gemv_blocks  # noqa: E402
from manifest_variants import (NB2_NOTE, TC_NOTE, VariantError, pin_module, plain_twin, prune, rewrite_main,  # noqa: E402
                               rewrite_parser, twin_entry)

MODULE = "gemv_flag"
FLAGS = "gemv_flags"
U32_IO = "inout buffer<u32>"
#: The decode ops the rewrite touches and the manifest entries it knows for each (the flag build has a twin of each;
#: a batched-prologue entry `NAME_nb2` is known as its plain NAME, whose twin it gets: the same bits, the loop prologue).
KNOWN = {
    "gemv_norm_silu_gate_up": ("kern_gemv_norm_silu_m1", "kern_gemv_norm_silu_m1_u5"),
    "gemv_residual_down_proj": ("kern_gemv_residual_m1",),
    "gemv_norm_qkv": ("kern_gemv_norm_m1",),
}
ENTRIES = ("kern_gemv_norm_silu_m1_signal", "kern_gemv_norm_silu_m1_u5_signal", "kern_gemv_residual_m1_flagwait",
           "kern_gemv_residual_m1_flagwait_signal", "kern_gemv_norm_m1_flagwait", "kern_gemv_norm_silu_m1_tagged",
           "kern_gemv_norm_silu_m1_u5_tagged", "kern_gemv_residual_m1_tagged")
MODES = ("down", "down-qkv", "signal-only", "tagged")
TAGGED = "act_tagged"


def _launch(m: dict, op: str) -> dict:
    """The single launch of decode op `op`, which must be gemv.cu's KNOWN entry (or its `_nb2` or gemv_tc.cu form:
    manifest_variants.twin_entry), as a copy whose entry is the plain one (the flag build's twins are named after it;
    manifest_variants.plain_twin)."""
    if op not in m["ops"]:
        raise VariantError(f"the manifest has no op `{op}` (a Qwen3 decode program of tools/gen_qwen3.py is expected)")
    launches = m["ops"][op]["impl"]["launches"]
    if len(launches) != 1 or twin_entry(str(launches[0].get("entry"))) not in KNOWN[op]:
        got = ", ".join(str(ln.get("entry") or ln.get("extern")) for ln in launches)
        raise VariantError(f"op `{op}` launches {got}; this rewrite knows one launch of "
                           + " or ".join(f"`{e}`" for e in KNOWN[op]) + NB2_NOTE * any("_norm" in e for e in KNOWN[op])
                           + TC_NOTE * any(e.startswith("kern_gemv_") for e in KNOWN[op]))
    return plain_twin(op, launches[0])


def _check_cubin(kernels: Path, cubin_name: str) -> None:
    from kern_verify.cubin import CubinError, read_cubin

    try:
        entries = read_cubin((kernels / cubin_name).read_bytes(), cubin_name).entries
    except (OSError, CubinError) as e:
        raise VariantError(f"{kernels / cubin_name}: {e}") from None
    missing = [e for e in ENTRIES if e not in entries]
    if missing:
        raise VariantError(f"{kernels / cubin_name}: not a -DGEMV_FLAG_DEP build of gemv.cu (no {', '.join(missing)})")


def _flag_op(m: dict, op: str, entry: str, extra_params: list[str], extra_args: list[dict]) -> dict:
    """Op `op` of `m` on the flag build's `entry`: its interface gains one `inout buffer<u32>` param per u32 pointer
    in extra_params (forwarded in order), its launch the extra kernel params and args."""
    ln = copy.deepcopy(_launch(m, op))
    n_iface = len(m["ops"][op]["params"])
    ptrs = [p for p in extra_params if p == U32_IO]
    fwd = iter(range(n_iface, n_iface + len(ptrs)))
    if ln.get("module") != "gemv":
        # a row-pass module (4B's qkv on gemv_p2): the flag build's entry is the default form, one 16-row unit per
        # block, whose grid is the default's (n and ksplit the launch's literals; 2 rows per warp group, 8 warps)
        n_out, ksplit = ln["args"][4 if "norm" in ln["entry"] else 3]["i32"], ln["args"][-1]["i32"]
        ln["grid"] = [gemv_blocks(n_out, 1 if "silu" in ln["entry"] else 2, 8, ksplit), 1, 1]
    ln.update(module=MODULE, entry=entry)
    ln["params"] = [*ln["params"], *extra_params]
    ln["args"] = [*ln["args"], *({"param": next(fwd)} if p == U32_IO else a for p, a in zip(extra_params, extra_args))]
    return {"params": [*m["ops"][op]["params"], *ptrs], "impl": {"launches": [ln]}}


def rewrite(m: dict, kernels: Path, mode: str = "down", cubin_name: str = f"{MODULE}.cubin") -> dict:
    """Manifest `m` with its decode program on the flag build (see the module docstring); raises VariantError naming
    what does not fit."""
    if mode not in MODES:
        raise VariantError(f"--mode {mode}: expected one of {', '.join(MODES)}")
    out = copy.deepcopy(m)
    pin_module(out, MODULE, kernels, cubin_name,
               how="build it: cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_FLAG_DEP "
                   f"-o {kernels}/{cubin_name} gemv.cu")
    _check_cubin(Path(kernels), cubin_name)
    gu, down = _launch(m, "gemv_norm_silu_gate_up"), _launch(m, "gemv_residual_down_proj")
    qkv = _launch(m, "gemv_norm_qkv")
    for name, ln in (("gemv_residual_down_proj", down), ("gemv_norm_qkv", qkv)):
        if not ln.get("pdl"):
            raise VariantError(f"op `{name}` is not a `pdl` launch: a waiting entry must launch before its producer "
                               "ends, or its counter is all it adds")
    for name, ln in (("gemv_norm_silu_gate_up", gu), ("gemv_residual_down_proj", down), ("gemv_norm_qkv", qkv)):
        # the targets are the producers' block counts, and a waiting grid's last block (FlagGate: its pass count
        # reaching gridDim.x) resets the counter: a y or z extent would reset it while blocks still poll (a hang)
        if not isinstance(ln["grid"][0], int) or ln["grid"][1:] != [1, 1]:
            raise VariantError(f"op `{name}`'s grid is {ln['grid']}; the flag build needs [N, 1, 1] with N an integer "
                               "(the counters' targets are block counts, FlagGate counts blocks along x)")
    if mode == "tagged":
        return _tagged(m, out, gu, down)
    gu_blocks, down_blocks = gu["grid"][0], down["grid"][0]
    out["buffers"][FLAGS] = {"dtype": "u32", "shape": [4], "class": "carry"}
    out["ops"]["gemv_norm_silu_gate_up_signal"] = _flag_op(m, "gemv_norm_silu_gate_up", gu["entry"] + "_signal",
                                                           [U32_IO], [{}])
    out["ops"]["gemv_residual_down_proj_flagwait"] = _flag_op(m, "gemv_residual_down_proj",
                                                              "kern_gemv_residual_m1_flagwait", [U32_IO, "i32"],
                                                              [{}, {"i32": gu_blocks}])
    if mode == "down-qkv":
        out["ops"]["gemv_residual_down_proj_flagwait_signal"] = _flag_op(
            m, "gemv_residual_down_proj", "kern_gemv_residual_m1_flagwait_signal", [U32_IO, "i32", U32_IO],
            [{}, {"i32": gu_blocks}, {}])
        out["ops"]["gemv_norm_qkv_flagwait"] = _flag_op(m, "gemv_norm_qkv", "kern_gemv_norm_m1_flagwait",
                                                        [U32_IO, "i32"], [{}, {"i32": down_blocks}])
    words01, words23 = {"buf": FLAGS}, {"buf": FLAGS, "offset": 8}
    src = m["programs"]["decode"]["calls"]
    downs = [i for i, c in enumerate(src) if c["op"] == "gemv_residual_down_proj"]
    qkvs = [i for i, c in enumerate(src) if c["op"] == "gemv_norm_qkv"]
    if not downs or not qkvs:
        raise VariantError("the decode program calls no down_proj or no qkv GEMV")
    calls = []
    for i, c in enumerate(src):
        if c["op"] == "gemv_norm_silu_gate_up":
            c = {**c, "op": "gemv_norm_silu_gate_up_signal", "args": [*c["args"], words01]}
        elif c["op"] == "gemv_residual_down_proj" and mode == "signal-only":
            pass
        elif c["op"] == "gemv_residual_down_proj":
            if mode == "down-qkv" and i != downs[-1]:
                c = {**c, "op": "gemv_residual_down_proj_flagwait_signal", "args": [*c["args"], words01, words23]}
            else:
                c = {**c, "op": "gemv_residual_down_proj_flagwait", "args": [*c["args"], words01]}
        elif c["op"] == "gemv_norm_qkv" and mode == "down-qkv" and i != qkvs[0]:
            if src[i - 1]["op"] != "gemv_residual_down_proj":
                raise VariantError(f"call `{c['label']}`: the qkv GEMV does not follow a down_proj call")
            c = {**c, "op": "gemv_norm_qkv_flagwait", "args": [*c["args"], words23]}
        calls.append(c)
    out["programs"]["decode"] = {**m["programs"]["decode"], "calls": calls}
    prune(out)
    return out


def _tagged(m: dict, out: dict, gu: dict, down: dict) -> dict:
    """`out` (a copy of `m` with the module pinned) with `--mode tagged`'s ops, buffer and calls."""
    n, k = gu["args"][4].get("i32"), down["args"][4].get("i32")
    if n is None or n != k:
        raise VariantError(f"gate_up's n ({n}) and down's k ({k}) must be the same integer: the tagged buffer holds "
                           "one word per intermediate column")
    out["buffers"][TAGGED] = {"dtype": "u32", "shape": [n], "class": "carry"}
    ln = copy.deepcopy(gu)
    ln.update(module=MODULE, entry=gu["entry"] + "_tagged")
    ln["params"] = [*ln["params"][:3], "out buffer<u32>", *ln["params"][4:], "i32"]
    ln["args"] = [*ln["args"], {"param": 4}]
    iface = m["ops"]["gemv_norm_silu_gate_up"]["params"]
    out["ops"]["gemv_norm_silu_gate_up_tagged"] = {"params": [*iface[:3], "out buffer<u32>", "i32"],
                                                   "impl": {"launches": [ln]}}
    ln = copy.deepcopy(down)
    ln.update(module=MODULE, entry="kern_gemv_residual_m1_tagged")
    ln["params"] = ["in buffer<u32>", *ln["params"][1:], "i32"]
    ln["args"] = [*ln["args"], {"param": 3}]
    iface = m["ops"]["gemv_residual_down_proj"]["params"]
    out["ops"]["gemv_residual_down_proj_tagged"] = {"params": ["in buffer<u32>", *iface[1:], "i32"],
                                                    "impl": {"launches": [ln]}}
    calls, layer = [], 0
    for c in m["programs"]["decode"]["calls"]:
        if c["op"] == "gemv_norm_silu_gate_up":
            layer += 1
            c = {**c, "op": "gemv_norm_silu_gate_up_tagged", "args": [*c["args"][:3], {"buf": TAGGED}, {"i32": layer}]}
        elif c["op"] == "gemv_residual_down_proj":
            if layer == 0:
                raise VariantError(f"call `{c['label']}`: a down_proj call before any gate_up call")
            c = {**c, "op": "gemv_residual_down_proj_tagged", "args": [{"buf": TAGGED}, *c["args"][1:], {"i32": layer}]}
        calls.append(c)
    if layer < 2:
        raise VariantError(f"{layer} decode layer(s): the tags need at least 2 (a layer's words must differ from the "
                           "previous writer's)")
    out["programs"]["decode"] = {**m["programs"]["decode"], "calls": calls}
    prune(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the manifest's kernels dir, with the gemv.cu flag build in it")
    ap.add_argument("--mode", default="down", choices=MODES, help="which GEMVs wait on counters (default: down)")
    ap.add_argument("--cubin", default=f"{MODULE}.cubin", help="the flag build's file name in KDIR (default: %(default)s)")
    a = ap.parse_args(argv)
    return rewrite_main(ap, a.manifest, a.kernels, a.out, lambda m: rewrite(m, a.kernels, a.mode, a.cubin),
                        f"GEMV dependencies by {a.mode} (not griddepcontrol.wait) from {a.cubin}")


if __name__ == "__main__":
    raise SystemExit(main())
