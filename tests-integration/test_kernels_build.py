"""CPU checks of the provider kernel build (tools/build_kernels.py): no GPU needed.

- every kernel of the default geometries builds (nvcc + Triton AOT for sm_90);
- building twice (different output dirs, cwd, job count) gives byte-identical files;
- every index entry is consistent: module exists with that sha256, the entry symbol is in
  it, and `params` matches the cubin's own ELF parameter table (count, offsets, sizes),
  the block matches the kernel's launch bounds / required block.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tools" / "build_kernels.py"

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin
sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_checks import check_index_against_cubins  # noqa: E402  (this folder's helper)


def _build(out: Path, *extra: str, cwd: Path | None = None) -> dict:
    subprocess.run([sys.executable, str(BUILD), "--out", str(out), "-q", *extra], check=True, cwd=cwd)
    return json.loads((out / "index.json").read_text())


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    a = tmp_path_factory.mktemp("kernels_a")
    idx = _build(a)
    return a, idx


def test_build_reproducible(built, tmp_path_factory):
    a, _ = built
    b = tmp_path_factory.mktemp("kernels_b")
    _build(b, "-j", "1", "--no-cache", cwd=b)  # other dir, other cwd, serial compile, a real one (no compile cache)
    fa = sorted(p.name for p in a.iterdir())
    fb = sorted(p.name for p in b.iterdir())
    assert fa == fb
    for name in fa:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between two builds"


def test_no_paths_leak(built):
    a, _ = built
    for p in a.glob("*.cubin"):
        data = p.read_bytes()
        for needle in (str(ROOT).encode(), b"/tmp/", b"kernels-src"):
            assert needle not in data, f"{p.name} embeds {needle!r}"


def test_index_format(built):
    _, idx = built
    assert idx["format"] == 1 and idx["target"] == "sm_90"
    need = {"embedding", "argmax_partial", "argmax_reduce", "silu_and_mul", "qk_norm_rope_kv",
            "paged_decode_attention", "paged_decode_reduce", "paged_prefill_attention",
            "rms_norm_h1024", "rms_norm_h2560", "add_rms_norm_h1024", "add_rms_norm_h2560"}
    need |= {f"kern_gemv{v}_m{m}" for v in ("", "_norm", "_norm_silu", "_residual") for m in (1, 2, 4, 8)}
    need |= {f"kern_gemvp{v}_m1" for v in ("", "_norm", "_norm_silu", "_residual")}
    need |= {f"kern_gemvtc{v}_m1{u}" for v in ("", "_norm", "_norm_silu", "_residual") for u in ("", "_u5")}
    assert need <= set(idx["kernels"]), need - set(idx["kernels"])
    for name, k in idx["kernels"].items():
        assert set(k) - {"pdl", "carveout"} == {"module", "sha256", "entry", "params", "param_names", "aligned16",
                                                "block", "shared_mem", "shared_mem_per", "grid", "constexprs", "doc"}, name
        assert k.get("pdl", True) is True and ("pdl" in k) == name.endswith("_pdl"), name
        # the one launch with a carveout: the decode program's rope-cluster attention (catalog.DA_ROPE_CARVEOUT)
        assert ("carveout" in k) == (name == "decode_attention_rope_cluster_pdl"), name
        assert k.get("carveout", 0) == 0, name
        assert set(k["shared_mem_per"]) <= set(k["param_names"]), name
        assert all(isinstance(c, int) and c > 0 for c in k["shared_mem_per"].values()), name
        assert len(k["params"]) == len(k["param_names"]) == len(set(k["param_names"])), name
        assert set(k["aligned16"]) <= set(k["param_names"]), name
        bx, by, bz = k["block"]
        assert 32 <= bx * by * bz <= 1024 and bx % 32 == 0, name
        assert 0 <= k["shared_mem"] <= 232448, name
        assert k["doc"] and k["grid"], name
        if k["module"].removesuffix("_pdl.cubin").removesuffix(".cubin") not in (
                "embedding", "argmax", "gemv", "gemv_p2", "gemv_tc", "gemv_persist", "decode_attention",
                "lm_head_screen"):  # Triton
            assert k["params"][-2:] == ["u64", "u64"], name
            assert k["param_names"][-2:] == ["global_scratch", "profile_scratch"], name


def test_index_matches_catalog_and_sources(built):
    """param_names are the kernels' own argument names; the scratch-using kernels say so in their docs."""
    _, idx = built
    k = idx["kernels"]
    assert k["paged_decode_attention"]["param_names"][:6] == ["q", "kv", "block_table", "seq_lens", "part_acc",
                                                              "part_ml"]
    assert k["paged_decode_attention"]["params"][1] == "in ptr"
    assert k["qk_norm_rope_kv"]["params"][6] == "inout ptr"
    assert k["paged_decode_reduce"]["constexprs"]["MAX_SPLITS"] == 64
    assert k["paged_prefill_attention"]["shared_mem"] > 48 * 1024  # needs the opt-in above 48 KB
    assert k["argmax_partial"]["module"] == k["argmax_reduce"]["module"] == "argmax.cubin"


