"""Rendering diagnostics: rustc-style text for people, JSON for machines."""

from __future__ import annotations

import dataclasses
import json

from .diagnostic import Diagnostic
from .plan import Plan


def summary(diags: list[Diagnostic], n_ops: int | None = None, n_calls: int | None = None) -> str:
    """`error: 3 errors, 1 warning`, `ok: manifest verified (N ops, M calls), 1 warning` ..."""
    ne = sum(1 for d in diags if d.is_error)
    nw = len(diags) - ne
    warn = f"{nw} warning{'s' if nw != 1 else ''}"
    if ne:
        return f"error: {ne} error{'s' if ne != 1 else ''}" + (f", {warn}" if nw else "")
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
        where = d.location
        if d.line is not None:
            where += f" (line {d.line}, column {d.column})"
        if filename:
            where = f"{filename}: {where}"
        out.append(f"  --> {where}")
        if lines_of is not None and d.line is not None and 1 <= d.line <= len(lines_of):
            src = lines_of[d.line - 1]
            num = str(d.line)
            pad = " " * len(num)
            col = max(1, d.column or 1)
            shown = src if len(src) <= 160 else src[max(0, col - 60): col + 100]
            caret_at = col - 1 if len(src) <= 160 else min(col - 1, 59)
            out.append(f"{pad} |")
            out.append(f"{num} | {shown}")
            out.append(f"{pad} | {' ' * caret_at}^")
        if d.hint:
            out.append(f"  = hint: {d.hint}")
        out.append("")
    return "\n".join(out)


def as_json(diags: list[Diagnostic], summary_line: str, plan: Plan | None = None) -> str:
    """`{"ok": bool, "errors": n, "warnings": n, "summary": str, "diagnostics": [...]}`,
    plus `"plan"` (the `Plan` as plain data) when given."""
    ne = sum(1 for d in diags if d.is_error)
    extra = {"plan": dataclasses.asdict(plan)} if plan is not None else {}
    return json.dumps({
        "ok": ne == 0,
        "errors": ne,
        "warnings": len(diags) - ne,
        "summary": summary_line,
        "diagnostics": [d.to_json() for d in diags],
        **extra,
    }, indent=1, ensure_ascii=False)
