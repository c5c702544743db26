"""tools/gpu/sync_domain_probe.py without a GPU: its mode strings (memory-synchronization domains, per-op carveouts)
are parsed and refused before any process loads a runtime (NOTES.md 55); and which functions a carveout mode changes
on the committed 4B example, whose decode attention launch carries its own `"carveout": 0` (the launch attribute takes
precedence over the function attribute the probe sets, so the probe must leave it, or refuse to be asked for it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import kern_schema as ks
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import sync_domain_probe as sdp  # noqa: E402

ATTN = "attention_decode_rope"


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


@pytest.fixture(scope="module")
def example():
    """The 4B example and stand-ins for kern-driver's resolved entries: one handle per (module, entry), as one
    CUfunction per entry of a loaded module."""
    m = ks.load((ROOT / "examples" / "qwen3-4b.json").read_bytes())
    handles: dict[tuple[str, str], int] = {}
    entries = {(op, i): SimpleNamespace(handle=handles.setdefault((la.module, la.entry), len(handles) + 1),
                                        entry=la.entry)
               for op, o in m.ops.items() for i, la in enumerate(o.impl.launches) if la.extern is None}
    return m, entries


def test_every_function_mode_keeps_the_launch_carveout(example):
    m, entries = example
    assert m.ops[ATTN].impl.launches[0].carveout == 0
    funcs, kept = sdp.function_carveouts(m, entries, {None: 72})
    assert kept == [ATTN]
    given = {op for _, _, op in funcs}
    assert ATTN not in given and "gemv_norm_qkv" in given and all(pct == 72 for _, pct, _ in funcs)
    assert len(funcs) == len({e.handle for (op, _), e in entries.items() if op != ATTN})  # one per function


def test_named_op_mode(example):
    m, entries = example
    funcs, kept = sdp.function_carveouts(m, entries, {"gemv_norm_qkv": 40})
    assert [(pct, op) for _, pct, op in funcs] == [(40, "gemv_norm_qkv")] and kept == []


def test_named_op_with_its_own_carveout_is_refused(example):
    m, entries = example
    with pytest.raises(ValueError) as e:
        sdp.function_carveouts(m, entries, {ATTN: 100})
    assert str(e.value) == (
        f"co100@{ATTN}: op {ATTN}'s launch 0 carries its own carveout 0 (the manifest's `carveout`), which takes "
        "precedence over the function attribute this mode sets; time a manifest with the launch's carveout changed "
        f"instead: tools/manifest_variants.py MANIFEST --kernels KDIR --variant {ATTN}.carveout=100 --out V.json, then "
        "--manifest V.json")


def test_unknown_op_and_shared_function_are_refused(example):
    m, entries = example
    with pytest.raises(ValueError, match=r"no op \['nope'\] in the manifest \(ops: \["):
        sdp.function_carveouts(m, entries, {"nope": 10})
    # o and down launch the same entry of gemv_tc.cubin: one function, one carveout
    with pytest.raises(ValueError, match="op gemv_residual_down_proj shares entry `kern_gemvtc_residual_m1` with op "
                                         "gemv_residual_o_proj, which was given carveout 40, not 10"):
        sdp.function_carveouts(m, entries, {"gemv_residual_o_proj": 40, "gemv_residual_down_proj": 10})
