"""kern-run: Qwen3 caller for kern: chunked prefill, GPU greedy decode, CUDA graphs."""

from .generator import GenerationStats, KernRunError, ManifestInfo, Qwen3Session, check_request, generate
from .stream import TextStream, load_tokenizer

__version__ = "0.2.1"

__all__ = ["GenerationStats", "KernRunError", "ManifestInfo", "Qwen3Session", "TextStream", "check_request",
           "generate", "load_tokenizer"]
