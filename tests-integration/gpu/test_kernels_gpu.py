"""GPU numerical tests of the provider kernels (tools/kernels-src) against float64 references.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_kernels_gpu.py
Kernels: built into a temp dir by this test (all six Qwen3 presets), or taken from
$KERN_KERNELS_DIR.  Every launch goes through the cubin (cuModuleLoadData +
cuLaunchKernel with the index's params), never through Triton's runtime.

Each check: fresh random inputs, every output poisoned (NaN) before the launch,
relative error ||out - ref|| / ||ref|| <= 1e-2 against a float64 reference, and
no NaN anywhere in the output (a NaN never passes).
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
from gpu_helpers import (torch, BF, D, DEV, bits, gather_kv, kernels_dir, kv_geom, kv_offsets,  # noqa: E402
                         nan_like, rope_table, slot_offsets)

TOKENS = [1, 7, 512, 2048]
TOL = 1e-2


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels", None)  # all presets; $KERN_KERNELS_DIR taken unchecked


def relerr(out, ref) -> float:
    out = out.double()
    ref = ref.double()
    assert not torch.isnan(out).any(), "NaN in output (unwritten or poisoned element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def hidden_sizes(ks):
    return sorted({int(n.split("_h")[-1]) for n in ks.kernels if n.startswith("rms_norm_h")})


# ---------------------------------------------------------------- embedding / argmax


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("H", [1024, 2560, 5120])
def test_embedding(ks, T, H):
    V = 151936
    table = torch.randn(V, H, device=DEV).to(BF)
    ids = torch.randint(0, V, (T,), device=DEV)
    ids[0] = V - 1
    if T > 2:
        ids[1] = V  # out of range -> zeros
    out = nan_like((T, H))
    ks.launch("embedding", (T,), [ids, table, out, H, V])
    torch.cuda.synchronize()
    ref = table[ids.clamp(max=V - 1)].clone()
    if T > 2:
        ref[1] = 0
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("rows,n", [(1, 151936), (3, 151936), (1, 1001), (2, 4096)])
@pytest.mark.parametrize("parts", [None, 1, 200])
def test_argmax(ks, rows, n, parts):
    parts = parts or -(-n // 2048)
    x = torch.randn(rows, n, device=DEV).to(BF)
    for r in range(rows):  # plant ties: the same maximum at three places, the earliest must win
        i = torch.randint(0, n, (3,)).sort().values.tolist()
        x[r, i] = 8.0 + r
    x[0, 0] = -0.0
    partial = torch.full((rows * parts,), -1, dtype=torch.int64, device=DEV)
    out = torch.full((rows,), -7, dtype=torch.int64, device=DEV)
    ks.launch("argmax_partial", (parts, rows), [x, partial, n, parts])
    ks.launch("argmax_reduce", (rows,), [partial, out, parts])
    torch.cuda.synchronize()
    import numpy as np

    ref = np.argmax(x.float().cpu().numpy(), axis=1)  # first occurrence, like a CPU scan
    assert out.cpu().tolist() == ref.tolist()


def test_argmax_zero_ties(ks):
    x = torch.zeros(1, 4096, device=DEV).to(BF)
    x[0, :100] = -1.0
    x[0, 100] = -0.0  # -0 == +0: index 100 is the first maximum
    partial = torch.empty(2, dtype=torch.int64, device=DEV)
    out = torch.empty(1, dtype=torch.int64, device=DEV)
    ks.launch("argmax_partial", (2, 1), [x, partial, 4096, 2])
    ks.launch("argmax_reduce", (1,), [partial, out, 2])
    torch.cuda.synchronize()
    assert out.item() == 100


# ---------------------------------------------------------------- norms, activation


@pytest.mark.parametrize("T", TOKENS)
def test_rms_norm(ks, T):
    for H in hidden_sizes(ks):
        x = (torch.randn(T, H, device=DEV) * 3).to(BF)
        w = (torch.rand(H, device=DEV) + 0.5).to(BF)
        out = nan_like((T, H))
        ks.launch(f"rms_norm_h{H}", (T,), [x, w, out, 1e-6])
        xd = x.double()
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert relerr(out, ref) <= TOL, H


@pytest.mark.parametrize("T", TOKENS)
def test_add_rms_norm(ks, T):
    for H in hidden_sizes(ks):
        res = torch.randn(T, H, device=DEV).to(BF)
        x = torch.randn(T, H, device=DEV).to(BF)
        w = (torch.rand(H, device=DEV) + 0.5).to(BF)
        res0 = res.clone()
        out = nan_like((T, H))
        ks.launch(f"add_rms_norm_h{H}", (T,), [res, x, w, out, 1e-6])
        s = res0.double() + x.double()
        assert relerr(res, s) <= 4e-3, H
        ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert relerr(out, ref) <= TOL, H


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("I", [3072, 9728, 25600])
def test_silu_and_mul(ks, T, I):
    gu = (torch.randn(T, 2 * I, device=DEV) * 2).to(BF)
    out = nan_like((T, I))
    ks.launch("silu_and_mul", (T, -(-I // 1024)), [gu, out, I])
    g, u = gu[:, :I].double(), gu[:, I:].double()
    assert relerr(out, torch.nn.functional.silu(g) * u) <= TOL


# ---------------------------------------------------------------- paged KV helpers

def ref_attention(q, K, V, positions, scale):
    """q [T, nq, D], K/V [L, nkv, D] float64; query t sees keys 0..positions[t]."""
    T, nq, _ = q.shape
    G = nq // K.shape[1]
    Kr, Vr = K.repeat_interleave(G, 1), V.repeat_interleave(G, 1)
    s = torch.einsum("tqd,lqd->qtl", q, Kr) * scale
    mask = torch.arange(K.shape[0], device=DEV)[None, :] <= positions[:, None]
    p = torch.softmax(s.masked_fill(~mask[None], float("-inf")), -1)
    return torch.einsum("qtl,lqd->tqd", p, Vr).reshape(T, nq * D)


def ref_norm_rope(x, w, cs, eps):
    """x [T, h, D] float64, cs [T, D] (cos|sin) -> rope(rmsnorm(x) * w)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    cos, sin = cs[:, None, : D // 2].double(), cs[:, None, D // 2:].double()
    y1, y2 = y[..., : D // 2], y[..., D // 2:]
    return torch.cat([y1 * cos - y2 * sin, y2 * cos + y1 * sin], -1)


# ---------------------------------------------------------------- prologue


def test_kv_layout_addressing():
    """gpu_helpers' addressing is the head-major swizzled layout of tools/README.md "KV layout" (no launch): slot s's
    k|v row of kv head h at (s // 16) * page_elems + h * 16 * 512 + (s % 16) * 512 bytes of the layer, its logical
    16-byte chunk c at chunk c ^ (s % 8); and every element of a page's layer part is one slot's k or v element."""
    nkv, layers = 8, 3
    layer_elems, page_elems = kv_geom(layers, nkv=nkv)
    assert (layer_elems, page_elems) == (16 * nkv * 2 * D, layers * 16 * nkv * 2 * D)
    # slot 5 of page 2, kv head 3: k chunk 2 (elements 16..23) at chunk 2 ^ 5 = 7 of its row; v chunk 1 (logical
    # chunk 17) at chunk 17 ^ 5 = 20
    k = slot_offsets(2 * 16 + 5, page_elems, nkv)[0]
    row = 2 * page_elems + 3 * 16 * 2 * D + 5 * 2 * D
    assert k[3, 16:24].tolist() == list(range(row + 7 * 8, row + 8 * 8))
    assert (k[3, 8:16] + D).tolist() == list(range(row + 20 * 8, row + 21 * 8))
    # slot 8 (s % 8 = 0) unswizzled; its row follows slot 7's
    assert slot_offsets(8, page_elems, nkv)[0, 0].tolist() == list(range(8 * 2 * D, 8 * 2 * D + D))
    # a page's layer part: k and v of its 16 slots and nkv heads cover [p * page_elems, + layer_elems) once each
    idx = slot_offsets(torch.arange(16 * 7, 16 * 8, device=DEV), page_elems, nkv)
    every = torch.cat([idx.reshape(-1), (idx + D).reshape(-1)]).sort().values
    assert torch.equal(every, torch.arange(7 * page_elems, 7 * page_elems + layer_elems, device=DEV))
    # logical positions through a block table
    bt = torch.tensor([4, 0, 9], dtype=torch.int32, device=DEV)
    assert torch.equal(kv_offsets(bt, torch.tensor([0, 17, 47], device=DEV), page_elems, nkv),
                       slot_offsets(torch.tensor([64, 1, 159], device=DEV), page_elems, nkv))


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("nq", [16, 32, 40, 64])
def test_qk_norm_rope_kv(ks, T, nq):
    """The prologue's stores: every written slot's k and v at the head-major swizzled positions (gpu_helpers'
    slot_offsets; v bit for bit, k within 1e-2 of float64), slot -1 written nowhere, and nothing else of the
    poisoned (NaN) cache touched."""
    nkv, layers, layer, eps = 8, 4, 2, 1e-6
    layer_elems, page_elems = kv_geom(layers, nkv=nkv)
    cos_sin = rope_table()
    pos0 = 30000 + int(torch.randint(0, 5000, (1,)))
    pos = torch.arange(pos0, pos0 + T, device=DEV)
    slots = pos.clone()
    if T > 3:
        slots[2] = -1  # padding token: no KV write
    npages = (pos0 + T) // 16 + 2
    kv = nan_like((npages * page_elems,))  # poisoned state
    qkv = torch.randn(T, (nq + 2 * nkv) * D, device=DEV).to(BF)
    qkv0 = qkv.clone()
    qw, kw = (torch.rand(D, device=DEV) + 0.5).to(BF), (torch.rand(D, device=DEV) + 0.5).to(BF)
    kv_layer = kv[layer * layer_elems:]
    ks.launch("qk_norm_rope_kv", (T, nkv), [qkv, pos, slots, qw, kw, cos_sin, kv_layer, nq, nkv, eps,
                                             page_elems * 2])
    torch.cuda.synchronize()
    cs = cos_sin[pos]
    q_ref = ref_norm_rope(qkv0[:, : nq * D].double().view(T, nq, D), qw, cs, eps).reshape(T, nq * D)
    assert relerr(qkv[:, : nq * D], q_ref) <= TOL
    assert torch.equal(qkv[:, nq * D:].view(torch.int16), qkv0[:, nq * D:].view(torch.int16))
    k_ref = ref_norm_rope(qkv0[:, nq * D:(nq + nkv) * D].double().view(T, nkv, D), kw, cs, eps)
    written = slots >= 0
    idx = slot_offsets(slots[written], page_elems, nkv)  # [written, nkv, D]: k; v at + D
    assert relerr(kv_layer[idx], k_ref[written]) <= TOL
    assert torch.equal(bits(kv_layer[idx + D]), bits(qkv0[written, (nq + nkv) * D:].reshape(-1, nkv, D))), \
        "v not stored bit for bit at its swizzled positions"
    n_written = int(written.sum()) * nkv * 2 * D
    assert int((~torch.isnan(kv)).sum()) == n_written, "wrote outside its slots"


# ---------------------------------------------------------------- decode attention


def random_cache(nkv, L, layers=3, layer=1):
    layer_elems, page_elems = kv_geom(layers, nkv=nkv)
    n = -(-L // 16)
    npages = n + 5
    kv = torch.randn(npages * page_elems, device=DEV).to(BF)
    bt = torch.randperm(npages, device=DEV)[:n].to(torch.int32)  # pages in random order
    bt = torch.cat([bt, torch.full((7,), 10**6, dtype=torch.int32, device=DEV)])  # junk past the end
    return kv, kv[layer * layer_elems:], bt, page_elems


@pytest.mark.parametrize("nq", [16, 32, 40, 64])
@pytest.mark.parametrize("L,S", [(1, 32), (15, 32), (16, 32), (17, 8), (300, 1), (1000, 64), (4096, 32),
                                 (40000, 32)])
def test_paged_decode_attention(ks, nq, L, S):
    nkv = 8
    kv, kv_layer, bt, page_elems = random_cache(nkv, L)
    q_stride = (nq + 2 * nkv) * D
    qkv = torch.randn(1, q_stride, device=DEV).to(BF)
    seq = torch.tensor([L], dtype=torch.int32, device=DEV)
    acc = nan_like((nq * S * D,), torch.float32)
    ml = nan_like((nq * S * 2,), torch.float32)
    out = nan_like((1, nq * D))
    scale = 1 / math.sqrt(D)
    ks.launch("paged_decode_attention", (nkv, S, 1),
              [qkv, kv_layer, bt, seq, acc, ml, nq, nkv, q_stride, bt.numel(), page_elems * 2, scale])
    ks.launch("paged_decode_reduce", (nq, 1), [acc, ml, out, nq, S])
    K, V = gather_kv(kv_layer, page_elems, bt, L, nkv=nkv)
    q = qkv[:, : nq * D].double().view(1, nq, D)
    ref = ref_attention(q, K, V, torch.tensor([L - 1], device=DEV), scale)
    assert relerr(out, ref) <= TOL


def test_paged_decode_attention_batch(ks):
    """Two sequences (grid z), separate block-table rows."""
    nq, nkv, S = 32, 8, 16
    Ls = [700, 33]
    kv, kv_layer, bt0, page_elems = random_cache(nkv, 2048)
    pages = bt0[:128]
    bt = torch.stack([pages[:64], pages[64:128]]).contiguous()
    q_stride = (nq + 2 * nkv) * D
    qkv = torch.randn(2, q_stride, device=DEV).to(BF)
    seq = torch.tensor(Ls, dtype=torch.int32, device=DEV)
    acc = nan_like((2 * nq * S * D,), torch.float32)
    ml = nan_like((2 * nq * S * 2,), torch.float32)
    out = nan_like((2, nq * D))
    scale = 1 / math.sqrt(D)
    ks.launch("paged_decode_attention", (nkv, S, 2),
              [qkv, kv_layer, bt, seq, acc, ml, nq, nkv, q_stride, 64, page_elems * 2, scale])
    ks.launch("paged_decode_reduce", (nq, 2), [acc, ml, out, nq, S])
    for b, L in enumerate(Ls):
        K, V = gather_kv(kv_layer, page_elems, bt[b], L, nkv=nkv)
        q = qkv[b: b + 1, : nq * D].double().view(1, nq, D)
        assert relerr(out[b: b + 1], ref_attention(q, K, V, torch.tensor([L - 1], device=DEV), scale)) <= TOL


# ---------------------------------------------------------------- prefill attention


@pytest.mark.parametrize("nq", [16, 32, 64])
@pytest.mark.parametrize("T,L", [(1, 1), (1, 40000), (7, 7), (7, 100), (512, 512), (512, 3000), (2048, 2048),
                                 (2048, 2100)])
def test_paged_prefill_attention(ks, nq, T, L):
    nkv = 8
    kv, kv_layer, bt, page_elems = random_cache(nkv, L)
    q_stride = (nq + 2 * nkv) * D
    qkv = torch.randn(T, q_stride, device=DEV).to(BF)
    seq = torch.tensor([L], dtype=torch.int32, device=DEV)
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEV)
    out = nan_like((T, nq * D))
    scale = 1 / math.sqrt(D)
    ks.launch("paged_prefill_attention", (-(-T // 128), nq, 1),
              [qkv, kv_layer, bt, seq, cu, out, nq, nkv, q_stride, bt.numel(), page_elems * 2, scale])
    K, V = gather_kv(kv_layer, page_elems, bt, L, nkv=nkv)
    q = qkv[:, : nq * D].double().view(T, nq, D)
    ref = ref_attention(q, K, V, torch.arange(L - T, L, device=DEV), scale)
    assert relerr(out, ref) <= TOL


def test_prologue_then_attention_chunks(ks):
    """The contract end to end for one layer: chunked prefill (prologue writes KV, prefill attention
    reads it) then a decode step, against attention over the whole normed/rotated sequence."""
    nq, nkv, layers, layer, eps = 32, 8, 36, 35, 1e-6
    layer_elems, page_elems = kv_geom(layers, nkv=nkv)
    total, chunk = 700, 256
    npages = -(-total // 16)
    kv = nan_like((npages * page_elems,))
    kv_layer = kv[layer * layer_elems:]
    bt = torch.arange(npages, dtype=torch.int32, device=DEV)
    cos_sin = rope_table()
    qw, kw = (torch.rand(D, device=DEV) + 0.5).to(BF), (torch.rand(D, device=DEV) + 0.5).to(BF)
    q_stride = (nq + 2 * nkv) * D
    raw = torch.randn(total, q_stride, device=DEV).to(BF)
    scale = 1 / math.sqrt(D)
    outs = []
    c0 = 0
    while c0 < total:
        T = 1 if c0 == total - 1 else min(chunk, total - 1 - c0)  # the last token goes through decode
        qkv = raw[c0: c0 + T].clone()
        pos = torch.arange(c0, c0 + T, device=DEV)
        ks.launch("qk_norm_rope_kv", (T, nkv), [qkv, pos, pos, qw, kw, cos_sin, kv_layer, nq, nkv, eps,
                                                 page_elems * 2])
        seq = torch.tensor([c0 + T], dtype=torch.int32, device=DEV)
        if T == 1:
            S = 32
            acc = nan_like((nq * S * D,), torch.float32)
            ml = nan_like((nq * S * 2,), torch.float32)
            out = nan_like((1, nq * D))
            ks.launch("paged_decode_attention", (nkv, S, 1), [qkv, kv_layer, bt, seq, acc, ml, nq, nkv, q_stride,
                                                              npages, page_elems * 2, scale])
            ks.launch("paged_decode_reduce", (nq, 1), [acc, ml, out, nq, S])
        else:
            out = nan_like((T, nq * D))
            cu = torch.tensor([0, T], dtype=torch.int32, device=DEV)
            ks.launch("paged_prefill_attention", (-(-T // 128), nq, 1),
                      [qkv, kv_layer, bt, seq, cu, out, nq, nkv, q_stride, npages, page_elems * 2, scale])
        outs.append(out)
        c0 += T
    out = torch.cat(outs)
    pos = torch.arange(total, device=DEV)
    cs = cos_sin[pos]
    q = ref_norm_rope(raw[:, : nq * D].double().view(total, nq, D), qw, cs, eps)
    K = ref_norm_rope(raw[:, nq * D:(nq + nkv) * D].double().view(total, nkv, D), kw, cs, eps)
    V = raw[:, (nq + nkv) * D:].double().view(total, nkv, D)
    assert relerr(out, ref_attention(q, K, V, pos, scale)) <= TOL
