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
    # the requests ran both graphs: the share over their sites counts the decode graph's
    # constants as not fitted (the reset windows' fills, in no request, are not counted)
    s = r.summary
    assert s.request_shapes == sorted([p, d])
    assert s.flat_sites_request_shapes == by_shape[p].flat_sites + by_shape[d].flat_sites == 54
    assert s.flat_sites_request_shapes_grid_fitted == by_shape[p].flat_sites_grid_fitted == 18


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


@pytest.fixture(scope="module")
def compiled_gemms(tmp_path_factory):
    """The same workload with the GEMMs' packed arguments recorded (extra_hex)."""
    d = tmp_path_factory.mktemp("compiled_gemms")
    write_compiled_capture(d, CompiledSpec(prompts=PROMPTS, gemm_extra=True))
    return mine(d)


def _calls(r, shape):
    """call index -> the library call sites of one shape (one per kernel the library picked for it)."""
    out = {}
    for s in r.sites:
        if s.shape == shape and not s.flat:
            out.setdefault(s.call, []).append(s)
    return out


def _shapes(r):
    (p,) = {s.shape for s in r.sites if s.symbol.startswith("p_")}
    (d,) = {s.shape for s in r.sites if s.symbol.startswith("d_")}
    return p, d


def test_library_calls_are_aligned_by_call_not_by_kernel(compiled_gemms):
    # The library picks its kernel by size, so gemm_64x8's second launch is layer 0's down
    # projection at 3 tokens and layer 1's o projection at 17. Sites of extra-buffer launches are
    # aligned by their index among the pass's library calls: 3 per layer and lm_head.
    r = compiled_gemms
    layers = CompiledSpec(prompts=PROMPTS).layers
    p, d = _shapes(r)
    for shape in (p, d):
        calls = _calls(r, shape)
        assert sorted(calls) == list(range(3 * layers + 1))
    pc = _calls(r, p)
    # layer 0's down projection: gemm_64x8 below 16 tokens, gemm_128x64 from 16 (one site each)
    assert sorted((s.symbol, s.token_counts[0]) for s in pc[2]) == [("gemm_128x64", 17), ("gemm_64x8", 2)]
    assert {s.occurrence for s in pc[2] if s.symbol == "gemm_64x8"} == {1}  # its 2nd launch at 3 tokens
    # flat sites keep (kernel, occurrence) alignment
    assert all(s.call is None for s in r.sites if s.flat)


def test_gemm_weights_outside_any_annotated_allocation(compiled_gemms):
    # Each GEMM's packed arguments: in (activation), weight, out (activation). The weights of
    # layers >= 1 lie in memory no flat kernel touches, so no annotated allocation holds them; the
    # position of the weight word is learned from layer 0's, which lies in an annotated allocation
    # (the embedding's). Every GEMM of both graphs reads its weight at one address, told apart
    # from the activations; lm_head reads the (tied) embedding, which embed_norm also reads: state.
    from synth import EMB_BASE, gemm_weight

    r = compiled_gemms
    layers = CompiledSpec(prompts=PROMPTS).layers
    by_site = {}
    for x in r.pointers:
        by_site.setdefault(x.site, []).append(x)
    p, d = _shapes(r)
    for shape in (p, d):
        for call, sites in _calls(r, shape).items():
            for s in sites:
                assert s.embedded_pointers == [(-1, 0), (-1, 8), (-1, 16), (-1, 40)]  # not M, N, K
                a, w, c, c2 = by_site[s.id]
                assert w.distinct == 1 and c2.class_ == c.class_
                if call == 3 * layers:  # lm_head
                    assert (w.class_, w.address, w.alloc_base) == ("state", EMB_BASE, EMB_BASE)
                    # its output (logits) in the decode graph: one address every step, which no other
                    # call site uses (the struct holding it twice does not make two users): unknown
                    assert c.class_ == ("workspace" if shape == p else "unknown")
                    continue
                layer, k = divmod(call, 3)
                assert w.class_ == "weight" and w.address == gemm_weight(layer, k), (shape, call, s.symbol)
                if layer:
                    assert w.alloc_base is None and "in no allocation the capture annotated" in w.reason
                else:
                    assert (w.alloc_base, w.alloc_offset) == (EMB_BASE, gemm_weight(0, k) - EMB_BASE)
                assert "reached by one library call per pass shape" in w.reason
                assert a.class_ == c.class_ == "workspace"
                if shape == p:
                    assert "distinct (allocation, offset)" in a.reason
    # weights are never workspace anywhere
    weights = {gemm_weight(layer, k) for layer in range(layers) for k in range(3)}
    assert {x.class_ for x in r.pointers if x.address in weights} == {"weight"}


def test_kernel_alignment_would_mix_gemms(compiled_gemms, tmp_path):
    # What call alignment buys: without it (a shape whose passes make different numbers of library
    # calls falls back to (kernel, occurrence)), gemm_64x8's n-th launch is a different GEMM at
    # different token counts: its weight word moves, and the weights it lands on become workspace.
    from kern_capture.records import LaunchRecord

    from kern_mine.capture import load_capture
    from kern_mine.passes import Pass
    from kern_mine.pointers import classify_pointers
    from kern_mine.sites import AllocIndex, Words, align_sites, kernel_keys

    d = tmp_path / "c"
    write_compiled_capture(d, CompiledSpec(prompts=PROMPTS, gemm_extra=True))
    launches: list[LaunchRecord] = load_capture(d).launches
    r = compiled_gemms
    passes = []
    for w in r.requests + r.other_windows:
        for x in w.passes:
            if x.shape is not None:
                passes.append(Pass(x.index, w.index, x.launches[0], x.launches[1], shape=x.shape, tokens=x.tokens))
    kid, kernels = kernel_keys(launches)
    words = Words(launches, AllocIndex(launches))
    tokens = {x.index: x.tokens for x in passes}
    aligned = align_sites(launches, kid, kernels, passes, words)
    assert any(s.call is not None for s in aligned)
    # cut one prefill pass short before its lm_head: the shape's passes no longer agree on the
    # number of library calls
    p, _ = _shapes(r)
    victim = next(x for x in passes if x.shape == p and x.tokens == 17)
    victim.end = next(i for i in range(victim.start, victim.end) if launches[i].symbol == "lm_head")
    mixed = align_sites(launches, kid, kernels, passes, words)
    assert all(s.call is None for s in mixed if s.shape == p)
    ptrs = classify_pointers(launches, mixed, tokens, words)
    site = next(s for s in mixed if s.shape == p and s.kernel.symbol == "gemm_64x8" and s.occurrence == 1)
    w = next(x for x in ptrs if x.site == site.id and x.within == 8)
    assert w.cls == "workspace" and w.distinct == 2
