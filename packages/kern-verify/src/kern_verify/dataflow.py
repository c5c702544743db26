"""Program dataflow (DESIGN §3 group 8) over the buffer accesses of the calls.

Per program, in call order (a call's reads before its writes, so an `inout`
argument reads then writes): no read of a `workspace` buffer before a write
(E0060; an `output` read first only warns, E0063); no write to `input` or
`weight` (E0061). Over all programs: every `output` and `carry` is written by
some call (E0062). Inputs, weights and carries count as written on entry.

A call whose accesses are unknown (unknown op, wrong arity, malformed param type;
reported by the call rules; or an op whose impl writes an `in` param, E0037) may have written anything: reads after it are not
reported, nor (anywhere) never-written outputs — one mistake, one diagnostic.
"""

from __future__ import annotations

from itertools import groupby

from .calls import Access
from .context import Context


def check_dataflow(ctx: Context, accesses: list[Access]) -> None:
    """Run group 8 on `accesses` (as returned by `check_calls`)."""
    bufs = ctx.m.buffers
    ever_written: set[str] = set()
    for pname, prog_acc in groupby(accesses, key=lambda a: a.program):
        written: set[str] = set()
        unknown_from = ctx.incomplete_from.get(pname)
        for ci, call_acc in groupby(prog_acc, key=lambda a: a.call):
            call_acc = list(call_acc)
            for a in call_acc:
                cls = bufs[a.buffer].class_
                if not a.reads or a.buffer in written or (unknown_from is not None and unknown_from <= ci):
                    continue
                if cls == "workspace":
                    ctx.r.add("E0060", a.path,
                              f"call `{a.label}` reads workspace buffer `{a.buffer}` before any call of program `{pname}` wrote it",
                              "write it earlier in this program, or make it a `carry` if another program fills it",
                              span=a.path + ("buf",))
                    written.add(a.buffer)  # report once per program
                elif cls == "output":
                    ctx.r.add("E0063", a.path,
                              f"call `{a.label}` reads output buffer `{a.buffer}` before any call of program `{pname}` wrote it",
                              "outputs are not kept between runs: use a `carry` for state across runs", span=a.path + ("buf",))
                    written.add(a.buffer)
            for a in call_acc:
                if not a.writes:
                    continue
                cls = bufs[a.buffer].class_
                if cls in ("input", "weight"):
                    ctx.r.add("E0061", a.path,
                              f"call `{a.label}` writes {cls} buffer `{a.buffer}`",
                              f"{'the caller owns inputs' if cls == 'input' else 'weights are read-only'}: "
                              "write into a workspace buffer instead (or fix the op param's direction)", span=a.path + ("buf",))
                written.add(a.buffer)
                ever_written.add(a.buffer)
    for name, b in bufs.items():
        if b.class_ in ("output", "carry") and name not in ever_written and name in ctx.used_buffers \
                and not ctx.incomplete_from:
            ctx.r.add("E0062", ("buffers", name), f"{b.class_} buffer `{name}` is written by no call of any program",
                      "pass it to an op param declared `out` or `inout`, or remove it")
