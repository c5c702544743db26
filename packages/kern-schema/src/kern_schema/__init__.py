"""kern-schema: the kern manifest data model (schema version 4).

Public API:

- `load(path_or_bytes) -> Manifest`, `decode(str | bytes)`, `dump(manifest) -> bytes`;
  `ManifestDecodeError.issues` lists every problem (`DecodeIssue`: kind, path, message,
  line/column);
- the structs `Manifest`, `Var`, `State`, `Buffer`, `Module`, `Op`, `Impl`, `Launch`,
  `Scratch`, `Program`, `Call`, `Arg`;
- `parse_param_type` (the type grammar), `DTYPES`, `SCALARS`;
- the expression language: `Expr`, `ExprNode`, `evaluate`, `bounds`;
- `SourceMap` and `format_path` for diagnostics that point into the JSON text.
"""

from .dtypes import DTYPES, POINTER_SIZE, SCALARS, ScalarType
from .expr import Expr, ExprError, ExprNode, bounds, evaluate, to_text, variables
from .load import (
    ISSUE_KINDS,
    TOP_LEVEL_KEYS,
    DecodeIssue,
    ManifestDecodeError,
    convert,
    decode,
    dump,
    load,
    parse_json,
    to_builtins,
)
from .manifest import (
    ARG_KINDS,
    BUFFER_CLASSES,
    KERNEL_LAUNCH_FIELDS,
    LITERAL_KEYS,
    OFFSET_KINDS,
    SCHEMA_VERSION,
    Arg,
    Buffer,
    Call,
    Impl,
    Launch,
    Manifest,
    Module,
    Op,
    Program,
    Scratch,
    State,
    Var,
)
from .params import DIRECTIONS, ParamType, ParamTypeError, parse_param_type
from .source import DuplicateKey, Path, Position, SourceMap, SourceScanError, format_path

__version__ = "0.3.0"

__all__ = [
    "DTYPES", "POINTER_SIZE", "SCALARS", "ScalarType",
    "Expr", "ExprError", "ExprNode", "bounds", "evaluate", "to_text", "variables",
    "ISSUE_KINDS", "TOP_LEVEL_KEYS", "DecodeIssue", "ManifestDecodeError", "convert", "decode", "dump", "load", "parse_json", "to_builtins",
    "ARG_KINDS", "BUFFER_CLASSES", "KERNEL_LAUNCH_FIELDS", "LITERAL_KEYS", "OFFSET_KINDS", "SCHEMA_VERSION",
    "Arg", "Buffer", "Call", "Impl", "Launch", "Manifest", "Module", "Op", "Program", "Scratch", "State", "Var",
    "DIRECTIONS", "ParamType", "ParamTypeError", "parse_param_type",
    "DuplicateKey", "Path", "Position", "SourceMap", "SourceScanError", "format_path",
]
