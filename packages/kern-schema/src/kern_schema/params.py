"""The parameter-type grammar of ops and launches.

Grammar (DESIGN §2)::

    param   := direction "buffer<" dtype ">"     e.g. "in buffer<bf16>"
             | direction "ptr"                   e.g. "inout ptr"  (state memory, untyped)
             | scalar                            e.g. "i32", "f32"
    direction := "in" | "out" | "inout"

`parse_param_type` turns a string into a `ParamType`; it raises `ParamTypeError`
with a message that says what was expected.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from .dtypes import DTYPES, POINTER_SIZE, SCALARS, ScalarType

Direction = Literal["in", "out", "inout"]
DIRECTIONS: tuple[str, ...] = ("in", "out", "inout")


class ParamTypeError(ValueError):
    """A parameter type string does not follow the grammar."""


@dataclass(frozen=True, slots=True)
class ParamType:
    """One parsed parameter type.

    Attributes:
        kind: "buffer", "ptr" or "scalar".
        direction: "in"/"out"/"inout" for buffers and pointers, None for scalars.
        dtype: element dtype of a buffer (None otherwise).
        scalar: the `ScalarType` of a scalar (None otherwise).
    """

    kind: Literal["buffer", "ptr", "scalar"]
    direction: Direction | None = None
    dtype: str | None = None
    scalar: ScalarType | None = None

    @property
    def size(self) -> int:
        """Bytes the value occupies in the kernel's parameter buffer."""
        return self.scalar.size if self.scalar is not None else POINTER_SIZE

    @property
    def is_pointer(self) -> bool:
        return self.kind != "scalar"

    @property
    def reads(self) -> bool:
        return self.direction in ("in", "inout")

    @property
    def writes(self) -> bool:
        return self.direction in ("out", "inout")

    def __str__(self) -> str:
        if self.kind == "buffer":
            return f"{self.direction} buffer<{self.dtype}>"
        if self.kind == "ptr":
            return f"{self.direction} ptr"
        assert self.scalar is not None
        return self.scalar.name


@functools.lru_cache(maxsize=4096)
def parse_param_type(text: str) -> ParamType:
    """Parse one type string of the grammar above.

    Raises:
        ParamTypeError: the string is not a valid type; the message names the
            offending part and lists what is allowed.
    """
    if not isinstance(text, str):
        raise ParamTypeError(f"a parameter type must be a string, got {type(text).__name__}")
    parts = text.split()
    if len(parts) == 1:
        (word,) = parts
        if word in SCALARS:
            return ParamType("scalar", scalar=SCALARS[word])
        if word == "ptr" or word.startswith("buffer"):
            raise ParamTypeError(
                f"`{text}` lacks a direction: write `in {word}`, `out {word}` or `inout {word}`"
            )
        raise ParamTypeError(
            f"unknown parameter type `{text}`: expected a scalar ({' '.join(SCALARS)}), "
            "`<dir> buffer<dtype>` or `<dir> ptr`"
        )
    if len(parts) != 2:
        raise ParamTypeError(
            f"malformed parameter type `{text}`: expected `<dir> buffer<dtype>`, `<dir> ptr` or a scalar"
        )
    direction, rest = parts
    if direction not in DIRECTIONS:
        raise ParamTypeError(f"unknown direction `{direction}` in `{text}`: expected in, out or inout")
    if rest == "ptr":
        return ParamType("ptr", direction=direction)  # type: ignore[arg-type]
    if rest.startswith("buffer<") and rest.endswith(">"):
        dtype = rest[len("buffer<") : -1]
        if dtype not in DTYPES:
            raise ParamTypeError(
                f"unknown dtype `{dtype}` in `{text}`: expected one of {' '.join(DTYPES)}"
            )
        return ParamType("buffer", direction=direction, dtype=dtype)  # type: ignore[arg-type]
    raise ParamTypeError(f"malformed parameter type `{text}`: expected `buffer<dtype>` or `ptr` after `{direction}`")
