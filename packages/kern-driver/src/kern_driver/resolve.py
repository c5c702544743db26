"""Entry resolution and argument resolution. Pure Python, no GPU.

Two steps of `Runtime.load` live here so that CI can test them against a fake
module table:

1. `resolve_entries`: each kernel launch of each op → the module and function
   it runs, with the cubin's parameter layout checked against the launch's
   declared `params` (count, every offset and size; DESIGN §4). A launch that
   names a module is resolved in that module only; a launch without a module
   is resolved among every module exporting its entry symbol, keeping the
   one(s) whose layout matches the declaration: none or several is an error.
2. `resolve_program`: each call of a program, through its op's impl, becomes a
   flat list of `Step`s whose arguments are already pointers (arena base +
   region offset + byte offset), constants, or expressions of vars (the only
   things left to evaluate at run time).
"""

from __future__ import annotations

import keyword
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kern_schema import LITERAL_KEYS, Arg, Expr, Manifest, ParamType, parse_param_type, to_text, variables
from kern_verify import EXTERNS as _VERIFY_EXTERNS
from kern_verify.cubin import ParamSlot, compare_layout, params_from_manifest

from .errors import KernDriverError
from .plan import Layout, plain_int

#: The runtime's built-ins and their fixed signatures (DESIGN §2), shared with the verifier.
EXTERNS: dict[str, list[str]] = {name: list(e.params) for name, e in _VERIFY_EXTERNS.items()}


class ModuleTable(Protocol):
    """What entry resolution needs to know about the loaded modules.

    `function(module, entry)` returns an opaque function handle, or None when the
    module does not export `entry`; `param_layout(module, entry)` returns the
    function's parameter slots (the driver's `cuFuncGetParamInfo`, or a cubin's
    `.nv.info` table, or a test's fake); `cluster(module, entry)` (optional: a table without it
    resolves every entry without a cluster) the thread-block cluster [x, y, z] the function is
    compiled for (`__cluster_dims__`), or None.
    """

    def modules(self) -> Iterable[str]: ...
    def function(self, module: str, entry: str) -> Any | None: ...
    def param_layout(self, module: str, entry: str) -> list[ParamSlot]: ...
    def cluster(self, module: str, entry: str) -> tuple[int, int, int] | None: ...


@dataclass
class FakeModuleTable:
    """A `ModuleTable` from a dict: `{module: {entry: [ParamSlot...]}}` (tests, dry runs), and
    optionally `clusters`: `{(module, entry): (x, y, z)}` for entries compiled for a cluster.

    `from_cubins` builds one from cubin files with kern-verify's ELF reader (parameter tables
    and `EIATTR_CTA_PER_CLUSTER`), so a manifest's resolution can be checked on a machine
    without a GPU.
    """

    layouts: dict[str, dict[str, list[ParamSlot]]] = field(default_factory=dict)
    clusters: dict[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)

    def modules(self) -> Iterable[str]:
        return self.layouts.keys()

    def cluster(self, module: str, entry: str) -> tuple[int, int, int] | None:
        return self.clusters.get((module, entry))

    def function(self, module: str, entry: str) -> Any | None:
        return (module, entry) if entry in self.layouts.get(module, {}) else None

    def param_layout(self, module: str, entry: str) -> list[ParamSlot]:
        return self.layouts[module][entry]

    @classmethod
    def from_cubins(cls, cubins: dict[str, bytes]) -> "FakeModuleTable":
        """`{module name: cubin bytes}` → table of every entry's ELF parameter table and compiled cluster."""
        from kern_verify.cubin import read_cubin

        parsed = {m: read_cubin(b, m).entries for m, b in cubins.items()}
        return cls({m: {e: k.params for e, k in es.items()} for m, es in parsed.items()},
                   {(m, e): k.cluster for m, es in parsed.items() for e, k in es.items() if k.cluster is not None})


@dataclass(frozen=True, slots=True)
class ResolvedEntry:
    """A launch's function: `module`, `entry`, the opaque `handle`, the checked `layout`,
    `param_bytes` (end of the last parameter: the exact size a packed parameter buffer must
    have, without tail padding) and `cluster`, the thread-block cluster [x, y, z] it is
    compiled for (its launches' grids must be multiples of it), or None."""

    module: str
    entry: str
    handle: Any
    layout: tuple[ParamSlot, ...]
    param_bytes: int
    cluster: tuple[int, int, int] | None = None


def _layout_text(slots: Iterable[ParamSlot]) -> str:
    return "[" + ", ".join(f"{s.offset}:{s.size}" for s in slots) + "]"


