"""tools/kernels-src/cubin_launch.py without a GPU: the launch config for programmatic dependent launch (the struct
only), the dynamic shared memory of a launch (index entries with `shared_mem_per`) and an index entry's carveout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

cu = pytest.importorskip("cuda.bindings.driver")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "kernels-src"))
from cubin_launch import index_carveout, pdl_config, shared_mem_of  # noqa: E402


def test_pdl_config_carries_the_geometry_and_the_one_attribute():
    cfg = pdl_config((8, 8, 1), (128, 1, 1), 139776, cu.CUstream(0))
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (8, 8, 1)
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (128, 1, 1)
    assert cfg.sharedMemBytes == 139776 and cfg.numAttrs == 1
    attr = cfg.attrs[0]
    assert attr.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1


GEMV_ENTRY = {"entry": "kern_gemv_norm_m1", "param_names": ["x", "norm_w", "w", "y", "n", "k", "eps", "ksplit"],
              "shared_mem": 0, "shared_mem_per": {"k": 2}}


def test_shared_mem_of_adds_the_per_param_bytes():
    # gemv.cu keeps x in shared memory: 2 bytes per element of k (the 4B qkv GEMV: k = 2560 -> 5120 bytes, as the
    # example manifest's launch says)
    assert shared_mem_of(GEMV_ENTRY, [0, 0, 0, 0, 6144, 2560, 1e-6, 1]) == 5120
    assert shared_mem_of({"entry": "e", "param_names": ["a"], "shared_mem": 139776}, [0]) == 139776


def test_shared_mem_of_takes_numpy_ints():
    np = pytest.importorskip("numpy")
    assert shared_mem_of(GEMV_ENTRY, [0, 0, 0, 0, 6144, np.int64(2560), 1e-6, 1]) == 5120


@pytest.mark.parametrize("k", [2560.0, None, True])
def test_shared_mem_of_wants_an_int_for_a_sizing_param(k):
    with pytest.raises(ValueError, match="param `k` sizes the dynamic shared memory"):
        shared_mem_of(GEMV_ENTRY, [0, 0, 0, 0, 6144, k, 1e-6, 1])


def test_index_carveout():
    assert index_carveout({"entry": "e"}, "k") is None  # none: the driver's choice, no attribute set
    assert index_carveout({"carveout": 0}, "k") == 0 and index_carveout({"carveout": 100}, "k") == 100
    for bad in (101, -1, 50.0, "0", True):
        with pytest.raises(ValueError) as e:
            index_carveout({"carveout": bad}, "build/kernels/index.json: kernel `x`")
        assert str(e.value) == (f"build/kernels/index.json: kernel `x`: carveout {bad!r} is not an int percent 0..100 "
                                "(the preferred shared-memory carveout; absent: the driver's choice); rebuild the "
                                "kernels dir with tools/build_kernels.py")
