from synth import A_BASE, KV_BASE, TOK_BASE, W_BASE


def _ptrs(r, symbol, occ=0):
    site = next(s for s in r.sites if s.symbol == symbol and s.occurrence == occ)
    return {p.param: p for p in r.pointers if p.site == site.id}


def test_two_logical_buffers_in_one_allocation(standard):
    _, _, r = standard
    # the 7 norm weights share one allocation at distinct offsets: 7 weights, not 1
    w = [_ptrs(r, "rms_norm", k)[1] for k in range(7)]
    assert all(p.class_ == "weight" and p.alloc_base == W_BASE for p in w)
    assert [p.alloc_offset for p in w] == [0, 4096, 512, 4608, 1024, 5120, 8192]
    assert w[0].reason == ("the same (allocation, offset) in every pass at 7 token counts, "
                           "reached by one kernel per pass shape")


def test_state_is_reached_by_two_kernels(standard):
    _, _, r = standard
    for layer in range(3):
        kw, at = _ptrs(r, "kv_write", layer)[1], _ptrs(r, "attn", layer)[1]
        assert kw.class_ == at.class_ == "state"
        assert (kw.alloc_base, kw.alloc_offset) == (at.alloc_base, at.alloc_offset) == (KV_BASE, layer * 0x10000)
        assert kw.kernels == ["attn", "kv_write"]


def test_workspace_moves_inside_one_allocation(standard):
    _, _, r = standard
    x = _ptrs(r, "rms_norm", 2)[0]
    assert x.class_ == "workspace" and x.alloc_base is None
    assert x.distinct == 11 and x.reason == "11 distinct (allocation, offset) over 19 passes inside one allocation"
    tok = _ptrs(r, "argmax")[1]
    assert tok.class_ == "weight" and tok.alloc_base == TOK_BASE  # a persistent output buffer looks like a weight
    assert r.summary.pointers == {"workspace": 34, "weight": 9, "state": 6}
    assert A_BASE not in {p.alloc_base for p in r.pointers}


def test_gemm_pointers_in_the_extra_buffer(tmp_path):
    # Library GEMMs pass their arguments through the packed extra buffer (kern-capture keeps it,
    # up to 4 KiB, as extra_hex). Words that lie in an allocation the capture annotated elsewhere
    # (here the norm weights' and the activations' allocations) are pointers: the weight operand
    # is stable, the activations move.
    from synth import GEMM_W, Spec, write_capture

    from kern_mine.mine import mine

    write_capture(tmp_path, Spec(prompts=[1, 5, 16, 30], warmup=[64, 17, 3], gemm_extra=True))
    r = mine(tmp_path)
    for layer in range(3):
        for k, sym in enumerate(("gemm_qkv", "gemm_o", "gemm_down")):
            site = next(s for s in r.sites if s.symbol == sym and s.occurrence == layer)
            assert not site.flat and site.embedded_pointers == [(-1, 0), (-1, 8), (-1, 16)]
            a, b, c = (p for p in r.pointers if p.site == site.id)
            assert (a.param, a.within, b.within, c.within) == (-1, 0, 8, 16)
            assert (a.class_, b.class_, c.class_) == ("workspace", "weight", "workspace")
            assert (b.alloc_base, b.alloc_offset) == (W_BASE, GEMM_W + (3 * layer + k) * 0x2000)
    # M, N, K (not in any allocation) are not pointers; 10 GEMMs (9 in the layers, lm_head) add one
    # weight and two workspace pointers each; nothing else changed
    assert r.summary.pointers == {"workspace": 34 + 20, "weight": 9 + 10, "state": 6}


def test_extra_buffer_pointer_positions_are_learned_per_buffer_size():
    # A word of an extra buffer outside every annotated allocation is a pointer only at a position
    # where some extra buffer of the same size holds an annotated pointer, and only when it is
    # non-zero and in the annotated allocations' 1 TiB of address space.
    import msgspec
    from kern_capture.records import LaunchRecord

    from kern_mine.sites import EXTRA, AllocIndex, Words

    base, size = 0x7F00_0000_0000, 1 << 20

    def rec(seq, words, params=None):
        d = {"seq": seq, "t_ns": seq, "pid": 1, "tid": 1, "ctx": 1, "stream": 0, "module_id": 1, "symbol": "k",
             "api": "cuLaunchKernel", "grid": [1, 1, 1], "block": [1, 1, 1], "shared_mem": 0, "attrs": None,
             "params": params, "params_reason": None if params else "extra"}
        if words is not None:
            d["extra_hex"] = b"".join(w.to_bytes(8, "little") for w in words).hex()
        return msgspec.convert(d, LaunchRecord)

    flat = rec(0, None, [{"offset": 0, "size": 8, "hex": base.to_bytes(8, "little").hex(),
                          "alloc": {"base": base, "size": size}, "host": False}])
    far = 0x7F00_9000_0000  # no annotated allocation holds it, same 1 TiB
    launches = [
        flat,
        rec(1, [base + 0x100, 7, 0]),          # position 0 learned (annotated); 8 and 16 not
        rec(2, [far, far, 0]),                 # 0: pointer (learned); 8: not learned
        rec(3, [0, 0x1234, 0]),                # zero / small value: not pointers
        rec(4, [0x5F00_0000_0000, 0, 0]),      # another region: not a pointer
        rec(5, [far, far]),                    # another buffer size: nothing learned for it
    ]
    words = Words(launches, AllocIndex(launches))
    assert words.extra_positions[24].tolist() == [True, False, False]
    assert words.extra_positions[16].tolist() == [False, False]
    _, where = words.pointer_mask([1, 2, 3, 4, 5], EXTRA)
    assert where[:, :2].tolist() == [[0, -2], [-1, -2], [-2, -2], [-2, -2], [-2, -2]]
