"""Source positions of a manifest's JSON text, and manifest paths.

A *path* is a tuple of map keys (str) and list indices (int) from the document
root, e.g. ``("programs", "decode", "calls", 12, "args", 3)``, rendered by
`format_path` as ``programs.decode.calls[12].args[3]``. Names that are not
plain identifiers are quoted: ``buffers["model.norm.weight"]``.

`SourceMap.build(text)` scans the text once (pure Python; only needed when a
diagnostic must point at a line) and records for every value the line and
column (1-based) where it starts and, for object members, where its key
starts. It also lists every duplicated object key, which `json` and msgspec
silently resolve as "last one wins".
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field

Path = tuple[str | int, ...]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def format_path(path: Path) -> str:
    """Render a path: ``ops.rms_norm.impl.launches[0].grid[1]``; the root is ``$``."""
    out: list[str] = []
    for p in path:
        if isinstance(p, int):
            out.append(f"[{p}]")
        elif _IDENT.match(p):
            out.append(f".{p}" if out else p)
        else:
            q = p.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'["{q}"]')
    return "".join(out) or "$"


@dataclass(frozen=True, slots=True)
class Position:
    """A 1-based line and column in the JSON text, and the 0-based character offset."""

    line: int
    col: int
    offset: int


@dataclass(frozen=True, slots=True)
class DuplicateKey:
    """A key that appears twice in one JSON object: `path` is the object's path."""

    path: Path
    key: str
    first: Position
    second: Position


_WS = re.compile(r"[ \t\r\n]*")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


class SourceScanError(ValueError):
    """The text is not valid JSON; `position` says where scanning stopped."""

    def __init__(self, message: str, position: Position):
        super().__init__(f"{message} at line {position.line}, column {position.col}")
        self.position = position


@dataclass
class SourceMap:
    """Positions of every value (and object key) of a JSON document, by path."""

    text: str
    values: dict[Path, Position] = field(default_factory=dict)
    keys: dict[Path, Position] = field(default_factory=dict)
    duplicates: list[DuplicateKey] = field(default_factory=list)
    _line_starts: list[int] = field(default_factory=list)

    @classmethod
    def build(cls, text: str | bytes) -> "SourceMap":
        """Scan `text` (JSON). Raises `SourceScanError` on invalid JSON."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        sm = cls(text)
        starts = [0]
        for m in re.finditer("\n", text):
            starts.append(m.end())
        sm._line_starts = starts
        end = sm._value(_WS.match(text, 0).end(), ())  # type: ignore[union-attr]
        end = _WS.match(text, end).end()  # type: ignore[union-attr]
        if end != len(text):
            raise SourceScanError("extra data after the JSON document", sm.position(end))
        return sm

    def position(self, offset: int) -> Position:
        """Line/column (1-based) of a character offset."""
        i = bisect.bisect_right(self._line_starts, offset) - 1
        return Position(i + 1, offset - self._line_starts[i] + 1, offset)

    def line_text(self, line: int) -> str:
        """The text of a 1-based line, without its newline."""
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start : end if end >= 0 else len(self.text)]

    def locate(self, path: Path) -> Position | None:
        """Position of the value at `path`, or of its nearest existing ancestor."""
        p = tuple(path)
        while True:
            pos = self.values.get(p)
            if pos is not None:
                return pos
            if not p:
                return None
            p = p[:-1]

    def _value(self, i: int, path: Path) -> int:
        text = self.text
        self.values[path] = self.position(i)
        if i >= len(text):
            raise SourceScanError("unexpected end of text", self.position(i))
        c = text[i]
        if c == "{":
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            seen: dict[str, Position] = {}
            if text.startswith("}", i):
                return i + 1
            while True:
                m = _STRING.match(text, i)
                if not m:
                    raise SourceScanError("expected a string key", self.position(i))
                raw = m.group()
                key = raw[1:-1] if "\\" not in raw else json.loads(raw)
                kpos = self.position(i)
                if key in seen:
                    self.duplicates.append(DuplicateKey(path, key, seen[key], kpos))
                seen[key] = kpos
                self.keys[path + (key,)] = kpos
                i = _WS.match(text, m.end()).end()  # type: ignore[union-attr]
                if not text.startswith(":", i):
                    raise SourceScanError("expected `:`", self.position(i))
                i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                i = self._value(i, path + (key,))
                i = _WS.match(text, i).end()  # type: ignore[union-attr]
                if text.startswith(",", i):
                    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                    continue
                if text.startswith("}", i):
                    return i + 1
                raise SourceScanError("expected `,` or `}`", self.position(i))
        if c == "[":
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            if text.startswith("]", i):
                return i + 1
            n = 0
            while True:
                i = self._value(i, path + (n,))
                n += 1
                i = _WS.match(text, i).end()  # type: ignore[union-attr]
                if text.startswith(",", i):
                    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                    continue
                if text.startswith("]", i):
                    return i + 1
                raise SourceScanError("expected `,` or `]`", self.position(i))
        if c == '"':
            m = _STRING.match(text, i)
            if not m:
                raise SourceScanError("invalid string", self.position(i))
            return m.end()
        for lit in ("true", "false", "null"):
            if text.startswith(lit, i):
                return i + len(lit)
        m = _NUMBER.match(text, i)
        if m and m.end() > i:
            return m.end()
        raise SourceScanError(f"unexpected character {c!r}", self.position(i))
