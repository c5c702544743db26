"""Entry points: `verify` (a decoded `Manifest`), `verify_text` (JSON text or bytes) and
`verify_path` (a file). Each returns every diagnostic and never raises on a bad manifest.

Order: root causes first — errors before warnings, and among errors the unused
declarations (E0070–E0074, often a consequence of a misspelled reference) last; within
that, by position in the text when the text is known. Diagnostics with one cause (a
buffer whose dtype no call expects, an undeclared name used many times) are folded
into the first of them (`Diagnostic.folded`, and a note naming the other sites)."""

from __future__ import annotations

import json
import os
import traceback

from kern_schema import DecodeIssue, Manifest, ManifestDecodeError, SourceMap, SourceScanError, decode

from .calls import check_calls
from .context import Context
from .dataflow import check_dataflow
from .decls import check_declarations
from .diagnostic import Diagnostic, fold, locate
from .kernels import check_kernels
from .launches import check_ops
from .pdl import check_pdl
from .usage import check_usage

_DECODE_CODES = {
    "json": "E0001",
    "duplicate_key": "E0002",
    "missing_field": "E0003",
    "unknown_field": "E0004",
    "invalid": "E0005",
}
_DECODE_HINTS = {
    "E0001": "fix the JSON syntax at this position (trailing commas and comments are not JSON)",
    "E0002": "rename or remove one of the two entries",
    "E0003": "add the field (see `kern-verify --explain E0003` and the schema)",
    "E0004": "remove the field or fix its spelling",
    "E0005": "see the schema for this field's type",
    "E0021": 'an expression is an integer, a var name, {"ceil_div": [E, int]} or {"mul": [E, int]}',
}


def verify(manifest: Manifest, source: str | bytes | SourceMap | None = None, *,
           kernels_dir: str | os.PathLike[str] | None = None) -> list[Diagnostic]:
    """Check a decoded manifest against every rule of DESIGN §3.

    Args:
        manifest: the decoded manifest.
        source: its JSON text (or a prebuilt `SourceMap`), to give diagnostics line/column.
        kernels_dir: when given, also check module files (sha256) and each launch's
            params against its cubin's parameter table.

    Returns:
        every diagnostic (errors and warnings); empty when the manifest is clean.
        Never raises on a bad manifest: an internal failure becomes an E0099 diagnostic.
    """
    ctx = Context.of(manifest)
    stages = [
        ("declarations", lambda: check_declarations(ctx)),
        ("ops", lambda: check_ops(ctx)),
        ("calls", lambda: check_dataflow(ctx, check_calls(ctx))),
        ("usage", lambda: check_usage(ctx)),
        ("pdl", lambda: check_pdl(ctx)),
    ]
    if kernels_dir is not None:
        stages.append(("kernels", lambda: check_kernels(ctx, kernels_dir)))
    for name, stage in stages:
        try:
            stage()
        except Exception as e:  # never raise on a bad manifest; say so loudly instead
            tb = traceback.extract_tb(e.__traceback__)[-1]
            ctx.r.add("E0099", (), f"internal error in the {name} rules: {type(e).__name__}: {e} "
                                   f"({os.path.basename(tb.filename)}:{tb.lineno})",
                      "this is a bug in kern-verify; please report it with the manifest")
    diags = ctx.r.items
    if diags and source is not None:
        sm = source if isinstance(source, SourceMap) else _source_map(source)
        diags = locate(diags, sm)
    return fold(_sorted(diags))


