"""CPU tests: everything of the load and launch path that needs no GPU."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kern_schema import DTYPES, SCALARS, load
from kern_verify import verify
from kern_verify.cubin import ParamSlot

from kern_driver import FakeModuleTable, KernDriverError, prepare
from kern_driver.plan import layout
from kern_driver.resolve import Dyn, Ptr, check_vars, resolve_entries, resolve_program
from kern_driver.staging import StagedProgram, pack_scalar
from kern_driver.testing import (CLUSTER16_CU, PDL_CU, RESIDENT_CU, pdl_manifest, VADD_CU, build_cubin, find_nvcc, from_bf16, gemm_manifest,
                                 peak_residency, resident_manifest, sha256, to_bf16, vadd_manifest, write_safetensors)
from kern_driver.weights import read_header

BASE = 0x7F00_0000_0000
VADD_LAYOUT = [ParamSlot(0, 0, 8), ParamSlot(1, 8, 8), ParamSlot(2, 16, 8), ParamSlot(3, 24, 4), ParamSlot(4, 28, 4)]


def manifest(d):
    return load(json.dumps(d).encode())


def vadd(**kw):
    return manifest(vadd_manifest("0" * 64, **kw))


def fake_vadd():
    return FakeModuleTable({"vec": {"vadd": VADD_LAYOUT}})


# ---------------------------------------------------------------- staging


@pytest.mark.parametrize("name,value,fmt", [
    ("i8", -128, "<b"), ("u8", 255, "<B"), ("i16", -32768, "<h"), ("u16", 65535, "<H"),
    ("i32", -(2**31), "<i"), ("u32", 2**32 - 1, "<I"), ("i64", -(2**63), "<q"), ("u64", 2**64 - 1, "<Q"),
    ("f32", 1e-6, "<f"), ("f64", 1e-300, "<d"),
])
def test_pack_scalar_width_and_encoding(name, value, fmt):
    buf = bytearray(b"\xaa" * 16)
    pack_scalar(buf, 4, SCALARS[name], value, "here")
    size = struct.calcsize(fmt)
    assert buf[4 : 4 + size] == struct.pack(fmt, value)
    assert buf[:4] == b"\xaa" * 4 and buf[4 + size :] == b"\xaa" * (12 - size)  # nothing else touched


def test_pack_f32_is_ieee_single():
    buf = bytearray(4)
    pack_scalar(buf, 0, SCALARS["f32"], 0.1, "x")
    assert buf == bytes.fromhex("cdcccc3d")  # 0x3dcccccd little-endian


@pytest.mark.parametrize("name,value,needle", [
    ("i32", 2**31, "does not fit `i32`"), ("u8", -1, "does not fit `u8`"), ("i32", 1.5, "integer `i32`"),
    ("f32", 1e39, "overflows `f32`"), ("i64", True, "integer `i64`"),
    ("f64", 10**400, "does not fit `f64`"), ("f32", "0.5", "does not fit `f32`"),  # were OverflowError / ValueError
])
def test_pack_scalar_refuses(name, value, needle):
    with pytest.raises(KernDriverError) as e:
        pack_scalar(bytearray(8), 0, SCALARS[name], value, "programs.p.calls[0]")
    assert needle in str(e.value) and "programs.p.calls[0]" in str(e.value)


def staged_vadd(**kw):
    m = vadd(**kw)
    lay = layout(m, 16)
    entries = resolve_entries(m, fake_vadd())
    return m, lay, StagedProgram(resolve_program(m, "main", lay, BASE, entries))


def test_staged_params_bytes_are_the_kernel_abi():
    m, lay, sp = staged_vadd()
    s = sp.steps[0]
    assert isinstance(s.args[3], Dyn) and s.args[3].expr == "n"
    assert sp.sizes[0] == 32  # exact: end of the last param, no tail padding
    assert sp.refresh({"n": 1000}) is True
    raw = sp.param_bytes(0)
    x, w, out, n, alpha = struct.unpack("<QQQif", raw)
    assert x == BASE + lay.buffers["x"].offset
    assert w == BASE + lay.buffers["w"].offset
    assert out == BASE + lay.buffers["out"].offset
    assert (n, alpha) == (1000, 2.0)
    assert sp.grids[0] == (4, 1, 1)  # ceil_div(1000, 256)
    # unchanged vars: no work; changed: slot and grid refreshed
    assert sp.refresh({"n": 1000}) is False
    sp.refresh({"n": 257})
    assert struct.unpack_from("<i", sp.param_bytes(0), 24)[0] == 257 and sp.grids[0] == (2, 1, 1)


def test_kernel_params_and_extra_point_into_the_packed_buffer():
    _, _, sp = staged_vadd()
    pbase = sp.params.ctypes.data + sp.offsets[0]
    kp = np.frombuffer(sp.kparams.tobytes(), dtype=np.uint64)[:5]
    assert list(kp) == [pbase + o for o in (0, 8, 16, 24, 28)]
    assert sp.kparams_addr(0) == sp.kparams.ctypes.data
    ex = sp.extra[0]
    assert list(ex) == [1, pbase, 2, sp.sizes.ctypes.data, 0]  # BUFFER_POINTER, BUFFER_SIZE, END
    assert sp.extra_addr(0) == sp.extra.ctypes.data


def test_many_calls_get_distinct_aligned_param_blocks():
    _, _, sp = staged_vadd(calls=3)
    assert sp.offsets == [0, 32, 64]
    sp.refresh({"n": 5})
    assert all(struct.unpack_from("<i", sp.param_bytes(i), 24)[0] == 5 for i in range(3))


def test_grid_out_of_range_is_refused():
    m = vadd_manifest("0" * 64)
    m["ops"]["add"]["impl"]["launches"][0]["grid"] = [{"mul": ["n", 0]}, 1, 1]
    man = manifest(m)
    sp = StagedProgram(resolve_program(man, "main", layout(man, 1), BASE, resolve_entries(man, fake_vadd())))
    with pytest.raises(KernDriverError) as e:
        sp.refresh({"n": 3})
    msg = str(e.value)
    assert "grid x = 0" in msg and "call `add0`" in msg and "launch 0" in msg


def test_grid_not_a_multiple_of_the_kernels_cluster_is_refused():
    """A var-dependent grid axis of a kernel compiled for a cluster (here 2 CTAs along x) is checked per run:
    CUDA would refuse the launch (kern-verify checks literal axes, E0089)."""
    m = vadd_manifest("0" * 64)
    m["ops"]["add"]["impl"]["launches"][0]["grid"] = [{"ceil_div": ["n", 256]}, 1, 1]
    man = manifest(m)
    table = FakeModuleTable({"vec": {"vadd": VADD_LAYOUT}}, {("vec", "vadd"): (2, 1, 1)})
    entries = resolve_entries(man, table)
    assert entries[("add", 0)].cluster == (2, 1, 1)
    sp = StagedProgram(resolve_program(man, "main", layout(man, 1024), BASE, entries))
    sp.refresh({"n": 512})
    assert sp.grids[0] == (2, 1, 1)
    with pytest.raises(KernDriverError) as e:
        sp.refresh({"n": 700})
    msg = str(e.value)
    assert "grid x = 3 (" in msg
    assert "is not a multiple of the kernel's thread-block cluster [2, 1, 1]" in msg and "call `add0`" in msg
    assert "grid x = 3 (ceil_div(n, 256) with {'n': 700})" in msg and "for every var value" in msg


def test_a_refused_refresh_does_not_leave_stale_parameters_behind():
    """A refresh that fails half-way (scalars re-packed, then a grid refused) must not let the next refresh
    with the previous values skip as "unchanged": it launched with the refused run's scalars (n = 700 here)."""
    m = vadd_manifest("0" * 64)
    m["ops"]["add"]["impl"]["launches"][0]["grid"] = [{"ceil_div": ["n", 256]}, 1, 1]
    man = manifest(m)
    table = FakeModuleTable({"vec": {"vadd": VADD_LAYOUT}}, {("vec", "vadd"): (2, 1, 1)})
    sp = StagedProgram(resolve_program(man, "main", layout(man, 1024), BASE, resolve_entries(man, table)))
    sp.refresh({"n": 512})
    with pytest.raises(KernDriverError, match="not a multiple"):
        sp.refresh({"n": 700})
    assert sp.refresh({"n": 512}) is True
    assert struct.unpack_from("<i", sp.param_bytes(0), 24)[0] == 512 and sp.grids[0] == (2, 1, 1)
    assert sp.refresh({"n": 512}) is False


