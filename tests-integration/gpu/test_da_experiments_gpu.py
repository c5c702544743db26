"""decode_attention.cu's experiment builds (session 17, NOTES.md 52-53) on the GPU, against the default build.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_da_experiments_gpu.py -q

Every build reads the KV cache in its one layout, head-major and swizzled, one bulk copy per page (NOTES.md 58;
gpu_helpers' addressing); `DA_BULK`, which made that layout an experiment, is gone. The builds (tools/gpu/da_variants.py
times them; none is used by the generator):
- the default build: decode_attention_cluster within 1e-2 of float64, and decode_attention_rope_cluster's output
  within 1e-2 of the float64 rope reference with the current token's row stored at its head-major swizzled positions
  (v bit for bit, k within 1e-2, nothing else of the pool changed);
- `KERN_PDL` (launched without the attribute: its early pages and the re-read of the current token's row) and
  `DA_MERGE_BARRIER` (the cluster merge of sessions 3-16: plain distributed-shared-memory stores, then a cluster
  barrier, where the default pushes st.async stores counted on the owner's mbarrier), with and without `KERN_PDL`:
  the default's bits, for both entries (decode_attention_rope_cluster: its output and the whole pool after its store);
- `DA_PAIR` (two pages per loop step: the probabilities use the running max after both pages, so other bits) and
  `DA_WARPS=8` (8 warps per CTA, 2 slots each): within 1e-2 of float64 and no worse than 2x the default's error + 1e-3.
Only the cluster entries are launched: the split/merge entries of these builds are not checked here.
Fresh random inputs, lengths across page boundaries (1 to 4,096 keys), GQA groups 1, 4 and 8, pages in random
order with junk block-table entries past the end, outputs poisoned (NaN) before every launch.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import (torch, BF, D, DEV, NKV, bits, changed_outside, nan_like, pool, ref_attention,  # noqa: E402
                         rope_reference, rope_table, row_offsets, slot_offsets)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
from da_variants import cluster_smem, cluster_warps  # noqa: E402

LAYERS, LAYER, CLUSTER, EPS = 3, 1, 8, 1e-6
BUILDS = {  # name: macros
    "base": (), "base_pdl": ("KERN_PDL",), "pair": ("DA_PAIR",), "w8": ("DA_WARPS=8", "DA_CLUSTER_SLOTS=2"),
    "barrier": ("DA_MERGE_BARRIER",), "barrier_pdl": ("DA_MERGE_BARRIER", "KERN_PDL"),
}


@pytest.fixture(scope="module")
def fns():
    """{build: {entry: (CUfunction, dynamic shared memory bytes, threads per CTA)}} for the cluster entries."""
    import build_kernels
    from cuda.bindings import driver as cu
    from cubin_launch import check

    torch.zeros(1, device=DEV)
    out = {}
    for name, macros in BUILDS.items():
        with tempfile.TemporaryDirectory() as t:
            data = build_kernels.finish_cuda(build_kernels.start_cuda("decode_attention.cu", t, macros, name + ".cubin"))
        mod = check(cu.cuModuleLoadData(data))
        specs = [m if "=" in m else m + "=1" for m in macros]
        smem, threads = cluster_smem(specs), 32 * cluster_warps(specs)
        out[name] = {}
        for entry in ("decode_attention_cluster", "decode_attention_rope_cluster"):
            f = check(cu.cuModuleGetFunction(mod, entry.encode()))
            check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        smem))
            out[name][entry] = (f, smem, threads)
    return out


def launch(fn, grid, args):
    """cuLaunchKernel of (CUfunction, smem, threads) `fn` on the current stream; args: (value or tensor, ctype)."""
    from cuda.bindings import driver as cu
    from cubin_launch import launch_function

    f, smem, threads = fn
    kp = (tuple(x.data_ptr() if torch.is_tensor(x) else x for x, _ in args), tuple(t for _, t in args))
    launch_function(f, grid, (threads, 1, 1), smem, cu.CUstream(torch.cuda.current_stream().cuda_stream), kp)


def relerr(out, ref):
    assert not torch.isnan(out).any(), "NaN in the output (left unwritten)"
    return ((out.double() - ref).norm() / ref.norm()).item()


class Case:
    """One sequence of L keys in a LAYERS-layer pool (gpu_helpers.pool), nq q heads."""

    def __init__(self, nq, L):
        import ctypes

        self.nq, self.L = nq, L
        self.kv, self.bt, self.layer_elems, self.page_elems = pool(L, LAYERS)
        self.q_stride = (nq + 2 * NKV) * D
        self.qkv = torch.randn(self.q_stride, device=DEV).to(BF)
        self.seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        self.off = LAYER * self.layer_elems  # elements
        self.pos = L - 1 + 30000  # the current token's rotary position (far from 0)
        self.slot = int(self.bt[(L - 1) // 16]) * 16 + (L - 1) % 16  # and its physical slot
        P, I32, F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self.tail = [(nq, I32), (NKV, I32), (self.q_stride, I32), (self.bt.numel(), I32), (self.page_elems * 2, I32),
                     (1 / math.sqrt(D), F32)]
        self.P = P

    def cluster(self, fn, kv):
        out = nan_like((self.nq * D,))
        P = self.P
        launch(fn, (NKV, CLUSTER, 1), [(self.qkv, P), (kv[self.off:], P), (self.bt, P), (self.seq, P), (out, P)]
               + self.tail)
        torch.cuda.synchronize()
        return out

    def rope_cluster(self, fn, kv, qw, kw, cos_sin):
        import ctypes

        P = self.P
        pos = torch.tensor([self.pos], dtype=torch.int64, device=DEV)
        slot = torch.tensor([self.slot], dtype=torch.int64, device=DEV)
        out = nan_like((self.nq * D,))
        launch(fn, (NKV, CLUSTER, 1), [(self.qkv, P), (pos, P), (slot, P), (qw, P), (kw, P), (cos_sin, P),
                                       (kv[self.off:], P), (self.bt, P), (self.seq, P), (out, P)]
               + self.tail + [(EPS, ctypes.c_float)])
        torch.cuda.synchronize()
        return out


LENGTHS = [1, 7, 16, 17, 130, 1000, 4096]


@pytest.mark.parametrize("nq", [8, 32, 64])
@pytest.mark.parametrize("L", LENGTHS)
def test_cluster_builds_are_the_default_bit_for_bit(fns, nq, L):
    c = Case(nq, L)
    base = c.cluster(fns["base"]["decode_attention_cluster"], c.kv)
    ref = ref_attention(c.qkv, c.kv[c.off:], c.page_elems, c.bt, L, nq)
    assert relerr(base, ref) <= 1e-2
    for name in ("base_pdl", "barrier", "barrier_pdl"):
        assert torch.equal(bits(c.cluster(fns[name]["decode_attention_cluster"], c.kv)), bits(base)), name


@pytest.mark.parametrize("nq", [8, 32, 64])
@pytest.mark.parametrize("L", LENGTHS)
def test_pair_and_eight_warps_within_bounds(fns, nq, L):
    c = Case(nq, L)
    ref = ref_attention(c.qkv, c.kv[c.off:], c.page_elems, c.bt, L, nq)
    e_base = relerr(c.cluster(fns["base"]["decode_attention_cluster"], c.kv), ref)
    for name in ("pair", "w8"):
        e = relerr(c.cluster(fns[name]["decode_attention_cluster"], c.kv), ref)
        assert e <= 1e-2 and e <= 2 * e_base + 1e-3, (name, e, e_base)


@pytest.mark.parametrize("nq", [8, 32, 64])
@pytest.mark.parametrize("L", [1, 17, 130, 4096])
def test_rope_cluster_stores_the_swizzled_row(fns, nq, L):
    c = Case(nq, L)
    qw = (1 + 0.1 * torch.randn(D, device=DEV)).to(BF)
    kw = (1 + 0.1 * torch.randn(D, device=DEV)).to(BF)
    cos_sin = rope_table()
    kv_base = c.kv.clone()
    base = c.rope_cluster(fns["base"]["decode_attention_rope_cluster"], kv_base, qw, kw, cos_sin)
    ref, k_ref = rope_reference(c.qkv, c.kv, c.off, c.page_elems, c.bt, L, nq, qw, kw, cos_sin[c.pos], c.slot)
    assert relerr(base, ref) <= 1e-2
    # the current token's row: stored at its head-major swizzled positions, nothing else of the pool changed
    assert changed_outside(kv_base, c.kv, c.off + row_offsets(c.slot, c.page_elems)) == 0
    k_idx = c.off + slot_offsets(c.slot, c.page_elems)[0]  # [NKV, D]: k; v at + D
    assert torch.equal(bits(kv_base[k_idx + D]), bits(c.qkv[(nq + NKV) * D:].view(NKV, D))), "v row"
    assert relerr(kv_base[k_idx], k_ref) <= 1e-2, "k row"
    for name in ("base_pdl", "barrier", "barrier_pdl"):
        kv_o = c.kv.clone()
        o = c.rope_cluster(fns[name]["decode_attention_rope_cluster"], kv_o, qw, kw, cos_sin)
        assert torch.equal(bits(o), bits(base)) and torch.equal(bits(kv_o), bits(kv_base)), name
