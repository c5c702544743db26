"""The memory plan: every buffer, state and op scratch at one offset of one arena.

Pure Python, no GPU. Sizes are taken at the var maxima (DESIGN §4): a buffer
of shape `[tokens, 2560]` with `tokens.max = 2048` takes
`2048 × 2560 × dtype size` bytes. States take `capacity_tokens ×
bytes_per_token` or `seqs.max × bytes_per_seq`. Each op's scratch is planned
once per op (calls of one op run one after another on one stream, and scratch
is never kept between launches of different calls). Every region starts at a
multiple of `ALIGN` (256 bytes, the alignment `cuMemAlloc` itself guarantees)
or of the state's own `align` when that is larger.

The arena offset of a region plus the arena's device base address is the
pointer the kernels get (plus the call's or launch's byte `offset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kern_schema import DTYPES, Manifest

from .errors import KernDriverError

#: Alignment of every region in the arena, bytes.
ALIGN = 256


@dataclass(frozen=True, slots=True)
class Region:
    """One planned allocation.

    Attributes:
        kind: "buffer", "state" or "scratch".
        name: the buffer or state name; for scratch `op/name`.
        cls: the buffer class (`input`, `output`, `weight`, `workspace`, `carry`),
            "state" or "scratch".
        offset: byte offset in the arena (a multiple of `ALIGN`, or of the state's align).
        nbytes: size in bytes at the var maxima.
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
class Plan:
    """The memory plan of a manifest for a given capacity.

    Attributes:
        capacity_tokens: the token capacity states were sized for.
        buffers, states: name → `Region`.
        scratch: op name → scratch name → `Region`.
        total_bytes: arena size in bytes (end of the last region, rounded up to `ALIGN`).
    """

    capacity_tokens: int
    buffers: dict[str, Region] = field(default_factory=dict)
    states: dict[str, Region] = field(default_factory=dict)
    scratch: dict[str, dict[str, Region]] = field(default_factory=dict)
    total_bytes: int = 0

    def regions(self) -> list[Region]:
        """Every region in arena order."""
        out = list(self.buffers.values()) + list(self.states.values())
        out += [r for per_op in self.scratch.values() for r in per_op.values()]
        return sorted(out, key=lambda r: r.offset)

    def bytes_by_class(self) -> dict[str, int]:
        """Bytes per buffer class, plus "state" and "scratch"; classes with no region omitted."""
        out: dict[str, int] = {}
        for r in self.regions():
            out[r.cls] = out.get(r.cls, 0) + r.nbytes
        return out

    def describe(self) -> str:
        """A short text table: bytes per class and the arena total."""
        lines = [f"memory plan (capacity {self.capacity_tokens} tokens, arena {_mib(self.total_bytes)}):"]
        for cls, n in self.bytes_by_class().items():
            lines.append(f"  {cls:<10} {_mib(n):>12}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n:,} B"


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def shape_at_max(manifest: Manifest, shape: list[int | str], where: str) -> tuple[int, ...]:
    """A declared shape with every var dim replaced by the var's maximum.

    Raises:
        KernDriverError: a dim names an unknown var (the verifier reports this first).
    """
    out = []
    for d in shape:
        if isinstance(d, str):
            v = manifest.vars.get(d)
            if v is None:
                raise KernDriverError(f"shape dim `{d}` is not a declared var", where=where)
            out.append(v.max)
        else:
            out.append(int(d))
    return tuple(out)


def _nbytes(dtype: str, shape: tuple[int, ...], where: str) -> int:
    if dtype not in DTYPES:
        raise KernDriverError(f"unknown dtype `{dtype}`", where=where)
    n = DTYPES[dtype]
    for d in shape:
        n *= d
    return n


def plan(manifest: Manifest, capacity_tokens: int) -> Plan:
    """Plan the arena for `manifest` with states sized for `capacity_tokens` tokens.

    Order: weights first (so the large read-only block is contiguous), then the other
    buffers in declaration order, then states, then each op's scratch.

    Raises:
        KernDriverError: `capacity_tokens < 1`, a `bytes_per_seq` state without a `seqs`
            var, or a malformed declaration the verifier would have reported.
    """
    if not isinstance(capacity_tokens, int) or capacity_tokens < 1:
        raise KernDriverError(
            f"capacity_tokens must be a positive integer, got {capacity_tokens!r}",
            hint="pass the most tokens the states (e.g. the KV cache) must hold, e.g. capacity_tokens=4096",
        )
    p = Plan(capacity_tokens)
    off = 0

    def place(nbytes: int, align: int) -> int:
        nonlocal off
        start = _align(off, max(ALIGN, align))
        off = start + nbytes
        return start

    names = sorted(manifest.buffers, key=lambda n: manifest.buffers[n].class_ != "weight")
    for name in names:
        b = manifest.buffers[name]
        where = f"buffers.{name}"
        shape = shape_at_max(manifest, b.shape, where)
        n = _nbytes(b.dtype, shape, where)
        p.buffers[name] = Region("buffer", name, b.class_, place(n, ALIGN), n, b.dtype, shape)
    for name, s in manifest.states.items():
        where = f"states.{name}"
        if s.bytes_per_token is not None:
            n = s.bytes_per_token * capacity_tokens
        elif s.bytes_per_seq is not None:
            seqs = manifest.vars.get("seqs")
            if seqs is None:
                raise KernDriverError(
                    "a `bytes_per_seq` state is sized by the `seqs` var, which is not declared",
                    where=where,
                    hint='declare `"seqs": {"max": N}` in `vars`',
                )
            n = s.bytes_per_seq * seqs.max
        else:
            raise KernDriverError("a state needs `bytes_per_token` or `bytes_per_seq`", where=where)
        p.states[name] = Region("state", name, "state", place(n, s.align), n, "u8", (n,))
    for op_name, op in manifest.ops.items():
        if not op.impl.scratch:
            continue
        per_op = p.scratch.setdefault(op_name, {})
        for sname, sc in op.impl.scratch.items():
            where = f"ops.{op_name}.impl.scratch.{sname}"
            shape = shape_at_max(manifest, sc.shape, where)
            n = _nbytes(sc.dtype, shape, where)
            per_op[sname] = Region("scratch", f"{op_name}/{sname}", "scratch", place(n, ALIGN), n, sc.dtype, shape)
    p.total_bytes = _align(off, ALIGN)
    return p