def test_a_literal_grid_not_a_multiple_of_the_cluster_is_refused_at_staging():
    """A literal axis (kern-verify's E0089) fails when the program is staged, and says so without a var env."""
    m = vadd_manifest("0" * 64)
    m["ops"]["add"]["impl"]["launches"][0]["grid"] = [1, 3, 1]
    man = manifest(m)
    entries = resolve_entries(man, FakeModuleTable({"vec": {"vadd": VADD_LAYOUT}}, {("vec", "vadd"): (1, 2, 1)}))
    with pytest.raises(KernDriverError) as e:
        StagedProgram(resolve_program(man, "main", layout(man, 16), BASE, entries))
    msg = str(e.value)
    assert "grid y = 3 is not a multiple of the kernel's thread-block cluster [1, 2, 1]" in msg
    assert "with {}" not in msg and "E0089" in msg


def test_a_table_without_clusters_still_resolves():
    """`cluster` is optional in a ModuleTable: a table written before clusters resolves every entry without one."""

    class OldTable:
        def modules(self):
            return ["vec"]

        def function(self, module, entry):
            return (module, entry) if (module, entry) == ("vec", "vadd") else None

        def param_layout(self, module, entry):
            return VADD_LAYOUT

    assert resolve_entries(vadd(), OldTable())[("add", 0)].cluster is None


# ---------------------------------------------------------------- programmatic dependent launch

PRODUCE_LAYOUT = [ParamSlot(0, 0, 8), ParamSlot(1, 8, 8), ParamSlot(2, 16, 4), ParamSlot(3, 20, 4), ParamSlot(4, 24, 8)]
CONSUME_LAYOUT = [ParamSlot(0, 0, 8), ParamSlot(1, 8, 8), ParamSlot(2, 16, 8), ParamSlot(3, 24, 4), ParamSlot(4, 28, 4)]


