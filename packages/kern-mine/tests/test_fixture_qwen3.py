"""Acceptance on the real capture (issue 8): torch.compile'd Qwen3-0.6B, 4 requests.

The fixture (fixtures/qwen3-0.6b-compile/README.md): transformers' Qwen3ForCausalLM, 0.6B
geometry, random weights, ``torch.compile`` with the token dims dynamic and the one-token
branches pinned (``--compile-mode one-graph``: Dynamo compiled one graph for every token count,
prefill and decode alike), captured by kern-capture on the H200 with the cuBLAS GEMMs' packed
arguments (``extra_hex``). kern-mine is given the directory only; the numbers below are the
workload's ground truth (the capture script's own output, and the model's structure where a test
counts GEMMs or norms), not anything read back from the mining.

How the fitted-grid share is counted. The issue asks for "at least 90% of the sites of flat-ABI
kernels" of the model's forward passes. Its denominator is ``summary.flat_sites_request_shapes``:
every flat call site of the program the requests' passes ran (one pass shape here), including
sites that only ran at some token counts (cuBLASLt's split-K reduces, run at 85 tokens or fewer;
the rotary embedding's CUTLASS SGEMMs, one kernel for one token and another for more). Not in it: the flat sites never launched in a pass
with a known token count (the model's initialisation, the cache resets between requests, the
compile and autotuning windows; ``flat_sites_no_count``): no grid of theirs can be fitted against
a token count, and they are no part of a forward pass. Each shape the requests ran must also
reach 90% on its own, and so must the flat sites of every shape seen at two or more token counts
(``flat_sites_multi_count``: the forward program plus two eager kernels cut off from their passes
by the compile). Over all flat sites of the capture the share is lower (see the README); it is
not the issue's number.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from kern_mine.mine import mine
from kern_mine.report import CANDIDATES_SHOWN, render_text

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3-0.6b-compile"
PROMPTS = [1, 34, 85, 175]  # the true prompt lengths, in request order
NEW_TOKENS = 4
WARMUP = [2048, 512, 130, 17, 3, 1, 2, 7]  # the second warm-up round, one window
TOKEN_COUNTS = sorted(set(WARMUP + PROMPTS))  # every token count a forward pass ran at
LAYERS = 28

pytestmark = pytest.mark.skipif(
    not any((FIXTURE / n).is_file() for n in ("launches.jsonl", "launches.jsonl.gz")),
    reason="real fixture missing (fixtures/qwen3-0.6b-compile/README.md)",
)


@pytest.fixture(scope="module")
def report():
    return mine(FIXTURE)


def _forward_shape(report):
    """The one program every pass of every request ran (prefill and decode alike)."""
    shapes = {sh.id: sh for sh in report.shapes}
    used = {p.shape for w in report.requests for p in w.passes}
    assert len(used) == 1, used
    return shapes[used.pop()]


def _by_site(report):
    by_site = defaultdict(list)
    for p in report.pointers:
        by_site[p.site].append(p)
    return by_site


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


def test_one_program_for_prefill_and_decode(report):
    # One Dynamo graph: the prefills (the 1-token prompt's too) and the decode passes run the same
    # kernels, so they are one pass shape, seen at every token count of the workload; no program
    # specialised to one token count is left.
    fwd = _forward_shape(report)
    assert report.summary.request_shapes == [fwd.id]
    assert fwd.token_counts == TOKEN_COUNTS
    # the requests' 16 passes and the second warm-up round at least (the first round's passes
    # are cut up by compiling and autotuning)
    assert fwd.passes >= 4 * NEW_TOKENS + len(WARMUP)
    assert report.summary.flat_sites_single_count == 0
    # the token count comes from the eager arange of cache positions before the graph
    ref = report.reference
    assert "arange" in ref.symbol and ref.field == "param[0]" and ref.divisor == 1


def test_flat_sites_get_fitted_grids(report):
    s = report.summary
    fwd = _forward_shape(report)
    # the issue's number: >= 90% of the flat sites of the requests' program (see the docstring)
    assert s.flat_sites_request_shapes == fwd.flat_sites > 0
    assert s.flat_sites_request_shapes_grid_fitted / s.flat_sites_request_shapes >= 0.90, (
        s.flat_sites_request_shapes_grid_fitted, s.flat_sites_request_shapes)
    # per shape the requests ran (one here), and over every shape seen at two or more token counts
    for sh in report.shapes:
        if sh.id in s.request_shapes:
            assert sh.flat_sites_grid_fitted / sh.flat_sites >= 0.90, (sh.id, sh.flat_sites_grid_fitted, sh.flat_sites)
    assert s.flat_sites_multi_count_grid_fitted / s.flat_sites_multi_count >= 0.90, (
        s.flat_sites_multi_count_grid_fitted, s.flat_sites_multi_count)
    flat = [x for x in report.sites if x.flat and x.shape == fwd.id]
    # every flat site of the forward program ran in passes with known token counts (no field of
    # its grid is unobserved), and every fitted grid is reported in the summary
    assert all(g.samples for x in flat for g in x.grid)
    fitted = [x for x in flat if all(g.status == "fit" for g in x.grid)]
    assert len(fitted) == s.flat_sites_request_shapes_grid_fitted == s.flat_sites_grid_fitted
    # most of what is left: cuBLASLt's split-K reduce after one GEMM per layer, run at 85 tokens
    # or fewer, whose grid the samples do not pin on [1, 2048]
    fitted_ids = {x.id for x in fitted}
    left = [x for x in flat if x.id not in fitted_ids]
    assert sum("splitKreduce" in x.symbol for x in left) == LAYERS
    # the rest never ran in a pass with a known token count: init, cache resets, compiling
    assert s.flat_sites == s.flat_sites_multi_count + s.flat_sites_single_count + s.flat_sites_no_count


def test_readme_accounts_for_every_flat_site(report):
    """The README's "On the real fixture": of all 841 flat sites 688 are fitted; the other 153 are 117
    never in a pass with a known token count, 34 unfitted in the requests' program, 2 in shape 1."""
    s = report.summary
    fwd = _forward_shape(report)
    others = [sh for sh in report.shapes if sh.id != fwd.id and sh.token_counts]
    assert [(sh.id, sh.token_counts, sh.flat_sites, sh.flat_sites_grid_fitted) for sh in others] == [
        (1, [2, 2048], 2, 0)]
    assert (s.flat_sites, s.flat_sites_grid_fitted, s.flat_sites_no_count) == (841, 688, 117)
    assert fwd.flat_sites - fwd.flat_sites_grid_fitted == 34
    assert s.flat_sites - s.flat_sites_grid_fitted == 153 == 117 + 34 + 2


