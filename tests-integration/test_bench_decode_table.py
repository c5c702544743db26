"""tools/bench_decode.py's table without a GPU: the 'time / kern graph' column is relative to kern's CUDA-graph row
whatever its label (e.g. with --prime-graphs), and the caption says how kern's runtime was loaded."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import bench_decode as bd  # noqa: E402


def test_relative_column_and_caption_follow_prime_graphs(monkeypatch):
    monkeypatch.setattr(bd, "machine", lambda: "test machine")
    monkeypatch.setattr(bd, "commit", lambda: "abc1234")
    for prime in (False, True):
        res = bd.Results()
        tag = ", prime_graphs" if prime else ""
        res.decode += [(f"kern decode (CUDA graph{tag})", 2.0, "n"), (f"kern decode (eager{tag})", 3.0, "n"),
                       ("HF eager", 5.0, "n")]
        text = bd.table(res, SimpleNamespace(geometry="4b", context=128, steps=256, prime_graphs=prime))
        rows = {r.split(" | ")[0]: r for r in text.splitlines() if r.startswith("| ")}
        assert "| 1.00x |" in rows[f"| kern decode (CUDA graph{tag})"]
        assert "| 2.50x |" in rows["| HF eager"]
        assert ("prime_graphs=True" in text) is prime
