"""nvcc runs of tools/kernels-src sources started together, for the CPU tests of experiment builds (imported by
test_gemv_flag_build.py, test_gemv_mlp_build.py, test_gemv_tma_build.py, test_gemv_passes_build.py,
test_da_experiments_build.py, test_qkv_attention_variant.py and test_build_cache.py), through the session's compile
cache when there is one."""

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
    it with the job's key and nvcc's output.

    With build_kernels' compile cache (KERN_BUILD_CACHE, which conftest.py sets for the session), a job on a file of
    SRC is looked up under `bk.nvcc_key` of its command line (that of build_kernels' own module for the same source
    and defines): a hit writes the stored bytes, those of the compile, and runs no nvcc; a compile is stored. A
    source elsewhere (a test's own file, which the key does not cover) always compiles, as every job does without
    the cache."""
    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    cache = bk.cache_dir()
    ptx_flags = [f for f in bk.NVCC_FLAGS if f != "-cubin"] + ["-ptx"]
    procs, store = {}, {}  # store: job -> the cache key its compile is stored under
    for key, (source, defines, file) in jobs.items():
        args = [*(ptx_flags if file.endswith(".ptx") else bk.NVCC_FLAGS), *(f"-D{d}" for d in defines), source]
        if cache is not None and (SRC / source).parent == SRC:
            if hit := bk.cache_get(cache, cache_key := bk.nvcc_key(args)):
                (tmp / file).write_bytes(hit[0])
                continue
            store[key] = cache_key
        cmd = [nvcc, *args[:-1], "-o", str(tmp / file), source]
        procs[key] = subprocess.Popen(cmd, cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for key, proc in procs.items():
        log = proc.communicate()[0].decode()
        assert proc.returncode == 0, f"{key}: {log[-2000:]}"
        if key in store:
            bk.cache_put(cache, store[key], (tmp / jobs[key][2]).read_bytes())
    return {key: tmp / file for key, (_, _, file) in jobs.items()}
