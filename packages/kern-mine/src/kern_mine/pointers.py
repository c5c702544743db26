"""Step 5: classify each pointer parameter by its stability across passes.

A logical buffer is identified by ``(allocation base, offset)``, never by the
allocation alone: a caching allocator carves many tensors out of one
``cudaMalloc`` (two KV pools, every small index buffer in one 2 MB arena).

- ``workspace``: the identity changes from pass to pass (activations the
  allocator hands out per call; possibly the same allocation at another
  offset).
- stable (the same identity in every pass the site occurs in, across all
  requests) is persistent memory, weight or state. Directions are not in a
  capture, so the split is a heuristic: an identity reached by two or more
  different kernels is ``state`` (something writes it and something else
  reads it: a KV cache written by a cache-update kernel and read by
  attention); an identity reached by one kernel only is ``weight``. A weight
  that two flat kernels read (tied embeddings read by a gather and a flat
  GEMV) is reported as ``state``: the generator should check.
- ``unknown``: the site occurs in fewer than two passes, or some observation
  is not a device pointer (a null pointer in one pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kern_capture.records import LaunchRecord

from .sites import Site

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


def classify_pointers(launches: list[LaunchRecord], sites: list[Site]) -> list[PointerClass]:
    """One ``PointerClass`` per pointer parameter of every site, in site order."""
    out: list[PointerClass] = []
    users: dict[tuple[int, int], set[str]] = {}
    for s in sites:
        recs = [launches[i] for _, i in sorted(s.launches.items())]
        for prm in s.params:
            if prm.kind != "pointer":
                continue
            ids = set()
            non_device = 0
            size = None
            for r in recs:
                p = r.params[prm.index]  # type: ignore[index]
                if p.alloc is None:
                    non_device += 1
                    continue
                v = int.from_bytes(bytes.fromhex(p.hex), "little")
                ids.add((p.alloc.base, v - p.alloc.base))
                size = p.alloc.size
            pc = PointerClass(s.id, prm.index, prm.offset, "unknown", "", len(recs), len(ids))
            if non_device:
                pc.reason = f"not a device pointer in {non_device} of {len(recs)} passes"
            elif len(recs) < 2:
                pc.reason = "seen in a single pass"
            elif len(ids) > 1:
                bases = {b for b, _ in ids}
                pc.cls = "workspace"
                pc.reason = (f"{len(ids)} distinct (allocation, offset) over {len(recs)} passes"
                             + (" inside one allocation" if len(bases) == 1 else ""))
            else:
                (base, off), = ids
                pc.cls = "stable"
                pc.alloc_base, pc.alloc_size, pc.alloc_offset = base, size, off
                users.setdefault((base, off), set()).add(s.kernel.symbol)
            out.append(pc)
    for pc in out:
        if pc.cls != "stable":
            continue
        ks = sorted(users[(pc.alloc_base, pc.alloc_offset)])  # type: ignore[index]
        pc.kernels = ks
        if len(ks) >= 2:
            pc.cls = "state"
            pc.reason = f"the same (allocation, offset) in every pass, reached by {len(ks)} kernels"
        else:
            pc.cls = "weight"
            pc.reason = "the same (allocation, offset) in every pass, reached by one kernel"
    return out
