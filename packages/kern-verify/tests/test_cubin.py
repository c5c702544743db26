"""kern_verify.cubin against real cubins: the parameter table must match the C ABI."""

from __future__ import annotations

import pytest
from kern_schema import ParamTypeError

from kern_verify.cubin import CubinError, ParamSlot, compare_layout, params_from_manifest, read_cubin


def slots(*pairs: tuple[int, int]) -> list[ParamSlot]:
    return [ParamSlot(i, off, size) for i, (off, size) in enumerate(pairs)]


def test_nvcc_entries(nvcc_cubin):
    c = read_cubin(nvcc_cubin)
    assert c.arch == 90
    assert set(c.entries) == {"k_mix", "k_struct", "k_noparams", "_Z4cppkiPf", "k_mix_pdl", "k_mix_cluster2",
                              "k_mix_cluster16", "k_mix_cluster_y2", "k_mix_cluster32", "k_mix_smem8k"}
    # the section holds sm_90's 1 KB reserved for the system besides the 8 KB array (E0094 subtracts it)
    assert c.entries["k_mix_smem8k"].static_shared_bytes == 9216 and c.entries["k_mix"].static_shared_bytes == 0


def test_grid_dependency_wait_is_found_in_the_code(nvcc_cubin):
    e = read_cubin(nvcc_cubin).entries
    assert e["k_mix_pdl"].grid_dep_wait is True
    assert e["k_mix"].grid_dep_wait is False and e["k_noparams"].grid_dep_wait is False
    assert e["k_mix_pdl"].params == e["k_mix"].params


def test_grid_dependency_wait_in_a_triton_kernel(triton_cubin):
    assert read_cubin(triton_cubin).entries["add_kernel"].grid_dep_wait is False


def test_nvcc_scalar_and_pointer_params(nvcc_cubin):
    k = read_cubin(nvcc_cubin).entries["k_mix"]
    # int, long long, float, const float*, unsigned char, float*
    assert k.params == slots((0, 4), (8, 8), (16, 4), (24, 8), (32, 1), (40, 8))
    assert k.param_bytes == 48
    assert k.max_threads is None


def test_nvcc_struct_param_and_launch_bounds(nvcc_cubin):
    k = read_cubin(nvcc_cubin).entries["k_struct"]
    # struct S (24 bytes), u8, i16, double*
    assert k.params == slots((0, 24), (24, 1), (26, 2), (32, 8))
    assert k.param_bytes == 40
    assert k.max_threads == (256, 1, 1)
    assert k.static_shared_bytes >= 512  # 128 floats (+ what the toolchain reserves)


def test_nvcc_cluster_dims(nvcc_cubin):
    """`__cluster_dims__` is EIATTR_CTA_PER_CLUSTER: the cluster shape in CTAs; None without one."""
    e = read_cubin(nvcc_cubin).entries
    assert (e["k_mix_cluster2"].cluster, e["k_mix_cluster16"].cluster, e["k_mix"].cluster) == ((2, 1, 1), (16, 1, 1), None)
    assert e["k_mix_cluster_y2"].cluster == (1, 2, 1)
    assert e["k_mix_cluster2"].params == e["k_mix"].params


def test_no_params_and_mangled(nvcc_cubin):
    c = read_cubin(nvcc_cubin)
    assert c.entries["k_noparams"].params == []
    assert c.entries["k_noparams"].param_bytes == 0
    assert c.entries["_Z4cppkiPf"].params == slots((0, 4), (8, 8))


def test_declared_layout_matches_nvcc(nvcc_cubin):
    k = read_cubin(nvcc_cubin).entries["k_mix"]
    declared = params_from_manifest(["i32", "i64", "f32", "in buffer<f32>", "u8", "out buffer<f32>"])
    assert compare_layout(declared, k.params) == []


def test_triton_hidden_params(triton_cubin):
    c = read_cubin(triton_cubin)
    assert c.arch == 90
    k = c.entries["add_kernel"]
    # x, y, out pointers, n: i32, scale: f32, then global and profile scratch (8 bytes each)
    assert k.params == slots((0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 8), (40, 8))
    assert k.required_block == (128, 1, 1)  # num_warps=4
    declared = params_from_manifest(
        ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "f32", "in ptr", "in ptr"]
    )
    assert compare_layout(declared, k.params) == []


def test_compare_layout_reports_size_and_count():
    actual = slots((0, 8), (8, 4))
    declared = params_from_manifest(["i32", "i32"])
    problems = compare_layout(declared, actual)
    # param 1's offset differs only because param 0's size does: reported once
    assert problems == ["param 0: declared 4 bytes, the kernel's is 8 bytes (offset 0)"]
    assert compare_layout(params_from_manifest(["i64", "i64"]), actual) == [
        "param 1: declared 8 bytes, the kernel's is 4 bytes (offset 8)"
    ]
    assert compare_layout(slots((0, 8), (16, 4)), actual) == ["param 1: declared at offset 16, the kernel's is at offset 8"]
    problems = compare_layout(params_from_manifest(["i64"]), actual)
    assert problems == ["declares 1 params, the kernel has 2"]


def test_params_from_manifest_alignment():
    assert params_from_manifest(["u8", "i16", "u8", "i64", "f32"]) == slots((0, 1), (2, 2), (4, 1), (8, 8), (16, 4))
    with pytest.raises(ParamTypeError):
        params_from_manifest(["buffer<bf16>"])


@pytest.mark.parametrize(
    "data, why",
    [
        (b"", "not an ELF file"),
        (b"hello world", "not an ELF file"),
        (b"\x7fELF" + b"\0" * 12, "corrupt ELF"),
    ],
)
def test_garbage_raises_cubin_error(data, why):
    with pytest.raises(CubinError, match=why) as e:
        read_cubin(data, "mod.cubin")
    assert "mod.cubin" in str(e.value)


def test_truncated_cubin(nvcc_cubin):
    for n in (64, len(nvcc_cubin) // 2, len(nvcc_cubin) - 1):
        try:
            read_cubin(nvcc_cubin[:n], "cut.cubin")
        except CubinError as e:
            assert "cut.cubin" in str(e)


def test_non_cuda_elf():
    import sys

    with open(sys.executable, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        pytest.skip("the Python executable is not ELF here")
    with pytest.raises(CubinError, match="not EM_CUDA"):
        read_cubin(data, "python")
