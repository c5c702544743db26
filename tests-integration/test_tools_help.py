"""Every command-line script of tools/ answers `--help` on a machine without a GPU or torch (tools/README.md
and the READMEs quote their options; bench_gemv.py and bench_pdl.py imported torch first and died on
ModuleNotFoundError), so do tools/gpu's but the four listed in GPU_TORCH_FIRST, and the two GPU benches refuse to
run there with one argparse error line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "tools").glob("*.py") if "argparse" in p.read_text())
#: tools/gpu's scripts that import torch before parsing their arguments, so `--help` needs torch (known, left as is)
GPU_TORCH_FIRST = {"boundary_probe.py", "da_timeline.py", "gemv_timeline.py", "gemvp_timeline.py"}
GPU_SCRIPTS = sorted(p.name for p in (ROOT / "tools" / "gpu").glob("*.py")
                     if "argparse" in p.read_text() and p.name not in GPU_TORCH_FIRST)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / script), "--help"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: "), r.stdout[:200]


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_gpu_script_help(script: str) -> None:
    """tools/gpu's scripts answer `--help` here too (their docstrings give the GPU machine's commands)."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / script), "--help"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: "), r.stdout[:200]


@pytest.mark.parametrize("script", ["bench_gemv.py", "bench_pdl.py"])
def test_gpu_bench_without_torch(script: str) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed: the bench would start")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / script)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"{script}: error: needs torch (and an NVIDIA GPU): run it on the GPU machine"