def staged_pdl(**kw):
    m = manifest(pdl_manifest("0" * 64, **kw))
    lay = layout(m, 16)
    entries = resolve_entries(m, FakeModuleTable({"pdl": {"produce": PRODUCE_LAYOUT, "consume": CONSUME_LAYOUT}}))
    return m, lay, StagedProgram(resolve_program(m, "main", lay, BASE, entries))


def test_pdl_flag_reaches_the_steps():
    _, _, sp = staged_pdl()
    assert [s.pdl for s in sp.steps] == [False, True]
    assert sp.pdl_steps == [1]
    _, _, off = staged_pdl(pdl=False)
    assert off.pdl_steps == [] and off.make_configs(0) == {}


def test_pdl_launch_config_is_built_once_with_the_attribute():
    drv = pytest.importorskip("cuda.bindings.driver")
    _, _, sp = staged_pdl()
    stream = drv.CUstream(0x1234)
    cfgs = sp.make_configs(stream)
    assert list(cfgs) == [1]
    cfg = cfgs[1]
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (256, 1, 1)
    assert cfg.sharedMemBytes == 0 and int(cfg.hStream) == 0x1234
    assert cfg.numAttrs == 1
    (attr,) = cfg.attrs
    assert attr.id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1
    # a var-dependent grid: refresh rewrites the same config object's grid, nothing else
    assert sp.refresh({"n": 1000}) is True
    assert sp.configs[1] is cfg and (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (4, 1, 1) == sp.grids[1]
    sp.refresh({"n": 257})
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (2, 1, 1)
    assert sp.refresh({"n": 257}) is False
    # the parameters are staged exactly as for cuLaunchKernel
    w, y, z, n, wait = struct.unpack("<QQQii", sp.param_bytes(1))
    assert (n, wait) == (257, 1) and sp.sizes[1] == 32


def test_carveout_reaches_the_steps_and_makes_an_ex_step():
    _, _, sp = staged_pdl(pdl=False, carveout=0)
    assert [(s.pdl, s.carveout, s.ex) for s in sp.steps] == [(False, None, False), (False, 0, True)]
    assert sp.pdl_steps == [] and sp.ex_steps == [1]
    assert sp.steps[1].attributes_text() == "carveout 0"
    _, _, both = staged_pdl(carveout=100)
    assert both.pdl_steps == [1] and both.ex_steps == [1]
    assert both.steps[1].attributes_text() == "programmatic dependent launch, carveout 100"
    _, _, neither = staged_pdl(pdl=False)
    assert [s.ex for s in neither.steps] == [False, False] and neither.ex_steps == [] and neither.make_configs(0) == {}


def test_carveout_only_launch_config_has_exactly_the_carveout_attribute():
    drv = pytest.importorskip("cuda.bindings.driver")
    _, _, sp = staged_pdl(pdl=False, carveout=0)
    cfgs = sp.make_configs(drv.CUstream(0x1234))
    assert list(cfgs) == [1]
    cfg = cfgs[1]
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (256, 1, 1) and int(cfg.hStream) == 0x1234
    assert cfg.numAttrs == 1
    (attr,) = cfg.attrs
    assert attr.id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    assert attr.value.sharedMemCarveout == 0
    sp.refresh({"n": 1000})  # a var-dependent grid is kept current as for pdl launches
    assert sp.configs[1] is cfg and (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (4, 1, 1)


def test_pdl_and_carveout_launch_config_has_both_attributes():
    drv = pytest.importorskip("cuda.bindings.driver")
    _, _, sp = staged_pdl(carveout=37)
    cfg = sp.make_configs(drv.CUstream(0))[1]
    assert cfg.numAttrs == 2
    pdl, carve = cfg.attrs
    assert pdl.id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert pdl.value.programmaticStreamSerializationAllowed == 1
    assert carve.id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    assert carve.value.sharedMemCarveout == 37


def test_carveout_outside_0_100_is_refused_before_the_bindings():
    """kern-verify refuses it (E0095) before load; a Step built around the verifier still gets a clear error."""
    from kern_driver.staging import launch_config

    _, _, sp = staged_pdl(pdl=False, carveout=0)
    step = sp.steps[1]
    step.carveout = -1
    with pytest.raises(KernDriverError) as e:
        launch_config(step, (1, 1, 1), 0)
    assert "carveout -1 is outside 0..100" in str(e.value) and "call `consume`" in str(e.value)


def test_carveout_out_of_range_is_refused_by_prepare(tmp_path):
    d = pdl_manifest("0" * 64, carveout=101)
    (tmp_path / "m.json").write_text(json.dumps(d))
    with pytest.raises(KernDriverError) as e:
        prepare(tmp_path / "m.json", tmp_path, [])
    assert "E0095" in str(e.value)


def test_resident_test_manifest_verifies_and_matches_the_real_cubin(tmp_path):
    """The GPU test of the carveout's effect (test_gpu.py) runs this manifest: it must load as written."""
    for carveout in (None, 0, 100):
        assert [str(d) for d in verify(manifest(resident_manifest("0" * 64, carveout=carveout)))] == []
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cubin = build_cubin(RESIDENT_CU, tmp_path / "resident.cubin")
    from kern_verify import verify_text
    assert [str(d) for d in verify_text(json.dumps(resident_manifest(sha256(cubin), carveout=0)), kernels_dir=tmp_path)] == []
    entries = resolve_entries(manifest(resident_manifest(sha256(cubin))), FakeModuleTable.from_cubins({"resident": cubin}))
    assert [(s.offset, s.size) for s in entries[("resident", 0)].layout] == [(0, 8), (8, 8)]


def test_peak_residency_counts_overlapping_blocks_per_sm():
    out = np.array([[0, 0, 10], [0, 5, 15], [0, 15, 20], [1, 0, 10], [1, 0, 10], [1, 0, 10], [2, 3, 4]])
    assert peak_residency(out) == 3  # SM 1: three at once; SM 0: two (one ending as the next starts is not overlap)
    assert peak_residency(out[:3]) == 2 and peak_residency(out.ravel()[:3]) == 1


def test_pdl_test_manifest_verifies_and_matches_the_real_cubin(tmp_path):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cubin = build_cubin(PDL_CU, tmp_path / "pdl.cubin")
    man = manifest(pdl_manifest(sha256(cubin)))
    assert [str(d) for d in verify(man)] == []
    from kern_verify import verify_text
    assert [str(d) for d in verify_text(json.dumps(pdl_manifest(sha256(cubin))), kernels_dir=tmp_path)] == []
    entries = resolve_entries(man, FakeModuleTable.from_cubins({"pdl": cubin}))
    assert [(s.offset, s.size) for s in entries[("produce", 0)].layout] == [(s.offset, s.size) for s in PRODUCE_LAYOUT]
    assert [(s.offset, s.size) for s in entries[("consume", 0)].layout] == [(s.offset, s.size) for s in CONSUME_LAYOUT]


# ---------------------------------------------------------------- entry resolution


def test_declared_param_of_wrong_size_names_launch_and_param():
    man = vadd(n_type="i64")
    with pytest.raises(KernDriverError) as e:
        resolve_entries(man, fake_vadd())
    msg = str(e.value)
    assert "ops.add.impl.launches[0]" in msg and "entry `vadd`" in msg
    assert "param 3: declared 8 bytes, the kernel's is 4 bytes" in msg


def test_entry_missing_from_named_module_says_where_it_is():
    table = FakeModuleTable({"vec": {"other": VADD_LAYOUT}, "vec2": {"vadd": VADD_LAYOUT}})
    with pytest.raises(KernDriverError) as e:
        resolve_entries(vadd(), table)
    assert "entry not found in module `vec`" in str(e.value) and "exported by: vec2" in str(e.value)


def test_named_module_with_wrong_layout_points_at_matching_module():
    bad = VADD_LAYOUT[:3] + [ParamSlot(3, 24, 8), ParamSlot(4, 32, 4)]
    table = FakeModuleTable({"vec": {"vadd": bad}, "vec2": {"vadd": VADD_LAYOUT}})
    with pytest.raises(KernDriverError) as e:
        resolve_entries(vadd(), table)
    assert "is `module` wrong?" in str(e.value) and "vec2" in str(e.value)


def _moduleless(man):
    man.ops["add"].impl.launches[0].module = None
    return man


def test_moduleless_launch_picks_the_module_whose_layout_matches():
    other = [ParamSlot(0, 0, 8), ParamSlot(1, 8, 4)]
    table = FakeModuleTable({"a": {"vadd": other}, "b": {"vadd": VADD_LAYOUT}, "c": {"x": other}})
    e = resolve_entries(_moduleless(vadd()), table)[("add", 0)]
    assert e.module == "b" and e.param_bytes == 32


def test_moduleless_launch_ambiguity_and_no_match_are_errors():
    table = FakeModuleTable({"a": {"vadd": VADD_LAYOUT}, "b": {"vadd": VADD_LAYOUT}})
    with pytest.raises(KernDriverError, match="ambiguous: modules a, b"):
        resolve_entries(_moduleless(vadd()), table)
    table = FakeModuleTable({"a": {"vadd": VADD_LAYOUT[:4]}})
    with pytest.raises(KernDriverError, match="declares 5 params, the kernel has 4"):
        resolve_entries(_moduleless(vadd()), table)
    with pytest.raises(KernDriverError, match="no module exports this entry"):
        resolve_entries(_moduleless(vadd()), FakeModuleTable({"a": {}}))


@pytest.fixture(scope="session")
def vadd_cubin(tmp_path_factory):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    return build_cubin(VADD_CU, tmp_path_factory.mktemp("cubin") / "vadd.cubin")


def test_cluster_shape_from_a_real_cubin(tmp_path):
    """FakeModuleTable.from_cubins reads the compiled cluster (kern-verify's EIATTR_CTA_PER_CLUSTER), as the
    runtime's table reads CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_*: a 16-CTA entry, and None for a plain one."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    table = FakeModuleTable.from_cubins({"c": build_cubin(CLUSTER16_CU, tmp_path / "c.cubin"),
                                         "v": build_cubin(VADD_CU, tmp_path / "v.cubin")})
    assert (table.cluster("c", "vadd16"), table.cluster("v", "vadd")) == ((16, 1, 1), None)


def test_test_manifests_verify_and_match_the_real_cubin(vadd_cubin):
    man = manifest(vadd_manifest(sha256(vadd_cubin)))
    assert [str(d) for d in verify(man)] == []
    e = resolve_entries(man, FakeModuleTable.from_cubins({"vec": vadd_cubin}))[("add", 0)]
    assert [(s.offset, s.size) for s in e.layout] == [(s.offset, s.size) for s in VADD_LAYOUT]
    for n, k in ((8, 16), (13, 64), (1000, 384)):
        assert [str(d) for d in verify(manifest(gemm_manifest(n, k)))] == []


# ---------------------------------------------------------------- gemm steps


def test_gemm_steps_resolve_pointers_and_shape_exprs():
    man = manifest(gemm_manifest(13, 64))
    lay = layout(man, 1)
    steps = resolve_program(man, "mm_acc", lay, BASE, {})
    assert [s.extern for s in steps] == ["cublaslt.gemm_bf16_tn", "cublaslt.gemm_bf16_tn_acc"]
    a, w2, c = steps[1].args[:3]
    assert isinstance(a, Ptr) and a.addr == BASE + lay.buffers["a"].offset
    assert w2.addr == BASE + lay.buffers["w2"].offset and c.addr == BASE + lay.buffers["c"].offset
    assert steps[1].var_names == {"m"} and "call `proj_acc`" in steps[1].where()


def test_a_failed_gemm_planning_is_not_skipped_on_a_retry_with_the_same_values():
    """`_prepare` plans a program's GEMMs after a refresh; when planning fails for some m, a second run with
    the same m must fail again, not find the refresh "unchanged" and launch the previous m's plans."""
    from kern_driver.runtime import Runtime, _Program

    class Lt:  # cuBLASLt's planning: no algorithm for m = 3
        def plan(self, m, n, k, a, w, c, where):
            if m == 3:
                raise KernDriverError("no cuBLASLt algorithm", where=where)
            return ("plan", m, n, k)

    man = manifest(gemm_manifest(13, 64))
    lay = layout(man, 1)
    prog = _Program("mm_acc", StagedProgram(resolve_program(man, "mm_acc", lay, BASE, {})), {"m"})
    rt = Runtime.__new__(Runtime)
    rt._cublas = Lt()
    rt._regions = sorted((BASE + r.offset, BASE + r.offset + r.nbytes, r) for r in lay.regions() if r.nbytes)
    rt._region_starts = [t[0] for t in rt._regions]
    rt._prepare(prog, {"m": 2})
    assert [g[0] for g in prog.gemms.values()] == [("plan", 2, 13, 64)] * 2
    for _ in range(2):
        with pytest.raises(KernDriverError, match="no cuBLASLt algorithm"):
            rt._prepare(prog, {"m": 3})
    rt._prepare(prog, {"m": 2})
    assert [g[0] for g in prog.gemms.values()] == [("plan", 2, 13, 64)] * 2


# ---------------------------------------------------------------- layout


def test_layout_aligns_every_region_and_places_states_after_the_arena():
    d = vadd_manifest("0" * 64, n_max=1000)
    d["states"] = {"kv": {"bytes_per_token": 100, "align": 4096}, "s": {"bytes_per_token": 3}}
    d["ops"]["add"]["impl"]["scratch"] = {"tmp": {"dtype": "u8", "shape": [3]}}
    man = manifest(d)
    lay = layout(man, 10)
    regs = lay.regions()
    assert all(r.offset % 256 == 0 for r in regs)
    assert lay.states["kv"].offset % 4096 == 0 and lay.states["kv"].nbytes == 4096  # 1000 rounded up to its align
    for r1, r2 in zip(regs, regs[1:]):
        assert r1.offset + r1.nbytes <= r2.offset  # no overlap
    assert lay.buffers["x"].nbytes == 4000 and lay.buffers["x"].shape == (1000,)
    assert lay.total_bytes >= regs[-1].offset + regs[-1].nbytes and lay.total_bytes % 256 == 0
    with pytest.raises(KernDriverError, match="capacity_tokens must be a positive integer"):
        layout(man, 0)


def test_layout_capacity_accepts_numpy_ints_and_refuses_an_arena_past_int64():
    """capacity_tokens=np.int64(...) was refused as "not a positive integer" (the vars accept numpy ints);
    a capacity of 2**62 tokens planned a 10^23-byte arena without a word, left to fail inside the bindings."""
    d = vadd_manifest("0" * 64)
    d["states"] = {"kv": {"bytes_per_token": 114688}}
    man = manifest(d)
    assert layout(man, np.int64(16)).states["kv"].nbytes == 16 * 114688
    with pytest.raises(KernDriverError, match="the arena would take") as e:
        layout(man, 2**62)
    assert "`kv`" in str(e.value) and "capacity_tokens=4,611,686,018,427,387,904" in str(e.value)
    with pytest.raises(KernDriverError, match="positive integer"):
        layout(man, np.float64(16.0))


@settings(max_examples=60, deadline=None)
@given(
    bufs=st.lists(st.tuples(st.sampled_from(sorted(DTYPES)), st.lists(st.one_of(st.integers(0, 70), st.just("n")),
                                                                      max_size=3)), min_size=1, max_size=6),
    states=st.lists(st.tuples(st.integers(1, 5000), st.sampled_from([1, 2, 64, 256, 512, 4096, 65536])), max_size=3),
    n_max=st.integers(1, 3000), capacity=st.integers(1, 70),
)
def test_layout_property_regions_are_aligned_disjoint_and_sized(bufs, states, n_max, capacity):
    """Any mix of dtypes, var dims and state alignments: every region at a multiple of 256 (states: of their
    align too), its bytes = dtype size x dims at the var maxima, no two regions overlapping, all inside the arena."""
    d = vadd_manifest("0" * 64, n_max=n_max)
    for i, (dt, shape) in enumerate(bufs):
        d["buffers"][f"b{i}"] = {"dtype": dt, "shape": shape, "class": "workspace"}
    d["states"] = {f"s{i}": {"bytes_per_token": bpt, "align": al} for i, (bpt, al) in enumerate(states)}
    lay = layout(manifest(d), capacity)
    for i, (dt, shape) in enumerate(bufs):
        r = lay.buffers[f"b{i}"]
        assert r.shape == tuple(n_max if x == "n" else x for x in shape)
        assert r.nbytes == DTYPES[dt] * int(np.prod(r.shape, dtype=object))
    for i, (bpt, al) in enumerate(states):
        r = lay.states[f"s{i}"]
        assert r.offset % max(256, al) == 0 and r.nbytes >= bpt * capacity
    regs = [r for r in lay.regions() if r.nbytes]
    assert all(r.offset % 256 == 0 for r in lay.regions())
    for r1, r2 in zip(regs, regs[1:]):
        assert r1.offset + r1.nbytes <= r2.offset, (r1, r2)
    assert lay.total_bytes % 256 == 0 and all(r.offset + r.nbytes <= lay.total_bytes for r in regs)


# ---------------------------------------------------------------- vars


def test_var_checks():
    man = vadd()
    assert check_vars(man, {"n"}, {"n": np.int64(7)}, "run") == {"n": 7}
    with pytest.raises(KernDriverError) as e:
        check_vars(man, {"n"}, {"n": 4097}, "run('main')")
    assert "var `n` = 4097 is outside its bounds [1, 4096]" in str(e.value)
    with pytest.raises(KernDriverError, match="missing var"):
        check_vars(man, {"n"}, {}, "run")
    with pytest.raises(KernDriverError, match="unknown var `tokens`"):
        check_vars(man, {"n"}, {"n": 1, "tokens": 2}, "run")
    with pytest.raises(KernDriverError, match="must be an int"):
        check_vars(man, {"n"}, {"n": 2.0}, "run")


# ---------------------------------------------------------------- prepare: modules and weights


@pytest.fixture
def vadd_dir(tmp_path, vadd_cubin):
    (tmp_path / "vadd.cubin").write_bytes(vadd_cubin)
    mpath = tmp_path / "vadd.json"
    mpath.write_text(json.dumps(vadd_manifest(sha256(vadd_cubin), n_max=64)))
    write_safetensors(tmp_path / "w.safetensors", {"w": ("f32", np.arange(64, dtype=np.float32))})
    return tmp_path


def test_prepare_checks_everything_without_a_gpu(vadd_dir):
    p = prepare(vadd_dir / "vadd.json", vadd_dir, vadd_dir / "w.safetensors", capacity_tokens=8)
    assert list(p.modules) == ["vec"] and p.modules["vec"].pinned
    (b,) = p.bindings
    assert b.buffer == "w" and b.tensor.nbytes == 256 and b.region.offset == p.layout.buffers["w"].offset
    assert "weight" in p.layout.plan.render()


def test_tampered_cubin_is_refused(vadd_dir):
    data = bytearray((vadd_dir / "vadd.cubin").read_bytes())
    data[-1] ^= 0xFF
    (vadd_dir / "vadd.cubin").write_bytes(bytes(data))
    with pytest.raises(KernDriverError) as e:
        prepare(vadd_dir / "vadd.json", vadd_dir, vadd_dir / "w.safetensors")
    assert "modules.vec: sha256 mismatch" in str(e.value) and "the manifest pins" in str(e.value)


def test_missing_module_file_and_bad_paths(vadd_dir):
    d = json.loads((vadd_dir / "vadd.json").read_text())
    d["modules"]["vec"]["source"] = "../vadd.cubin"
    with pytest.raises(KernDriverError, match="without `..`"):
        prepare(json.dumps(d).encode(), vadd_dir, vadd_dir / "w.safetensors", verify=False)
    d["modules"]["vec"]["source"] = "nope.cubin"
    with pytest.raises(KernDriverError, match="cannot read .*nope.cubin"):
        prepare(json.dumps(d).encode(), vadd_dir, vadd_dir / "w.safetensors", verify=False)


@pytest.mark.parametrize("tensors,needles", [
    ({}, ["missing: weight buffer `w` (f32 [64])"]),
    ({"w": ("f32", np.zeros(64, np.float32)), "bias": ("f32", np.zeros(2, np.float32))},
     ["extra: tensor `bias`", "is not a weight buffer"]),
    ({"w": ("f16", np.zeros(64, np.float16))}, ["tensor `w`", "dtype f16, the manifest declares f32"]),
    ({"w": ("f32", np.zeros((8, 8), np.float32))}, ["tensor `w`", "shape [8, 8], the manifest declares [64]"]),
    ({"w": ("f32", np.zeros(64, np.float32)), "x": ("f32", np.zeros(64, np.float32))},
     ["extra: tensor `x`", "is an `input` buffer, not a weight"]),
])
def test_weight_binding_errors_name_the_tensor(vadd_dir, tensors, needles):
    write_safetensors(vadd_dir / "bad.safetensors", tensors)
    with pytest.raises(KernDriverError) as e:
        prepare(vadd_dir / "vadd.json", vadd_dir, vadd_dir / "bad.safetensors")
    for n in needles:
        assert n in str(e.value)


def test_weights_across_files_and_duplicates(vadd_dir):
    write_safetensors(vadd_dir / "empty.safetensors", {})
    p = prepare(vadd_dir / "vadd.json", vadd_dir, [vadd_dir / "w.safetensors", vadd_dir / "empty.safetensors"])
    assert len(p.bindings) == 1
    write_safetensors(vadd_dir / "w2.safetensors", {"w": ("f32", np.zeros(64, np.float32))})
    with pytest.raises(KernDriverError, match="tensor `w` is in two weights files"):
        prepare(vadd_dir / "vadd.json", vadd_dir, [vadd_dir / "w.safetensors", vadd_dir / "w2.safetensors"])


def test_weights_argument_forms(vadd_dir):
    """The same file twice was reported as 'tensor `w` is in two weights files: X and X'; a generator of paths
    and a non-path item raised TypeErrors from Path()/os.fspath."""
    w = vadd_dir / "w.safetensors"
    with pytest.raises(KernDriverError, match=r"weights file .*w.safetensors is listed twice \(also as"):
        prepare(vadd_dir / "vadd.json", vadd_dir, [w, f"{vadd_dir}/./w.safetensors"])
    assert len(prepare(vadd_dir / "vadd.json", vadd_dir, (p for p in [w])).bindings) == 1
    with pytest.raises(KernDriverError, match=r"weights: list item 3 \(int\) is not a path"):
        prepare(vadd_dir / "vadd.json", vadd_dir, [w, 3])
    with pytest.raises(KernDriverError, match="weights: expected a path, a list of paths or None, not int"):
        prepare(vadd_dir / "vadd.json", vadd_dir, 3)


def test_a_kernels_dir_that_is_not_a_directory_is_one_error(vadd_dir):
    """It gave one 'Not a directory' / 'No such file' line per module."""
    for bad, needle in ((vadd_dir / "w.safetensors", "is not a directory"), (vadd_dir / "nope", "does not exist")):
        with pytest.raises(KernDriverError, match=f"kernels directory .* {needle}") as e:
            prepare(vadd_dir / "vadd.json", bad, vadd_dir / "w.safetensors")
        assert "modules." not in str(e.value)


def test_malformed_safetensors(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x01\x00")
    with pytest.raises(KernDriverError, match="too short"):
        read_header(p)
    p.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(KernDriverError, match="impossible"):
        read_header(p)
    h = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    with pytest.raises(KernDriverError, match="outside the file"):
        read_header(p)
    for shape in ([2.5], ["2"], [True, 2]):  # were read as [2] and bound to a [2] weight
        h = json.dumps({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 8]}}).encode()
        p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
        with pytest.raises(KernDriverError, match="tensor `t` has a malformed header entry"):
            read_header(p)


def test_unverifiable_manifest_is_refused_with_the_diagnostics(vadd_dir):
    d = json.loads((vadd_dir / "vadd.json").read_text())
    d["programs"]["main"]["calls"][0]["args"][3] = {"i32": 5000}  # fine for the verifier? (literal fits i32)
    d["buffers"]["unused"] = {"dtype": "f32", "shape": [4], "class": "workspace"}
    with pytest.raises(KernDriverError) as e:
        prepare(json.dumps(d).encode(), vadd_dir, vadd_dir / "w.safetensors")
    msg = str(e.value)
    assert "does not verify" in msg and "unused" in msg


def test_a_manifest_as_dict_or_json_str_is_one_clear_error(vadd_dir):
    """A dict raised a TypeError from os.fspath; a JSON str was opened as a path and the whole text came back
    as the 'file name' of an OSError."""
    text = (vadd_dir / "vadd.json").read_text()
    with pytest.raises(KernDriverError, match="not dict") as e:
        prepare(json.loads(text), vadd_dir, vadd_dir / "w.safetensors")
    assert "json.dumps(d).encode()" in e.value.hint
    with pytest.raises(KernDriverError, match="a str that holds JSON text, not a path") as e:
        prepare(text, vadd_dir, vadd_dir / "w.safetensors")
    assert len(str(e.value)) < 300 and "text.encode()" in e.value.hint
    assert prepare(text.encode(), vadd_dir, vadd_dir / "w.safetensors").bindings  # as bytes it loads


def test_bf16_helpers_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38], dtype=np.float32)
    assert list(from_bf16(to_bf16(x))) == [1.0, 1.0, 1.015625, -2.5, from_bf16(to_bf16(np.float32(3.0e38)))[0]]


