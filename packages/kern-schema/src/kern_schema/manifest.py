"""msgspec structs for the kern manifest, schema version 4 (DESIGN §2).

Every struct rejects unknown fields. Maps (`vars`, `buffers`, `ops`, ...) are
keyed by name. The structs check the *form* of the document (types, which
keys go together, exactly one form per argument, three launch dimensions);
the *meaning* (known dtypes, names that resolve, value ranges, sha256 syntax)
is `kern-verify`'s job, so that it can report every problem with a stable
code. Type strings (`"in buffer<bf16>"`) are kept as written and parsed by
`kern_schema.params.parse_param_type` for the same reason.

The JSON Schema (`kern-schema json-schema`) is stricter than decoding where it
helps an editor: it lists the known dtypes, buffer classes and the sha256
pattern (as `extra_json_schema`, not enforced by decoding).

All structs are `gc=False` (a manifest is a tree, never a cycle): decoding is
faster and the garbage collector never scans them.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from .dtypes import DTYPES, SCALARS
from .expr import Expr

SCHEMA_VERSION = 4

#: Buffer classes (DESIGN §2).
BUFFER_CLASSES: tuple[str, ...] = ("input", "output", "weight", "workspace", "carry")

#: Keys of typed literal arguments: `{"i32": 6144}`.
LITERAL_KEYS: tuple[str, ...] = ("i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f32", "f64")

#: Every argument form, in the order of `Arg`'s fields (`offset` is not a form).
ARG_KINDS: tuple[str, ...] = ("param", "scratch", "buf", "state", "var", "expr") + LITERAL_KEYS
_ARG_KINDS = ARG_KINDS  # backwards-compatible private alias
#: Argument forms that may carry an `offset`.
OFFSET_KINDS: frozenset[str] = frozenset(("scratch", "buf", "state"))
_OFFSET_KINDS = OFFSET_KINDS

#: Launch fields of the kernel form (the first five required there, `shared_mem` and `carveout`
#: optional; all absent in the extern form). The `pdl` flag (default false) is not among them:
#: kern-verify refuses `"pdl": true` on an extern launch with its own code.
KERNEL_LAUNCH_FIELDS: tuple[str, ...] = ("module", "entry", "params", "block", "grid", "shared_mem", "carveout")

Number = int | float

#: The param type grammar as a JSON Schema pattern: what `kern_schema.params.parse_param_type` accepts, whitespace
#: around and between the words included (it splits on whitespace); a test checks the two agree.
_PARAM_TYPE_PATTERN = (
    r"^\s*(?:(?:in|out|inout)\s+(?:ptr|buffer<(?:" + "|".join(DTYPES) + r")>)"
    r"|" + "|".join(SCALARS) + r")\s*$"
)
_NAME = Meta(description="A name declared in this manifest.")
ParamTypeStr = Annotated[
    str,
    Meta(
        description="A parameter type: `in|out|inout buffer<dtype>`, `in|out|inout ptr` or a scalar "
        "(i8 u8 i16 u16 i32 u32 i64 u64 f32 f64).",
        examples=["in buffer<bf16>", "inout ptr", "i32"],
        extra_json_schema={"pattern": _PARAM_TYPE_PATTERN},
    ),
]
DTypeStr = Annotated[
    str,
    Meta(description="Element type.", extra_json_schema={"enum": list(DTYPES)}),
]
Shape = Annotated[
    list[int | str],
    Meta(description="Dimensions: each an int or the name of a var (sized at the var's max)."),
]
Dim3 = Annotated[list[int], Meta(min_length=3, max_length=3, description="[x, y, z]")]
Grid3 = Annotated[
    list[Expr],
    Meta(min_length=3, max_length=3, description="[x, y, z], each an expression over vars."),
]


def _map(description: str) -> Meta:
    return Meta(description=description)


class _Base(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):
    pass


class Var(_Base, kw_only=True):
    """A scalar the caller supplies at each run, bounded by [min, max] (min defaults to 1)."""

    min: int = 1
    max: int


class State(_Base, kw_only=True):
    """Persistent opaque memory: exactly one of `bytes_per_token` / `bytes_per_seq`.

    `align` is the allocation's alignment in bytes (a power of two, default 256).
    """

    bytes_per_token: Annotated[int, Meta(description="Bytes per token of capacity.")] | None = None
    bytes_per_seq: Annotated[int, Meta(description="Bytes per sequence (seqs.max of them).")] | None = None
    align: Annotated[int, Meta(description="Alignment in bytes, a power of two.")] = 256


class Buffer(_Base, kw_only=True):
    """A typed tensor: `dtype`, `shape` (ints or var names) and class (`input`, `output`,
    `weight`, `workspace`, `carry`)."""

    dtype: DTypeStr
    shape: Shape
    class_: Annotated[
        str,
        Meta(
            description="input: caller writes before a run; output: caller reads after; weight: bound "
            "by name from the weights file; workspace: runtime-planned, not kept; carry: kept between "
            "runs, written by one program and read by another.",
            extra_json_schema={"enum": list(BUFFER_CLASSES)},
        ),
    ] = msgspec.field(name="class")


class Module(_Base, kw_only=True):
    """Where a cubin comes from: `source` is relative to the kernels directory (no absolute
    path, no `..`) or `hf:org/repo/path`; `sha256` pins its content (64 hex digits)."""

    source: Annotated[
        str,
        Meta(description="Path relative to the kernel directory, or `hf:org/repo/path`.",
             examples=["rms_norm.cubin", "hf:kernels-community/activation/build/x/_activation.abi3.so"]),
    ]
    sha256: Annotated[
        str,
        Meta(description="SHA-256 of the file, 64 lowercase hex digits (mandatory for `hf:` sources).",
             extra_json_schema={"pattern": "^[0-9a-f]{64}$"}),
    ] | None = None


class Scratch(_Base, kw_only=True):
    """Memory private to an op's impl: `dtype` and `shape` (ints or var names)."""

    dtype: DTypeStr
    shape: Shape


