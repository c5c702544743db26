"""`Diagnostic`: one problem found in a manifest, and the collector rules report into."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kern_schema import Path, SourceMap, format_path

from .codes import CODES


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One problem.

    Attributes:
        code: stable code (`E0052`), see `kern_verify.codes`.
        severity: "error" or "warning".
        path: where in the manifest, e.g. ("programs", "decode", "calls", 3, "args", 1).
        message: what is wrong (names the call label / op / launch where useful).
        hint: how to fix it, or None.
        line, column: 1-based position in the JSON text when the source is known.
    """

    code: str
    severity: str
    path: Path
    message: str
    hint: str | None = None
    line: int | None = None
    column: int | None = None

    @property
    def location(self) -> str:
        """The path rendered as `programs.decode.calls[3].args[1]`."""
        return format_path(self.path)

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (path both as a list and rendered)."""
        return {
            "code": self.code,
            "severity": self.severity,
            "location": self.location,
            "path": list(self.path),
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "hint": self.hint,
        }

    def __str__(self) -> str:
        where = self.location
        if self.line is not None:
            where += f" (line {self.line}, column {self.column})"
        s = f"{self.severity}[{self.code}]: {self.message} at {where}"
        return s + (f" (hint: {self.hint})" if self.hint else "")


@dataclass
class Report:
    """Collects diagnostics while rules run; rules call `error`/`warn`."""

    items: list[Diagnostic] = field(default_factory=list)

    def add(self, code: str, path: Path, message: str, hint: str | None = None, severity: str | None = None) -> None:
        """Report `code` at `path`; severity defaults to the code's registered one."""
        sev = severity or CODES[code].severity
        self.items.append(Diagnostic(code, sev, tuple(path), message, hint))


def locate(diags: list[Diagnostic], source: SourceMap | None) -> list[Diagnostic]:
    """Attach line/column from `source` (the nearest existing ancestor of each path)."""
    if source is None:
        return diags
    out = []
    for d in diags:
        if d.line is not None:
            out.append(d)
            continue
        pos = source.locate(d.path)
        out.append(replace(d, line=pos.line, column=pos.col) if pos is not None else d)
    return out
