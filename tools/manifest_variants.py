#!/usr/bin/env python3
"""Variants of a Qwen3 manifest that differ from it in one or a few launch configurations, for A/B runs.

    python3 tools/manifest_variants.py MANIFEST --kernels DIR --variant gu.entry=kern_gemv_norm_silu_m1+attn.pdl=0 \
        --out OUT.json

A variant is `CHANGE[+CHANGE...]`, each `OP.OPTION=VALUE` on the first launch of one op that only the decode
program calls (an op of several launches has its first changed: the screened lm_head's screen, of three; a dense
manifest's argmax's partial pass, of two):

- OP: a short name (`qkv`, `o`, `gate_up` or `gu`, `down`: the gemv ops of tools/gen_qwen3.py; `lm_head`: the
  screened lm_head's op `norm_lm_head_argmax_screened`, gen_qwen3's default, or the dense one's GEMV
  `gemv_norm_lm_head` in a `gen_qwen3.py --lm-head dense` manifest; `attn`: the decode attention, whichever impl;
  `argmax`: the dense lm_head's argmax, which the screened op does in its own third launch) or a full op name of the
  manifest.
- `ksplit=N` (gemv.cu entries): the launch's `ksplit` literal and its grid (`gemv_plan.gemv_blocks` with the
  entry's COLS_PER_WARP, WARPS and PASSES from the kernel index); N in 1, 2, 4, 8 (only 1 on a row-pass entry,
  PASSES > 1: 4B's qkv on gemv_p2.cubin in a `--gemv gemv-fma` manifest, and on gemv_tc.cu's tensor-core entries,
  TC_STEP: every decode GEMV by default).
- `entry=NAME`: the same kernel with another unroll or norm prologue: an entry of the same module with the same
  params and the same index constexprs but UNROLL and NORM_NB (e.g. `kern_gemv_norm_silu_m1` for
  `kern_gemv_norm_silu_m1_u5`, or for `kern_gemv_norm_silu_m1_nb2`, its batched-prologue form); the
  launch's dynamic shared memory follows the index (`shared_mem` + `shared_mem_per`), and so does its `carveout`.
- `tc=1|0`: the op on gemv_tc.cu's tensor-core twin of its gemv.cu entry (`tc=1`: `kern_gemv_norm_m1_nb2` of module
  gemv or gemv_p2 -> `kern_gemvtc_norm_m1`, with the unroll tools/gemv_plan.py `gemv_tc_unroll` gives the op, as
  tools/gen_qwen3.py launches it), or back on gemv.cu's plain twin (`tc=0`: module `gemv`, the loop norm prologue,
  the tc entry's unroll; not the launch a `--gemv gemv-fma` manifest has, whose ksplit, row passes and `_nb2` follow
  gemv.cu's rules: for that A/B, time against such a manifest, or add `OP.entry=` / `OP.ksplit=` changes); either way
  at ksplit 1 with that entry's ksplit-1 grid (`gemv_plan.gemv_blocks` with its COLS_PER_WARP and WARPS), its dynamic
  shared memory and carveout from the index. M = 1 gemv.cu / gemv_tc.cu entries only (not gemv_persist.cu's). The
  module `gemv_tc` (gemv_tc.cubin of the kernels dir) is declared where the manifest lacks it. With
  tools/manifest_whatif.py `--module gemv_tc=FILE` after it, an op can be timed on a what-if build of gemv_tc.cu.
- `pdl=0|1`: the launch's programmatic-dependent-launch flag.
- `carveout=P|none`: the launch's preferred shared-memory carveout (percent 0..100; `none` removes the field: the
  driver's choice), e.g. `attn.carveout=none` against the default's `"carveout": 0` (NOTES.md 55).

The other changes keep the launch's `carveout`, except `entry=`, which takes the new entry's from the index.

The result is checked by kern-verify (with the kernels dir: each launch's params against its cubin) before it is
written; its errors refuse the variant, its warnings are printed (E0088: a `pdl` launch of a kernel that does not
wait for its predecessor). Session 10 found the o-proj's ksplit 2 this way (NOTES.md 32): the decode program, not a chain of GEMVs,
is where a launch configuration is judged; `tools/gpu/program_sweep.py` times such variants side by side.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))

from catalog import shared_mem_of  # noqa: E402  (the index's shared-memory rule)
from gemv_plan import (GEMV_TC_PREFIX, GEMV_TC_STEP, GEMV_UNROLL_SUFFIX, gemv_blocks, gemv_entry_inputs,  # noqa: E402
                       gemv_plain_entry, gemv_tc_entry, gemv_tc_unroll)

#: The screened lm_head's op (tools/gen_qwen3.py --lm-head screened, the default since session 24): the final norm,
#: the lm_head and the argmax in three launches (lm_head_screen.cubin's screen and pick, then argmax_reduce), in place
#: of the dense form's two ops DENSE_LM_HEAD_OPS (`--lm-head dense`: a GEMV into `logits`, then a two-launch argmax).
SCREENED_LM_HEAD = "norm_lm_head_argmax_screened"
DENSE_LM_HEAD_OPS = ("gemv_norm_lm_head", "argmax")
#: Short op names -> the manifest op names they may stand for (the first present is used): `lm_head` is the dense
#: GEMV where there is one, else the screened op; `argmax` exists in dense manifests only.
SHORT = {
    "qkv": ("gemv_norm_qkv",), "o": ("gemv_residual_o_proj",), "gate_up": ("gemv_norm_silu_gate_up",),
    "gu": ("gemv_norm_silu_gate_up",), "down": ("gemv_residual_down_proj",),
    "lm_head": ("gemv_norm_lm_head", SCREENED_LM_HEAD), "attn": ("attention_decode_rope", "attention_decode"),
    "argmax": ("argmax",),
}
KSPLITS = (1, 2, 4, 8)
CARVEOUT_MAX = 100  # a launch's `carveout` is a percent (kern-verify E0095)


class VariantError(ValueError):
    """A variant that cannot be applied; the message names the change and what is wrong."""


def load_index(kernels_dir: str | Path) -> dict:
    """DIR/index.json's kernels by (module file, entry). Raises VariantError when it cannot be read."""
    path = Path(kernels_dir) / "index.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise VariantError(f"{path}: cannot read the kernel index ({e}); build one with tools/build_kernels.py") from None
    return {(k["module"], k["entry"]): k for k in raw["kernels"].values()}


