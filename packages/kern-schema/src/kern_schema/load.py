"""Loading and dumping manifests.

`load`/`decode` turn JSON into a `Manifest`, refusing duplicated object keys
(JSON's "last one wins" would silently drop a declaration) and the non-JSON
numbers `NaN`/`Infinity`. On failure `ManifestDecodeError.issues` lists
*every* problem, each with its full path (``ops.rms_norm.impl.launches[0].args[2]``)
and line/column: every unknown field, every missing field, every value of the
wrong type or form, every duplicated key.

Two paths:

- fast (valid manifests, the common case): msgspec decodes the bytes untyped
  (C); duplicated keys are detected by comparing the number of `:` in the text
  with that of the re-encoded document (exact when the text has no ``\\u``
  escapes: every member dropped by "last one wins" takes at least its own `:`
  with it, and `:` inside strings is written the same way in both); then
  msgspec converts the document into `Manifest` (C, plus one small
  `__post_init__` per argument). About 10 ms for a 1,000-call manifest on a
  2-core machine (`tools/bench_schema.py`).
- slow (invalid input, or text with ``\\u`` escapes): `json` with a
  duplicate-refusing hook, then the localizer (`_localize`) walks the document
  against the struct types, and `SourceMap` adds line/column.

`dump` writes deterministic, indented JSON: struct fields in their declared
order, maps in insertion order, defaults omitted.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from .manifest import Manifest
from .source import Path, Position, SourceMap, SourceScanError, format_path

TOP_LEVEL_KEYS: tuple[str, ...] = tuple(f.encode_name for f in msgspec.structs.fields(Manifest))

#: `DecodeIssue.kind` values.
ISSUE_KINDS: tuple[str, ...] = ("json", "duplicate_key", "missing_field", "unknown_field", "invalid")


@dataclass(frozen=True, slots=True)
class DecodeIssue:
    """One problem found while decoding.

    Attributes:
        kind: "json" (not JSON at all, or NaN/Infinity), "duplicate_key",
            "missing_field", "unknown_field" or "invalid" (wrong type or form).
        path: where in the document: for "unknown_field" and "duplicate_key" the
            path of the offending key, for "missing_field" the path of the object
            that lacks it, otherwise the path of the bad value.
        message: what is wrong (names the field for missing/unknown fields).
        position: line/column in the text, when known (the key's position for
            unknown and duplicated keys).
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
    """The text is not a well-formed manifest.

    Attributes:
        issues: every problem found, in document order when positions are known.
        source: the `SourceMap` of the text when it was scannable JSON, else None.
    """

    def __init__(self, issues: list[DecodeIssue], source: SourceMap | None = None):
        self.issues = issues
        self.source = source
        head = f"{len(issues)} problem(s) decoding the manifest"
        super().__init__(head + ":\n" + "\n".join(f"  {i}" for i in issues))


class _DuplicateKey(Exception):
    pass


class _NotJSONConstant(Exception):
    pass


class _OutOfRange(str):
    """A JSON number too large for a float64 (e.g. `1e400`), or an integer with more digits
    than Python converts (`sys.get_int_max_str_digits()`, 4300), kept as its text so that
    the localizer can report it with its path."""

    def describe(self) -> str:
        if any(c in self for c in ".eE"):
            return f"number `{self}` is out of range (not a finite float64)"
        shown = self if len(self) <= 24 else f"{self[:12]}...{self[-6:]}"
        return f"integer `{shown}` ({len(self.lstrip('-'))} digits) is out of range"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _DuplicateKey
    return d


def _parse_constant(name: str) -> Any:
    raise _NotJSONConstant(name)


def _parse_float(s: str) -> Any:
    f = float(s)
    return f if math.isfinite(f) else _OutOfRange(s)


#: Integers up to this many digits are converted (Python's default conversion limit is
#: 4300 digits; no manifest value comes near: int64 has 19).
_MAX_INT_DIGITS = 4000


def _parse_int(s: str) -> Any:
    return int(s) if len(s) <= _MAX_INT_DIGITS else _OutOfRange(s)


def _read(src: str | os.PathLike[str] | bytes) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    with open(src, "rb") as f:
        return f.read()


def _text(data: str | bytes) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestDecodeError(
            [DecodeIssue("json", (), f"not UTF-8 text: invalid byte at offset {e.start}")]
        ) from None


