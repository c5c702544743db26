"""Pass shapes: which regular passes run the same program.

A compiled model may run different programs for different passes: Dynamo
specialises a one-token decode graph beside the prefill graph, a serving
engine has separate prefill and decode paths. Their kernels are different
(another graph's kernels are other compiled functions, even when a name
repeats), so their call sites are different call sites, and a program only
ever run at one token count (the decode graph) has fields that are constants
*by construction*.

Two regular passes have the same shape when their sets of kernels (symbol +
parameter layout) overlap by at least ``SHAPE_JACCARD`` (intersection over
union), transitively. Passes of one program at different token counts differ
only in a few library kernels (cuBLAS picks another GEMM kernel, a split-K
reduce appears), two programs share only the odd library kernel. Shapes are
numbered in order of their first pass; irregular passes have none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .passes import Pass

__all__ = ["Shape", "assign_shapes", "SHAPE_JACCARD"]

SHAPE_JACCARD = 0.5


@dataclass
class Shape:
    """One program: its passes, their kernels, and the token counts it was seen at."""

    id: int
    passes: list[int] = field(default_factory=list)
    kernels: set[int] = field(default_factory=set)
    token_counts: list[int] = field(default_factory=list)


def assign_shapes(passes: list[Pass], kid: np.ndarray) -> list[Shape]:
    """Set ``Pass.shape`` of every regular pass; return the shapes."""
    sets: dict[frozenset[int], list[int]] = {}
    for p in passes:
        if p.regular:
            sets.setdefault(frozenset(np.unique(kid[p.start:p.end]).tolist()), []).append(p.index)
    keys = list(sets)
    parent = list(range(len(keys)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(keys)):
        for j in range(i):
            a, b = keys[i], keys[j]
            inter = len(a & b)
            if inter and inter >= SHAPE_JACCARD * len(a | b):
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[ri] = rj
    groups: dict[int, list[int]] = {}
    for i in range(len(keys)):
        groups.setdefault(find(i), []).append(i)
    by_pass = {p.index: p for p in passes}
    shapes = []
    for members in sorted(groups.values(), key=lambda m: min(min(sets[keys[i]]) for i in m)):
        s = Shape(len(shapes))
        for i in members:
            s.passes += sets[keys[i]]
            s.kernels |= keys[i]
        s.passes.sort()
        for pi in s.passes:
            by_pass[pi].shape = s.id
        shapes.append(s)
    return shapes
