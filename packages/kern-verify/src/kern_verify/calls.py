"""Rules on program calls (DESIGN §3 group 7): op exists (E0050), labels unique (E0057)
and not empty (E0058), argument count (E0051), each argument against its op param (E0040,
E0052–E0056).

`check_calls` returns every buffer access (program, call, arg, buffer, reads, writes)
for the dataflow rules of group 8.
"""

from __future__ import annotations

from typing import NamedTuple

from kern_schema import DTYPES, Arg, ParamType, Path
from kern_schema.dtypes import INT64_MAX

from .args import check_scalar_arg
from .context import Context, arg_kind, site_of, suggest
from .diagnostic import Fold, Note

#: State offsets are multiples of this many bytes (the widest CUDA vector access, 16 B).
STATE_OFFSET_ALIGN = 16


class Access(NamedTuple):
    """A call passing buffer `buffer` to an op param that `reads` and/or `writes` it."""

    program: str
    call: int
    label: str
    arg: int
    buffer: str
    reads: bool
    writes: bool
    path: Path


class _DtypeMismatch(NamedTuple):
    path: Path
    what: str
    op: str
    param: ParamType
    buffer: str


def check_calls(ctx: Context) -> list[Access]:
    """Check every call of every program; return the buffer accesses in program order."""
    out: list[Access] = []
    mismatches: list[_DtypeMismatch] = []
    matched: set[str] = set()  # buffers passed at least once to a param of their own dtype
    for pname, prog in ctx.m.programs.items():
        labels: dict[str, int] = {}
        for ci, call in enumerate(prog.calls):
            cpath: Path = ("programs", pname, "calls", ci)
            what = f"call `{call.label}`"
            if not call.label.strip():
                ctx.r.add("E0058", cpath + ("label",), f"call {ci} of program `{pname}` (op `{call.op}`) has an empty label",
                          "label every call with what it is, e.g. `l3.qkv_proj`")
                what = f"call {ci} (op `{call.op}`)"
            elif call.label in labels:
                ctx.r.add("E0057", cpath + ("label",),
                          f"{what}: label already used by calls[{labels[call.label]}] of program `{pname}`",
                          "give every call of a program a distinct label, e.g. `l3.qkv_proj`")
            else:
                labels[call.label] = ci
            iface = ctx.iface.get(call.op)
            if iface is None:
                ctx.refer_unknown("ops", call.op, f"call `{call.label}` (program `{pname}`)")
                ctx.r.add("E0050", cpath + ("op",), f"{what}: op `{call.op}` is not declared",
                          suggest(call.op, ctx.m.ops, "declare it in `ops`"),
                          fold=Fold(("op", call.op), f"calls name the undeclared op `{call.op}`", f"`{call.label}`"))
            else:
                ctx.used_ops.add(call.op)
                if len(call.args) != len(iface):
                    ctx.r.add("E0051", cpath + ("args",),
                              f"{what}: {len(call.args)} args, op `{call.op}` takes {len(iface)}",
                              "op params: " + ", ".join(ctx.m.ops[call.op].params))
            if iface is None or len(call.args) != len(iface) or None in iface or call.op in ctx.unsound_ops:
                ctx.incomplete_from.setdefault(pname, ci)
            for ai, arg in enumerate(call.args):
                pt = iface[ai] if iface is not None and ai < len(iface) else None
                apath = cpath + ("args", ai)
                acc = _arg(ctx, arg, apath, pt, f"{what} arg {ai}", call.op, mismatches, matched)
                if acc is not None:
                    out.append(Access(pname, ci, call.label, ai, acc, pt.reads, pt.writes, apath))  # type: ignore[union-attr]
    _report_dtypes(ctx, mismatches, matched)
    return out


def _report_dtypes(ctx: Context, mismatches: list[_DtypeMismatch], matched: set[str]) -> None:
    """E0052 for buffers passed to a buffer param of another dtype. All the call sites
    passing one buffer where one dtype is expected have one cause (usually the buffer's
    declaration), so they fold into one diagnostic that points at the declaration."""
    expected: dict[str, set[str]] = {}
    for mm in mismatches:
        expected.setdefault(mm.buffer, set()).add(mm.param.dtype)  # type: ignore[arg-type]
    for mm in mismatches:
        name, want = mm.buffer, mm.param.dtype
        b = ctx.m.buffers[name]
        if name not in matched and expected[name] == {want}:
            hint = (f"no call passes `{name}` to a buffer<{b.dtype}> param: declare `{name}` with dtype {want} "
                    f"(or pass a buffer<{want}>)")
        else:
            hint = f"pass a buffer<{want}>; dtypes must match exactly"
        ctx.r.add("E0052", mm.path, f"{mm.what}: buffer `{name}` is {b.dtype} but op `{mm.op}` expects `{mm.param}`", hint,
                  notes=(Note(f"buffer `{name}` is declared {b.dtype} here", ("buffers", name, "dtype")),),
                  span=mm.path + ("buf",),
                  fold=Fold(("dtype", name, want), f"call sites pass `{name}` where buffer<{want}> is expected",
                            site_of(mm.what)))


