#!/usr/bin/env python3
"""What-if manifests for timing: a program with every call of some ops removed, or a module loaded from a what-if
build (with the grid that build needs), so that the whole program's time says what those ops (or that work) cost in
it: an upper bound for any faster or fused form of them.

    python3 tools/manifest_whatif.py MANIFEST --kernels KDIR [--drop OP ...] [--module NAME=FILE ...]
        [--op-module OP=FILE ...] [--op-grid OP=GX[,GY,GZ] ...] [--program decode] --out OUT.json

The result computes wrong values (whatever the dropped calls wrote is stale, a what-if build skips work): time it,
never use its tokens (a build checked bit-identical, such as -DGEMV_PASSES below with its grid, is the exception).
A launch that stays keeps its entry and so its configuration (`pdl`, shared memory, `carveout`): only what an option
names changes (its module, or its grid).

--drop OP
    OP is a short name of tools/manifest_variants.py for the decode program's ops (`attn`, `qkv`, `o`, `gate_up`,
    `down`, `lm_head`: the screened lm_head's one op in the default manifests, the dense GEMV `gemv_norm_lm_head` in a
    `gen_qwen3.py --lm-head dense` one; `argmax`: a dense manifest's) or any op name of the manifest; every call of it
    in `--program` (default `decode`) is removed, and the ops and modules no call uses any more with them. A
    `workspace` buffer the program then reads before writing it (the dropped op's output) becomes a `carry`
    (kern-verify's E0060 otherwise): it keeps whatever was last written there, in memory of its own outside the
    runtime's workspace plan.
    What can be dropped depends on the weights: kern-driver binds a checkpoint's tensors to the manifest's weight
    buffers exactly, so a drop that leaves a weight used by no call of any program is refused (the weights file
    would not load). In the Qwen3 examples prefill ends at the last layer's KV write (the last token's logits come
    from the first decode step), so the last layer's o, gate_up, down and the lm_head weights are decode's alone:
    from decode, `attn`, `qkv` and `embedding` can be dropped; bound the others with --module.

--module NAME=FILE
    Module NAME loaded from FILE in the --kernels dir instead (pinned by its sha256): a what-if build of the same
    source with the same entries and params, e.g. gemv.cu built with -DGEMV_NO_WAIT (its kernels do not wait for
    their predecessors; NOTES.md 47), which serves the decode GEMV ops on module `gemv`: qkv, gate_up and (0.6B) down
    (and the lm_head of a `--lm-head dense` manifest: the default's screened lm_head is lm_head_screen.cu); 4B's qkv is
    on `gemv_p2` since session 18 (add --module gemv_p2=FILE, a build with -DGEMV_NO_WAIT -DGEMV_PASSES=2, for it
    too), and o (and 4B's down) on `gemv_tc` since session 30 (add --module gemv_tc=FILE, gemv_tc.cu built with
    -DGEMV_NO_WAIT; on a `tools/gen_qwen3.py --gemv gemv-fma` manifest they are on `gemv`):

        cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_NO_WAIT -o KDIR/gemv_nowait.cubin gemv.cu
        python3 tools/manifest_whatif.py MANIFEST --kernels KDIR --module gemv=gemv_nowait.cubin --out OUT.json

    (the flags are tools/build_kernels.py's NVCC_FLAGS). kern-verify then warns E0088 for each `pdl` launch of the
    build (its code no longer waits): expected here. A build for another architecture than the module's is refused.

--op-module OP=FILE
    The same for one op: OP's launches load a new module `MODULE__OP` from FILE, the other ops of the module keep
    theirs. OP is named as for --drop (resolved in --program); the op changes in every program that calls it (the
    tool says which). This splits a whole-module bound by op, e.g. which GEMVs' waits the 0.19 ms of NOTES.md 47 are:

        python3 tools/manifest_whatif.py MANIFEST --kernels KDIR --op-module down=gemv_nowait.cubin --out OUT.json

    The module copy is not free when the op shares its function with another op: in the 4B manifests o and down
    both launch gemv_tc's kern_gemvtc_residual_m1 (gemv's kern_gemv_residual_m1 with `--gemv gemv-fma`), and the default gemv.cubin itself given to one of them this way costs
    the 4B program +0.009 ms/token (nothing for gate_up, whose function is its own; NOTES.md 62): read such a
    variant against a copy of the default module given to the same op, not against the manifest alone.

    The launch keeps its grid: 4B's qkv (on gemv_p2, 192 blocks of 32 rows) on a build of the default form would
    cover half its rows; give it --op-grid qkv=384 too, or build the what-if with -DGEMV_PASSES=2.
    Refused: an op whose launches use no module (a built-in) or two (the screened lm_head: lm_head_screen and
    argmax_pdl), an op given twice or also dropped.

--op-grid OP=GX[,GY,GZ]
    OP's one launch gets the literal grid [GX, GY, GZ] (GY, GZ default to 1), OP named as for --drop; the op changes
    in every program that calls it (the tool says which). For a what-if build whose blocks do other work than the
    module's, e.g. gemv.cu built with -DGEMV_PASSES=2 (each block owns 2 units of 16 rows, ksplit 1, grid.x =
    ceil_div(n, 32); NOTES.md 54): the dense 4B lm_head (n = 151,936) on it, with 4,748 blocks where the default
    module has 9,496 (session 18 measured the qkv this way, 384 → 192 blocks, before the generator put 4B's qkv on it).
    tools/build_kernels.py builds it as gemv_p2.cubin, so a kernels dir it wrote already holds the file. The dense
    lm_head is a `gen_qwen3.py --lm-head dense` manifest's (tools/gpu/prepare.py writes one as manifest-dense.json):
    in the default manifests `lm_head` is the screened op, of three launches, which --op-grid refuses.

        python3 tools/manifest_whatif.py DENSE_MANIFEST --kernels KDIR --out OUT.json \\
            --op-module lm_head=gemv_p2.cubin --op-grid lm_head=4748

    The grid is taken as given: kern-verify checks it against CUDA's limits (and a cluster kernel's cluster shape),
    not against what the kernel covers with it. Refused: an op with other than one launch, a launch with no grid (a
    built-in), a malformed value or a number that is not positive, an op given twice or also dropped.

Timing on the GPU (tools/gpu/program_sweep.py, one runtime per process): make the what-if from the layout
tools/gpu/prepare.py writes, so that its weights and kernels are the ones timed:

    python3 tools/gpu/prepare.py --work W --geometry 4b
    python3 tools/manifest_whatif.py W/qwen3-4b/manifest.json --kernels W/kernels --drop attn --out W/noattn.json
    python3 tools/gpu/program_sweep.py --work W --geometry 4b --manifest-variant noattn=W/noattn.json

(a --module file must be in W/kernels). program_sweep reports the what-if's tokens as differing. NOTES.md 45 and 47
are the first uses: the 4B decode program with no attention (2.339–2.358 ms/token against 2.467–2.482) and with GEMVs
that do not wait (2.288; both 2.075).

Refused, by name, before anything is written: a manifest kern-verify refuses (its first errors), an --out that is
the manifest itself, a --kernels that is not a directory, an op the program does not call (the programs that do are
named), a drop that leaves a weight unbound, a buffer read with no writer left, or an input or output no call uses
any more, a --module spec that is malformed, names no module, gives no file, names a cubin for another architecture,
or that the drop leaves unused, the same module given twice, an --op-module or --op-grid refused as said above, and
a result that does not verify.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manifest_variants import (SHORT, VariantError, lm_head_note, pin_module, prune, rewrite_main,  # noqa: E402
                               rewrite_parser, verify)

#: How to build a what-if module into the kernels dir (the refusal of a missing --module file says it).
BUILD_HINT = ("cd tools/kernels-src && nvcc -cubin -arch=sm_90 -O3 -std=c++17 -D<MACRO> -o {kdir}/{file} <source>.cu "
              "(tools/build_kernels.py's flags)")


def resolve_op(m: dict, name: str, program: str, option: str = "--drop") -> str:
    """The manifest op that `name` (a SHORT name or a full op name) stands for in `program`. Raises VariantError
    naming the programs that do call it, or the short names, when `program` does not (the message starts with
    `option NAME`)."""
    calls = {c.get("op") for c in m["programs"][program]["calls"]}
    for op in SHORT.get(name, (name,)):
        if op in calls:
            return op
    elsewhere = [p for p, v in m["programs"].items() if p != program and name in {c.get("op") for c in v["calls"]}]
    if elsewhere:
        raise VariantError(f"{option} {name}: program `{program}` does not call it; {', '.join(elsewhere)} does "
                           f"(add --program {elsewhere[0]})")
    raise VariantError(f"{option} {name}: program `{program}` calls no op of that name (its ops: "
                       f"{', '.join(sorted(calls))}; short names for decode: {', '.join(SHORT)})"
                       + lm_head_note(m, name))


def _accesses(m: dict, call: dict) -> list[tuple[object, str]]:
    """(param type, buffer name) of each buffer argument of `call`, from its op's params."""
    from kern_schema.params import parse_param_type

    params = [parse_param_type(t) for t in m["ops"][call["op"]]["params"]]
    return [(p, a["buf"]) for p, a in zip(params, call["args"]) if isinstance(a, dict) and "buf" in a]


