"""Acceptance on the real capture (issue 8): torch.compile'd Qwen3-0.6B, 4 requests.

The fixture (fixtures/qwen3-0.6b-compile/README.md): transformers' Qwen3ForCausalLM, 0.6B
geometry, random weights, ``torch.compile`` with the token dims marked dynamic, captured by
kern-capture on the H200 with the cuBLAS GEMMs' packed arguments (``extra_hex``). kern-mine is
given the directory only; the numbers below are the workload's ground truth (the capture
script's own output, and the model's structure where a test counts GEMMs), not anything read
back from the mining.

How the fitted-grid share is counted (``summary.flat_sites_multi_count*``): Dynamo compiled
two graphs, one for passes of more than one token and one specialised to one token (the
decode passes, the 1-token prompt's prefill, the 1-token warm-up pass). The second graph's
call sites only ever run at ``tokens == 1``: each of their fields is one observed constant,
and no capture of this program can say how it would scale, because it never does (a
generator emits those launches under ``tokens == 1``). So the share is taken over the flat
sites of pass shapes seen at two or more token counts, with every such site in the
denominator (including odd shapes from the compile windows and library kernels that only
run at some sizes); the single-count sites are asserted separately: they are exactly the
sites of one shape whose passes all have 1 token, and none of them is reported as fitted.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from kern_mine.mine import mine

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3-0.6b-compile"
PROMPTS = [1, 34, 85, 175]  # the true prompt lengths, in request order
NEW_TOKENS = 4
WARMUP = [2048, 512, 130, 17, 3, 1, 2, 7]  # the second warm-up round, one window
LAYERS = 28

pytestmark = pytest.mark.skipif(
    not any((FIXTURE / n).is_file() for n in ("launches.jsonl", "launches.jsonl.gz")),
    reason="real fixture missing (fixtures/qwen3-0.6b-compile/README.md)",
)


@pytest.fixture(scope="module")
def report():
    return mine(FIXTURE)


def _main_shapes(report):
    """(the multi-token graph, the one-token graph): the shapes of the requests' passes."""
    shapes = {sh.id: sh for sh in report.shapes}
    prefill = {p.shape for w in report.requests for p in w.passes[:1] if p.tokens > 1}
    decode = {p.shape for w in report.requests for p in w.passes[1:]}
    assert len(prefill) == len(decode) == 1
    return shapes[prefill.pop()], shapes[decode.pop()]


def test_four_requests(report):
    assert report.summary.requests == 4
    assert [len(w.passes) for w in report.requests] == [NEW_TOKENS] * 4


def test_prefill_token_counts_are_the_prompt_lengths(report):
    assert [w.passes[0].tokens for w in report.requests] == PROMPTS
    assert all(w.passes[0].kind == "prefill" for w in report.requests)


def test_decode_passes_have_one_token(report):
    decodes = [p for w in report.requests for p in w.passes[1:]]
    assert len(decodes) == 4 * (NEW_TOKENS - 1)
    assert all(p.kind == "decode" and p.tokens == 1 for p in decodes)


def test_warmup_round_token_counts(report):
    # the second warm-up round is one window: its first launches are the cache reset's fills
    # (no token count), then one pass per warm-up token count, in order
    rounds = [[p.tokens for p in w.passes if p.tokens is not None] for w in report.other_windows]
    assert WARMUP in rounds


def test_token_reference_counts_both_graphs(report):
    # the arange of cache positions runs eagerly before either graph: its element count
    ref = report.reference
    assert "arange" in ref.symbol and ref.field == "param[0]" and ref.divisor == 1
    prefill, decode = _main_shapes(report)
    assert decode.token_counts == [1]
    assert prefill.token_counts == sorted(set(WARMUP + PROMPTS) - {1})


def test_flat_sites_get_fitted_grids(report):
    s = report.summary
    prefill, decode = _main_shapes(report)
    # >= 90% of the flat sites of shapes seen at two or more token counts (see the docstring)
    assert s.flat_sites_multi_count_grid_fitted / s.flat_sites_multi_count >= 0.90, (
        s.flat_sites_multi_count_grid_fitted, s.flat_sites_multi_count)
    # the prefill graph alone
    assert prefill.flat_sites_grid_fitted / prefill.flat_sites >= 0.90
    # the sites seen at one token count only are the decode graph's, all of them constants at 1
    single = [x for x in report.sites if x.flat and len(x.token_counts) == 1 and x.shape == decode.id]
    assert s.flat_sites_single_count == decode.flat_sites == len(single) > 0
    assert all(x.token_counts == [1] for x in single)
    assert all(len({v for _, v in g.samples}) == 1 for x in single for g in x.grid)
    assert decode.flat_sites_grid_fitted == 0  # never reported as a fitted expression
    # the rest never saw a token count: the reset windows' fills, compile and autotune launches
    assert s.flat_sites == s.flat_sites_multi_count + s.flat_sites_single_count + s.flat_sites_no_count


def _norm_sites(report, shape):
    # Inductor names a kernel after its ops: an RMS norm is ..._mean_..._pow_..._rsqrt_...;
    # the ones that apply a norm weight read a persistent buffer
    return [x for x in report.sites if x.flat and x.shape == shape.id and "rsqrt" in x.symbol and x.pointer_params]


