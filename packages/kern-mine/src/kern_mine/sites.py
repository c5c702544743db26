"""Step 3: align call sites across passes and extract what varies per site.

A call site is ``(shape, kernel, occurrence)``: the n-th launch of one kernel
inside a pass of one shape (``shapes.py``: passes of different programs, such
as a prefill graph and a decode graph, have different call sites even where a
kernel name repeats). A kernel is a symbol together with its parameter layout
(the ``(offset, size)`` list; ``None`` for launches whose parameters went
through the packed ``extra`` buffer). Only regular passes are aligned.

Each flat site's parameters are sorted into:

- ``pointer``: some observation points into a device allocation;
- ``host``: an 8-byte value the capture flagged as a host pointer (never
  dereferenced, never fitted);
- ``scalar``: 1–8 bytes, read as an unsigned little-endian integer;
- ``opaque``: larger by-value structs (reported, not fitted).

Pointers are also found *inside* by-value structs (a CUTLASS ``Params``, an
ATen ``TensorIterator`` offset calculator) and inside the packed ``extra``
buffer of a library launch (cuBLAS; recorded as ``extra_hex`` when at most
4 KiB): every 8-byte-aligned word that lies in a device allocation the
capture annotated anywhere (``AllocIndex``: the allocations of all flat
pointer parameters, a model's weights included through their initialisation
kernels) is an *embedded* pointer, ``(param, within)``; ``param`` is -1 for
the extra buffer.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from kern_capture.records import LaunchRecord

from .passes import Pass

__all__ = ["Kernel", "Site", "ParamInfo", "Embedded", "AllocIndex", "align_sites", "kernel_keys", "scalar_value",
           "EXTRA"]

EXTRA = -1
"""``Embedded.param`` of a pointer inside the packed extra buffer."""


@dataclass
class Kernel:
    """A kernel: symbol + parameter layout, and the module ids it was seen in."""

    id: int
    symbol: str
    layout: tuple[tuple[int, int], ...] | None
    module_ids: set[int] = field(default_factory=set)

    @property
    def flat(self) -> bool:
        return self.layout is not None


@dataclass
class ParamInfo:
    """One parameter of a site: ``kind`` is pointer | host | scalar | opaque."""

    index: int
    offset: int
    size: int
    kind: str


@dataclass(frozen=True)
class Embedded:
    """A pointer inside a by-value parameter (``param``) or the extra buffer (``param == EXTRA``),
    ``within`` bytes from its start."""

    param: int
    within: int


class AllocIndex:
    """The device allocations annotated on any flat pointer parameter of the capture."""

    def __init__(self, launches: list[LaunchRecord]):
        sizes: dict[int, int] = {}
        for r in launches:
            if r.params is None:
                continue
            for p in r.params:
                a = p.alloc
                if a is not None and sizes.get(a.base, 0) < a.size:
                    sizes[a.base] = a.size
        self.bases = sorted(sizes)
        self.sizes = [sizes[b] for b in self.bases]

    def find(self, addr: int) -> tuple[int, int] | None:
        """(base, size) of the allocation holding ``addr``, or None."""
        i = bisect_right(self.bases, addr) - 1
        if i >= 0 and addr < self.bases[i] + self.sizes[i]:
            return self.bases[i], self.sizes[i]
        return None


def embedded_words(r: LaunchRecord, e: Embedded) -> int | None:
    """The 8-byte word of an embedded pointer in one launch (None when the bytes are not there)."""
    raw = r.extra_hex if e.param == EXTRA else (r.params[e.param].hex if r.params else None)  # type: ignore[index]
    if raw is None or 2 * (e.within + 8) > len(raw):
        return None
    return int.from_bytes(bytes.fromhex(raw[2 * e.within:2 * (e.within + 8)]), "little")


@dataclass
class Site:
    """One call site and its launch in each regular pass it occurs in."""

    id: int
    kernel: Kernel
    occurrence: int
    shape: int = 0
    launches: dict[int, int] = field(default_factory=dict)  # pass index -> launch index
    params: list[ParamInfo] = field(default_factory=list)
    embedded: list[Embedded] = field(default_factory=list)


def kernel_keys(launches: list[LaunchRecord]) -> tuple[list[int], list[Kernel]]:
    """Kernel id of every launch, and the kernels."""
    table: dict[tuple, Kernel] = {}
    kid: list[int] = []
    for r in launches:
        layout = None if r.params is None else tuple((p.offset, p.size) for p in r.params)
        key = (r.symbol, layout)
        k = table.get(key)
        if k is None:
            k = table[key] = Kernel(len(table), r.symbol, layout)
        if r.module_id is not None:
            k.module_ids.add(r.module_id)
        kid.append(k.id)
    return kid, list(table.values())


def align_sites(launches: list[LaunchRecord], kid: list[int], kernels: list[Kernel],
                passes: list[Pass], allocs: AllocIndex | None = None) -> list[Site]:
    """Sites in order of first appearance (pass order, then launch order)."""
    sites: dict[tuple[int, int, int], Site] = {}
    for p in passes:
        if not p.regular:
            continue
        shape = p.shape or 0
        occ: dict[int, int] = {}
        for i in range(p.start, p.end):
            k = kid[i]
            n = occ.get(k, 0)
            occ[k] = n + 1
            key = (shape, k, n)
            s = sites.get(key)
            if s is None:
                s = sites[key] = Site(len(sites), kernels[k], n, shape)
            s.launches[p.index] = i
    out = list(sites.values())
    for s in out:
        s.params = _param_kinds(launches, s)
        if allocs is not None and allocs.bases:
            s.embedded = _embedded(launches, s, allocs)
    return out


def _embedded(launches: list[LaunchRecord], s: Site, allocs: AllocIndex) -> list[Embedded]:
    bufs: list[tuple[int, list[str]]] = []
    recs = [launches[i] for i in s.launches.values()]
    if s.kernel.layout is None:
        raws = [r.extra_hex for r in recs if r.extra_hex]
        if raws:
            bufs.append((EXTRA, raws))
    else:
        for prm in s.params:
            if prm.kind == "opaque":
                bufs.append((prm.index, [r.params[prm.index].hex for r in recs]))  # type: ignore[index]
    lo, hi = (allocs.bases[0], allocs.bases[-1] + allocs.sizes[-1]) if allocs.bases else (0, 0)
    out = []
    for j, raws in bufs:
        found: set[int] = set()
        for raw in raws:
            b = bytes.fromhex(raw)
            for w in range(0, len(b) - 7, 8):
                if w in found:
                    continue
                v = int.from_bytes(b[w:w + 8], "little")
                if lo <= v < hi and allocs.find(v) is not None:
                    found.add(w)
        out += [Embedded(j, w) for w in sorted(found)]
    return out


def _param_kinds(launches: list[LaunchRecord], s: Site) -> list[ParamInfo]:
    if s.kernel.layout is None:
        return []
    kinds = []
    recs = [launches[i] for i in s.launches.values()]
    for j, (off, size) in enumerate(s.kernel.layout):
        obs = [r.params[j] for r in recs]  # type: ignore[index]
        if any(p.alloc is not None for p in obs):
            kind = "pointer"
        elif any(p.host for p in obs):
            kind = "host"
        elif size <= 8:
            kind = "scalar"
        else:
            kind = "opaque"
        kinds.append(ParamInfo(j, off, size, kind))
    return kinds


def scalar_value(r: LaunchRecord, j: int) -> int:
    """Parameter ``j`` of a launch read as an unsigned little-endian integer."""
    return int.from_bytes(bytes.fromhex(r.params[j].hex), "little")  # type: ignore[index]
