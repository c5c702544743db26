"""Element types of buffers and scalar types of kernel parameters.

Sizes are in bytes. Scalar ranges are the inclusive value ranges of the C types
(`int32_t` etc.); the floating types carry the finite range of IEEE 754 binary32
and binary64.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Buffer element types and their size in bytes (DESIGN §2).
DTYPES: dict[str, int] = {
    "bf16": 2,
    "f16": 2,
    "f32": 4,
    "f64": 8,
    "i8": 1,
    "u8": 1,
    "i16": 2,
    "u16": 2,
    "i32": 4,
    "u32": 4,
    "i64": 8,
    "u64": 8,
    "fp8e4m3": 1,
    "fp8e5m2": 1,
}


@dataclass(frozen=True, slots=True)
class ScalarType:
    """A scalar kernel parameter type.

    Attributes:
        name: the type name as written in a manifest (`i32`, `f32`, ...).
        size: size in bytes of the value in the kernel's parameter buffer.
        is_float: True for `f32`/`f64`.
        lo, hi: inclusive range of representable values (finite range for floats).
    """

    name: str
    size: int
    is_float: bool
    lo: int | float
    hi: int | float

    def contains(self, lo: int | float, hi: int | float) -> bool:
        """True when the whole interval [lo, hi] is representable in this type."""
        return self.lo <= lo and hi <= self.hi


def _int(name: str, bits: int, signed: bool) -> ScalarType:
    if signed:
        return ScalarType(name, bits // 8, False, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return ScalarType(name, bits // 8, False, 0, (1 << bits) - 1)


#: Scalar parameter types (DESIGN §2: `i8 u8 i16 u16 i32 u32 i64 u64 f32 f64`).
SCALARS: dict[str, ScalarType] = {
    "i8": _int("i8", 8, True),
    "u8": _int("u8", 8, False),
    "i16": _int("i16", 16, True),
    "u16": _int("u16", 16, False),
    "i32": _int("i32", 32, True),
    "u32": _int("u32", 32, False),
    "i64": _int("i64", 64, True),
    "u64": _int("u64", 64, False),
    "f32": ScalarType("f32", 4, True, -3.4028234663852886e38, 3.4028234663852886e38),
    "f64": ScalarType("f64", 8, True, -1.7976931348623157e308, 1.7976931348623157e308),
}

#: Size in bytes of a pointer parameter (buffers and state pointers), 64-bit CUDA.
POINTER_SIZE = 8

INT64_MAX = (1 << 63) - 1
