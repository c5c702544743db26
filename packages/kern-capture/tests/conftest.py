import os
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def toolchain():
    from kern_capture.build import BuildError, find_toolchain

    try:
        return find_toolchain()
    except BuildError as exc:
        pytest.skip(f"CUPTI/CUDA headers or a C compiler are not installed here: {exc}")


@pytest.fixture(scope="session")
def built_library(toolchain, tmp_path_factory) -> Path:
    """The injection library, built from source into a fresh cache."""
    from kern_capture.build import build_library

    return build_library(cache_dir=tmp_path_factory.mktemp("kc-cache"))


@pytest.fixture(scope="session")
def selftest_library(toolchain, tmp_path_factory) -> Path:
    """The library built with -DKERN_CAPTURE_SELFTEST (scripted CUPTI events, stub driver)."""
    from kern_capture.build import _command, source_path

    out = tmp_path_factory.mktemp("kc-selftest") / "libkern_capture_selftest.so"
    cmd = _command(toolchain, source_path(), out)
    cmd.insert(1, "-DKERN_CAPTURE_SELFTEST")
    cmd.insert(1, "-Werror")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out
