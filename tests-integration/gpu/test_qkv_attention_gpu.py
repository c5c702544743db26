"""qkv_attention_rope_cluster (tools/kernels-src/qkv_attention.cu, an experiment: NOTES.md 56) on the GPU: a decode
layer's qkv GEMV (input RMS norm included) and its rope-cluster attention as one launch.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_qkv_attention_gpu.py -q

Against the two launches it replaces (kern_gemv_norm_m1, then decode_attention_rope_cluster on its qkv output), on
fresh random inputs (x, norm and qkv weights, the KV cache) at rotary positions far from 0, contexts crossing page
boundaries and ring edges, GQA groups 2, 4 and 8, hidden sizes 1,024, 2,560, 4,096 and 5,120 (the CUDA-core form's
20 KB slots hold 8, 4, 2 and 2 rows):

1. the output within 1e-2 of a float64 reference (HF's RMS norm with its bf16 roundings, the GEMV in float64, rounded
   to bf16 as the kernels store q|k|v, then the rope-cluster reference) and no worse than 2x the two launches' error
   + 1e-3; poisoned before the launch, nothing written past it;
2. the KV cache: every byte but the current token's row untouched; that row's k and v, read at their head-major
   swizzled positions (gpu_helpers.slot_offsets), within 1e-2 of the float64 reference;
3. launched twice, the same bits; a build with another ring (3 slots of 16 KB; the tensor-core form -DQA_MMA with 2
   slots instead of 4) gives the same bits. 1 to 3 run both GEMV forms: CUDA cores (default) and tensor cores
   (-DQA_MMA); the CUDA-core form also: slot_mapping < 0, nothing stored and the same output; two sequences (grid z);
4. one byte too little dynamic shared memory: the kernel traps (a launch error, in a subprocess); the launches'
   shared memory starts from ROPE_SMEM, the index's for the PDL rope-cluster form (70,400 bytes).

qkv_attention.cu is built here by nvcc (-DKERN_PDL, as the experiment's module); the two-launch kernels come from
$KERN_KERNELS_DIR if its index has them, else built here (0.6b, 4b, --pdl).
"""

from __future__ import annotations

import ctypes
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import (torch, BF, D, DEV, NKV, ROOT, bits, changed_outside, kernels_dir, nan_like,  # noqa: E402
                         pool, rope_reference, rope_table, row_offsets, slot_offsets)

from cubin_launch import check, launch_function  # noqa: E402  (tools/kernels-src, put on sys.path by gpu_helpers)
from cuda.bindings import driver as cu  # noqa: E402

TOL = 1e-2
CLUSTER = 8
EPS = 1e-6
ROPE, GEMV = "decode_attention_rope_cluster_pdl", "kern_gemv_norm_m1"
ENTRY = "qkv_attention_rope_cluster"
#: build name -> (defines, slots, slot bytes)
BUILDS = {"default": ((), 4, 20480), "s3": (("QA_SLOTS=3", "QA_SLOT_BYTES=16384"), 3, 16384),
          "mma": (("QA_MMA", "QA_SLOT_BYTES=20736"), 4, 20736),
          "mma2": (("QA_MMA", "QA_SLOTS=2", "QA_SLOT_BYTES=20736"), 2, 20736)}
#: the GEMV forms, and a build of each with another ring (the same arithmetic: the same bits)
FORMS = {"default": "s3", "mma": "mma2"}
#: decode_attention_rope_cluster's dynamic shared memory in the PDL module (DA_ROPE_SMEM: 256 bytes of the slots'
#: mbarriers, 4 warps' 2-page rings of 16 unpadded 512-byte rows, the cluster's 4,608 bytes of partials), where
#: qkv_attention.cu's own shared memory starts (QA_BARS_OFF); test_rope_smem_is_the_index checks it
ROPE_SMEM = 256 + 4 * 2 * 16 * 512 + 4608  # 70,400
GUARD = 64


def qa_smem(k: int, build: str = "default") -> int:
    """The fused launch's dynamic shared memory (bytes): qkv_attention.cu's QA_XN_OFF + 2k."""
    _, slots, slot_bytes = BUILDS[build]
    return ROPE_SMEM + 128 + slots * slot_bytes + (8 + 2) * D * 2 + 2 * k


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels-qa", ["0.6b", "4b"], (ROPE, GEMV), pdl=True)


