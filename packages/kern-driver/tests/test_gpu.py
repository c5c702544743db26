"""GPU tests (`-m gpu`): skip cleanly without an NVIDIA GPU or nvcc."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kern_driver import KernDriverError, Runtime
from kern_driver.testing import (CLUSTER16_CU, SMEM_CU, PDL_CU, RESIDENT_CU, pdl_manifest, VADD_CU, build_cubin, find_nvcc, from_bf16,
                                 gemm_manifest, peak_residency, resident_manifest, sha256, to_bf16, vadd_manifest,
                                 write_safetensors)

pytestmark = pytest.mark.gpu


def _gpu() -> bool:
    try:
        from cuda.bindings import driver as drv

        return drv.cuInit(0)[0] == drv.CUresult.CUDA_SUCCESS and drv.cuDeviceGetCount()[1] > 0
    except Exception:
        return False


if not _gpu():
    pytest.skip("no NVIDIA GPU / driver", allow_module_level=True)

N_MAX = 4096


@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    return build_cubin(VADD_CU, tmp_path_factory.mktemp("k") / "vadd.cubin")


@pytest.fixture
def vdir(tmp_path, cubin):
    (tmp_path / "vadd.cubin").write_bytes(cubin)
    (tmp_path / "vadd.json").write_text(json.dumps(vadd_manifest(sha256(cubin), n_max=N_MAX)))
    w = np.random.default_rng(0).standard_normal(N_MAX).astype(np.float32)
    write_safetensors(tmp_path / "w.safetensors", {"w": ("f32", w)})
    return tmp_path, w


def load_vadd(vdir, **kw):
    d, _ = vdir
    return Runtime.load(d / "vadd.json", d, d / "w.safetensors", **kw)


@pytest.mark.parametrize("mode", ["packed", "params"])
def test_vadd_matches_numpy(vdir, mode):
    _, w = vdir
    with load_vadd(vdir, launch_mode=mode) as rt:
        for n in (1, 255, 1000, N_MAX):
            x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
            rt.write_input("x", x, prefix=True)
            rt.run("main", n=n)
            out = rt.read_output("out")
            assert out.shape == (n,)
            np.testing.assert_array_equal(out, x + np.float32(2.0) * w[:n])
        text = rt.describe()
        assert "vadd in module `vec`" in text and "program main: 1 calls" in text and "weights: 1 tensors bound" in text


def test_graph_replay_equals_eager_bit_for_bit_and_inputs_stay_outside(vdir):
    with load_vadd(vdir) as rt:
        x = np.random.default_rng(1).standard_normal(777).astype(np.float32)
        rt.write_input("x", x, prefix=True)
        rt.run("main", n=777)
        eager = rt.read_output("out")
        g = rt.capture("main", n=777)
        g.replay()
        assert rt.read_output("out").tobytes() == eager.tobytes()
        # a new input is seen by the next replay: staging copies are not in the graph
        rt.write_input("x", -x, prefix=True)
        rt.run("main", graph=True, n=777)
        out2 = rt.read_output("out")
        rt.run("main", n=777)
        assert out2.tobytes() == rt.read_output("out").tobytes()
        assert len(rt.graphs) == 1  # run(graph=True) reused the captured graph
        with pytest.raises(KernDriverError, match="replay with n=5 is refused"):
            g.replay(n=5)
        with pytest.raises(KernDriverError, match="has no var `m`"):
            g.replay(m=5)
        assert "graph: main {'n': 777}" in rt.describe()


def test_var_out_of_bounds(vdir):
    with load_vadd(vdir) as rt:
        with pytest.raises(KernDriverError) as e:
            rt.run("main", n=N_MAX + 1)
        assert f"var `n` = {N_MAX + 1} is outside its bounds [1, {N_MAX}]" in str(e.value)
        with pytest.raises(KernDriverError, match="missing var"):
            rt.run("main")
        with pytest.raises(KernDriverError, match="array dtype float64"):
            rt.write_input("x", np.zeros(3), prefix=True)
        with pytest.raises(KernDriverError, match="pass prefix=True"):
            rt.write_input("x", np.zeros(3, np.float32))
        with pytest.raises(KernDriverError, match="is a `weight` buffer"):
            rt.write_input("w", np.zeros(3, np.float32), prefix=True)


def test_tampered_cubin(vdir):
    d, _ = vdir
    data = bytearray((d / "vadd.cubin").read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / "vadd.cubin").write_bytes(bytes(data))
    with pytest.raises(KernDriverError) as e:
        load_vadd(vdir)
    assert "modules.vec: sha256 mismatch" in str(e.value)


def test_declared_param_of_wrong_size(vdir, cubin):
    d, _ = vdir
    (d / "bad.json").write_text(json.dumps(vadd_manifest(sha256(cubin), n_max=N_MAX, n_type="i64")))
    with pytest.raises(KernDriverError) as e:
        Runtime.load(d / "bad.json", d, d / "w.safetensors")
    msg = str(e.value)
    assert "ops.add.impl.launches[0] (entry `vadd`)" in msg
    assert "param 3: declared 8 bytes, the kernel's is 4 bytes" in msg


def test_missing_weight(vdir):
    d, _ = vdir
    write_safetensors(d / "none.safetensors", {"v": ("f32", np.zeros(4, np.float32))})
    with pytest.raises(KernDriverError) as e:
        Runtime.load(d / "vadd.json", d, d / "none.safetensors")
    assert "missing: weight buffer `w`" in str(e.value) and "extra: tensor `v`" in str(e.value)


@pytest.mark.parametrize("graph", [False, True])
def test_async_reads_and_device_fed_inputs_pipeline_runs(vdir, graph):
    """A run's output fed back as the next run's input on the device, each output collected later: the same
    values as the synchronous loop; more pending reads than slots; close() resolves what is left."""
    _, w = vdir
    n = 1000
    x = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    rt = load_vadd(vdir)
    try:
        rt.write_input("x", x, prefix=True)
        pending = []
        for _ in range(7):  # out_i = x + 2(i+1) w; 7 > reads.SLOTS reads in flight
            rt.run("main", graph=graph, n=n)
            pending.append(rt.read_output_async("out"))
            rt.write_input_from("x", "out")
        expect, acc = [], x.copy()
        for _ in range(7):
            acc = acc + np.float32(2.0) * w[:n]
            expect.append(acc.copy())
        for i, (p, e) in enumerate(zip(pending, expect)):
            got = p.result()
            assert got.shape == (n,) and p.done()
            np.testing.assert_array_equal(got, e, err_msg=f"read {i}")
            assert p.result() is got  # resolved once
        rt.run("main", graph=graph, n=n)
        last = rt.read_output_async("out")
    finally:
        rt.close()
    np.testing.assert_array_equal(last.result(), expect[-1] + np.float32(2.0) * w[:n])  # resolved by close()


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("n", [1000, 999, 1])  # 8-byte copies; a size that is not a multiple of 8: bytewise
def test_stage_feeds_reads_and_writes_in_one_launch(vdir, graph, n):
    """Runtime.stage between runs: the read-back of the last output (stored by the staging kernel into mapped
    pinned memory), that output fed back as the next input, and a prefix write, all in one launch: the same values
    as write_input / write_input_from / read_output_async give, more reads in flight than slots, the read taken
    before the feed of the same launch lands."""
    _, w = vdir
    rng = np.random.default_rng(n)
    x0 = rng.standard_normal(n).astype(np.float32)
    head = rng.standard_normal(min(n, 3)).astype(np.float32)  # written over the fed value's first elements
    rt = load_vadd(vdir)
    try:
        rt.write_input("x", x0, prefix=True)
        rt.run("main", graph=graph, n=n)
        reads = []
        for i in range(7):
            writes = {"x": head} if i == 3 else None
            feeds = None if i == 3 else {"x": "out"}
            got = rt.stage(writes=writes, feeds=feeds, reads=["out"])
            assert list(got) == ["out"]
            reads.append(got["out"])
            rt.run("main", graph=graph, n=n)
        reads.append(rt.stage(reads=["out"])["out"])
        x = x0.copy()
        out = x + np.float32(2.0) * w[:n]
        expect = [out]
        for i in range(7):
            if i == 3:  # x keeps the value fed at step 2; only its head is rewritten
                x[: head.size] = head
            else:
                x = out.copy()
            out = x + np.float32(2.0) * w[:n]
            expect.append(out)
        for i, (p, e) in enumerate(zip(reads, expect)):
            np.testing.assert_array_equal(p.result(), e, err_msg=f"read {i}")
            assert p.result().shape == (n,) and p.done()
    finally:
        rt.close()


def test_stage_errors_name_the_buffer(vdir):
    with load_vadd(vdir) as rt:
        with pytest.raises(KernDriverError, match=r"stage\(reads=\.\.\.\): output `out` has not been written"):
            rt.stage(reads=["out"])
        with pytest.raises(KernDriverError, match=r"stage\(writes=\.\.\.\)\(`x`\): array dtype float64"):
            rt.stage(writes={"x": np.zeros(2)})
        with pytest.raises(KernDriverError, match=r"at most 16 per launch"):
            rt.stage(writes={"x": np.zeros(40, np.float32)})
        rt.write_input("x", np.ones(4, np.float32), prefix=True)  # nothing launched by the refusals above
        rt.run("main", n=4)
        np.testing.assert_array_equal(rt.stage(reads=["out"])["out"].result(),
                                      np.float32(1.0) + np.float32(2.0) * vdir[1][:4])


def test_async_read_and_feed_errors_name_the_buffer(vdir):
    with load_vadd(vdir) as rt:
        with pytest.raises(KernDriverError, match="buffer `x` is an `input` buffer, not an output"):
            rt.read_output_async("x")
        with pytest.raises(KernDriverError, match="unknown buffer `nope`"):
            rt.read_output_async("nope")
        with pytest.raises(KernDriverError, match=r"`w` is a `weight` buffer; only `input` buffers are written"):
            rt.write_input_from("w", "out")
        with pytest.raises(KernDriverError, match=r"`w` is a `weight` buffer; the source must be an `output`"):
            rt.write_input_from("x", "w")
        with pytest.raises(KernDriverError, match="unknown buffer `nope`"):
            rt.write_input_from("x", "nope")


def test_debug_mode_and_close(vdir):
    rt = load_vadd(vdir, debug=True)
    rt.write_input("x", np.ones(10, np.float32), prefix=True)
    rt.run("main", n=10)
    rt.close()
    rt.close()
    with pytest.raises(KernDriverError, match="closed"):
        rt.run("main", n=10)


# ---------------------------------------------------------------- cuBLASLt


def gemm_rt(tmp_path, n, k, m_max=64, seed=0):
    rng = np.random.default_rng(seed)
    w1 = to_bf16(rng.uniform(-1, 1, (n, k)))
    w2 = to_bf16(rng.uniform(-1, 1, (n, k)))
    (tmp_path / "g.json").write_text(json.dumps(gemm_manifest(n, k, m_max=m_max)))
    write_safetensors(tmp_path / "g.safetensors", {"w1": ("bf16", w1), "w2": ("bf16", w2)})
    rt = Runtime.load(tmp_path / "g.json", tmp_path, tmp_path / "g.safetensors")
    return rt, w1, w2


def close_to(c_bits, ref):
    c = from_bf16(c_bits).astype(np.float64)
    tol = 2.0**-7 * np.abs(ref) + 1e-3 * max(np.abs(ref).max(), 1e-30)
    bad = np.abs(c - ref) > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} elements off; worst {np.abs(c - ref).max()} (max |ref| {np.abs(ref).max()})"


@pytest.mark.parametrize("n,k,ms", [(8, 16, (1, 2)), (13, 64, (1, 7, 64)), (1000, 384, (1, 17)), (2048, 1024, (1, 64))])
def test_gemm_matches_float64_reference(tmp_path, n, k, ms):
    rt, w1, w2 = gemm_rt(tmp_path, n, k)
    with rt:
        assert "cublaslt.gemm_bf16_tn: cuBLASLt built-in" in rt.describe()
        for m in ms:
            a = to_bf16(np.random.default_rng(m).uniform(-1, 1, (m, k)))
            rt.write_input("a", a, prefix=True)
            rt.run("mm", m=m)
            c = rt.read_output("c")
            assert c.shape == (m, n) and c.dtype == np.uint16
            ref = from_bf16(a).astype(np.float64) @ from_bf16(w1).astype(np.float64).T
            close_to(c, ref)


def test_gemm_acc_accumulates_and_graph_is_bitwise_equal(tmp_path):
    n, k, m = 300, 256, 5
    rt, w1, w2 = gemm_rt(tmp_path, n, k)
    with rt:
        a = to_bf16(np.random.default_rng(3).uniform(-1, 1, (m, k)))
        rt.write_input("a", a, prefix=True)
        rt.run("mm_acc", m=m)
        c = rt.read_output("c")
        A = from_bf16(a).astype(np.float64)
        first = from_bf16(to_bf16(A @ from_bf16(w1).astype(np.float64).T)).astype(np.float64)
        close_to(c, first + A @ from_bf16(w2).astype(np.float64).T)
        rt.run("mm_acc", m=m, graph=True)
        assert rt.read_output("c").tobytes() == c.tobytes()
        rt.run("mm", m=m)
        plain = rt.read_output("c")
        assert plain.tobytes() != c.tobytes()


def test_gemm_bounds_are_checked(tmp_path):
    d = gemm_manifest(16, 32)
    d["programs"]["mm"]["calls"][0]["args"][5] = {"i32": 64}  # k larger than the buffers
    (tmp_path / "g.json").write_text(json.dumps(d))
    rng = np.random.default_rng(0)
    write_safetensors(tmp_path / "g.safetensors", {"w1": ("bf16", to_bf16(rng.uniform(-1, 1, (16, 32)))),
                                                    "w2": ("bf16", to_bf16(rng.uniform(-1, 1, (16, 32))))})
    with Runtime.load(tmp_path / "g.json", tmp_path, tmp_path / "g.safetensors", verify=False) as rt:
        with pytest.raises(KernDriverError) as e:
            rt.run("mm", m=1)
        assert "past its end" in str(e.value) and "call `proj`" in str(e.value)


# ---------------------------------------------------------------- programmatic dependent launch

#: clock cycles the producer spins before writing (~0.25 ms at the H200's ~1.98 GHz): long
#: enough that a consumer which did not wait would certainly read before the write.
SPIN = 500_000


@pytest.fixture(scope="module")
def pdl_cubin(tmp_path_factory):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    return build_cubin(PDL_CU, tmp_path_factory.mktemp("k") / "pdl.cubin")


def load_pdl(tmp_path, cubin, **kw):
    (tmp_path / "pdl.cubin").write_bytes(cubin)
    mode = kw.pop("launch_mode", "packed")
    prime = kw.pop("prime_graphs", False)
    (tmp_path / "pdl.json").write_text(json.dumps(pdl_manifest(sha256(cubin), n_max=N_MAX, **kw)))
    w = np.random.default_rng(7).standard_normal(N_MAX).astype(np.float32)
    write_safetensors(tmp_path / "w.safetensors", {"w": ("f32", w)})
    return Runtime.load(tmp_path / "pdl.json", tmp_path, tmp_path / "w.safetensors", launch_mode=mode,
                        prime_graphs=prime), w


def expected(x, w):
    return (np.float32(2.0) * x + np.float32(1.0)) + w[: x.shape[0]]


def check_eagerly_and_in_a_graph(rt, w, edges: int) -> None:
    """The pair's z equals `expected` after eager runs at n = 1, 1000, N_MAX, and after replays, on fresh x, of a
    graph captured at n = 3000 with `edges` programmatic edges."""
    for n in (1, 1000, N_MAX):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        rt.write_input("x", x, prefix=True)
        rt.run("main", n=n)
        np.testing.assert_array_equal(rt.read_output("z"), expected(x, w))
    n = 3000
    g = rt.capture("main", n=n)
    assert g.programmatic_edges == edges, f"stream capture of the pair gave {g!r}"
    for seed in (1, 2, 3):
        x = np.random.default_rng(100 + seed).standard_normal(n).astype(np.float32)
        rt.write_input("x", x, prefix=True)
        g.replay()
        np.testing.assert_array_equal(rt.read_output("z"), expected(x, w))


@pytest.mark.parametrize("mode", ["packed", "params"])
def test_pdl_consumer_sees_the_producers_output_eagerly_and_in_a_graph(tmp_path, pdl_cubin, mode):
    rt, w = load_pdl(tmp_path, pdl_cubin, spin=SPIN, trigger_early=True, wait=True, launch_mode=mode)
    with rt:
        text = rt.describe()
        assert "PDL (programmatic dependent launch)" in text and "1 of them with PDL" in text
        check_eagerly_and_in_a_graph(rt, w, edges=1)
        assert "1 programmatic edges" in rt.describe()


def test_prime_graphs_keeps_one_graph_that_computes_the_same(tmp_path, pdl_cubin):
    """prime_graphs: the first capture of a program with pdl launches makes a throwaway graph first (destroyed,
    never launched); what is cached and replayed computes what eager launches do."""
    rt, w = load_pdl(tmp_path, pdl_cubin, spin=SPIN, trigger_early=True, wait=True, prime_graphs=True)
    made = []
    real = rt._instantiate

    def spy(prog, env):
        made.append(real(prog, env))
        return made[-1]

    rt._instantiate = spy
    with rt:
        assert "prime_graphs: no program with pdl launches captured yet" in rt.describe()
        n = 2000
        for seed in (1, 2):
            x = np.random.default_rng(200 + seed).standard_normal(n).astype(np.float32)
            rt.write_input("x", x, prefix=True)
            rt.run("main", graph=True, n=n)
            np.testing.assert_array_equal(rt.read_output("z"), expected(x, w))
        assert len(made) == 2 and made[0]._exec is None and made[1] is rt.graphs[0]  # throwaway destroyed, kept
        assert rt.graphs[0].programmatic_edges == 1 and rt.primed == "main"
        assert "prime_graphs: a throwaway of `main` was captured and destroyed first" in rt.describe()
        rt.run("main", graph=True, n=7)  # a second capture: no second throwaway
        assert len(made) == 3 and len(rt.graphs) == 2


def test_pdl_takes_effect(tmp_path, pdl_cubin):
    """The control experiment: a consumer that breaks its promise (no wait) reads the
    producer's output before it is written — only possible if the launch really overlapped.
    The same kernels without `pdl` are serialized and correct."""
    n = N_MAX
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rt, w = load_pdl(tmp_path / "a", pdl_cubin, spin=SPIN, trigger_early=True, wait=False)
    with rt:
        rt.write_input("x", x)
        rt.run("main", n=n)
        z = rt.read_output("z")
    assert not np.array_equal(z, expected(x, w)), "the pdl consumer did not overlap its producer"
    rt, w = load_pdl(tmp_path / "b", pdl_cubin, spin=SPIN, trigger_early=True, wait=False, pdl=False)
    with rt:
        rt.write_input("x", x)
        rt.run("main", n=n)
        np.testing.assert_array_equal(rt.read_output("z"), expected(x, w))
        g = rt.capture("main", n=n)
        assert g.programmatic_edges == 0


# ---------------------------------------------------------------- shared-memory carveout


@pytest.mark.parametrize("pdl", [False, True], ids=["carveout", "pdl+carveout"])
def test_carveout_consumer_computes_the_same_eagerly_and_in_a_graph(tmp_path, pdl_cubin, pdl):
    """The pdl pair with `"carveout": 0` on the consumer (through cuLaunchKernelEx, alone or beside the pdl
    attribute): the results are those of the plain launch, eagerly and in a graph."""
    rt, w = load_pdl(tmp_path, pdl_cubin, spin=SPIN, trigger_early=True, wait=True, pdl=pdl, carveout=0)
    with rt:
        text = rt.describe()
        assert "carveout 0%" in text and "1 with a carveout" in text
        assert ("PDL (programmatic dependent launch)" in text) is pdl
        check_eagerly_and_in_a_graph(rt, w, edges=1 if pdl else 0)


@pytest.fixture(scope="module")
def resident_cubin(tmp_path_factory):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    return build_cubin(RESIDENT_CU, tmp_path_factory.mktemp("k") / "resident.cubin")


def test_carveout_takes_effect_eagerly_and_in_a_graph(tmp_path, resident_cubin):
    """The control experiment: blocks with 40 KB of dynamic shared memory (41 KB with sm_90's reserved 1 KB) fit
    five to an SM in the 228 KB configuration the driver picks by default and with carveout 100, but one at a time
    with carveout 0 (the smallest configuration that fits a block: 64 KB). Each launch's blocks record when they
    ran on which SM; the peak per SM shows the configuration, so this fails if the attribute is dropped, eagerly
    or by stream capture."""
    peaks = {}
    for carveout in (None, 0, 100):
        d = tmp_path / f"c{carveout}"
        d.mkdir()
        (d / "resident.cubin").write_bytes(resident_cubin)
        (d / "m.json").write_text(json.dumps(resident_manifest(sha256(resident_cubin), carveout=carveout)))
        with Runtime.load(d / "m.json", d, None) as rt:
            blocks = 2048  # ≥ 5 per SM on any H100/H200: every SM fills up
            rt.run("main", blocks=blocks)
            eager = peak_residency(rt.read_output("out"))
            rt.run("main", graph=True, blocks=blocks)
            graph = peak_residency(rt.read_output("out"))
        peaks[carveout] = (eager, graph)
    assert peaks[0] == (1, 1), peaks
    assert min(peaks[None]) >= 2 and min(peaks[100]) >= 2, peaks


# ---------------------------------------------------------------- static + dynamic shared memory over 48 KB


def test_static_plus_dynamic_shared_memory_over_48kb_launches(tmp_path):
    """8 KB of static shared memory and 46,080 bytes of dynamic: each below 48 KB, together above it. Runtime.load
    raises the function's MAX_DYNAMIC_SHARED_SIZE_BYTES (without it the launch fails with CUDA_ERROR_INVALID_VALUE,
    seen on the H200 with gemv_mlp.cu's MLP_DOWN_PREWAIT build in session 14)."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cubin = build_cubin(SMEM_CU, tmp_path / "vadd_smem.cubin")
    m = vadd_manifest(sha256(cubin), n_max=N_MAX, source="vadd_smem.cubin")
    la = m["ops"]["add"]["impl"]["launches"][0]
    la["entry"], la["shared_mem"] = "vadd_smem", 46080
    (tmp_path / "m.json").write_text(json.dumps(m))
    w = np.random.default_rng(5).standard_normal(N_MAX).astype(np.float32)
    write_safetensors(tmp_path / "w.safetensors", {"w": ("f32", w)})
    with Runtime.load(tmp_path / "m.json", tmp_path, tmp_path / "w.safetensors") as rt:
        x = np.random.default_rng(6).standard_normal(3000).astype(np.float32)
        rt.write_input("x", x, prefix=True)
        rt.run("main", n=3000)
        np.testing.assert_array_equal(rt.read_output("out"), x + np.float32(2.0) * w[:3000])


# ---------------------------------------------------------------- clusters of more than 8 CTAs



@pytest.mark.parametrize("mode", ["packed", "params"])
def test_a_16_cta_cluster_kernel_runs(tmp_path, mode):
    """A cubin whose entry is compiled for a 16-CTA cluster launches: Runtime.load opts the function in to
    non-portable cluster sizes (without it cuLaunchKernel fails), eagerly and in a graph."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cubin = build_cubin(CLUSTER16_CU, tmp_path / "vadd16.cubin")
    m = vadd_manifest(sha256(cubin), n_max=N_MAX, source="vadd16.cubin")
    la = m["ops"]["add"]["impl"]["launches"][0]
    la["entry"], la["grid"] = "vadd16", [32, 1, 1]
    (tmp_path / "m.json").write_text(json.dumps(m))
    w = np.random.default_rng(3).standard_normal(N_MAX).astype(np.float32)
    write_safetensors(tmp_path / "w.safetensors", {"w": ("f32", w)})
    with Runtime.load(tmp_path / "m.json", tmp_path, tmp_path / "w.safetensors", launch_mode=mode) as rt:
        assert rt.entries[("add", 0)].cluster == (16, 1, 1)  # from cuFuncGetAttribute(REQUIRED_CLUSTER_*)
        for n in (1, 3000, N_MAX):
            x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
            rt.write_input("x", x, prefix=True)
            rt.run("main", n=n)
            np.testing.assert_array_equal(rt.read_output("out"), x + np.float32(2.0) * w[:n])
        g = rt.capture("main", n=N_MAX)
        g.replay()
        np.testing.assert_array_equal(rt.read_output("out"), x + np.float32(2.0) * w[:N_MAX])