def _arg(ctx: Context, arg: Arg, path: Path, pt: ParamType | None, what: str, op: str,
         mismatches: list[_DtypeMismatch], matched: set[str]) -> str | None:
    """Check one call argument; return the buffer name when it is a well-typed buffer access."""
    r = ctx.r
    kind = arg_kind(arg)
    if kind == "buf":
        name = arg.buf
        b = ctx.m.buffers.get(name)  # type: ignore[arg-type]
        if b is None:
            ctx.refer_unknown("buffers", name, site_of(what))  # type: ignore[arg-type]
            r.add("E0054", path + ("buf",), f"{what}: buffer `{name}` is not declared",
                  suggest(name, ctx.m.buffers, "declare it in `buffers`"),  # type: ignore[arg-type]
                  fold=Fold(("buffer", name), f"uses of the undeclared buffer `{name}`", site_of(what)))
            return None
        ctx.used_buffers.add(name)  # type: ignore[arg-type]
        _buf_offset(ctx, arg, path, name, what)  # type: ignore[arg-type]
        if pt is None:
            return None
        if pt.kind != "buffer":
            r.add("E0052", path, f"{what}: buffer `{name}` passed to op `{op}` param `{pt}`",
                  "a ptr param takes a state, a scalar param a var, expr or literal" if pt.kind == "ptr"
                  else "a scalar param takes a var, an expr or a literal", span=path + ("buf",))
            return None
        if pt.dtype != b.dtype and b.dtype in DTYPES:
            mismatches.append(_DtypeMismatch(path, what, op, pt, name))  # type: ignore[arg-type]
        elif pt.dtype == b.dtype:
            matched.add(name)  # type: ignore[arg-type]
        return name  # the direction is known even when the dtype is wrong: keep the dataflow exact
    if kind == "state":
        name = arg.state
        if name not in ctx.m.states:
            ctx.refer_unknown("states", name, site_of(what))  # type: ignore[arg-type]
            r.add("E0054", path + ("state",), f"{what}: state `{name}` is not declared",
                  suggest(name, ctx.m.states, "declare it in `states`"),  # type: ignore[arg-type]
                  fold=Fold(("state", name), f"uses of the undeclared state `{name}`", site_of(what)))
            return None
        ctx.used_states.add(name)  # type: ignore[arg-type]
        off = arg.offset or 0
        if off < 0 or off % STATE_OFFSET_ALIGN:
            r.add("E0055", path + ("offset",), f"{what}: offset {off} into state `{name}` is not a non-negative multiple of {STATE_OFFSET_ALIGN}",
                  f"state offsets are multiples of {STATE_OFFSET_ALIGN} bytes")
        else:
            _state_offset(ctx, path, name, off, what)  # type: ignore[arg-type]
        if pt is not None and pt.kind != "ptr":
            r.add("E0052", path, f"{what}: state `{name}` passed to op `{op}` param `{pt}`",
                  "a state binds only to a `ptr` param (`in ptr`, `out ptr`, `inout ptr`)", span=path + ("state",))
        return None
    if kind in ("param", "scratch"):
        r.add("E0040", path, f"{what}: a `{kind}` argument is not allowed in a call",
              "calls pass buffers ({\"buf\": name}), states, vars, expressions and literals")
        return None
    if pt is None:
        if kind == "var" and arg.var in ctx.ranges:
            ctx.used_vars.add(arg.var)  # type: ignore[arg-type]
        elif kind == "expr":
            ctx.expr_bounds(arg.expr, path + ("expr",), site_of(what))  # type: ignore[arg-type]
        return None
    if pt.kind != "scalar":
        if kind == "var" and arg.var in ctx.ranges:
            ctx.used_vars.add(arg.var)  # type: ignore[arg-type]
        r.add("E0052", path, f"{what}: a `{kind}` argument passed to op `{op}` param `{pt}`",
              "a buffer param takes {\"buf\": name}, a ptr param {\"state\": name}")
        return None
    check_scalar_arg(ctx, arg, path, pt, what)
    return None


def _buf_offset(ctx: Context, arg: Arg, path: Path, name: str, what: str) -> None:
    off = arg.offset or 0
    if not off:
        return
    b = ctx.m.buffers[name]
    esize = DTYPES.get(b.dtype)
    if esize is None:
        return
    opath = path + ("offset",)
    if off < 0 or off % esize:
        ctx.r.add("E0055", opath, f"{what}: offset {off} into buffer `{name}` ({b.dtype}) is not a non-negative multiple of {esize}",
                  f"offsets are bytes: use a multiple of the element size ({esize})")
        return
    nb = ctx.buffer_nbytes(name)
    if nb is not None and off >= nb:
        ctx.r.add("E0056", opath, f"{what}: offset {off} is outside buffer `{name}` ({b.dtype} {b.shape}: {nb} bytes at the var maxima)",
                  "the offset must be less than the buffer's size; check the buffer's shape")


def _state_offset(ctx: Context, path: Path, name: str, off: int, what: str) -> None:
    """E0056 for a state offset past the state: a per-sequence state's size is known
    (`seqs.max × bytes_per_seq`); a per-token state's depends on the capacity, so its
    offsets are only held to what a device address can add (int64)."""
    st = ctx.m.states[name]
    size = None
    if st.bytes_per_seq is not None and st.bytes_per_token is None and "seqs" in ctx.ranges \
            and "seqs" not in ctx.bad_vars and st.bytes_per_seq > 0:
        size = ctx.ranges["seqs"][1] * st.bytes_per_seq
    if size is not None and off >= size:
        ctx.r.add("E0056", path + ("offset",),
                  f"{what}: offset {off} is outside state `{name}` ({st.bytes_per_seq} bytes per sequence × "
                  f"seqs.max {ctx.ranges['seqs'][1]} = {size} bytes)",
                  "the offset must be less than the state's size; check `bytes_per_seq` and the offset")
    elif off > INT64_MAX:
        ctx.r.add("E0056", path + ("offset",), f"{what}: offset {off} into state `{name}` is over 2^63−1 bytes",
                  "a state offset is a byte count inside the state: check the value")