def lm_head_note(m: dict, name: str) -> str:
    """A sentence to add to a refusal about op `name` (a short or full op name) of manifest `m`: where `m` has the
    screened lm_head and `name` is one of the lm_head's names (`lm_head`, `argmax`, DENSE_LM_HEAD_OPS or the screened
    op itself), what the screened op is and that the dense ops need a `--lm-head dense` manifest; else ""."""
    if SCREENED_LM_HEAD not in m.get("ops", {}) or name not in ("lm_head", *DENSE_LM_HEAD_OPS, SCREENED_LM_HEAD):
        return ""
    return (f"; this manifest has the screened lm_head (tools/gen_qwen3.py's default): one op `{SCREENED_LM_HEAD}` "
            "(short name `lm_head`) of three launches, the screen and pick of lm_head_screen.cubin and argmax_reduce, "
            f"in place of the dense `{DENSE_LM_HEAD_OPS[0]}` + `{DENSE_LM_HEAD_OPS[1]}`: for those, pass a manifest of "
            "`tools/gen_qwen3.py --lm-head dense`")


def _calls(m: dict, program: str) -> set[str]:
    return {c["op"] for c in m.get("programs", {}).get(program, {}).get("calls", [])}


def _launch(m: dict, op_key: str, change: str) -> tuple[str, dict]:
    names = SHORT.get(op_key, (op_key,))
    op = next((n for n in names if n in m["ops"]), None)
    decode_only = sorted(_calls(m, "decode") - _calls(m, "prefill"))
    if op is None:
        raise VariantError(f"`{change}`: no op `{op_key}` in the manifest (short names: {', '.join(SHORT)}; "
                           f"or one of its decode ops: {', '.join(decode_only)})" + lm_head_note(m, op_key))
    if op not in decode_only:
        why = "not called by decode" if op not in _calls(m, "decode") else "also called by prefill"
        raise VariantError(f"`{change}`: op `{op}` is {why}; a variant changes decode-only ops: {', '.join(decode_only)}")
    launches = m["ops"][op]["impl"]["launches"]
    if not launches or "entry" not in launches[0]:
        raise VariantError(f"`{change}`: op `{op}` has no kernel launch to change")
    return op, launches[0]