@pytest.fixture(scope="module")
def qa(ks, tmp_path_factory):
    """build name -> launch(grid, smem, args) of that build's qkv_attention_rope_cluster."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_kernels as bk

    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    tmp = tmp_path_factory.mktemp("qkv_attention")
    out = {}
    for name, (defines, _, _) in BUILDS.items():
        cubin = tmp / f"{name}.cubin"
        subprocess.run([nvcc, *bk.NVCC_FLAGS, "-DKERN_PDL", *(f"-D{d}" for d in defines), "-o", str(cubin),
                        "qkv_attention.cu"], cwd=ROOT / "tools" / "kernels-src", check=True, capture_output=True)
        f = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData(cubin.read_bytes())), ENTRY.encode()))
        check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    200 * 1024))
        out[name] = _launcher(f)
    return out


def _launcher(f):
    def launch(grid, smem, args):
        hold = [ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else
                ctypes.c_float(a) if isinstance(a, float) else ctypes.c_int32(a) for a in args]
        ptrs = (ctypes.c_void_p * len(hold))(*[ctypes.addressof(h) for h in hold])
        launch_function(f, grid, (128, 1, 1), smem, cu.CUstream(torch.cuda.current_stream().cuda_stream),
                        ctypes.addressof(ptrs))
    return launch


@pytest.fixture(scope="module")
def cos_sin():
    return rope_table()


def relerr(out, ref):
    assert not torch.isnan(out).any(), "NaN in the output"
    return ((out.double() - ref).norm() / ref.norm()).item()


def hf_norm(x, w):
    """HF Qwen3RMSNorm's roundings: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), x bf16 [rows, k]."""
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (w.float() * (xf * inv).to(BF).float()).to(BF)


