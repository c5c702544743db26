"""kern-verify: Verifier for kern manifests: every rule, rustc-style diagnostics, static cubin checks without a GPU."""

__version__ = "0.1.0"