def test_load_without_gpu_is_one_clear_error(vadd_dir):
    from cuda.bindings import driver as drv

    try:
        ok = drv.cuInit(0)[0] == drv.CUresult.CUDA_SUCCESS and drv.cuDeviceGetCount()[1] > 0
    except Exception:
        ok = False
    if ok:
        pytest.skip("a GPU is present")
    from kern_driver import Runtime

    with pytest.raises(KernDriverError) as e:
        Runtime.load(vadd_dir / "vadd.json", vadd_dir, vadd_dir / "w.safetensors")
    assert "no NVIDIA driver" in str(e.value) or "no CUDA device" in str(e.value) or "cuInit" in str(e.value)
    assert e.value.__cause__ is None or isinstance(e.value, KernDriverError)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_load_refuses_a_graph_cache_that_holds_nothing(bad, monkeypatch):
    """max_graphs < 1 used to hand run(graph=True) a graph already evicted (destroyed) by its own capture."""
    import kern_driver.runtime as R
    from kern_driver.runtime import Runtime

    monkeypatch.setattr(R, "prepare", lambda *a, **k: pytest.fail("prepare must not run"))
    with pytest.raises(KernDriverError, match=r"max_graphs .*at least 1 graph"):
        Runtime.load("m.json", None, None, max_graphs=bad)


