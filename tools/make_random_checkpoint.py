#!/usr/bin/env python3
"""Write a seeded random-weight Qwen3 checkpoint of a real geometry, in Hugging Face format.

Usage (GPU machine: torch + transformers)::

    python tools/make_random_checkpoint.py --geometry 4b --seed 0 --out ckpt/qwen3-4b \\
        [--layers N] [--tokenizer DIR] [--max-shard-size 5GB] [--device cuda]

No real checkpoint can be downloaded here, so tests and benchmarks run the real
geometries (`0.6b 1.7b 4b 8b 14b 32b`, the published config.json values from
tools/qwen3_config.py) with random weights. The result is a normal HF checkpoint:
`Qwen3ForCausalLM.from_pretrained(OUT)` loads it, and `tools/export_weights.py OUT`
turns it into kern weights.

Weights (bf16):
- every matrix (embedding, projections, lm_head when untied) ~ N(0, 0.02²), the
  `initializer_range` of the config, as transformers itself initialises them;
- every RMS-norm weight (input/post-attention/final norms, q_norm, k_norm) = 1 + 0.1·N(0, 1)
  instead of transformers' all-ones, so that a kernel that drops or misplaces a norm
  weight changes the output.

Each tensor is drawn from its own generator, seeded from (--seed, tensor name): the
weights do not depend on the order modules are built in, and `--layers 2` gives the
first two layers of the full model exactly. The values depend on the device's random
number generator (CUDA Philox on the GPU, the CPU generator otherwise): the same
seed on the same kind of device gives the same checkpoint. Initialisation runs on
the GPU when there is one (a 4B checkpoint takes seconds; the time goes to writing
~8 GB).

`--layers N` keeps the first N layers (config num_hidden_layers = N), for fast tests.
`--tokenizer DIR` copies the tokenizer files of DIR (tokenizer.json, its config, its
NOTICE) next to the weights.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_config import PRESETS, preset_hf_config  # noqa: E402

NORM_SUFFIXES = ("layernorm.weight", "norm.weight")  # input/post_attention_layernorm, q/k_norm, model.norm
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "generation_config.json", "NOTICE.md", "LICENSE")


def tensor_seed(seed: int, name: str) -> int:
    """Seed of one tensor's generator: independent of construction order, stable across runs."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def build_config(geometry: str, layers: int | None):
    import transformers

    hf = preset_hf_config(geometry)
    if layers is not None:
        if not 1 <= layers <= hf["num_hidden_layers"]:
            raise SystemExit(f"--layers {layers}: must be in 1..{hf['num_hidden_layers']} for {geometry}")
        hf["num_hidden_layers"] = layers
        hf["max_window_layers"] = layers
    # Only the model's own fields: transformers fills in its version, dtype spelling, rope form.
    drop = {"architectures", "model_type", "torch_dtype", "transformers_version"}
    cfg = transformers.Qwen3Config(**{k: v for k, v in hf.items() if k not in drop})
    cfg.architectures = ["Qwen3ForCausalLM"]
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", required=True, choices=list(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N layers (tests)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="directory whose tokenizer files to copy")
    ap.add_argument("--max-shard-size", default="5GB", help="shard size for save_pretrained (default 5GB)")
    ap.add_argument("--device", default=None, help="where to initialise (default: cuda if available)")
    args = ap.parse_args(argv)

    import torch
    import transformers

    t0 = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = build_config(args.geometry, args.layers)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):  # no memory, no transformers init: every tensor is drawn below
            model = transformers.Qwen3ForCausalLM(cfg)
        model = model.to_empty(device=device)
    finally:
        torch.set_default_dtype(default_dtype)
    if cfg.tie_word_embeddings:
        model.tie_weights()  # moving off `meta` may have split the tied pair: tie before drawing
        assert model.lm_head.weight is model.model.embed_tokens.weight, "lm_head is not tied to the embedding"
    std = cfg.initializer_range
    with torch.no_grad():
        # named_parameters lists a tied lm_head once (as the embedding); sorted: a stable order for the log
        for name, p in sorted(model.named_parameters()):
            assert p.dtype == torch.bfloat16, f"{name}: {p.dtype}"
            g = torch.Generator(device=device)
            g.manual_seed(tensor_seed(args.seed, name))
            if name.endswith(NORM_SUFFIXES):
                noise = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32)
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.normal_(0.0, std, generator=g)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # Non-persistent buffers (rotary inv_freq) are left uninitialised by to_empty; save_pretrained does not
    # write them, and from_pretrained recomputes them. This model object is only saved, never run.
    t_init = time.perf_counter() - t0

    args.out.mkdir(parents=True, exist_ok=True)
    save_kwargs = {"max_shard_size": args.max_shard_size}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4; 5 writes safetensors only
    model.save_pretrained(args.out, **save_kwargs)
    if args.tokenizer is not None:
        copied = [f for f in TOKENIZER_FILES if (args.tokenizer / f).is_file()]
        if "tokenizer.json" not in copied:
            raise SystemExit(f"--tokenizer {args.tokenizer}: no tokenizer.json there")
        for f in copied:
            shutil.copy2(args.tokenizer / f, args.out / f)
    saved = json.loads((args.out / "config.json").read_text())
    n = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {args.out}: qwen3-{args.geometry} ({saved['num_hidden_layers']} layers, "
        f"{n / 1e9:.2f} B params, tied={saved.get('tie_word_embeddings')}), seed {args.seed}, "
        f"init {t_init:.1f} s on {device}, total {time.perf_counter() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