def test_text_report_points_to_the_other_candidates(report):
    cands = report.reference.candidates
    assert len(cands) > CANDIDATES_SHOWN  # the README: the JSON lists every one
    assert f"({len(cands) - CANDIDATES_SHOWN} more in --json)" in render_text(report)


def _norm_sites(report, shape):
    # Inductor names a kernel after its ops: an RMS norm is ..._mean_..._pow_..._rsqrt_...;
    # the ones that apply a norm weight read a persistent buffer
    return [x for x in report.sites if x.flat and x.shape == shape.id and "rsqrt" in x.symbol and x.pointer_params]


def test_norm_sites_tell_weights_from_workspace(report):
    by_site = _by_site(report)
    persistent = {"weight", "state"}
    addr_class = defaultdict(set)
    for p in report.pointers:
        if p.alloc_base is not None:
            addr_class[(p.alloc_base, p.alloc_offset)].add(p.class_)
    fwd = _forward_shape(report)
    norms = _norm_sites(report, fwd)
    with_weight = [x for x in norms if any(p.class_ in persistent for p in by_site[x.id])]
    # input + post-attention norm per layer and the final norm, and the q/k norms, each applied by
    # a kernel reading its weight
    assert len(with_weight) >= 2 * LAYERS + 1
    for x in norms:
        classes = [p.class_ for p in by_site[x.id]]
        assert "unknown" not in classes, (x.symbol, x.occurrence, classes)
        assert "workspace" in classes, (x.symbol, x.occurrence, classes)  # the activations
    weights = {(p.alloc_base, p.alloc_offset) for x in with_weight for p in by_site[x.id] if p.class_ in persistent}
    # the activations move with the token count (the decode passes' with them: same program)
    ws = [p for x in norms for p in by_site[x.id] if p.class_ == "workspace"]
    assert sum("distinct (allocation, offset)" in p.reason for p in ws) > len(ws) // 2
    # 57 RMSNorm weights + 56 q/k-norm weights (+ the KV cache, read by the fused k-norm, rope and
    # cache-write kernels), each its own address, never classified workspace anywhere
    assert len(weights) >= 2 * LAYERS + 1 + 2 * LAYERS
    assert all(addr_class[a] <= persistent for a in weights)
    # the RMSNorm weights, each read by one kernel, are weights (the q/k-norm weights, each read
    # by two kernels recomputing the normalised q or k, look like state: see the README's limits)
    assert sum(addr_class[a] == {"weight"} for a in weights) >= 2 * LAYERS + 1


