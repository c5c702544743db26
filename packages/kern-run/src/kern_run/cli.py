"""kern-run: generate tokens for a Qwen3 manifest on the GPU.

    kern-run --manifest examples/qwen3-0.6b.json --kernels kernels \\
             --weights weights/qwen3-0.6b.safetensors --prompt "The capital of France is"

Generated text goes to stdout as it is produced; the runtime description,
graph captures and timings go to stderr. kern-run's own checks fail with one line;
errors from loading (modules, weights, verification, no GPU) list each problem, then
`at …` and `hint: …`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .generator import GenerationStats, KernRunError, ManifestInfo, Qwen3Session, check_request
from .stream import TextStream, load_tokenizer

DEFAULT_TOKENIZER = Path("examples") / "tokenizer" / "tokenizer.json"
EOS_TOKENS = ("<|endoftext|>", "<|im_end|>")
DEFAULT_CHUNK = 512
DEFAULT_CAPACITY = 4096


def find_default_tokenizer() -> Path | None:
    """The tokenizer shipped in the kern checkout: examples/tokenizer/tokenizer.json.

    Looked for above the current directory, then above this file (a source checkout).
    """
    if env := os.environ.get("KERN_TOKENIZER"):
        return Path(env)
    for base in (Path.cwd(), Path(__file__).resolve()):
        for d in (base, *base.parents):
            if (d / DEFAULT_TOKENIZER).is_file():
                return d / DEFAULT_TOKENIZER
    return None


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise KernRunError(f"--prompt-ids must be integers separated by commas, got {text!r}") from None
    if not ids:
        raise KernRunError("--prompt-ids is empty: give at least one token id")
    return ids


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kern-run",
        description="Generate tokens for a Qwen3 kern manifest: chunked prefill, greedy decode on the GPU, CUDA graphs.",
    )
    p.add_argument("--manifest", required=True, type=Path, help="the manifest JSON (e.g. examples/qwen3-4b.json)")
    p.add_argument("--kernels", required=True, type=Path, help="directory holding the manifest's cubins")
    p.add_argument("--weights", required=True, type=Path, action="append",
                   help="kern weights (.safetensors, from tools/export_weights.py); repeat it to load several files "
                        "(e.g. a --no-screened-head export and, beside it, the screened lm_head's --only-screened-head file): "
                        "together they must hold exactly the manifest's weight buffers")
    p.add_argument("--tokenizer", type=Path,
                   help="tokenizer.json (default with --prompt: the shipped examples/tokenizer/tokenizer.json)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (encoded with the tokenizer)")
    src.add_argument("--prompt-ids", metavar="IDS", help="prompt token ids, e.g. 785,6722,315")
    p.add_argument("--steps", type=int, default=64, help="new tokens to generate (default 64)")
    p.add_argument("--chunk", type=int,
                   help=f"prefill chunk length, at most the manifest's `tokens` max (default {DEFAULT_CHUNK})")
    p.add_argument("--capacity", type=int,
                   help=f"KV capacity in tokens: prompt + steps must fit (default {DEFAULT_CAPACITY})")
    p.add_argument("--eager", action="store_true", help="launch kernel by kernel instead of replaying CUDA graphs")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    p.add_argument("--stop-at-eos", action="store_true", help="stop at <|endoftext|> or <|im_end|> (needs a tokenizer)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the runtime description")
    return p


def log(msg: str = "") -> None:
    print(msg, file=sys.stderr, flush=True)


def format_stats(s: GenerationStats, graph: bool) -> list[str]:
    chunks = "+".join(str(n) for n in s.prefill_chunks)
    n = len(s.prefill_chunks)
    how = (f"prefill {chunks} tokens in {n} chunk{'s' if n > 1 else ''}, then the last through decode" if n
           else "decode only")
    lines = [f"prompt: {s.prompt_tokens} tokens in {1e3 * s.prefill_s:.1f} ms, "
             f"{s.prefill_tok_s:,.0f} tok/s ({how}; time to first token)"]
    if s.decode_steps:
        lines.append(f"decode: {s.decode_steps} tokens in {1e3 * s.decode_s:.1f} ms, {s.decode_ms_per_token:.3f} ms/token, "
                     f"{s.decode_tok_s:,.1f} tok/s ({'CUDA graph' if graph else 'eager'})")
    return lines


def run(args: argparse.Namespace) -> int:
    for flag, path, is_dir in (("--manifest", args.manifest, False), ("--kernels", args.kernels, True),
                               *(("--weights", w, False) for w in args.weights)):
        if not (path.is_dir() if is_dir else path.is_file()):
            raise KernRunError(f"{flag}: {'directory' if is_dir else 'file'} not found: {path}")
    if args.steps < 1:
        raise KernRunError(f"--steps must be >= 1 (got {args.steps})")
    if args.capacity is not None and args.capacity < 1:
        raise KernRunError(f"--capacity must be >= 1 (got {args.capacity})")
    if args.chunk is not None and args.chunk < 1:
        raise KernRunError(f"--chunk must be >= 1 (got {args.chunk})")

    info = ManifestInfo.read(args.manifest)

    tok_path = args.tokenizer
    if tok_path is None and args.prompt is not None:
        tok_path = find_default_tokenizer()
        if tok_path is None:
            raise KernRunError("--prompt needs a tokenizer: pass --tokenizer tokenizer.json (or use --prompt-ids)")
    tokenizer = load_tokenizer(tok_path) if tok_path is not None else None
    if args.stop_at_eos and tokenizer is None:
        raise KernRunError("--stop-at-eos needs a tokenizer (--tokenizer)")

    if args.prompt is not None:
        prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
        if not prompt_ids:
            raise KernRunError("the prompt is empty: give at least one token")
    else:
        prompt_ids = parse_ids(args.prompt_ids)

    # Explicit values above what the manifest allows are clamped with a note; defaults silently.
    if args.capacity is not None and args.capacity > info.max_positions:
        log(f"note: --capacity {args.capacity} is more than this manifest addresses; using {info.max_positions}")
    capacity = min(args.capacity or DEFAULT_CAPACITY, info.max_positions)
    check_request(info, capacity, prompt_ids, args.steps)  # before loading anything onto the GPU
    if args.chunk is not None and args.chunk > info.tokens_max:
        log(f"note: --chunk {args.chunk} is more than the manifest's `tokens` max; using {info.tokens_max}")
    chunk = min(args.chunk or DEFAULT_CHUNK, info.tokens_max)

    try:
        from kern_driver import KernDriverError, Runtime
    except ImportError as e:
        raise KernRunError(f"kern-driver cannot be imported ({e}); on a GPU machine install kern-driver") from None

    graph = not args.eager
    try:
        t0 = time.perf_counter()
        weights = args.weights[0] if len(args.weights) == 1 else args.weights
        rt = Runtime.load(args.manifest, args.kernels, weights, device=args.device, capacity_tokens=capacity)
        log(f"loaded {info.model or args.manifest.name} in {time.perf_counter() - t0:.2f} s")
        try:
            if not args.quiet:
                log(rt.describe().rstrip())
            session = Qwen3Session(rt, info, capacity=capacity, graph=graph)
            tokens = session.generate(prompt_ids, args.steps, chunk)  # checks before running anything
            n_prefill = len(prompt_ids) - 1
            for name, secs in session.warmup(chunk if n_prefill >= chunk else None).items():
                log(f"graph: {name} captured in {1e3 * secs:.1f} ms")
            log(f"generating {args.steps} tokens after a {len(prompt_ids)}-token prompt "
                f"(chunk {chunk}, {'CUDA graphs' if graph else 'eager'})")
            log()
            stopped = _stream(tokens, prompt_ids, tokenizer, args.stop_at_eos)
            log()
            for line in format_stats(session.stats, graph):
                log(line)
            if stopped:
                log(f"stopped at {stopped}")
        finally:
            rt.close()
    except KernDriverError as e:
        raise KernRunError(str(e)) from None
    return 0


def _stream(tokens, prompt_ids, tokenizer, stop_at_eos: bool) -> str | None:
    out = sys.stdout
    if tokenizer is None:
        out.write(" ".join(map(str, prompt_ids)) + " |")
        out.flush()
        for t in tokens:
            out.write(f" {t}")
            out.flush()
        out.write("\n")
        return None
    eos = {tokenizer.token_to_id(t) for t in EOS_TOKENS} - {None} if stop_at_eos else set()
    out.write(tokenizer.decode(prompt_ids, skip_special_tokens=False))
    out.flush()
    stream = TextStream(tokenizer)
    stopped = None
    for t in tokens:
        if t in eos:
            stopped = tokenizer.id_to_token(t)
            break
        if text := stream.push(t):
            out.write(text)
            out.flush()
    out.write(stream.flush() + "\n")
    out.flush()
    return stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KernRunError as e:
        print(f"kern-run: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nkern-run: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
