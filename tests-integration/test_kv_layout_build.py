"""CPU checks of the opt-in head-major KV layout (tools/build_kernels.py --kv-layout head-major; NOTES.md 58): no GPU.

- the catalog (`instances(..., kv_layout="head-major")`): the token-major set less KV_TOKEN_MAJOR_ONLY; every
  decode_attention.cu instance is its token-major one with -DDA_BULK, a `_hm.cubin` module and DA_BULK_BAR_BYTES more
  dynamic shared memory (the merge, which has none, keeps 0); the Triton KV kernels (KV_HEAD_MAJOR_TRITON) are their
  token-major ABI with the entry `<entry>_hm`; every other instance is the token-major one; a bad layout and
  head-major + fused attention are ValueErrors;
- a head-major build (`build_kernels.build(..., kv_layout="head-major")`, once per module): its index says
  `"kv_layout": "head-major"` (a token-major index has no such key), its entries match their cubins' ELF parameter
  tables, the kernels the layout does not touch are the token-major build's entries and cubins byte for byte
  (conftest's `built_kernels`), the touched ones keep their token-major index fields but entry, module, sha256, doc
  and shared memory;
- decode_attention.cu's `_hm` modules export their token-major modules' entries with the same parameter layouts,
  and each of the PDL module's entries copies K|V with a bulk copy and stores nothing before griddepcontrol.wait;
- gen_qwen3.py on the head-major dir: 0.6b and 4b manifests that verify against it and differ from
  examples/qwen3-<g>.json only in the ops qk_norm_rope_kv, attention_prefill, attention_decode_rope (the `_hm`
  entries and module, the attention's shared memory + 256) and in those modules; `--decode-attention cluster` and
  `cuda` verify too; `--decode-attention triton` and `--fused-attention` are refused naming the layout, a geometry
  the dir was not built for is refused with the geometry message;
- the CLI: `--kv-layout head-major --fused-attention` and `--kv-layout bogus` exit 2 before anything is built.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx_entries import ptx_entries  # noqa: E402  (this folder's helper)
from index_checks import check_index_against_cubins  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "kernels-src"
EXAMPLES = {"0.6b": ROOT / "examples" / "qwen3-0.6b.json", "4b": ROOT / "examples" / "qwen3-4b.json"}

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin


#: Instances the layout changes: decode_attention.cu's (all of them) and the Triton KV kernels.
HM_TRITON = ("qk_norm_rope_kv", "qk_norm_rope_kv_pdl", "paged_prefill_attention")
#: The manifest ops that launch them in the examples (the default --pdl rope-cluster manifests).
HM_OPS = ("qk_norm_rope_kv", "attention_prefill", "attention_decode_rope")
#: Triton index fields the layout keeps (shared_mem is the compiler's, the doc names the layout).
SAME_FIELDS = ("params", "param_names", "aligned16", "block", "shared_mem_per", "grid", "constexprs")



def _tools():
    """(catalog, geometries, build_kernels, gen_qwen3), imported from tools/ with their own sys.path."""
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_kernels
        import catalog
        import gen_qwen3
        import geometries
    finally:
        del sys.path[:2]
    return catalog, geometries, build_kernels, gen_qwen3


@pytest.fixture(scope="module")
def built_hm(tmp_path_factory):
    """The head-major kernels of the example geometries, built once per module through build_kernels.build (in
    process: its Triton environment variables are put back afterwards)."""
    _, _, bk, _ = _tools()
    d = tmp_path_factory.mktemp("kernels_hm")
    keys = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DISABLE_LINE_INFO", "TRITON_INTERPRET", "TRITON_KERNEL_OVERRIDE")
    saved = {k: os.environ.get(k) for k in keys}
    try:
        idx = bk.build(d, ["0.6b", "4b"], quiet=True, kv_layout="head-major")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert json.loads((d / "index.json").read_text()) == idx
    return d, idx


@pytest.fixture(scope="module")
def built_tm(built_kernels):
    """The token-major (default) build: conftest's session build, shared with the other build tests."""
    return built_kernels, json.loads((built_kernels / "index.json").read_text())


# ------------------------------------------------------------------ the catalog


