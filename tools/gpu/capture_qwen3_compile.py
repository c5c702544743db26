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
   the last token``, with ``torch.compile`` over a ``StaticCache`` (so the
   token count is the only dynamic size), as ONE graph for every token count
   (``--compile-mode one-graph``, the default). Two things split tokens == 1
   into a graph of its own before (``--compile-mode legacy``: the token dims
   ``mark_dynamic``, i.e. backed; ``backed_size_oblivious`` does not help):
   (a) transformers 5.17's ``create_causal_mask`` branches in Python on
   ``q_length == 1`` (masking_utils.py:951, guard ``Ne(tokens, 1)``), and
   (b) ATen's C++ ``reshape`` in the ``matmul`` decomposition (eager
   attention's ``query @ key.T``, the query being a transposed view) calls
   ``guard_bool(tokens != 1)``, a guard ``backed_size_oblivious`` does not
   reach (the recompile reads ``2 <= input_ids.size()[1]``). one-graph
   therefore (a) passes ``allow_is_causal_skip=False`` to
   ``create_causal_mask`` while tracing (no traced op changes: see
   ``patch_mask_branch``) and, with ``--attn sdpa``, short-circuits HF's
   ``is_causal = q_length > 1 and ...`` the same way
   (``patch_sdpa_branch``), and (b) marks the token dims ``mark_unbacked``
   (one shared symbol): nothing can guard on an unbacked size, and
   size-oblivious code treats it as ≥ 2, which is valid at 1 here. Checked
   on CPU only (``--device cpu --layers 2``, torch 2.11.0+cu130,
   transformers 5.17.0, 2026-11-29): one graph, no recompiles, no graph
   breaks over 63 token counts from 1 to 2048 (1-48, 63-65, 127-129,
   255-257, 511, 513, 1024, 1025, 2048; eager attention), and over the
   default warm-up and prompts with ``--attn sdpa``, ``--dynamic all`` and
   ``--no-oblivious`` too; the same generated tokens as ``--compile-mode
   eager`` (no torch.compile) in each; in fp32 the logits within 4e-6 of the
   uncompiled model's at every token count tried, 1 included. On the H200
   (2026-11-29, under kern-capture, the kern-mine fixture): ``dynamo_graphs:
   1``, no recompiles, no graph breaks; kern-mine finds one program shape
   for prefill and decode (NOTES.md entry 15).
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
the warm-up token counts, how many graphs Dynamo compiled (``dynamo_graphs``:
1 means the prefill and decode passes share every kernel; 2 means tokens == 1
was specialised into its own graph, whose sites are then only ever seen at one
token count), why it recompiled (``recompile_reasons``: the first failed guard,
as ``TORCH_LOGS=recompiles`` prints it) and how many graph breaks it hit.
``--device cpu`` runs it without a GPU to count graphs (Inductor then
generates C++ instead of Triton, which does not change the graph count).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build_model(torch, layers: int, attn: str, device: str = "cuda"):
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
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return cfg, model.to(torch.bfloat16).eval()


def make_cache(torch, cfg, max_len: int, device: str = "cuda"):
    from transformers import StaticCache

    try:
        cache = StaticCache(config=cfg, max_cache_len=max_len)
    except TypeError:  # older signature
        cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len,
                            device=device, dtype=torch.bfloat16)
    return cache


def patch_mask_branch(torch) -> bool:
    """--compile-mode one-graph: no Python branch on ``tokens == 1`` in HF's mask code.

    transformers 5.17's ``create_causal_mask`` evaluates ``is_compileable and
    q_length == 1`` (masking_utils.py:951) to decide ``allow_is_causal_skip``;
    on a symbolic token count that is a guard (``Ne(tokens, 1)``), i.e. a
    second graph for tokens == 1. Passing ``allow_is_causal_skip=False`` while
    Dynamo traces short-circuits that test and changes no traced op: eager's
    mask ignores the flag, and sdpa's mask is materialised under tracing
    anyway (``_ignore_causal_mask_sdpa`` returns False when tracing).
    Uncompiled calls are left alone.
    """
    import inspect

    import transformers.models.qwen3.modeling_qwen3 as mq

    orig = mq.create_causal_mask
    if "allow_is_causal_skip" not in inspect.signature(orig).parameters:
        return False

    def create_causal_mask(*args, **kwargs):
        if torch.compiler.is_compiling():
            kwargs["allow_is_causal_skip"] = False
        return orig(*args, **kwargs)

    mq.create_causal_mask = create_causal_mask
    return True