def resolve_entries(manifest: Manifest, table: ModuleTable) -> dict[tuple[str, int], ResolvedEntry]:
    """Resolve every kernel launch of every op (see the module docstring).

    Returns `{(op name, launch index): ResolvedEntry}` (externs are not in it).

    Raises:
        KernDriverError: listing every launch that cannot be resolved: entry absent from
            its module (or from every module), declared params that do not match the
            kernel's layout (each difference named), several matching modules.
    """
    out: dict[tuple[str, int], ResolvedEntry] = {}
    problems: list[str] = []
    all_modules = list(table.modules())
    cluster = getattr(table, "cluster", None)  # optional for tables written before clusters
    for op_name, op in manifest.ops.items():
        for i, launch in enumerate(op.impl.launches):
            if launch.extern is not None:
                continue
            where = f"ops.{op_name}.impl.launches[{i}] (entry `{launch.entry}`)"
            try:
                declared = params_from_manifest(list(launch.params or []))
            except ValueError as e:
                problems.append(f"{where}: {e}")
                continue
            candidates = [launch.module] if launch.module is not None else all_modules
            exporting = [m for m in candidates if table.function(m, launch.entry) is not None]
            if not exporting:
                others = [m for m in all_modules if m not in candidates and table.function(m, launch.entry) is not None]
                msg = f"{where}: entry not found in module `{launch.module}`" if launch.module else f"{where}: no module exports this entry"
                if others:
                    msg += f" (it is exported by: {', '.join(others)})"
                problems.append(msg)
                continue
            matching = []
            mismatches = []
            for m in exporting:
                actual = list(table.param_layout(m, launch.entry))
                diff = compare_layout(declared, actual)
                if diff:
                    mismatches.append(
                        f"module `{m}`: " + "; ".join(diff)
                        + f" (declared {_layout_text(declared)}, kernel {_layout_text(actual)} as offset:size)"
                    )
                else:
                    matching.append((m, actual))
            if not matching:
                hint = ""
                if launch.module is not None:
                    alt = [m for m in all_modules if m != launch.module and table.function(m, launch.entry) is not None
                           and not compare_layout(declared, list(table.param_layout(m, launch.entry)))]
                    if alt:
                        hint = f" (module(s) {', '.join(alt)} export `{launch.entry}` with the declared layout: is `module` wrong?)"
                problems.append(f"{where}: declared params do not match the kernel: " + " | ".join(mismatches) + hint)
                continue
            if len(matching) > 1:
                problems.append(
                    f"{where}: ambiguous: modules {', '.join(m for m, _ in matching)} all export this entry with the "
                    "declared layout; name the module in the launch (`\"module\": ...`)"
                )
                continue
            m, actual = matching[0]
            nbytes = max((s.offset + s.size for s in actual), default=0)
            out[(op_name, i)] = ResolvedEntry(m, launch.entry, table.function(m, launch.entry), tuple(actual), nbytes,
                                              cluster(m, launch.entry) if cluster is not None else None)
    if problems:
        raise KernDriverError(
            f"{len(problems)} launch(es) cannot be resolved against the loaded modules:\n    " + "\n    ".join(problems),
            hint="a launch's `params` must be the kernel's real parameter list (Triton kernels: plus two trailing 8-byte "
            "scratch pointers); `kern-verify --kernels DIR` reports the same without a GPU",
        )
    return out


# --- argument resolution -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ptr:
    """A device address known at load (arena base + region offset + byte offset)."""

    addr: int


@dataclass(frozen=True, slots=True)
class Const:
    """A scalar known at load (a literal, or an expression with no var)."""

    value: int | float


@dataclass(frozen=True, slots=True)
class Dyn:
    """A scalar that depends on var values: evaluated at each run whose vars changed."""

    expr: Expr


ResolvedArg = Ptr | Const | Dyn