@pytest.mark.parametrize("pdl", [True, False])
def test_catalog_head_major_instances(pdl):
    catalog, geometries, _, _ = _tools()
    g = [geometries.load_geometry("0.6b"), geometries.load_geometry("4b")]
    tm = {k.name: k for k in catalog.instances(g, pdl=pdl)}
    assert {k.name for k in catalog.instances(g, pdl=pdl, kv_layout="token-major")} == set(tm)
    hm_list = catalog.instances(g, pdl=pdl, kv_layout="head-major")
    hm = {k.name: k for k in hm_list}
    assert [k.name for k in hm_list] == sorted(hm)  # sorted by NAME, as the token-major list
    assert set(hm) == set(tm) - set(catalog.KV_TOKEN_MAJOR_ONLY)
    assert "paged_decode_attention" in tm and "paged_decode_attention" not in hm
    assert catalog.DA_BULK_BAR_BYTES == catalog.DA_WARPS * 8 * 8 == 256
    changed = set()
    for name, k in hm.items():
        t = tm[name]
        if t.source == "decode_attention.cu":
            changed.add(name)
            assert "DA_BULK" in k.defines and k.defines == t.defines + ("DA_BULK",), name
            assert k.module.endswith("_hm.cubin") and k.module == t.module.removesuffix(".cubin") + "_hm.cubin", name
            assert k.shared_mem == catalog.da_bulk_smem(t), name
            rows = catalog.DA_WARPS * t.constexprs.get("SLOTS", 0) * 16 * (catalog.DA_ROW - 512)  # padding gone
            assert k.shared_mem == (t.shared_mem + catalog.DA_BULK_BAR_BYTES - rows if t.shared_mem else 0), name
            assert (t.shared_mem == 0) == (t.entry == "decode_attention_merge"), name
            assert k.doc.startswith(t.doc) and "Head-major" in k.doc, name
            assert (k.entry, k.params, k.constexprs, k.block_x, k.pdl, k.carveout, k.grid) == \
                (t.entry, t.params, t.constexprs, t.block_x, t.pdl, t.carveout, t.grid), name
        elif t.lang == "triton" and t.entry in catalog.KV_HEAD_MAJOR_TRITON:
            changed.add(name)
            assert k.entry == t.entry + "_hm", name
            assert (k.params, k.constexprs, k.num_warps, k.num_stages) == \
                (t.params, t.constexprs, t.num_warps, t.num_stages), name
            assert k.module == t.module.removesuffix(".cubin") + "_hm.cubin", name
            assert (k.grid, k.pdl, k.shared_mem_per, k.defines) == (t.grid, t.pdl, t.shared_mem_per, t.defines), name
        else:
            assert k.key() == t.key() and k == t, name
    da = {n for n, t in tm.items() if t.source == "decode_attention.cu"}
    assert changed == da | {n for n in HM_TRITON if n in tm}
    assert len(da) == (8 if pdl else 4)
    assert ("qk_norm_rope_kv_pdl" in changed) == pdl


def test_catalog_refusals():
    catalog, geometries, _, _ = _tools()
    g = [geometries.load_geometry("4b")]
    with pytest.raises(ValueError, match="bogus"):
        catalog.instances(g, kv_layout="bogus")
    with pytest.raises(ValueError, match="head-major"):
        catalog.instances(g, kv_layout="head-major", fused_attention=True)
    with pytest.raises(ValueError, match="head-major"):
        catalog.instances(g, pdl=True, kv_layout="head-major", fused_attention=True)
    # the fused attention stays available on the default layout
    assert catalog.FUSED_ATTENTION in {k.name for k in catalog.instances(g, fused_attention=True,
                                                                       kv_layout="token-major")}


# ------------------------------------------------------------------ the head-major build


def test_index_says_the_layout(built_hm, built_tm):
    _, idx = built_hm
    _, tidx = built_tm
    assert idx["kv_layout"] == "head-major" and idx["format"] == 1 and idx["target"] == "sm_90"
    assert "kv_layout" not in tidx
    assert set(idx) == set(tidx) | {"kv_layout"}


def test_index_matches_cubins(built_hm):
    """The ABI-index-vs-ELF check of test_kernels_build.py, over the whole head-major build."""
    d, idx = built_hm
    check_index_against_cubins(d, idx)
    files = {p.name for p in d.iterdir()} - {"index.json"}
    assert files == {k["module"] for k in idx["kernels"].values()}  # no stray module