def _arg_forms(arg: "Arg") -> list[str]:
    return [k for k in ARG_KINDS if getattr(arg, k) is not None]


class Arg(_Base, kw_only=True):
    """One argument, of exactly one form:

    - `{"param": i}`: forward interface param i (launch args only);
    - `{"scratch": name, "offset": bytes}`: the impl's scratch (launch args only);
    - `{"buf": name, "offset": bytes}` / `{"state": name, "offset": bytes}` (call args only);
    - `{"var": name}`; `{"expr": E}`; a typed literal `{"i32": 6144}`, `{"f32": 1e-6}` ...

    `offset` (bytes, default 0) applies to scratch, buf and state only. Integer literals
    are Python ints of any size (the verifier checks the range); `f32`/`f64` literals
    accept JSON integers and are stored as floats.

    Raises (on construction and decoding): `ValueError` when no form or several are given,
    or `offset` goes with another form.
    """

    param: Annotated[int, Meta(description="Index of the op's interface param to forward.")] | None = None
    scratch: str | None = None
    buf: str | None = None
    state: str | None = None
    var: str | None = None
    expr: Expr | None = None
    offset: Annotated[int, Meta(description="Byte offset from the start (default 0).")] | None = None
    i8: int | None = None
    u8: int | None = None
    i16: int | None = None
    u16: int | None = None
    i32: int | None = None
    u32: int | None = None
    i64: int | None = None
    u64: int | None = None
    f32: float | None = None
    f64: float | None = None

    def __post_init__(self) -> None:
        # Hot path of decoding (one call per argument): count Nones in C.
        # Fields: 16 forms + offset = 17.
        if self.offset is None:
            if msgspec.structs.astuple(self).count(None) == 16:
                return
        elif msgspec.structs.astuple(self).count(None) == 15 and (
            self.buf is not None or self.state is not None or self.scratch is not None
        ):
            return
        forms = _arg_forms(self)
        if not forms:
            raise ValueError("an argument needs exactly one of: " + ", ".join(ARG_KINDS))
        if len(forms) > 1:
            raise ValueError(
                "an argument has exactly one form, this one has " + ", ".join(f"`{k}`" for k in forms)
            )
        raise ValueError(f"`offset` applies to buf, state and scratch arguments, not to `{forms[0]}`")

    @property
    def kind(self) -> str:
        """The form of this argument: "param", "scratch", "buf", "state", "var", "expr"
        or a literal key ("i32", "f32", ...)."""
        t = msgspec.structs.astuple(self)
        for k, v in zip(ARG_KINDS, t[:6] + t[7:]):
            if v is not None:
                return k
        raise AssertionError("unreachable: validated in __post_init__")

    @property
    def literal(self) -> Number | None:
        """The literal value when this is a typed literal, else None."""
        for v in msgspec.structs.astuple(self)[7:]:
            if v is not None:
                return v
        return None


#: An argument in a list: the JSON Schema adds "one form (+ offset)" as 1-2 properties.
ArgItem = Annotated[Arg, Meta(extra_json_schema={"minProperties": 1, "maxProperties": 2})]