@pytest.mark.parametrize("kw,needle", [
    ({"device": "cuda:0"}, "device 'cuda:0': expected a CUDA device index"),
    ({"device": -1}, "device -1"), ({"device": 1.0}, "device 1.0"),
    ({"workspace_bytes": -5}, "workspace_bytes -5: expected a byte count"), ({"workspace_bytes": 2.0**25}, "workspace_bytes"),
])
def test_load_refuses_a_bad_device_or_workspace_before_reading_anything(kw, needle, monkeypatch):
    """device='cuda:0' (or a torch.device) failed inside the bindings after the whole prepare; a float
    workspace_bytes only inside cuMemAlloc, and only for manifests with a GEMM."""
    import kern_driver.runtime as R
    from kern_driver.runtime import Runtime

    monkeypatch.setattr(R, "prepare", lambda *a, **k: pytest.fail("prepare must not run"))
    with pytest.raises(KernDriverError, match=re.escape(needle)):
        Runtime.load("m.json", None, None, **kw)


# ---------------------------------------------------------------- shared-memory opt-in


def test_shared_opt_in_counts_the_static_shared_memory():
    """The 48 KB default covers static + dynamic (cuFuncSetAttribute): 8 KB static + 46,080 dynamic needs the
    opt-in although the dynamic part alone is below 48 KB; exactly 48 KB in all does not."""
    from kern_driver.runtime import shared_opt_ins

    needs = {"a": (46080, "ops.mlp.impl.launches[0] (entry `kern_mlp_m1`)"), "b": (49152, "ops.b.impl.launches[0]"),
             "c": (40960, "ops.c.impl.launches[0]"), "d": (16384, "ops.d.impl.launches[0]"),
             "e": (8193, "ops.e.impl.launches[0]"), "f": (49153, "ops.f.impl.launches[0]")}
    static = {"a": 8352, "b": 0, "c": 8192, "d": 40960, "e": 40960}  # "f": none (a kernel with no static arrays)
    got = shared_opt_ins(needs, static, 232448)
    # b and c total exactly 48 KB: no opt-in; e is one byte over; f's dynamic part alone is
    assert [(k, s) for k, s, _ in got] == [("a", 46080), ("d", 16384), ("e", 8193), ("f", 49153)]
    assert got[0][2] == needs["a"][1]