def test_untouched_kernels_are_the_token_major_build(built_hm, built_tm):
    """Every kernel the layout does not touch is the token-major build's index entry and cubin, byte for byte; the
    touched ones keep their ABI fields, and only the layout's modules are new or changed."""
    catalog, geometries, _, _ = _tools()
    d, idx = built_hm
    t, tidx = built_tm
    hk, tk = idx["kernels"], tidx["kernels"]
    geoms = [geometries.load_geometry("0.6b"), geometries.load_geometry("4b")]
    tm_kernels = {k.name: k for k in catalog.instances(geoms, pdl=True)}
    assert set(hk) == set(tk) - set(catalog.KV_TOKEN_MAJOR_ONLY)
    da = {n for n, e in tk.items() if e["module"] in ("decode_attention.cubin", "decode_attention_pdl.cubin")}
    assert len(da) == 8
    for name, e in hk.items():
        te = tk[name]
        if name in da:
            assert e["module"] == te["module"].removesuffix(".cubin") + "_hm.cubin", name
            assert e["entry"] == te["entry"], name
            assert e["shared_mem"] == catalog.da_bulk_smem(tm_kernels[name]), name
            assert e.get("carveout") == te.get("carveout") and e.get("pdl") == te.get("pdl"), name
        elif name in HM_TRITON:
            assert e["module"] == te["module"].removesuffix(".cubin") + "_hm.cubin", name
            assert e["entry"] == te["entry"] + "_hm", name
            assert e["sha256"] != te["sha256"], name
            assert e.get("pdl") == te.get("pdl"), name
        else:
            assert e == te, name
            assert (d / e["module"]).read_bytes() == (t / te["module"]).read_bytes(), name
            continue
        for f in SAME_FIELDS:
            assert e[f] == te[f], (name, f)
        assert e["doc"].startswith(te["doc"]) and "Head-major" in e["doc"], name
    for m in ("gemv.cubin", "embedding.cubin", "embedding_pdl.cubin", "argmax_pdl.cubin", "paged_decode_reduce.cubin"):
        assert (d / m).read_bytes() == (t / m).read_bytes(), m
    for m in ("decode_attention.cubin", "decode_attention_pdl.cubin", "paged_decode_attention.cubin",
              "paged_decode_attention_pdl.cubin"):
        assert not (d / m).exists(), m


# ------------------------------------------------------------------ the CUDA side: decode_attention.cu -DDA_BULK


@pytest.mark.parametrize("module", ["decode_attention_pdl", "decode_attention"])
def test_da_hm_module_has_the_token_major_abi(built_hm, built_tm, module):
    """decode_attention*_hm.cubin: the token-major module's entries, each with the same parameter layout, block
    bounds, cluster and PDL wait; another binary (the DA_BULK code)."""
    d, _ = built_hm
    t, _ = built_tm
    data_hm, data_tm = (d / f"{module}_hm.cubin").read_bytes(), (t / f"{module}.cubin").read_bytes()
    assert data_hm != data_tm
    hm, tm = read_cubin(data_hm, module + "_hm.cubin"), read_cubin(data_tm, module + ".cubin")
    assert set(hm.entries) == set(tm.entries) == {"decode_attention_split", "decode_attention_merge",
                                                   "decode_attention_cluster", "decode_attention_rope_cluster"}
    for e, ti in tm.entries.items():
        hi = hm.entries[e]
        assert [(p.index, p.offset, p.size) for p in hi.params] == [(p.index, p.offset, p.size) for p in ti.params], e
        assert hi.param_bytes == ti.param_bytes, e
        assert (hi.max_threads, hi.required_block, hi.cluster, hi.grid_dep_wait) == \
            (ti.max_threads, ti.required_block, ti.cluster, ti.grid_dep_wait), e
    for name in HM_TRITON:  # the Triton modules of the layout: just the `_hm` entry
        k = json.loads((d / "index.json").read_text())["kernels"][name]
        assert set(read_cubin((d / k["module"]).read_bytes(), k["module"]).entries) == {k["entry"]}, name


def test_da_hm_pdl_ptx_bulk_copies_after_the_wait():
    """The PTX of decode_attention_pdl_hm.cubin's module: every entry but the merge copies K|V pages with
    cp.async.bulk (the DA_BULK path), and no entry stores, does an atomic or returns before griddepcontrol.wait
    (the PDL contract test_kernels_build.py checks for the token-major module)."""
    catalog, geometries, bk, _ = _tools()
    ks = {k.name: k for k in catalog.instances([geometries.load_geometry("4b")], pdl=True, kv_layout="head-major")}
    k = ks["decode_attention_rope_cluster_pdl"]
    assert k.module == "decode_attention_pdl_hm.cubin" and "DA_BULK" in k.defines and "KERN_PDL" in k.defines
    entries = ptx_entries(bk.cuda_ptx(k))
    assert set(entries) == {"decode_attention_split", "decode_attention_merge", "decode_attention_cluster",
                            "decode_attention_rope_cluster"}
    for name, lines in entries.items():
        bulk = [ln for ln in lines if ln.startswith("cp.async.bulk.shared")]
        assert bool(bulk) == (name != "decode_attention_merge"), name
        wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
        assert not [ln for ln in lines[:wait] if re.search(r"\bst\.global|\batom\.|\bred\.|\bret;", ln)], name
        assert any(ln.startswith("griddepcontrol.launch_dependents") for ln in lines), name