def _writes(m: dict, calls: list[dict]) -> set[str]:
    """The buffers `calls` write."""
    return {b for c in calls for p, b in _accesses(m, c) if p.writes}


def _reads_before_writes(m: dict, calls: list[dict]) -> list[str]:
    """The workspace buffers that `calls` (in order) read before any of them writes: kern-verify's E0060 rule
    (kern_verify.dataflow), restated over the ops' param directions; the result is verified, so a drift between the
    two shows as a refusal, never as a wrong manifest."""
    written: set[str] = set()
    found: list[str] = []
    for c in calls:
        acc = _accesses(m, c)
        for p, b in acc:
            if p.reads and b not in written and m["buffers"][b]["class"] == "workspace" and b not in found:
                found.append(b)
        written.update(b for p, b in acc if p.writes)
    return found


def drop_ops(m: dict, names: list[str], program: str = "decode") -> tuple[dict, list[str]]:
    """Manifest `m` (not modified, already verified) without `program`'s calls of the ops `names` stand for, and
    the workspace buffers made `carry` because the program now reads them first. Raises VariantError naming the
    problem."""
    check_program(m, program)
    if not names:
        raise VariantError("nothing to drop: give --drop OP at least once")
    ops = list(dict.fromkeys(resolve_op(m, n, program) for n in names))
    what = f"--drop {' '.join(dict.fromkeys(names))}"
    out = copy.deepcopy(m)
    calls = out["programs"][program]["calls"]
    dropped = [c for c in calls if c["op"] in ops]
    out["programs"][program]["calls"] = [c for c in calls if c["op"] not in ops]
    used = {a["buf"] for p in out["programs"].values() for c in p["calls"] for a in c["args"]
            if isinstance(a, dict) and "buf" in a}
    lost = list(dict.fromkeys(a["buf"] for c in dropped for a in c["args"] if isinstance(a, dict) and "buf" in a
                              and a["buf"] not in used))
    orphans = [b for b in lost if out["buffers"][b]["class"] == "weight"]
    if orphans:
        raise VariantError(
            f"{what}: leaves {len(orphans)} weight buffer(s) that only the dropped calls read (first: `{orphans[0]}`); "
            "kern-driver binds the checkpoint's tensors to weight buffers exactly, so the same weights file would not "
            "load. Drop an op whose weights another program reads too, or bound this op's work with --module and a "
            "what-if build of its kernel")
    io = [b for b in lost if out["buffers"][b]["class"] in ("input", "output")]
    if io:
        cls = out["buffers"][io[0]]["class"]
        raise VariantError(f"{what}: {cls} buffer `{io[0]}` would be used by no call (the dropped op was its only "
                           f"user): a program must still {'read its inputs' if cls == 'input' else 'produce its outputs'}")
    carried = _reads_before_writes(out, out["programs"][program]["calls"])
    written = {b for p in out["programs"].values() for b in _writes(out, p["calls"])}
    unwritten = [b for b in carried if b not in written]
    if unwritten:
        raise VariantError(f"{what}: `{program}` would read buffer `{unwritten[0]}` that no call of any program "
                           "writes any more (the dropped op was its only writer): nothing could fill it")
    for b in carried:
        out["buffers"][b]["class"] = "carry"
    prune(out)
    return out, carried


