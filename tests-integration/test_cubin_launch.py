"""tools/kernels-src/cubin_launch.py's launch config for programmatic dependent launch (no GPU: the struct only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

cu = pytest.importorskip("cuda.bindings.driver")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "kernels-src"))
from cubin_launch import pdl_config  # noqa: E402


def test_pdl_config_carries_the_geometry_and_the_one_attribute():
    cfg = pdl_config((8, 8, 1), (128, 1, 1), 139776, cu.CUstream(0))
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (8, 8, 1)
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (128, 1, 1)
    assert cfg.sharedMemBytes == 139776 and cfg.numAttrs == 1
    attr = cfg.attrs[0]
    assert attr.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1
