"""Loading and dumping manifests.

`load` parses JSON, refuses duplicated object keys, and converts the document
into `Manifest` structs entry by entry, so that *every* malformed entry is
reported (`ManifestDecodeError.issues`), each with its full path
(``ops.rms_norm.impl.launches[0].args[2]``) and, from the `SourceMap`, line and
column. `dump` writes deterministic, indented JSON: struct fields in their
declared order, maps in insertion order, defaults omitted.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass
from typing import Any, Union

import msgspec

from .manifest import Manifest
from .source import Path, Position, SourceMap, SourceScanError, format_path

TOP_LEVEL_KEYS: tuple[str, ...] = tuple(f.encode_name for f in msgspec.structs.fields(Manifest))


@dataclass(frozen=True, slots=True)
class DecodeIssue:
    """One problem found while decoding.

    Attributes:
        kind: "json" (not JSON at all), "duplicate_key", "missing_field",
            "unknown_field" or "invalid" (wrong type or form).
        path: where in the document.
        message: what is wrong.
        position: line/column in the text, when known.
    """

    kind: str
    path: Path
    message: str
    position: Position | None = None

    def __str__(self) -> str:
        where = format_path(self.path)
        if self.position is not None:
            where += f" (line {self.position.line}, column {self.position.col})"
        return f"{where}: {self.message}"


class ManifestDecodeError(ValueError):
    """The text is not a well-formed manifest. `issues` lists every problem found;
    `source` is the SourceMap when the text was valid JSON."""

    def __init__(self, issues: list[DecodeIssue], source: SourceMap | None = None):
        self.issues = issues
        self.source = source
        head = f"{len(issues)} problem(s) decoding the manifest"
        super().__init__(head + ":\n" + "\n".join(f"  {i}" for i in issues))


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _DuplicateKey
    return d


def _read(src: str | os.PathLike[str] | bytes) -> str:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src).decode("utf-8")
    with open(src, encoding="utf-8") as f:
        return f.read()


def parse_json(text: str) -> Any:
    """Parse JSON text, refusing duplicated keys.

    Raises:
        ManifestDecodeError: invalid JSON (kind "json") or duplicated keys (one issue per
            duplicate, with the path of the object and both positions).
    """
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey:
        sm = SourceMap.build(text)
        issues = [
            DecodeIssue(
                "duplicate_key",
                d.path + (d.key,),
                f"duplicate key `{d.key}` (first at line {d.first.line}, column {d.first.col}): "
                "every name must be unique, JSON's 'last one wins' is refused",
                d.second,
            )
            for d in sm.duplicates
        ]
        raise ManifestDecodeError(issues, sm) from None
    except json.JSONDecodeError as e:
        raise ManifestDecodeError(
            [DecodeIssue("json", (), f"not valid JSON: {e.msg}", Position(e.lineno, e.colno, e.pos))]
        ) from None
    except RecursionError:
        raise ManifestDecodeError([DecodeIssue("json", (), "JSON nested too deeply")]) from None


def load(src: str | os.PathLike[str] | bytes) -> Manifest:
    """Load a manifest from a file path or from JSON bytes.

    Raises:
        ManifestDecodeError: invalid JSON, duplicated keys, unknown or missing fields,
            values of the wrong type; every problem is listed with its path.
        OSError: the file cannot be read.
    """
    return decode(_read(src))


def decode(text: str) -> Manifest:
    """Decode manifest JSON text (see `load`)."""
    obj = parse_json(text)
    return convert(obj, text)


def convert(obj: Any, text: str | None = None) -> Manifest:
    """Convert a parsed JSON document into a `Manifest`.

    Raises:
        ManifestDecodeError: one issue per malformed entry, with positions when `text`
            is given.
    """
    try:
        return msgspec.convert(obj, Manifest, strict=True)
    except msgspec.ValidationError:
        pass
    issues = list(_localize(obj, Manifest, ()))
    if not issues:  # pragma: no cover - msgspec and the localizer disagree
        issues = [DecodeIssue("invalid", (), "the document is not a valid manifest")]
    sm = None
    if text is not None:
        try:
            sm = SourceMap.build(text)
        except SourceScanError:
            sm = None
    if sm is not None:
        issues = [
            DecodeIssue(i.kind, i.path, i.message, sm.keys.get(i.path) or sm.locate(i.path)) for i in issues
        ]
    raise ManifestDecodeError(issues, sm)


def _classify(message: str) -> str:
    if message.startswith("Object contains unknown field"):
        return "unknown_field"
    if message.startswith("Object missing required field"):
        return "missing_field"
    return "invalid"


def _strip_at(message: str) -> str:
    head, sep, _ = message.rpartition(" - at `$")
    return head if sep else message


_HINTS = {
    "unknown_field": " (unknown fields are refused everywhere; check the spelling against the schema)",
}


def _localize(obj: Any, tp: Any, path: Path) -> typing.Iterator[DecodeIssue]:
    """Yield every innermost validation failure of `obj` against type `tp`, with its path."""
    try:
        msgspec.convert(obj, tp, strict=True)
        return
    except msgspec.ValidationError as e:
        message = str(e)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or origin is getattr(__import__("types"), "UnionType", None):
        # descend into the one member that has the JSON shape of obj
        for member in args:
            if isinstance(obj, dict) and isinstance(member, type) and issubclass(member, msgspec.Struct):
                yield from _localize(obj, member, path)
                return
            if isinstance(obj, list) and typing.get_origin(member) in (list, tuple):
                yield from _localize(obj, member, path)
                return
    elif isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(obj, dict):
        found = False
        for f in msgspec.structs.fields(tp):
            if f.encode_name in obj:
                for issue in _localize(obj[f.encode_name], f.type, path + (f.encode_name,)):
                    found = True
                    yield issue
        if found:
            return
        inner = _strip_at(message)
        kind = _classify(inner)
        sub = path
        if kind == "unknown_field":
            name = inner.split("`")[1] if "`" in inner else None
            if name is not None:
                sub = path + (name,)
        yield DecodeIssue(kind, sub, inner + _HINTS.get(kind, ""))
        return
    elif origin is dict and isinstance(obj, dict):
        _, vt = args
        for k, v in obj.items():
            yield from _localize(v, vt, path + (k,))
        return
    elif origin is list and isinstance(obj, list):
        (vt,) = args
        for i, v in enumerate(obj):
            yield from _localize(v, vt, path + (i,))
        return
    elif origin is tuple and isinstance(obj, list) and args and args[-1] is not Ellipsis and len(obj) == len(args):
        found = False
        for i, (v, t) in enumerate(zip(obj, args)):
            for issue in _localize(v, t, path + (i,)):
                found = True
                yield issue
        if found:
            return
    inner = _strip_at(message)
    yield DecodeIssue(_classify(inner), path, inner)


def dump(manifest: Manifest) -> bytes:
    """Serialize deterministically: indented JSON (1 space), struct fields in declared order,
    maps in insertion order, default values omitted, a trailing newline."""
    return msgspec.json.format(msgspec.json.encode(manifest), indent=1) + b"\n"


def to_builtins(manifest: Manifest) -> dict[str, Any]:
    """The manifest as plain dicts/lists (what `dump` writes)."""
    return msgspec.to_builtins(manifest)
