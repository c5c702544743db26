"""Static cubin checks (`kernels_dir`): sha256, entries, parameter layouts, blocks —
against real nvcc and Triton cubins."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from verify_helpers import check, found

TRITON_PARAMS = ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "f32", "in ptr", "in ptr"]
MIX_PARAMS = ["i32", "i64", "f32", "in buffer<f32>", "u8", "out buffer<f32>"]


@pytest.fixture
def kdir(tmp_path, nvcc_cubin, triton_cubin):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "sample.cubin").write_bytes(nvcc_cubin)
    (tmp_path / "add.cubin").write_bytes(triton_cubin)
    return tmp_path


def manifest(nvcc_cubin: bytes, triton_cubin: bytes) -> dict:
    """Two ops: `add` (the Triton kernel, with its two hidden params) and `mix` (nvcc k_mix)."""
    return {
        "schema_version": 4,
        "model": "cubin-checks",
        "vars": {"n": {"max": 4096}},
        "states": {},
        "buffers": {
            "x": {"dtype": "bf16", "shape": ["n"], "class": "input"},
            "y": {"dtype": "bf16", "shape": ["n"], "class": "input"},
            "z": {"dtype": "bf16", "shape": ["n"], "class": "output"},
            "p": {"dtype": "f32", "shape": [4], "class": "input"},
            "o": {"dtype": "f32", "shape": [64], "class": "output"},
        },
        "modules": {
            "sample": {"source": "cuda/sample.cubin", "sha256": hashlib.sha256(nvcc_cubin).hexdigest()},
            "triton_add": {"source": "add.cubin", "sha256": hashlib.sha256(triton_cubin).hexdigest()},
        },
        "ops": {
            "add": {
                "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                "impl": {"launches": [{
                    "module": "triton_add", "entry": "add_kernel", "params": list(TRITON_PARAMS),
                    "block": [128, 1, 1], "grid": [{"ceil_div": ["n", 1024]}, 1, 1],
                    "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"f32": 0.5},
                             {"i64": 0}, {"i64": 0}],
                }]},
            },
            "mix": {
                "params": ["in buffer<f32>", "out buffer<f32>"],
                "impl": {"launches": [{
                    "module": "sample", "entry": "k_mix", "params": list(MIX_PARAMS),
                    "block": [64, 1, 1], "grid": [1, 1, 1],
                    "args": [{"i32": 1}, {"i64": 2}, {"f32": 3.0}, {"param": 0}, {"u8": 4}, {"param": 1}],
                }]},
            },
        },
        "programs": {"run": {"calls": [
            {"label": "add", "op": "add", "args": [{"buf": "x"}, {"buf": "y"}, {"buf": "z"}, {"var": "n"}]},
            {"label": "mix", "op": "mix", "args": [{"buf": "p"}, {"buf": "o"}]},
        ]}},
    }


@pytest.fixture
def doc(nvcc_cubin, triton_cubin):
    return manifest(nvcc_cubin, triton_cubin)


def mix_launch(d):
    return d["ops"]["mix"]["impl"]["launches"][0]


def add_launch(d):
    return d["ops"]["add"]["impl"]["launches"][0]


def test_clean(doc, kdir):
    assert check(doc, kernels_dir=kdir) == []


def test_clean_without_kernels_dir(doc):
    assert check(doc) == []


def test_sha256_mismatch(doc, kdir):
    doc["modules"]["sample"]["sha256"] = "0" * 64
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0081", "modules.sample.sha256")
    assert hashlib.sha256((kdir / "cuda" / "sample.cubin").read_bytes()).hexdigest() in d.message


def test_missing_file(doc, kdir):
    (kdir / "add.cubin").unlink()
    assert found(check(doc, kernels_dir=kdir)) == [("E0080", "modules.triton_add.source")]


def test_not_a_cubin(doc, kdir):
    data = b"// PTX\n.version 8.0\n"
    (kdir / "add.cubin").write_bytes(data)
    doc["modules"]["triton_add"]["sha256"] = hashlib.sha256(data).hexdigest()
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0082", "modules.triton_add.source")
    assert "not an ELF file" in d.message


def test_entry_missing(doc, kdir):
    mix_launch(doc)["entry"] = "k_mixx"
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0083", "ops.mix.impl.launches[0].entry")
    assert "k_mix" in d.hint


def test_entry_in_another_module(doc, kdir):
    add_launch(doc)["module"] = "sample"  # add_kernel lives in triton_add
    diags = check(doc, kernels_dir=kdir)
    assert found(diags) == [("E0073", "modules.triton_add"), ("E0083", "ops.add.impl.launches[0].entry")]
    (d,) = [x for x in diags if x.code == "E0083"]
    assert "`triton_add`" in d.hint


def test_declared_i32_where_kernel_has_8_bytes(doc, kdir):
    mix_launch(doc)["params"][1] = "i32"
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0084", "ops.mix.impl.launches[0].params[1]")
    assert "op `mix` launch 0 (`k_mix`)" in d.message and "param 1" in d.message and "8 bytes" in d.message


def test_a_dropped_param_is_one_diagnostic_naming_where_the_lists_part(doc, kdir):
    """k_mix's first param (i32) left out: the count differs and every later slot shifts; one E0084."""
    launch = mix_launch(doc)
    del launch["params"][0]
    del launch["args"][0]
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0084", "ops.mix.impl.launches[0].params")
    assert "declares 5 params, the kernel has 6; they first differ at param 0 (`i64`): declared 8 bytes" in d.message


