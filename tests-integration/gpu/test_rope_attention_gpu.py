"""decode_attention_rope_cluster (tools/kernels-src/decode_attention.cu) on the GPU: the attention prologue's
decode work (qk_norm_rope_kv: q/k RMS norm, neox rotary, the token's k/v into the paged KV cache) fused into
the cluster decode attention.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_rope_attention_gpu.py -q

Against the two launches it replaces (qk_norm_rope_kv, then decode_attention_cluster on the rotated q), on
fresh random inputs at rotary positions far from 0, contexts crossing page boundaries and GQA groups 2..8:

1. the output: within 1e-2 of a float64 reference (float64 norm + rotary of the bf16 inputs, attention over the
   cache with the float64-computed new k/v row rounded as the kernels store it) and no worse than 2x the
   two-launch path's error + 1e-3; poisoned before the launch, nothing written past it;
2. the KV cache: every byte but the current token's row is untouched (by either path); that row, read at its
   head-major swizzled positions (gpu_helpers.slot_offsets), has v the input's bit for bit and k within 1e-2 of the
   float64 reference and within one bf16 rounding of qk_norm_rope_kv's;
   qkv is read only (unchanged bit for bit);
3. slot_mapping < 0: nothing stored, the same output (the token's row reaches attention through shared memory);
4. two sequences (grid z; each token's row stored at its slot, nothing else); the `_pdl` form launched without the
   attribute equals the plain form bit for bit; launched twice in a row, the same bits.

Kernels: $KERN_KERNELS_DIR if its index has them, else built here (0.6b, 4b, --pdl).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import (torch, BF, D, DEV, NKV, bits, changed_outside, kernels_dir, nan_like, pool,  # noqa: E402
                         rope_reference as reference, rope_table, row_offsets, slot_offsets)

TOL = 1e-2
CLUSTER = 8
EPS = 1e-6
ROPE, CLU, PRO = "decode_attention_rope_cluster", "decode_attention_cluster", "qk_norm_rope_kv"
NEEDED = (ROPE, ROPE + "_pdl", CLU, PRO)
GUARD = 64


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels-rope", ["0.6b", "4b"], NEEDED, pdl=True)


@pytest.fixture(scope="module")
def cos_sin():
    return rope_table()


def relerr(out, ref):
    assert not torch.isnan(out).any(), "NaN in the output"
    return ((out.double() - ref).norm() / ref.norm()).item()


class Case:
    """One sequence of L tokens (the last one current) in a 3-layer pool; layer 1 attended."""

    def __init__(self, ks, cos_sin, nq, L, layer=1):
        self.ks, self.cos_sin, self.nq, self.L = ks, cos_sin, nq, L
        self.kv, self.bt, self.layer_elems, self.page_elems = pool(L, 3)
        self.off = layer * self.layer_elems
        self.q_stride = (nq + 2 * NKV) * D
        self.qkv = torch.randn(1, self.q_stride, device=DEV).to(BF)
        self.qw = (torch.rand(D, device=DEV) + 0.5).to(BF)
        self.kw = (torch.rand(D, device=DEV) + 0.5).to(BF)
        self.seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        self.pos = torch.tensor([L - 1], dtype=torch.int64, device=DEV)
        self.slot = (self.bt[(L - 1) // 16].long() * 16 + (L - 1) % 16).view(1)
        # the token's row in the pool (gpu_helpers' head-major addressing): its k [NKV, D] (v at + D), and every
        # element of it (what storing it may change)
        self.k_idx = self.off + slot_offsets(int(self.slot), self.page_elems)[0]
        self.row = self.off + row_offsets(int(self.slot), self.page_elems)

    def tail(self):
        return [self.nq, NKV, self.q_stride, self.bt.numel(), self.page_elems * 2, 1 / math.sqrt(D)]

    def rope(self, kv, out, slot=None, pdl=""):
        self.ks.launch(ROPE + pdl, (NKV, CLUSTER, 1),
                       [self.qkv, self.pos, self.slot if slot is None else slot, self.qw, self.kw, self.cos_sin,
                        kv[self.off:], self.bt, self.seq, out] + self.tail() + [EPS])

    def two_launch(self, kv, out):
        qkv = self.qkv.clone()
        self.ks.launch(PRO, (1, NKV), [qkv, self.pos, self.slot, self.qw, self.kw, self.cos_sin, kv[self.off:],
                                        self.nq, NKV, EPS, self.page_elems * 2])
        self.ks.launch(CLU, (NKV, CLUSTER, 1), [qkv, kv[self.off:], self.bt, self.seq, out] + self.tail())
        return qkv

    def reference(self):
        return reference(self.qkv[0], self.kv, self.off, self.page_elems, self.bt, self.L, self.nq,
                         self.qw, self.kw, self.cos_sin[self.L - 1], int(self.slot))


def guarded(nq, rows=1):
    buf = nan_like((rows * nq * D + GUARD,))
    return buf, buf[: rows * nq * D].view(rows, nq * D)


def check_guard(buf, nq, rows=1):
    assert torch.isnan(buf[rows * nq * D:]).all(), "wrote past the output"


CASES = [(16, 1), (32, 7), (32, 16), (64, 17), (40, 100), (32, 1000), (16, 4096), (32, 4096), (64, 4096),
         (32, 40000)]


@pytest.mark.parametrize("nq,L", CASES)
def test_rope_cluster_vs_two_launches(ks, cos_sin, nq, L):
    c = Case(ks, cos_sin, nq, L)
    qkv0 = c.qkv.clone()
    kv_a, kv_b = c.kv.clone(), c.kv.clone()
    _, out_a = guarded(nq)
    buf_b, out_b = guarded(nq)
    c.two_launch(kv_a, out_a)
    c.rope(kv_b, out_b)
    torch.cuda.synchronize()
    check_guard(buf_b, nq)
    assert torch.equal(bits(c.qkv), bits(qkv0)), "qkv is read only"
    ref, k_ref = c.reference()
    e, ea = relerr(out_b, ref), relerr(out_a, ref)
    assert e <= TOL, f"relative error {e:.3e} (two launches: {ea:.3e})"
    assert e <= 2 * ea + 1e-3, f"relative error {e:.3e} vs the two launches' {ea:.3e}"
    # the cache: only the token's row changed (by either path), at its head-major swizzled positions; v bit for bit,
    # k close to float64 and to qk_norm_rope_kv's
    assert changed_outside(kv_b, c.kv, c.row) == 0, "the rope-cluster form wrote outside the token's row"
    assert changed_outside(kv_a, c.kv, c.row) == 0, "qk_norm_rope_kv wrote outside the token's row"
    k_b, k_a = kv_b[c.k_idx], kv_a[c.k_idx]
    assert torch.equal(bits(kv_b[c.k_idx + D]), bits(qkv0[0, (nq + NKV) * D:].view(NKV, D))), "v row"
    assert torch.equal(bits(kv_a[c.k_idx + D]), bits(kv_b[c.k_idx + D]))
    assert relerr(k_b, k_ref) <= TOL
    ulp = (k_a.float().abs() * 2.0 ** -7).clamp_min(1e-30)  # one bf16 rounding step
    assert ((k_b.float() - k_a.float()).abs() <= ulp).all(), "k differs from qk_norm_rope_kv's"
    # twice in a row: the same bits (the row written by the first launch is rewritten identically)
    _, out_c = guarded(nq)
    c.rope(kv_b, out_c)
    torch.cuda.synchronize()
    assert torch.equal(bits(out_c), bits(out_b))


@pytest.mark.parametrize("nq,L", [(32, 4096), (16, 17), (64, 1000)])
def test_rope_cluster_negative_slot_stores_nothing(ks, cos_sin, nq, L):
    c = Case(ks, cos_sin, nq, L)
    kv = c.kv.clone()
    buf, out = guarded(nq)
    c.rope(kv, out, slot=torch.tensor([-1], dtype=torch.int64, device=DEV))
    kv2 = c.kv.clone()
    buf2, out2 = guarded(nq)
    c.rope(kv2, out2)
    torch.cuda.synchronize()
    assert torch.equal(bits(kv), bits(c.kv)), "slot -1: the cache must not change"
    assert torch.equal(bits(out), bits(out2)), "the output must not depend on the store"


def test_rope_cluster_two_sequences(ks, cos_sin):
    """Grid z = 2: sequence b uses qkv row b, positions/slot_mapping/seq_lens[b], block-table row b, out row b."""
    nq, Ls = 40, [700, 33]
    c = Case(ks, cos_sin, nq, 2048)  # a pool of 128 pages: 64 for each sequence
    bt = torch.stack([c.bt[:64], c.bt[64:128]]).contiguous()
    qkv = torch.randn(2, c.q_stride, device=DEV).to(BF)
    pos = torch.tensor([L - 1 for L in Ls], dtype=torch.int64, device=DEV)
    slot = torch.stack([bt[b, (L - 1) // 16].long() * 16 + (L - 1) % 16 for b, L in enumerate(Ls)])
    seq = torch.tensor(Ls, dtype=torch.int32, device=DEV)
    kv = c.kv.clone()
    buf, out = guarded(nq, rows=2)
    ks.launch(ROPE, (NKV, CLUSTER, 2), [qkv, pos, slot, c.qw, c.kw, cos_sin, kv[c.off:], bt, seq, out,
                                        nq, NKV, c.q_stride, 64, c.page_elems * 2, 1 / math.sqrt(D), EPS])
    torch.cuda.synchronize()
    check_guard(buf, nq, rows=2)
    rows = torch.cat([c.off + row_offsets(int(slot[b]), c.page_elems) for b in range(2)])
    assert changed_outside(kv, c.kv, rows) == 0, "wrote outside the two tokens' rows"
    for b in range(2):  # each sequence's row at its slot's head-major positions (v bit for bit)
        k_idx = c.off + slot_offsets(int(slot[b]), c.page_elems)[0]
        assert torch.equal(bits(kv[k_idx + D]), bits(qkv[b, (nq + NKV) * D:].view(NKV, D))), f"sequence {b}: v row"
    for b, L in enumerate(Ls):
        ref, _ = reference(qkv[b], c.kv, c.off, c.page_elems, bt[b], L, nq, c.qw, c.kw, cos_sin[L - 1],
                           int(slot[b]))
        assert relerr(out[b: b + 1], ref) <= TOL, f"sequence {b}"


#: The PDL form's ring (catalog.DA_ROPE_SLOTS pages per warp, 2) ends at 16 * 8 CTAs * 4 warps * 2 = 1,024 tokens;
#: the plain form's (4 pages) at 2,048: lengths on both sides of each
ROPE_RING_EDGE = 16 * CLUSTER * 4 * 2


@pytest.mark.parametrize("nq,L", [(32, 4096), (16, 17), (64, 1000), (40, 40000), (32, ROPE_RING_EDGE),
                                  (32, ROPE_RING_EDGE + 1), (8, ROPE_RING_EDGE + 16), (32, 2048), (32, 2049)])
def test_rope_cluster_pdl_twin(ks, cos_sin, nq, L):
    """The `_pdl` form launched without the attribute (griddepcontrol is then a no-op) equals the plain form, although
    its ring is 2 pages per warp and the plain form's 4 (the same pages in the same order per warp)."""
    c = Case(ks, cos_sin, nq, L)
    kv1, kv2 = c.kv.clone(), c.kv.clone()
    o1, o2 = nan_like((1, nq * D)), nan_like((1, nq * D))
    c.rope(kv1, o1)
    c.rope(kv2, o2, pdl="_pdl")
    torch.cuda.synchronize()
    assert torch.equal(bits(o1), bits(o2)) and torch.equal(bits(kv1), bits(kv2))