def patch_sdpa_branch(torch) -> bool:
    """--compile-mode one-graph --attn sdpa: no Python branch on ``tokens > 1`` in HF's sdpa call.

    transformers 5.17's ``sdpa_attention_forward`` computes ``is_causal =
    q_length > 1 and attention_mask is None and is_causal``: a guard on the
    token count, and at tokens == 1 a SymBool passed to sdpa (a graph break).
    Under tracing the mask is always materialised (see ``patch_mask_branch``),
    so that expression is False whatever the token count; this wrapper does
    what HF's function does in that case (repeat_kv, since HF's GQA path needs
    no mask; sdpa with the mask and ``is_causal=False``) without evaluating it,
    and calls HF's function for everything else.
    """
    from transformers import modeling_utils
    from transformers.integrations import sdpa_attention as hf_sdpa

    mapping = modeling_utils.ALL_ATTENTION_FUNCTIONS._global_mapping
    orig = mapping.get("sdpa")
    if orig is None or getattr(hf_sdpa, "_is_torch_xpu_available", False) \
            or getattr(hf_sdpa, "_is_torch_npu_available", False):
        return False

    def sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                               scaling=None, is_causal=None, **kwargs):
        if not (torch.compiler.is_compiling() and isinstance(attention_mask, torch.Tensor)
                and kwargs.get("position_bias") is None):
            return orig(module, query, key, value, attention_mask, dropout=dropout,
                        scaling=scaling, is_causal=is_causal, **kwargs)
        n_rep = getattr(module, "num_key_value_groups", 1)
        if n_rep > 1:
            key = hf_sdpa.repeat_kv(key, n_rep)
            value = hf_sdpa.repeat_kv(value, n_rep)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False)
        return out.transpose(1, 2).contiguous(), None

    mapping["sdpa"] = sdpa_attention_forward
    return True