def _index_entry(m: dict, index: dict, launch: dict, entry: str, change: str, op: str = "") -> dict:
    module = m["modules"][launch["module"]]["source"]
    k = index.get((module, entry))
    if k is None:
        have = sorted(e for (mod, e) in index if mod == module)
        raise VariantError(f"`{change}`: the kernel index has no entry `{entry}` in module {module} "
                           f"(it has: {', '.join(have)})" + lm_head_note(m, op))
    return k


def _same_params(new: dict, old: dict, new_entry: str, entry: str, change: str) -> None:
    """Raises VariantError unless index entry `new` (named new_entry) takes the params of `old` (the launch's entry)."""
    if (new["params"], new["param_names"]) != (old["params"], old["param_names"]):
        raise VariantError(f"`{change}`: `{new_entry}` takes {new['params']}, `{entry}` takes {old['params']}; only an "
                           "entry with the same params can replace it")


def _index_config(launch: dict, k: dict, change: str) -> None:
    """Sets `launch`'s dynamic shared memory (catalog.shared_mem_of over its literal args) and carveout (none: the
    driver's choice) from its new index entry `k`, in place. Raises VariantError when a literal the rule needs is
    missing."""
    try:
        smem = shared_mem_of(k, [a.get("i32") for a in launch["args"]])
    except ValueError as e:
        raise VariantError(f"`{change}`: {e} (a literal in the manifest)") from None
    if smem:
        launch["shared_mem"] = smem
    else:
        launch.pop("shared_mem", None)
    if k.get("carveout") is not None:
        launch["carveout"] = k["carveout"]
    else:
        launch.pop("carveout", None)


def _arg(launch: dict, k: dict, pname: str, change: str) -> int:
    i = k["param_names"].index(pname)
    a = launch["args"][i]
    if "i32" not in a:
        raise VariantError(f"`{change}`: param `{pname}` of `{launch['entry']}` is not an i32 literal ({a})")
    return a["i32"]


