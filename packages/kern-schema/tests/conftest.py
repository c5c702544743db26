"""Shared fixtures for kern-schema tests: a small valid manifest as plain JSON data.

(Tests run with `--import-mode=importlib`, so this module is not importable from test
modules: everything shared is a fixture.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

_SMALL: dict[str, Any] = {
    "schema_version": 4,
    "model": "tiny",
    "vars": {"tokens": {"max": 64}, "seqs": {"min": 1, "max": 4}},
    "states": {"kv": {"bytes_per_token": 1024}, "ssm": {"bytes_per_seq": 4096, "align": 512}},
    "buffers": {
        "ids": {"dtype": "i64", "shape": ["tokens"], "class": "input"},
        "w": {"dtype": "bf16", "shape": [128, 64], "class": "weight"},
        "x": {"dtype": "bf16", "shape": ["tokens", 64], "class": "workspace"},
        "y": {"dtype": "bf16", "shape": ["tokens", 128], "class": "output"},
        "c": {"dtype": "f32", "shape": ["seqs"], "class": "carry"},
    },
    "modules": {
        "k": {"source": "k.cubin", "sha256": "ab" * 32},
        "hub": {"source": "hf:org/repo/k.cubin", "sha256": "cd" * 32},
    },
    "ops": {
        "scale": {
            "params": ["in buffer<bf16>", "out buffer<bf16>", "inout ptr", "i32"],
            "impl": {
                "scratch": {"tmp": {"dtype": "f32", "shape": ["tokens", 4]}},
                "launches": [
                    {
                        "module": "k",
                        "entry": "_Z5scalePKvPvS_if",
                        "params": ["in buffer<bf16>", "out buffer<bf16>", "inout ptr", "out buffer<f32>",
                                   "i32", "f32", "u8", "i64"],
                        "block": [128, 1, 1],
                        "grid": [{"ceil_div": ["tokens", 4]}, {"mul": ["seqs", 2]}, 1],
                        "shared_mem": 49152,
                        "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"scratch": "tmp", "offset": 16},
                                 {"param": 3}, {"f32": 0.5}, {"u8": 255}, {"i64": -1}],
                    }
                ],
            },
        },
        "gemm": {
            "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"],
            "impl": {"launches": [{"extern": "cublaslt.gemm_bf16_tn",
                                   "args": [{"param": i} for i in range(6)]}]},
        },
    },
    "programs": {
        "decode": {
            "calls": [
                {"label": "proj", "op": "gemm",
                 "args": [{"buf": "x"}, {"buf": "w"}, {"buf": "y"}, {"var": "tokens"}, {"i32": 128}, {"i32": 64}]},
                {"label": "scale", "op": "scale",
                 "args": [{"buf": "x", "offset": 128}, {"buf": "y"}, {"state": "kv", "offset": 256},
                          {"expr": {"mul": [{"ceil_div": ["tokens", 2]}, 3]}}]},
            ]
        }
    },
}


def small_manifest() -> dict[str, Any]:
    """A fresh deep copy of a small valid manifest using every struct and arg form."""
    return copy.deepcopy(_SMALL)


@pytest.fixture
def small() -> dict[str, Any]:
    return small_manifest()