def _scan_position(text: str) -> Position | None:
    try:
        SourceMap.build(text)
    except SourceScanError as e:
        return e.position
    return None


def parse_json(text: str | bytes) -> Any:
    """Parse JSON text into plain dicts/lists, refusing duplicated keys and NaN/Infinity.

    Numbers too large for a float64 (`1e400`) and integers of thousands of digits are kept
    as an `_OutOfRange` marker that `convert` reports with its path.

    Raises:
        ManifestDecodeError: invalid JSON, NaN/Infinity (kind "json", with line/column),
            or duplicated keys (one "duplicate_key" issue per duplicate, at the second
            occurrence, the message naming the first).
    """
    text = _text(text)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_parse_constant,
                          parse_float=_parse_float, parse_int=_parse_int)
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
    except _NotJSONConstant as e:
        raise ManifestDecodeError(
            [DecodeIssue("json", (), f"not valid JSON: `{e}` is not a JSON number", _scan_position(text))]
        ) from None
    except json.JSONDecodeError as e:
        raise ManifestDecodeError(
            [DecodeIssue("json", (), f"not valid JSON: {e.msg}", Position(e.lineno, e.colno, e.pos))]
        ) from None
    except RecursionError:
        raise ManifestDecodeError([DecodeIssue("json", (), "not valid JSON: nested too deeply")]) from None
    except ValueError as e:  # pragma: no cover - defensive: json.loads raising another ValueError
        raise ManifestDecodeError([DecodeIssue("json", (), f"not valid JSON: {e}")]) from None


def load(src: str | os.PathLike[str] | bytes) -> Manifest:
    """Load a manifest from a file path (str or PathLike) or from JSON bytes.

    Raises:
        ManifestDecodeError: invalid JSON, duplicated keys, unknown or missing fields,
            values of the wrong type or form; every problem is listed with its path
            and line/column.
        OSError: the file cannot be read.
    """
    return decode(_read(src))


_untyped_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def decode(text: str | bytes) -> Manifest:
    """Decode manifest JSON (str, or UTF-8 bytes) into a `Manifest` (see `load`).

    Raises:
        ManifestDecodeError: as `load`.
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if b"\\u" not in data:
        try:
            obj = _untyped_decoder.decode(data)
        except (msgspec.DecodeError, RecursionError):
            pass  # not JSON, a number out of range, too deep: the slow path says where
        else:
            if data.count(b":") == _encoder.encode(obj).count(b":"):
                return convert(obj, data)
    return convert(parse_json(data), data)


def convert(obj: Any, text: str | bytes | None = None) -> Manifest:
    """Convert a parsed JSON document (plain dicts/lists, as `parse_json` returns) into a
    `Manifest`.

    `obj` cannot carry duplicated keys; use `decode` on text to have them refused.

    Raises:
        ManifestDecodeError: one issue per malformed entry, with line/column when `text`
            (the JSON the document was parsed from) is given.
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
            sm = SourceMap.build(_text(text))
        except (SourceScanError, ManifestDecodeError):
            sm = None
    if sm is not None:
        issues = [
            DecodeIssue(
                i.kind, i.path, i.message,
                (sm.keys.get(i.path) if i.kind == "unknown_field" else None) or sm.locate(i.path),
            )
            for i in issues
        ]
        issues.sort(key=lambda i: i.position.offset if i.position is not None else -1)
    raise ManifestDecodeError(issues, sm)


# ---------------------------------------------------------------------------- localizer


def _strip_at(message: str) -> str:
    head, sep, _ = message.rpartition(" - at `$")
    return head if sep else message