def test_gemv_entries(built):
    """The decode GEMV family: one module, the ABI of gemv.cu's header, per-call shared memory M·k·2."""
    a, idx = built
    k = idx["kernels"]
    # every kernel of the module is indexed (no entry of gemv.cu left without its ABI)
    entries = set(read_cubin((a / "gemv.cubin").read_bytes(), "gemv.cubin").entries)
    assert entries == {e["entry"] for e in k.values() if e["module"] == "gemv.cubin"}
    buf_in, buf_out, buf_inout = "in buffer<bf16>", "out buffer<bf16>", "inout buffer<bf16>"
    for m in (1, 2, 4, 8):
        plain, norm = k[f"kern_gemv_m{m}"], k[f"kern_gemv_norm_m{m}"]
        silu, res = k[f"kern_gemv_norm_silu_m{m}"], k[f"kern_gemv_residual_m{m}"]
        for name, e in ((f"kern_gemv_m{m}", plain), (f"kern_gemv_norm_m{m}", norm),
                        (f"kern_gemv_norm_silu_m{m}", silu), (f"kern_gemv_residual_m{m}", res)):
            assert e["module"] == "gemv.cubin" and e["entry"] == name and e["block"] == [256, 1, 1], name
            assert e["shared_mem"] == 0, name
            assert e["constexprs"]["M"] == m and e["constexprs"]["WARPS"] == 8, name
        assert plain["param_names"] == ["x", "w", "y", "n", "k", "ksplit"]
        assert plain["params"] == [buf_in, buf_in, buf_out, "i32", "i32", "i32"]
        assert res["param_names"] == ["x", "w", "residual", "n", "k", "ksplit"]
        assert res["params"] == [buf_in, buf_in, buf_inout, "i32", "i32", "i32"]
        for e in (norm, silu):
            assert e["param_names"] == ["x", "norm_w", "w", "y", "n", "k", "eps", "ksplit"]
            assert e["params"] == [buf_in, buf_in, buf_in, buf_out, "i32", "i32", "f32", "i32"]
            assert e["shared_mem_per"] == {"k": 2 * m}
        assert plain["shared_mem_per"] == res["shared_mem_per"] == {}
        assert plain["constexprs"]["COLS_PER_WARP"] == norm["constexprs"]["COLS_PER_WARP"] == 2
        assert res["constexprs"]["COLS_PER_WARP"] == 2 and silu["constexprs"]["COLS_PER_WARP"] == 1
        for e in (plain, norm, silu, res):
            assert set(e["aligned16"]) == {n for n, t in zip(e["param_names"], e["params"]) if "buffer" in t}


def test_index_matches_cubins(built):
    a, idx = built
    check_index_against_cubins(a, idx)


# ------------------------------------------------------------------ the CUDA C decode attention

DA = ("decode_attention_split", "decode_attention_merge", "decode_attention_cluster", "decode_attention_rope_cluster")
EIATTR_CTA_PER_CLUSTER = 0x3D  # (x, y, z) u32: the compiled cluster (__cluster_dims__), as nvcc 13.0 writes it


def _cluster_dims(data: bytes, entry: str):
    import io

    from elftools.elf.elffile import ELFFile
    from kern_verify.cubin import _records

    sec = ELFFile(io.BytesIO(data)).get_section_by_name(f".nv.info.{entry}")
    dims = [v for fmt, attr, v in _records(sec.data(), entry) if attr == EIATTR_CTA_PER_CLUSTER]
    return tuple(int.from_bytes(dims[0][i:i + 4], "little") for i in (0, 4, 8)) if dims else None


