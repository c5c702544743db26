"""CPU checks of the opt-in L2-prefetch GEMV forms (tools/build_kernels.py --l2-prefetch): no GPU needed.

- `--l2-prefetch` only adds `kern_gemv*_m1_pf` entries and their module `gemv_pf.cubin`: every default
  entry and cubin keeps the sha256 the committed examples pin (the default build stays byte-identical);
- each `_pf` entry is its twin's ABI plus `pf_ptr` (in buffer<bf16>, aligned16) and `pf_bytes` (u64), and
  the index matches the cubins' ELF parameter tables (count, offsets, sizes) for every entry of the build,
  the new ones included; gemv_pf.cubin holds exactly the `_pf` entries; they wait (griddepcontrol.wait);
- the PTX: the default module has no bulk prefetch and no cache hint; each `_pf` entry issues
  `cp.async.bulk.prefetch.L2.global` after `griddepcontrol.wait` (default GEMV_PF_AT=1) and before it
  with -DGEMV_PF_AT=0, and every weight load carries the evict_first policy (GEMV_PF_EVICT_FIRST=1);
- a chunk of 1 MB or more (the SASS size field's limit) does not compile.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx_entries import ptx_entries  # noqa: E402  (this folder's helper)
from index_checks import check_index_against_cubins  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tools" / "build_kernels.py"
SRC = ROOT / "tools" / "kernels-src"

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin

EXAMPLES = [ROOT / "examples" / "qwen3-0.6b.json", ROOT / "examples" / "qwen3-4b.json"]
VARIANTS = ("", "_norm", "_norm_silu", "_residual")
PF = {f"kern_gemv{v}_m1_pf" for v in VARIANTS}



def _catalog():
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_kernels
        from catalog import instances
        from geometries import load_geometry
    finally:
        del sys.path[:2]
    return instances, load_geometry, build_kernels


@pytest.fixture(scope="session")
def built_pf(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels_pf")
    subprocess.run([sys.executable, str(BUILD), "--out", str(d), "-q", "--l2-prefetch"], check=True)
    return d, json.loads((d / "index.json").read_text())


def test_catalog_adds_only_the_pf_forms():
    instances, load_geometry, _ = _catalog()
    g = [load_geometry("4b"), load_geometry("0.6b")]
    plain = {k.name for k in instances(g)}
    assert not {n for n in plain if n.endswith("_pf")}
    assert {k.name for k in instances(g, l2_prefetch=True)} == plain | PF
    pdl = {k.name for k in instances(g, pdl=True)}
    assert {k.name for k in instances(g, pdl=True, l2_prefetch=True)} == pdl | PF
    for k in instances(g, l2_prefetch=True):
        if k.name in PF:
            assert k.defines == ("GEMV_L2_PREFETCH",) and k.module == "gemv_pf.cubin" and not k.pdl, k.name


def test_pf_build_keeps_every_default_entry(built_pf, pinned_modules):
    """Every entry but the `_pf` ones has the sha256 the committed examples pin (or conftest's pin of a default
    module no example uses), and its module file is that cubin: the flag changes no default entry or cubin."""
    d, idx = built_pf
    pinned = pinned_modules
    instances, load_geometry, _ = _catalog()
    default = {k.name for k in instances([load_geometry("0.6b"), load_geometry("4b")], pdl=True)}  # build's default
    assert set(idx["kernels"]) == default | PF
    for name, k in idx["kernels"].items():
        if name in PF:
            continue
        assert k["sha256"] == pinned[k["module"]], f"{name}: {k['module']} changed vs the committed examples"
        assert hashlib.sha256((d / k["module"]).read_bytes()).hexdigest() == pinned[k["module"]], name
    assert "gemv_pf.cubin" not in pinned


def test_pf_entries_are_twins_plus_two_params(built_pf):
    d, idx = built_pf
    k = idx["kernels"]
    for v in VARIANTS:
        twin, e = k[f"kern_gemv{v}_m1"], k[f"kern_gemv{v}_m1_pf"]
        assert e["module"] == "gemv_pf.cubin" and e["entry"] == twin["entry"] + "_pf", v
        assert e["params"] == twin["params"] + ["in buffer<bf16>", "u64"], v
        assert e["param_names"] == twin["param_names"] + ["pf_ptr", "pf_bytes"], v
        assert e["aligned16"] == twin["aligned16"] + ["pf_ptr"], v
        for f in ("block", "shared_mem", "shared_mem_per", "grid", "constexprs"):
            assert e[f] == twin[f], (v, f)
        assert "pdl" not in e and e["doc"].startswith(twin["doc"]), v
    # the module holds exactly the _pf entries, each with griddepcontrol.wait like its twin
    cub = read_cubin((d / "gemv_pf.cubin").read_bytes(), "gemv_pf.cubin")
    assert set(cub.entries) == PF
    assert all(cub.entries[n].grid_dep_wait is True for n in PF)


def test_index_matches_cubins_with_pf(built_pf):
    """The ABI-index-vs-ELF check of test_kernels_build.py, over the whole --l2-prefetch build."""
    d, idx = built_pf
    check_index_against_cubins(d, idx)


def _ptx(defines: tuple[str, ...]) -> str:
    instances, load_geometry, bk = _catalog()
    k = next(k for k in instances([load_geometry("4b")], l2_prefetch=True) if k.name == "kern_gemv_m1_pf")
    from dataclasses import replace

    return bk.cuda_ptx(replace(k, defines=k.defines + defines))


def test_default_module_ptx_has_no_prefetch():
    instances, load_geometry, bk = _catalog()
    k = next(k for k in instances([load_geometry("4b")]) if k.name == "kern_gemv_m1")
    ptx = bk.cuda_ptx(k)
    assert "cp.async.bulk.prefetch" not in ptx and "cache_hint" not in ptx and "createpolicy" not in ptx
    assert not re.search(r"\.entry \w+_pf\(", ptx)


@pytest.mark.parametrize("at", [None, 0, 2])
def test_pf_ptx_prefetch_point_and_hints(at):
    """Each _pf entry: bulk prefetches present; at point 1 (default) and 2 only after griddepcontrol.wait, at
    point 0 before it (and, as every GEMV, no store before the wait); every weight load (ld.global.nc with
    L1::no_allocate) carries the evict_first policy of createpolicy."""
    ptx = _ptx(() if at is None else (f"GEMV_PF_AT={at}",))
    entries = ptx_entries(ptx)
    assert set(entries) == PF
    for name, lines in entries.items():
        wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
        pf = [i for i, ln in enumerate(lines) if ln.startswith("cp.async.bulk.prefetch.L2.global")]
        assert pf, name
        if at == 0:
            assert min(pf) < wait, name
        else:
            assert min(pf) > wait, name
        assert not [ln for ln in lines[:wait] if re.search(r"\bst\.global|\batom\.|\bred\.", ln)], name
        weight_loads = [ln for ln in lines if "ld.global.nc.L1::no_allocate" in ln]
        assert weight_loads and all("L2::cache_hint" in ln for ln in weight_loads), name
        assert any("createpolicy.fractional.L2::evict_first" in ln for ln in lines), name


def test_pf_ptx_without_evict_first():
    for name, lines in ptx_entries(_ptx(("GEMV_PF_EVICT_FIRST=0",))).items():
        assert not [ln for ln in lines if "cache_hint" in ln or "createpolicy" in ln], name
        assert any(ln.startswith("cp.async.bulk.prefetch.L2.global") for ln in lines), name


def test_pf_chunk_below_one_megabyte():
    """sm_90 encodes a bulk prefetch's size in 16 bits of 16-byte units (1 MB assembles to 0): refused."""
    with pytest.raises(subprocess.CalledProcessError):
        _ptx(("GEMV_PF_CHUNK=1048576ull",))
