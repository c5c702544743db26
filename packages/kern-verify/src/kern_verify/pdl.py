"""Programmatic dependent launch (`"pdl": true` on a launch): E0090, E0091.

A `pdl` launch may begin before the previous launch of its program has completed;
the kernel promises to execute `griddepcontrol.wait` in every block before it reads
anything an earlier launch wrote and before it writes anything (kern-schema README,
"Programmatic dependent launch"). What the verifier can check is where the flag is:

- E0090 (error): on a built-in (`extern`). The runtime runs a built-in through a
  library (cuBLASLt) that launches its own kernels: nothing executes the wait, so the
  promise cannot hold, and there is no launch to put the attribute on.
- E0091 (warning): on a kernel launch whose predecessor in program order is not a
  kernel launch: the first launch of a program (nothing before it in the program; in
  a graph it is a root node), or a launch right after a built-in (cuBLASLt's kernels
  never execute `griddepcontrol.launch_dependents`). Correctness does not suffer —
  the wait still returns only after the predecessor completed, and the launch then
  simply starts when the predecessor's blocks have exited, like an ordinary one — but
  the flag buys nothing there, so it is a warning, not an error: a provider may keep
  one impl with `pdl` for an op that is called both after kernels and after a GEMM
  built-in.

The verifier cannot prove that a kernel keeps its promise (waits before its first
dependent read, writes nothing before the wait, waits in every block): that is a
statement about the kernel's code, on the trusted side of the boundary like what it
reads and writes. With `--kernels`, E0088 checks the weaker, decidable part: the
entry's code contains the wait instruction at all.
"""

from __future__ import annotations

from kern_schema import Launch, Path

from .context import Context


def check_pdl(ctx: Context) -> None:
    """Report E0090 for `pdl` on built-ins and E0091 for `pdl` launches that follow no kernel."""
    m = ctx.m
    for oname, op in m.ops.items():
        for li, launch in enumerate(op.impl.launches):
            if launch.pdl and launch.extern is not None:
                ctx.r.add("E0090", ("ops", oname, "impl", "launches", li, "pdl"),
                          f"op `{oname}` launch {li} (extern `{launch.extern}`): `pdl` on a built-in",
                          "only kernel launches can use programmatic dependent launch: remove `\"pdl\": true` here")
            elif launch.pdl and li > 0 and op.impl.launches[li - 1].extern is not None:
                ctx.r.add("E0091", ("ops", oname, "impl", "launches", li, "pdl"),
                          f"op `{oname}` launch {li} (`{launch.entry}`) has `pdl` but follows the built-in "
                          f"`{op.impl.launches[li - 1].extern}` (launch {li - 1}), which never triggers its dependents",
                          "the flag has no effect after a built-in: remove it (correctness is not affected)")
    for pname, prog in m.programs.items():
        prev: Launch | None = None  # the last launch of the previous call with any launch
        known = True  # False after a call of an undeclared op (reported as E0050)
        for ci, call in enumerate(prog.calls):
            op = m.ops.get(call.op)
            if op is None:
                known = False
                continue
            if not op.impl.launches:
                continue
            first = op.impl.launches[0]
            if first.pdl and first.extern is None and known:
                path: Path = ("programs", pname, "calls", ci)
                if prev is None:
                    ctx.r.add("E0091", path,
                              f"call `{call.label}` is the first launch of program `{pname}`, and op `{call.op}` launch 0 "
                              f"(`{first.entry}`) has `pdl`: no earlier kernel of the program to overlap",
                              "in a CUDA graph a program's first launch is a root node and the flag has no effect "
                              "(eagerly it overlaps whatever kernel ran before on the stream): use an impl without "
                              "`pdl` here, or ignore this warning")
                elif prev.extern is not None:
                    ctx.r.add("E0091", path,
                              f"call `{call.label}`: op `{call.op}` launch 0 (`{first.entry}`) has `pdl`, but the "
                              f"previous call ends with the built-in `{prev.extern}`, which never triggers its dependents",
                              "the flag has no effect after a built-in: use an impl without `pdl` at this call site, "
                              "or ignore this warning (correctness is not affected)")
            prev = op.impl.launches[-1]
            known = True
