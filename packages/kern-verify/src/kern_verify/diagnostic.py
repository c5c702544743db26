"""`Diagnostic`: one problem found in a manifest, and the collector rules report into."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from kern_schema import Path, SourceMap, format_path

from .codes import CODES


@dataclass(frozen=True, slots=True)
class Note:
    """A secondary message of a diagnostic; with `path`, it points at another place of the
    manifest (`declared here: buffers.x.dtype`), and gets its own line/column."""

    message: str
    path: Path | None = None
    line: int | None = None
    column: int | None = None

    @property
    def location(self) -> str | None:
        return format_path(self.path) if self.path is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message, "location": self.location,
                "path": list(self.path) if self.path is not None else None,
                "line": self.line, "column": self.column}


class Fold(NamedTuple):
    """Diagnostics with one cause: those sharing `key` are folded into the first one (in
    report order), which gets the note "K more `what`: `site`, `site`, ...".

    key: what they share, e.g. ("E0052", buffer, expected dtype).
    what: the plural noun phrase of the note, e.g. "call sites pass `x` where buffer<bf16> is expected".
    site: this diagnostic's short name in that list, e.g. "`l3.qkv_proj` (prefill)".
    """

    key: Hashable
    what: str
    site: str


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One problem.

    Attributes:
        code: stable code (`E0052`), see `kern_verify.codes`.
        severity: "error" or "warning".
        path: where in the manifest, e.g. ("programs", "decode", "calls", 3, "args", 1).
        message: what is wrong (names the call label / op / launch where useful).
        hint: how to fix it, or None.
        line, column: 1-based position in the JSON text when the source is known: of the
            value at `span` when set (a token inside the value at `path`, e.g. the unknown
            var inside a `ceil_div`), else of the value at `path`.
        notes: secondary messages (`Note`), e.g. where the declaration involved is.
        folded: diagnostics with the same cause folded into this one (same code; see
            `Fold`); the count of errors does not include them.
        span: the path of the exact token to point at, when finer than `path`.
    """

    code: str
    severity: str
    path: Path
    message: str
    hint: str | None = None
    line: int | None = None
    column: int | None = None
    notes: tuple[Note, ...] = ()
    folded: tuple["Diagnostic", ...] = ()
    span: Path | None = field(default=None, compare=False, repr=False)
    fold: Fold | None = field(default=None, compare=False, repr=False)

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
            "notes": [n.to_json() for n in self.notes],
            "folded": [d.to_json() for d in self.folded],
        }

    def __str__(self) -> str:
        where = self.location
        if self.line is not None:
            where += f" (line {self.line}, column {self.column})"
        s = f"{self.severity}[{self.code}]: {self.message} at {where}"
        for n in self.notes:
            s += f" (note: {n.message}" + (f" at {n.location}" if n.path is not None else "") + ")"
        return s + (f" (hint: {self.hint})" if self.hint else "")


@dataclass
class Report:
    """Collects diagnostics while rules run; rules call `error`/`warn`."""

    items: list[Diagnostic] = field(default_factory=list)

    def add(self, code: str, path: Path, message: str, hint: str | None = None, severity: str | None = None, *,
            notes: tuple[Note, ...] = (), span: Path | None = None, fold: Fold | None = None) -> None:
        """Report `code` at `path`; severity defaults to the code's registered one. `span`
        points the line/column at a token inside `path`'s value; `fold` groups diagnostics
        with one cause (see `fold`)."""
        sev = severity or CODES[code].severity
        self.items.append(Diagnostic(code, sev, tuple(path), message, hint, notes=tuple(notes),
                                     span=tuple(span) if span is not None else None, fold=fold))


def locate(diags: list[Diagnostic], source: SourceMap | None) -> list[Diagnostic]:
    """Attach line/column from `source` (the nearest existing ancestor of each path)."""
    if source is None:
        return diags
    out = []
    for d in diags:
        if d.notes:
            d = replace(d, notes=tuple(_locate_note(n, source) for n in d.notes))
        if d.line is not None:
            out.append(d)
            continue
        pos = source.locate(d.span if d.span is not None else d.path)
        out.append(replace(d, line=pos.line, column=pos.col) if pos is not None else d)
    return out


def _locate_note(n: Note, source: SourceMap) -> Note:
    if n.path is None or n.line is not None:
        return n
    pos = source.locate(n.path)
    return replace(n, line=pos.line, column=pos.col) if pos is not None else n


#: At most this many sites are named in a fold note.
FOLD_SITES = 6


def fold(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Fold diagnostics that share a `Fold.key` into the first of them (in list order):
    it gets `folded` (the others) and the note "K more <what>: <sites>, ...". One cause
    (a buffer declared with the wrong dtype, a renamed var) then gives one diagnostic,
    not one per use."""
    groups: dict[Hashable, list[Diagnostic]] = {}
    for d in diags:
        if d.fold is not None:
            groups.setdefault((d.code, d.fold.key), []).append(d)
    out = []
    for d in diags:
        if d.fold is None:
            out.append(d)
            continue
        g = groups[(d.code, d.fold.key)]
        if g[0] is not d:
            continue
        if len(g) == 1:
            out.append(d)
            continue
        rest = g[1:]
        sites = []
        for x in rest:
            if x.fold.site not in sites:  # type: ignore[union-attr]
                sites.append(x.fold.site)  # type: ignore[union-attr]
        shown = ", ".join(sites[:FOLD_SITES]) + (f", and {len(sites) - FOLD_SITES} more" if len(sites) > FOLD_SITES else "")
        note = Note(f"{len(rest)} more {d.fold.what}: {shown}")
        out.append(replace(d, notes=d.notes + (note,), folded=tuple(rest)))
    return out
