#!/usr/bin/env python3
"""Host overhead of kern-driver's launch path (needs an NVIDIA GPU and nvcc).

Builds a trivial kernel, a manifest whose program makes 400 calls of it, and
measures (median of many repetitions):

- a bare Python `cuLaunchKernel` loop (the floor for any Python runtime);
- `rt.run(program)` eager, per launch, packed parameter buffer (`extra`) and
  `kernelParams` modes, with unchanged vars and with a var change every run;
- `rt.run(program, graph=True)`: host time of one replay, and wall time of
  replay + synchronize (400 launches of GPU work).

Prints a table and appends it to BENCHMARKS.md (date, commit, machine).

    PYTHONPATH=packages/kern-schema/src:packages/kern-verify/src:packages/kern-driver/src \
        python3 tools/bench_driver.py [--reps 50] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
from benchinfo import commit  # noqa: E402  (tools/ is the script's own directory)
for p in ("kern-schema", "kern-verify", "kern-driver"):
    sys.path.insert(0, str(ROOT / "packages" / p / "src"))

from kern_driver import Runtime  # noqa: E402
from kern_driver.cuda import SUCCESS, drv  # noqa: E402
from kern_driver.testing import build_cubin, sha256  # noqa: E402

NOP_CU = r"""
extern "C" __global__ void nop(float* p, int n, float a) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && n < 0) p[0] = a;
}
"""
LAUNCHES = 400


def manifest(sha: str, calls: int) -> dict:
    return {
        "schema_version": 4, "model": "bench-nop",
        "vars": {"n": {"min": 1, "max": 1024}},
        "states": {},
        "buffers": {"out": {"dtype": "f32", "shape": ["n"], "class": "output"}},
        "modules": {"m": {"source": "nop.cubin", "sha256": sha}},
        "ops": {"nop": {"params": ["out buffer<f32>", "i32"], "impl": {"launches": [{
            "module": "m", "entry": "nop", "params": ["out buffer<f32>", "i32", "f32"],
            "block": [32, 1, 1], "grid": [{"ceil_div": ["n", 1024]}, 1, 1],
            "args": [{"param": 0}, {"param": 1}, {"f32": 1.0}]}]}}},
        "programs": {"p": {"calls": [{"label": f"c{i}", "op": "nop", "args": [{"buf": "out"}, {"var": "n"}]}
                                     for i in range(calls)]}},
    }


def median_us(samples: list[float], per: int = 1) -> float:
    return statistics.median(samples) * 1e6 / per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = ap.parse_args()
    reps = args.reps

    tmp = Path(tempfile.mkdtemp(prefix="kern-bench-"))
    cubin = build_cubin(NOP_CU, tmp / "nop.cubin")
    (tmp / "bench.json").write_text(json.dumps(manifest(sha256(cubin), LAUNCHES)))
    rows: list[tuple[str, float, str]] = []
    with Runtime.load(tmp / "bench.json", tmp, None) as rt:
        dev = f"{rt._dev.name} (sm_{rt._dev.cc[0]}{rt._dev.cc[1]})"
        prog = rt._programs["p"]

        def timed(fn, warm: int = 3) -> list[float]:
            for _ in range(warm):
                fn()
            rt.synchronize()
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
                rt.synchronize()
            return out

        # bare cuLaunchKernel loop over the same staged parameters (packed mode)
        rt.run("p", n=1)
        it = prog.items[0]
        _, f, bx, by, bz, smem, _, ex, i0 = it  # (kind, function, block, shared, kernelParams, extra, step)
        stream = rt._stream
        launch = drv.cuLaunchKernel

        def bare():
            for _ in range(LAUNCHES):
                r = launch(f, 1, 1, 1, bx, by, bz, smem, stream, 0, ex)
                if r[0] != SUCCESS:
                    raise RuntimeError(r)

        rows.append(("bare cuLaunchKernel loop (Python), per launch", median_us(timed(bare), LAUNCHES), "host µs"))
        for mode in ("packed", "params"):
            rt.set_launch_mode(mode)
            rows.append((f"rt.run eager, {mode} mode, per launch", median_us(timed(lambda: rt.run("p", n=1)), LAUNCHES),
                         "host µs"))
        rt.set_launch_mode("packed")
        flip = iter(range(10**9))
        rows.append(("rt.run eager, packed, var changes every run, per launch",
                     median_us(timed(lambda: rt.run("p", n=1 + next(flip) % 2)), LAUNCHES), "host µs"))
        rt.capture("p", n=1)
        rows.append((f"rt.run(graph=True), {LAUNCHES}-launch program, per replay",
                     median_us(timed(lambda: rt.run("p", graph=True, n=1))), "host µs"))

        def replay_sync():
            rt.run("p", graph=True, n=1)
            rt.synchronize()

        rows.append((f"graph replay + synchronize ({LAUNCHES} trivial kernels)", median_us(timed(replay_sync)), "wall µs"))

        def eager_sync():
            rt.run("p", n=1)
            rt.synchronize()

        rows.append((f"eager run + synchronize ({LAUNCHES} trivial kernels)", median_us(timed(eager_sync)), "wall µs"))

    date = datetime.date.today().isoformat()
    head = (f"## kern-driver launch overhead ({date}, commit {commit()}, {dev}, Python {platform.python_version()}, "
            f"median of {reps})\n\n")
    table = "| measurement | value | unit |\n|---|---:|---|\n" + "".join(f"| {n} | {v:.2f} | {u} |\n" for n, v, u in rows)
    print(head + table)
    with open(args.out, "a", encoding="utf-8") as fh:
        fh.write("\n" + head + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
