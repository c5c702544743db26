"""The head-major KV layout (build_kernels.py --kv-layout head-major; NOTES.md 58) on the GPU: every kernel of a
head-major kernels dir against its token-major twin on the same cache, converted.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_kv_layout_gpu.py -q

The head-major layout is [page][layer][NKV][16 tokens][k|v][D] with token t's 16-byte chunk c at chunk c ^ (t % 8);
`to_head_major` converts gpu_helpers.pool's token-major cache into it (and back: the swizzle is an involution). On
fresh random caches, tokens and weights:

1. qk_norm_rope_kv (attention.py `qk_norm_rope_kv_hm`): q rotated in place bit for bit as the token-major kernel does,
   and the cache it writes equal, converted, to the token-major kernel's, bit for bit (a slot of -1 writes nothing);
2. paged_prefill_attention (`paged_prefill_attention_hm`): the same output bits, chunks of 1..2,048 queries against
   1..3,000 cached tokens;
3. decode_attention.cu built with -DDA_BULK (decode_attention_hm.cubin, decode_attention_pdl_hm.cubin): the
   rope-cluster form (plain and PDL module: output and the row it stores), the cluster form and split + merge: the
   same bits as the token-major module on the converted cache, at lengths across pages and the rings' edges;
   the PDL forms launched without the attribute too (their early pages and the cluster form's refresh of row L-1
   included), each against the token-major PDL form.

Kernels: the token-major set from $KERN_KERNELS_DIR if its index has them (else built here), the head-major set from
$KERN_KERNELS_DIR_HM if its index says `"kv_layout": "head-major"` (else built here).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, D, DEV, NKV, bits, kernels_dir, nan_like, pool, rope_table  # noqa: E402

from cubin_launch import KernelSet  # noqa: E402  (tools/kernels-src, put on sys.path by gpu_helpers)

EPS = 1e-6
CLUSTER = 8
LAYERS, LAYER = 3, 1
ROPE, CLU, SPLIT, MERGE = ("decode_attention_rope_cluster", "decode_attention_cluster", "decode_attention_split",
                           "decode_attention_merge")
NEEDED = ("qk_norm_rope_kv", "qk_norm_rope_kv_pdl", "paged_prefill_attention", ROPE, ROPE + "_pdl", CLU, CLU + "_pdl",
          SPLIT, SPLIT + "_pdl", MERGE, MERGE + "_pdl")


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    d = kernels_dir(tmp_path_factory, "kernels-tm", ["0.6b", "4b"], NEEDED, pdl=True)
    if json.loads((Path(d) / "index.json").read_text()).get("kv_layout", "token-major") != "token-major":
        pytest.fail(f"$KERN_KERNELS_DIR {d} is a head-major kernels dir: this test needs the token-major one there "
                    "(and the head-major one in $KERN_KERNELS_DIR_HM)")
    return d


@pytest.fixture(scope="module")
def ks_hm(ks, tmp_path_factory):
    d = os.environ.get("KERN_KERNELS_DIR_HM")
    if not (d and json.loads((Path(d) / "index.json").read_text()).get("kv_layout") == "head-major"):
        import build_kernels

        d = tmp_path_factory.mktemp("kernels-hm")
        build_kernels.build(d, ["0.6b", "4b"], quiet=True, kv_layout="head-major")
    return KernelSet(d)


def to_head_major(kv: torch.Tensor, layers: int = LAYERS, nkv: int = NKV) -> torch.Tensor:
    """A token-major cache (pool's layout, [page][layer][16][nkv][k|v][D]) in the head-major layout, or back (the
    chunk swizzle c ^ (t % 8) is its own inverse; `back` is to_token_major)."""
    x = kv.view(-1, layers, 16, nkv, 32, 8).permute(0, 1, 3, 2, 4, 5)  # [page, layer, head, token, chunk, 8]
    t = torch.arange(16, device=kv.device)
    src = torch.arange(32, device=kv.device)[None, :] ^ (t[:, None] % 8)  # physical chunk p holds logical p ^ t
    return x[:, :, :, t[:, None], src, :].contiguous().view(-1)


def to_token_major(hm: torch.Tensor, layers: int = LAYERS, nkv: int = NKV) -> torch.Tensor:
    x = hm.view(-1, layers, nkv, 16, 32, 8)
    t = torch.arange(16, device=hm.device)
    src = torch.arange(32, device=hm.device)[None, :] ^ (t[:, None] % 8)
    return x[:, :, :, t[:, None], src, :].permute(0, 1, 3, 2, 4, 5).contiguous().view(-1)


def test_conversion_round_trip():
    kv, _, _, _ = pool(100, LAYERS)
    hm = to_head_major(kv)
    assert torch.equal(bits(to_token_major(hm)), bits(kv))
    # token 5 of page 0, layer 1, head 3: its k chunk 2 (elements 16..23) at chunk 2 ^ 5 = 7 of its row
    tok = NKV * 2 * D
    src = kv[LAYER * 16 * tok + 5 * tok + 3 * 2 * D + 16: LAYER * 16 * tok + 5 * tok + 3 * 2 * D + 24]
    row = LAYER * 16 * tok + 3 * 16 * 2 * D + 5 * 2 * D
    assert torch.equal(bits(hm[row + 7 * 8: row + 8 * 8]), bits(src))


@pytest.mark.parametrize("form", ["", "_pdl"])  # the PDL form launched without the attribute: the plain form's work
@pytest.mark.parametrize("T,nq", [(1, 32), (7, 16), (300, 32), (33, 64)])
def test_prologue(ks, ks_hm, T, nq, form):
    tok = NKV * 2 * D
    cos_sin = rope_table()
    pos0 = 30000 + int(torch.randint(0, 5000, (1,)))
    pos = torch.arange(pos0, pos0 + T, device=DEV)  # rotary positions far from 0
    slots = torch.arange(5, 5 + T, device=DEV)  # cache slots across pages (a small cache)
    if T > 3:
        slots[2] = -1  # a padding token: no KV write
    kv, _, _, page_elems = pool(T + 40, LAYERS)
    kv_hm = to_head_major(kv)
    qkv = torch.randn(T, (nq + 2 * NKV) * D, device=DEV).to(BF)
    qkv_hm = qkv.clone()
    qw, kw = (torch.rand(D, device=DEV) + 0.5).to(BF), (torch.rand(D, device=DEV) + 0.5).to(BF)
    off = LAYER * 16 * tok
    for k, q, c in ((ks, qkv, kv), (ks_hm, qkv_hm, kv_hm)):
        k.launch("qk_norm_rope_kv" + form, (T, NKV),
                 [q, pos, slots, qw, kw, cos_sin, c[off:], nq, NKV, EPS, page_elems * 2])
    torch.cuda.synchronize()
    assert torch.equal(bits(qkv_hm), bits(qkv)), "q rotated in place differently"
    assert torch.equal(bits(kv_hm), bits(to_head_major(kv))), "the cache written differs (converted)"


@pytest.mark.parametrize("nq", [16, 32])
@pytest.mark.parametrize("T,L", [(1, 1), (7, 100), (512, 3000), (2048, 2048), (100, 1111)])
def test_prefill_attention(ks, ks_hm, nq, T, L):
    tok = NKV * 2 * D
    kv, bt, _, page_elems = pool(L, LAYERS)
    kv_hm = to_head_major(kv)
    q_stride = (nq + 2 * NKV) * D
    qkv = torch.randn(T, q_stride, device=DEV).to(BF)
    seq = torch.tensor([L], dtype=torch.int32, device=DEV)
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEV)
    outs = []
    for k, c in ((ks, kv), (ks_hm, kv_hm)):
        out = nan_like((T, nq * D))
        k.launch("paged_prefill_attention", (-(-T // 128), nq, 1),
                 [qkv, c[LAYER * 16 * tok:], bt, seq, cu, out, nq, NKV, q_stride, bt.numel(), page_elems * 2,
                  1 / math.sqrt(D)])
        outs.append(out)
    torch.cuda.synchronize()
    assert not torch.isnan(outs[1]).any()
    diff = (outs[1].float() - outs[0].float()).abs().max().item()
    assert torch.equal(bits(outs[1]), bits(outs[0])), f"outputs differ (max abs diff {diff:.3e})"


#: lengths across pages and the rings' edges (PDL rope ring 1,024 tokens, plain 2,048; cluster 2,048; split 4 pages)
LENGTHS = [1, 17, 130, 1024, 1025, 2049, 4096]


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("nq", [16, 32])
@pytest.mark.parametrize("form", ["", "_pdl"])
def test_rope_cluster(ks, ks_hm, nq, L, form):
    tok = NKV * 2 * D
    cos_sin = rope_table()
    kv, bt, _, page_elems = pool(L, LAYERS)
    kv_hm = to_head_major(kv)
    q_stride = (nq + 2 * NKV) * D
    qkv = torch.randn(1, q_stride, device=DEV).to(BF)
    qw, kw = (torch.rand(D, device=DEV) + 0.5).to(BF), (torch.rand(D, device=DEV) + 0.5).to(BF)
    seq = torch.tensor([L], dtype=torch.int32, device=DEV)
    pos = torch.tensor([L - 1], dtype=torch.int64, device=DEV)
    slot = (bt[(L - 1) // 16].long() * 16 + (L - 1) % 16).view(1)
    outs = []
    for k, c in ((ks, kv), (ks_hm, kv_hm)):
        out = nan_like((1, nq * D))
        k.launch(ROPE + form, (NKV, CLUSTER, 1),
                 [qkv, pos, slot, qw, kw, cos_sin, c[LAYER * 16 * tok:], bt, seq, out, nq, NKV, q_stride, bt.numel(),
                  page_elems * 2, 1 / math.sqrt(D), EPS])
        outs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(bits(outs[1]), bits(outs[0])), "outputs differ"
    assert torch.equal(bits(kv_hm), bits(to_head_major(kv))), "the stored row differs (converted)"


@pytest.mark.parametrize("form", ["", "_pdl"])  # the PDL module's forms (early pages, the refresh of row L-1) too
@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("nq", [16, 64])
def test_cluster_and_split(ks, ks_hm, nq, L, form):
    tok = NKV * 2 * D
    kv, bt, _, page_elems = pool(L, LAYERS)
    kv_hm = to_head_major(kv)
    q = torch.randn(1, nq * D, device=DEV).to(BF)
    seq = torch.tensor([L], dtype=torch.int32, device=DEV)
    tail = [nq, NKV, nq * D, bt.numel(), page_elems * 2, 1 / math.sqrt(D)]
    S = 32
    res = []
    for k, c in ((ks, kv), (ks_hm, kv_hm)):
        layer = c[LAYER * 16 * tok:]
        out_c, out_s = nan_like((1, nq * D)), nan_like((1, nq * D))
        k.launch(CLU + form, (NKV, CLUSTER, 1), [q, layer, bt, seq, out_c] + tail)
        acc = torch.full((1, nq, S, D), float("nan"), device=DEV)
        ml = torch.full((1, nq, S, 2), float("nan"), device=DEV)
        k.launch(SPLIT + form, (NKV, S, 1), [q, layer, bt, seq, acc, ml] + tail)
        k.launch(MERGE + form, (nq, 1, 1), [acc, ml, seq, out_s, nq, S])
        res.append((out_c, out_s))
    torch.cuda.synchronize()
    assert torch.equal(bits(res[1][0]), bits(res[0][0])), "cluster form differs"
    assert torch.equal(bits(res[1][1]), bits(res[0][1])), "split + merge differs"
