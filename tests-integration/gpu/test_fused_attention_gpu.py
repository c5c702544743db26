"""The one-launch decode attention (build_kernels.py --fused-attention) on the GPU.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_fused_attention_gpu.py -q

`paged_decode_attention_fused` runs stage 1 of `paged_decode_attention` unchanged and lets the
last program of each (sequence, kv head) merge the splits as `paged_decode_reduce` does, so its
output is expected to equal the two-launch output BIT FOR BIT (same tensor ops in the same
layouts: tests-integration/test_kernels_build.py::test_fused_is_the_two_launch_arithmetic).
These tests assert bitwise equality; a mismatch is either a race (a merge that read a partial
before it was visible: wrong by far more than rounding) or a codegen difference (off by one bf16
ulp here and there: the message prints the max difference to tell them apart).

1. Against the two launches and a float64 reference, over page-crossing lengths, S in 1..64,
   NQ 16..64, several layers' counters (one state, per-layer offsets), each run several times
   in a row: the counters are all zero after every launch, outputs identical every time.
2. Two sequences (grid z; counters b*NKV + h).
3. Stress: 36 layers × many back-to-back launches with no sync in between, eager and replayed
   from a CUDA graph; every output equals its two-launch twin, counters zero at the end.
4. The `_pdl` form (launched without the attribute) equals the plain one.
5. The 0.6B decode program with `gen_qwen3.py --fused-attention` (and with --pdl too) gives the
   `--decode-attention triton` manifest's tokens and logits bit for bit, eager and in a CUDA graph.

Kernels: $KERN_KERNELS_DIR if its index has `paged_decode_attention_fused` (and `_pdl`), else
built here (0.6b, 4b, --fused-attention --pdl).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import (torch, BF, D, DEV, NKV, DecodeContext, bits, decode_chains, kernels_dir,  # noqa: E402
                         nan_like, pool, ref_attention, run_generations)

FUSED = "paged_decode_attention_fused"
NEEDED = (FUSED, FUSED + "_pdl", "paged_decode_attention_pdl")


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels-fused", ["0.6b", "4b"], NEEDED, pdl=True, fused_attention=True)


def explain(out, ref2):
    d = (out.float() - ref2.float()).abs()
    return f"max |fused - two-launch| = {d.nan_to_num(float('inf')).max().item():.3e}, " \
           f"{(bits(out) != bits(ref2)).sum().item()} bytes differ"


class Attn(DecodeContext):
    """One context's decode attention, both ways, for `layers` layers of one pool."""

    def __init__(self, ks, nq, L, S, layers=4):
        super().__init__(ks, nq, L, S, layers)
        self.counters = torch.zeros(layers * NKV, dtype=torch.int32, device=DEV)  # the state, zeroed at load
        self.acc = torch.empty(nq * S * D, device=DEV)  # impl scratch: shared by the layers, as in the manifest
        self.ml = torch.empty(nq * S * 2, device=DEV)

    def two_launch(self, qkv, l, out):
        self.ks.launch("paged_decode_attention", (NKV, self.S, 1),
                       [qkv, self.layer_kv(l), self.bt, self.seq, self.acc, self.ml] + self.tail())
        self.ks.launch("paged_decode_reduce", (self.nq, 1), [self.acc, self.ml, out, self.nq, self.S])

    def fused(self, qkv, l, out, name=FUSED):
        self.ks.launch(name, (NKV, self.S, 1),
                       [qkv, self.layer_kv(l), self.bt, self.seq, self.acc, self.ml,
                        self.counters.data_ptr() + l * NKV * 4, out] + self.tail())


@pytest.mark.parametrize("nq", [16, 32, 40, 64])
@pytest.mark.parametrize("L,S", [(1, 1), (1, 64), (15, 16), (16, 32), (17, 64), (65, 16), (300, 1), (1000, 64),
                                 (4096, 32), (4096, 64), (40000, 32), (40000, 64)])
def test_fused_equals_two_launch(ks, nq, L, S):
    a = Attn(ks, nq, L, S, layers=3)
    for l in (2, 0, 1):
        qkv = torch.randn(1, a.q_stride, device=DEV).to(BF)
        ref2 = nan_like((1, nq * D))
        a.two_launch(qkv, l, ref2)
        ref = ref_attention(qkv[0], a.layer_kv(l), a.page_elems, a.bt, L, nq)
        assert ((ref2.double() - ref).norm() / ref.norm()).item() <= 1e-2
        for rep in range(3):
            out = nan_like((1, nq * D))
            a.fused(qkv, l, out)
            torch.cuda.synchronize()
            assert torch.count_nonzero(a.counters).item() == 0, f"counters not reset: {a.counters.tolist()}"
            assert torch.equal(bits(out), bits(ref2)), f"layer {l} run {rep}: " + explain(out, ref2)


