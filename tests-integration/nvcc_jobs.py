"""nvcc runs of tools/kernels-src sources started together, for the CPU tests of experiment builds (imported by
test_gemv_flag_build.py, test_gemv_mlp_build.py, test_gemv_tma_build.py, test_gemv_passes_build.py and
test_da_experiments_build.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "kernels-src"
sys.path.insert(0, str(ROOT / "tools"))
import build_kernels as bk  # noqa: E402


def nvcc_builds(tmp: Path, jobs: dict[str, tuple[str, tuple[str, ...], str]]) -> dict[str, Path]:
    """Each job `key: (source, defines, file)` compiled from SRC/source with -D of each define into tmp/file, a PTX
    file when `file` ends in `.ptx`, else a cubin (tools/build_kernels.py's NVCC_FLAGS); every nvcc run is started
    before the first is waited for. Returns {key: tmp/file}. Skips the test when nvcc is missing; a failed run fails
    it with the job's key and nvcc's output."""
    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    ptx_flags = [f for f in bk.NVCC_FLAGS if f != "-cubin"] + ["-ptx"]
    procs = {}
    for key, (source, defines, file) in jobs.items():
        flags = ptx_flags if file.endswith(".ptx") else bk.NVCC_FLAGS
        cmd = [nvcc, *flags, *(f"-D{d}" for d in defines), "-o", str(tmp / file), source]
        procs[key] = subprocess.Popen(cmd, cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for key, proc in procs.items():
        log = proc.communicate()[0].decode()
        assert proc.returncode == 0, f"{key}: {log[-2000:]}"
    return {key: tmp / file for key, (_, _, file) in jobs.items()}