def check_program(m: dict, program: str) -> None:
    """Raises VariantError when manifest `m` has no program `program`."""
    if program not in m.get("programs", {}):
        raise VariantError(f"--program {program}: the manifest has no such program ({', '.join(m.get('programs', {}))})")


def repoint_modules(m: dict, specs: list[str], kernels: Path) -> dict:
    """Manifest `m` (not modified) with each `NAME=FILE` module loaded from KDIR/FILE, which must be a cubin for the
    module's architecture. Raises VariantError naming the spec at fault."""
    out = copy.deepcopy(m)
    seen: set[str] = set()
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise VariantError(f"--module {spec}: expected NAME=FILE (a module of the manifest, a cubin in {kernels})")
        if name not in out["modules"]:
            raise VariantError(f"--module {spec}: the manifest has no module `{name}` ({', '.join(out['modules'])})")
        if name in seen:
            raise VariantError(f"--module {spec}: module `{name}` is given twice")
        seen.add(name)
        _pin_build(out, name, name, file, kernels, f"--module {spec}")
    return out


def _pin_build(m: dict, module: str, new: str, file: str, kernels: Path, what: str) -> None:
    """Declares module `new` in `m` (in place) as KDIR/file, a what-if build of module `module`: refused (VariantError
    starting with `what`) when the file is missing or not a cubin, or built for another architecture than `module`'s
    cubin."""
    from kern_verify.cubin import CubinError, read_cubin

    old = Path(kernels) / m["modules"][module]["source"]
    pin_module(m, new, kernels, file, how="build it there, e.g. " + BUILD_HINT.format(kdir=kernels, file=file))
    try:
        new_arch = read_cubin((Path(kernels) / file).read_bytes(), file).arch
        old_arch = read_cubin(old.read_bytes(), old.name).arch if old.is_file() else None
    except (CubinError, OSError) as e:
        raise VariantError(f"{what}: {e}") from None
    if old_arch is not None and new_arch != old_arch:
        raise VariantError(f"{what}: {file} is built for sm_{new_arch}, module `{module}` for sm_{old_arch} "
                           f"(rebuild it with -arch=sm_{old_arch})")


