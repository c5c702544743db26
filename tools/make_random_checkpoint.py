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
- every projection matrix ~ N(0, 0.02²), the `initializer_range` of the config, as
  transformers itself initialises them;
- the embedding (= the tied lm_head; the lm_head too when untied): row v is
  s · r_v · N(0, 1) with s = --logit-std / √hidden (default 4.0) and a log-normal row
  scale r_v = exp(0.5·N(0, 1) − 0.25) (E[r²] = 1). Why: the logits are
  final_norm(h) · E_v, and |final_norm(h)| ≈ √hidden (unit RMS times norm weights
  ≈ 1), so logit std ≈ √hidden · s. At transformers' 0.02 that is 0.64 on 0.6B: flat
  logits, a Gaussian over 151,936 tokens whose best two are only ~0.2 std apart
  (extreme-value spacing, std/√(2 ln V)), so bf16 rounding (±0.04 there) flips greedy
  decoding every ~10 steps (seen on the H200: near-ties at steps 5, 11, 15). The scale
  alone does not fix that: every logit and every rounding error scales with s, so the
  gap/noise ratio is unchanged; it only makes the numbers look like a trained model's
  (logit std of a few units). What makes near-ties rarer is the row scale: trained
  embeddings have unequal row norms (frequent tokens), the top of the logit
  distribution becomes heavy-tailed, and the best logit stands further apart. Measured
  on a numpy model of the last layer (V = 151,936, H = 1024, isotropic hidden noise
  calibrated to the H200's e_hf; 300 draws each): median top-2 gap 0.16 -> 1.1 logit
  std, i.e. 1.3x -> 3.2x the test's noise bound, and greedy flips between two noisy
  evaluations 7% -> 2-3% of steps. Nothing in the kernels' arithmetic
  gets easier: the same GEMMs, norms and attention, on other numbers;
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

`--logit-std 0` restores transformers' plain N(0, 0.02²) embedding (flat logits).
The init scheme is recorded in OUT/kern_random_init.json; tools/gpu/prepare.py remakes
a checkpoint whose record differs.

OUT must be a new or empty directory (written into, an older checkpoint's shards or
index would be left beside the new ones). Every argument is checked before torch is
imported, so a bad one is a usage error in a second, not after the weights are drawn.

`--layers N` keeps the first N layers (config num_hidden_layers = N), for fast tests.
`--tokenizer DIR` copies the tokenizer files of DIR (tokenizer.json, its config, its
NOTICE) next to the weights.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import re
import shutil
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_config import PRESETS, preset_hf_config  # noqa: E402

NORM_SUFFIXES = ("layernorm.weight", "norm.weight")  # input/post_attention_layernorm, q/k_norm, model.norm
EMBEDDING_NAMES = ("model.embed_tokens.weight", "lm_head.weight")
ROW_SCALE_SIGMA = 0.5  # log-normal spread of the embedding's row norms
INIT_VERSION = 2  # bump when the drawing below changes (tools/gpu/prepare.py remakes older checkpoints)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "generation_config.json", "NOTICE.md", "LICENSE")


def tensor_seed(seed: int, name: str) -> int:
    """Seed of one tensor's generator: independent of construction order, stable across runs."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def init_record(args, cfg) -> dict:
    """What decides the weights (written next to them; prepare.py compares it)."""
    return {"init_version": INIT_VERSION, "geometry": args.geometry, "seed": args.seed, "layers": args.layers,
            "initializer_range": cfg.initializer_range, "logit_std": args.logit_std,
            "row_scale_sigma": ROW_SCALE_SIGMA if args.logit_std else 0.0}


def embedding_std(logit_std: float, hidden: int, initializer_range: float) -> float:
    """Per-element std of the embedding that gives logits of std ≈ logit_std (0: transformers' default)."""
    return logit_std / hidden**0.5 if logit_std else initializer_range


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


def _geometry(text: str) -> str:
    key = text.lower().removeprefix("qwen3-")  # `4b`, `4B`, `qwen3-4b`, `Qwen3-4B`
    if key not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown geometry {text!r}; known: {', '.join(PRESETS)}")
    return key


def _seed(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 0:  # -1 is no "random seed" here: it silently drew a fixed checkpoint
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _shard_size(text: str) -> int | str:
    """--max-shard-size as save_pretrained takes it: bytes, or an integer with KB/MB/GB/KiB/MiB/GiB."""
    t = text.strip()
    if t.isdigit():
        return int(t)  # save_pretrained reads a plain-digits string as no valid size
    # a capital B: save_pretrained reads a lower-case one as bits ("200mb" = 25 MB)
    if not re.fullmatch(r"\d+[KkMmGg][iI]?B", t) or int(re.match(r"\d+", t).group()) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive integer followed by KB, MB, GB, KiB, MiB or GiB "
                                         "(e.g. 5GB, 200MB)")
    return t


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything about the arguments that can be checked before torch is imported (seconds) and the
    weights are drawn and written (minutes for the large geometries)."""
    layers = PRESETS[args.geometry]["num_hidden_layers"]
    if args.layers is not None and not 1 <= args.layers <= layers:
        ap.error(f"--layers {args.layers}: must be in 1..{layers} for {args.geometry}")
    if not (math.isfinite(args.logit_std) and args.logit_std >= 0):
        ap.error(f"--logit-std {args.logit_std}: must be >= 0 (0: transformers' plain initialisation)")
    out: Path = args.out
    if not str(out) or out.exists() and not out.is_dir():
        ap.error(f"--out {str(out)!r}: exists and is not a directory (the checkpoint is a directory)")
    if blocker := next((q for q in out.parents if q.exists() and not q.is_dir()), None):
        ap.error(f"--out {out}: {blocker} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        # save_pretrained would mix the new files with the old (a stale index.json or shards of another
        # geometry, which export_weights.py then reads)
        ap.error(f"--out {out}: a directory that is not empty; remove it or choose a new one")
    if args.tokenizer is not None:
        if not args.tokenizer.is_dir():
            ap.error(f"--tokenizer {args.tokenizer}: not a directory")
        if not (args.tokenizer / "tokenizer.json").is_file():
            ap.error(f"--tokenizer {args.tokenizer}: no tokenizer.json there")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", required=True, type=_geometry, metavar="{" + ",".join(PRESETS) + "}",
                    help="a published Qwen3 dense geometry (also written 4B, qwen3-4b)")
    ap.add_argument("--seed", type=_seed, default=0, help="a non-negative integer (default 0)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N layers (tests)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="directory whose tokenizer files to copy")
    ap.add_argument("--logit-std", type=float, default=4.0,
                    help="target logit std: embedding std = this / sqrt(hidden), log-normal row norms "
                         "(default 4.0; 0 = plain N(0, initializer_range^2))")
    ap.add_argument("--max-shard-size", type=_shard_size, default="5GB",
                    help="shard size for save_pretrained (default 5GB)")
    ap.add_argument("--device", default=None, help="where to initialise (default: cuda if available)")
    args = ap.parse_args(argv)
    check_args(ap, args)

    try:
        import torch
        import transformers
    except ImportError as e:
        raise SystemExit(f"make_random_checkpoint: needs torch and transformers ({e}); run it where they are "
                         "installed (the GPU machine)") from None

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
            elif name in EMBEDDING_NAMES and args.logit_std:
                x = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32)
                u = torch.randn((p.shape[0], 1), generator=g, device=device, dtype=torch.float32)
                row = torch.exp(ROW_SCALE_SIGMA * u - ROW_SCALE_SIGMA**2)  # E[row^2] = 1
                p.copy_(embedding_std(args.logit_std, cfg.hidden_size, std) * row * x)
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
    (args.out / "kern_random_init.json").write_text(json.dumps(init_record(args, cfg), indent=1) + "\n")
    saved = json.loads((args.out / "config.json").read_text())
    n = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {args.out}: qwen3-{args.geometry} ({saved['num_hidden_layers']} layers, "
        f"{n / 1e9:.2f} B params, tied={saved.get('tie_word_embeddings')}), seed {args.seed}, embedding std "
        f"{embedding_std(args.logit_std, cfg.hidden_size, std):.4f} (logit std ~{args.logit_std or 'flat'}), "
        f"init {t_init:.1f} s on {device}, total {time.perf_counter() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