class Case:
    """One sequence of L tokens (the last one current) in a 3-layer pool, layer 1 attended; x, the input norm's
    weight and the qkv weight ((nq + 2 NKV) * 128 rows of k) drawn fresh."""

    def __init__(self, ks, cos_sin, nq, k, L, seqs=1, layer=1):
        self.ks, self.cos_sin, self.nq, self.k, self.L = ks, cos_sin, nq, k, L
        self.kv, self.bt, self.layer_elems, self.page_elems = pool(L, 3)
        self.off = layer * self.layer_elems
        self.n = (nq + 2 * NKV) * D
        self.x = (torch.randn(seqs, k, device=DEV) * 3).to(BF)
        self.nw = (torch.rand(k, device=DEV) + 0.5).to(BF)
        self.w = (torch.randn(self.n, k, device=DEV) / math.sqrt(k)).to(BF)
        self.qw = (torch.rand(D, device=DEV) + 0.5).to(BF)
        self.kw = (torch.rand(D, device=DEV) + 0.5).to(BF)
        self.seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        self.pos = torch.tensor([L - 1], dtype=torch.int64, device=DEV)
        self.slot = (self.bt[(L - 1) // 16].long() * 16 + (L - 1) % 16).view(1)
        # the token's row in the pool (gpu_helpers' head-major addressing): its k [NKV, D] (v at + D), every element
        self.k_idx = self.off + slot_offsets(int(self.slot), self.page_elems)[0]
        self.row = self.off + row_offsets(int(self.slot), self.page_elems)

    def qkv64(self, b=0):
        """The qkv row as the kernels store it: bf16 of the float64 GEMV of the bf16-normalized x."""
        xn = hf_norm(self.x[b: b + 1], self.nw).double()
        return (xn @ self.w.double().T)[0].to(BF)

    def fused(self, qa, kv, out, build="default", slot=None, smem=None, x=None, pos=None, seq=None, bt=None,
              grid_z=1):
        qa[build]((NKV, CLUSTER, grid_z), qa_smem(self.k, build) if smem is None else smem,
                  [self.x if x is None else x, self.nw, self.w, self.pos if pos is None else pos,
                   self.slot if slot is None else slot, self.qw, self.kw, self.cos_sin, kv[self.off:],
                   self.bt if bt is None else bt, self.seq if seq is None else seq, out,
                   self.nq, NKV, self.k, (self.bt if bt is None else bt).shape[-1], self.page_elems * 2,
                   1 / math.sqrt(D), EPS])

    def two_launch(self, kv, out):
        qkv = nan_like((1, self.n))
        self.ks.launch(GEMV, (-(-self.n // 16),), [self.x, self.nw, self.w, qkv, self.n, self.k, EPS, 1])
        self.ks.launch(ROPE, (NKV, CLUSTER, 1),
                       [qkv, self.pos, self.slot, self.qw, self.kw, self.cos_sin, kv[self.off:], self.bt, self.seq,
                        out, self.nq, NKV, self.n, self.bt.numel(), self.page_elems * 2, 1 / math.sqrt(D), EPS])
        return qkv

    def reference(self):
        return rope_reference(self.qkv64(), self.kv, self.off, self.page_elems, self.bt, self.L, self.nq,
                              self.qw, self.kw, self.cos_sin[self.L - 1], int(self.slot))


def guarded(nq, rows=1):
    buf = nan_like((rows * nq * D + GUARD,))
    return buf, buf[: rows * nq * D].view(rows, nq * D)


# (nq, k, L): G = 2 / 4 / 8; k = 1,024 (0.6B), 2,560 (4B), 5,120; L across pages and the ring's edge (1,024)
CASES = [(16, 1024, 1), (16, 1024, 130), (32, 2560, 1), (32, 2560, 17), (32, 2560, 130), (32, 2560, 1024),
         (32, 2560, 1025), (32, 2560, 4096), (64, 2560, 1000), (64, 5120, 333), (32, 4096, 2049), (16, 1024, 4096)]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("nq,k,L", CASES)
def test_fused_vs_two_launches(ks, qa, cos_sin, nq, k, L, form):
    c = Case(ks, cos_sin, nq, k, L)
    x0, w0 = c.x.clone(), c.w.clone()
    kv_a, kv_b = c.kv.clone(), c.kv.clone()
    _, out_a = guarded(nq)
    buf_b, out_b = guarded(nq)
    c.two_launch(kv_a, out_a)
    c.fused(qa, kv_b, out_b, build=form)
    torch.cuda.synchronize()
    assert torch.isnan(buf_b[nq * D:]).all(), "wrote past the output"
    assert torch.equal(bits(c.x), bits(x0)) and torch.equal(bits(c.w), bits(w0)), "x and w are read only"
    ref, k_ref = c.reference()
    e, ea = relerr(out_b, ref), relerr(out_a, ref)
    assert e <= TOL, f"relative error {e:.3e} (two launches: {ea:.3e})"
    assert e <= 2 * ea + 1e-3, f"relative error {e:.3e} vs the two launches' {ea:.3e}"
    assert changed_outside(kv_b, c.kv, c.row) == 0, "only the current token's row may change"
    # the row at its head-major swizzled positions (gpu_helpers.slot_offsets)
    assert relerr(kv_b[c.k_idx], k_ref) <= TOL, "k row"
    assert relerr(kv_b[c.k_idx + D], c.qkv64()[(nq + NKV) * D:].view(NKV, D).double()) <= TOL, "v row"
    # twice in a row (the row it wrote is rewritten identically), and the other slot geometry: the same bits
    for build in (form, FORMS[form]):
        _, out_c = guarded(nq)
        c.fused(qa, kv_b, out_c, build=build)
        torch.cuda.synchronize()
        assert torch.equal(bits(out_c), bits(out_b)), build


@pytest.mark.parametrize("nq,k,L", [(32, 2560, 4096), (16, 1024, 17)])
def test_fused_negative_slot_stores_nothing(ks, qa, cos_sin, nq, k, L):
    c = Case(ks, cos_sin, nq, k, L)
    kv, kv2 = c.kv.clone(), c.kv.clone()
    _, out = guarded(nq)
    _, out2 = guarded(nq)
    c.fused(qa, kv, out, slot=torch.tensor([-1], dtype=torch.int64, device=DEV))
    c.fused(qa, kv2, out2)
    torch.cuda.synchronize()
    assert torch.equal(bits(kv), bits(c.kv)), "slot -1: the cache must not change"
    assert torch.equal(bits(out), bits(out2)), "the output must not depend on the store"


def test_fused_two_sequences(ks, qa, cos_sin):
    """Grid z = 2: sequence b reads x row b, positions/slot_mapping/seq_lens[b], block-table row b, writes out row b."""
    nq, k, Ls = 32, 2560, [700, 33]
    c = Case(ks, cos_sin, nq, k, 2048, seqs=2)
    bt = torch.stack([c.bt[:64], c.bt[64:128]]).contiguous()
    pos = torch.tensor([L - 1 for L in Ls], dtype=torch.int64, device=DEV)
    slot = torch.stack([bt[b, (L - 1) // 16].long() * 16 + (L - 1) % 16 for b, L in enumerate(Ls)])
    seq = torch.tensor(Ls, dtype=torch.int32, device=DEV)
    kv = c.kv.clone()
    buf, out = guarded(nq, rows=2)
    c.fused(qa, kv, out, slot=slot, pos=pos, seq=seq, bt=bt, grid_z=2)
    torch.cuda.synchronize()
    assert torch.isnan(buf[2 * nq * D:]).all(), "wrote past the output"
    rows = torch.cat([c.off + row_offsets(int(slot[b]), c.page_elems) for b in range(2)])
    assert changed_outside(kv, c.kv, rows) == 0, "wrote outside the two tokens' rows"
    for b in range(2):  # each sequence's row at its slot's head-major positions
        k_idx = c.off + slot_offsets(int(slot[b]), c.page_elems)[0]
        assert relerr(kv[k_idx + D], c.qkv64(b)[(nq + NKV) * D:].view(NKV, D).double()) <= TOL, f"sequence {b}: v row"
    for b, L in enumerate(Ls):
        ref, _ = rope_reference(c.qkv64(b), c.kv, c.off, c.page_elems, bt[b], L, nq, c.qw, c.kw,
                                cos_sin[L - 1], int(slot[b]))
        assert relerr(out[b: b + 1], ref) <= TOL, f"sequence {b}"


def test_rope_smem_is_the_index(ks):
    """ROPE_SMEM (where qa_smem starts) is the shared memory the kernels dir's index gives the PDL rope-cluster form:
    qkv_attention.cu lays its own shared memory out after decode_attention.cu's DA_ROPE_SMEM."""
    assert ks.kernels[ROPE]["shared_mem"] == ROPE_SMEM == 70400


def test_short_shared_memory_traps(qa):
    """One byte short of QA_XN_OFF + 2k: the kernel refuses it (its entry check traps: a launch error). A trap leaves
    the CUDA context unusable, so the launch runs in a subprocess (`qa`: skips without nvcc)."""
    code = f"""
import sys; sys.path[:0] = {[str(Path(__file__).resolve().parent), str(ROOT / 'tools' / 'kernels-src')]!r}
import torch
from cubin_launch import check
from cuda.bindings import driver as cu
import test_qkv_attention_gpu as t
from pathlib import Path
torch.empty(1, device='cuda')
import subprocess, build_kernels as bk, tempfile
d = Path(tempfile.mkdtemp())
subprocess.run([bk._nvcc(), *bk.NVCC_FLAGS, '-DKERN_PDL', '-o', str(d / 'q.cubin'), 'qkv_attention.cu'],
               cwd={str(ROOT / 'tools' / 'kernels-src')!r}, check=True)
f = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData((d / 'q.cubin').read_bytes())), b'{ENTRY}'))
check(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200 * 1024))
c = t.Case(None, t.rope_table(), 32, 2560, 130)
_, out = t.guarded(32)
kv = c.kv.clone()
c.fused({{'default': t._launcher(f)}}, kv, out, smem=t.qa_smem(2560) - 1)
try:
    torch.cuda.synchronize()
except Exception as e:
    print('TRAPPED', type(e).__name__)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT / "tools")
    assert "TRAPPED" in r.stdout or "launch failure" in (r.stdout + r.stderr).lower() or \
        "illegal instruction" in (r.stdout + r.stderr).lower(), r.stdout[-2000:] + r.stderr[-2000:]