def _op_specs(m: dict, specs: list[str], program: str, flag: str, form: str, parse=lambda spec, value: value):
    """Each `OP=VALUE` of `specs` (--op-module's and --op-grid's form): yields (spec, op, parse(spec, VALUE)), OP
    resolved in `program` as --drop's names are (resolve_op). Raises VariantError naming the spec: malformed
    (`flag SPEC: expected FORM`), whatever `parse` or resolve_op raise, an op given twice."""
    seen: set[str] = set()
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name or not value:
            raise VariantError(f"{flag} {spec}: expected {form}")
        parsed = parse(spec, value)
        op = resolve_op(m, name, program, flag)
        if op in seen:
            raise VariantError(f"{flag} {spec}: op `{op}` is given twice")
        seen.add(op)
        yield spec, op, parsed


def _also_in(m: dict, op: str, program: str) -> str:
    """A note's tail naming the programs other than `program` that call `op` (they change too), or ""."""
    others = [p for p, v in m["programs"].items() if p != program and op in {c["op"] for c in v["calls"]}]
    return f"; it changes in {', '.join(others)} too" if others else ""


def repoint_op_modules(m: dict, specs: list[str], kernels: Path, program: str = "decode") -> tuple[dict, list[str]]:
    """Manifest `m` (not modified) with the launches of each `OP=FILE`'s op loaded from KDIR/FILE instead of their
    module: a new module `MODULE__OP` (pinned by its sha256) for that op alone, so that one op of a shared module (the
    five decode GEMVs share `gemv`) runs a what-if build while the others keep theirs. OP is resolved in `program` as
    --drop's names are; the op changes in every program that calls it. Returns the manifest and one note per spec
    naming the op, its new module and the other programs it changes in. Raises VariantError naming the spec at fault:
    malformed, an op the program does not call, an op whose launches use no module (a built-in) or several, an op given
    twice, a FILE that is missing or for another architecture."""
    out = copy.deepcopy(m)
    notes: list[str] = []
    for spec, op, file in _op_specs(out, specs, program, "--op-module",
                                    f"OP=FILE (an op of `{program}`, a cubin in {kernels})"):
        launches = out["ops"][op]["impl"]["launches"]
        mods = list(dict.fromkeys(ln["module"] for ln in launches if ln.get("module")))
        if len(mods) != 1:
            raise VariantError(f"--op-module {spec}: op `{op}`'s launches use " + (
                f"modules {', '.join(mods)}; one cubin can stand for one module (build a what-if of each and use "
                f"--module)" if mods else "no module (a built-in such as cuBLASLt): there is no cubin to replace")
                + lm_head_note(out, op))
        new = f"{mods[0]}__{op}"
        if new in out["modules"]:
            raise VariantError(f"--op-module {spec}: the manifest already has a module `{new}`")
        _pin_build(out, mods[0], new, file, kernels, f"--op-module {spec}")
        for ln in launches:
            if ln.get("module") == mods[0]:
                ln["module"] = new
        notes.append(f"op `{op}` now loads module `{new}` ({file})" + _also_in(out, op, program))
    prune(out)
    return out, notes