def mark_tokens(torch, t, dim: int, mode: str) -> None:
    """Make dim ``dim`` of ``t`` (the token count) symbolic for --compile-mode ``mode``."""
    if mode == "legacy":  # backed: Dynamo guards tokens != 1 (see the module docstring)
        torch._dynamo.mark_dynamic(t, dim)
        return
    # one-graph: unbacked, so no guard can be put on its value; both token dims share one symbol
    from torch._dynamo.decorators import mark_unbacked

    try:
        mark_unbacked(t, dim, shape_id="tokens")
    except TypeError:  # torch without shape_id
        mark_unbacked(t, dim)


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
                    help="do not set backed_size_oblivious (with --compile-mode legacy: let Dynamo specialise "
                         "tokens == 1 at once)")
    ap.add_argument("--dynamic", default="auto", choices=["auto", "all"],
                    help="torch.compile dynamic shapes: auto = only the token dims (marked), all = dynamic=True")
    ap.add_argument("--compile-mode", default="one-graph", choices=["one-graph", "legacy", "eager"],
                    help="one-graph (default): token dims unbacked (mark_unbacked) and HF's tokens == 1 branches "
                         "short-circuited while tracing, one graph for every token count; legacy: token dims "
                         "mark_dynamic, as before 2026-11-29 (two graphs: tokens == 1 its own); eager: no "
                         "torch.compile (a reference for the generated tokens)")
    ap.add_argument("--device", default="cuda",
                    help="torch device (cuda for the capture; cpu to count graphs without a GPU: "
                         "Inductor then generates C++ instead of Triton)")
    a = ap.parse_args()
    if a.sleep_ms < 50:
        ap.error("--sleep-ms must be at least 50")

    import torch

    torch.manual_seed(a.seed)

    def sync() -> None:
        if torch.device(a.device).type == "cuda":
            torch.cuda.synchronize()
    if not a.no_oblivious:
        try:  # do not specialise size-1 dims: one graph for prefill and decode
            import torch.fx.experimental._config as fx_config

            fx_config.backed_size_oblivious = True
        except (ImportError, AttributeError):
            print("capture_qwen3_compile: backed_size_oblivious unavailable", file=sys.stderr)

    cfg, model = build_model(torch, a.layers, a.attn, a.device)
    patched = []
    if a.compile_mode == "one-graph":
        if patch_mask_branch(torch):
            patched.append("create_causal_mask")
        else:
            print("capture_qwen3_compile: create_causal_mask has no allow_is_causal_skip; not patched",
                  file=sys.stderr)
        if a.attn == "sdpa":
            if patch_sdpa_branch(torch):
                patched.append("sdpa_attention_forward")
            else:
                print("capture_qwen3_compile: sdpa_attention_forward not patched", file=sys.stderr)
    max_len = max([*a.warmup, *(p + a.new_tokens for p in a.prompts)]) + 16
    cache = make_cache(torch, cfg, max_len, a.device)

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
    if a.compile_mode == "eager":
        compiled = forward
    else:
        compiled = torch.compile(forward, dynamic=True if a.dynamic == "all" else None)
    gen = torch.Generator().manual_seed(a.seed)

    @torch.inference_mode()
    def step(ids, pos: int) -> int:
        n = ids.shape[1]
        cache_position = torch.arange(pos, pos + n, device=a.device)
        if a.compile_mode != "eager":
            mark_tokens(torch, ids, 1, a.compile_mode)
            mark_tokens(torch, cache_position, 0, a.compile_mode)
        tokens = compiled(ids, cache_position)
        return int(tokens[0, n - 1].item())  # host sync: the pause between passes

    def rand_ids(n: int):
        return torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(a.device)

    @torch.inference_mode()  # the cache tensors are inference tensors (made in the eager pass)
    def reset_cache() -> None:
        try:
            cache.reset()
        except (AttributeError, RuntimeError) as e:  # a lazily built cache before its first use
            print(f"capture_qwen3_compile: cache.reset(): {e}", file=sys.stderr)

    # One eager pass first: a lazily initialised StaticCache allocates its
    # tensors outside the compiled graph (its launches are warm-up noise).
    with torch.inference_mode():
        model(input_ids=rand_ids(2), cache_position=torch.arange(2, device=a.device),
              past_key_values=cache, use_cache=True, logits_to_keep=1)
    sync()

    sleep = a.sleep_ms / 1000.0
    for _ in range(a.warmup_rounds):
        for n in a.warmup:
            reset_cache()
            step(rand_ids(n), 0)
        sync()
        time.sleep(sleep)

    outputs = []
    for p in a.prompts:
        time.sleep(sleep)
        reset_cache()
        sync()
        time.sleep(sleep)
        tok = step(rand_ids(p), 0)
        toks = [tok]
        for i in range(a.new_tokens - 1):
            tok = step(torch.tensor([[tok]], device=a.device), p + i)
            toks.append(tok)
        outputs.append(toks)
    sync()
    time.sleep(sleep)

    graphs = None
    recompiles: list[str] = []
    graph_breaks = None
    try:
        from torch._dynamo.utils import counters, guard_failures

        graphs = int(counters["stats"]["unique_graphs"])
        graph_breaks = int(sum(counters["graph_break"].values()))
        # Why each recompilation happened: the first failed guard of each earlier graph
        # (the text TORCH_LOGS=recompiles prints), per compiled function.
        for code, reasons in guard_failures.items():
            recompiles += [f"{code.co_name}: {r.splitlines()[0]}" for r in reasons]
    except Exception:  # noqa: BLE001 - diagnostics only
        pass
    try:
        import transformers

        tf_version = transformers.__version__
    except Exception:  # noqa: BLE001
        tf_version = None
    print(json.dumps({
        "prompts": a.prompts, "new_tokens": a.new_tokens, "generated": outputs,
        "warmup": a.warmup, "warmup_rounds": a.warmup_rounds, "layers": a.layers, "attn": a.attn,
        "seed": a.seed, "dynamic": a.dynamic, "compile_mode": a.compile_mode, "patched": patched,
        "dynamo_graphs": graphs, "recompile_reasons": recompiles, "graph_breaks": graph_breaks,
        "backed_size_oblivious": not a.no_oblivious, "device": a.device,
        "torch": torch.__version__, "transformers": tf_version, "pid": os.getpid(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
