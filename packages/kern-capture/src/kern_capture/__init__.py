"""kern-capture: CUPTI injection library that dumps the kernels and launches of any CUDA program."""

__version__ = "0.1.0"
