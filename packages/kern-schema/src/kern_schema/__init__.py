"""kern-schema: the kern manifest data model (schema version 4).

Public API:

- `load(path_or_bytes) -> Manifest`, `decode(text)`, `dump(manifest) -> bytes`;
- the structs `Manifest`, `Var`, `State`, `Buffer`, `Module`, `Op`, `Impl`, `Launch`,
  `Scratch`, `Program`, `Call`, `Arg`;
- `parse_param_type` (the type grammar), `DTYPES`, `SCALARS`;
- the expression language: `Expr`, `ExprNode`, `evaluate`, `bounds`;
- `SourceMap` and `format_path` for diagnostics that point into the JSON text.
"""

from .dtypes import DTYPES, POINTER_SIZE, SCALARS, ScalarType
from .expr import Expr, ExprError, ExprNode, bounds, evaluate, to_text, variables
from .load import DecodeIssue, ManifestDecodeError, convert, decode, dump, load, parse_json, to_builtins
from .manifest import (
    BUFFER_CLASSES,
    LITERAL_KEYS,
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

__version__ = "0.1.0"

__all__ = [
    "DTYPES", "POINTER_SIZE", "SCALARS", "ScalarType",
    "Expr", "ExprError", "ExprNode", "bounds", "evaluate", "to_text", "variables",
    "DecodeIssue", "ManifestDecodeError", "convert", "decode", "dump", "load", "parse_json", "to_builtins",
    "BUFFER_CLASSES", "LITERAL_KEYS", "SCHEMA_VERSION",
    "Arg", "Buffer", "Call", "Impl", "Launch", "Manifest", "Module", "Op", "Program", "Scratch", "State", "Var",
    "DIRECTIONS", "ParamType", "ParamTypeError", "parse_param_type",
    "DuplicateKey", "Path", "Position", "SourceMap", "SourceScanError", "format_path",
]
