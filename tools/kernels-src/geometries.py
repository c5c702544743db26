"""Qwen3 dense geometries: named presets (real Hugging Face config.json values) and a loader.

A geometry is the subset of an HF ``config.json`` the kernels care about.  The
kernel build (``tools/build_kernels.py --geometry``) accepts either a preset
name below or a path to a ``config.json``.

The values come from tools/qwen3_config.py (the published Qwen/Qwen3-* configs):
every dense Qwen3 has head_dim 128, 8 kv heads, vocab 151936, rms_norm_eps 1e-6,
rope_theta 1e6, max_position_embeddings 40960.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tools/, for qwen3_config
from qwen3_config import PRESETS as QWEN3_PRESETS  # noqa: E402
from qwen3_config import ConfigError, Qwen3Config, load_config, preset_hf_config  # noqa: E402

__all__ = ["Geometry", "PRESETS", "check", "load_geometry"]


#: A geometry is a `qwen3_config.Qwen3Config` (the fields the kernels read: hidden_size,
#: num_attention_heads, num_key_value_heads, head_dim, intermediate_size, ...).
Geometry = Qwen3Config


def check(g: Geometry) -> None:
    """Refuse geometries the kernels cannot serve (a clear message, not a bad cubin).

    Raises:
        ValueError: naming the geometry and every limit it breaks.
    """
    errs = []
    if g.head_dim != 128:
        errs.append(f"head_dim {g.head_dim} != 128 (the attention kernels are built for D=128)")
    if g.num_attention_heads % g.num_key_value_heads:
        errs.append("num_attention_heads must be a multiple of num_key_value_heads")
    elif g.num_attention_heads // g.num_key_value_heads > 16:
        errs.append("GQA group size NQ/NKV must be <= 16")
    for f in ("hidden_size", "intermediate_size"):
        if getattr(g, f) % 16:
            errs.append(f"{f} {getattr(g, f)} must be a multiple of 16")
    if g.hidden_size > 16384:
        errs.append("hidden_size must be <= 16384")
    if errs:
        raise ValueError(f"geometry {g.name}: " + "; ".join(errs))


#: The six published Qwen3 dense geometries, from the one list of their config.json values
#: (tools/qwen3_config.py, which the manifest generator reads too).
PRESETS: dict[str, Geometry] = {name: Qwen3Config.from_hf(preset_hf_config(name), name=name) for name in QWEN3_PRESETS}


def load_geometry(spec: str) -> Geometry:
    """A preset name (``4b``, case-insensitive, optional ``qwen3-`` prefix) or a config.json path
    (read by tools/qwen3_config.py: both the transformers 4 ``rope_theta`` and the transformers 5
    ``rope_parameters`` forms)."""
    key = spec.lower().removeprefix("qwen3-")
    if key in PRESETS:
        g = PRESETS[key]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"geometry {spec!r}: not a preset ({', '.join(PRESETS)}) and not a file")
        try:
            g = load_config(path)
        except ConfigError as e:
            raise ValueError(f"geometry {spec!r}: {e}") from None
    check(g)
    return g
