"""kern-driver: Runtime: executes a verified kern manifest on a GPU through the CUDA driver API."""

__version__ = "0.1.0"
