"""kern-run: Qwen3 caller for kern: chunked prefill, GPU greedy decode, CUDA graphs."""

from .generator import (GenerationStats, KernRunError, ManifestInfo, Qwen3Session, StepToken, check_request,
                        generate)
from .stream import TextStream, load_tokenizer

__version__ = "0.3.0"

__all__ = ["GenerationStats", "KernRunError", "ManifestInfo", "Qwen3Session", "StepToken", "TextStream",
           "check_request", "generate", "load_tokenizer"]