def test_fused_two_sequences(ks):
    """Grid z = 2: sequence b uses block-table row b and counters b*NKV + h of the layer's region."""
    nq, S, Ls = 32, 16, [700, 33]
    kv, bt0, layer_elems, page_elems = pool(2048, 2)
    kv_layer = kv[layer_elems:]  # layer 1
    bt = torch.stack([bt0[:64], bt0[64:128]]).contiguous()
    q_stride = (nq + 2 * NKV) * D
    qkv = torch.randn(2, q_stride, device=DEV).to(BF)
    seq = torch.tensor(Ls, dtype=torch.int32, device=DEV)
    acc, ml = torch.empty(2 * nq * S * D, device=DEV), torch.empty(2 * nq * S * 2, device=DEV)
    tail = [nq, NKV, q_stride, 64, page_elems * 2, 1 / math.sqrt(D)]
    ref2 = nan_like((2, nq * D))
    ks.launch("paged_decode_attention", (NKV, S, 2), [qkv, kv_layer, bt, seq, acc, ml] + tail)
    ks.launch("paged_decode_reduce", (nq, 2), [acc, ml, ref2, nq, S])
    for b, L in enumerate(Ls):  # the two-launch output against float64 (gpu_helpers' head-major addressing)
        ref = ref_attention(qkv[b], kv_layer, page_elems, bt[b], L, nq)
        assert ((ref2[b: b + 1].double() - ref).norm() / ref.norm()).item() <= 1e-2, f"sequence {b}"
    counters = torch.zeros(2 * NKV, dtype=torch.int32, device=DEV)
    for _ in range(3):
        out = nan_like((2, nq * D))
        ks.launch(FUSED, (NKV, S, 2), [qkv, kv_layer, bt, seq, acc, ml, counters, out] + tail)
        torch.cuda.synchronize()
        assert torch.count_nonzero(counters).item() == 0
        assert torch.equal(bits(out), bits(ref2)), explain(out, ref2)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("nq,L,S", [(32, 4096, 64), (16, 100, 64), (64, 33000, 32)])
def test_fused_stress_back_to_back(ks, nq, L, S, graph):
    """36 layers' launches back to back (no sync), repeated; in a CUDA graph, replayed. Every layer's output
    equals its two-launch twin bit for bit and the counters are zero at the end."""
    layers, rounds = 36, 20
    a = Attn(ks, nq, L, S, layers=layers)
    qkvs = [torch.randn(1, a.q_stride, device=DEV).to(BF) for _ in range(layers)]
    refs = []
    for l in range(layers):
        r = nan_like((1, nq * D))
        a.two_launch(qkvs[l], l, r)
        refs.append(r)
    outs = [nan_like((1, nq * D)) for _ in range(layers)]

    def step():
        for l in range(layers):
            a.fused(qkvs[l], l, outs[l])

    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            step()
        torch.cuda.synchronize()
        assert torch.count_nonzero(a.counters).item() == 0  # capture launched nothing
        for _ in range(rounds):
            for o in outs:
                o.fill_(float("nan"))
            g.replay()
    else:
        for _ in range(rounds):
            for o in outs:
                o.fill_(float("nan"))
            step()
    torch.cuda.synchronize()
    assert torch.count_nonzero(a.counters).item() == 0, a.counters.tolist()
    bad = [l for l in range(layers) if not torch.equal(bits(outs[l]), bits(refs[l]))]
    assert not bad, f"layers {bad}: " + explain(outs[bad[0]], refs[bad[0]])


@pytest.mark.parametrize("nq,L,S", [(32, 4096, 64), (16, 17, 32), (64, 1000, 16)])
def test_fused_pdl_twin(ks, nq, L, S):
    """The `_pdl` form launched without the attribute (its griddepcontrol instructions are no-ops) equals the
    plain fused kernel bit for bit, and resets its counters too."""
    a = Attn(ks, nq, L, S, layers=2)
    qkv = torch.randn(1, a.q_stride, device=DEV).to(BF)
    o1, o2 = nan_like((1, nq * D)), nan_like((1, nq * D))
    a.fused(qkv, 1, o1)
    a.fused(qkv, 1, o2, name=FUSED + "_pdl")
    torch.cuda.synchronize()
    assert torch.count_nonzero(a.counters).item() == 0
    assert torch.equal(bits(o1), bits(o2)), explain(o2, o1)


# ---------------------------------------------------------------- the decode program, 0.6B

GEOMETRY, CAPACITY, PROMPT, STEPS = "0.6b", 4096, 300, 24


@pytest.fixture(scope="module")
def chain(kdir, tmp_path_factory):
    # plain: the Triton two-launch impl, which the fused kernel equals bit for bit (not the default impl);
    # --no-pdl on the plain ones: --pdl is the generator's default
    chains = {"plain": ["--decode-attention", "triton", "--no-pdl"], "fused": ["--fused-attention", "--no-pdl"],
              "fused_pdl": ["--fused-attention", "--pdl"]}
    return decode_chains(kdir, tmp_path_factory.mktemp("fused-chain"), chains, "plain", GEOMETRY, CAPACITY)


def _counters_zero(rt):
    if "attn_counters" in rt.layout.states:
        assert not rt.read_state("attn_counters").any(), "counters left nonzero after the runs"


def run_chain(chain, which: str, graph: bool):
    """Greedy tokens and every decode step's logits of 2 prompts in a row on one runtime (the counters carry
    over from one run to the next, and from one generation to the next), concatenated."""
    tokens, logits = run_generations(chain, which, graph, capacity=CAPACITY, prompt=PROMPT, steps=STEPS,
                                     after=_counters_zero)
    return [t for g in tokens for t in g], np.concatenate(logits)


@pytest.mark.parametrize("which", ["fused", "fused_pdl"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_decode_chain_fused_equals_plain(chain, which, graph):
    t0, l0 = run_chain(chain, "plain", graph)
    t1, l1 = run_chain(chain, which, graph)
    assert t0 == t1, f"tokens differ: {t0} vs {t1}"
    assert np.array_equal(l0.view(np.uint16), l1.view(np.uint16)), \
        f"logits differ at steps {sorted(set(np.nonzero(l0.view(np.uint16) != l1.view(np.uint16))[0].tolist()))}"
    assert len(set(t0)) > 1, "degenerate random model: one token only"
