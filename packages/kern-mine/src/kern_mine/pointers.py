"""Step 6: classify each pointer parameter by its stability across passes.

Pointers are the pointer parameters of flat launches and the pointers embedded
in by-value structs or in a library launch's packed extra buffer (``sites.py``).

A logical buffer is identified by ``(allocation base, offset)``, never by the
allocation alone: a caching allocator carves many tensors out of one
``cudaMalloc`` (two KV pools, every small index buffer in one 2 MB arena, a
model's norm weights next to the activations of a decode step).

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
  shape is ``state`` (something writes it and something else reads it: a KV
  cache written by a cache-update kernel and read by attention); otherwise
  ``weight``. A weight that two kernels of one program read (tied embeddings
  read by a gather and a flat GEMV, an embedding re-read by fused kernels) is
  reported as ``state``: the generator should check.
- an address seen only in passes of one token count (a graph specialised to
  one-token decode): a weight and an activation the allocator hands out
  identically every step cannot be told apart by stability. If two or more call
  sites of one pass use the address, it is a recycled activation buffer
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

from .sites import EXTRA, AllocIndex, Site, embedded_words

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


@dataclass
class _Addr:
    """Everything known about one (allocation base, offset) over the capture."""

    token_counts: set[int] = field(default_factory=set)
    moving_user: tuple[int, int] | None = None  # (site, param) whose buffer moves and sometimes lands here
    kernels: dict[int, set[str]] = field(default_factory=dict)  # shape -> kernels reaching it, stable
    users_per_pass: dict[int, int] = field(default_factory=dict)  # pass -> call sites using it


def _slots(s: Site):
    """(param, offset, within, reader) of every pointer of a site: plain pointer parameters, then embedded ones.
    A reader maps a launch to ((allocation base, size), address) or None (not a device pointer there)."""
    for prm in s.params:
        if prm.kind == "pointer":
            def plain(r: LaunchRecord, j: int = prm.index):
                x = r.params[j]  # type: ignore[index]
                if x.alloc is None:
                    return None
                return (x.alloc.base, x.alloc.size), int.from_bytes(bytes.fromhex(x.hex), "little")
            yield prm.index, prm.offset, None, plain
    offsets = {prm.index: prm.offset for prm in s.params}
    for e in s.embedded:
        yield e.param, (0 if e.param == EXTRA else offsets[e.param]), e.within, e


def classify_pointers(launches: list[LaunchRecord], sites: list[Site],
                      tokens: Mapping[int, int | None] | None = None,
                      allocs: AllocIndex | None = None) -> list[PointerClass]:
    """One ``PointerClass`` per pointer of every site (parameters, then embedded pointers), in site order.

    ``tokens`` maps pass index to its token count (None: unknown); ``allocs`` resolves embedded pointers."""
    tokens = tokens or {}
    out: list[PointerClass] = []
    addrs: dict[tuple[int, int], _Addr] = {}
    stable_id: list[tuple[int, int] | None] = []
    sizes: list[int | None] = []
    for s in sites:
        items = sorted(s.launches.items())
        recs = [(p, launches[i]) for p, i in items]
        for param, offset, within, reader in _slots(s):
            ids: dict[tuple[int, int], list[int]] = {}
            non_device = 0
            size = None
            for p, r in recs:
                if within is None:
                    got = reader(r)  # type: ignore[operator]
                else:
                    v = embedded_words(r, reader)  # type: ignore[arg-type]
                    a = None if v is None or allocs is None else allocs.find(v)
                    got = None if a is None else (a, v)
                if got is None:
                    non_device += 1
                    continue
                (base, size), v = got
                ids.setdefault((base, v - base), []).append(p)
            pc = PointerClass(s.id, param, offset, "unknown", "", len(recs), len(ids), within=within)
            sizes.append(size)
            moving = len(ids) > 1
            for ident, ps in ids.items():
                a = addrs.get(ident)
                if a is None:
                    a = addrs[ident] = _Addr()
                # only forward passes (a known token count) testify about an address: the
                # launches of compile and autotune windows reuse memory in their own ways
                known = [p for p in ps if tokens.get(p) is not None]
                for p in known:
                    a.users_per_pass[p] = a.users_per_pass.get(p, 0) + 1
                    a.token_counts.add(tokens[p])  # type: ignore[arg-type]
                if not known:
                    continue
                if moving:
                    if a.moving_user is None:
                        a.moving_user = (s.id, param)
                else:
                    a.kernels.setdefault(s.shape, set()).add(s.kernel.symbol)
            if non_device:
                pc.reason = f"not a device pointer in {non_device} of {len(recs)} passes"
                stable_id.append(None)
            elif moving:
                bases = {b for b, _ in ids}
                pc.cls = "workspace"
                pc.reason = (f"{len(ids)} distinct (allocation, offset) over {len(recs)} passes"
                             + (" inside one allocation" if len(bases) == 1 else ""))
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
            by_shape = {sh: ks for sh, ks in a.kernels.items()}
            ks = sorted(set().union(*by_shape.values()))
            pc.alloc_base, pc.alloc_size, pc.alloc_offset = base, size, off
            pc.kernels = ks
            n_tc = len(a.token_counts)
            if any(len(v) >= 2 for v in by_shape.values()):
                pc.cls = "state"
                most = max(len(v) for v in by_shape.values())
                pc.reason = (f"the same (allocation, offset) in every pass at {n_tc} token counts, "
                             f"reached by {most} kernels of one pass shape")
            else:
                pc.cls = "weight"
                pc.reason = (f"the same (allocation, offset) in every pass at {n_tc} token counts, "
                             "reached by one kernel per pass shape")
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
