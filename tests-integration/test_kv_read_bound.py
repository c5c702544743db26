"""CPU checks of tools/gpu/kv_read_bound (NOTES.md 75): the builds it times compile for sm_90 without spills, and the
entry's parameter table, block size and shared memory agree with what kv_read_bound.py launches; the constants the
two files share agree."""

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
import kv_read_bound as kb  # noqa: E402

#: the default build and the two of session 33's call 1
FLAGS = [[], ["-DKR_RING=16", "-DKR_THREADS=512"], ["-DKR_RING=4"]]
SM90_SHARED_PER_BLOCK = 232448  # bytes a block may use on sm_90 (static + dynamic), as kern-verify's E0094


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: ",".join(f) or "default")
def test_build_and_abi(tmp_path, flags):
    from kern_verify.cubin import read_cubin
    from kern_verify.kernels import RESERVED_SHARED

    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    r = subprocess.run([*kb.nvcc_command(flags, tmp_path / "kr.cubin", nvcc), "-Xptxas", "-v"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", r.stderr), r.stderr
    k = read_cubin((tmp_path / "kr.cubin").read_bytes(), "kr.cubin").entries["kv_read"]
    # kv, block_table, seq_lens, out: pointers; page_bytes, wait_first: i32 (what run() passes: 4 tensors, 2 ints)
    assert [p.size for p in k.params] == [8, 8, 8, 8, 4, 4]
    cfg = kb.kr_config(flags)
    assert k.max_threads == (cfg["KR_THREADS"], 1, 1)
    assert kb.kr_smem(cfg) + k.static_shared_bytes - RESERVED_SHARED <= SM90_SHARED_PER_BLOCK
    assert k.grid_dep_wait  # its griddepcontrol.wait (the pre / wait forms)


def test_shared_constants_agree():
    src = kb.SRC.read_text()
    for name, value in {**kb.KR_DEFAULTS, "KR_MAX_PAGES": kb.KR_MAX_PAGES}.items():
        m = re.search(rf"^#define {name} (\d+)", src, re.M)
        assert m and int(m.group(1)) == value, name


def test_kr_config():
    assert kb.kr_config([]) == {"KR_THREADS": 256, "KR_RING": 8}
    assert kb.kr_config(["-DKR_RING=16", "-O2", "-DOTHER=3", "-DKR_THREADS=512"]) == {"KR_THREADS": 512, "KR_RING": 16}