# ------------------------------------------------------------------ gen_qwen3.py on a head-major dir


def _normalized(m: dict) -> dict:
    """A head-major manifest with the layout's differences undone: the `_hm` entries and modules; the decode
    attention's shared memory (DA_BULK's, removed), the prefill attention's (Triton's own) and the three modules'
    sha256 set aside (the last two returned as they are in the manifest, for the caller to check)."""
    catalog, _, _, _ = _tools()
    m = copy.deepcopy(m)
    for op in HM_OPS:
        for la in m["ops"][op]["impl"]["launches"]:
            la["entry"] = la["entry"].removesuffix("_hm")
            if la["module"].endswith("_hm"):
                la["module"] = la["module"].removesuffix("_hm")
                if la["module"].startswith("decode_attention"):
                    la.pop("shared_mem")  # DA_BULK's own (catalog.da_bulk_smem): checked by the caller
    mods = m["modules"]
    for name in [n for n in mods if n.endswith("_hm")]:
        mod = mods.pop(name)
        mods[name.removesuffix("_hm")] = {**mod, "source": mod["source"].replace("_hm.cubin", ".cubin")}
    return m


@pytest.mark.parametrize("preset", list(EXAMPLES))
def test_gen_qwen3_head_major_manifest(built_hm, preset, tmp_path, capsys):
    import kern_verify

    _, _, _, gen = _tools()
    d, idx = built_hm
    out = tmp_path / f"qwen3-{preset}-hm.json"
    assert gen.main(["--preset", preset, "--kernels", str(d), "--out", str(out)]) == 0
    diags = kern_verify.verify_path(out, kernels_dir=d)
    assert diags == [], "\n".join(map(str, diags))
    m, ex = json.loads(out.read_text()), json.loads(EXAMPLES[preset].read_text())
    assert list(m) == list(ex)
    for key in m:
        if key not in ("ops", "modules"):
            assert m[key] == ex[key], key
    assert set(m["ops"]) == set(ex["ops"])
    for op in m["ops"]:
        if op not in HM_OPS:
            assert m["ops"][op] == ex["ops"][op], op
    # the layout's launches: the `_hm` entries and modules, decode's attention with DA_BULK's shared memory (the
    # slots' mbarriers, unpadded page rows)
    qk, pre, dec = (m["ops"][op]["impl"]["launches"] for op in HM_OPS)
    assert [(la["module"], la["entry"]) for la in qk] == [("qk_norm_rope_kv_hm", "qk_norm_rope_kv_hm")]
    assert [(la["module"], la["entry"]) for la in pre] == [("paged_prefill_attention_hm", "paged_prefill_attention_hm")]
    assert [(la["module"], la["entry"]) for la in dec] == [("decode_attention_pdl_hm", "decode_attention_rope_cluster")]
    exdec = ex["ops"]["attention_decode_rope"]["impl"]["launches"]
    rope = idx["kernels"]["decode_attention_rope_cluster_pdl"]
    assert dec[0]["shared_mem"] == rope["shared_mem"] == exdec[0]["shared_mem"] + 256 - 4 * 2 * 16 * 16  # 70,400
    assert pre[0]["shared_mem"] == idx["kernels"]["paged_prefill_attention"]["shared_mem"]
    assert m["modules"]["decode_attention_pdl_hm"]["source"] == "decode_attention_pdl_hm.cubin"
    assert "decode_attention_pdl" not in m["modules"]
    # everything else as in the example: the ops once the layout's differences are undone, the modules but the
    # layout's three
    n = _normalized(m)
    expre = ex["ops"]["attention_prefill"]["impl"]["launches"][0]
    n["ops"]["attention_prefill"]["impl"]["launches"][0]["shared_mem"] = expre["shared_mem"]
    ex_ops = copy.deepcopy(ex["ops"])
    ex_ops["attention_decode_rope"]["impl"]["launches"][0].pop("shared_mem")
    assert n["ops"] == ex_ops
    assert set(n["modules"]) == set(ex["modules"])
    for name, mod in n["modules"].items():
        if name in ("qk_norm_rope_kv", "paged_prefill_attention"):
            assert mod["source"] == ex["modules"][name]["source"] and mod["sha256"] != ex["modules"][name]["sha256"]
            hm_file = d / mod["source"].replace(".cubin", "_hm.cubin")
            assert mod["sha256"] == hashlib.sha256(hm_file.read_bytes()).hexdigest(), name
        elif name == "decode_attention_pdl":
            assert mod["sha256"] == hashlib.sha256((d / "decode_attention_pdl_hm.cubin").read_bytes()).hexdigest()
        else:
            assert mod == ex["modules"][name], name
    capsys.readouterr()


