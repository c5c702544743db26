"""Step 3: align call sites across passes and extract what varies per site.

A call site is ``(shape, kernel, occurrence)``: the n-th launch of one kernel
inside a pass of one shape (``shapes.py``: passes of different programs, such
as a prefill graph and a decode graph, have different call sites even where a
kernel name repeats). A kernel is a symbol together with its parameter layout
(the ``(offset, size)`` list; ``None`` for launches whose parameters went
through the packed ``extra`` buffer). Only regular passes are aligned.

**Library calls.** A library (cuBLAS) picks its kernel by size: at one token
count the 5th GEMM of a pass runs kernel A, at another kernel B, and A's n-th
launch is not the same GEMM at every token count. When every regular pass of
a shape makes the same number of extra-buffer launches, those launches are
aligned by *call* instead: a library call site is ``(shape, kernel, call)``,
``call`` being the launch's index among the pass's extra-buffer launches (the
program makes the same library calls in the same order; only the kernel the
library picks changes). Its ``occurrence`` is the kernel's occurrence in the
first pass it was seen in.

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
the extra buffer. A library's own operands may lie in allocations no flat
kernel ever touched (weights copied into fresh memory and only ever read by
the library): a word of an extra buffer is also a pointer when, in some
extra buffer of the same size anywhere in the capture (the library's
argument struct), the word at that position lies in an annotated allocation,
and its own value is non-zero and in the same 1 TiB of address space as the
annotated allocations (``REGION_SHIFT``). Such a pointer's allocation is
unknown; it is identified by its address.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
from kern_capture.records import LaunchRecord

from .passes import Pass

__all__ = ["Kernel", "Site", "ParamInfo", "Embedded", "AllocIndex", "Words", "align_sites", "kernel_keys",
           "scalar_value", "EXTRA", "REGION_SHIFT"]

EXTRA = -1
"""``Embedded.param`` of a pointer inside the packed extra buffer."""

REGION_SHIFT = 40
"""An unannotated word is a device address only if ``word >> REGION_SHIFT`` is that of an annotated allocation."""


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
        self._b = np.array(self.bases, dtype=np.uint64)
        self._e = self._b + np.array(self.sizes, dtype=np.uint64)
        self._regions = [np.uint64(r) for r in sorted({b >> REGION_SHIFT for b in self.bases})]

    def find(self, addr: int) -> tuple[int, int] | None:
        """(base, size) of the allocation holding ``addr``, or None."""
        i = bisect_right(self.bases, addr) - 1
        if i >= 0 and addr < self.bases[i] + self.sizes[i]:
            return self.bases[i], self.sizes[i]
        return None

    def lookup(self, words: np.ndarray) -> np.ndarray:
        """For each word (uint64), the index of the allocation holding it, or -1."""
        if not self.bases:
            return np.full(words.shape, -1, dtype=np.int64)
        i = np.searchsorted(self._b, words, side="right").astype(np.int64) - 1
        ok = (i >= 0) & (words < self._e[np.maximum(i, 0)])
        return np.where(ok, i, -1)

    def in_region(self, words: np.ndarray) -> np.ndarray:
        """Non-zero words in the same ``1 << REGION_SHIFT`` bytes of address space as an annotated allocation."""
        top = words >> np.uint64(REGION_SHIFT)
        out = np.zeros(words.shape, dtype=bool)
        for r in self._regions:
            out |= top == r
        return out & (words != 0)


_EMPTY = np.zeros(0, dtype=np.uint64)


class Words:
    """The 8-byte little-endian words of by-value parameters and extra buffers, decoded once, and the
    positions of the extra buffers that hold pointers (learned per buffer size over the whole capture)."""

    def __init__(self, launches: list[LaunchRecord], allocs: AllocIndex):
        self.launches = launches
        self.allocs = allocs
        self._cache: dict[str, np.ndarray] = {}
        self._masks: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.extra_positions: dict[int, np.ndarray] = {}  # buffer size in bytes -> bool per word
        by_len: dict[int, list[str]] = {}
        for r in launches:
            if r.params is None and r.extra_hex:
                by_len.setdefault(len(r.extra_hex) // 2, []).append(r.extra_hex)
        for size, raws in by_len.items():
            n_words = size // 8
            if not n_words:
                continue
            seen = np.zeros(n_words, dtype=bool)
            for c in range(0, len(raws), 4096):  # bounded memory on large captures
                chunk = raws[c:c + 4096]
                arr = np.frombuffer(bytes.fromhex("".join(chunk)), dtype=np.uint8).reshape(len(chunk), size)
                w = np.ascontiguousarray(arr[:, :8 * n_words]).view("<u8")
                seen |= (allocs.lookup(w) >= 0).any(axis=0)
            self.extra_positions[size] = seen

    def of(self, i: int, param: int) -> np.ndarray:
        """The words of launch ``i``'s by-value parameter ``param`` (``EXTRA``: its extra buffer)."""
        r = self.launches[i]
        raw = r.extra_hex if param == EXTRA else (r.params[param].hex if r.params else None)  # type: ignore[index]
        if not raw:
            return _EMPTY
        a = self._cache.get(raw)
        if a is None:
            b = bytes.fromhex(raw)
            a = self._cache[raw] = np.frombuffer(b[:len(b) // 8 * 8], dtype="<u8")
        return a

    def learned(self, i: int, param: int) -> np.ndarray | None:
        """Pointer positions learned for this launch's extra buffer (None for a by-value parameter)."""
        if param != EXTRA:
            return None
        r = self.launches[i]
        return self.extra_positions.get(len(r.extra_hex) // 2) if r.extra_hex else None

    def matrix(self, idx: list[int], param: int) -> tuple[np.ndarray, np.ndarray]:
        """The words of ``param`` (``EXTRA``: the extra buffer) of launches ``idx``, one row each, zero-padded
        to the longest: (words, present) arrays of shape (launches, words)."""
        arrs = [self.of(i, param) for i in idx]
        n = max((len(a) for a in arrs), default=0)
        vals = np.zeros((len(idx), n), dtype=np.uint64)
        have = np.zeros((len(idx), n), dtype=bool)
        for k, a in enumerate(arrs):
            vals[k, :len(a)] = a
            have[k, :len(a)] = True
        return vals, have

    def pointer_mask(self, idx: list[int], param: int) -> tuple[np.ndarray, np.ndarray]:
        """(words, allocation index) of ``param`` of launches ``idx`` (see ``matrix``). Allocation index: the
        annotated allocation holding the word; -1: a pointer outside any (at a position learned for its
        extra buffer, see the module docstring); -2: not a pointer."""
        key = (tuple(idx), param)
        got = self._masks.get(key)
        if got is None:
            got = self._masks[key] = self._pointer_mask(idx, param)
        return got

    def _pointer_mask(self, idx: list[int], param: int) -> tuple[np.ndarray, np.ndarray]:
        vals, have = self.matrix(idx, param)
        where = self.allocs.lookup(vals)
        if param == EXTRA and vals.size:
            learned = np.zeros(vals.shape, dtype=bool)
            for k, i in enumerate(idx):
                m = self.learned(i, param)
                if m is not None:
                    learned[k, :len(m)] = m
            guess = learned & have & self.allocs.in_region(vals)
            where[(where < 0) & ~guess] = -2
        else:
            where[where < 0] = -2
        return vals, where


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
    call: int | None = None  # a library call site: the index of its launches among their passes' extra-buffer launches


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
                passes: list[Pass], allocs: AllocIndex | Words | None = None) -> list[Site]:
    """Sites in order of first appearance (pass order, then launch order)."""
    regular = [p for p in passes if p.regular]
    # shapes whose regular passes all make the same number of library (extra-buffer) calls
    calls: dict[int, set[int]] = {}
    for p in regular:
        n = sum(1 for i in range(p.start, p.end) if kernels[kid[i]].layout is None)
        calls.setdefault(p.shape or 0, set()).add(n)
    by_call = {sh for sh, ns in calls.items() if len(ns) == 1 and next(iter(ns)) > 0}
    sites: dict[tuple[int, int, int, bool], Site] = {}
    for p in regular:
        shape = p.shape or 0
        occ: dict[int, int] = {}
        call = 0
        aligned = shape in by_call
        for i in range(p.start, p.end):
            k = kid[i]
            n = occ.get(k, 0)
            occ[k] = n + 1
            if aligned and kernels[k].layout is None:
                key = (shape, k, call, True)
                s = sites.get(key)
                if s is None:
                    s = sites[key] = Site(len(sites), kernels[k], n, shape, call=call)
                call += 1
            else:
                key = (shape, k, n, False)
                s = sites.get(key)
                if s is None:
                    s = sites[key] = Site(len(sites), kernels[k], n, shape)
            s.launches[p.index] = i
    out = list(sites.values())
    words = allocs if isinstance(allocs, Words) else (Words(launches, allocs) if allocs is not None else None)
    for s in out:
        s.params = _param_kinds(launches, s)
        if words is not None and words.allocs.bases:
            s.embedded = _embedded(s, words)
    return out


def _embedded(s: Site, words: Words) -> list[Embedded]:
    idx = list(s.launches.values())
    if s.kernel.layout is None:
        params = [EXTRA]
    else:
        params = [prm.index for prm in s.params if prm.kind == "opaque"]
    out = []
    for j in params:
        _, where = words.pointer_mask(idx, j)
        out += [Embedded(j, 8 * int(w)) for w in np.flatnonzero((where > -2).any(axis=0))]
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