def test_decode_attention_cuda_entries(built):
    """decode_attention.cu: one module with exactly its four entries; the split kernel has the Triton stage 1's
    params (names and types, without the hidden two), the merge adds seq_lens, the cluster form has no scratch,
    the rope cluster form has qk_norm_rope_kv's params (qkv read only), the cluster's block_table, seq_lens, out
    and tail, then eps; block, dynamic shared memory (its page ring) and constexprs from the catalog; the cluster
    entries are compiled for clusters of (1, CLUSTER, 1) and the others for none; registers leave room for 3
    split CTAs per SM."""
    a, idx = built
    k = idx["kernels"]
    data = (a / "decode_attention.cubin").read_bytes()
    cub = read_cubin(data, "decode_attention.cubin")
    assert set(cub.entries) == set(DA) == {n for n, e in k.items() if e["module"] == "decode_attention.cubin"}
    split, merge, clu, rope, tri, pro = (k[n] for n in DA + ("paged_decode_attention", "qk_norm_rope_kv"))
    assert split["params"] == tri["params"][:-2] and split["param_names"] == tri["param_names"][:-2]
    assert merge["param_names"] == ["part_acc", "part_ml", "seq_lens", "out", "num_q_heads", "num_splits"]
    assert merge["params"] == ["in buffer<f32>", "in buffer<f32>", "in buffer<i32>", "out buffer<bf16>", "i32", "i32"]
    assert clu["param_names"] == split["param_names"][:4] + ["out"] + split["param_names"][6:]
    assert clu["params"] == split["params"][:4] + ["out buffer<bf16>"] + split["params"][6:]
    assert rope["param_names"] == pro["param_names"][:7] + clu["param_names"][2:] + ["eps"]
    assert rope["params"] == ["in buffer<bf16>"] + pro["params"][1:7] + clu["params"][2:] + ["f32"]
    assert rope["shared_mem"] == clu["shared_mem"] and rope["constexprs"] == clu["constexprs"]
    assert _cluster_dims(data, "decode_attention_rope_cluster") == (1, clu["constexprs"]["CLUSTER"], 1)
    for e in (split, merge, clu, rope):
        assert e["entry"] in DA and e["block"] == [128, 1, 1] and e["constexprs"]["D"] == 128
    cx = split["constexprs"]
    slot = cx["PAGE"] * 512  # one page of one kv head: 16 token rows of k|v, 512 bytes each, unpadded (one bulk copy)
    bars = cx["WARPS"] * 8 * 8  # one mbarrier per slot, up to 8 slots per warp, before the rings
    assert split["shared_mem"] == bars + cx["WARPS"] * cx["SLOTS"] * slot == 65792 and merge["shared_mem"] == 0
    recv = 8 * (2 * 8 + 8 * 128 // 8) * 4  # what the 8 CTAs of a cluster push to one: m, l of 8 heads, 128 acc
    assert clu["shared_mem"] == bars + clu["constexprs"]["WARPS"] * clu["constexprs"]["SLOTS"] * slot + recv == 135936
    assert cx["MAX_G"] == 8 and merge["constexprs"]["MAX_SPLITS"] == cx["MAX_SPLITS"] == 64
    assert _cluster_dims(data, "decode_attention_cluster") == (1, clu["constexprs"]["CLUSTER"], 1)
    assert _cluster_dims(data, "decode_attention_split") is None and _cluster_dims(data, "decode_attention_merge") is None
    regs = cub.entries["decode_attention_split"].registers
    assert regs is not None and 3 * 128 * regs <= 65536, regs  # 3 CTAs per SM (3 x 64 KB shared memory fits too)
    assert 3 * split["shared_mem"] <= 228 * 1024 - 3 * 1024


def _variant_cubin(source: str, *defines: str) -> bytes:
    """`source` built by tools/build_kernels.py's nvcc path with -D`define` for each of `defines`."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_kernels
    finally:
        sys.path.pop(0)
    with tempfile.TemporaryDirectory() as t:
        return build_kernels.finish_cuda(build_kernels.start_cuda(source, t, defines, "variant.cubin"))


def _assert_same_abi(plain, variant) -> None:
    """Two parsed cubins export the same entries with the same parameter layouts."""
    assert set(variant.entries) == set(plain.entries)
    for e in plain.entries:
        assert [(p.offset, p.size) for p in variant.entries[e].params] == [(p.offset, p.size) for p in plain.entries[e].params]


def _check_timeline_build(built, source: str, module: str, define: str, symbols: tuple[str, ...]):
    """The `define` build of `source` exports the unmangled `symbols` its tools/gpu script reads with
    cuModuleGetGlobal and keeps every entry and its params; the default `module` holds no trace of them."""
    a, _ = built
    data = (a / module).read_bytes()
    for sym in symbols:
        assert sym.encode() not in data, sym
    tl = _variant_cubin(source, define)
    for sym in symbols:
        assert sym.encode() + b"\x00" in tl, sym
    _assert_same_abi(read_cubin(data, module), read_cubin(tl, "tl.cubin"))


def test_decode_attention_timeline_build_is_separate(built):
    """-DDA_TIMELINE (tools/gpu/da_timeline.py): the `da_timeline` global, the same four entries and params."""
    _check_timeline_build(built, "decode_attention.cu", "decode_attention.cubin", "DA_TIMELINE", ("da_timeline",))
    assert set(read_cubin((built[0] / "decode_attention.cubin").read_bytes(), "decode_attention.cubin").entries) == set(DA)


def test_gemv_timeline_build_is_separate(built):
    """-DGEMV_TIMELINE (tools/gpu/gemv_timeline.py): the `gemv_tl` records and the `gemv_tl_next` ticket the script
    zeroes before each replay, the same entries and params."""
    _check_timeline_build(built, "gemv.cu", "gemv.cubin", "GEMV_TIMELINE", ("gemv_tl", "gemv_tl_next"))


def test_every_geometry_builds_the_same_shared_kernels(tmp_path):
    """The geometry-dependent set is only the norms; all presets build (norms only: fast)."""
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    try:
        from catalog import instances
        from geometries import PRESETS, load_geometry
    finally:
        sys.path.pop(0)
    names = {k.name for k in instances([load_geometry(g) for g in PRESETS])}
    for g in PRESETS.values():
        assert f"rms_norm_h{g.hidden_size}" in names and f"add_rms_norm_h{g.hidden_size}" in names
    with pytest.raises(ValueError, match="head_dim"):
        cfg = tmp_path / "config.json"
        sys.path.insert(0, str(ROOT / "tools"))
        try:
            from qwen3_config import preset_hf_config
        finally:
            sys.path.pop(0)
        cfg.write_text(json.dumps({**preset_hf_config("0.6b"), "head_dim": 64}))
        load_geometry(str(cfg))


# ------------------------------------------------------------------ the default build is pinned

def test_default_build_matches_the_examples(built, pinned_modules):
    """Every default cubin (the PDL forms included, since 2026-11-29 a default) has the sha256 the committed
    examples pin (those cubins were validated on the H200). Every default module is used by some example or
    pinned in conftest.UNUSED_BY_EXAMPLES, so this covers the whole default build."""
    a, idx = built
    pinned = pinned_modules
    for name, k in idx["kernels"].items():
        assert k["module"] in pinned, f"{name}: module {k['module']} is used by no example"
        assert k["sha256"] == pinned[k["module"]], f"{name}: {k['module']} changed vs the committed examples"
        assert hashlib.sha256((a / k["module"]).read_bytes()).hexdigest() == pinned[k["module"]], name


# ------------------------------------------------------------------ PDL instances (default; --no-pdl drops them)

PDL_BASE = ("embedding", "qk_norm_rope_kv", "paged_decode_attention", "paged_decode_reduce",
            "argmax_partial", "argmax_reduce", "decode_attention_split", "decode_attention_merge",
            "decode_attention_cluster", "decode_attention_rope_cluster")


@pytest.fixture(scope="session")
def built_pdl(built):
    """The default build has the PDL forms (`--pdl` is the default)."""
    return built


@pytest.fixture(scope="session")
def built_base(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels_base")
    return d, _build(d, "--no-pdl")


def test_pdl_build_keeps_every_base_entry(built_base, built_pdl):
    """The PDL forms only add `NAME_pdl` entries and their modules: every entry and cubin of the
    `--no-pdl` build is identical in the default build."""
    a, idx = built_base
    p, pidx = built_pdl
    assert set(pidx["kernels"]) == set(idx["kernels"]) | {n + "_pdl" for n in PDL_BASE}
    for name, k in idx["kernels"].items():
        assert pidx["kernels"][name] == k, name
        assert (p / k["module"]).read_bytes() == (a / k["module"]).read_bytes(), name
    new_modules = {pidx["kernels"][n + "_pdl"]["module"] for n in PDL_BASE}
    assert not new_modules & {k["module"] for k in idx["kernels"].values()}
    assert pidx["kernels"]["argmax_partial_pdl"]["module"] == pidx["kernels"]["argmax_reduce_pdl"]["module"] \
        == "argmax_pdl.cubin"
    assert pidx["kernels"]["embedding_pdl"]["module"] == "embedding_pdl.cubin"


def test_pdl_entries_are_twins_that_wait(built_pdl):
    """Each NAME_pdl has its twin's ABI (params, block, shared memory, grid), says `pdl: true`, and its
    entry's code contains griddepcontrol.wait (SASS ACQBULK: what kern-verify E0088 checks). The one exception to the
    shared memory: the rope-cluster attention's PDL form, whose ring is catalog.DA_ROPE_SLOTS pages per warp (its
    constexpr SLOTS) instead of DA_CLUSTER_SLOTS, launched with carveout DA_ROPE_CARVEOUT."""
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    try:
        from catalog import DA_BAR_BYTES, DA_CLUSTER_SLOTS, DA_RECV_BYTES, DA_ROPE_CARVEOUT, DA_ROPE_SLOTS, DA_SLOT_BYTES, DA_WARPS
    finally:
        del sys.path[0]
    p, pidx = built_pdl
    for base in PDL_BASE:
        k, t = pidx["kernels"][base + "_pdl"], pidx["kernels"][base]
        assert k.get("pdl") is True, base
        rope = base == "decode_attention_rope_cluster"
        for f in ("entry", "params", "param_names", "aligned16", "block", "shared_mem", "shared_mem_per", "grid"):
            if not (rope and f == "shared_mem"):
                assert k[f] == t[f], (base, f)
        cx = dict(k["constexprs"])
        if cx.pop("PDL", None) is not None:
            assert k["module"] == base + "_pdl.cubin"  # Triton: the same function with PDL = True
        if rope:
            assert (cx.pop("SLOTS"), t["constexprs"]["SLOTS"]) == (DA_ROPE_SLOTS, DA_CLUSTER_SLOTS)
            assert k["shared_mem"] == DA_BAR_BYTES + DA_WARPS * DA_ROPE_SLOTS * DA_SLOT_BYTES + DA_RECV_BYTES == 70400
            assert t["shared_mem"] == DA_BAR_BYTES + DA_WARPS * DA_CLUSTER_SLOTS * DA_SLOT_BYTES + DA_RECV_BYTES
            assert k["carveout"] == DA_ROPE_CARVEOUT and "carveout" not in t
            cx["SLOTS"] = t["constexprs"]["SLOTS"]
        assert cx == t["constexprs"], base
        cub = read_cubin((p / k["module"]).read_bytes(), k["module"])
        assert cub.entries[k["entry"]].grid_dep_wait is True, base
        twin = read_cubin((p / t["module"]).read_bytes(), t["module"])
        assert twin.entries[t["entry"]].grid_dep_wait is False, base


def _pdl_kernels():
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from catalog import PDL_EXTRA_DOC, instances
        from geometries import load_geometry
        import build_kernels
    finally:
        del sys.path[:2]
    return {k.name: k for k in instances([load_geometry("4b")], pdl=True) if k.pdl}, build_kernels, PDL_EXTRA_DOC


#: Global loads a PDL Triton kernel issues before its wait: only inputs and weights (qk_norm_rope_kv:
#: positions and the cos and sin halves of the rotary row (3 loads each in Triton's layout); the norm
#: weights and the slot come after the wait, as in the plain form (2531002); decode attention:
#: seq_lens; the reduce: none).
PDL_LOADS_BEFORE_WAIT = {"qk_norm_rope_kv_pdl": 7, "paged_decode_attention_pdl": 1, "paged_decode_reduce_pdl": 0}


def test_pdl_ptx_waits_before_any_store(tmp_path):
    """The PTX of every PDL instance: griddepcontrol.wait comes, in program text, before every global
    store, atomic and return, and before every cp.async except in the kernels whose catalog doc says what they copy
    early (catalog.PDL_EXTRA_DOC: the cluster decode attentions' first catalog.DA_PRE_PAGES K|V pages, the rope form's
    DA_ROPE_PRE_PAGES), which do copy
    exactly those; the Triton kernels (straight-line before the wait) issue exactly the expected input/weight loads
    before it and no branch."""
    import re as _re

    kernels, bk, early = _pdl_kernels()
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    try:
        from catalog import DA_PRE_PAGES, DA_ROPE_PRE_PAGES
    finally:
        del sys.path[0]
    for name, k in sorted(kernels.items()):
        if k.lang == "triton":
            ptx = bk.triton_compiled(k, str(tmp_path))
            ptx = ptx.asm["ptx"]
        else:
            ptx = bk.cuda_ptx(k)
        # the entry's body (CUDA modules hold several entries)
        body = ptx.split(f".entry {k.entry}(", 1)[1].split(".entry ", 1)[0]
        lines = [ln.strip() for ln in body.splitlines()]
        first_wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
        before = lines[:first_wait]
        assert not [ln for ln in before if _re.search(r"\bst\.global|\batom\.|\bred\.|\bret;", ln)], name
        # copies global -> shared before the wait only where the catalog documents what they read and why it is safe
        early_copies = [ln for ln in before if "cp.async" in ln]
        assert bool(early_copies) == (name.removesuffix("_pdl") in early), (name, early_copies[:2])
        if early_copies:  # the cluster forms: catalog.DA_PRE_PAGES pages (the rope form: DA_ROPE_PRE_PAGES), one bulk
            # copy of a kv head's page each (the head-major layout), and nothing else
            pre = DA_ROPE_PRE_PAGES if "rope" in name else DA_PRE_PAGES
            assert len([ln for ln in early_copies if ln.startswith("cp.async.bulk.shared")]) == pre, name
            assert len(early_copies) == pre, (name, early_copies)
        assert any(ln.startswith("griddepcontrol.launch_dependents") for ln in lines), name
        if k.lang == "triton":
            loads = [ln for ln in before if "ld.global" in ln]
            assert len(loads) == PDL_LOADS_BEFORE_WAIT[name], (name, loads)
            assert not [ln for ln in before if _re.search(r"\bbra\b", ln)], name


# ------------------------------------------------------------------ opt-in fused decode attention (--fused-attention)

FUSED = "paged_decode_attention_fused"


@pytest.fixture(scope="session")
def built_fused(tmp_path_factory):
    """`--fused-attention` (with the default --pdl): the fused kernel and its PDL form, with every PDL instance."""
    d = tmp_path_factory.mktemp("kernels_fused")
    return d, _build(d, "--fused-attention")


def test_fused_build_keeps_every_default_entry(built, built_fused):
    """`--fused-attention` only adds its entries and modules: every default entry and cubin is identical;
    alone it adds just `paged_decode_attention_fused`, with `--pdl` also its `_pdl` form."""
    a, idx = built
    f, fidx = built_fused
    assert set(fidx["kernels"]) == set(idx["kernels"]) | {FUSED, FUSED + "_pdl"}  # the default build has the _pdl forms
    for name, k in idx["kernels"].items():
        assert fidx["kernels"][name] == k, name
        assert (f / k["module"]).read_bytes() == (a / k["module"]).read_bytes(), name
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    try:
        from catalog import instances
        from geometries import load_geometry
    finally:
        sys.path.pop(0)
    g = [load_geometry("4b")]
    plain = {k.name for k in instances(g)}
    assert {k.name for k in instances(g, fused_attention=True)} == plain | {FUSED}
    assert {k.name for k in instances(g, pdl=True, fused_attention=True)} == \
        plain | {FUSED, FUSED + "_pdl"} | {n + "_pdl" for n in PDL_BASE}


def test_fused_entries_abi(built_fused):
    """The fused kernel: stage 1's params, then `counters` (inout ptr, i32) and `out`, then stage 1's scalars;
    stage 1's block, shared memory and constexprs plus the reduce's MAX_SPLITS; its `_pdl` form is a twin
    that waits (SASS ACQBULK), the plain one does not."""
    f, fidx = built_fused
    k, s1, red = fidx["kernels"][FUSED], fidx["kernels"]["paged_decode_attention"], fidx["kernels"]["paged_decode_reduce"]
    assert k["module"] == FUSED + ".cubin" and k["entry"] == FUSED
    assert k["param_names"] == s1["param_names"][:6] + ["counters", "out"] + s1["param_names"][6:]
    assert k["params"] == s1["params"][:6] + ["inout ptr", "out buffer<bf16>"] + s1["params"][6:]
    assert k["block"] == s1["block"] and k["shared_mem"] == s1["shared_mem"]
    assert k["constexprs"] == {**s1["constexprs"], "MAX_SPLITS": red["constexprs"]["MAX_SPLITS"]}
    assert "pdl" not in k
    p = fidx["kernels"][FUSED + "_pdl"]
    assert p["pdl"] is True and p["module"] == FUSED + "_pdl.cubin"
    for fld in ("entry", "params", "param_names", "aligned16", "block", "shared_mem", "shared_mem_per", "grid"):
        assert p[fld] == k[fld], fld
    assert {**p["constexprs"]} == {**k["constexprs"], "PDL": True}
    assert read_cubin((f / p["module"]).read_bytes(), p["module"]).entries[FUSED].grid_dep_wait is True
    assert read_cubin((f / k["module"]).read_bytes(), k["module"]).entries[FUSED].grid_dep_wait is False


def _fused_compiled(tmp, name):
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from catalog import instances
        from geometries import load_geometry
        import build_kernels
    finally:
        del sys.path[:2]
    ks = {k.name: k for k in instances([load_geometry("4b")], pdl=True, fused_attention=True)}
    return build_kernels.triton_compiled(ks[name], str(tmp))


def test_fused_ptx_memory_ordering(tmp_path):
    """The PTX of the fused kernel (kernels-src/attention.py docstring, "Memory ordering"): after the last
    partial store a bar.sync, then the one atom (add, acq_rel, gpu scope) on the counter, then the reset
    store; the merge (a .func of its own) reads the partials only with ld.global.cg (L2, not L1) and is
    called only after the atom. The PDL form: wait before any store or atomic, only seq_lens loaded before."""
    import re as _re

    for name in (FUSED, FUSED + "_pdl"):
        ptx = _fused_compiled(tmp_path, name).asm["ptx"]
        entry = ptx.split(f".entry {FUSED}(", 1)[1].split("\n}\n", 1)[0]
        # the merge: one non-inlined function (a declaration, then its definition with a body)
        funcs = [f.split("\n}\n", 1)[0] for f in ptx.split(".func ")[1:]
                 if "merge_splits" in f.split("(", 1)[0] and _re.search(r"^[^;{]*\{", f)]
        assert len(funcs) == 1, (name, len(funcs))
        merge = funcs[0]
        lines = [ln.strip() for ln in entry.splitlines()]
        atoms = [i for i, ln in enumerate(lines) if _re.search(r"\batom\.", ln)]
        assert len(atoms) == 1 and "atom.global.gpu.acq_rel.add" in lines[atoms[0]], (name, [lines[i] for i in atoms])
        at = atoms[0]
        stores = [i for i, ln in enumerate(lines) if _re.search(r"\bst\.global", ln)]
        before, after = [i for i in stores if i < at], [i for i in stores if i > at]
        assert before and len(after) == 1, (name, len(before), len(after))  # partials; then the counter reset
        bars = [i for i, ln in enumerate(lines) if ln.startswith("bar.sync")]
        assert any(max(before) < i < at for i in bars), f"{name}: no bar.sync between the partial stores and the atom"
        calls = [i for i, ln in enumerate(lines) if ln.startswith("call")]
        assert calls and min(calls) > at, name
        loads = [ln for ln in merge.splitlines() if "ld.global" in ln]
        assert loads and all("ld.global.cg" in ln for ln in loads), (name, loads)
        if name.endswith("_pdl"):
            first_wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
            pre = lines[:first_wait]
            assert not [ln for ln in pre if _re.search(r"\bst\.global|\batom\.|\bred\.|\bret;|\bcall", ln)], name
            assert len([ln for ln in pre if "ld.global" in ln]) == 1, name  # seq_lens
        else:
            assert not any("griddepcontrol" in ln for ln in lines), name


def _layouts(ttgir: str, func_marker: str):
    """(op, tensor types with every layout alias spelled out) of the tensor arithmetic, reduction, load and
    store ops of one function of a TTGIR module, as a multiset."""
    import re as _re
    from collections import Counter

    defs = dict(_re.findall(r"^(#\w+) = (#ttg\.\w+<.*)$", ttgir, _re.M))
    i = ttgir.index(func_marker)
    body = ttgir[ttgir.index("{\n", i): ttgir.index("\n  }", i)]
    body = _re.sub(r"loc\((?:[^()]|\([^()]*\))*\)", "", body)
    for alias in sorted(defs, key=len, reverse=True):
        body = _re.sub(_re.escape(alias) + r"\b", defs[alias], body)
    ops = ("\"tt.reduce\"", "tt.load", "tt.store", "tt.dot", "arith.addf", "arith.mulf", "arith.divf", "arith.subf",
           "math.exp2", "arith.maxnumf", "arith.maximumf", "ttg.convert_layout", "arith.select")
    out = Counter()
    for ln in body.splitlines():
        m = _re.search(r"(?:= )?(\"[\w.]+\"|[a-z_]+\.[\w.]+)", ln.strip())
        types = tuple(_re.findall(r"tensor<[^<>]*(?:<[^<>]*(?:<[^<>]*>[^<>]*)*>)?[^<>]*>", ln))
        if m and m.group(1) in ops and types:  # tensor ops only (the fused kernel adds scalar ones)
            out[(m.group(1), types)] += 1
    return out


def test_fused_is_the_two_launch_arithmetic(tmp_path):
    """Why the fused output is expected to equal the two-launch one bit for bit: its stage 1 has
    paged_decode_attention's tensor ops in the same layouts (same MMA, same reductions), and its merge
    (a non-inlined function) paged_decode_reduce's (same tiles, so the splits are summed in the same
    order). Inlined, the merge's [64, 128] tile took stage 1's layout and summed in another order."""
    fused = _fused_compiled(tmp_path, FUSED).asm["ttgir"]
    s1 = _fused_compiled(tmp_path, "paged_decode_attention").asm["ttgir"]
    red = _fused_compiled(tmp_path, "paged_decode_reduce").asm["ttgir"]
    assert _layouts(fused, f"tt.func public @{FUSED}") == _layouts(s1, "tt.func public @paged_decode_attention")
    merge = _layouts(fused, "tt.func private @")
    assert merge and merge == _layouts(red, "tt.func public @paged_decode_reduce")


def test_decode_attention_no_wait_build_drops_the_wait(built):
    """-DDA_NO_WAIT (NOTES.md 61, a timing what-if) on the PDL module: every entry, with the same params, and none of
    them waits for its predecessor (no griddepcontrol.wait in its code), where every default PDL entry does."""
    pdl = read_cubin((built[0] / "decode_attention_pdl.cubin").read_bytes(), "decode_attention_pdl.cubin")
    nowait = read_cubin(_variant_cubin("decode_attention.cu", "KERN_PDL", "DA_NO_WAIT"), "da_nw.cubin")
    _assert_same_abi(pdl, nowait)
    for e, k in pdl.entries.items():
        assert k.grid_dep_wait is True and nowait.entries[e].grid_dep_wait is False, e


def test_decode_attention_halves_build(built):
    """-DDA_HALVES=2 (NOTES.md 63, an experiment; tools/gpu/da_halves_probe.py): the rope-cluster entry takes the
    default's params plus two pointers (the pair merge's scratch and counters), still waits for its predecessor, and
    every other entry of the PDL module keeps its ABI."""
    pdl = read_cubin((built[0] / "decode_attention_pdl.cubin").read_bytes(), "decode_attention_pdl.cubin")
    halves = read_cubin(_variant_cubin("decode_attention.cu", "KERN_PDL", "DA_HALVES=2"), "da_halves.cubin")
    assert set(halves.entries) == set(pdl.entries)
    rope = "decode_attention_rope_cluster"
    base, got = pdl.entries[rope].params, halves.entries[rope].params
    assert [(q.offset, q.size) for q in got[:len(base)]] == [(q.offset, q.size) for q in base]
    assert [q.size for q in got[len(base):]] == [8, 8]
    assert halves.entries[rope].grid_dep_wait is True and halves.entries[rope].cluster == pdl.entries[rope].cluster
    for e in set(pdl.entries) - {rope}:
        assert [(q.offset, q.size) for q in halves.entries[e].params] == [(q.offset, q.size) for q in pdl.entries[e].params]


def test_gemv_no_wait_build_drops_the_wait(built):
    """-DGEMV_NO_WAIT (NOTES.md 47, a timing what-if): every gemv.cu entry, with the same params, and none of them
    waits for its predecessor (no griddepcontrol.wait in its code), where every default entry does."""
    plain = read_cubin((built[0] / "gemv.cubin").read_bytes(), "gemv.cubin")
    nowait = read_cubin(_variant_cubin("gemv.cu", "GEMV_NO_WAIT"), "nw.cubin")
    _assert_same_abi(plain, nowait)
    for e, k in plain.entries.items():
        assert k.grid_dep_wait is True and nowait.entries[e].grid_dep_wait is False, e
