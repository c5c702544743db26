"""CPU checks of gemv.cu's opt-in bulk-copy form (-DGEMV_TMA; tools/gpu/gemv_tma_probe.py times it): no GPU needed.

- the form has exactly the default module's entries with the same ELF parameter tables (offsets and sizes), and
  every entry waits (griddepcontrol.wait): a manifest can swap the module without touching its calls;
- its PTX: each M = 1 entry issues its first bulk copies (cp.async.bulk ... mbarrier::complete_tx) before
  griddepcontrol.wait, loads no weight through ld.global.nc.L1::no_allocate (the default form's weight loads), and
  stores nothing to global memory before the wait; the default module has no bulk copy;
- a ring width that is not a multiple of 32 vectors does not compile;
- the probe's manifest rewrite: the 4B example with qkv on the TMA module verifies against the built kernels,
  with the ring added to the launch's dynamic shared memory, the cubin pinned by its sha256, the other ops as they
  were.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "kernels-src"
EXAMPLE = ROOT / "examples" / "qwen3-4b.json"

read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin

sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import build_kernels as bk  # noqa: E402
import gemv_tma_probe as probe  # noqa: E402


def _nvcc(tmp: Path, name: str, *defines: str, ptx: bool = False) -> Path:
    out = tmp / (name + (".ptx" if ptx else ".cubin"))
    flags = [f for f in bk.NVCC_FLAGS if f != "-cubin"] + ["-ptx"] if ptx else list(bk.NVCC_FLAGS)
    subprocess.run([bk._nvcc(), *flags, *(f"-D{d}" for d in defines), "-o", str(out), "gemv.cu"],
                   cwd=SRC, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemv_tma")
    return {"default": _nvcc(tmp, "gemv"), "tma": _nvcc(tmp, "gemv_tma_c64_s2", "GEMV_TMA", "GEMV_TMA_C=64",
                                                          "GEMV_TMA_S=2"), "tmp": tmp}


def test_tma_module_has_the_default_abi(builds):
    base = read_cubin(builds["default"].read_bytes(), "gemv.cubin")
    tma = read_cubin(builds["tma"].read_bytes(), "gemv_tma.cubin")
    assert set(tma.entries) == set(base.entries) and len(base.entries) == 20
    for name, info in base.entries.items():
        def table(i):
            return [(s.index, s.offset, s.size) for s in sorted(i.params, key=lambda s: s.index)]
        assert table(tma.entries[name]) == table(info), name
        assert tma.entries[name].grid_dep_wait is True, name


def _entries(ptx: str) -> dict[str, list[str]]:
    out = {}
    for part in ptx.split(".entry ")[1:]:
        name = part.split("(", 1)[0].strip()
        out[name] = [ln.strip() for ln in part.split("\n}\n", 1)[0].splitlines()]
    return out


def test_tma_ptx_copies_before_the_wait(builds):
    tma = _entries(_nvcc(builds["tmp"], "tma", "GEMV_TMA", "GEMV_TMA_C=64", "GEMV_TMA_S=2", ptx=True).read_text())
    m1 = {n: lines for n, lines in tma.items() if re.search(r"_m1(_u5)?$", n)}
    assert len(m1) == 8
    for name, lines in m1.items():
        wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
        copies = [i for i, ln in enumerate(lines) if ln.startswith("cp.async.bulk.shared::cluster.global.mbarrier")]
        assert copies and min(copies) < wait and max(copies) > wait, name  # first stages before, refills after
        assert not [ln for ln in lines if "ld.global.nc.L1::no_allocate" in ln], name
        assert not [ln for ln in lines[:wait] if re.search(r"\bst\.global|\batom\.|\bred\.", ln)], name
    base = _nvcc(builds["tmp"], "base", ptx=True).read_text()
    assert "cp.async.bulk" not in base and "mbarrier" not in base


def test_tma_ring_width_must_be_whole_warp_loads(tmp_path):
    with pytest.raises(subprocess.CalledProcessError):
        _nvcc(tmp_path, "bad", "GEMV_TMA", "GEMV_TMA_C=48")


def test_probe_manifest_variant_verifies(builds, built_kernels, tmp_path):
    from kern_verify.verify import verify_text

    kernels = tmp_path / "kernels"
    shutil.copytree(built_kernels, kernels)
    path = probe.manifest_variant(EXAMPLE, kernels, builds["tma"], "q64s2", probe.ring_bytes(64, 2), tmp_path,
                                  [probe.SHORT["qkv"]])
    text = path.read_text()
    assert not [d for d in verify_text(text, kernels_dir=kernels) if d.severity == "error"]
    base, v = json.loads(EXAMPLE.read_text()), json.loads(text)
    launch = v["ops"]["gemv_norm_qkv"]["impl"]["launches"][0]
    assert launch["module"] == "gemv_tma_c64_s2" and launch["entry"] == "kern_gemv_norm_m1"
    assert launch["shared_mem"] == 5120 + 8 * 2 * 2 * 64 * 16  # x (k = 2,560 bf16) + the ring
    assert v["modules"]["gemv_tma_c64_s2"] == {
        "source": "gemv_tma_c64_s2.cubin", "sha256": hashlib.sha256(builds["tma"].read_bytes()).hexdigest()}
    assert v["modules"]["gemv"] == base["modules"]["gemv"]  # o, gate_up, down and lm_head still launch it
    assert {k: o for k, o in v["ops"].items() if k != "gemv_norm_qkv"} == \
        {k: o for k, o in base["ops"].items() if k != "gemv_norm_qkv"}
    assert v["programs"] == base["programs"]


def test_probe_refuses_bad_specs(capsys):
    for spec, msg in (("a=b:1", "expected LABEL=CUBIN:C:S"), ("a=x.cubin:64:2:qkv+foo", "unknown op foo"),
                      ("a=/nonexistent.cubin:64:2", "no file /nonexistent.cubin")):
        with pytest.raises(SystemExit):
            probe.main(["--base", "x", "--tma", spec, "--geometry", "none"])
        assert msg in capsys.readouterr().err, spec