def test_gen_qwen3_triton_decode_attention_refused(built_hm, tmp_path, capsys):
    """The Triton decode attention has no head-major form: the generator says so, naming the layout, and writes
    nothing."""
    _, _, _, gen = _tools()
    d, _ = built_hm
    out = tmp_path / "m.json"
    rc = gen.main(["--preset", "4b", "--kernels", str(d), "--out", str(out), "--decode-attention", "triton"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("gen_qwen3: error: ") and "head-major" in line and "paged_decode_attention" in line, line
    assert "--kv-layout head-major" in line
    assert not out.exists() and not Path(str(out) + ".tmp").exists()


@pytest.mark.parametrize("impl", ["cluster", "cuda"])
def test_gen_qwen3_other_cuda_decode_attentions(built_hm, impl, tmp_path, capsys):
    """The head-major dir serves the other CUDA C decode attentions too (their own prologue call), from its `_hm`
    modules, and the manifests verify against it."""
    import kern_verify

    _, _, _, gen = _tools()
    d, _ = built_hm
    out = tmp_path / "m.json"
    assert gen.main(["--preset", "0.6b", "--kernels", str(d), "--out", str(out), "--decode-attention", impl]) == 0
    diags = kern_verify.verify_path(out, kernels_dir=d)
    assert diags == [], "\n".join(map(str, diags))
    m = json.loads(out.read_text())
    launches = [la for op in m["ops"].values() for la in op["impl"]["launches"] if "module" in la]  # not the externs
    assert {la["module"] for la in launches if la["module"].startswith("decode_attention")} == \
        {"decode_attention_pdl_hm"}
    assert {la["entry"] for la in launches if la["module"] == "qk_norm_rope_kv_pdl_hm"} == {"qk_norm_rope_kv_hm"}
    capsys.readouterr()


def test_gen_qwen3_refusals_name_the_layout_only_where_it_is_the_cause(built_hm, tmp_path, capsys):
    """--fused-attention on the head-major dir names the layout (it said: rebuild with --fused-attention, which
    build_kernels.py refuses with --kv-layout head-major); a geometry the dir was not built for keeps the geometry
    message (it said the layout had no form of `rms_norm_h4096`). gen_qwen3's list of the kernels the layout leaves
    out is the catalog's."""
    catalog, _, _, gen = _tools()
    assert gen.KV_TOKEN_MAJOR_ONLY == catalog.KV_TOKEN_MAJOR_ONLY
    d, _ = built_hm
    out = tmp_path / "m.json"

    def refused(*argv: str) -> str:
        assert gen.main(["--kernels", str(d), "--out", str(out), *argv]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and not out.exists()
        return err.strip().splitlines()[-1]

    for pdl in ("--pdl", "--no-pdl"):
        line = refused("--preset", "4b", "--fused-attention", pdl)
        assert "head-major" in line and "paged_decode_attention_fused" in line, line
    line = refused("--preset", "8b")
    assert line == ("gen_qwen3: error: the kernel index has no `rms_norm_h4096` (needed for hidden_size 4096); "
                    "rebuild it with tools/build_kernels.py --geometry for this model"), line


# ------------------------------------------------------------------ build_kernels.py CLI


@pytest.fixture
def no_build(monkeypatch):
    _, _, bk, _ = _tools()
    monkeypatch.setattr(sys, "argv", ["build_kernels.py"])  # argparse's prog, as when run as a script

    def refuse(*a, **kw):
        raise AssertionError("build() reached with bad options")

    monkeypatch.setattr(bk, "build", refuse)
    return bk


def _cli_error(bk, capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        bk.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_cli_head_major_with_fused_attention(no_build, tmp_path, capsys):
    out = tmp_path / "k"
    for argv in (["--kv-layout", "head-major", "--fused-attention"], ["--fused-attention", "--kv-layout", "head-major"]):
        line = _cli_error(no_build, capsys, ["--out", str(out), *argv])
        assert line.startswith("build_kernels.py: error: ") and "--fused-attention" in line and "--kv-layout" in line
        assert "head-major" in line
    assert not out.exists()


def test_cli_bogus_layout(no_build, tmp_path, capsys):
    out = tmp_path / "k"
    line = _cli_error(no_build, capsys, ["--out", str(out), "--kv-layout", "bogus"])
    assert line.startswith("build_kernels.py: error: argument --kv-layout: invalid choice: 'bogus'"), line
    assert "head-major" in line and "token-major" in line
    assert not out.exists()
