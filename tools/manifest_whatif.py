#!/usr/bin/env python3
"""What-if manifests for timing: one program with every call of some ops removed, so that the whole program's time
says what those ops cost in it — an upper bound for any faster or fused form of them.

    python3 tools/manifest_whatif.py MANIFEST --kernels KDIR [--drop OP ...] [--module NAME=FILE ...] [--program decode] --out OUT.json

The result computes wrong values (whatever the dropped calls wrote is stale): time it, never use its tokens.
tools/gpu/program_sweep.py times it beside the manifest (`--manifest-variant NAME=OUT.json`; it reports that the
tokens differ). NOTES.md 45 is the first use: the 4B decode program with no attention at all.

- OP: a short name of tools/manifest_variants.py (`attn`, `qkv`, `o`, `gate_up`, `down`, `lm_head`, `argmax`) or
  a full op name of the manifest; every call of it in `--program` (default `decode`) is removed.
- A `workspace` buffer that the program now reads before writing it (the dropped op's output) becomes a `carry`
  (kern-verify's E0060 otherwise): it keeps whatever was last written there. A carry has memory of its own, outside
  the workspace the runtime plans, so its address (not its size) may differ from the manifest's run.
- `--module NAME=FILE`: module NAME of the manifest loaded from KDIR/FILE instead (pinned by its sha256): a what-if
  build with the same entries and params, e.g. gemv.cu built with -DGEMV_NO_WAIT (its kernels do not wait for their
  predecessors; NOTES.md 47).
- Refused, by name: an op the program does not call, a program the manifest lacks, a drop that leaves weight
  buffers unused anywhere (kern-driver binds a checkpoint's tensors to weight buffers exactly, so the same
  weights file would no longer load; bound such an op another way, e.g. `--module` onto a build of its kernel that
  returns at once, where no other op shares its module), a drop that leaves a buffer read with no call of any
  program writing it, and a `--module` the drop leaves unused.

The result is checked by kern-verify against KDIR before it is written; its errors refuse the what-if.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manifest_variants import SHORT, VariantError, pin_module, prune, rewrite_main, rewrite_parser  # noqa: E402


def resolve_op(m: dict, name: str, program: str) -> str:
    """The manifest op that `name` (a SHORT name or a full op name) stands for in `program`. Raises VariantError."""
    calls = {c["op"] for c in m["programs"][program]["calls"]}
    for op in SHORT.get(name, (name,)):
        if op in calls:
            return op
    known = ", ".join(sorted(calls))
    raise VariantError(f"--drop {name}: program `{program}` calls no op of that name (it calls: {known})")


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
    """Manifest `m` (not modified) without `program`'s calls of the ops `names` stand for, and the workspace
    buffers made `carry` because the program now reads them first. Raises VariantError naming the problem."""
    check_program(m, program)
    if not names:
        raise VariantError("nothing to drop: give --drop OP at least once")
    ops = [resolve_op(m, n, program) for n in names]
    out = copy.deepcopy(m)
    calls = out["programs"][program]["calls"]
    dropped = [c for c in calls if c["op"] in ops]
    out["programs"][program]["calls"] = [c for c in calls if c["op"] not in ops]
    used = {a["buf"] for p in out["programs"].values() for c in p["calls"] for a in c["args"]
            if isinstance(a, dict) and "buf" in a}
    orphans = list(dict.fromkeys(a["buf"] for c in dropped for a in c["args"] if isinstance(a, dict) and "buf" in a
                                 and out["buffers"][a["buf"]]["class"] == "weight" and a["buf"] not in used))
    if orphans:
        raise VariantError(
            f"--drop {' '.join(names)}: leaves {len(orphans)} weight buffer(s) used by no call of any program "
            f"(first: `{orphans[0]}`); kern-driver binds the checkpoint's tensors to weight buffers exactly, so the "
            "same weights file would not load. Bound this op another way (e.g. --module onto a build of its kernel that "
            "returns at once, where no other op shares its module)")
    carried = _reads_before_writes(out, out["programs"][program]["calls"])
    written = {b for p in out["programs"].values() for b in _writes(out, p["calls"])}
    unwritten = [b for b in carried if b not in written]
    if unwritten:
        raise VariantError(f"--drop {' '.join(names)}: `{program}` would read buffer `{unwritten[0]}` that no call of "
                           "any program writes any more (the dropped op was its only writer): nothing could fill it")
    for b in carried:
        out["buffers"][b]["class"] = "carry"
    prune(out)
    return out, carried


def check_program(m: dict, program: str) -> None:
    """Raises VariantError when manifest `m` has no program `program`."""
    if program not in m.get("programs", {}):
        raise VariantError(f"--program {program}: the manifest has no such program ({', '.join(m.get('programs', {}))})")


def repoint_modules(m: dict, specs: list[str], kernels: Path) -> dict:
    """Manifest `m` (not modified) with each `NAME=FILE` module loaded from KDIR/FILE. Raises VariantError."""
    out = copy.deepcopy(m)
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise VariantError(f"--module {spec}: expected NAME=FILE (a module of the manifest, a cubin in {kernels})")
        if name not in out["modules"]:
            raise VariantError(f"--module {spec}: the manifest has no module `{name}` ({', '.join(out['modules'])})")
        pin_module(out, name, kernels, file)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = rewrite_parser(__doc__.split("\n\n")[0], "the manifest's kernels dir (to verify the result)")
    ap.add_argument("--drop", action="append", default=[], metavar="OP", help="an op to remove (repeatable)")
    ap.add_argument("--module", action="append", default=[], metavar="NAME=FILE",
                    help="load module NAME from KDIR/FILE, a build with the same ABI (repeatable)")
    ap.add_argument("--program", default="decode", help="the program to remove its calls from (default: decode)")
    a = ap.parse_args(argv)
    if not a.drop and not a.module:
        ap.error("nothing to change: give --drop OP or --module NAME=FILE")
    carried: list[str] = []

    def rewrite(m: dict) -> dict:
        check_program(m, a.program)
        out = repoint_modules(m, a.module, a.kernels)
        if a.drop:
            out, c = drop_ops(out, a.drop, a.program)
            carried.extend(c)
            for spec in a.module:
                name = spec.partition("=")[0]
                if name not in out["modules"]:
                    raise VariantError(f"--module {spec}: the drop leaves module `{name}` used by no launch")
        return out

    what = ", ".join([f"no `{a.program}` calls of {', '.join(a.drop)}"] * bool(a.drop) + [f"module {s}" for s in a.module])
    rc = rewrite_main(ap, a.manifest, a.kernels, a.out, rewrite, f"{what} (timing only: its values are wrong)")
    if rc == 0 and carried:
        print(f"now carried (stale contents): {', '.join(carried)}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
