#!/usr/bin/env python3
"""Where one decode token's time goes: a kernel-level profile of kern-run's decode graph.

    python3 tools/profile_decode.py --work DIR [--geometry 4b] [--context 128] [--steps 64] \\
        [--manifest M] [--append BENCHMARKS.md]

Runs the same session as tools/bench_decode.py (tools/gpu/prepare.py's layout: DIR/kernels,
DIR/qwen3-<g>/{manifest.json,weights.safetensors,lm_head_screen.safetensors}; --manifest picks another manifest over the
same kernels and weights) under ``torch.profiler`` (CUPTI kernel activity, which also records
the kernels inside CUDA graph launches), and splits the decode steps' wall time into:

- each kernel's GPU time per token, grouped (GEMV = the decode GEMMs, attention, norms/rotary/KV,
  embedding, argmax, other), from CUPTI's start/end timestamps;
- per op of the manifest's decode program (its calls' kernel launches matched to the profile in order): kernel
  time and the increment, how far each kernel moves the latest end of the kernels before it — the increments sum
  to the decode kernels' span, so under PDL, where a kernel starts early and its duration includes its wait, they
  split the step where durations cannot (an attribution of end times: a variant whose kernel is faster alone but
  whose neighbour then ends later shows as exactly that);
- the gaps: wall time per step (first decode kernel start to last decode kernel end, divided by
  the steps) minus the time covered by at least one kernel (the union of their intervals: under
  PDL kernels overlap, and their summed durations, which then include each one's wait, can
  exceed the wall; the table shows that overlap as its own line). Gaps are where no kernel of the step ran: launch
  latency between graph nodes, the host's 8-byte read-back and the next graph launch.

Decode steps are the kernels after the last prefill kernel (the profile runs prefill of the
prompt first; a kernel whose name contains ``prefill`` or a cuBLASLt GEMM marks prefill), the
step count is the number of ``embedding`` launches among them. The profiler's own overhead makes
the wall time a little longer than tools/bench_decode.py's (which is the number to quote for
speed); the split is what this script is for. Prints a table; appends it to --append.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from benchinfo import commit, kv_capacity  # noqa: E402  (tools/ is the script's own directory)
sys.path.insert(0, str(ROOT / "tools"))

GROUPS = (  # (group, substrings of the kernel name), first match wins
    ("GEMV (decode GEMMs)", ("gemv",)),
    # the screened greedy head (gen_qwen3's default --lm-head): the int8 screen and the candidates' exact logits
    ("lm_head screen + candidate rows (screened head)", ("lmhead_screen", "lmhead_pick")),
    # rope-cluster (gen_qwen3's default decode attention) also does qk_norm_rope_kv's decode work
    ("decode attention + qk-norm, rotary, KV write (one launch)", ("decode_attention_rope",)),
    ("decode attention", ("paged_decode_attention", "paged_decode_reduce", "decode_attention_")),
    ("qk-norm + rotary + KV write", ("qk_norm_rope_kv",)),
    ("RMS norm / residual", ("rms_norm",)),
    ("SiLU-and-mul", ("silu",)),
    ("embedding", ("embedding",)),
    ("argmax", ("argmax",)),
    ("staging (kern-driver's stage kernel) and copies (8-byte read-back)",
     ("kern_runtime_stage", "Memcpy", "Memset", "memcpy", "memset")),
)
# Kernels the runtime launches between the decode graphs, not the manifest's program: kern-driver's `Runtime.stage`
# kernel (kern_driver/stage_kernel.py's ENTRY), which writes each step's token and position into the program's input
# buffers. per_call matches the program's launches without them and gives their increments a row of their own.
RUNTIME_KERNELS = ("kern_runtime_stage",)
RUNTIME_LABEL = "(kern-driver: the step's input staging)"


def group_of(name: str) -> str:
    for g, subs in GROUPS:
        if any(s in name for s in subs):
            return g
    return "other"


def is_prefill(name: str) -> bool:
    return "prefill" in name or "gemm" in name.lower() or "nvjet" in name or "cutlass" in name


def profile(manifest: Path, kernels: Path, weights: Path | list[Path], context: int, steps: int):
    """[(name, start_us, end_us)] of the CUDA kernels of one prefill + `steps` decode steps."""
    import numpy as np
    import torch
    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    capacity = kv_capacity(context, max(steps, 8))  # the warm run takes 8 steps
    rt = Runtime.load(manifest, kernels, weights, capacity_tokens=capacity)
    try:
        info = ManifestInfo.read(manifest)
        prompt = np.random.default_rng(0).integers(0, 151936, context).tolist()
        s = Qwen3Session(rt, info, capacity=capacity, graph=True)
        list(s.generate(prompt, 8, 512))  # warm: graphs captured, caches hot
        s = Qwen3Session(rt, info, capacity=capacity, graph=True)
        acts = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            tokens = list(s.generate(prompt, steps, 512))
        torch.cuda.synchronize()
    finally:
        rt.close()
    ev = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            ev.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    ev.sort(key=lambda x: x[1])
    return ev, tokens


def is_named(name: str, entry: str) -> bool:
    """Whether a CUPTI kernel name is the launch entry `entry` (exact: kern_gemv_norm_m1 is not ..._m1_u5)."""
    return name == entry or name.startswith(entry + "(")


def decode_events(ev, first_entry: str | None = None):
    """The events of the decode steps: after the last prefill kernel, and from the first kernel named `first_entry`
    (the decode program's first launch, when known: a prefill tail kernel not named as prefill, such as
    qk_norm_rope_kv, may come before it). Copies are kept."""
    last_prefill = max((i for i, (n, _, _) in enumerate(ev) if is_prefill(n)), default=-1)
    dec = ev[last_prefill + 1:]
    if first_entry is not None:
        dec = dec[next((i for i, e in enumerate(dec) if is_named(e[0], first_entry)), len(dec)):]
    return dec


def breakdown(ev, steps_hint: int, first_entry: str | None = None):
    """Per-token kernel time by group and kernel, wall per token and gap per token (µs), over `decode_events`."""
    dec = decode_events(ev, first_entry)
    if not dec:
        raise SystemExit("profile_decode: no decode kernels after the prefill kernels in the profile"
                         + (f" (none named `{first_entry}`, the decode program's first launch)" if first_entry else ""))
    steps = sum(1 for n, _, _ in dec if "embedding" in n) or steps_hint
    wall = (dec[-1][2] - dec[0][1]) / steps
    by_kernel: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for n, a, b in dec:
        by_kernel[n] += (b - a) / steps
        count[n] += 1
    by_group: dict[str, float] = defaultdict(float)
    for n, t in by_kernel.items():
        by_group[group_of(n)] += t
    busy = sum(by_kernel.values())
    # the union of the kernel intervals: under PDL a kernel starts before its predecessor ends
    # (and waits), so durations overlap and their sum can exceed the wall time
    covered, end = 0.0, float("-inf")
    for _, a, b in dec:
        if b > end:
            covered += b - max(a, end)
            end = b
    covered /= steps
    return dict(steps=steps, wall=wall, busy=busy, covered=covered, gap=wall - covered,
                overlap=busy - covered, by_group=dict(by_group), by_kernel=dict(by_kernel),
                launches={n: c / steps for n, c in count.items()})


def is_copy(name: str) -> bool:
    """A copy or memset in the CUPTI activity (torch names them `Memcpy ...` / `Memset ...`): not a launch."""
    return name.lower().startswith(("memcpy", "memset"))


def is_runtime(name: str) -> bool:
    """A kernel of the runtime itself (RUNTIME_KERNELS), launched between the decode graphs: not a program launch."""
    return any(is_named(name, entry) for entry in RUNTIME_KERNELS)


def decode_launches(manifest: dict) -> list[tuple[str, str | None]]:
    """(call label, entry) of every launch of one decode step, in program order: the manifest's decode calls, each
    op's launches; an extern built-in (cuBLASLt) has entry None (its kernels are the library's, not named by the
    manifest). Raises SystemExit when the manifest has no decode program."""
    try:
        calls = manifest["programs"]["decode"]["calls"]
    except KeyError:
        raise SystemExit("profile_decode: the manifest has no `decode` program") from None
    return [(c.get("label", c["op"]), ln.get("entry")) for c in calls for ln in manifest["ops"][c["op"]]["impl"]["launches"]]


def per_call(ev, launches: list[tuple[str, str | None]]):
    """The decode kernels of `ev` (`decode_events` from the program's first launch; copies and memsets left out)
    matched, in start order, to `launches` repeated once per step: each kernel's name must be its launch's entry.

    Returns ({label: (kernel µs per token, increment µs per token)}, None), or (None, why not) when they do not match.
    A kernel's increment is how far it moves the latest end of the decode kernels before it (0 when it ends earlier;
    the first kernel's counts from its own start, so each step's first kernel carries the gap since the previous
    step): the increments of all kernels sum to (last kernel end − first kernel start) / steps, and split that time
    by which launch's end defines it. Under PDL, where a kernel's duration includes its wait, this is the split that
    adds up; it is an attribution of end times, not a counterfactual (a faster kernel may move time into its
    neighbour's increment). A call with several launches (argmax: two) sums them; calls of one op in different
    layers stay apart by label (`by_op` sums them per op). The runtime's own kernels between the steps
    (RUNTIME_KERNELS: kern-driver's stage kernel) are not program launches: they are left out of the matching, and
    their time and increments are reported under RUNTIME_LABEL, so that the increments still sum to the span."""
    if not launches or any(entry is None for _, entry in launches):
        why = "launches no kernel" if not launches else "has extern (cuBLASLt) launches, whose kernels are not named"
        return None, f"the decode program {why}: kernels cannot be matched to its launches"
    dec = [e for e in decode_events(ev, launches[0][1]) if not is_copy(e[0])]
    n = len(launches)
    if not dec:
        return None, f"no kernel named `{launches[0][1]}` (the decode program's first launch, {launches[0][0]}) after the prefill"
    staged = [e for e in dec if is_runtime(e[0])]
    program = [e for e in dec if not is_runtime(e[0])]
    if len(program) % n:
        extra = f" (besides {len(staged)} of the runtime's {', '.join(RUNTIME_KERNELS)})" if staged else ""
        return None, (f"{len(program)} decode kernels{extra} are {len(program) // n} steps of {n} launches and "
                      f"{len(program) % n} more: the profile ends mid-step or holds another program's kernels")
    steps = len(program) // n
    dur: dict[str, float] = defaultdict(float)
    inc: dict[str, float] = defaultdict(float)
    end = dec[0][1]
    i = 0
    for name, a, b in dec:
        if is_runtime(name):
            label = RUNTIME_LABEL
        else:
            label, entry = launches[i % n]
            if not is_named(name, entry):
                return None, (f"program kernel {i} (in start order, the runtime's own kernels left out) is `{name}`, "
                              f"the program's launch {i % n} ({label}) is `{entry}`")
            i += 1
        dur[label] += (b - a) / steps
        inc[label] += max(0.0, b - end) / steps
        end = max(end, b)
    return {label: (dur[label], inc[label]) for label in dur}, None


def by_op(calls: dict[str, tuple[float, float]], manifest: dict) -> dict[str, tuple[int, float, float]]:
    """per_call's result summed per op: {op: (calls per token, µs of kernel time, µs of increment)}."""
    op_of = {c.get("label", c["op"]): c["op"] for c in manifest["programs"]["decode"]["calls"]}
    op_of[RUNTIME_LABEL] = RUNTIME_LABEL
    out: dict[str, list] = {}
    for label, (d, i) in calls.items():
        o = out.setdefault(op_of[label], [0, 0.0, 0.0])
        o[0] += 1
        o[1] += d
        o[2] += i
    return {op: tuple(v) for op, v in out.items()}


def op_table(ops: dict[str, tuple[int, float, float]]) -> str:
    """Markdown rows of `by_op`, largest increment first; shares are of the increments' sum (the decode kernels'
    span per token), which the last row gives."""
    total = sum(i for _, _, i in ops.values())
    L = ["| op | calls per token | kernel µs per token | increment µs per token | increment µs per call | share |",
         "|---|---|---|---|---|---|"]
    for op, (k, d, i) in sorted(ops.items(), key=lambda x: -x[1][2]):
        L.append(f"| `{op}` | {k} | {d:.1f} | {i:.1f} | {i / k:.2f} | {100 * i / total:.1f}% |")
    L.append(f"| **sum: first kernel start to last kernel end, per token** | | | **{total:.1f}** | | 100% |")
    return "\n".join(L) + "\n"


def table(r, label: str, machine: str) -> str:
    L = [f"### Decode profile: {label} (`tools/profile_decode.py`)", "",
         f"{datetime.date.today().isoformat()}, commit `{commit()}`, {machine}. torch.profiler (CUPTI kernel "
         f"activity) over {r['steps']} decode steps in CUDA graphs after a prefill; per-token µs. The wall time "
         "includes the profiler's overhead; quote tools/bench_decode.py for speed.", "",
         "| part | µs per token | share of wall |", "|---|---|---|"]
    for g, t in sorted(r["by_group"].items(), key=lambda x: -x[1]):
        L.append(f"| {g} | {t:.1f} | {100 * t / r['wall']:.1f}% |")
    if r["overlap"] > 0.05 * r["wall"]:
        L.append(f"| overlap (kernels running at once: under PDL a kernel starts early and waits; its "
                 f"duration includes the wait) | −{r['overlap']:.1f} | −{100 * r['overlap'] / r['wall']:.1f}% |")
    L.append(f"| gaps (no kernel running: graph-node latency, read-back, next launch) | {r['gap']:.1f} | "
             f"{100 * r['gap'] / r['wall']:.1f}% |")
    L.append(f"| **wall per token** | **{r['wall']:.1f}** | 100% |")
    L += ["", "| kernel | launches per token | µs per token | µs per launch |", "|---|---|---|---|"]
    for n, t in sorted(r["by_kernel"].items(), key=lambda x: -x[1])[:16]:
        k = r["launches"][n]
        L.append(f"| `{n[:70]}` | {k:.0f} | {t:.1f} | {t / k:.2f} |")
    if r.get("ops"):
        L += ["", "Per op of the decode program: kernel time, and the increment — how far each kernel moves the latest "
              "end of the kernels before it; the increments sum to the decode kernels' span (the wall above less the "
              "read-back copy after the last kernel) and split it by whose end defines it (under PDL the durations "
              "overlap and do not add up; an attribution, not a counterfactual):", "",
              op_table(r["ops"]).rstrip("\n")]
    elif r.get("ops_skipped"):
        L += ["", f"(no per-op split: {r['ops_skipped']})"]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path, help="tools/gpu/prepare.py's directory")
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--manifest", type=Path, default=None, help="another manifest over the same kernels/weights")
    ap.add_argument("--label", default=None, help="table title (default: geometry and manifest name)")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--append", type=Path, default=None)
    a = ap.parse_args(argv)
    d = a.work / f"qwen3-{a.geometry}"
    manifest = a.manifest or d / "manifest.json"
    sys.path.insert(0, str(ROOT / "tools" / "gpu"))
    from prepare import paths, weights_for  # the model's weights, and the screened head's file where declared

    ev, _ = profile(manifest, a.work / "kernels", weights_for(manifest, paths(a.work, a.geometry)), a.context,
                    a.steps)
    m = json.loads(manifest.read_text())
    launches = decode_launches(m)
    first = launches[0][1] if launches and all(e is not None for _, e in launches) else None
    r = breakdown(ev, a.steps, first)
    calls, why = per_call(ev, launches)
    if calls is None:
        r["ops_skipped"] = why
    else:
        r["ops"] = by_op(calls, m)
    import torch

    machine = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    t = table(r, a.label or f"Qwen3-{a.geometry}, {manifest.name}, context {a.context}", machine)
    print(t)
    if a.append:
        with open(a.append, "a") as f:
            f.write("\n" + t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