def verify_text(text: str | bytes, *, kernels_dir: str | os.PathLike[str] | None = None) -> list[Diagnostic]:
    """Decode manifest JSON and verify it. Decoding problems (not JSON, duplicate keys,
    missing/unknown fields, wrong types, unknown expression forms) become diagnostics
    E0001–E0005/E0021, all of them; the semantic rules then run only when decoding
    succeeded (a half-decoded manifest would give follow-on noise)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            return [Diagnostic("E0001", "error", (), f"not UTF-8 text: {e.reason} at byte {e.start}",
                               "a manifest is UTF-8 JSON")]
    try:
        manifest = decode(text)
    except ManifestDecodeError as e:
        return _not_a_manifest(text, e.issues) or _sorted([_from_issue(i) for i in e.issues])
    except RecursionError:
        return [Diagnostic("E0001", "error", (), "JSON nested too deeply", _DECODE_HINTS["E0001"])]
    except Exception as e:  # pragma: no cover - kern-schema should only raise ManifestDecodeError
        return [Diagnostic("E0099", "error", (), f"internal error while decoding: {type(e).__name__}: {e}",
                           "this is a bug in kern-schema/kern-verify; please report it with the manifest")]
    return verify(manifest, text, kernels_dir=kernels_dir)


def verify_path(path: str | os.PathLike[str], *, kernels_dir: str | os.PathLike[str] | None = None) -> list[Diagnostic]:
    """Read a manifest file and verify it (`verify_text`).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read()
    return verify_text(data, kernels_dir=kernels_dir)


#: A manifest's top-level fields (kern_schema.Manifest; all required).
_TOP_LEVEL = tuple(Manifest.__struct_fields__)


def _not_a_manifest(text: str, issues: list[DecodeIssue]) -> list[Diagnostic]:
    """One E0003 for a JSON object that has none of a manifest's top-level fields (another tool's JSON, such as a
    kernels directory's index, passed by mistake), instead of one E0003 per missing field and one E0004 per key it
    has. Empty when the text has at least one manifest field, or when any issue is below the top level."""
    top = {"missing_field": 0, "unknown_field": 1}  # the path's length of a top-level issue of that kind
    if any(top.get(i.kind) != len(i.path) for i in issues):
        return []
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return []
    if not isinstance(doc, dict) or any(k in doc for k in _TOP_LEVEL):
        return []
    keys = ", ".join(f"`{k}`" for k in list(doc)[:8]) + (", ..." if len(doc) > 8 else "")
    return [Diagnostic("E0003", "error", (),
                       f"not a kern manifest: it has none of a manifest's top-level fields ({', '.join(_TOP_LEVEL)})"
                       + (f"; its keys are {keys}" if doc else ""),
                       "pass the manifest's JSON file; a kernels directory (the cubins a manifest pins) goes to "
                       "`--kernels DIR`")]


def _source_map(text: str | bytes) -> SourceMap | None:
    try:
        return SourceMap.build(text)
    except (SourceScanError, UnicodeDecodeError, RecursionError):
        return None


def _from_issue(issue: DecodeIssue) -> Diagnostic:
    code = _DECODE_CODES.get(issue.kind, "E0005")
    last = issue.path[-1] if issue.path else None
    if code == "E0005" and issue.message.startswith(("an `extern` launch has only", "a kernel launch needs")):
        return _diag("E0031", issue, issue.message,
                     "a kernel launch has module, entry, params, block, grid and args; an extern launch only extern and args")
    if code == "E0005" and last == "block":
        return _diag("E0032", issue, f"malformed block: {issue.message}", "a block is [x, y, z], three integers")
    if code == "E0005" and last == "grid":
        return _diag("E0033", issue, f"malformed grid: {issue.message}", "a grid is [x, y, z], three expressions")
    if code in ("E0004", "E0005") and any(p in ("grid", "expr") for p in issue.path if isinstance(p, str)):
        code = "E0021"
        message = f"unknown or malformed expression form: {issue.message}"
    else:
        message = issue.message
    pos = issue.position
    return Diagnostic(code, "error", tuple(issue.path), message, _DECODE_HINTS.get(code),
                      pos.line if pos else None, pos.col if pos else None)


def _diag(code: str, issue: DecodeIssue, message: str, hint: str) -> Diagnostic:
    pos = issue.position
    return Diagnostic(code, "error", tuple(issue.path), message, hint, pos.line if pos else None, pos.col if pos else None)


#: Reported after the other errors: an unused declaration is often the other half of a
#: misspelled or renamed reference (`rms_nrom` in a call leaves op `rms_norm` unused).
_CONSEQUENCES = frozenset({"E0070", "E0071", "E0072", "E0073", "E0074"})


def _sorted(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Errors, then warnings; root causes before unused declarations; then by position."""
    return sorted(diags, key=lambda d: (not d.is_error, d.code in _CONSEQUENCES,
                                        d.line is None, d.line or 0, d.column or 0))
