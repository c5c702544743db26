"""Comparing two greedy token sequences, with bf16 near-ties told apart from real divergences.

Two runs of the same model in bf16 (kern against transformers, or kern against
itself with another prefill chunking) round at different points, so their logits
differ by a small noise. Where the two best logits of a step are closer than that
noise, greedy decoding may pick either: a *near-tie*. After one near-tie the two
runs feed different tokens and nothing later is comparable.

The rule used by the end-to-end test and the benchmark: at the first step where
the tokens differ (the context up to it is still shared), take each available
run's own logits at that step; the divergence is a near-tie when, in every one of
them, the logit of its own token exceeds the logit of the other run's token by no
more than the noise bound. Anything else is a real divergence: some run saw the
other token as clearly worse, so the two runs computed different things.

Pure numpy; the logits are rows over the vocabulary (bf16 as np.uint16 bits, or
any float dtype).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["Divergence", "bf16_to_f32", "first_difference", "judge_divergence", "top2_gap"]


def bf16_to_f32(a) -> np.ndarray:
    """bf16 bits (np.uint16) to float32; any other dtype is cast to float32."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where `a` and `b` differ (over their common length); None when they agree."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def top2_gap(row) -> float:
    """Best logit minus the second best."""
    top2 = np.partition(bf16_to_f32(row).reshape(-1), -2)[-2:]
    return float(top2.max() - top2.min())


@dataclass
class Divergence:
    """The first difference between two greedy runs `a` (the reference) and `b`, judged.

    ``gaps[name]`` is, in the logits of run `name` at ``step``, the logit of the token
    that run chose minus the logit of the other run's token (>= 0 when that run's
    argmax is exact). ``near_tie`` is true when every gap is <= ``bound``; None
    when no logits were given (cannot judge: treat as a failure).
    """

    step: int
    a_token: int
    b_token: int
    bound: float
    gaps: dict[str, float] = field(default_factory=dict)
    top2_gaps: dict[str, float] = field(default_factory=dict)
    near_tie: bool | None = None

    @property
    def real(self) -> bool:
        return self.near_tie is not True

    def record(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        gaps = ", ".join(f"{k} {v:.4f}" for k, v in self.gaps.items()) or "no logits on that context"
        verdict = {True: "bf16 near-tie", False: "REAL divergence", None: "cannot judge"}[self.near_tie]
        return (f"step {self.step}: {self.a_token} vs {self.b_token}; logit gaps ({gaps}) vs bf16 noise bound "
                f"{self.bound:.4f}: {verdict}")


def judge_divergence(a_tokens: Sequence[int], b_tokens: Sequence[int], bound: float,
                     logits: Mapping[str, tuple[str, object]] | None = None) -> Divergence | None:
    """Judge the first difference of `a_tokens` and `b_tokens` (None when they agree).

    `logits` maps a run's name to ``(side, row)``: side "a" or "b" says which of the
    two sequences that run produced (so which token is its own), `row` its logits at
    the first differing step, on the shared context. Give whatever runs have logits
    there: both kern runs for a kern-vs-kern comparison, HF's for kern-vs-HF.
    """
    i = first_difference(a_tokens, b_tokens)
    if i is None:
        return None
    d = Divergence(step=i, a_token=int(a_tokens[i]), b_token=int(b_tokens[i]), bound=float(bound))
    for name, (side, row) in (logits or {}).items():
        if side not in ("a", "b"):
            raise ValueError(f"{name}: side must be 'a' or 'b', not {side!r}")
        r = bf16_to_f32(row).reshape(-1)
        own, other = (d.a_token, d.b_token) if side == "a" else (d.b_token, d.a_token)
        d.gaps[name] = float(r[own] - r[other])
        d.top2_gaps[name] = top2_gap(r)
    if d.gaps:
        d.near_tie = all(g <= d.bound for g in d.gaps.values())
    return d
