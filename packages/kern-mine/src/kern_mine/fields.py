"""The observed quantities of each site: grid axes and scalar parameters.

A field is one integer per pass the site occurs in; fitting it against a
token count per pass is ``fit.fit_samples``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kern_capture.records import LaunchRecord

from .fit import Fit, fit_pairs, fit_samples
from .sites import Site, scalar_value

__all__ = ["Field", "site_fields", "fit_field", "site_token_counts", "AXES"]

AXES = ("x", "y", "z")


@dataclass
class Field:
    """``values``: (pass index, value) for each regular pass the site occurs in."""

    site: int
    kind: str  # "grid" | "scalar"
    index: int  # axis 0..2, or parameter index
    values: list[tuple[int, int]]
    const: int | None = None  # the value, when it is the same in every pass

    def __post_init__(self) -> None:
        vs = {v for _, v in self.values}
        if len(vs) == 1:
            self.const = next(iter(vs))

    @property
    def name(self) -> str:
        return f"grid.{AXES[self.index]}" if self.kind == "grid" else f"param[{self.index}]"


def site_fields(launches: list[LaunchRecord], sites: list[Site]) -> list[Field]:
    """Every grid axis and every scalar parameter of every site."""
    out: list[Field] = []
    for s in sites:
        items = sorted(s.launches.items())
        for a in range(3):
            out.append(Field(s.id, "grid", a, [(p, launches[i].grid[a]) for p, i in items]))
        for prm in s.params:
            if prm.kind == "scalar":
                out.append(Field(s.id, "scalar", prm.index,
                                 [(p, scalar_value(launches[i], prm.index)) for p, i in items]))
    return out


def fit_field(f: Field, tokens: Mapping[int, int | None], tokens_max: int,
              site_tokens: tuple[int, ...] | None = None) -> Fit:
    """Fit a field against the passes' token counts (passes without one are skipped).

    ``site_tokens`` (the sorted distinct token counts of the site's passes) is a
    shortcut for constant fields."""
    if f.const is not None and site_tokens is not None:
        return fit_pairs(tuple((t, f.const) for t in site_tokens), tokens_max)
    samples = []
    for p, v in f.values:
        t = tokens.get(p)
        if t is not None:
            samples.append((t, v))
    return fit_samples(samples, tokens_max)


def site_token_counts(f: Field, tokens: Mapping[int, int | None]) -> tuple[int, ...]:
    """Sorted distinct token counts of the passes a field (its site) was seen in."""
    return tuple(sorted({t for p, _ in f.values if (t := tokens.get(p)) is not None}))
