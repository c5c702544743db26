"""Benchmark kern-schema: time to load (and dump) a 1,000-call manifest.

Usage: ``uv run python tools/bench_schema.py [--calls N] [--repeat R] [--no-record]``

Prints a table of the median and best wall time of each stage over R runs
(milliseconds) and appends it to ``BENCHMARKS.md`` at the repository root with
the date, the commit (`git rev-parse --short HEAD`) and the machine. The target
(issue 2) is `load` of a 1,000-call manifest in under 20 ms on the 2-core CI
machine.

The manifest is synthetic but shaped like a Qwen3 decode program: per layer an
RMS norm, a fused qkv GEMM, q/k norms, rotary, KV write, attention (two
launches), o-projection, norm, gate/up GEMM, SiLU-and-mul and down projection,
with per-layer weight buffers, states, scratch and expressions.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from kern_schema import SourceMap, decode, dump, load

ROOT = Path(__file__).resolve().parent.parent
from benchinfo import commit as _git_commit  # noqa: E402  (tools/ is the script's own directory)
TARGET_MS = 20.0


def _kernel_op(name: str, params: list[str], grid: list[Any], n_launches: int = 1) -> dict[str, Any]:
    launches = []
    for j in range(n_launches):
        launches.append(
            {
                "module": name,
                "entry": f"_Z{len(name)}{name}_kernel_{j}PvS_iif",
                "params": params + ["i64", "f32"],
                "block": [256, 1, 1],
                "grid": grid,
                "shared_mem": 16384,
                "args": [{"param": i} for i in range(len(params))] + [{"i64": 2560}, {"f32": 1e-6}],
            }
        )
    return {"params": params, "impl": {"launches": launches}}


def synthetic_manifest(n_calls: int = 1000) -> dict[str, Any]:
    """A valid manifest (as plain JSON data) whose `decode` program has `n_calls` calls."""
    tok = {"ceil_div": ["tokens", 4]}
    ops = {
        "rms_norm": _kernel_op("rms_norm", ["out buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32"],
                               ["tokens", 1, 1]),
        "qk_norm": _kernel_op("qk_norm", ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32"],
                              [{"mul": ["tokens", 40]}, 1, 1]),
        "rotary": _kernel_op("rotary", ["inout buffer<bf16>", "in buffer<f32>", "in buffer<i64>", "i32"],
                             [tok, 32, 1]),
        "kv_write": _kernel_op("kv_write", ["inout ptr", "in buffer<bf16>", "in buffer<i64>", "i32"], ["tokens", 8, 1]),
        "attention": _kernel_op("attention", ["out buffer<bf16>", "in buffer<bf16>", "in ptr", "i32"],
                                ["seqs", 32, {"ceil_div": [{"mul": ["tokens", 2]}, 64]}], n_launches=2),
        "silu_mul": _kernel_op("silu_mul", ["out buffer<bf16>", "in buffer<bf16>", "i32"], [{"mul": [tok, 2]}, 1, 1]),
        "gemm": {
            "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"],
            "impl": {"launches": [{"extern": "cublaslt.gemm_bf16_tn", "args": [{"param": i} for i in range(6)]}]},
        },
    }
    ops["attention"]["impl"]["scratch"] = {"partial": {"dtype": "f32", "shape": ["seqs", 32, 16, 128]}}
    modules = {
        name: {"source": f"{name}.cubin", "sha256": f"{i:064x}"}
        for i, name in enumerate(["rms_norm", "qk_norm", "rotary", "kv_write", "attention", "silu_mul"])
    }
    buffers: dict[str, Any] = {
        "token_ids": {"dtype": "i64", "shape": ["tokens"], "class": "input"},
        "positions": {"dtype": "i64", "shape": ["tokens"], "class": "input"},
        "rope": {"dtype": "f32", "shape": [40960, 128], "class": "weight"},
        "x": {"dtype": "bf16", "shape": ["tokens", 2560], "class": "workspace"},
        "residual": {"dtype": "bf16", "shape": ["tokens", 2560], "class": "workspace"},
        "qkv": {"dtype": "bf16", "shape": ["tokens", 6144], "class": "workspace"},
        "attn": {"dtype": "bf16", "shape": ["tokens", 4096], "class": "workspace"},
        "gate_up": {"dtype": "bf16", "shape": ["tokens", 19456], "class": "workspace"},
        "act": {"dtype": "bf16", "shape": ["tokens", 9728], "class": "workspace"},
        "logits": {"dtype": "bf16", "shape": ["tokens", 151936], "class": "output"},
    }
    per_layer = [
        ("input_norm", "rms_norm", lambda l: [{"buf": "x"}, {"buf": "residual"}, {"buf": f"{l}.input_norm.w"}, {"var": "tokens"}]),
        ("qkv_proj", "gemm", lambda l: [{"buf": "x"}, {"buf": f"{l}.qkv.w"}, {"buf": "qkv"}, {"var": "tokens"}, {"i32": 6144}, {"i32": 2560}]),
        ("q_norm", "qk_norm", lambda l: [{"buf": "qkv"}, {"buf": f"{l}.q_norm.w"}, {"buf": f"{l}.q_norm.w"}, {"var": "tokens"}]),
        ("rotary", "rotary", lambda l: [{"buf": "qkv"}, {"buf": "rope"}, {"buf": "positions"}, {"expr": {"mul": ["tokens", 32]}}]),
        ("kv_write", "kv_write", lambda l: [{"state": "kv", "offset": 8192}, {"buf": "qkv", "offset": 8192}, {"buf": "positions"}, {"var": "tokens"}]),
        ("attention", "attention", lambda l: [{"buf": "attn"}, {"buf": "qkv"}, {"state": "kv"}, {"var": "seqs"}]),
        ("o_proj", "gemm", lambda l: [{"buf": "attn"}, {"buf": f"{l}.o.w"}, {"buf": "x"}, {"var": "tokens"}, {"i32": 2560}, {"i32": 4096}]),
        ("post_norm", "rms_norm", lambda l: [{"buf": "x"}, {"buf": "residual"}, {"buf": f"{l}.post_norm.w"}, {"var": "tokens"}]),
        ("gate_up", "gemm", lambda l: [{"buf": "x"}, {"buf": f"{l}.gate_up.w"}, {"buf": "gate_up"}, {"var": "tokens"}, {"i32": 19456}, {"i32": 2560}]),
        ("silu_mul", "silu_mul", lambda l: [{"buf": "act"}, {"buf": "gate_up"}, {"var": "tokens"}]),
        ("down", "gemm", lambda l: [{"buf": "act"}, {"buf": f"{l}.down.w"}, {"buf": "x"}, {"var": "tokens"}, {"i32": 2560}, {"i32": 9728}]),
    ]
    calls: list[dict[str, Any]] = []
    layer = 0
    while len(calls) < n_calls:
        l = f"model.layers.{layer}"
        for w, shape in (("input_norm", [2560]), ("qkv", [6144, 2560]), ("q_norm", [128]), ("o", [2560, 4096]),
                         ("post_norm", [2560]), ("gate_up", [19456, 2560]), ("down", [2560, 9728])):
            buffers[f"{l}.{w}.w"] = {"dtype": "bf16", "shape": shape, "class": "weight"}
        for label, op, args in per_layer:
            if len(calls) == n_calls:
                break
            calls.append({"label": f"l{layer}.{label}", "op": op, "args": args(l)})
        layer += 1
    return {
        "schema_version": 4,
        "model": "synthetic-qwen3-like",
        "vars": {"tokens": {"max": 2048}, "seqs": {"min": 1, "max": 256}},
        "states": {"kv": {"bytes_per_token": 147456}},
        "buffers": buffers,
        "modules": modules,
        "ops": ops,
        "programs": {"decode": {"calls": calls}},
    }


def _time(fn: Any, repeat: int) -> tuple[float, float]:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--no-record", action="store_true", help="do not append to BENCHMARKS.md")
    args = ap.parse_args(argv)

    data = msgspec.json.format(msgspec.json.encode(synthetic_manifest(args.calls)), indent=1)
    text = data.decode()
    m = load(data)
    rows = [
        (f"load(bytes), {args.calls} calls", *_time(lambda: load(data), args.repeat)),
        ("decode(str)", *_time(lambda: decode(text), args.repeat)),
        ("dump", *_time(lambda: dump(m), args.repeat)),
        ("SourceMap.build (error path only)", *_time(lambda: SourceMap.build(text), max(3, args.repeat // 10))),
    ]
    example = ROOT / "examples" / "qwen3-4b.json"
    if example.exists():
        ex = example.read_bytes()
        n = sum(len(p.calls) for p in load(ex).programs.values())
        rows.append((f"load(examples/qwen3-4b.json), {n} calls, {len(ex) / 1024:.0f} KiB",
                     *_time(lambda: load(ex), args.repeat)))
    cpus = os.cpu_count()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    machine = (f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}, {platform.node()}, "
               f"load average {load1:.1f} (other work on the machine inflates the medians)")
    lines = [
        f"### kern-schema load ({datetime.date.today().isoformat()}, commit {_git_commit()})",
        "",
        f"Machine: {machine}. Manifest: {args.calls} calls, {len(data) / 1024:.0f} KiB; {args.repeat} runs.",
        "",
        "| stage | median ms | best ms |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {med:.2f} | {best:.2f} |" for name, med, best in rows]
    verdict = "meets" if rows[0][1] < TARGET_MS else "MISSES"
    lines += ["", f"load {verdict} the {TARGET_MS:.0f} ms target (median {rows[0][1]:.2f} ms).", ""]
    out = "\n".join(lines)
    print(out)
    if not args.no_record:
        bench = ROOT / "BENCHMARKS.md"
        new = not bench.exists()
        with open(bench, "a", encoding="utf-8") as f:
            if new:
                f.write("# Benchmarks\n\nAppended by the scripts under `tools/bench_*.py`; newest last.\n\n")
            f.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
