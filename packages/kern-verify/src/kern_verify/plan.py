"""The memory plan of a manifest: what a load allocates, known before any GPU is touched.

Buffers and per-op scratch are sized at the var maxima and laid out in one arena,
each at a 256-byte aligned offset (buffers in declaration order, then scratch by
op and name). States are allocated separately: `capacity × bytes_per_token` or
`seqs.max × bytes_per_seq`, rounded up to their `align`. The driver allocates from
this plan, so it is a plain data object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kern_schema import DTYPES, BUFFER_CLASSES, Manifest

ALIGN = 256


class PlanError(ValueError):
    """The manifest cannot be planned (a dtype or dim does not resolve): verify it first."""


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True, slots=True)
class PlanBuffer:
    """One buffer: `shape` at the var maxima, `nbytes` exact, `aligned_nbytes` rounded up to
    256, `offset` in the arena (a multiple of 256)."""

    name: str
    class_: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    aligned_nbytes: int
    offset: int


@dataclass(frozen=True, slots=True)
class PlanScratch:
    """One op's scratch tensor at the var maxima, placed in the arena after the buffers."""

    op: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    aligned_nbytes: int
    offset: int


@dataclass(frozen=True, slots=True)
class PlanState:
    """One state: `unit` is "token" or "seq", `bytes_per_unit` as declared; `per_1000_tokens`
    is the bytes per 1,000 tokens of capacity (None for per-seq states); `nbytes` the
    allocation at the planned capacity (rounded up to `align`)."""

    name: str
    unit: str
    bytes_per_unit: int
    align: int
    per_1000_tokens: int | None
    nbytes: int


@dataclass(frozen=True)
class Plan:
    """The whole plan. `arena_bytes` covers buffers and scratch; `state_bytes` the states
    at `capacity_tokens`; `by_class` the aligned bytes per buffer class."""

    capacity_tokens: int
    vars_max: dict[str, int]
    buffers: tuple[PlanBuffer, ...]
    scratch: tuple[PlanScratch, ...]
    states: tuple[PlanState, ...]
    by_class: dict[str, int] = field(default_factory=dict)
    scratch_bytes: int = 0
    arena_bytes: int = 0
    state_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Arena plus states."""
        return self.arena_bytes + self.state_bytes

    def buffer(self, name: str) -> PlanBuffer:
        """The planned buffer `name` (KeyError if absent)."""
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The plan as plain JSON data; field names as in the manifest (a buffer's `class`)."""
        d = dataclasses.asdict(self)
        d["buffers"] = [{("class" if k == "class_" else k): v for k, v in b.items()} for b in d["buffers"]]
        d["total_bytes"] = self.total_bytes
        return d

    def render(self) -> str:
        """A text report: bytes per buffer class, scratch per op, states, totals."""
        lines = [f"memory plan (vars at their maxima: "
                 + ", ".join(f"{k}={v}" for k, v in self.vars_max.items()) + f"; capacity {self.capacity_tokens} tokens)", ""]
        rows = [("buffers by class", "count", "bytes")]
        for cls in BUFFER_CLASSES:
            n = sum(1 for b in self.buffers if b.class_ == cls)
            rows.append((f"  {cls}", str(n), _h(self.by_class.get(cls, 0))))
        ops: dict[str, int] = {}
        for s in self.scratch:
            ops[s.op] = ops.get(s.op, 0) + s.aligned_nbytes
        rows.append(("scratch by op", "", ""))
        for op, n in ops.items():
            rows.append((f"  {op}", str(sum(1 for s in self.scratch if s.op == op)), _h(n)))
        rows.append(("arena (buffers + scratch)", "", _h(self.arena_bytes)))
        rows.append(("states", "per 1,000 tokens", f"at {self.capacity_tokens} tokens"))
        for st in self.states:
            per = _h(st.per_1000_tokens) if st.per_1000_tokens is not None else f"{st.bytes_per_unit} B/seq"
            rows.append((f"  {st.name}", per, _h(st.nbytes)))
        rows.append(("total", "", _h(self.total_bytes)))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines += [f"{a:<{w0}}  {b:>{w1}}  {c:>14}".rstrip() for a, b, c in rows]
        return "\n".join(lines)


def _h(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{n} B"


def plan(manifest: Manifest, capacity_tokens: int) -> Plan:
    """Plan the memory of a (verified) manifest for a state capacity of `capacity_tokens`.

    Raises:
        PlanError: a dtype or shape dim does not resolve, or capacity_tokens < 1.
    """
    if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int) or capacity_tokens < 1:
        raise PlanError(f"capacity_tokens must be a positive integer (tokens the states hold), got {capacity_tokens!r}")
    vmax = {k: v.max for k, v in manifest.vars.items()}

    def shape_of(where: str, dtype: str, shape: list[int | str]) -> tuple[tuple[int, ...], int]:
        if dtype not in DTYPES:
            raise PlanError(f"{where}: unknown dtype `{dtype}` (run kern-verify first)")
        dims = []
        for d in shape:
            if isinstance(d, str):
                if d not in vmax:
                    raise PlanError(f"{where}: dim `{d}` is not a declared var (run kern-verify first)")
                d = vmax[d]
            dims.append(d)
        n = DTYPES[dtype]
        for d in dims:
            n *= d
        return tuple(dims), n

    off = 0
    bufs = []
    by_class = {c: 0 for c in BUFFER_CLASSES}
    for name, b in manifest.buffers.items():
        shape, n = shape_of(f"buffers.{name}", b.dtype, b.shape)
        a = _align(n)
        bufs.append(PlanBuffer(name, b.class_, b.dtype, shape, n, a, off))
        by_class[b.class_] = by_class.get(b.class_, 0) + a
        off += a
    scratch = []
    sbytes = 0
    for oname, op in manifest.ops.items():
        for sname, sc in op.impl.scratch.items():
            shape, n = shape_of(f"ops.{oname}.impl.scratch.{sname}", sc.dtype, sc.shape)
            a = _align(n)
            scratch.append(PlanScratch(oname, sname, sc.dtype, shape, n, a, off))
            off += a
            sbytes += a
    states = []
    total_states = 0
    for name, s in manifest.states.items():
        if s.align < 1 or s.align & (s.align - 1):
            raise PlanError(f"states.{name}: align {s.align} is not a power of two (run kern-verify first)")
        if s.bytes_per_token is not None:
            n = _align(capacity_tokens * s.bytes_per_token, s.align)
            st = PlanState(name, "token", s.bytes_per_token, s.align, 1000 * s.bytes_per_token, n)
        elif s.bytes_per_seq is not None:
            seqs = vmax.get("seqs")
            if seqs is None:
                raise PlanError(f"states.{name}: bytes_per_seq needs a var `seqs` (run kern-verify first)")
            n = _align(seqs * s.bytes_per_seq, s.align)
            st = PlanState(name, "seq", s.bytes_per_seq, s.align, None, n)
        else:
            raise PlanError(f"states.{name}: no bytes_per_token or bytes_per_seq (run kern-verify first)")
        states.append(st)
        total_states += st.nbytes
    return Plan(capacity_tokens, vmax, tuple(bufs), tuple(scratch), tuple(states), by_class, sbytes, off, total_states)
