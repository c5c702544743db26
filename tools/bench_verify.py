"""Benchmark kern-verify: time to verify a Qwen3-4B-sized manifest (~900 calls).

Usage: ``uv run python tools/bench_verify.py [--layers 36] [--repeat 50] [--no-record]``

Times, over R runs (median and best, milliseconds):

- `verify(manifest)`: every rule on a decoded manifest;
- `verify_text(text)`: decoding plus every rule (what the CLI does);
- `verify_text` of the same manifest with one error (adds the source map that gives
  line and column);
- the same stages on `examples/qwen3-4b.json` when it exists.

The synthetic manifest is shaped like Qwen3-4B (36 layers, H=2560, 32/8 heads, D=128,
I=9728, V=151936): per layer and program ~12 calls (norm, qkv GEMM, q/k norm, rotary,
KV write, attention with scratch and two launches, o GEMM, norm, gate/up GEMM,
SiLU-and-mul, down GEMM), programs `prefill` and `decode`, ~300 buffers. Target
(issue 3): under 100 ms on the development machine. Appends the table to BENCHMARKS.md
with date, commit and machine.
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
import time
from pathlib import Path

from kern_schema import decode
from kern_verify import verify, verify_text

ROOT = Path(__file__).resolve().parents[1]
SHA = "0" * 64


def _launch(module, entry, params, args, grid, block=(128, 1, 1), **extra):
    d = {"module": module, "entry": entry, "params": params, "block": list(block), "grid": grid, "args": args}
    d.update(extra)
    return d


def _ops(H: int, NQ: int, NKV: int, D: int, I: int, V: int) -> dict:
    P = lambda n: [{"param": i} for i in range(n)]  # noqa: E731
    hidden = ["in ptr", "in ptr"]
    z = [{"i64": 0}, {"i64": 0}]
    gemm = {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"],
            "impl": {"launches": [{"extern": "cublaslt.gemm_bf16_tn", "args": P(6)}]}}
    return {
        "embed": {"params": ["in buffer<i64>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                  "impl": {"launches": [_launch("embedding", "embedding_kernel",
                                                ["in buffer<i64>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32"],
                                                P(4) + [{"i32": H}], ["tokens", 1, 1])]}},
        "add_rms_norm": {"params": ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                         "impl": {"launches": [_launch("norm", "add_rms_norm_kernel",
                                                       ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>",
                                                        "out buffer<bf16>", "i32", "f32"] + hidden,
                                                       P(5) + [{"f32": 1e-6}] + z, ["tokens", 1, 1])]}},
        "rms_norm": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                     "impl": {"launches": [_launch("norm", "rms_norm_kernel",
                                                   ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "f32"] + hidden,
                                                   P(4) + [{"f32": 1e-6}] + z, ["tokens", 1, 1])]}},
        "gemm": gemm,
        "head_norm": {"params": ["inout buffer<bf16>", "in buffer<bf16>", "i32", "i32"],
                      "impl": {"launches": [_launch("qk", "head_norm_kernel",
                                                    ["inout buffer<bf16>", "in buffer<bf16>", "i32", "i32", "f32"] + hidden,
                                                    P(4) + [{"f32": 1e-6}] + z, ["tokens", NQ, 1])]}},
        "rope": {"params": ["inout buffer<bf16>", "in buffer<f32>", "in buffer<i64>", "i32"],
                 "impl": {"launches": [_launch("qk", "rope_kernel",
                                               ["inout buffer<bf16>", "in buffer<f32>", "in buffer<i64>", "i32"] + hidden,
                                               P(4) + z, ["tokens", NQ + NKV, 1])]}},
        "kv_write": {"params": ["in buffer<bf16>", "in buffer<i64>", "inout ptr", "i32", "i64"],
                     "impl": {"launches": [_launch("kv", "kv_write_kernel",
                                                   ["in buffer<bf16>", "in buffer<i64>", "inout ptr", "i32", "i64"] + hidden,
                                                   P(5) + z, ["tokens", NKV, 1])]}},
        "attention": {"params": ["in buffer<bf16>", "in ptr", "in buffer<i32>", "out buffer<bf16>", "i32", "i64"],
                      "impl": {"scratch": {"partial": {"dtype": "f32", "shape": ["tokens", NQ, 16, D]},
                                           "lse": {"dtype": "f32", "shape": ["tokens", NQ, 16]}},
                               "launches": [
                                   _launch("attn", "attn_split_kernel",
                                           ["in buffer<bf16>", "in ptr", "in buffer<i32>", "out buffer<f32>",
                                            "out buffer<f32>", "i32", "i64"] + hidden,
                                           [{"param": 0}, {"param": 1}, {"param": 2}, {"scratch": "partial"},
                                            {"scratch": "lse"}, {"param": 4}, {"param": 5}] + z, ["tokens", NQ, 16],
                                           shared_mem=65536),
                                   _launch("attn", "attn_reduce_kernel",
                                           ["in buffer<f32>", "in buffer<f32>", "out buffer<bf16>", "i32"] + hidden,
                                           [{"scratch": "partial"}, {"scratch": "lse"}, {"param": 3},
                                            {"expr": {"mul": ["tokens", NQ]}}] + z,
                                           [{"ceil_div": [{"mul": ["tokens", NQ]}, 4]}, 1, 1])]}},
        "silu_mul": {"params": ["in buffer<bf16>", "out buffer<bf16>", "i32"],
                     "impl": {"launches": [_launch("act", "silu_mul_kernel",
                                                   ["in buffer<bf16>", "out buffer<bf16>", "i32", "i32"] + hidden,
                                                   P(3) + [{"i32": I}] + z, [{"ceil_div": [{"mul": ["tokens", I]}, 1024]}, 1, 1])]}},
        "argmax": {"params": ["in buffer<bf16>", "out buffer<i64>"],
                   "impl": {"launches": [_launch("argmax", "argmax_kernel", ["in buffer<bf16>", "out buffer<i64>", "i32"],
                                                 P(2) + [{"i32": V}], [1, 1, 1], block=(1024, 1, 1))]}},
    }


def synthetic(layers: int = 36, H: int = 2560, NQ: int = 32, NKV: int = 8, D: int = 128, I: int = 9728,
              V: int = 151936) -> dict:
    """A Qwen3-shaped manifest with `prefill` and `decode` programs."""
    N = (NQ + 2 * NKV) * D
    layer_bytes = 16 * NKV * 2 * D * 2
    buffers = {
        "token_ids": {"dtype": "i64", "shape": ["tokens"], "class": "input"},
        "positions": {"dtype": "i64", "shape": ["tokens"], "class": "input"},
        "slot_mapping": {"dtype": "i64", "shape": ["tokens"], "class": "input"},
        "seq_lens": {"dtype": "i32", "shape": [1], "class": "input"},
        "model.embed_tokens.weight": {"dtype": "bf16", "shape": [V, H], "class": "weight"},
        "model.norm.weight": {"dtype": "bf16", "shape": [H], "class": "weight"},
        "rope.cos_sin": {"dtype": "f32", "shape": [40960, D], "class": "weight"},
        "residual": {"dtype": "bf16", "shape": ["tokens", H], "class": "workspace"},
        "h": {"dtype": "bf16", "shape": ["tokens", H], "class": "workspace"},
        "x": {"dtype": "bf16", "shape": ["tokens", H], "class": "workspace"},
        "qkv": {"dtype": "bf16", "shape": ["tokens", N], "class": "workspace"},
        "attn": {"dtype": "bf16", "shape": ["tokens", NQ * D], "class": "workspace"},
        "gate_up": {"dtype": "bf16", "shape": ["tokens", 2 * I], "class": "workspace"},
        "act": {"dtype": "bf16", "shape": ["tokens", I], "class": "workspace"},
        "logits": {"dtype": "bf16", "shape": [1, V], "class": "workspace"},
        "next_token": {"dtype": "i64", "shape": [1], "class": "output"},
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        buffers.update({
            p + "input_layernorm.weight": {"dtype": "bf16", "shape": [H], "class": "weight"},
            p + "self_attn.qkv_proj.weight": {"dtype": "bf16", "shape": [N, H], "class": "weight"},
            p + "self_attn.q_norm.weight": {"dtype": "bf16", "shape": [D], "class": "weight"},
            p + "self_attn.k_norm.weight": {"dtype": "bf16", "shape": [D], "class": "weight"},
            p + "self_attn.o_proj.weight": {"dtype": "bf16", "shape": [H, NQ * D], "class": "weight"},
            p + "post_attention_layernorm.weight": {"dtype": "bf16", "shape": [H], "class": "weight"},
            p + "mlp.gate_up_proj.weight": {"dtype": "bf16", "shape": [2 * I, H], "class": "weight"},
            p + "mlp.down_proj.weight": {"dtype": "bf16", "shape": [H, I], "class": "weight"},
        })

    def program(final: bool) -> dict:
        B = lambda n, off=None: {"buf": n} if off is None else {"buf": n, "offset": off}  # noqa: E731
        t = {"var": "tokens"}
        calls = [{"label": "embed", "op": "embed", "args": [B("token_ids"), B("model.embed_tokens.weight"), B("residual"), t]}]
        for i in range(layers):
            p, w = f"l{i}.", f"model.layers.{i}."
            calls += [
                {"label": p + "input_norm", "op": "add_rms_norm",
                 "args": [B("residual"), B("h"), B(w + "input_layernorm.weight"), B("x"), t]} if i else
                {"label": p + "input_norm", "op": "rms_norm",
                 "args": [B("residual"), B(w + "input_layernorm.weight"), B("x"), t]},
                {"label": p + "qkv_proj", "op": "gemm",
                 "args": [B("x"), B(w + "self_attn.qkv_proj.weight"), B("qkv"), t, {"i32": N}, {"i32": H}]},
                {"label": p + "q_norm", "op": "head_norm",
                 "args": [B("qkv"), B(w + "self_attn.q_norm.weight"), t, {"i32": NQ}]},
                {"label": p + "k_norm", "op": "head_norm",
                 "args": [B("qkv", NQ * D * 2), B(w + "self_attn.k_norm.weight"), t, {"i32": NKV}]},
                {"label": p + "rope", "op": "rope",
                 "args": [B("qkv"), B("rope.cos_sin"), B("positions"), t]},
                {"label": p + "kv_write", "op": "kv_write",
                 "args": [B("qkv", NQ * D * 2), B("slot_mapping"), {"state": "kv", "offset": i * layer_bytes}, t,
                          {"i64": layers * layer_bytes}]},
                {"label": p + "attention", "op": "attention",
                 "args": [B("qkv"), {"state": "kv", "offset": i * layer_bytes}, B("seq_lens"), B("attn"), t,
                          {"i64": layers * layer_bytes}]},
                {"label": p + "o_proj", "op": "gemm",
                 "args": [B("attn"), B(w + "self_attn.o_proj.weight"), B("h"), t, {"i32": H}, {"i32": NQ * D}]},
                {"label": p + "post_norm", "op": "add_rms_norm",
                 "args": [B("residual"), B("h"), B(w + "post_attention_layernorm.weight"), B("x"), t]},
                {"label": p + "gate_up_proj", "op": "gemm",
                 "args": [B("x"), B(w + "mlp.gate_up_proj.weight"), B("gate_up"), t, {"i32": 2 * I}, {"i32": H}]},
                {"label": p + "silu_mul", "op": "silu_mul", "args": [B("gate_up"), B("act"), t]},
                {"label": p + "down_proj", "op": "gemm",
                 "args": [B("act"), B(w + "mlp.down_proj.weight"), B("h"), t, {"i32": H}, {"i32": I}]},
            ]
        calls.append({"label": "final_norm", "op": "add_rms_norm",
                      "args": [B("residual"), B("h"), B("model.norm.weight"), B("x"), t]})
        if final:
            calls += [
                {"label": "lm_head", "op": "gemm",
                 "args": [B("x"), B("model.embed_tokens.weight"), B("logits"), {"i32": 1}, {"i32": V}, {"i32": H}]},
                {"label": "argmax", "op": "argmax", "args": [B("logits"), B("next_token")]},
            ]
        return {"calls": calls}

    modules = {m: {"source": f"{m}.cubin", "sha256": SHA} for m in ("embedding", "norm", "qk", "kv", "attn", "act", "argmax")}
    return {
        "schema_version": 4, "model": f"synthetic-qwen3-{layers}l",
        "vars": {"tokens": {"min": 1, "max": 2048}},
        "states": {"kv": {"bytes_per_token": layers * NKV * 2 * D * 2}},
        "buffers": buffers, "modules": modules, "ops": _ops(H, NQ, NKV, D, I, V),
        "programs": {"prefill": program(False), "decode": program(True)},
    }


def _time(fn, repeat: int) -> tuple[float, float, float]:
    """Median wall ms, best wall ms, median CPU ms (process time: less sensitive to other load)."""
    fn()  # warm caches (type-string parsing is memoized)
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return statistics.median(wall), min(wall), statistics.median(cpu)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--no-record", action="store_true", help="do not append to BENCHMARKS.md")
    a = ap.parse_args(argv)

    cases = []
    doc = synthetic(a.layers)
    cases.append((f"synthetic {a.layers} layers", json.dumps(doc, indent=1)))
    example = ROOT / "examples" / "qwen3-4b.json"
    if example.exists():
        cases.append(("examples/qwen3-4b.json", example.read_text()))

    rows = []
    for name, text in cases:
        m = decode(text)
        calls = sum(len(p.calls) for p in m.programs.values())
        assert not [d for d in verify(m) if d.is_error], f"{name} does not verify clean"
        bad = json.loads(text)
        next(iter(bad["programs"].values()))["calls"][-1]["label"] = next(iter(bad["programs"].values()))["calls"][0]["label"]
        bad_text = json.dumps(bad, indent=1)
        assert verify_text(bad_text), "the one-error variant must report an error"
        for stage, fn in (("verify(manifest)", lambda: verify(m)),
                          ("verify_text(text)", lambda: verify_text(text)),
                          ("verify_text, 1 error (+ source map)", lambda: verify_text(bad_text))):
            med, best, cpu = _time(fn, a.repeat)
            rows.append((name, calls, len(m.buffers), stage, med, best, cpu))

    head = ("| manifest | calls | buffers | stage | median ms | best ms | median CPU ms |\n"
            "|---|---|---|---|---|---|---|")
    body = "\n".join(f"| {n} | {c} | {b} | {s} | {med:.1f} | {best:.1f} | {cpu:.1f} |" for n, c, b, s, med, best, cpu in rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(head)
    print(body)
    print(f"\nload average during the run: {load:.2f} on {os.cpu_count()} CPUs")
    ok = all(med < 100 for *_, s, med, _, _ in rows if s != "verify_text, 1 error (+ source map)")
    print(f"\ntarget: verify_text < 100 ms: {'met' if ok else 'NOT met'}")
    if not a.no_record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        date = datetime.date.today().isoformat()
        with open(ROOT / "BENCHMARKS.md", "a", encoding="utf-8") as f:
            f.write(f"\n## kern-verify: verify a Qwen3-4B-sized manifest (tools/bench_verify.py) — {date}, commit {commit}, "
                    f"{platform.node()} ({_cpu()}, Python {platform.python_version()})\n\n"
                    f"Median and best of {a.repeat} runs (wall), median process CPU time; load average {load:.2f} "
                    f"on {os.cpu_count()} CPUs. Target (issue 3): < 100 ms.\n\n{head}\n{body}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
