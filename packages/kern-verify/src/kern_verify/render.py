"""Rendering diagnostics: rustc-style text for people, JSON for machines."""

from __future__ import annotations

import json

from .diagnostic import Diagnostic
from .plan import Plan


def summary(diags: list[Diagnostic], n_ops: int | None = None, n_calls: int | None = None) -> str:
    """`error: 3 errors, 1 warning`, `ok: manifest verified (N ops, M calls), 1 warning` ...;
    `error: 2 errors (140 more sites with the same causes folded into them)` when folded."""
    ne = sum(1 for d in diags if d.is_error)
    nw = len(diags) - ne
    warn = f"{nw} warning{'s' if nw != 1 else ''}"
    if ne:
        nf = sum(len(d.folded) for d in diags)
        folded = (f" ({nf} more site{'s' if nf != 1 else ''} with the same cause{'s' if ne != 1 else ''} "
                  f"folded into {'them' if ne != 1 else 'it'})") if nf else ""
        return f"error: {ne} error{'s' if ne != 1 else ''}" + (f", {warn}" if nw else "") + folded
    counts = f" ({n_ops} ops, {n_calls} calls)" if n_ops is not None else ""
    return f"ok: manifest verified{counts}" + (f", {warn}" if nw else "")


def human(diags: list[Diagnostic], text: str | None = None, filename: str | None = None) -> str:
    """Render diagnostics like rustc::

        error[E0052]: call `l0.qkv` arg 1: buffer `x` is f32 but op `gemm` expects `in buffer<bf16>`
          --> programs.decode.calls[3].args[1] (line 120, column 9)
            |
        120 |         {"buf": "x"},
            |         ^
          = hint: pass a buffer<bf16>; dtypes must match exactly
    """
    lines_of = text.splitlines() if text is not None else None
    out: list[str] = []
    for d in diags:
        out.append(f"{d.severity}[{d.code}]: {d.message}")
        _span(out, lines_of, filename, d.location, d.line, d.column)
        for n in d.notes:
            if n.path is None:
                out.append(f"  = note: {n.message}")
        if d.hint:
            out.append(f"  = hint: {d.hint}")
        for n in d.notes:
            if n.path is not None:
                out.append(f"note: {n.message}")
                _span(out, lines_of, filename, n.location, n.line, n.column)  # type: ignore[arg-type]
        out.append("")
    return "\n".join(out)


def _span(out: list[str], lines_of: list[str] | None, filename: str | None, location: str,
          line: int | None, column: int | None) -> None:
    """`  --> file: path (line L, column C)` and the source line with a caret under C."""
    where = location
    if line is not None:
        where += f" (line {line}, column {column})"
    if filename:
        where = f"{filename}: {where}"
    out.append(f"  --> {where}")
    if lines_of is not None and line is not None and 1 <= line <= len(lines_of):
        src = lines_of[line - 1]
        num = str(line)
        pad = " " * len(num)
        col = max(1, column or 1)
        shown = src if len(src) <= 160 else src[max(0, col - 60): col + 100]
        caret_at = col - 1 if len(src) <= 160 else min(col - 1, 59)
        out.append(f"{pad} |")
        out.append(f"{num} | {shown}")
        out.append(f"{pad} | {' ' * caret_at}^")


def as_json(diags: list[Diagnostic], summary_line: str, plan: Plan | None = None, manifest: str | None = None) -> str:
    """`{"manifest": file, "ok": bool, "errors": n, "warnings": n, "summary": str, "diagnostics": [...]}`,
    plus `"plan"` (`Plan.to_json()`) when given."""
    ne = sum(1 for d in diags if d.is_error)
    extra = {"plan": plan.to_json()} if plan is not None else {}
    return json.dumps({
        "manifest": manifest,
        "ok": ne == 0,
        "errors": ne,
        "warnings": len(diags) - ne,
        "summary": summary_line,
        "diagnostics": [d.to_json() for d in diags],
        **extra,
    }, indent=1, ensure_ascii=False)