class Launch(_Base, kw_only=True):
    """One step of an impl: a kernel launch or a runtime built-in (`extern`).

    Kernel launch: `module`, `entry` (cubin symbol), `params` (the kernel's real parameter
    list, type strings), `block` [x, y, z], `grid` [E, E, E], optional `shared_mem`
    (dynamic shared memory, bytes), optional `carveout` (the preferred shared-memory carveout,
    percent), optional `pdl` (programmatic dependent launch, default false; omitted from `dump`
    when false), `args`. Built-in: `extern` (e.g.
    `cublaslt.gemm_bf16_tn`) and `args` only (`"pdl": true` on a built-in decodes, and
    kern-verify refuses it with its own code, E0090).

    Raises (on construction and decoding): `ValueError` when the fields mix the two forms
    or the kernel form lacks one of module, entry, params, block, grid.
    """

    module: Annotated[str, _NAME] | None = None
    entry: Annotated[str, Meta(description="The cubin's entry symbol, mangled as it is.")] | None = None
    params: list[ParamTypeStr] | None = None
    block: Dim3 | None = None
    grid: Grid3 | None = None
    shared_mem: Annotated[int, Meta(description="Dynamic shared memory in bytes (≤ 232448).")] | None = None
    carveout: Annotated[
        int,
        Meta(description="The launch's preferred shared-memory carveout (kernel launches only; absent: the "
             "driver's choice, which maximizes the kernel's own occupancy): percent 0..100 of the device's maximum "
             "shared memory per SM, CUDA's CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT. 0 asks for the "
             "smallest shared-memory configuration that fits the launch's blocks, i.e. the most L1; 100 for the "
             "most shared memory. A hint: the driver rounds it to a supported configuration and raises it where a "
             "block needs more. An SM runs one configuration at a time, so a launch's configuration also sets the "
             "L1 of whatever runs beside it on that SM."),
    ] | None = None
    pdl: Annotated[
        bool,
        Meta(description="Programmatic dependent launch (kernel launches only; default false): the launch may "
             "begin before the previous launch of the program completes. The kernel promises to execute "
             "`griddepcontrol.wait` in every block before it reads anything an earlier launch wrote, and to "
             "write nothing before it."),
    ] = False
    extern: Annotated[
        str,
        Meta(description="A runtime built-in instead of a kernel.",
             examples=["cublaslt.gemm_bf16_tn", "cublaslt.gemm_bf16_tn_acc"]),
    ] | None = None
    args: list[ArgItem]

    def __post_init__(self) -> None:
        if self.extern is not None:
            mixed = [k for k in KERNEL_LAUNCH_FIELDS if getattr(self, k) is not None]
            if mixed:
                raise ValueError(
                    "an `extern` launch has only `extern` and `args`; remove "
                    + ", ".join(f"`{k}`" for k in mixed)
                )
            return
        missing = [k for k in KERNEL_LAUNCH_FIELDS[:5] if getattr(self, k) is None]
        if missing:
            raise ValueError(
                "a kernel launch needs " + ", ".join(f"`{k}`" for k in missing)
                + " (or is an `extern` built-in with `args` only)"
            )

    @property
    def is_extern(self) -> bool:
        """True for a runtime built-in (`extern`), False for a kernel launch."""
        return self.extern is not None


class Impl(_Base, kw_only=True):
    """An op's implementation: private scratch and an ordered list of launches."""

    scratch: dict[str, Scratch] = msgspec.field(default_factory=dict)
    launches: list[Launch]


class Op(_Base, kw_only=True):
    """An interface (`params`, type strings) plus its implementation (`impl`)."""

    params: list[ParamTypeStr]
    impl: Impl


class Call(_Base, kw_only=True):
    """One call of a program: a `label` unique in the program, an `op` name and its args."""

    label: Annotated[str, Meta(description="Unique within the program; names the call in diagnostics.")]
    op: Annotated[str, _NAME]
    args: list[ArgItem]


class Program(_Base, kw_only=True):
    """An ordered list of calls (e.g. `prefill`, `decode`)."""

    calls: list[Call]


class Manifest(_Base, kw_only=True):
    """A whole kern manifest (schema version 4). All top-level keys are required."""

    schema_version: Annotated[int, Meta(description="Format version; this runtime reads 4.")]
    model: Annotated[str, Meta(description="A label; the runtime gives it no meaning.")]
    vars: Annotated[dict[str, Var], _map("Scalars the caller supplies at each run, by name.")]
    states: Annotated[dict[str, State], _map("Persistent opaque memory (e.g. the KV cache), by name.")]
    buffers: Annotated[dict[str, Buffer], _map("Typed tensors, by name (weights by their name in the weights file).")]
    modules: Annotated[dict[str, Module], _map("Kernel files (cubins), by name.")]
    ops: Annotated[dict[str, Op], _map("Interfaces with their implementations (launches), by name.")]
    programs: Annotated[dict[str, Program], _map("Ordered call lists the caller runs (e.g. prefill, decode), by name.")]
