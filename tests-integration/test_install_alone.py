"""kern-schema, kern-verify and kern-mine install alone, with pip, into an empty venv.

DESIGN §1: each package installs alone, and `pip install kern-verify` must not pull
cuda-bindings (nor numpy): a CI machine or an editor plugin that only checks manifests
needs no GPU stack. kern-mine (with its workspace dependencies kern-schema and
kern-capture, as its README's Install section says) must bring everything it imports
(numpy, msgspec) and nothing of the GPU stack beyond numpy: every module imports, and
its command line mines the committed fixture. Needs PyPI (for hatchling, msgspec and
numpy); pip's cache is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_STACK = {"cuda-bindings", "cuda-python", "cuda-core", "numpy", "nvmath-python", "safetensors", "torch"}


MINE_FIXTURE = ROOT / "packages/kern-mine/tests/fixtures/qwen3-0.6b-compile"


def _venv(tmp_path: Path) -> tuple[Path, Path, tuple]:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    bindir = env / ("Scripts" if sys.platform == "win32" else "bin")
    py = bindir / "python"
    return bindir, py, (py, "-m", "pip", "--disable-pip-version-check")


def _run(*cmd: str | Path, cwd: Path = ROOT) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.slow
def test_schema_then_verify_install_alone(tmp_path):
    bindir, py, pip = _venv(tmp_path)

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


@pytest.mark.slow
def test_mine_installs_alone_and_mines_the_fixture(tmp_path):
    bindir, py, pip = _venv(tmp_path)
    _run(*pip, "install", "-q", "packages/kern-schema", "packages/kern-capture", "packages/kern-mine")
    installed = {p["name"].lower() for p in json.loads(_run(*pip, "list", "--format=json"))}
    assert {"kern-schema", "kern-capture", "kern-mine", "msgspec", "numpy"} <= installed
    assert not installed & (GPU_STACK - {"numpy"}), f"kern-mine pulled {sorted(installed & GPU_STACK)}"

    # every module imports from the venv (run outside the checkout: nothing from the source tree)
    src = ROOT / "packages/kern-mine/src/kern_mine"
    modules = sorted(f"kern_mine.{p.stem}" for p in src.glob("*.py") if p.stem != "__init__")
    assert len(modules) >= 10
    out = _run(py, "-c", "import importlib, sys\n"
                         "for m in sys.argv[1:]: print(importlib.import_module(m).__file__)", *modules, cwd=tmp_path)
    assert all(str(tmp_path / "venv") in line for line in out.splitlines()), out
    assert len(out.splitlines()) == len(modules)

    mine = bindir / "kern-mine"
    assert "usage: kern-mine" in _run(mine, "--help", cwd=tmp_path)
    version = tomllib.loads((ROOT / "packages/kern-mine/pyproject.toml").read_text())["project"]["version"]
    assert _run(mine, "--version", cwd=tmp_path).strip() == f"kern-mine {version}"
    if not any(MINE_FIXTURE.glob("launches.jsonl*")):
        pytest.skip("kern-mine fixture missing (packages/kern-mine/tests/fixtures/qwen3-0.6b-compile/README.md)")
    doc = json.loads(_run(mine, MINE_FIXTURE, "--json", cwd=tmp_path))
    assert doc["format"] == "kern-mine/2"
    assert doc["summary"]["requests"] == 4 and doc["summary"]["flat_sites_request_shapes_grid_fitted"] == 688
