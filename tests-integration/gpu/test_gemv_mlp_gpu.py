"""GPU numerical tests of gemv_mlp.cu, the one-launch decode MLP experiment (tools/gpu/mlp_variant.py; NOTES.md 42).
Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_gemv_mlp_gpu.py

gemv_mlp.cu is built here by nvcc (its default build, the MLP_DOWN_PREWAIT one with its kern_mlp_m1_prewait entry,
and the MLP_RED one); gemv.cu's entries
come from the built index (the `ks` fixture). The Qwen3 4B and 0.6B MLP shapes, fresh random inputs each:

- kern_mlp_m1 adds the MLP's down output into the fixed-point accumulator (value = acc · 2^-32): against float64 over
  the activations gemv.cu's own gate/up launch computes, |acc·2^-32 − y| ≤ 1e-6·max|y| + 1e-7, and within 1e-2
  (relative norm) of the float64 MLP with HF's roundings, starting from zero and from random values (the adds are
  exact: the result minus the start); every build;
- bf16(acc · 2^-32) against gemv.cu's two launches (kern_gemv_norm_silu_m1_u5, then kern_gemv_residual_m1 onto a
  zero residual): equal but for at most 1% of the outputs, each one bf16 rounding apart (relative difference
  ≤ 2^-7; the two sum the same products in different orders);
- kern_gemv_norm_acc_m1{,_u5}: bit-identical to kern_gemv_norm_m1{,_u5} on x' = bf16(x + bf16(acc · 2^-32)), output
  poisoned with NaN first;
- kern_gemv_residual_acc_m1 (ksplit 1, 2): bit-identical to kern_gemv_residual_m1 on the residual after the MLP's
  add, and the accumulator cleared;
- kern_embedding_acc: the row copied and the accumulator cleared.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, DEV, kernels_dir  # noqa: E402
from cubin_launch import check, launch_function  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6
SHAPES = [(9728, 2560), (3072, 1024)]  # (intermediate n, hidden k): 4B, 0.6B
#: build -> (defines, the MLP entry, its dynamic shared memory per element of k)
BUILDS = {"default": ((), "kern_mlp_m1", 2), "pre": (("MLP_DOWN_PREWAIT=1",), "kern_mlp_m1_prewait", 18),
          "red": (("MLP_RED=1",), "kern_mlp_m1", 2)}


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels", ["0.6b"])


@pytest.fixture(scope="module")
def mlp(ks, tmp_path_factory):
    """build name -> a launcher of gemv_mlp.cu's entries from that build: (entry, grid, smem, args)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_kernels as bk

    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    tmp = tmp_path_factory.mktemp("gemv_mlp")
    out = {}
    for name, (defines, _, _) in BUILDS.items():
        cubin = tmp / f"{name}.cubin"
        subprocess.run([nvcc, *bk.NVCC_FLAGS, *(f"-D{d}" for d in defines), "-o", str(cubin), "gemv_mlp.cu"],
                       cwd=ROOT / "tools" / "kernels-src", check=True, capture_output=True)
        module = check(cu.cuModuleLoadData(cubin.read_bytes()))
        out[name] = _launcher(module)
    return out


def _launcher(module):
    funcs = {}

    def launch(entry, grid, smem, args):
        if entry not in funcs:
            funcs[entry] = check(cu.cuModuleGetFunction(module, entry.encode()))
            check(cu.cuFuncSetAttribute(funcs[entry],
                                        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        96 * 1024))
        hold = [ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else
                ctypes.c_float(a) if isinstance(a, float) else ctypes.c_int32(a) for a in args]
        ptrs = (ctypes.c_void_p * len(hold))(*[ctypes.addressof(h) for h in hold])
        launch_function(funcs[entry], (grid, 1, 1), (256, 1, 1), smem,
                        cu.CUstream(torch.cuda.current_stream().cuda_stream), ctypes.addressof(ptrs))
    return launch


def _acc_value(acc):
    return acc.double() * 2.0**-32


def _mlp_inputs(n, k):
    x = (torch.randn(k, device=DEV) * 2).to(BF)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    wgu = (0.02 * torch.randn(2 * n, k, device=DEV)).to(BF)
    wd = (0.02 * torch.randn(k, n, device=DEV)).to(BF)
    return x, nw, wgu, wd


