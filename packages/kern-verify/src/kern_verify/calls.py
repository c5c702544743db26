"""Rules on program calls (DESIGN §3 group 7): op exists (E0050), labels unique (E0057),
argument count (E0051), each argument against its op param (E0040, E0052–E0056).

`check_calls` returns every buffer access (program, call, arg, buffer, reads, writes)
for the dataflow rules of group 8.
"""

from __future__ import annotations

from typing import NamedTuple

from kern_schema import DTYPES, Arg, ParamType, Path

from .args import check_scalar_arg
from .context import Context, arg_kind, suggest

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


def check_calls(ctx: Context) -> list[Access]:
    """Check every call of every program; return the buffer accesses in program order."""
    out: list[Access] = []
    for pname, prog in ctx.m.programs.items():
        labels: dict[str, int] = {}
        for ci, call in enumerate(prog.calls):
            cpath: Path = ("programs", pname, "calls", ci)
            what = f"call `{call.label}`"
            if call.label in labels:
                ctx.r.add("E0057", cpath + ("label",),
                          f"{what}: label already used by calls[{labels[call.label]}] of program `{pname}`",
                          "give every call of a program a distinct label, e.g. `l3.qkv_proj`")
            else:
                labels[call.label] = ci
            iface = ctx.iface.get(call.op)
            if iface is None:
                ctx.r.add("E0050", cpath + ("op",), f"{what}: op `{call.op}` is not declared",
                          suggest(call.op, ctx.m.ops, "declare it in `ops`"))
            else:
                ctx.used_ops.add(call.op)
                if len(call.args) != len(iface):
                    ctx.r.add("E0051", cpath + ("args",),
                              f"{what}: {len(call.args)} args, op `{call.op}` takes {len(iface)}",
                              "op params: " + ", ".join(ctx.m.ops[call.op].params))
            for ai, arg in enumerate(call.args):
                pt = iface[ai] if iface is not None and ai < len(iface) else None
                apath = cpath + ("args", ai)
                acc = _arg(ctx, arg, apath, pt, f"{what} arg {ai}", call.op)
                if acc is not None:
                    out.append(Access(pname, ci, call.label, ai, acc, pt.reads, pt.writes, apath))  # type: ignore[union-attr]
    return out


def _arg(ctx: Context, arg: Arg, path: Path, pt: ParamType | None, what: str, op: str) -> str | None:
    """Check one call argument; return the buffer name when it is a well-typed buffer access."""
    r = ctx.r
    kind = arg_kind(arg)
    if kind == "buf":
        name = arg.buf
        b = ctx.m.buffers.get(name)  # type: ignore[arg-type]
        if b is None:
            r.add("E0054", path + ("buf",), f"{what}: buffer `{name}` is not declared",
                  suggest(name, ctx.m.buffers, "declare it in `buffers`"))  # type: ignore[arg-type]
            return None
        ctx.used_buffers.add(name)  # type: ignore[arg-type]
        _buf_offset(ctx, arg, path, name, what)  # type: ignore[arg-type]
        if pt is None:
            return None
        if pt.kind != "buffer":
            r.add("E0052", path, f"{what}: buffer `{name}` passed to op `{op}` param `{pt}`",
                  "a ptr param takes a state, a scalar param a var, expr or literal" if pt.kind == "ptr"
                  else "a scalar param takes a var, an expr or a literal")
            return None
        if pt.dtype != b.dtype and b.dtype in DTYPES:
            r.add("E0052", path, f"{what}: buffer `{name}` is {b.dtype} but op `{op}` expects `{pt}`",
                  f"pass a buffer<{pt.dtype}>; dtypes must match exactly")
        return name  # the direction is known even when the dtype is wrong: keep the dataflow exact
    if kind == "state":
        name = arg.state
        if name not in ctx.m.states:
            r.add("E0054", path + ("state",), f"{what}: state `{name}` is not declared",
                  suggest(name, ctx.m.states, "declare it in `states`"))  # type: ignore[arg-type]
            return None
        ctx.used_states.add(name)  # type: ignore[arg-type]
        off = arg.offset or 0
        if off < 0 or off % STATE_OFFSET_ALIGN:
            r.add("E0055", path + ("offset",), f"{what}: offset {off} into state `{name}` is not a non-negative multiple of {STATE_OFFSET_ALIGN}",
                  f"state offsets are multiples of {STATE_OFFSET_ALIGN} bytes")
        if pt is not None and pt.kind != "ptr":
            r.add("E0052", path, f"{what}: state `{name}` passed to op `{op}` param `{pt}`",
                  "a state binds only to a `ptr` param (`in ptr`, `out ptr`, `inout ptr`)")
        return None
    if kind in ("param", "scratch"):
        r.add("E0040", path, f"{what}: a `{kind}` argument is not allowed in a call",
              "calls pass buffers ({\"buf\": name}), states, vars, expressions and literals")
        return None
    if pt is None:
        if kind == "var" and arg.var in ctx.ranges:
            ctx.used_vars.add(arg.var)  # type: ignore[arg-type]
        elif kind == "expr":
            ctx.expr_bounds(arg.expr, path + ("expr",))  # type: ignore[arg-type]
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
