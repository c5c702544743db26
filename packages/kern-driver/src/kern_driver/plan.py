"""The device layout: kern-verify's memory plan, plus where the states go.

The plan itself (which buffer and scratch at which 256-byte aligned arena
offset, sizes at the var maxima, state sizes at the capacity) is
`kern_verify.plan` — the same numbers `kern-verify --plan` prints before any
GPU is touched. The driver adds only the states' placement: they follow the
buffers and scratch in the same allocation, each at a multiple of
max(256, its `align`). One `cuMemAlloc` then holds everything, so every
pointer a kernel gets is `arena base + region offset + byte offset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kern_schema import Manifest
from kern_verify import Plan, PlanError
from kern_verify import plan as verify_plan

from .errors import KernDriverError

#: Alignment of every region in the arena, bytes (`cuMemAlloc` itself aligns to ≥ 256).
ALIGN = 256

def plain_int(v: object) -> object:
    """`v` as a Python int when it is a numpy integer (np.int64 from a config array or a shape), else `v` unchanged:
    the integer arguments of kern-driver (vars, capacity_tokens, device) accept both."""
    if type(v).__module__ == "numpy" and hasattr(v, "__index__") and not isinstance(v, (bool, int)):
        return int(v)  # type: ignore[call-overload]
    return v


#: Largest arena `layout` plans, bytes (int64, the verifier's bound on one buffer; device addresses are
#: packed as u64 and sizes go to cuMemAlloc as size_t).
ARENA_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Region:
    """One region of the arena.

    Attributes:
        kind: "buffer", "state" or "scratch".
        name: the buffer or state name; for scratch `op/name`.
        cls: the buffer class (`input`, `output`, `weight`, `workspace`, `carry`),
            "state" or "scratch".
        offset: byte offset in the arena.
        nbytes: size in bytes (buffers/scratch at the var maxima, states at the capacity).
        dtype: element dtype ("u8" for states).
        shape: shape at the var maxima (states: `(nbytes,)`).
    """

    kind: str
    name: str
    cls: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(slots=True)
class Layout:
    """`plan` (kern-verify's `Plan`) as arena regions: `buffers`, `states` (name →
    `Region`), `scratch` (op → name → `Region`), and `total_bytes` of the arena."""

    plan: Plan
    buffers: dict[str, Region] = field(default_factory=dict)
    states: dict[str, Region] = field(default_factory=dict)
    scratch: dict[str, dict[str, Region]] = field(default_factory=dict)
    total_bytes: int = 0

    @property
    def capacity_tokens(self) -> int:
        return self.plan.capacity_tokens

    def regions(self) -> list[Region]:
        """Every region, in arena order."""
        out = list(self.buffers.values()) + list(self.states.values())
        out += [r for per_op in self.scratch.values() for r in per_op.values()]
        return sorted(out, key=lambda r: r.offset)

    def bytes_by_class(self) -> dict[str, int]:
        """Bytes per buffer class plus "scratch" and "state" (classes with no bytes omitted)."""
        out: dict[str, int] = {}
        for r in self.regions():
            if r.nbytes:
                out[r.cls] = out.get(r.cls, 0) + r.nbytes
        return out


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def layout(manifest: Manifest, capacity_tokens: int) -> Layout:
    """kern-verify's plan for `capacity_tokens`, with the states placed after the arena.

    Args:
        capacity_tokens: tokens every `bytes_per_token` state holds (an int ≥ 1; numpy integers are accepted).

    Raises:
        KernDriverError: capacity_tokens < 1 or not an integer; the plan fails (an unverified manifest);
            the arena would exceed `ARENA_MAX` bytes (int64, as kern-verify bounds each buffer: a
            capacity far too large), naming each state's size.
    """
    capacity_tokens = plain_int(capacity_tokens)
    if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int) or capacity_tokens < 1:
        raise KernDriverError(
            f"capacity_tokens must be a positive integer, got {capacity_tokens!r}",
            hint="pass the most tokens the states (e.g. the KV cache) must hold, e.g. capacity_tokens=4096",
        )
    try:
        p = verify_plan(manifest, capacity_tokens)
    except PlanError as e:
        raise KernDriverError(f"memory plan: {e}") from None
    lay = Layout(p)
    end = 0
    for b in p.buffers:
        lay.buffers[b.name] = Region("buffer", b.name, b.class_, b.offset, b.nbytes, b.dtype, b.shape)
        end = max(end, b.offset + b.aligned_nbytes)
    for s in p.scratch:
        lay.scratch.setdefault(s.op, {})[s.name] = Region(
            "scratch", f"{s.op}/{s.name}", "scratch", s.offset, s.nbytes, s.dtype, s.shape)
        end = max(end, s.offset + s.aligned_nbytes)
    end = max(end, p.arena_bytes)
    for st in p.states:
        off = _align(end, max(ALIGN, st.align))
        lay.states[st.name] = Region("state", st.name, "state", off, st.nbytes, "u8", (st.nbytes,))
        end = off + st.nbytes
    lay.total_bytes = _align(end, ALIGN)
    if lay.total_bytes > ARENA_MAX:
        sizes = ", ".join(f"`{r.name}` {r.nbytes:,} B" for r in lay.states.values())
        raise KernDriverError(
            f"memory plan: the arena would take {lay.total_bytes:,} bytes, more than any device address space "
            f"(int64 max {ARENA_MAX:,}); states at capacity_tokens={capacity_tokens:,}: {sizes or '(none)'}",
            hint="pass the most tokens the states must really hold (e.g. capacity_tokens=4096)",
        )
    return lay