def _unwrap(tp: Any) -> Any:
    """`Annotated[T, ...]` → T (constraints are checked by the msgspec call on the original)."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _json_kind(obj: Any) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, (int, float)):
        return "number"
    if isinstance(obj, str):
        return "string"
    if isinstance(obj, list):
        return "array"
    return "object"


#: How messages name a struct whose class name means nothing to a manifest's author.
_STRUCT_NAMES = {"ExprNode": "expression object"}


def _a(tp: type) -> str:
    """`a Launch`, `an Op`, `an expression object`: a struct named with its article."""
    name = _STRUCT_NAMES.get(tp.__name__, tp.__name__)
    return ("an " if name[0].lower() in "aeiou" else "a ") + name


def _struct_issues(obj: dict[str, Any], tp: type[msgspec.Struct], path: Path) -> list[DecodeIssue]:
    fields = {f.encode_name: f for f in msgspec.structs.fields(tp)}
    issues: list[DecodeIssue] = []
    for key, value in obj.items():
        f = fields.get(key)
        if f is None:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            issues.append(DecodeIssue(
                "unknown_field", path + (key,),
                f"unknown field `{key}` ({_a(tp)} has: {', '.join(fields)}){hint}",
            ))
        else:
            issues.extend(_localize(value, f.type, path + (key,)))
    for name, f in fields.items():
        if f.required and name not in obj:
            issues.append(DecodeIssue(
                "missing_field", path, f"missing required field `{name}` ({_a(tp)} needs: "
                + ", ".join(n for n, g in fields.items() if g.required) + ")",
            ))
    return issues


def _localize(obj: Any, tp: Any, path: Path) -> typing.Iterator[DecodeIssue]:
    """Yield every innermost validation failure of `obj` against type `tp`, with its path.

    Containers are descended (struct fields, map values, list items); an issue is reported
    at the deepest level where msgspec fails and no part below it fails on its own
    (e.g. an argument with two forms is reported at the argument).
    """
    if isinstance(obj, _OutOfRange):
        yield DecodeIssue("invalid", path, obj.describe())
        return
    try:
        msgspec.convert(obj, tp, strict=True)
        return
    except msgspec.ValidationError as e:
        message = _strip_at(str(e))
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        # descend into the one member that has the JSON shape of obj
        for member in args:
            bare = _unwrap(member)
            m_origin = typing.get_origin(bare)
            if (isinstance(obj, dict) and (_is_struct(bare) or m_origin is dict)) or (
                isinstance(obj, list) and m_origin in (list, tuple)
            ):
                yield from _localize(obj, member, path)  # keep Annotated constraints
                return
    elif _is_struct(tp) and isinstance(obj, dict):
        issues = _struct_issues(obj, tp, path)
        if issues:
            yield from issues
            return
    elif origin is dict and isinstance(obj, dict):
        _, vt = args
        found = False
        for k, v in obj.items():
            for issue in _localize(v, vt, path + (k,)):
                found = True
                yield issue
        if found:
            return
    elif origin is list and isinstance(obj, list):
        (vt,) = args
        found = False
        for i, v in enumerate(obj):
            for issue in _localize(v, vt, path + (i,)):
                found = True
                yield issue
        if found:
            return
    elif origin is tuple and isinstance(obj, list) and args and args[-1] is not Ellipsis and len(obj) == len(args):
        found = False
        for i, (v, t) in enumerate(zip(obj, args)):
            for issue in _localize(v, t, path + (i,)):
                found = True
                yield issue
        if found:
            return
    yield DecodeIssue("invalid", path, _explain(message, obj, tp))


def _explain(message: str, obj: Any, tp: Any) -> str:
    """Make msgspec's message about `obj` more helpful: drop `| null` (an optional field is
    never usefully null), name the struct, show the offending scalar."""
    if message.startswith("Expected `object`") and _is_struct(tp):
        return f"expected an object ({_a(tp)}), got {_json_kind(obj)}"
    message = message.replace(" | null`", "`")
    if message.startswith("Expected `array` of length") and isinstance(obj, list) and ", got" not in message:
        return f"{message}, got {len(obj)} entries"
    if message.startswith("Expected") and isinstance(obj, (bool, int, float, str)):
        shown = json.dumps(obj) if not isinstance(obj, int) or abs(obj) < 10**40 else f"{obj:.3e}"
        if len(shown) > 40:
            shown = shown[:37] + "..."
        return f"{message} ({shown})"
    return message


# ---------------------------------------------------------------------------- dump


def dump(manifest: Manifest) -> bytes:
    """Serialize deterministically: indented JSON (1 space), struct fields in declared order,
    maps in insertion order, default values omitted, a trailing newline. UTF-8 bytes."""
    return msgspec.json.format(_encoder.encode(manifest), indent=1) + b"\n"


def to_builtins(manifest: Manifest) -> dict[str, Any]:
    """The manifest as plain JSON data (dicts, lists, str, int, float): exactly what `dump`
    writes, defaults omitted."""
    return _untyped_decoder.decode(_encoder.encode(manifest))