@dataclass(slots=True)
class Step:
    """One launch of a program, flattened.

    Attributes:
        program, call_index, call_label, op, launch_index: where it comes from.
        extern: the built-in name, or None for a kernel launch.
        entry: the resolved function (kernel launches), else None.
        types: the parameter types (the launch's `params`, or the built-in's signature).
        args: one `ResolvedArg` per parameter.
        grid: 3 expressions (kernel launches), block, shared_mem.
        pdl: programmatic dependent launch (the launch's `"pdl": true`): launched with
            `cuLaunchKernelEx` and `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`.
        carveout: the launch's preferred shared-memory carveout, percent 0..100 of the device's
            maximum shared memory per SM (its `"carveout"`), or None (the CUDA driver's choice):
            launched with `cuLaunchKernelEx` and `CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`.
    """

    program: str
    call_index: int
    call_label: str
    op: str
    launch_index: int
    extern: str | None
    entry: ResolvedEntry | None
    types: list[ParamType]
    args: list[ResolvedArg]
    grid: list[Expr] = field(default_factory=list)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_mem: int = 0
    pdl: bool = False
    carveout: int | None = None

    @property
    def ex(self) -> bool:
        """True for a kernel launch that goes through `cuLaunchKernelEx`: it has a launch
        attribute (`pdl`, `carveout`)."""
        return self.extern is None and (self.pdl or self.carveout is not None)

    def attributes_text(self) -> str:
        """The launch attributes in words, e.g. "programmatic dependent launch, carveout 0" ("" without any)."""
        parts = ["programmatic dependent launch"] if self.pdl else []
        if self.carveout is not None:
            parts.append(f"carveout {self.carveout}")
        return ", ".join(parts)

    def where(self) -> str:
        """`program P, call LABEL (#i, op O), launch j (module M, entry E)`."""
        s = f"program `{self.program}`, call `{self.call_label}` (#{self.call_index}, op `{self.op}`), launch {self.launch_index}"
        if self.extern is not None:
            return s + f" (built-in {self.extern})"
        if self.entry is not None:
            return s + f" (module `{self.entry.module}`, entry `{self.entry.entry}`)"
        return s

    @property
    def var_names(self) -> set[str]:
        """Every var this step's arguments and grid depend on."""
        out: set[str] = set()
        for a in self.args:
            if isinstance(a, Dyn):
                out.update(variables(a.expr))
        for g in self.grid:
            out.update(variables(g))
        return out


def _scalar_of(arg: Arg, where: str) -> ResolvedArg:
    k = arg.kind
    if k in LITERAL_KEYS:
        return Const(arg.literal)  # type: ignore[arg-type]
    if k == "var":
        return Dyn(arg.var)  # type: ignore[arg-type]
    if k == "expr":
        e = arg.expr
        return Dyn(e) if any(True for _ in variables(e)) else Const(_const_eval(e, where))  # type: ignore[arg-type]
    raise KernDriverError(f"a `{k}` argument where a scalar is expected", where=where)


def _const_eval(e: Expr, where: str) -> int:
    from kern_schema import ExprError, evaluate

    try:
        return evaluate(e, {})
    except ExprError as err:
        raise KernDriverError(f"expression {to_text(e)}: {err}", where=where) from None


def resolve_program(
    manifest: Manifest,
    program: str,
    plan: Layout,
    base: int,
    entries: dict[tuple[str, int], ResolvedEntry],
) -> list[Step]:
    """Flatten `program` into steps with every pointer resolved against `base + plan`.

    Args:
        manifest: a verified manifest.
        program: the program name.
        plan: the memory plan; `base`: the arena's device address.
        entries: from `resolve_entries`.

    Raises:
        KernDriverError: an argument form that is not allowed where it stands, or a name
            the verifier would have refused (unknown buffer, state, scratch, param index).
    """
    steps: list[Step] = []
    prog = manifest.programs[program]
    for ci, call in enumerate(prog.calls):
        op = manifest.ops.get(call.op)
        cwhere = f"programs.{program}.calls[{ci}] (`{call.label}`)"
        if op is None:
            raise KernDriverError(f"unknown op `{call.op}`", where=cwhere)

        def call_arg(i: int, where: str) -> ResolvedArg:
            if not 0 <= i < len(call.args):
                raise KernDriverError(f"`param: {i}` but the call passes {len(call.args)} argument(s)", where=where)
            a = call.args[i]
            awhere = f"{cwhere}.args[{i}]"
            if a.kind == "buf":
                r = plan.buffers.get(a.buf)  # type: ignore[arg-type]
                if r is None:
                    raise KernDriverError(f"unknown buffer `{a.buf}`", where=awhere)
                return Ptr(base + r.offset + (a.offset or 0))
            if a.kind == "state":
                r = plan.states.get(a.state)  # type: ignore[arg-type]
                if r is None:
                    raise KernDriverError(f"unknown state `{a.state}`", where=awhere)
                return Ptr(base + r.offset + (a.offset or 0))
            return _scalar_of(a, awhere)

        for li, launch in enumerate(op.impl.launches):
            lwhere = f"ops.{call.op}.impl.launches[{li}]"
            if launch.extern is not None:
                sig = EXTERNS.get(launch.extern)
                if sig is None:
                    raise KernDriverError(f"unknown built-in `{launch.extern}`", where=lwhere,
                                          hint=f"built-ins: {', '.join(EXTERNS)}")
                types = [parse_param_type(t) for t in sig]
                entry = None
            else:
                types = [parse_param_type(t) for t in (launch.params or [])]
                entry = entries.get((call.op, li))
                if entry is None:
                    raise KernDriverError("launch was not resolved", where=lwhere)
            if len(launch.args) != len(types):
                raise KernDriverError(f"{len(launch.args)} args for {len(types)} params", where=lwhere)
            args: list[ResolvedArg] = []
            for ai, a in enumerate(launch.args):
                awhere = f"{lwhere}.args[{ai}] in {cwhere}"
                if a.kind == "param":
                    r = call_arg(a.param, awhere)  # type: ignore[arg-type]
                elif a.kind == "scratch":
                    reg = plan.scratch.get(call.op, {}).get(a.scratch)  # type: ignore[arg-type]
                    if reg is None:
                        raise KernDriverError(f"unknown scratch `{a.scratch}`", where=awhere)
                    r = Ptr(base + reg.offset + (a.offset or 0))
                else:
                    r = _scalar_of(a, awhere)
                if types[ai].is_pointer != isinstance(r, Ptr):
                    raise KernDriverError(
                        f"param {ai} is `{types[ai]}` but gets a {'pointer' if isinstance(r, Ptr) else 'scalar'}",
                        where=awhere,
                    )
                args.append(r)
            step = Step(program, ci, call.label, call.op, li, launch.extern, entry, types, args)
            if launch.extern is None:
                step.grid = list(launch.grid or [1, 1, 1])
                step.block = tuple(launch.block or [1, 1, 1])  # type: ignore[assignment]
                step.shared_mem = launch.shared_mem or 0
                step.pdl = bool(launch.pdl)
                step.carveout = launch.carveout
            steps.append(step)
    return steps


