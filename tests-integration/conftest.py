"""Shared fixtures of the integration tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [ROOT / "examples" / "qwen3-0.6b.json", ROOT / "examples" / "qwen3-4b.json"]

#: Default modules no example uses: the Triton decode attention, which the CUDA C one replaced as the
#: examples' impl (2026-11-29; `gen_qwen3.py --decode-attention triton` still selects it, and the GPU tests
#: and benches compare against it). Pinned here as they were in the examples (validated on the H200).
UNUSED_BY_EXAMPLES = {
    "paged_decode_attention.cubin": "77354f69eaf21e464d7d4d011a7491d57fa85105ebb605c21d2e9c3a4a5ec8cd",
    "paged_decode_reduce.cubin": "4aa5b00c5a5e8e8503ef217ba94f7fca85d256b795c91a189569d63b9db99003",
    # the persistent decode GEMVs: gen_qwen3.py --gemv persistent (and auto with --pdl on 0.6B), not the examples
    "gemv_persist.cubin": "399ff4e1f58a483e5639ce11f8a24faabfdd5bc9e0a35a5ef607a4c816501255",
}


@pytest.fixture(scope="session")
def pinned_modules() -> dict[str, str]:
    """module file -> sha256 of every default module: those the committed examples pin, and
    UNUSED_BY_EXAMPLES (which no example may use)."""
    pinned = dict(UNUSED_BY_EXAMPLES)
    for ex in EXAMPLES:
        for mod in json.loads(ex.read_text())["modules"].values():
            assert mod["source"] not in UNUSED_BY_EXAMPLES, mod["source"]
            pinned.setdefault(mod["source"], mod["sha256"])
    return pinned