def test_gemm_sites_tell_weights_from_workspace(report):
    # cuBLAS GEMMs (nvjet kernels) carry their arguments in the packed extra buffer, which the
    # capture kept (extra_hex). cuBLAS picks its kernel by size, so GEMM sites are aligned by
    # library call: every pass makes the same calls, 9 per layer (the q, k, v, o, gate, up and
    # down projections, the two attention matmuls) and lm_head.
    fwd = _forward_shape(report)
    by_site = _by_site(report)
    calls = defaultdict(list)
    for x in report.sites:
        if x.shape == fwd.id and not x.flat:
            calls[x.call].append(x)
    assert sorted(calls) == list(range(9 * LAYERS + 1))
    # each call is made at every token count, decode passes included (whichever kernel it picked)
    assert all(sorted(set().union(*(x.token_counts for x in ss))) == TOKEN_COUNTS for ss in calls.values())
    per_call = {c: {p.address for x in ss for p in by_site[x.id] if p.class_ == "weight"} for c, ss in calls.items()}
    linear = {c: a for c, a in per_call.items() if a}
    # the 7 nn.Linear projections of every layer: each call reads one weight, at one address
    # whichever kernel cuBLAS picked, at every token count; 196 distinct weights
    assert len(linear) == 7 * LAYERS and all(len(a) == 1 for a in linear.values())
    weights = set().union(*linear.values())
    assert len(weights) == 7 * LAYERS
    for c in linear:
        for x in calls[c]:
            ptrs = by_site[x.id]
            assert x.embedded_pointers and all(p.param == -1 for p in ptrs)
            classes = {p.class_ for p in ptrs}
            # the weight, the activations (input and output), and at most cuBLAS's own
            # workspace (one address every call uses: state)
            assert {"weight", "workspace"} <= classes <= {"weight", "workspace", "state"}, (c, x.symbol, classes)
            for p in ptrs:
                if p.class_ == "weight":
                    assert p.distinct == 1 and f"at {len(TOKEN_COUNTS)} token counts" in p.reason
                if p.class_ == "state":
                    assert "library calls of one pass shape" in p.reason
            ws = [p for p in ptrs if p.class_ == "workspace"]
            if len(x.token_counts) > 1:  # activations move with the token count
                assert all("distinct (allocation, offset)" in p.reason for p in ws), (c, x.symbol)
    # no pointer of any GEMM call is left unknown
    assert all(p.class_ != "unknown" for ss in calls.values() for x in ss for p in by_site[x.id])
    # lm_head reads the tied embedding, which the program's embedding kernels also read: state
    head = {p.address for x in calls[9 * LAYERS] for p in by_site[x.id] if p.class_ == "state"}
    emb = {p.address for x in report.sites if x.shape == fwd.id and x.flat and "embedding" in x.symbol
           for p in by_site[x.id] if p.class_ == "state"}
    assert head & emb
    # most weights lie in allocations no flat kernel ever touched (found at the positions other
    # calls' annotated pointers taught)
    unannotated = {p.address for p in report.pointers if p.class_ == "weight" and p.param == -1 and p.alloc_base is None}
    assert len(unannotated & weights) > 7 * LAYERS // 2


def test_cutlass_sgemm_pointers_inside_its_params_struct(report):
    # The flat GEMMs, CUTLASS SGEMMs of the rotary embedding (inverse frequencies times
    # positions), pass their operands inside a by-value Params struct: found there, and all four
    # (A, B, C, D) are per-pass activations (the frequencies are copied to a fresh buffer first).
    # The library picks one kernel for 1 token and another for more: two sites, each flat and
    # aligned by kernel occurrence, that together ran at every token count.
    fwd = _forward_shape(report)
    by_site = _by_site(report)
    sgemms = [x for x in report.sites if x.shape == fwd.id and "cutlass" in x.symbol and "sgemm" in x.symbol]
    assert len(sgemms) == 2
    counts = [set(x.token_counts) for x in sgemms]
    assert not counts[0] & counts[1] and sorted(counts[0] | counts[1]) == TOKEN_COUNTS
    for sgemm in sgemms:
        assert len(sgemm.embedded_pointers) == 4 and {j for j, _ in sgemm.embedded_pointers} == {0}
        assert [p.class_ for p in by_site[sgemm.id]] == ["workspace"] * 4


def test_no_pointer_of_the_forward_program_is_unknown(report):
    # the pointers left unknown are all in launches outside the model's passes (init, resets)
    fwd = _forward_shape(report)
    sites = {x.id: x for x in report.sites}
    assert all(sites[p.site].shape != fwd.id for p in report.pointers if p.class_ == "unknown")