def parse_grid(spec: str, value: str) -> list[int]:
    """The grid `GX[,GY,GZ]` of --op-grid `spec` as [x, y, z] (missing axes 1). Raises VariantError when it is not
    one to three comma-separated integers, or one of them is not positive."""
    parts = value.split(",")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"[+-]?[0-9]+", p) for p in parts):
        raise VariantError(f"--op-grid {spec}: expected OP=GX[,GY,GZ] (one to three integers, e.g. qkv=192)")
    grid = [int(p) for p in parts] + [1] * (3 - len(parts))
    bad = [f"{'xyz'[i]} {g}" for i, g in enumerate(grid) if g <= 0]
    if bad:
        raise VariantError(f"--op-grid {spec}: grid {', '.join(bad)}: every grid axis must be a positive integer")
    return grid


def set_op_grids(m: dict, specs: list[str], program: str = "decode") -> tuple[dict, list[str]]:
    """Manifest `m` (not modified) with the grid of each `OP=GX[,GY,GZ]`'s op set to the literal [GX, GY, GZ] (GY, GZ
    default to 1): for a what-if build whose blocks cover other work than the module's (gemv.cu -DGEMV_PASSES=P:
    grid.x = ceil_div(n, 16·P)). OP is resolved in `program` as --drop's names are; the op changes in every program
    that calls it. Returns the manifest and one note per spec naming the op, its old and new grid and the other
    programs it changes in. Raises VariantError naming the spec at fault: malformed, a grid axis that is not
    positive, an op the program does not call, an op with other than one launch or whose launch has no grid (a
    built-in), an op given twice."""
    out = copy.deepcopy(m)
    notes: list[str] = []
    for spec, op, grid in _op_specs(out, specs, program, "--op-grid",
                                    f"OP=GX[,GY,GZ] (an op of `{program}`, e.g. qkv=192)", parse_grid):
        launches = out["ops"][op]["impl"]["launches"]
        if len(launches) != 1:
            raise VariantError(f"--op-grid {spec}: op `{op}` has {len(launches)} launches; --op-grid sets the grid of "
                               "an op's one launch" + lm_head_note(out, op))
        if "grid" not in launches[0]:
            raise VariantError(f"--op-grid {spec}: op `{op}`'s launch has no grid (a built-in such as cuBLASLt)")
        old = launches[0]["grid"]
        launches[0]["grid"] = grid
        notes.append(f"op `{op}` now launches grid {json.dumps(grid)} (was {json.dumps(old)})"
                     + _also_in(out, op, program))
    return out, notes


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__, "the manifest's kernels dir (to verify the result; --module files are read there)")
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.allow_abbrev = False
    ap.add_argument("--drop", action="append", default=[], metavar="OP", help="an op to remove (repeatable)")
    ap.add_argument("--module", action="append", default=[], metavar="NAME=FILE",
                    help="load module NAME from FILE in the --kernels dir, a build with the same ABI (repeatable)")
    ap.add_argument("--op-module", action="append", default=[], metavar="OP=FILE",
                    help="load op OP's launches from FILE in the --kernels dir (a new module for that op alone; "
                         "repeatable)")
    ap.add_argument("--op-grid", action="append", default=[], metavar="OP=GX[,GY,GZ]",
                    help="launch op OP's one launch with grid [GX, GY, GZ] (GY, GZ default to 1; repeatable)")
    ap.add_argument("--program", default="decode",
                    help="the program to remove calls from and to resolve OP names in (default: decode)")
    a = ap.parse_args(argv)
    if not a.drop and not a.module and not a.op_module and not a.op_grid:
        ap.error("nothing to change: give --drop OP, --module NAME=FILE, --op-module OP=FILE or --op-grid OP=GX")
    if not a.kernels.is_dir():
        ap.error(f"--kernels {a.kernels}: not a directory (build one with tools/build_kernels.py --out {a.kernels})")
    if a.out.resolve() == a.manifest.resolve():
        ap.error(f"--out {a.out}: that is the manifest itself; write the what-if elsewhere")
    carried: list[str] = []
    notes: list[str] = []

    def rewrite(m: dict) -> dict:
        errors = verify(m, a.kernels)
        if errors:
            raise VariantError(f"{a.manifest}: kern-verify refuses the manifest itself (first: {errors[0]}); fix it, "
                               "or give the --kernels dir it was generated for")
        check_program(m, a.program)
        out = repoint_modules(m, a.module, a.kernels)
        if a.op_module:
            out, n = repoint_op_modules(out, a.op_module, a.kernels, a.program)
            notes.extend(n)
        if a.op_grid:
            out, n = set_op_grids(out, a.op_grid, a.program)
            notes.extend(n)
        if a.drop:
            dropped = {resolve_op(out, d, a.program) for d in a.drop}
            for option, specs in (("--op-module", a.op_module), ("--op-grid", a.op_grid)):
                for spec in specs:
                    op = resolve_op(out, spec.partition("=")[0], a.program, option)
                    if op in dropped:
                        raise VariantError(f"{option} {spec}: --drop removes every `{a.program}` call of `{op}`")
            out, c = drop_ops(out, a.drop, a.program)
            carried.extend(c)
        for spec in a.module:  # pruned after the drop or after --op-module moved every op of it: it changed nothing
            name = spec.partition("=")[0]
            if name not in out["modules"]:
                cause = "the drop with --op-module" if a.drop and a.op_module else "the drop" if a.drop else "--op-module"
                raise VariantError(f"--module {spec}: {cause} leaves module `{name}` used by no launch")
        return out

    drops = ", ".join(dict.fromkeys(a.drop))
    what = ", ".join([f"no `{a.program}` calls of {drops}"] * bool(a.drop) + [f"module {s}" for s in a.module]
                     + [f"op module {s}" for s in a.op_module] + [f"op grid {s}" for s in a.op_grid])
    rc = rewrite_main(ap, a.manifest, a.kernels, a.out, rewrite, f"{what} (timing only: its values are wrong)")
    if rc == 0:
        for n in notes:
            print(n)
        if carried:
            print(f"now carried (stale contents): {', '.join(carried)}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