def written_buffers(manifest: Manifest, program: str) -> set[str]:
    """The buffers `program` writes: every `{"buf": ...}` call argument bound to an `out` or `inout`
    parameter of its op's interface."""
    out: set[str] = set()
    for call in manifest.programs[program].calls:
        op = manifest.ops.get(call.op)
        if op is None:
            continue
        for a, t in zip(call.args, op.params):
            if a.kind == "buf" and parse_param_type(t).writes:
                out.add(a.buf)  # type: ignore[arg-type]
    return out


def program_vars(steps: list[Step]) -> set[str]:
    """Every var a program's launches depend on (the vars `run` requires)."""
    out: set[str] = set()
    for s in steps:
        out |= s.var_names
    return out


#: `Runtime.run`'s keyword-only arguments: a var of one of these names goes in run's positional mapping.
RUN_KEYWORDS = frozenset({"graph"})


def check_vars(manifest: Manifest, required: set[str], given: dict[str, int], what: str) -> dict[str, int]:
    """Check run-time var values: every required var given, no unknown name, every value
    an int within its declared [min, max]. Returns the values as a plain dict.

    Raises:
        KernDriverError: naming the var, its value and bounds.
    """
    out: dict[str, int] = {}
    for name, v in given.items():
        decl = manifest.vars.get(name)
        if decl is None:
            raise KernDriverError(f"{what}: unknown var `{name}`", hint=f"declared vars: {', '.join(manifest.vars) or '(none)'}")
        v = plain_int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise KernDriverError(f"{what}: var `{name}` must be an int, got {type(v).__name__} {v!r}")
        if not decl.min <= v <= decl.max:
            raise KernDriverError(
                f"{what}: var `{name}` = {v} is outside its bounds [{decl.min}, {decl.max}]",
                where=f"vars.{name}",
                hint="every buffer, state and grid was checked and sized at these bounds; split the work "
                "(e.g. prefill in chunks) or raise the var's `max` in the manifest",
            )
        out[name] = v
    missing = sorted(required - given.keys())
    if missing:
        if all(m.isidentifier() and not keyword.iskeyword(m) and m not in RUN_KEYWORDS for m in missing):
            example = ", ".join(f"{m}=..." for m in missing)
        else:  # a name that cannot be a keyword argument of run (`graph`, `kv-len`, `class`): the mapping form
            example = "{" + ", ".join(f"{m!r}: ..." for m in missing) + "}"
        raise KernDriverError(
            f"{what}: missing var(s) {', '.join(missing)}",
            hint=f"pass every var the program uses, e.g. rt.run(prog, {example})",
        )
    return out

