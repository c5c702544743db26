#!/usr/bin/env python3
"""Qwen3 decode, side by side on the same weights: kern vs the PyTorch peers, and the floors.

    python3 tools/bench_decode.py --work DIR [--geometry 4b] [--context 128] [--steps 256] \\
        [--append BENCHMARKS.md] [--skip hf-eager,hf-compile,gpt-fast,floors]

DIR is the layout of tools/gpu/prepare.py (random-weight checkpoint, kern weights,
manifest, kernels). One run measures, on one GPU:

- kern: decode ms/token with CUDA graphs and eager (prompt of --context random ids,
  then --steps tokens, each step's 8-byte token read back); prefill tok/s of one
  512-token and one 2048-token chunk (graph replays, after capture);
- transformers `generate`, static cache, no compile (`disable_compile=True`);
- transformers + torch.compile, compiled once: a StaticCache and a manual decode loop
  whose step (token, cache_position as tensors; fixed shapes) is
  `torch.compile(mode="reduce-overhead", fullgraph=True, dynamic=False)`, with
  `torch.compiler.cudagraph_mark_step_begin()` each step and the output cloned.
  (`generate(cache_implementation="static")` under reduce-overhead fails in
  transformers 5.17 with "accessing tensor output of CUDAGraphs that has been
  overwritten"; a loop whose shapes or Python ints change recompiles every step.)
  The Dynamo graph count is checked before and after the timed loop;
- gpt-fast-style PyTorch (tools/gpu/qwen3_torch.py): static KV cache, one
  torch.compile(mode="reduce-overhead") decode step, tokens fed back on the GPU;
- the floors: device-to-device copy bandwidth and the bytes one decode token must read
  (weights + KV at the mean context), and the cuBLAS time of the token's GEMMs alone
  (every layer's qkv, o, gate_up, down and the lm_head at m=1) replayed in a CUDA graph.

Every peer's first tokens are compared with kern's (same weights, greedy): a peer
that computes another model is flagged. The first FIRST_TOKENS tokens of kern, HF
eager, each compiled peer and each compiled peer's own step run uncompiled (same
harness: prefill of the whole prompt, then the step at positions T, T+1, ...) are
printed one above the other, with kern's top-2 logit gap at each of those steps:
a peer whose uncompiled step agrees with kern while its compiled step does not, at a
step where kern's gap is tiny, met a bf16 near-tie under Inductor's numerics (no
harness bug); a peer whose uncompiled step already differs has a harness bug. Each
peer is guarded: a failure prints its
error and the run goes on. The table is printed and appended to --append.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
from benchinfo import commit, kv_capacity  # noqa: E402  (tools/ is the script's own directory)
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
for pkg in ("kern-schema", "kern-verify", "kern-driver", "kern-run"):
    sys.path.insert(0, str(ROOT / "packages" / pkg / "src"))

from prepare import paths, weights_for  # noqa: E402

MATCH_TOKENS = 32  # tokens compared with kern's for each peer
FIRST_TOKENS = 8  # tokens printed side by side, per peer


def top2_gap(bits) -> float:
    """Best minus second-best logit of a bf16 logits buffer (np.uint16 bits)."""
    from kern_run.compare import top2_gap as gap

    return gap(bits)


def log(msg=""):
    print(msg, flush=True)


class Results:
    def __init__(self):
        self.decode: list[tuple[str, float | None, str]] = []  # (name, ms/token, note)
        self.prefill: list[tuple[str, float | None, str]] = []  # (name, tok/s, note)
        self.floors: dict[str, float] = {}
        self.notes: list[str] = []

    def guard(self, name, fn, table="decode"):
        t0 = time.perf_counter()
        log(f"\n== {name}")
        try:
            fn()
        except Exception as e:  # a peer's failure must not kill the run
            traceback.print_exc()
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            getattr(self, table).append((name, None, f"FAILED: {msg}"))
        finally:
            try:
                import torch

                torch.cuda.synchronize()
            except Exception as e:  # a sticky CUDA error: report it, the next peers will say more
                log(f"   synchronize after {name}: {e}")
            log(f"   ({time.perf_counter() - t0:.1f} s)")


def random_prompt(n, seed=0):
    return np.random.default_rng(seed + 12345).integers(0, 151643, size=n).tolist()


def match_note(tokens, ref, state=None):
    n = min(len(tokens), len(ref), MATCH_TOKENS)
    if n == 0:
        return "no kern tokens to compare"
    same = sum(1 for a, b in zip(tokens[:n], ref[:n]) if a == b)
    first = next((i for i in range(n) if tokens[i] != ref[i]), None)
    if first is None:
        return f"tokens = kern's {n}/{n}"
    note = f"tokens differ from kern's at step {first} ({same}/{n} equal)"
    gaps = (state or {}).get("kern_top2", [])
    if first < len(gaps):
        note += f", kern's top-2 logit gap there {gaps[first]:.4f}"
    return note


def show_first(state, name, tokens):
    """Log a run's first FIRST_TOKENS tokens under kern's (and remember them for the summary)."""
    row = [int(t) for t in tokens[:FIRST_TOKENS]]
    state.setdefault("first_tokens", []).append((name, row))
    kern = state.get("kern_tokens", [])[:FIRST_TOKENS]
    marks = " ".join(f"{t:>7}{'' if i < len(kern) and t == kern[i] else '*'}" for i, t in enumerate(row))
    log(f"   first tokens {name:<34} {marks}   (* = differs from kern)")


def time_cuda(fn, reps):
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps  # ms


# -- kern -------------------------------------------------------------------


def bench_kern(res: Results, p, args, state):
    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    info = ManifestInfo.read(p["manifest"])
    capacity = kv_capacity(args.context, args.steps)
    t0 = time.perf_counter()
    rt = Runtime.load(p["manifest"], p["kernels"], weights_for(p["manifest"], p), capacity_tokens=capacity,
                      prime_graphs=args.prime_graphs)
    log(f"kern: loaded in {time.perf_counter() - t0:.1f} s" + (" (prime_graphs)" if args.prime_graphs else ""))
    try:
        prompt = random_prompt(args.context)
        for graph, steps in ((True, args.steps), (False, min(args.steps, 64))):
            s = Qwen3Session(rt, info, capacity=capacity, graph=graph)
            s.warmup()
            warm = []  # warm run (untimed): the prompt's remainder chunk, caches; and the first steps' logits
            stepwise = Qwen3Session(rt, info, capacity=capacity, graph=graph, pipeline=False)  # logits per step
            for t in stepwise.generate(prompt, FIRST_TOKENS, 512):
                warm.append(t)
                if graph and "logits" in rt.manifest.buffers:  # (a screened lm_head computes no logits)
                    state.setdefault("kern_top2", []).append(top2_gap(rt.read_buffer("logits")))
            tokens = list(s.generate(prompt, steps, 512))
            if tokens[:FIRST_TOKENS] != warm:
                log(f"   WARNING: kern's warm run (step by step) and timed run (pipelined) disagree: {warm} vs "
                    f"{tokens[:FIRST_TOKENS]}")
            st = s.stats
            name = f"kern decode ({'CUDA graph' if graph else 'eager'}{', prime_graphs' if args.prime_graphs else ''})"
            log(f"{name}: {st.decode_ms_per_token:.3f} ms/token over {st.decode_steps} steps")
            res.decode.append((name, st.decode_ms_per_token, f"{st.decode_steps} steps, pipelined: each 8-byte token read while the next step runs"))
            if graph:
                state["kern_tokens"] = tokens
                show_first(state, "kern (graph)", tokens)
                log("   kern top-2 logit gaps " + " ".join(f"{g:.4f}" for g in state.get("kern_top2", [])))
            else:
                show_first(state, "kern (eager)", tokens)
        s = Qwen3Session(rt, info, capacity=capacity, graph=True)
        for n in (512, 2048):
            if n > info.tokens_max:
                res.prefill.append((f"kern prefill {n}", None, f"manifest tokens max is {info.tokens_max}"))
                continue
            ids = random_prompt(n, seed=1)

            def once():
                s.prefill(ids, n)
                rt.synchronize()

            once()  # capture
            t0 = time.perf_counter()
            reps = 5
            for _ in range(reps):
                once()
            dt = (time.perf_counter() - t0) / reps
            log(f"kern prefill {n}: {1e3 * dt:.2f} ms, {n / dt:,.0f} tok/s")
            res.prefill.append((f"kern prefill, one {n}-token chunk (CUDA graph)", n / dt, f"{1e3 * dt:.2f} ms"))
    finally:
        rt.close()


# -- transformers -------------------------------------------------------------


def load_hf(p, state):
    if "hf" not in state:
        import torch
        import transformers

        m = transformers.Qwen3ForCausalLM.from_pretrained(p["hf"], dtype=torch.bfloat16).cuda().eval()
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
        state["hf"] = m
    return state["hf"]


def bench_hf_eager(res: Results, p, args, state):
    import torch

    hf = load_hf(p, state)
    ids = torch.tensor([random_prompt(args.context)], device="cuda")
    steps = min(args.steps, 64)

    def gen(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                          cache_implementation="static", disable_compile=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out[0, ids.shape[1]:].tolist()

    gen(4)
    t_short, _ = gen(8)
    t_long, tokens = gen(8 + steps)
    ms = 1e3 * (t_long - t_short) / steps
    note = match_note(tokens, state.get("kern_tokens", []), state)
    show_first(state, "transformers generate (eager)", tokens)
    log(f"transformers static eager: {ms:.3f} ms/token; {note}")
    res.decode.append(("transformers generate, static cache, eager", ms, note))
    for n in (512, 2048):
        x = torch.tensor([random_prompt(n, seed=1)], device="cuda")
        with torch.no_grad():
            hf(x, logits_to_keep=1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(3):
                hf(x, logits_to_keep=1)
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / 3
        res.prefill.append((f"transformers forward, {n} tokens, eager", n / dt, f"{1e3 * dt:.2f} ms"))
        log(f"transformers prefill {n}: {n / dt:,.0f} tok/s")


def bench_hf_compile(res: Results, p, args, state):
    """fullgraph=True first; if Dynamo cannot trace the HF forward whole, once more with graph breaks."""
    try:
        _bench_hf_compile(res, p, args, state, fullgraph=True)
    except Exception:
        traceback.print_exc()
        log("transformers + torch.compile: fullgraph=True failed (above); retrying with fullgraph=False")
        import torch

        torch._dynamo.reset()
        _bench_hf_compile(res, p, args, state, fullgraph=False)


def _bench_hf_compile(res: Results, p, args, state, fullgraph: bool):
    import torch
    import transformers

    hf = load_hf(p, state)
    prompt = random_prompt(args.context)
    T, steps = len(prompt), args.steps
    dev = "cuda"
    caches = [transformers.StaticCache(config=hf.config, max_cache_len=T + steps + 16)]

    def prefill():
        """A fresh static cache holding the prompt; the first new token [1, 1] (the T-1 logits' argmax)."""
        caches[0] = transformers.StaticCache(config=hf.config, max_cache_len=T + steps + 16)
        with torch.no_grad():
            out = hf(torch.tensor([prompt], device=dev), past_key_values=caches[0],
                     cache_position=torch.arange(T, device=dev), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def step(token, cache_position):
        logits = hf(token, past_key_values=caches[0], cache_position=cache_position, use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    if fullgraph:  # the same harness, uncompiled: tells a harness bug from Inductor numerics at a near-tie
        tok = prefill()
        eager = [int(tok)]
        with torch.no_grad():
            for i in range(FIRST_TOKENS - 1):
                tok = step(tok, torch.tensor([T + i], device=dev))
                eager.append(int(tok))
        show_first(state, "HF manual loop, uncompiled", eager)
    tok = prefill()

    cstep = torch.compile(step, mode="reduce-overhead", fullgraph=fullgraph, dynamic=False)
    positions = [torch.tensor([T + i], device=dev) for i in range(steps)]
    tokens = [int(tok)]
    warm = 4
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(warm):  # compile, cudagraph warm-up and record
            torch.compiler.cudagraph_mark_step_begin()
            tok = cstep(tok, positions[i]).clone()
            tokens.append(int(tok))
    log(f"transformers compile + warm-up: {time.perf_counter() - t0:.1f} s")
    from torch._dynamo.utils import counters

    graphs_before = counters["stats"]["unique_graphs"]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(warm, steps):
            torch.compiler.cudagraph_mark_step_begin()
            tok = cstep(tok, positions[i]).clone()
            tokens.append(tok)  # stays on the GPU: no sync per step (as gpt-fast)
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0) / (steps - warm)
    tokens = [int(t) for t in tokens]
    show_first(state, f"HF manual loop, compiled (fullgraph={fullgraph})", tokens)
    recompiled = counters["stats"]["unique_graphs"] - graphs_before
    note = f"{match_note(tokens, state.get('kern_tokens', []), state)}; " + (
        "compiled once" if recompiled == 0 else f"RECOMPILED {recompiled}x in the timed loop")
    log(f"transformers + torch.compile: {ms:.3f} ms/token; {note}")
    res.decode.append((f"transformers + torch.compile (StaticCache, manual loop, reduce-overhead, fullgraph={fullgraph})",
                       ms, note))


# -- gpt-fast style -------------------------------------------------------------


def load_kern_weights_torch(p, state):
    if "w" not in state:
        from qwen3_torch import load_kern_weights

        state["w"] = load_kern_weights(p["weights"], "cuda")
    return state["w"]


def bench_gpt_fast(res: Results, p, args, state):
    import torch
    from qwen3_torch import Qwen3Torch

    cfg = json.loads((p["hf"] / "config.json").read_text())
    w = load_kern_weights_torch(p, state)
    prompt = random_prompt(args.context)
    T, steps = len(prompt), args.steps
    m = Qwen3Torch(cfg, w, max_seq=-(-(T + steps + 1) // 64) * 64)
    tok = m.prefill(prompt).argmax(-1)  # [1]
    eager = [int(tok)]  # the same harness, uncompiled (see the docstring)
    with torch.no_grad():
        for i in range(FIRST_TOKENS - 1):
            tok = m.decode_step(tok, torch.tensor([T + i], device="cuda"))
            eager.append(int(tok))
    show_first(state, "gpt-fast step, uncompiled", eager)
    tok = m.prefill(prompt).argmax(-1)  # the compiled loop rewrites positions T.. before reading them
    step = m.compiled_decode()
    positions = [torch.tensor([T + i], device="cuda") for i in range(steps)]
    tokens = [tok]
    warm = 4
    t0 = time.perf_counter()
    for i in range(warm):
        tok = step(tok, positions[i])
        tokens.append(tok)
    torch.cuda.synchronize()
    log(f"gpt-fast compile + warm-up: {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    for i in range(warm, steps):
        tok = step(tok, positions[i])
        tokens.append(tok)
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0) / (steps - warm)
    tokens = [int(t) for t in tokens]
    show_first(state, "gpt-fast step, compiled", tokens)
    note = f"{match_note(tokens, state.get('kern_tokens', []), state)}; KV cache {m.max_seq} positions"
    log(f"gpt-fast: {ms:.3f} ms/token; {note}")
    res.decode.append(("gpt-fast-style PyTorch (torch.compile reduce-overhead)", ms, note))
    del m


# -- floors -------------------------------------------------------------------------


def bench_floors(res: Results, p, args, state):
    import torch

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    ms = time_cuda(lambda: b.copy_(a), 20)
    copy_bw = 2 * n / (ms * 1e-3)  # bytes read + written per second
    del a, b
    log(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)")

    cfg = json.loads((p["hf"] / "config.json").read_text())
    H, NQ, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, L, I, V = cfg.get("head_dim", 128), cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    tied = cfg.get("tie_word_embeddings", False)
    matrices = L * ((NQ * D + 2 * NKV * D) * H + H * NQ * D + 2 * I * H + H * I) + V * H  # lm_head (= embedding if tied)
    vectors = L * (2 * H + 2 * D) + H  # norms
    weight_bytes = 2 * (matrices + vectors) + 2 * H  # + one embedding row
    mean_ctx = args.context + args.steps / 2
    kv_bytes = mean_ctx * L * NKV * 2 * D * 2
    per_token = weight_bytes + kv_bytes
    res.floors.update(copy_bw=copy_bw, weight_bytes=weight_bytes, kv_bytes=kv_bytes, mean_ctx=mean_ctx)
    floor_ms = 1e3 * per_token / copy_bw
    log(f"bytes per token: {weight_bytes / 1e9:.3f} GB weights + {kv_bytes / 1e6:.1f} MB KV (mean context "
        f"{mean_ctx:.0f}) -> {floor_ms:.3f} ms at copy bandwidth")
    res.decode.append(("floor: bytes read per token / D2D copy bandwidth", floor_ms,
                       f"{per_token / 1e9:.3f} GB at {copy_bw / 1e12:.2f} TB/s (read+write){' , tied lm_head' if tied else ''}"))

    w = load_kern_weights_torch(p, state)
    lm = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    xh = torch.randn(1, H, dtype=torch.bfloat16, device="cuda")
    xa = torch.randn(1, NQ * D, dtype=torch.bfloat16, device="cuda")
    xi = torch.randn(1, I, dtype=torch.bfloat16, device="cuda")
    layers = [tuple(w[f"model.layers.{l}.{n}"] for n in ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
                                                          "mlp.gate_up_proj.weight", "mlp.down_proj.weight"))
              for l in range(L)]

    def gemms():
        for qkv, o, gu, down in layers:
            torch.matmul(xh, qkv.t())
            torch.matmul(xa, o.t())
            torch.matmul(xh, gu.t())
            torch.matmul(xi, down.t())
        torch.matmul(xh, lm.t())

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemms()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemms()
    g.replay()
    ms = time_cuda(g.replay, 20)
    gemm_bytes = 2 * matrices
    log(f"cuBLAS GEMMs of one token in a CUDA graph: {ms:.3f} ms ({gemm_bytes / (ms * 1e-3) / 1e12:.2f} TB/s of weights)")
    res.decode.append(("floor: cuBLAS GEMMs only (m=1, CUDA graph)", ms,
                       f"{4 * L + 1} GEMMs, {gemm_bytes / 1e9:.2f} GB, {100 * (gemm_bytes / (ms * 1e-3)) / copy_bw:.0f}% "
                       "of copy bandwidth"))


# -- report ---------------------------------------------------------------------------


def machine():
    import torch

    bits = [torch.cuda.get_device_name(0)]
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        bits.append(f"driver {drv}")
    except Exception:
        pass
    import transformers

    bits += [f"torch {torch.__version__}", f"transformers {transformers.__version__}", f"python {platform.python_version()}"]
    return ", ".join(bits)


def table(res: Results, args) -> str:
    kern_graph = next((ms for n, ms, _ in res.decode if n.startswith("kern decode (CUDA graph") and ms), None)
    lines = [f"### Qwen3-{args.geometry} decode, batch 1 (`tools/bench_decode.py`)", "",
             f"{datetime.date.today().isoformat()}, commit `{commit()}`, {machine()}. Random weights "
             f"(tools/make_random_checkpoint.py, seed 0), prompt {args.context} random token ids, {args.steps} "
             "decode steps, greedy." + (" kern's runtime loaded with prime_graphs=True." if args.prime_graphs else ""),
             "",
             "| decode | ms/token | tok/s | time / kern graph | note |", "|---|---:|---:|---:|---|"]
    for name, ms, note in res.decode:
        if ms is None:
            lines.append(f"| {name} | — | — | — | {note} |")
        else:
            rel = f"{ms / kern_graph:.2f}x" if kern_graph else "—"
            lines.append(f"| {name} | {ms:.3f} | {1e3 / ms:,.1f} | {rel} | {note} |")
    lines += ["", "| prefill | tok/s | note |", "|---|---:|---|"]
    for name, tps, note in res.prefill:
        lines.append(f"| {name} | {'—' if tps is None else f'{tps:,.0f}'} | {note} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path, help="tools/gpu/prepare.py's directory")
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens before decoding (default 128)")
    ap.add_argument("--steps", type=int, default=256, help="decode steps measured (default 256)")
    ap.add_argument("--append", type=Path, default=ROOT / "BENCHMARKS.md", help="markdown file to append the table to")
    ap.add_argument("--skip", default="", help="comma list of: kern, hf-eager, hf-compile, gpt-fast, floors")
    ap.add_argument("--prime-graphs", action="store_true",
                    help="load kern's runtime with prime_graphs=True (a throwaway graph before the first capture of a "
                    "program with pdl launches; kern-driver's README, NOTES.md 37)")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    p = paths(args.work, args.geometry)
    for k in ("manifest", "weights"):
        if not p[k].is_file():
            raise SystemExit(f"bench_decode: {p[k]} not found: run tools/gpu/prepare.py --work {args.work} first")
    res, state = Results(), {}
    benches = [("kern", bench_kern), ("hf-eager", bench_hf_eager), ("hf-compile", bench_hf_compile),
               ("gpt-fast", bench_gpt_fast), ("floors", bench_floors)]
    for key, fn in benches:
        if key not in skip:
            res.guard(key, lambda fn=fn: fn(res, p, args, state))
    if state.get("first_tokens"):
        log("\nfirst tokens, side by side (* = differs from kern graph):")
        kern = state.get("kern_tokens", [])[:FIRST_TOKENS]
        for name, row in state["first_tokens"]:
            log(f"   {name:<40} " + " ".join(f"{t:>7}{'' if i < len(kern) and t == kern[i] else '*'}"
                                            for i, t in enumerate(row)))
        if state.get("kern_top2"):
            log(f"   {'kern top-2 logit gap':<40} " + " ".join(f"{g:>8.4f}" for g in state["kern_top2"]))
    text = table(res, args)
    log("\n" + text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)
        log(f"appended to {args.append}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