def apply(m: dict, spec: str, index: dict) -> dict:
    """A copy of manifest `m` (a decoded JSON dict) with variant `spec` applied (see the module docstring).

    Raises:
        VariantError: a malformed change, an unknown op or option, a value out of range (a carveout that is not
            0..100 or `none` too), an entry the index lacks or whose params differ, a launch without a `ksplit` param,
            a ksplit other than 1 on a row-pass entry.
    """
    out = copy.deepcopy(m)
    for change in spec.split("+"):
        what, eq, value = change.partition("=")
        op_key, dot, option = what.partition(".")
        if not (eq and dot and value):
            raise VariantError(f"`{change}`: a change is OP.OPTION=VALUE (e.g. o.ksplit=2, gu.entry=NAME, attn.pdl=0)")
        op, launch = _launch(out, op_key, change)
        if option == "ksplit":
            k = _index_entry(out, index, launch, launch["entry"], change, op)
            if "ksplit" not in k["param_names"]:
                raise VariantError(f"`{change}`: `{launch['entry']}` (op `{op}`) has no ksplit param"
                                   + lm_head_note(out, op))
            if not value.isdigit() or int(value) not in KSPLITS:
                raise VariantError(f"`{change}`: ksplit must be one of {', '.join(map(str, KSPLITS))}")
            ks = int(value)
            n = _arg(launch, k, "n", change)
            cx = k["constexprs"]
            passes = cx.get("PASSES", 1)
            if passes != 1 and ks != 1:
                default = gemv_blocks(n, cx["COLS_PER_WARP"], cx["WARPS"], 1)
                raise VariantError(f"`{change}`: `{launch['entry']}` of module {out['modules'][launch['module']]['source']}"
                                   f" (op `{op}`) is the row-pass form, {passes} units of 16 rows per block (gemv.cu "
                                   f"-DGEMV_PASSES={passes}): it takes ksplit 1 only (another traps); to try another, "
                                   f"put the op on the default form first: tools/manifest_whatif.py --op-module "
                                   f"{op_key}=gemv.cubin --op-grid {op_key}={default}")
            if "TC_STEP" in cx and ks != 1:
                raise VariantError(f"`{change}`: `{launch['entry']}` (op `{op}`) is gemv_tc.cu's tensor-core form, one "
                                   f"16-row tile per block with its 8 warps splitting k: it takes ksplit 1 only "
                                   f"(another traps); for gemv.cu's ksplit, generate the manifest with "
                                   f"`tools/gen_qwen3.py --gemv gemv-fma`")
            launch["args"][k["param_names"].index("ksplit")] = {"i32": ks}
            launch["grid"][0] = gemv_blocks(n, cx["COLS_PER_WARP"], cx["WARPS"], ks, passes)
        elif option == "entry":
            old = _index_entry(out, index, launch, launch["entry"], change, op)
            new = _index_entry(out, index, launch, value, change, op)
            _same_params(new, old, value, launch["entry"], change)
            differ = sorted(c for c in set(new["constexprs"]) | set(old["constexprs"])
                            if c not in ("UNROLL", "NORM_NB") and new["constexprs"].get(c) != old["constexprs"].get(c))
            if differ:
                raise VariantError(f"`{change}`: `{value}` is not `{launch['entry']}` with another unroll or norm "
                                   "prologue (their "
                                   + ", ".join(f"{c} {old['constexprs'].get(c)} vs {new['constexprs'].get(c)}"
                                               for c in differ) + ")")
            launch["entry"] = value
            _index_config(launch, new, change)
        elif option == "tc":
            _to_tensor_core(out, index, op, launch, value, change)
        elif option == "pdl":
            if value not in ("0", "1"):
                raise VariantError(f"`{change}`: pdl is 0 or 1")
            if value == "1":
                launch["pdl"] = True
            else:
                launch.pop("pdl", None)
        elif option == "carveout":
            if value == "none":
                launch.pop("carveout", None)
            elif value.isdigit() and int(value) <= CARVEOUT_MAX:
                launch["carveout"] = int(value)
            else:
                raise VariantError(f"`{change}`: carveout is a percent 0..{CARVEOUT_MAX} of the maximum shared memory "
                                   "per SM (0: the most L1), or `none` for the driver's choice")
        else:
            raise VariantError(f"`{change}`: unknown option `{option}` (ksplit, entry, tc, pdl, carveout)")
    return out


#: Module names and files of the GEMV forms `tc=` moves a launch between (tools/gen_qwen3.py's names).
TC_MODULE, GEMV_MODULE = ("gemv_tc", "gemv_tc.cubin"), ("gemv", "gemv.cubin")


