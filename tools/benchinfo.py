"""What every benchmark table records about where it ran (the commit), and the KV capacity the decode
benchmarks size their runtime with (stdlib only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The short commit of the measured code: ``$KERN_COMMIT`` when set (the GPU machine's copy of
    ``.git`` can be older than the working tree it runs), else ``git rev-parse --short HEAD``,
    else ``unknown``."""
    if os.environ.get("KERN_COMMIT"):
        return os.environ["KERN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def kv_capacity(context: int, steps: int) -> int:
    """KV-cache tokens for a benchmark run: the prompt and every decode step, rounded up to a 16-token page,
    and at least 4,096 (the 2,048-token prefill benchmarks and short runs keep the size they always had)."""
    return max(4096, -(-(context + steps) // 16) * 16)
