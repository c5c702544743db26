#!/usr/bin/env python3
"""The workload behind kern-mine's real fixture: a torch.compile'd Qwen3-0.6B
(random weights) serving four greedy requests, one process, one GPU.

Run it under the capture on the GPU machine::

    kern-capture run --out /tmp/q3c -- python3 tools/gpu/capture_qwen3_compile.py
    kern-mine /tmp/q3c                       # check: 4 requests, prefill 1/34/85/175
    kern-mine trim /tmp/q3c packages/kern-mine/tests/fixtures/qwen3-0.6b-compile --max-bytes 8000000

What it does, in order (all on one CUDA stream, each forward pass ends with a
host sync on the sampled token, so passes are separated by a host pause):

1. Builds ``Qwen3ForCausalLM`` from a ``Qwen3Config`` of the 0.6B geometry
   (hidden 1024, 16 heads, 8 KV heads, head_dim 128, intermediate 3072, 28
   layers, vocab 151936, tied embeddings), bf16, weights from the seeded
   default initialisation: no checkpoint is read or downloaded.
2. Compiles one function, ``forward(input_ids, cache_position) -> logits of
   the last token``, with ``torch.compile`` (token dims marked dynamic) over a
   ``StaticCache`` (so the token count is the only dynamic size).
3. Warm-up: two rounds of single forward passes at ``--warmup`` token counts
   (default 2048 512 130 17 3 1 2 7; the first round compiles and autotunes).
   They are extra sampling points for the expression fits: without a pass at
   the largest token count a grid of 1 cannot be told from
   ``ceil_div(tokens, 256)``. No two consecutive warm-up passes have 1 token,
   so no warm-up window looks like a request.
4. For each prompt length in ``--prompts`` (default 1 34 85 175): a pause,
   ``cache.reset()`` (its fill kernels land in their own window), another
   pause, then the request: a prefill pass over the prompt (random token ids,
   seeded) and ``--new-tokens - 1`` one-token decode passes, greedy.

It prints one JSON line at the end: the prompt lengths, the generated tokens,
the warm-up token counts and how many graphs Dynamo compiled (1 means the
prefill and decode passes share every kernel; 2 means tokens == 1 was
specialised into its own graph, whose sites are then only ever seen at one
token count).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build_model(torch, layers: int, attn: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        attn_implementation=attn,
    )
    cfg._attn_implementation = attn
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    return cfg, model.to(torch.bfloat16).eval()


def make_cache(torch, cfg, max_len: int):
    from transformers import StaticCache

    try:
        cache = StaticCache(config=cfg, max_cache_len=max_len)
    except TypeError:  # older signature
        cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len,
                            device="cuda", dtype=torch.bfloat16)
    return cache


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[1, 34, 85, 175])
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--warmup", type=int, nargs="*", default=[2048, 512, 130, 17, 3, 1, 2, 7])
    ap.add_argument("--warmup-rounds", type=int, default=2)
    ap.add_argument("--sleep-ms", type=float, default=200.0, help="pause around each request (≥ 50 ms)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"],
                    help="HF attention implementation (eager has no tokens == 1 branch in the attention call)")
    ap.add_argument("--no-oblivious", action="store_true",
                    help="do not set backed_size_oblivious (let Dynamo specialise tokens == 1)")
    ap.add_argument("--dynamic", default="auto", choices=["auto", "all"],
                    help="torch.compile dynamic shapes: auto = only the token dims (mark_dynamic), all = dynamic=True")
    a = ap.parse_args()
    if a.sleep_ms < 50:
        ap.error("--sleep-ms must be at least 50")

    import torch

    torch.manual_seed(a.seed)
    if not a.no_oblivious:
        try:  # do not specialise size-1 dims: one graph for prefill and decode
            import torch.fx.experimental._config as fx_config

            fx_config.backed_size_oblivious = True
        except (ImportError, AttributeError):
            print("capture_qwen3_compile: backed_size_oblivious unavailable", file=sys.stderr)

    cfg, model = build_model(torch, a.layers, a.attn)
    max_len = max([*a.warmup, *(p + a.new_tokens for p in a.prompts)]) + 16
    cache = make_cache(torch, cfg, max_len)

    def forward(input_ids, cache_position):
        # All positions' logits and their argmax inside the graph; the last one is picked
        # eagerly. (`logits_to_keep=1` slices `hidden_states[:, -1:, :]`, which Dynamo
        # refuses on a size-oblivious dynamic dim in torch 2.11: seen on the H200.)
        out = model(input_ids=input_ids, cache_position=cache_position, past_key_values=cache,
                    use_cache=True, logits_to_keep=0)
        return out.logits.argmax(-1)

    # --dynamic auto (default): only the dims marked below (the token count) are symbolic, so the
    # StaticCache's length stays a constant; --dynamic all: every input dim symbolic (torch 2.11
    # generated out-of-bounds device asserts for it on the H200, 2026-11-29, NOTES.md entry 7).
    compiled = torch.compile(forward, dynamic=True if a.dynamic == "all" else None)
    gen = torch.Generator().manual_seed(a.seed)

    @torch.inference_mode()
    def step(ids, pos: int) -> int:
        n = ids.shape[1]
        torch._dynamo.mark_dynamic(ids, 1)
        cache_position = torch.arange(pos, pos + n, device="cuda")
        torch._dynamo.mark_dynamic(cache_position, 0)
        tokens = compiled(ids, cache_position)
        return int(tokens[0, n - 1].item())  # host sync: the pause between passes

    def rand_ids(n: int):
        return torch.randint(0, cfg.vocab_size, (1, n), generator=gen).cuda()

    @torch.inference_mode()  # the cache tensors are inference tensors (made in the eager pass)
    def reset_cache() -> None:
        try:
            cache.reset()
        except (AttributeError, RuntimeError) as e:  # a lazily built cache before its first use
            print(f"capture_qwen3_compile: cache.reset(): {e}", file=sys.stderr)

    # One eager pass first: a lazily initialised StaticCache allocates its
    # tensors outside the compiled graph (its launches are warm-up noise).
    with torch.inference_mode():
        model(input_ids=rand_ids(2), cache_position=torch.arange(2, device="cuda"),
              past_key_values=cache, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()

    sleep = a.sleep_ms / 1000.0
    for _ in range(a.warmup_rounds):
        for n in a.warmup:
            reset_cache()
            step(rand_ids(n), 0)
        torch.cuda.synchronize()
        time.sleep(sleep)

    outputs = []
    for p in a.prompts:
        time.sleep(sleep)
        reset_cache()
        torch.cuda.synchronize()
        time.sleep(sleep)
        tok = step(rand_ids(p), 0)
        toks = [tok]
        for i in range(a.new_tokens - 1):
            tok = step(torch.tensor([[tok]], device="cuda"), p + i)
            toks.append(tok)
        outputs.append(toks)
    torch.cuda.synchronize()
    time.sleep(sleep)

    graphs = None
    try:
        from torch._dynamo.utils import counters

        graphs = int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - diagnostics only
        pass
    print(json.dumps({
        "prompts": a.prompts, "new_tokens": a.new_tokens, "generated": outputs,
        "warmup": a.warmup, "warmup_rounds": a.warmup_rounds, "layers": a.layers, "attn": a.attn,
        "seed": a.seed, "dynamic": a.dynamic, "dynamo_graphs": graphs, "backed_size_oblivious": not a.no_oblivious,
        "torch": torch.__version__, "pid": os.getpid(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
