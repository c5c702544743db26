from kern_schema import to_text


def _site(r, symbol, occ=0):
    return next(s for s in r.sites if s.symbol == symbol and s.occurrence == occ)


def test_reference_is_chosen_by_score(standard):
    _, _, r = standard
    ref = r.reference
    assert (ref.symbol, ref.field, ref.axis, ref.param) == ("embed", "grid.x", "x", None)
    scores = {(c.symbol, c.field): (c.score, c.unfit, c.underdetermined, c.values) for c in ref.candidates}
    # 118 fields: the 6 position-dependent scalars are unfit under any reference;
    # bucket's grid (ceil_div(tokens, 32) seen up to 64) is underdetermined.
    assert scores[("embed", "grid.x")] == (7, 6, 1, [1, 3, 5, 16, 17, 30, 64])
    # rope counts pairs of tokens: 22 more fields are not functions of it
    assert scores[("rope", "grid.x")][0] == 29 and scores[("rope", "grid.x")][3] == [1, 2, 3, 8, 9, 15, 32]
    # the degenerate candidate (values 1 and 2 only) explains the least
    assert scores[("bucket", "grid.x")][0] == 32 and scores[("bucket", "grid.x")][3] == [1, 2]
    # scalars are candidates too: embed's 64·tokens element count, judged on its own range [1, 64·64],
    # leaves more fields underdetermined than the token count itself (divided by its common factor 64
    # it would be the same candidate as embed's grid, and is dropped as a duplicate)
    assert scores[("embed", "param[3]")][:3] == (26, 6, 20)
    # first launches of multi-launch kernels are candidates too; those giving the same
    # counts as embed (rms_norm, kv_write: tokens; act / 3) are dropped as duplicates
    assert [(c.symbol, c.field, c.divisor, c.once_per_pass, c.score) for c in ref.candidates] == [
        ("embed", "grid.x", 1, True, 7), ("act", "grid.x", 1, False, 11), ("act", "param[2]", 1, False, 26),
        ("embed", "param[3]", 1, True, 26), ("rope", "grid.x", 1, True, 29), ("attn", "grid.x", 1, False, 30),
        ("attn", "param[3]", 1, False, 30), ("bucket", "grid.x", 1, True, 32)]


def test_sites_align_by_symbol_and_occurrence(standard):
    _, _, r = standard
    assert r.summary.sites == 30 and r.summary.flat_sites == 20
    norms = [s for s in r.sites if s.symbol == "rms_norm"]
    assert [s.occurrence for s in norms] == list(range(7))
    assert all(s.passes == 19 for s in r.sites)
    # params via extra: no scalars, no pointers, but the grid is still fitted
    g = _site(r, "gemm_qkv", 1)
    assert not g.flat and g.scalars == [] and [to_text(f.expr) for f in g.grid] == ["1", "3", "1"]


def test_grid_and_scalar_fits(standard):
    _, _, r = standard
    grid = lambda s: [to_text(f.expr) if f.status == "fit" else f.status for f in s.grid]  # noqa: E731
    assert grid(_site(r, "rms_norm", 3)) == ["tokens", "1", "1"]
    assert grid(_site(r, "attn", 2)) == ["ceil_div(tokens, 16)", "4", "1"]
    assert grid(_site(r, "act", 0)) == ["mul(tokens, 3)", "1", "1"]
    assert grid(_site(r, "rope")) == ["ceil_div(tokens, 2)", "1", "1"]
    bucket = _site(r, "bucket").grid[0]
    assert bucket.status == "underdetermined"
    assert [to_text(c) for c in bucket.candidates] == ["ceil_div(tokens, 32)", "ceil_div(tokens, 63)"]
    sc = {x.param: x.fit for x in _site(r, "embed").scalars}
    assert to_text(sc[3].expr) == "mul(tokens, 64)"
    kv = {x.param: x.fit for x in _site(r, "kv_write", 1).scalars}
    assert to_text(kv[2].expr) == "tokens"
    assert kv[3].status == "unfit" and kv[3].reason.startswith("not a function of tokens: tokens=1 gives")
    norm = {x.param: x.fit for x in _site(r, "rms_norm", 0).scalars}
    assert norm[3].expr == 64 and norm[4].expr == 0x358637BD  # f32 1e-6, as its bits
    assert r.summary.flat_sites_grid_fitted == 19  # all flat sites but `bucket`
    assert r.summary.fields == {"fit": 111, "underdetermined": 1, "unfit": 6}


def test_degenerate_token_counts(degenerate):
    _, truth, r = degenerate
    assert [[p.tokens for p in w.passes] for w in r.requests] == truth.windows == [[2, 1]] * 3
    # tokens ∈ {1, 2} claimed on [1, 64]: `tokens` cannot be told from ceil_div(mul(tokens, 3), 4),
    # nor 1 from ceil_div(tokens, 2)
    norm = _site(r, "rms_norm").grid[0]
    assert norm.status == "underdetermined"
    assert [to_text(c) for c in norm.candidates][:2] == ["tokens", "ceil_div(mul(tokens, 3), 4)"]
    attn = _site(r, "attn").grid[0]
    assert attn.status == "underdetermined"
    assert [to_text(c) for c in attn.candidates][:2] == ["1", "ceil_div(tokens, 2)"]
    assert r.summary.flat_sites_grid_fitted == 0


def test_a_reference_counting_blocks_is_divided(tmp_path):
    from synth import Spec, write_capture

    from kern_mine.mine import mine

    # embed launches 4 blocks per token; rope (ceil_div(t, 2)) is the other candidate
    write_capture(tmp_path, Spec(prompts=[1, 5, 16, 30], warmup=[64, 17, 3], embed_blocks=4))
    r = mine(tmp_path)
    assert (r.reference.symbol, r.reference.divisor) == ("embed", 4)
    assert [w.passes[0].tokens for w in r.requests] == [1, 5, 16, 30]
    undivided = next(c for c in r.reference.candidates if c.symbol == "embed" and c.divisor == 1)
    best = r.reference.candidates[0]
    # undivided, 1 token is 4 "tokens": more fits become ceil_divs, some can no longer be pinned
    assert (undivided.score, undivided.complexity) == (10, 48) and (best.score, best.complexity) == (7, 38)
    embed = next(s for s in r.sites if s.symbol == "embed")
    assert to_text(embed.grid[0].expr) == "mul(tokens, 4)"
