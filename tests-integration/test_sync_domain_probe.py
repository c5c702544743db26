"""tools/gpu/sync_domain_probe.py without a GPU: its mode strings, and which functions a carveout mode changes on the
committed 4B example, whose decode attention launch carries its own `"carveout": 0` (the launch attribute takes
precedence over the function attribute the probe sets, so the probe must leave it, or refuse to be asked for it)."""

from __future__ import annotations

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


def test_parse_mode():
    assert sdp.parse_mode("default") == ("default", {})
    assert sdp.parse_mode("alt2+co72") == ("alt2", {None: 72})
    assert sdp.parse_mode("co40@gemv_norm_qkv,gemv_residual_o_proj") == (
        "default", {"gemv_norm_qkv": 40, "gemv_residual_o_proj": 40})
    for bad in ("co101", "co", "co40@", "alt3"):
        with pytest.raises(ValueError, match="is neither a domain mode"):
            sdp.parse_mode(bad)


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
    # o and down launch the same entry of gemv.cubin: one function, one carveout
    with pytest.raises(ValueError, match="op gemv_residual_down_proj shares entry `kern_gemv_residual_m1` with op "
                                         "gemv_residual_o_proj, which was given carveout 40, not 10"):
        sdp.function_carveouts(m, entries, {"gemv_residual_o_proj": 40, "gemv_residual_down_proj": 10})