def _to_tensor_core(m: dict, index: dict, op: str, launch: dict, value: str, change: str) -> None:
    """`OP.tc=1|0` on `launch` of op `op` of manifest `m` (in place; see the module docstring). Raises VariantError:
    a value other than 0 or 1, an entry that is not an M = 1 gemv.cu / gemv_tc.cu entry or is already on the form
    asked for, an entry the index lacks or whose params differ from the launch's, a module name taken by another
    file."""
    if value not in ("0", "1"):
        raise VariantError(f"`{change}`: tc is 1 (gemv_tc.cu's tensor-core entry) or 0 (gemv.cu's)")
    entry = str(launch["entry"])
    on_tc = entry.startswith(GEMV_TC_PREFIX)
    if not twin_entry(entry).startswith("kern_gemv_"):  # gemv_persist.cu's kern_gemvp_*, or no GEMV at all
        raise VariantError(f"`{change}`: op `{op}` launches `{entry}`, not a gemv.cu or gemv_tc.cu entry"
                           + (" (gemv_persist.cu's: generate the manifest with `tools/gen_qwen3.py --gemv gemv` or "
                              "`--gemv gemv-fma` for these)" if entry.startswith("kern_gemvp") else "")
                           + lm_head_note(m, op))
    inputs = gemv_entry_inputs(entry)
    if inputs != 1:
        raise VariantError(f"`{change}`: `{entry}` (op `{op}`) takes {inputs} inputs; decode's GEMVs take one")
    if on_tc == (value == "1"):
        raise VariantError(f"`{change}`: op `{op}` already launches `{entry}` (" +
                           ("gemv_tc.cu's tensor-core form" if on_tc else "gemv.cu's form") + ")")
    old = _index_entry(m, index, launch, entry, change, op)
    if value == "1":  # the generator's unroll for the op (gemv_plan.gemv_tc_unroll), not the gemv.cu entry's
        from gen_qwen3 import GEMV_OPS_BEFORE_ATTENTION  # (imports kern-schema: only for this change)

        k = _arg(launch, old, "k", change)
        if k % GEMV_TC_STEP:
            raise VariantError(f"`{change}`: gemv_tc.cu's M = 1 entries step k by {GEMV_TC_STEP} elements; op "
                               f"`{op}`'s k = {k} is not a multiple (the launch would trap)")
        base = gemv_tc_entry(gemv_plain_entry(entry).removesuffix("_u5"))
        (name, file_name), new_entry = TC_MODULE, base + GEMV_UNROLL_SUFFIX[
            gemv_tc_unroll(k, op in GEMV_OPS_BEFORE_ATTENTION)]
    else:
        (name, file_name), new_entry = GEMV_MODULE, twin_entry(entry)
    new = index.get((file_name, new_entry))
    if new is None:
        raise VariantError(f"`{change}`: the kernel index has no `{new_entry}` in module {file_name} (rebuild the "
                           "kernels with tools/build_kernels.py)")
    _same_params(new, old, new_entry, entry, change)
    have = m["modules"].get(name)
    if have is None:
        m["modules"][name] = {"source": file_name, "sha256": new["sha256"]}
    elif have["source"] != file_name:
        raise VariantError(f"`{change}`: the manifest's module `{name}` is {have['source']}, not {file_name}")
    cx = new["constexprs"]
    if value == "1" and cx.get("TC_STEP") != GEMV_TC_STEP:
        raise VariantError(f"`{change}`: `{new_entry}` in the kernel index has TC_STEP {cx.get('TC_STEP')}, not "
                           f"{GEMV_TC_STEP}: a stale index; rebuild the kernels with tools/build_kernels.py")
    launch["module"], launch["entry"] = name, new_entry
    launch["args"][new["param_names"].index("ksplit")] = {"i32": 1}
    launch["grid"][0] = gemv_blocks(_arg(launch, new, "n", change), cx["COLS_PER_WARP"], cx["WARPS"], 1)
    _index_config(launch, new, change)
    prune(m)  # the module the op left may have no launch now (kern-verify E0073)


def verify(m: dict, kernels_dir: str | Path | None, warnings: list[str] | None = None) -> list[str]:
    """kern-verify's errors on manifest dict `m` (with `kernels_dir`: params against the cubins too); its
    warnings are appended to `warnings` when given."""
    from kern_verify.verify import verify_text

    diags = verify_text(json.dumps(m), kernels_dir=kernels_dir)
    if warnings is not None:
        warnings.extend(str(d) for d in diags if d.severity != "error")
    return [str(d) for d in diags if d.severity == "error"]


def read_manifest(path: str | Path) -> dict:
    """A manifest file's JSON. Raises VariantError when it cannot be read or is not a JSON object with ops."""
    try:
        m = json.loads(Path(path).read_text())
    except OSError as e:
        raise VariantError(f"{path}: cannot read the manifest ({e.strerror or e})") from None
    except ValueError as e:
        raise VariantError(f"{path}: not JSON ({e})") from None
    if not isinstance(m, dict) or not isinstance(m.get("ops"), dict) or not isinstance(m.get("modules"), dict):
        raise VariantError(f"{path}: not a kern manifest (no `ops` / `modules` objects)")
    return m