def test_triton_hidden_params_forgotten(doc, kdir):
    launch = add_launch(doc)
    launch["params"] = launch["params"][:5]
    launch["args"] = launch["args"][:5]
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0084", "ops.add.impl.launches[0].params")
    assert "declares 5 params, the kernel has 7" in d.message and "hidden" in d.message


def test_block_differs_from_reqntid(doc, kdir):
    add_launch(doc)["block"] = [256, 1, 1]
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0085", "ops.add.impl.launches[0].block")
    assert "[128, 1, 1]" in d.hint


def test_block_outside_cuda_limits_is_one_error_not_also_a_kernel_mismatch(doc, kdir):
    add_launch(doc)["block"] = [2048, 1, 1]
    assert found(check(doc, kernels_dir=kdir)) == [("E0032", "ops.add.impl.launches[0].block[0]")]


def test_block_over_launch_bounds(tmp_path, nvcc_cubin, doc):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "sample.cubin").write_bytes(nvcc_cubin)
    launch = mix_launch(doc)
    launch.update(entry="k_struct", params=["in buffer<bf16>"], block=[512, 1, 1])
    doc["ops"]["add"]["impl"]["launches"][0]["module"] = "sample"
    doc["ops"]["add"]["impl"]["launches"][0]["entry"] = "k_mix"
    diags = [d for d in check(doc, kernels_dir=tmp_path) if d.code == "E0085"]
    assert [(d.code, d.location) for d in diags] == [("E0085", "ops.mix.impl.launches[0].block")]
    assert "256" in diags[0].message


def test_hf_module_not_present_warns(doc, kdir):
    doc["modules"]["triton_add"]["source"] = "hf:org/kernels/triton/add.cubin"
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.severity, d.location) == ("E0086", "warning", "modules.triton_add.source")


def test_hf_module_present_is_checked(doc, kdir, triton_cubin):
    doc["modules"]["triton_add"]["source"] = "hf:org/kernels/add.cubin"
    assert check(doc, kernels_dir=kdir) == []


def test_pdl_kernel_without_wait_warns(doc, kdir):
    mix_launch(doc)["pdl"] = True  # k_mix has no griddepcontrol.wait
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.severity, d.location) == ("E0088", "warning", "ops.mix.impl.launches[0].pdl")
    assert "griddepcontrol.wait" in d.message


def test_pdl_kernel_with_wait_is_clean(doc, kdir):
    mix_launch(doc).update(pdl=True, entry="k_mix_pdl")
    assert check(doc, kernels_dir=kdir) == []
    mix_launch(doc)["pdl"] = False  # the wait is a no-op without the attribute: fine too
    assert check(doc, kernels_dir=kdir) == []