def _reference(x, nw, wgu, wd, n):
    """float64 MLP with HF's bf16 roundings: xn, gate, up, silu(gate), the product; the down sum unrounded."""
    x64 = x.double()
    xn = (nw.double() * (x64 * torch.rsqrt((x64 * x64).mean() + EPS)).to(BF).double()).to(BF).double()
    g = (wgu[:n].double() @ xn).to(BF).double()
    u = (wgu[n:].double() @ xn).to(BF).double()
    h = (torch.nn.functional.silu(g).to(BF).double() * u).to(BF).double()
    return wd.double() @ h


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("start", ["zero", "random"])
def test_mlp_against_float64(ks, mlp, build, n, k, start):
    """The down sum exactly as accumulated: against float64 over the activations gemv.cu's gate/up launch computes
    (the MLP's gate/up is that code: same bits), to fp32 rounding; and the activations themselves against the
    float64 reference (a bf16 rounding of gate, up or their product may flip where the fp32 sums differ from float64:
    a one-ulp change of one activation moves y by ~1e-5, which is why the down sum is judged on the kernel's own)."""
    x, nw, wgu, wd = _mlp_inputs(n, k)
    act = torch.full((n,), float("nan"), dtype=BF, device=DEV)
    ks.launch("kern_gemv_norm_silu_m1_u5", grid=(n // 8,), args=[x, nw, wgu, act, n, k, EPS, 1])
    acc0 = (torch.zeros(k, dtype=torch.int64, device=DEV) if start == "zero"
            else (torch.randn(k, device=DEV) * 3 * 2**32).to(torch.int64))
    acc = acc0.clone()
    _, entry, per_k = BUILDS[build]
    mlp[build](entry, n // 8, per_k * k, [x, nw, wgu, wd, acc, n, k, EPS])
    torch.cuda.synchronize()
    y = wd.double() @ act.double()
    err = (_acc_value(acc - acc0) - y).abs().max().item()
    assert err <= 1e-6 * y.abs().max().item() + 1e-7, (err, y.abs().max().item())
    y_ref = _reference(x, nw, wgu, wd, n)
    assert ((_acc_value(acc - acc0) - y_ref).norm() / y_ref.norm()).item() < 1e-2


@pytest.mark.parametrize("n,k", SHAPES)
def test_mlp_against_gemv_pair(ks, mlp, n, k):
    x, nw, wgu, wd = _mlp_inputs(n, k)
    act = torch.full((n,), float("nan"), dtype=BF, device=DEV)
    ks.launch("kern_gemv_norm_silu_m1_u5", grid=(n // 8,), args=[x, nw, wgu, act, n, k, EPS, 1])
    res = torch.zeros(k, dtype=BF, device=DEV)
    ks.launch("kern_gemv_residual_m1", grid=((k + 15) // 16,), args=[act, wd, res, k, n, 1])
    acc = torch.zeros(k, dtype=torch.int64, device=DEV)
    mlp["default"]("kern_mlp_m1", n // 8, 2 * k, [x, nw, wgu, wd, acc, n, k, EPS])
    torch.cuda.synchronize()
    mine = _acc_value(acc).float().to(BF).float()
    assert not torch.isnan(res).any()
    differ = mine != res.float()
    rel = ((mine - res.float()).abs() / res.float().abs().clamp_min(1e-30)).max().item()
    # the two sum the same products in different orders: a few outputs round to the neighbouring bf16, no more
    assert differ.sum().item() <= max(1, k // 100) and rel <= 2**-7, (differ.sum().item(), rel)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("u5", [False, True])
def test_norm_acc_is_norm_on_the_added_residual(ks, mlp, n, k, u5):
    nq = 6144 if k == 2560 else 4096
    x = (torch.randn(k, device=DEV) * 2).to(BF)
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    acc = (torch.randn(k, device=DEV) * 2**32).to(torch.int64)
    xp = (x.float() + _acc_value(acc).float().to(BF).float()).to(BF)
    w = (0.02 * torch.randn(nq, k, device=DEV)).to(BF)
    ya = torch.full((nq,), float("nan"), dtype=BF, device=DEV)
    yb = torch.full((nq,), float("nan"), dtype=BF, device=DEV)
    sfx = "_u5" if u5 else ""
    mlp["default"](f"kern_gemv_norm_acc_m1{sfx}", nq // 16, 2 * k, [x, acc, nw, w, ya, nq, k, EPS, 1])
    ks.launch(f"kern_gemv_norm_m1{sfx}", grid=(nq // 16,), args=[xp, nw, w, yb, nq, k, EPS, 1])
    torch.cuda.synchronize()
    assert not torch.isnan(ya).any() and torch.equal(ya, yb)


@pytest.mark.parametrize("k,kk", [(2560, 4096), (1024, 2048)])
@pytest.mark.parametrize("ksplit", [1, 2])
def test_residual_acc_adds_both_and_clears(ks, mlp, k, kk, ksplit):
    x = torch.randn(kk, device=DEV).to(BF)
    w = (0.02 * torch.randn(k, kk, device=DEV)).to(BF)
    res0 = torch.randn(k, device=DEV).to(BF)
    acc = (torch.randn(k, device=DEV) * 2**32).to(torch.int64)
    rb = (res0.float() + _acc_value(acc).float().to(BF).float()).to(BF)
    ra = res0.clone()
    rows = 16 // ksplit
    mlp["default"]("kern_gemv_residual_acc_m1", (k + rows - 1) // rows, 0, [x, w, ra, acc, k, kk, ksplit])
    ks.launch("kern_gemv_residual_m1", grid=((k + rows - 1) // rows,), args=[x, w, rb, k, kk, ksplit])
    torch.cuda.synchronize()
    assert torch.equal(ra, rb) and int(acc.abs().max()) == 0


@pytest.mark.parametrize("k", [2560, 1024])
def test_embedding_acc(mlp, k):
    vocab = 1000
    table = torch.randn(vocab, k, device=DEV).to(BF)
    ids = torch.tensor([417], dtype=torch.int64, device=DEV)
    out = torch.full((k,), float("nan"), dtype=BF, device=DEV)
    acc = (torch.randn(k, device=DEV) * 2**32).to(torch.int64)
    mlp["default"]("kern_embedding_acc", 1, 0, [ids, table, out, acc, k, vocab])
    torch.cuda.synchronize()
    assert torch.equal(out, table[417]) and int(acc.abs().max()) == 0