def pin_module(m: dict, name: str, kernels_dir: str | Path, file_name: str, how: str = "") -> None:
    """Declares module `name` in manifest `m` (in place) as KDIR/file_name pinned by its sha256. file_name is a bare
    file name in the kernels dir (module sources resolve against it); `how` says how to build it when it is missing.
    Raises VariantError naming the problem."""
    if Path(file_name).name != file_name:
        raise VariantError(f"`{file_name}`: give the cubin's file name in the kernels dir {kernels_dir}, not a path")
    path = Path(kernels_dir) / file_name
    if not path.is_file():
        raise VariantError(f"{path}: not found" + (f"; {how}" if how else ""))
    m["modules"][name] = {"source": file_name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def prune(m: dict) -> None:
    """Drops (in place) the ops no program calls and the modules no launch uses: the verifier refuses both (E0074,
    E0073), and a rewrite that replaces ops leaves them behind."""
    used = {c["op"] for p in m.get("programs", {}).values() for c in p.get("calls", [])}
    for op in [op for op in m["ops"] if op not in used]:
        del m["ops"][op]
    mods = {ln.get("module") for o in m["ops"].values() for ln in o["impl"]["launches"]}
    for mod in [mod for mod in m["modules"] if mod not in mods]:
        del m["modules"][mod]


def known_launch(m: dict, op: str, known: tuple[str, ...]) -> dict:
    """The first launch of op `op` of manifest `m`, whose entry must be one of `known` (tools/gpu's rewrites of a
    generated decode program), or a form of one with the same params that `twin_entry` maps onto it: the
    batched-prologue form `NAME_nb2` (the same grid and bits) or gemv_tc.cu's tensor-core entry (`kern_gemvtc_*`: the
    same grid at ksplit 1, other bits); then a copy of the launch on that entry, whose twins the experiment builds
    are (see `plain_twin`). Raises VariantError naming the op: the manifest has none, or it launches another entry."""
    if op not in m["ops"]:
        raise VariantError(f"the manifest has no op `{op}` (a Qwen3 decode program from tools/gen_qwen3.py, "
                           "not yet rewritten, is expected)" + lm_head_note(m, op))
    ln = m["ops"][op]["impl"]["launches"][0]
    if twin_entry(str(ln.get("entry"))) not in known:
        raise VariantError(f"op `{op}` launches `{ln.get('entry')}`; this rewrite knows {', '.join(known)}"
                           + NB2_NOTE * any("_norm" in e for e in known)
                           + TC_NOTE * any(e.startswith("kern_gemv_") for e in known))
    return plain_twin(op, ln)


def twin_entry(entry: str) -> str:
    """gemv.cu's plain entry that an experiment build's twin of `entry` copies: `NAME` for its batched-prologue form
    `NAME_nb2` (gemv_plan.gemv_plain_entry) and for gemv_tc.cu's `kern_gemvtc*` form of NAME; `entry` otherwise."""
    if entry.startswith(GEMV_TC_PREFIX):
        entry = "kern_gemv" + entry[len(GEMV_TC_PREFIX):]
    return gemv_plain_entry(entry)


def plain_twin(op: str, ln: dict) -> dict:
    """Launch `ln` of op `op` itself, or, where it launches another form of a plain gemv.cu entry NAME (`twin_entry`),
    a copy on NAME with a note (once per op and entry) on what to time the rewrite against: for a batched-prologue
    entry `NAME_nb2` the variant `OP.entry=NAME` (the loop prologue, the same bits); for a tensor-core entry
    (gemv_tc.cu, whose launches take ksplit 1 and gemv.cu's ksplit-1 grid) the copy is on gemv.cu's module (`gemv`)
    with the same grid and args, a valid gemv.cu launch at ksplit 1, and the fair control is a manifest of
    `tools/gen_qwen3.py --gemv gemv-fma` (gemv.cu for every op) with the variant `OP.ksplit=1` (its o_proj is at
    ksplit 2 there)."""
    entry = str(ln.get("entry"))
    plain = twin_entry(entry)
    if plain == entry:
        return ln
    tc = entry.startswith(GEMV_TC_PREFIX)
    if (op, plain) not in _NOTED:
        _NOTED.add((op, plain))
        if tc:
            print(f"note: op `{op}` launches `{entry}` (gemv_tc.cu, the tensor cores); the rewrite's twin is gemv.cu's "
                  f"`{plain}` at ksplit 1 (other bits): time it against a manifest of `tools/gen_qwen3.py --gemv "
                  f"gemv-fma` with the variant `{op}.ksplit=1` (tools/manifest_variants.py: gemv.cu's form of the op as "
                  "the twin launches it), not against the manifest as it is", file=sys.stderr)
        else:
            print(f"note: op `{op}` launches `{entry}`; the rewrite's twin is `{plain}`'s, with the loop norm "
                  f"prologue (the same bits, slower on this k): time it against the variant `{op}.entry={plain}` "
                  "(tools/manifest_variants.py), not against the manifest as it is", file=sys.stderr)
    return {**ln, "entry": plain, "module": "gemv"} if tc else {**ln, "entry": plain}


_NOTED: set[tuple[str, str]] = set()  # known_launch's notes already printed in this process
#: Added to a refusal that lists known norm entries: their batched-prologue forms are known too.
NB2_NOTE = " (or their `_nb2` forms)"
#: Added to a refusal of known_launch that lists gemv.cu entries: gemv_tc.cu's forms of them are known too.
TC_NOTE = " (or gemv_tc.cu's `kern_gemvtc` forms of them)"


def merge_pairs(calls: list[dict], first: str, second: str, merge: Callable[[dict, dict], dict], missing: str,
                stray: str) -> list[dict]:
    """A program's call list with each call of op `first` and the call right after it, which must be of op `second`,
    replaced by the one call `merge(first_call, second_call)` returns (merge may raise VariantError naming what does
    not fit); every other call is kept as it is. Returns the new list (`calls` is not changed).

    Raises:
        VariantError: "call `LABEL`: " + `missing` for a `first` call not followed by a `second` call, and
            + `stray` for a `second` call not right after a `first` call (the first such call in program order).
    """
    out, i = [], 0
    while i < len(calls):
        c = calls[i]
        if c["op"] == first:
            d = calls[i + 1] if i + 1 < len(calls) else None
            if d is None or d["op"] != second:
                raise VariantError(f"call `{c['label']}`: {missing}")
            out.append(merge(c, d))
            i += 2
        elif c["op"] == second:
            raise VariantError(f"call `{c['label']}`: {stray}")
        else:
            out.append(c)
            i += 1
    return out


def rewrite_main(ap: argparse.ArgumentParser, manifest: Path, kernels: Path, out: Path, rewrite, what: str) -> int:
    """The command line of a manifest-rewriting tool (this one and tools/gpu's rewrites): refuse an `out` that is a
    directory or has no folder (ap.error: exit 2), read `manifest` (read_manifest), `rewrite(m)` (returns the new
    manifest dict; raises VariantError, or ValueError, naming the problem), verify the result against `kernels` and
    write it to `out`. Errors go to stderr as `PROG: error: ...` and return 1 (input refused, or the result does not
    verify); kern-verify's warnings are printed; `what` describes the rewrite in the last line. Returns 0 on success."""
    if out.is_dir() or not out.parent.is_dir():
        ap.error(f"--out {out}: " + ("is a directory" if out.is_dir() else f"no folder {out.parent}"))
    prog = ap.prog.removesuffix(".py")
    warnings: list[str] = []
    try:
        base = read_manifest(manifest)
        m = rewrite(base)
        errors = verify(m, kernels, warnings)
    except (VariantError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    for w in warnings:
        print(f"{prog}: {w}", file=sys.stderr)
    if errors:
        print(f"{prog}: error: the result does not verify:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    if m == base:
        print(f"{prog}: note: {what} changes nothing in {manifest}", file=sys.stderr)
    out.write_text(json.dumps(m, indent=1))
    print(f"wrote {out}: {manifest.name} with {what}")
    return 0


def rewrite_parser(description: str, kernels_help: str) -> argparse.ArgumentParser:
    """The arguments every manifest-rewriting tool takes: MANIFEST, --kernels KDIR (described by kernels_help),
    --out OUT.json."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("manifest", type=Path)
    ap.add_argument("--kernels", required=True, type=Path, help=kernels_help)
    ap.add_argument("--out", required=True, type=Path, help="the manifest to write (its folder must exist)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the kernels dir the manifest was generated for")
    ap.add_argument("--variant", required=True, action="append",
                    help="CHANGE[+CHANGE...], each OP.OPTION=VALUE (one variant: join changes with +)")
    a = ap.parse_args(argv)
    if len(a.variant) > 1:
        ap.error("one --variant per call; join changes with + (e.g. o.ksplit=2+attn.pdl=0)")
    return rewrite_main(ap, a.manifest, a.kernels, a.out, lambda m: apply(m, a.variant[0], load_index(a.kernels)),
                        f"`{a.variant[0]}`")


if __name__ == "__main__":
    sys.exit(main())
