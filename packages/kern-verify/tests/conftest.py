"""Shared fixtures: real sm_90 cubins built once per session (nvcc 13, Triton 3.6)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # for `verify_helpers` (pytest runs with --import-mode=importlib)
KERNELS = HERE / "kernels"


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc") if os.path.exists(p)), None
    )


@pytest.fixture(scope="session")
def nvcc_cubin(tmp_path_factory) -> bytes:
    """`tests/kernels/sample.cu` built with `nvcc -cubin -arch=sm_90`."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/bin, /usr/local/cuda/bin): cannot build a test cubin")
    out = tmp_path_factory.mktemp("nvcc") / "sample.cubin"
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", str(out), str(KERNELS / "sample.cu")], check=True)
    return out.read_bytes()


@pytest.fixture(scope="session")
def triton_cubin(tmp_path_factory) -> bytes:
    """`tests/kernels/triton_add.py::add_kernel` compiled ahead of time for sm_90 by Triton."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: cannot build a Triton test cubin")
    os.environ.setdefault("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
    import triton
    from triton.backends.compiler import GPUTarget

    sys.path.insert(0, str(KERNELS))
    try:
        from triton_add import add_kernel
    finally:
        sys.path.remove(str(KERNELS))
    src = triton.compiler.ASTSource(
        fn=add_kernel,
        signature={"x_ptr": "*bf16", "y_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "scale": "fp32"},
        constexprs={"BLOCK": 1024},
    )
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    return k.asm["cubin"]