def test_norm_sites_tell_weights_from_workspace(report):
    by_site = defaultdict(list)
    for p in report.pointers:
        by_site[p.site].append(p)
    persistent = {"weight", "state"}
    addr_class = defaultdict(set)
    for p in report.pointers:
        if p.alloc_base is not None:
            addr_class[(p.alloc_base, p.alloc_offset)].add(p.class_)
    prefill, decode = _main_shapes(report)
    weights = {}
    for shape in (prefill, decode):
        norms = _norm_sites(report, shape)
        with_weight = [x for x in norms if any(p.class_ in persistent for p in by_site[x.id])]
        # input + post-attention norm per layer and the final norm, and the q/k norms, each
        # applied by a kernel reading its weight
        assert len(with_weight) >= 2 * LAYERS + 1
        for x in norms:
            classes = [p.class_ for p in by_site[x.id]]
            assert "unknown" not in classes, (x.symbol, x.occurrence, classes)
            assert "workspace" in classes, (x.symbol, x.occurrence, classes)  # the activations
        weights[shape.id] = {(p.alloc_base, p.alloc_offset) for x in with_weight for p in by_site[x.id]
                             if p.class_ in persistent}
        # the prefill graph's activations move with the token count; the decode graph's sit at
        # the same addresses every step and are recognised as recycled
        ws = [p for x in norms for p in by_site[x.id] if p.class_ == "workspace"]
        if shape is prefill:
            assert sum("distinct (allocation, offset)" in p.reason for p in ws) > len(ws) // 2
        else:
            assert all("distinct" not in p.reason for p in ws)
    # 57 RMSNorm weights + 56 q/k-norm weights (+ the KV cache and the rope table, read by the
    # fused q/k kernels), each its own address, never classified workspace anywhere
    assert len(weights[prefill.id]) >= 2 * LAYERS + 1 + 2 * LAYERS
    assert all(addr_class[a] <= persistent for a in weights[prefill.id])
    # the decode graph reads the same weights
    assert weights[decode.id] <= weights[prefill.id]


def test_gemm_sites_tell_weights_from_workspace(report):
    # cuBLAS GEMMs (nvjet kernels) carry their arguments in the packed extra buffer, which the
    # capture kept (extra_hex). cuBLAS picks its kernel by size, so GEMM sites are aligned by
    # library call: every pass of a graph makes the same calls, 9 per layer (the q, k, v, o, gate,
    # up and down projections, the two attention matmuls) and lm_head.
    prefill, decode = _main_shapes(report)
    by_site = defaultdict(list)
    for p in report.pointers:
        by_site[p.site].append(p)
    weights = {}
    for shape in (prefill, decode):
        calls = defaultdict(list)
        for x in report.sites:
            if x.shape == shape.id and not x.flat:
                calls[x.call].append(x)
        assert sorted(calls) == list(range(9 * LAYERS + 1))
        per_call = {c: {p.address for x in ss for p in by_site[x.id] if p.class_ == "weight"}
                    for c, ss in calls.items()}
        linear = {c: a for c, a in per_call.items() if a}
        # the 7 nn.Linear projections of every layer: each call reads one weight, at one address
        # whichever kernel cuBLAS picked, at every token count; 196 distinct weights
        assert len(linear) == 7 * LAYERS and all(len(a) == 1 for a in linear.values())
        weights[shape.id] = set().union(*linear.values())
        assert len(weights[shape.id]) == 7 * LAYERS
        for c in linear:
            for x in calls[c]:
                ptrs = by_site[x.id]
                assert x.embedded_pointers and all(p.param == -1 for p in ptrs)
                classes = {p.class_ for p in ptrs}
                # the weight, the activations (input and output), and at most cuBLAS's own
                # workspace (one address every call of the graph uses: state)
                assert {"weight", "workspace"} <= classes <= {"weight", "workspace", "state"}, (c, x.symbol, classes)
                for p in ptrs:
                    if p.class_ == "weight":
                        assert p.distinct == 1 and "at 11 token counts" in p.reason
                    if p.class_ == "state":
                        assert "library calls of one pass shape" in p.reason
                ws = [p for p in ptrs if p.class_ == "workspace"]
                if shape is prefill and len(x.token_counts) > 1:  # activations move with the token count
                    assert all("distinct (allocation, offset)" in p.reason for p in ws), (c, x.symbol)
        # no pointer of any GEMM call is left unknown
        assert all(p.class_ != "unknown" for ss in calls.values() for x in ss for p in by_site[x.id])
        # lm_head reads the tied embedding, which the graph's embedding kernels also read: state
        head = {p.address for x in calls[9 * LAYERS] for p in by_site[x.id] if p.class_ == "state"}
        emb = {p.address for x in report.sites if x.shape == shape.id and x.flat and "embedding" in x.symbol
               for p in by_site[x.id] if p.class_ == "state"}
        assert head & emb
    # the decode graph reads the prefill graph's weights; most lie in allocations no flat kernel
    # ever touched (found at the positions other calls' annotated pointers taught)
    assert weights[decode.id] == weights[prefill.id]
    unannotated = {p.address for p in report.pointers if p.class_ == "weight" and p.param == -1 and p.alloc_base is None}
    assert len(unannotated & weights[prefill.id]) > 7 * LAYERS // 2


def test_cutlass_sgemm_pointers_inside_its_params_struct(report):
    # The one flat GEMM, CUTLASS's SGEMM of the rotary embedding (inverse frequencies times
    # positions), passes its operands inside its by-value Params struct: found there, and all four
    # (A, B, C, D) are per-pass activations (the frequencies are copied to a fresh buffer first).
    prefill, decode = _main_shapes(report)
    by_site = defaultdict(list)
    for p in report.pointers:
        by_site[p.site].append(p)
    for shape in (prefill, decode):
        (sgemm,) = [x for x in report.sites if x.shape == shape.id and "cutlass" in x.symbol and "sgemm" in x.symbol]
        assert len(sgemm.embedded_pointers) == 4 and {j for j, _ in sgemm.embedded_pointers} == {0}
        assert [p.class_ for p in by_site[sgemm.id]] == ["workspace"] * 4
