"""CPU checks of tools/gpu/megakernel_probe (NOTES.md 46): the builds it times compile for sm_90 without spills; the
entry's parameter table, block size and shared memory agree with what megakernel_probe.py launches; the constants the
two files share agree; build configs outside what the kernel accepts are refused by name."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import build_kernels as bk  # noqa: E402
import megakernel_probe as mp  # noqa: E402

#: The builds NOTES.md 46 reports (the best: S=1, 20 KB slots, 2 in flight), the default, and the L2-prefetch form.
CONFIGS = [{}, {"S": 1, "SLOT_BYTES": 20480, "INFLIGHT": 2}, {"S": 1, "SLOT_BYTES": 20480, "INFLIGHT": 2, "PF_AHEAD": 8},
           {"NW": 16, "S": 1}, {"NW": 4, "S": 4}]
SM90_SHARED_PER_BLOCK = 232448  # bytes a block may use on sm_90 (static + dynamic), as kern-verify's E0094


@pytest.mark.parametrize("defines", CONFIGS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "default")
def test_build_and_abi(tmp_path, defines):
    from kern_verify.cubin import read_cubin
    from kern_verify.kernels import RESERVED_SHARED

    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    cfg = mp.config(defines)
    cmd = mp.nvcc_command(cfg, tmp_path / "mk.cubin", nvcc)
    assert {f"-D{k}={v}" for k, v in cfg.items()} <= set(cmd)  # every macro explicit, the defaults too
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", r.stderr), r.stderr
    k = read_cubin((tmp_path / "mk.cubin").read_bytes(), "mk.cubin").entries[mp.ENTRY]
    assert [p.size for p in k.params] == [ctypes.sizeof(mp.CTYPES[t]) for _, t in mp.LAUNCH_PARAMS]
    threads, smem = mp.threads_and_smem(cfg)
    assert k.max_threads == (threads, 1, 1)
    assert k.registers is not None and k.registers * threads <= 65536  # one block per SM (the kernel's waits need it)
    assert smem + k.static_shared_bytes - RESERVED_SHARED <= SM90_SHARED_PER_BLOCK


def test_shared_constants_agree():
    """XS_BYTES, TMAXP and MAX_OPS as the .cu defines them; the .cu traps when launched with less dynamic shared
    memory than its build needs or more ops than MAX_OPS."""
    src = mp.SOURCE.read_text()
    for name in ("XS_BYTES", "TMAXP", "MAX_OPS"):
        m = re.search(rf"^#define {name} (\d+)", src, re.M)
        assert m and int(m.group(1)) == getattr(mp, name), name
    for name, default in mp.DEFAULTS.items():
        m = re.search(rf"^#define {name} (\(NW \* S\)|\d+)", src, re.M)
        assert m, name
        assert m.group(1) == ("(NW * S)" if default is None else str(default)), name
    assert "dyn < SMEM_BYTES || num_ops > MAX_OPS" in src


def test_op_record_matches_the_struct():
    """megakernel_probe.cu's `Op`: five pointers, then n, k, kind and one unused int (56 bytes)."""
    src = mp.SOURCE.read_text()
    body = src[src.index("struct Op {"):src.index("};", src.index("struct Op {"))]
    assert re.findall(r"\*(\w+);", body) == ["w", "x", "norm_w", "y", "res"]
    assert "int n, k, kind, unused;" in body
    assert list(mp.OP.names) == ["w", "x", "norm_w", "y", "res", "n", "k", "kind", "unused"]
    assert mp.OP.itemsize == 5 * 8 + 4 * 4


@pytest.mark.parametrize("defines,needle", [
    ({"NW": 0}, "NW"), ({"NW": 17}, "NW"), ({"S": 0}, "S"), ({"SLOT_BYTES": 8192}, "SLOT_BYTES"),
    ({"SLOT_BYTES": 10248}, "SLOT_BYTES"), ({"INFLIGHT": 17}, "INFLIGHT"), ({"INFLIGHT": 0}, "INFLIGHT"),
    ({"NW": 16, "S": 2}, "exceed 227 KB"), ({"RING": 3}, "unknown macro"),
])
def test_config_refuses_what_the_kernel_does_not_accept(defines, needle):
    with pytest.raises(SystemExit, match=re.escape(needle)):
        mp.config(defines)


def test_config_defaults_and_parsing():
    assert mp.config({}) == {"NW": 8, "S": 2, "SLOT_BYTES": 10240, "INFLIGHT": 16, "POLL_NS": 32, "PF_AHEAD": 0}
    assert mp.config({"S": 1})["INFLIGHT"] == 8
    with pytest.raises(SystemExit, match="expected NAME=INT"):
        mp.parse_config("NW=8,RING=3")
    with pytest.raises(SystemExit, match="expected NAME=INT"):
        mp.parse_config("NW=-1")
    assert mp.parse_config("NW=16,S=1") == {"NW": 16, "S": 1}
