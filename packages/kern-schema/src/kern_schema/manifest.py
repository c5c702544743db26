"""msgspec structs for the kern manifest, schema version 4 (DESIGN §2).

Every struct rejects unknown fields. Maps (`vars`, `buffers`, `ops`, ...) are
keyed by name. Type strings (`"in buffer<bf16>"`) are kept as written and
parsed by `kern_schema.params.parse_param_type`, so that a verifier can report
every malformed one instead of stopping at the first.
"""

from __future__ import annotations

import msgspec

from .expr import Expr

SCHEMA_VERSION = 4

#: Buffer classes (DESIGN §2).
BUFFER_CLASSES: tuple[str, ...] = ("input", "output", "weight", "workspace", "carry")

#: Keys of typed literal arguments: `{"i32": 6144}`.
LITERAL_KEYS: tuple[str, ...] = ("i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f32", "f64")

_ARG_KINDS: tuple[str, ...] = ("param", "scratch", "buf", "state", "var", "expr") + LITERAL_KEYS
_OFFSET_KINDS = frozenset(("scratch", "buf", "state"))

Number = int | float


class _Base(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class Var(_Base, kw_only=True):
    """A scalar the caller supplies at each run, bounded by [min, max] (min defaults to 1)."""

    min: int = 1
    max: int


class State(_Base, kw_only=True):
    """Persistent opaque memory: exactly one of `bytes_per_token` / `bytes_per_seq`.

    `align` is the allocation's alignment in bytes (a power of two, default 256).
    """

    bytes_per_token: int | None = None
    bytes_per_seq: int | None = None
    align: int = 256


class Buffer(_Base, kw_only=True):
    """A typed tensor: `dtype`, `shape` (ints or var names) and class (`input`, `output`,
    `weight`, `workspace`, `carry`)."""

    dtype: str
    shape: list[int | str]
    class_: str = msgspec.field(name="class")


class Module(_Base, kw_only=True):
    """Where a cubin comes from: `source` is relative to the kernels directory (no absolute
    path, no `..`) or `hf:org/repo/path`; `sha256` pins its content (64 hex digits)."""

    source: str
    sha256: str | None = None


class Scratch(_Base, kw_only=True):
    """Memory private to an op's impl: `dtype` and `shape` (ints or var names)."""

    dtype: str
    shape: list[int | str]


class Arg(_Base, kw_only=True):
    """One argument, of exactly one form:

    - `{"param": i}`: forward interface param i (launch args only);
    - `{"scratch": name, "offset": bytes}`: the impl's scratch (launch args only);
    - `{"buf": name, "offset": bytes}` / `{"state": name, "offset": bytes}` (call args only);
    - `{"var": name}`; `{"expr": E}`; a typed literal `{"i32": 6144}`, `{"f32": 1e-6}` ...
    """

    param: int | None = None
    scratch: str | None = None
    buf: str | None = None
    state: str | None = None
    var: str | None = None
    expr: Expr | None = None
    offset: int | None = None
    i8: int | None = None
    u8: int | None = None
    i16: int | None = None
    u16: int | None = None
    i32: int | None = None
    u32: int | None = None
    i64: int | None = None
    u64: int | None = None
    f32: Number | None = None
    f64: Number | None = None

    def __post_init__(self) -> None:
        set_kinds = [k for k in _ARG_KINDS if getattr(self, k) is not None]
        if len(set_kinds) != 1:
            if not set_kinds:
                raise ValueError(
                    "an argument needs exactly one of: " + ", ".join(_ARG_KINDS)
                )
            raise ValueError(
                "an argument has exactly one form, this one has " + ", ".join(f"`{k}`" for k in set_kinds)
            )
        if self.offset is not None and set_kinds[0] not in _OFFSET_KINDS:
            raise ValueError(f"`offset` applies to buf, state and scratch arguments, not to `{set_kinds[0]}`")
        for k in ("i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"):
            if isinstance(getattr(self, k), bool):
                raise ValueError(f"`{k}` literal must be an integer, not a boolean")

    @property
    def kind(self) -> str:
        """The form of this argument: "param", "scratch", "buf", "state", "var", "expr"
        or a literal key ("i32", "f32", ...)."""
        for k in _ARG_KINDS:
            if getattr(self, k) is not None:
                return k
        raise AssertionError("unreachable: validated in __post_init__")

    @property
    def literal(self) -> Number | None:
        """The literal value when this is a typed literal, else None."""
        for k in LITERAL_KEYS:
            v = getattr(self, k)
            if v is not None:
                return v
        return None


class Launch(_Base, kw_only=True):
    """One step of an impl: a kernel launch or a runtime built-in (`extern`).

    Kernel launch: `module`, `entry` (cubin symbol), `params` (the kernel's real parameter
    list, type strings), `block` [x, y, z], `grid` [E, E, E], `shared_mem` (dynamic
    shared memory, bytes), `args`. Built-in: `extern` (e.g. `cublaslt.gemm_bf16_tn`) and
    `args` only.
    """

    module: str | None = None
    entry: str | None = None
    params: list[str] | None = None
    block: list[int] | None = None
    grid: list[Expr] | None = None
    shared_mem: int | None = None
    extern: str | None = None
    args: list[Arg]

    @property
    def is_extern(self) -> bool:
        return self.extern is not None


class Impl(_Base, kw_only=True):
    """An op's implementation: private scratch and an ordered list of launches."""

    scratch: dict[str, Scratch] = msgspec.field(default_factory=dict)
    launches: list[Launch]


class Op(_Base, kw_only=True):
    """An interface (`params`, type strings) plus its implementation (`impl`)."""

    params: list[str]
    impl: Impl


class Call(_Base, kw_only=True):
    """One call of a program: a `label` unique in the program, an `op` name and its args."""

    label: str
    op: str
    args: list[Arg]


class Program(_Base, kw_only=True):
    """An ordered list of calls (e.g. `prefill`, `decode`)."""

    calls: list[Call]


class Manifest(_Base, kw_only=True):
    """A whole manifest. All top-level keys are required."""

    schema_version: int
    model: str
    vars: dict[str, Var]
    states: dict[str, State]
    buffers: dict[str, Buffer]
    modules: dict[str, Module]
    ops: dict[str, Op]
    programs: dict[str, Program]