def test_cubin_for_another_arch_warns(doc, kdir, tmp_path):
    import subprocess

    # this package's conftest by path: under --import-mode=importlib, `import conftest` may
    # resolve to another package's conftest.py in a whole-repo run
    spec = importlib.util.spec_from_file_location("kern_verify_tests_conftest", Path(__file__).with_name("conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    KERNELS, _nvcc = conftest.KERNELS, conftest._nvcc

    out = tmp_path / "sm80.cubin"
    subprocess.run([_nvcc(), "-cubin", "-arch=sm_80", "-o", str(out), str(KERNELS / "sample.cu")], check=True)
    (kdir / "cuda" / "sample.cubin").write_bytes(out.read_bytes())
    doc["modules"]["sample"]["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    diags = check(doc, kernels_dir=kdir)
    assert found(diags) == [("E0087", "modules.sample.source")]
    assert "sm_80" in diags[0].message and diags[0].severity == "warning"


def test_grid_must_be_a_multiple_of_the_kernels_cluster(doc, kdir):
    """E0089: a grid axis without vars (literal or constant expression) that the kernel's compiled cluster does not
    divide, on the axis it concerns; an axis computed from vars is left to the runtime; a grid below 1 is E0033's."""
    mix_launch(doc).update(entry="k_mix_cluster2", grid=[3, 1, 1])  # __cluster_dims__(2, 1, 1)
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.severity, d.location) == ("E0089", "error", "ops.mix.impl.launches[0].grid[0]")
    assert "grid x = 3 is not a multiple of the kernel's cluster [2, 1, 1]" in d.message
    assert d.hint == "make grid x a multiple of 2, e.g. 4"
    mix_launch(doc)["grid"] = [4, 1, 1]
    assert check(doc, kernels_dir=kdir) == []
    mix_launch(doc)["grid"] = [{"mul": [3, 1]}, 1, 1]  # no var: checked here
    (d,) = check(doc, kernels_dir=kdir)
    assert d.code == "E0089" and "grid x = 3 (mul(3, 1))" in d.message
    mix_launch(doc)["grid"] = [-1, 1, 1]
    assert "E0089" not in {d.code for d in check(doc, kernels_dir=kdir)}
    mix_launch(doc).update(entry="k_mix_cluster_y2", grid=[5, 3, 1])  # __cluster_dims__(1, 2, 1)
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.location) == ("E0089", "ops.mix.impl.launches[0].grid[1]")
    assert "grid y = 3" in d.message and d.hint.endswith("e.g. 4")
    mix_launch(doc)["grid"] = [5, 2, 1]
    assert check(doc, kernels_dir=kdir) == []


def test_grid_from_vars_is_left_to_the_runtime(doc, kdir):
    add = add_launch(doc)
    mix_launch(doc).update(entry="k_mix_cluster2", grid=[{"ceil_div": [64, 2]}, 1, 1])
    assert check(doc, kernels_dir=kdir) == []
    assert add["grid"][0] == {"ceil_div": ["n", 1024]}  # the Triton launch's var grid: no cluster, nothing to check


def test_a_cluster_of_more_than_8_ctas_warns(doc, kdir):
    mix_launch(doc).update(entry="k_mix_cluster16", grid=[16, 1, 1])
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.severity, d.location) == ("E0092", "warning", "ops.mix.impl.launches[0].entry")
    assert "[16, 1, 1] = 16 CTAs" in d.message
    mix_launch(doc)["grid"] = [8, 1, 1]
    assert found(check(doc, kernels_dir=kdir)) == [("E0089", "ops.mix.impl.launches[0].grid[0]"),
                                                   ("E0092", "ops.mix.impl.launches[0].entry")]


def test_a_cluster_of_more_than_16_ctas_is_refused(doc, kdir):
    """nvcc compiles __cluster_dims__(32, 1, 1); sm_90 never runs it (E0093, an error, not E0092's warning)."""
    mix_launch(doc).update(entry="k_mix_cluster32", grid=[32, 1, 1])
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.severity, d.location) == ("E0093", "error", "ops.mix.impl.launches[0].entry")
    assert "32 CTAs; sm_90 runs at most 16" in d.message


def test_static_plus_dynamic_shared_memory_over_the_maximum_is_refused(doc, kdir):
    """k_mix_smem8k declares 8 KB of __shared__ arrays: a launch may add at most 232448 - 8192 bytes of dynamic shared
    memory (E0094 names both parts); E0034 alone would pass 229376."""
    mix_launch(doc).update(entry="k_mix_smem8k", shared_mem=232448 - 8192)
    assert check(doc, kernels_dir=kdir) == []
    mix_launch(doc)["shared_mem"] = 229376
    (d,) = check(doc, kernels_dir=kdir)
    assert (d.code, d.severity, d.location) == ("E0094", "error", "ops.mix.impl.launches[0].shared_mem")
    assert "shared_mem 229376 bytes plus the kernel's 8192 bytes of static shared memory" in d.message
    assert "at most 224256 bytes" in d.hint
    mix_launch(doc).update(entry="k_mix", shared_mem=232448)  # no static shared memory: the whole maximum
    assert check(doc, kernels_dir=kdir) == []


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_refused_module_path_is_never_opened(tmp_path, where):
    """A source refused by E0017 (absolute, `..`) is not read from disk: one diagnostic, and no file outside the
    kernels directory is hashed or parsed."""
    from verify_helpers import fixture

    kernels = tmp_path / "k"
    kernels.mkdir()
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"not a cubin")
    d = fixture("launch")
    src = str(outside) if where == "absolute" else "../secret.bin"
    d["modules"]["vllm_layernorm"]["source"] = src
    assert found(check(d, kernels_dir=kernels)) == [("E0017", "modules.vllm_layernorm.source")]
