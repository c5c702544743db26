"""kern-run: Qwen3 caller for kern: chunked prefill, GPU greedy decode, CUDA graphs."""

__version__ = "0.1.0"
