"""Step 6: classify each pointer parameter by its stability across passes.

Pointers are the pointer parameters of flat launches and the pointers embedded
in by-value structs or in a library launch's packed extra buffer (``sites.py``).

A logical buffer is identified by ``(allocation base, offset)``, never by the
allocation alone: a caching allocator carves many tensors out of one
``cudaMalloc`` (two KV pools, every small index buffer in one 2 MB arena, a
model's norm weights next to the activations of a decode step). An embedded
pointer into an allocation the capture never annotated is identified by its
address.

Stability is judged per call-site parameter and then per address, over the
whole capture:

- ``workspace``: the site's address changes from pass to pass (activations
  the allocator hands out per call; possibly the same allocation at another
  offset); or it is stable but the same address is the moving buffer of some
  other site (the allocator recycles it).
- persistent: the same address in every pass the site occurs in, and that
  address is used, never moving, in passes of at least two token counts (a
  caching allocator hands an activation of another size another address; a
  weight stays put). Directions are not in a capture, so the split is a
  heuristic: an address reached by two or more different kernels of one pass
  shape (a library call counts once, whichever kernels the library picked for
  it) is ``state`` (something writes it and something else reads it: a KV
  cache written by a cache-update kernel and read by attention); otherwise
  ``weight``. A weight that two kernels of one program read (tied embeddings
  read by a gather and a flat GEMV, an embedding re-read by fused kernels) is
  reported as ``state``: the generator should check.
- an address seen only in passes of one token count (a graph specialised to
  one-token decode): a weight and an activation the allocator hands out
  identically every step cannot be told apart by stability. If two or more call
  sites of one pass use the address (a site counts once, however many times
  its struct holds the pointer), it is a recycled activation buffer
  (``workspace``: the allocator gave the same memory to several layers'
  intermediates); otherwise ``unknown``.
- ``unknown`` also: some observation is not a device pointer (a null pointer
  in one pass), or the site occurs in one pass only and its address says
  nothing more, or only in passes without a token count.

Only forward passes (those with a known token count) testify about an
address: compile and autotune windows reuse memory in their own ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kern_capture.records import LaunchRecord

from .sites import EXTRA, AllocIndex, Site, Words

__all__ = ["PointerClass", "classify_pointers"]


@dataclass
class PointerClass:
    """The class of one pointer parameter of one site."""

    site: int
    param: int
    offset: int
    cls: str
    reason: str
    passes: int
    distinct: int
    alloc_base: int | None = None
    alloc_size: int | None = None
    alloc_offset: int | None = None
    kernels: list[str] = field(default_factory=list)
    within: int | None = None  # an embedded pointer: its byte offset inside the parameter
    address: int | None = None  # a persistent pointer: its address (the only identity of an unannotated one)


@dataclass
class _Addr:
    """Everything known about one (allocation base, offset) over the capture."""

    token_counts: set[int] = field(default_factory=set)
    moving_user: tuple[int, int] | None = None  # (site, param) whose buffer moves and sometimes lands here
    users: dict[int, set] = field(default_factory=dict)  # shape -> kernels (library calls) reaching it, stable
    kernels: set[str] = field(default_factory=set)  # their symbols
    users_per_pass: dict[int, int] = field(default_factory=dict)  # pass -> call sites using it


def _observations(launches: list[LaunchRecord], s: Site, words: Words | None):
    """(param, offset, within, ids, non_device, size) of every pointer of a site: plain pointer parameters,
    then embedded ones. ``ids`` maps each identity seen to the passes it was seen in: (allocation base,
    offset), or (None, address) for an address in no annotated allocation; ``non_device`` counts the
    passes where it was not a device pointer; ``size`` is the allocation's."""
    items = sorted(s.launches.items())
    for prm in s.params:
        if prm.kind != "pointer":
            continue
        ids: dict[tuple[int | None, int], list[int]] = {}
        non_device = 0
        size = None
        for p, i in items:
            x = launches[i].params[prm.index]  # type: ignore[index]
            if x.alloc is None:
                non_device += 1
                continue
            size = x.alloc.size
            v = int.from_bytes(bytes.fromhex(x.hex), "little")
            ids.setdefault((x.alloc.base, v - x.alloc.base), []).append(p)
        yield prm.index, prm.offset, None, ids, non_device, size
    if not s.embedded or words is None:
        return
    offsets = {prm.index: prm.offset for prm in s.params}
    idx = [i for _, i in items]
    passes = [p for p, _ in items]
    by_param: dict[int, list[int]] = {}
    for e in s.embedded:
        by_param.setdefault(e.param, []).append(e.within)
    allocs = words.allocs
    for j, withins in by_param.items():
        vals, where = words.pointer_mask(idx, j)
        done: dict[bytes, tuple] = {}  # a struct often holds one pointer several times (TMA descriptors)
        for w in withins:
            col_v, col_w = vals[:, w // 8], where[:, w // 8]
            key = col_v.tobytes() + col_w.tobytes()
            got = done.get(key)
            if got is None:
                ids = {}
                non_device = 0
                size = None
                for p, a, v in zip(passes, col_w.tolist(), col_v.tolist()):
                    if a == -2:
                        non_device += 1
                    elif a == -1:
                        ids.setdefault((None, v), []).append(p)
                    else:
                        base = allocs.bases[a]
                        size = allocs.sizes[a]
                        ids.setdefault((base, v - base), []).append(p)
                got = done[key] = (ids, non_device, size)
            yield (j, (0 if j == EXTRA else offsets[j]), w) + got


def classify_pointers(launches: list[LaunchRecord], sites: list[Site],
                      tokens: Mapping[int, int | None] | None = None,
                      allocs: AllocIndex | Words | None = None) -> list[PointerClass]:
    """One ``PointerClass`` per pointer of every site (parameters, then embedded pointers), in site order.

    ``tokens`` maps pass index to its token count (None: unknown); ``allocs`` resolves embedded pointers."""
    tokens = tokens or {}
    words = allocs if isinstance(allocs, Words) else (Words(launches, allocs) if allocs is not None else None)
    out: list[PointerClass] = []
    addrs: dict[tuple[int | None, int], _Addr] = {}
    stable_id: list[tuple[int | None, int] | None] = []
    sizes: list[int | None] = []
    for s in sites:
        # what counts as one user of an address for the state rule: a kernel, or a library call
        # (whichever kernel the library picked for it)
        user = ("call", s.call) if s.call is not None else ("kernel", s.kernel.symbol)
        n_passes = len(s.launches)
        tok = {p: t for p in s.launches if (t := tokens.get(p)) is not None}
        counted: set[tuple[int | None, int]] = set()  # addresses this site was already counted as a user of
        for param, offset, within, ids, non_device, size in _observations(launches, s, words):
            pc = PointerClass(s.id, param, offset, "unknown", "", n_passes, len(ids), within=within)
            sizes.append(size)
            moving = len(ids) > 1
            for ident, ps in ids.items():
                a = addrs.get(ident)
                if a is None:
                    a = addrs[ident] = _Addr()
                # only forward passes (a known token count) testify about an address: the
                # launches of compile and autotune windows reuse memory in their own ways
                known = [p for p in ps if p in tok]
                if not known:
                    continue
                if ident not in counted:  # one call site, however many times its struct holds the pointer
                    counted.add(ident)
                    upp, tcs = a.users_per_pass, a.token_counts
                    for p in known:
                        upp[p] = upp.get(p, 0) + 1
                        tcs.add(tok[p])
                if moving:
                    if a.moving_user is None:
                        a.moving_user = (s.id, param)
                else:
                    a.users.setdefault(s.shape, set()).add(user)
                    a.kernels.add(s.kernel.symbol)
            if non_device:
                pc.reason = f"not a device pointer in {non_device} of {n_passes} passes"
                stable_id.append(None)
            elif moving:
                bases = {b for b, _ in ids}
                pc.cls = "workspace"
                pc.reason = (f"{len(ids)} distinct (allocation, offset) over {n_passes} passes"
                             + (" inside one allocation" if len(bases) == 1 and None not in bases else ""))
                stable_id.append(None)
            else:
                stable_id.append(next(iter(ids)) if ids else None)
            out.append(pc)
    for pc, ident, size in zip(out, stable_id, sizes):
        if ident is None:
            continue
        a = addrs[ident]
        base, off = ident
        if a.moving_user is not None:
            pc.cls = "workspace"
            pc.reason = (f"the same (allocation, offset) in every pass, but site {a.moving_user[0]} param "
                         f"{a.moving_user[1]} also lands there among other addresses: memory the allocator recycles")
            continue
        if len(a.token_counts) >= 2:
            if base is None:
                pc.address = off
                where = "the same address (in no allocation the capture annotated)"
            else:
                pc.alloc_base, pc.alloc_size, pc.alloc_offset = base, size, off
                pc.address = base + off
                where = "the same (allocation, offset)"
            pc.kernels = sorted(a.kernels)
            n_tc = len(a.token_counts)
            most = max((len(v) for v in a.users.values()), default=0)
            if most >= 2:
                pc.cls = "state"
                calls = any(u[0] == "call" for v in a.users.values() for u in v)
                pc.reason = (f"{where} in every pass at {n_tc} token counts, "
                             f"reached by {most} {'kernels or library calls' if calls else 'kernels'} of one pass shape")
            else:
                pc.cls = "weight"
                one = "one library call" if any(u[0] == "call" for v in a.users.values() for u in v) else "one kernel"
                pc.reason = f"{where} in every pass at {n_tc} token counts, reached by {one} per pass shape"
            continue
        users = max(a.users_per_pass.values(), default=0)
        if not a.token_counts:
            pc.reason = ("seen in a single pass" if pc.passes < 2 else
                         "the same (allocation, offset) in every pass, none of them with a known token count")
        elif users >= 2:
            pc.cls = "workspace"
            pc.reason = ("the same (allocation, offset) in every pass, all at one token count, and used by "
                         f"{users} call sites of one pass: an activation buffer the allocator recycles")
        else:
            pc.reason = ("the same (allocation, offset) in every pass, all at one token count: a weight cannot be "
                         "told from a buffer the allocator hands out identically every pass")
    return out
