"""CPU checks of tools/gpu/megakernel_probe (NOTES.md 46): the builds it times compile for sm_90 without spills, and
the entry's parameter table, block size and shared memory agree with what megakernel_probe.py launches."""

from __future__ import annotations

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

#: The builds NOTES.md 46 reports, and the default.
CONFIGS = [{}, {"S": 1, "SLOT_BYTES": 20480, "INFLIGHT": 2}, {"NW": 16, "S": 1}, {"NW": 4, "S": 4}]
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
    out = tmp_path / "mk.cubin"
    r = subprocess.run(mp.nvcc_command(cfg, out, nvcc), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", r.stderr), r.stderr
    k = read_cubin(out.read_bytes(), str(out)).entries[mp.ENTRY]
    assert [p.size for p in k.params] == [size for _, size in mp.LAUNCH_PARAMS]
    threads, smem = mp.threads_and_smem(cfg)
    assert k.max_threads == (threads, 1, 1)
    assert k.registers is not None and k.registers * threads <= 65536  # one block per SM (the kernel's waits need it)
    assert smem + k.static_shared_bytes - RESERVED_SHARED <= SM90_SHARED_PER_BLOCK


def test_op_record_matches_the_struct():
    """megakernel_probe.cu's `Op`: five pointers, then n, k, kind and one unused int (56 bytes)."""
    src = mp.SOURCE.read_text()
    body = src[src.index("struct Op {"):src.index("};", src.index("struct Op {"))]
    assert re.findall(r"\*(\w+);", body) == ["w", "x", "norm_w", "y", "res"]
    assert "int n, k, kind, unused;" in body
    assert list(mp.OP.names) == ["w", "x", "norm_w", "y", "res", "n", "k", "kind", "unused"]
    assert mp.OP.itemsize == 5 * 8 + 4 * 4


def test_config_refuses_unknown_macros():
    with pytest.raises(SystemExit, match="expected NAME=INT"):
        mp.parse_config("NW=8,RING=3")
    assert mp.parse_config("NW=16,S=1") == {"NW": 16, "S": 1}