def test_shared_opt_in_refuses_what_no_setting_can_run():
    from kern_driver.runtime import shared_opt_ins

    with pytest.raises(KernDriverError) as e:
        shared_opt_ins({"a": (230000, "ops.attn.impl.launches[0] (entry `attn`)")}, {"a": 4096}, 232448)
    msg = str(e.value)
    assert "230000 bytes of dynamic" in msg and "4096 bytes of static" in msg and "232448" in msg
    assert "ops.attn.impl.launches[0] (entry `attn`)" in msg and "at most 228352 bytes" in msg and "E0094" in msg


def test_graph_replay_refuses_unknown_and_changed_vars():
    """Graph.replay with a var the graph was not captured with names it as unknown (it used to read as a value
    mismatch, `replay with foo=1 is refused`); a changed value of a var the launches use is refused as before,
    nothing reaching the driver; a var they do not use may change (it only shapes read_output), as with
    run(graph=True)."""
    from kern_driver.graphs import Graph

    from types import SimpleNamespace as NS

    replays = []
    rt = NS(_programs={"decode": NS(required={"pos"})}, _replay=lambda g, env: replays.append(env))
    g = object.__new__(Graph)  # no CUDA graph: the runtime is a stub that records the replays
    g.program, g.vars, g._exec, g._rt = "decode", {"pos": 7, "tokens": 1}, object(), rt
    with pytest.raises(KernDriverError, match=r"graph of program `decode` has no var `foo` \(it was captured with "
                                              r"\{'pos': 7, 'tokens': 1\}\)") as e:
        g.replay(foo=1)
    assert "pass only the vars the graph was captured with" in str(e.value)
    with pytest.raises(KernDriverError, match="replay with pos=8 is refused"):
        g.replay(pos=8)  # a var the launches use: frozen in the graph
    assert replays == []
    # a var the launches do not use (tokens shapes read_output): another value is recorded, as run(graph=True) does
    g.replay(tokens=3)
    g.replay()
    assert replays == [{"pos": 7, "tokens": 3}, {"pos": 7, "tokens": 1}]
