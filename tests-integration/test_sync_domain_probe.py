"""tools/gpu/sync_domain_probe.py without a GPU: its mode strings (memory-synchronization domains, per-op carveouts)
are parsed and refused before any process loads a runtime (NOTES.md 55)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import sync_domain_probe as sdp  # noqa: E402


@pytest.mark.parametrize("mode, want", [
    ("default", ("default", {})),
    ("alt2", ("alt2", {})),
    ("co0", ("default", {None: 0})),
    ("co100", ("default", {None: 100})),
    ("alt2+co72", ("alt2", {None: 72})),
    ("co40@gemv_norm_qkv", ("default", {"gemv_norm_qkv": 40})),
    ("co100@attention_decode_rope+co72@gemv_norm_qkv,gemv_residual_o_proj",
     ("default", {"attention_decode_rope": 100, "gemv_norm_qkv": 72, "gemv_residual_o_proj": 72})),
])
def test_modes_parse(mode, want):
    assert sdp.parse_mode(mode) == want


@pytest.mark.parametrize("mode", ["", "bogus", "co", "co101", "co-1", "co72@", "co7x", "alt3", "co50@a,,b"])
def test_bad_modes_are_refused_by_name(mode):
    with pytest.raises(ValueError, match="neither a domain mode"):
        sdp.parse_mode(mode)


def test_domains_per_kernel_node():
    assert [sdp.domain_of("default", i, 4) for i in range(3)] == [None] * 3
    assert [sdp.domain_of("same1", i, 4) for i in range(3)] == [1] * 3
    assert [sdp.domain_of("alt2", i, 4) for i in range(4)] == [0, 1, 0, 1]
    assert [sdp.domain_of("cycle4", i, 4) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [sdp.domain_of("cycle4", i, 2) for i in range(4)] == [0, 1, 0, 1]  # a device with 2 domains
    with pytest.raises(ValueError, match="unknown domain mode"):
        sdp.domain_of("co72", 0, 4)


def test_cli_refuses_a_bad_mode_before_any_process():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "sync_domain_probe.py"), "--work", "/nonexistent",
                        "--mode", "co101"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2
    assert "co101" in r.stderr and "neither a domain mode" in r.stderr
