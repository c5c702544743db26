"""The memory plan: buffer bytes at the var maxima, 256-byte aligned arena offsets,
states per 1,000 tokens and at a capacity, per-op scratch."""

from __future__ import annotations

import pytest
from kern_schema import decode

from verify_helpers import fixture, text_of
from kern_verify import PlanError, plan


def planned(name: str, capacity: int = 1000, mutate=None):
    d = fixture(name)
    if mutate:
        mutate(d)
    return plan(decode(text_of(d)), capacity)


def test_buffers_at_maxima_and_aligned_offsets():
    p = planned("carry")
    ids = p.buffer("token_ids")
    assert (ids.class_, ids.dtype, ids.shape, ids.nbytes, ids.aligned_nbytes, ids.offset) == ("input", "i64", (512,), 4096, 4096, 0)
    nt = p.buffer("next_token")
    assert nt.nbytes == 8 and nt.aligned_nbytes == 256
    offsets = [b.offset for b in p.buffers]
    assert offsets == sorted(offsets) and all(o % 256 == 0 for o in offsets)
    for a, b in zip(p.buffers, p.buffers[1:]):
        assert b.offset == a.offset + a.aligned_nbytes
    assert p.by_class["weight"] == 1024 * 64 * 2
    assert p.by_class["workspace"] == 512 * 64 * 2 + 1024 * 4
    assert p.by_class["carry"] == 256 and p.by_class["output"] == 256


def test_states():
    p = planned("carry", capacity=2000)
    kv, pos = p.states
    assert (kv.unit, kv.per_1000_tokens, kv.nbytes) == ("token", 4096 * 1000, 4096 * 2000)
    assert (pos.unit, pos.per_1000_tokens, pos.nbytes, pos.align) == ("seq", None, 512, 512)  # 1 seq x 256, aligned to 512
    assert p.state_bytes == kv.nbytes + pos.nbytes


def test_scratch_after_buffers():
    p = planned("scratch")
    partial, lse = p.scratch
    assert (partial.op, partial.name, partial.nbytes) == ("paged_attention", "partial", 64 * 32 * 16 * 128 * 4)
    assert lse.nbytes == 64 * 32 * 16 * 4
    last = p.buffers[-1]
    assert partial.offset == last.offset + last.aligned_nbytes
    assert p.arena_bytes == lse.offset + lse.aligned_nbytes
    assert p.scratch_bytes == partial.aligned_nbytes + lse.aligned_nbytes
    assert p.total_bytes == p.arena_bytes + p.state_bytes


def test_render_lists_every_class_and_op():
    text = planned("scratch").render()
    for word in ("input", "output", "weight", "workspace", "carry", "paged_attention", "kv", "per 1,000 tokens", "total"):
        assert word in text


def test_unverifiable_manifest_raises_plan_error():
    with pytest.raises(PlanError, match="tokenz"):
        planned("launch", mutate=lambda d: d["buffers"]["x"]["shape"].__setitem__(0, "tokenz"))
    with pytest.raises(PlanError):
        planned("launch", capacity=-1)
    with pytest.raises(PlanError, match="positive"):
        planned("launch", capacity=0)
