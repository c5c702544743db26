"""The edge cases of a torch.compile workload, on a synthetic capture modelled on the real one
(synth.write_compiled_capture): a prefill graph and a one-token decode graph with different
kernels, an eager ``arange`` before each graph with a guard pause between them, cache-reset
fills, library GEMMs whose kernel and count depend on the token count, host stalls inside
passes, decode activations at the same addresses every step (a deterministic allocator, in
the same arena as the norm weights)."""

import pytest
from kern_schema import to_text
from synth import DEC_ACT, KVC_BASE, SMALL_BASE, CompiledSpec, write_compiled_capture

from kern_mine.mine import mine

PROMPTS = [1, 5, 30, 100]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("compiled")
    truth = write_compiled_capture(d, CompiledSpec(prompts=PROMPTS))
    return d, truth, mine(d)


def _site(r, symbol, occ=0):
    return next(s for s in r.sites if s.symbol == symbol and s.occurrence == occ)


def _ptrs(r, site):
    return {p.param: p for p in r.pointers if p.site == site.id}


def test_requests_prefill_and_decode_token_counts(compiled):
    _, truth, r = compiled
    assert [w.index for w in r.requests] == truth.requests
    assert [[p.tokens for p in w.passes] for w in r.requests] == [[p, 1, 1, 1] for p in PROMPTS]
    assert all([p.kind for p in w.passes] == ["prefill", "decode", "decode", "decode"] for w in r.requests)
    # the warm-up window is not a request (its passes after the first are not all 1 token);
    # the reset windows (fills only) have no token count
    warm = r.other_windows[0]
    assert [p.tokens for p in warm.passes] == [None, 64, 17, 3, 1, 2, 7]
    assert all(p.passes[0].tokens is None for p in r.other_windows[1:])


def test_passes_start_at_the_eager_prologue(compiled):
    # Every pass starts at its arange (after the host sync), not at the graph's first kernel
    # (after the longer guard pause), and no stall inside a pass becomes a boundary: the first
    # pass at a new token count stalls before a GEMM, every prefill pass stalls before layer 1's
    # norm and before its final norm (a sub-cycle as regular as the pass it would split).
    _, truth, r = compiled
    starts = sorted(p.launches[0] for w in r.requests + r.other_windows for p in w.passes if p.tokens is not None)
    assert starts == truth.start_of_pass
    assert [(k.symbol, k.passes) for k in r.pass_split.start_kernels] == [("arange", 22)]
    assert r.summary.regular_passes == r.summary.passes == 27


def test_library_kernels_do_not_make_passes_irregular(compiled):
    # below 64 tokens a split-K GEMM and a flat reduce, above another GEMM kernel: the GEMMs go
    # through the extra buffer and are not counted; the reduce keeps its count where it runs
    _, _, r = compiled
    prefills = [p for w in r.requests for p in w.passes[:1]] + r.other_windows[0].passes[1:]
    assert all(p.regular and p.mismatch == 0 for p in prefills)
    red = _site(r, "splitk_reduce")
    assert red.token_counts == [2, 3, 5, 7, 17, 30]


def test_two_graphs_are_two_shapes(compiled):
    _, _, r = compiled
    by_shape = {sh.id: sh for sh in r.shapes}
    prefill = {s.shape for s in r.sites if s.symbol.startswith("p_")}
    decode = {s.shape for s in r.sites if s.symbol.startswith("d_")}
    assert len(prefill) == len(decode) == 1 and prefill != decode
    (p,), (d,) = prefill, decode
    assert by_shape[p].token_counts == [2, 3, 5, 7, 17, 30, 64, 100]
    assert by_shape[d].token_counts == [1] and by_shape[d].passes == 4 + 3 * 4 - 2
    # arange runs before both graphs: one site per shape
    assert sorted(s.shape for s in r.sites if s.symbol == "arange") == sorted([p, d])
    # decode-graph sites only ever see 1 token: counted apart, never as "fitted"
    flat_d = [s for s in r.sites if s.shape == d and s.flat]
    assert r.summary.flat_sites_single_count == len(flat_d)
    assert all(s.token_counts == [1] and s.grid[0].status == "underdetermined" for s in flat_d)
    assert r.summary.flat_sites_no_count == 4  # the reset windows' fills
    assert r.summary.flat_sites_multi_count == by_shape[p].flat_sites


def test_reference_is_the_scalar_of_a_kernel_outside_the_graphs(compiled):
    # No grid inside the decode graph varies; the arange's element count (a scalar) is the
    # token count of every pass of both graphs. The prefill graph's own token counts (its first
    # kernel's grid) explain the prefill sites as well but leave the decode passes without one.
    _, _, r = compiled
    ref = r.reference
    assert (ref.symbol, ref.field, ref.axis, ref.param, ref.divisor) == ("arange", "param[0]", None, 0, 1)
    assert ref.candidates[0].passes == 22
    inside = next(c for c in ref.candidates if c.symbol == "p_embed_norm" and c.field == "grid.x")
    assert inside.passes == 8 and inside.unobserved > 0 and inside.score > ref.candidates[0].score


def test_prefill_fits(compiled):
    _, _, r = compiled
    txt = lambda s: [to_text(g.expr) for g in s.grid]  # noqa: E731
    assert txt(_site(r, "p_add_norm", 2)) == ["tokens", "1", "1"]
    assert txt(_site(r, "p_attn_softmax")) == ["mul(tokens, 16)", "1", "1"]
    assert txt(_site(r, "p_qk_norm_rope_cache", 3)) == ["ceil_div(mul(tokens, 3), 8)", "1", "1"]
    mlp = {x.param: x.fit for x in _site(r, "p_mlp_act").scalars}
    assert to_text(mlp[2].expr) == "mul(tokens, 3072)"


def test_weights_and_workspace_in_both_graphs(compiled):
    # The norm weights and the decode activations share one small-block allocation. A prefill
    # activation moves with the token count: workspace. A decode activation sits at the same
    # address every decode step (and every step is 1 token): stability cannot tell it from a
    # weight, but several call sites of one pass use it (the allocator recycles it layer after
    # layer): workspace. A decode norm's weight is the prefill norm's weight, stable over 9
    # token counts: weight.
    _, _, r = compiled
    for layer in (1, 2, 3):
        p, d = _ptrs(r, _site(r, "p_add_norm", layer - 1)), _ptrs(r, _site(r, "d_add_norm", layer - 1))
        for ptrs in (p, d):
            assert ptrs[2].class_ == "weight" and ptrs[2].alloc_base == SMALL_BASE
            assert ptrs[2].alloc_offset == 2 * layer * 0x800
            assert [ptrs[i].class_ for i in (0, 1, 3)] == ["workspace"] * 3
        assert "distinct (allocation, offset)" in p[0].reason
        assert "activation buffer the allocator recycles" in d[0].reason
    # the KV cache: written by the resets' fills and the cache update, read by attention
    kv = _ptrs(r, _site(r, "d_attn_softmax", 1))[1]
    assert kv.class_ == "state" and (kv.alloc_base, kv.alloc_offset) == (KVC_BASE, 0x10_0000)
    # a decode-only buffer at a fixed address that one call site uses: nothing tells it apart
    out = _ptrs(r, _site(r, "d_argmax"))[1]
    assert out.class_ == "unknown" and "cannot be told" in out.reason
    assert DEC_ACT  # the decode activations' offset in the small arena (see synth)
