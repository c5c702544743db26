#!/usr/bin/env python3
"""Benchmark kern-mine: time to mine a capture, step by step.

Mines the real fixture (``packages/kern-mine/tests/fixtures/qwen3-0.6b-compile``)
when it is present, and synthetic captures of a 28-layer fake model
(``packages/kern-mine/tests/synth.py``) of increasing size. Prints a table
and appends it to ``BENCHMARKS.md`` with the date, the commit and the machine.
Target (issue 8): mining the real fixture takes under 5 s.

    uv run python tools/bench_mine.py [--repeat 3] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from benchinfo import commit as _git_commit  # noqa: E402  (tools/ is the script's own directory)
TESTS = ROOT / "packages" / "kern-mine" / "tests"
FIXTURE = TESTS / "fixtures" / "qwen3-0.6b-compile"
sys.path.insert(0, str(TESTS))

from synth import Spec, write_capture  # noqa: E402

from kern_mine.capture import load_capture  # noqa: E402
from kern_mine.fit import _fit_cached  # noqa: E402
from kern_mine.mine import mine_launches  # noqa: E402

TARGET_S = 5.0


def _bench(name: str, d: Path, repeat: int) -> list[str]:
    best_load = best_mine = float("inf")
    for _ in range(repeat):
        _fit_cached.cache_clear()  # each run starts cold
        t0 = time.perf_counter()
        cap = load_capture(d)
        t1 = time.perf_counter()
        r = mine_launches(cap.launches, str(d))
        t2 = time.perf_counter()
        best_load, best_mine = min(best_load, t1 - t0), min(best_mine, t2 - t1)
    s = r.summary
    total = best_load + best_mine
    size = sum(f.stat().st_size for f in d.iterdir() if f.name.startswith("launches.jsonl"))
    return [name, f"{s.launches}", f"{size / 1e6:.1f}", f"{s.passes}", f"{s.sites}", f"{s.requests}",
            f"{best_load:.2f}", f"{best_mine:.2f}", f"{total:.2f}", "yes" if total < TARGET_S else "NO"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-record", action="store_true", help="do not append to BENCHMARKS.md")
    a = ap.parse_args(argv)
    rows = []
    if any((FIXTURE / n).is_file() for n in ("launches.jsonl", "launches.jsonl.gz")):
        rows.append(_bench("real fixture qwen3-0.6b-compile", FIXTURE, a.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        warm = [2048, 512, 130, 17, 3, 1, 2, 7]
        for n_req in (4, 25):
            d = Path(tmp) / f"s{n_req}"
            write_capture(d, Spec(prompts=[1, 34, 85, 175] * (n_req // 4) + [9] * (n_req % 4),
                                  layers=28, warmup=warm * 2))
            rows.append(_bench(f"synthetic 28 layers, {n_req} requests", d, a.repeat))
    head = ["capture", "launches", "MB (jsonl)", "passes", "sites", "requests", "read s", "mine s",
            "total s", f"< {TARGET_S:g} s"]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    cpus = os.cpu_count()
    machine = f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}, {platform.node()}"
    text = "\n".join([
        f"### kern-mine: mining time (tools/bench_mine.py) — {datetime.date.today().isoformat()}, "
        f"commit {_git_commit()}",
        "",
        f"Machine: {machine}. Best of {a.repeat}; read = decode launches.jsonl(.gz), "
        "mine = windows → passes → shapes → sites → reference → fits → pointers → report.",
        "",
        *table,
        "",
    ])
    print(text)
    if not a.no_record:
        with open(ROOT / "BENCHMARKS.md", "a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
