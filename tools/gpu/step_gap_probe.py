#!/usr/bin/env python3
"""What one decode graph launch costs between steps: the decode program captured once per graph (what kern-run
replays, one cuGraphLaunch per token) against N copies of the step captured into one graph (issue 9; timing only).

    python3 tools/gpu/step_gap_probe.py --work DIR [--geometry 4b] [--context 128] [--steps 1,2,4,8] [--replays 64]
        [--rounds 3]

DIR is tools/gpu/prepare.py's layout. One runtime (kern_driver.Runtime) in this process: a `--context`-token random
prompt is prefilled and the decode inputs staged for the next position (Qwen3Session); then, per N of --steps, the
decode program is stream-captured N times back to back into one CUDA graph (the same inputs every time: each copy
rewrites the same KV slot and the same next_token, so the values are those of one step) and that graph launched
--replays // N times back to back (after two untimed launches), µs per step = elapsed / ((replays // N) * N), median
over --rounds rounds; the table's "vs first" is against the first N of --steps. N = 1 is kern-run's graph. The
difference between N = 1 and large N is what a launch of the whole step graph costs beyond its kernels (the gap
between two replays: the graph launch, its first node's start), i.e. what decoding several tokens per graph launch
could save. A probe: prints a table, changes nothing in kern.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))


def capture_n(rt, program: str, n: int, env: dict[str, int]):
    """An executable graph of `program` enqueued n times in one stream capture (kern_driver's own capture path,
    run n times between one begin and one end): (graph, exec)."""
    from kern_driver.cuda import check, drv

    prog = rt._programs[program]
    rt._prepare(prog, env)
    check(drv.cuStreamBeginCapture(rt._stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
          "cuStreamBeginCapture")
    for _ in range(n):
        rt._enqueue(prog, capturing=True)
    g = check(drv.cuStreamEndCapture(rt._stream), "cuStreamEndCapture")
    ex = check(drv.cuGraphInstantiate(g, 0), "cuGraphInstantiate")
    check(drv.cuGraphUpload(ex, rt._stream), "cuGraphUpload")
    return g, ex


def decoding_session(work: Path, geometry: str, context: int):
    """(runtime, Qwen3Session) of DIR/qwen3-<geometry> (tools/gpu/prepare.py's layout), its graphs captured, a
    `context`-token random prompt prefilled and its last token decoded at position context − 1 (next_token
    written). The caller closes the runtime. Shared with tools/gpu/staging_probe.py."""
    from bench_decode import random_prompt
    from benchinfo import kv_capacity
    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session
    from prepare import paths, weights_for

    p = paths(work, geometry)
    capacity = kv_capacity(context, 64)
    rt = Runtime.load(p["manifest"], p["kernels"], weights_for(p["manifest"], p), capacity_tokens=capacity)
    try:
        s = Qwen3Session(rt, ManifestInfo.read(p["manifest"]), capacity=capacity, graph=True)
        s.warmup()
        prompt = random_prompt(context)
        s.prefill(prompt[:-1], 512)
        s.begin_decode()
        s.decode(prompt[-1], context - 1)
    except BaseException:
        rt.close()
        raise
    return rt, s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", default="1,2,4,8", help="steps per graph, comma-separated (default: %(default)s)")
    ap.add_argument("--replays", type=int, default=64, help="graph launches per round for N = 1 (N: replays/N)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    try:
        ns = [int(x) for x in a.steps.split(",")]
    except ValueError:
        ap.error(f"--steps {a.steps}: comma-separated positive ints (e.g. 1,2,4,8)")
    if any(n < 1 for n in ns) or a.replays < max(ns):
        ap.error(f"--steps {a.steps}: positive ints, each at most --replays ({a.replays})")
    if a.context < 1 or a.rounds < 1:
        ap.error("--context and --rounds: positive ints")

    from kern_driver.cuda import check, drv

    rt, s = decoding_session(a.work, a.geometry, a.context)  # the step kern-run would replay
    try:
        s.stage_position(a.context)  # then its inputs for the next position
        rt.synchronize()
        graphs = {n: capture_n(rt, "decode", n, {"tokens": 1}) for n in ns}
        times: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(a.rounds):
            for n, (_, ex) in graphs.items():
                reps = a.replays // n
                for _ in range(2):
                    check(drv.cuGraphLaunch(ex, rt._stream), "cuGraphLaunch")
                rt.synchronize()
                t0, t1 = check(drv.cuEventCreate(0), "cuEventCreate"), check(drv.cuEventCreate(0), "cuEventCreate")
                check(drv.cuEventRecord(t0, rt._stream), "cuEventRecord")
                for _ in range(reps):
                    check(drv.cuGraphLaunch(ex, rt._stream), "cuGraphLaunch")
                check(drv.cuEventRecord(t1, rt._stream), "cuEventRecord")
                rt.synchronize()
                ms = check(drv.cuEventElapsedTime(t0, t1), "cuEventElapsedTime")
                drv.cuEventDestroy(t0)
                drv.cuEventDestroy(t1)
                times[n].append(ms * 1000 / (reps * n))
        base = statistics.median(times[ns[0]])
        print(f"{a.geometry} decode step, {a.context}-token context, µs per step (graph launches back to back, "
              f"{a.rounds} rounds)")
        print("| steps per graph | rounds | median | vs first |")
        print("|---:|---|---:|---:|")
        for n in ns:
            med = statistics.median(times[n])
            print(f"| {n} | {', '.join(f'{t:.1f}' for t in times[n])} | {med:.1f} | {med - base:+.1f} |")
        for g, ex in graphs.values():
            drv.cuGraphExecDestroy(ex)
            drv.cuGraphDestroy(g)
    finally:
        rt.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
