"""kern-schema and kern-verify install alone, with pip, into an empty venv.

DESIGN §1: each package installs alone, and `pip install kern-verify` must not pull
cuda-bindings (nor numpy): a CI machine or an editor plugin that only checks manifests
needs no GPU stack. Needs PyPI (for hatchling and msgspec); pip's cache is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_STACK = {"cuda-bindings", "cuda-python", "cuda-core", "numpy", "nvmath-python", "safetensors", "torch"}


def _run(*cmd: str | Path, cwd: Path = ROOT) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.slow
def test_schema_then_verify_install_alone(tmp_path):
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    bindir = env / ("Scripts" if sys.platform == "win32" else "bin")
    py = bindir / "python"
    pip = (py, "-m", "pip", "--disable-pip-version-check")

    _run(*pip, "install", "-q", "packages/kern-schema")
    installed = {p["name"].lower() for p in json.loads(_run(*pip, "list", "--format=json"))}
    assert {"kern-schema", "msgspec"} <= installed
    assert not installed & GPU_STACK
    _run(py, "-c", "import kern_schema as k; assert k.load('packages/kern-schema/tests/fixtures/article.json')")
    schema = _run(bindir / "kern-schema", "json-schema")
    assert schema.encode() == (ROOT / "packages/kern-schema/manifest.schema.json").read_bytes()

    _run(*pip, "install", "-q", "packages/kern-schema", "packages/kern-verify")
    installed = {p["name"].lower() for p in json.loads(_run(*pip, "list", "--format=json"))}
    assert {"kern-schema", "kern-verify"} <= installed
    assert not installed & GPU_STACK, f"kern-verify pulled {sorted(installed & GPU_STACK)}"
    _run(py, "-c", "import kern_verify, kern_schema")
