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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tools/, for qwen3_config
from qwen3_config import PRESETS as QWEN3_PRESETS  # noqa: E402
from qwen3_config import ConfigError, Qwen3Config, load_config, preset_hf_config  # noqa: E402

__all__ = ["Geometry", "PRESETS", "load_geometry"]


@dataclass(frozen=True)
class Geometry:
    name: str
    hidden_size: int  # H
    num_attention_heads: int  # NQ
    num_key_value_heads: int  # NKV
    head_dim: int  # D
    intermediate_size: int  # I
    num_hidden_layers: int  # L
    vocab_size: int  # V
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool

    def check(self) -> None:
        """Refuse geometries the kernels cannot serve (clear message, not a bad cubin)."""
        errs = []
        if self.head_dim != 128:
            errs.append(f"head_dim {self.head_dim} != 128 (the attention kernels are built for D=128)")
        if self.num_attention_heads % self.num_key_value_heads:
            errs.append("num_attention_heads must be a multiple of num_key_value_heads")
        elif self.num_attention_heads // self.num_key_value_heads > 16:
            errs.append("GQA group size NQ/NKV must be <= 16")
        for f in ("hidden_size", "intermediate_size"):
            if getattr(self, f) % 16:
                errs.append(f"{f} {getattr(self, f)} must be a multiple of 16")
        if self.hidden_size > 16384:
            errs.append("hidden_size must be <= 16384")
        if errs:
            raise ValueError(f"geometry {self.name}: " + "; ".join(errs))


def _from_config(c) -> Geometry:
    return Geometry(c.name, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                    c.intermediate_size, c.num_hidden_layers, c.vocab_size, c.rms_norm_eps, c.rope_theta,
                    c.tie_word_embeddings)


#: The six published Qwen3 dense geometries, from the one list of their config.json values
#: (tools/qwen3_config.py, which the manifest generator reads too).
PRESETS: dict[str, Geometry] = {
    name: _from_config(Qwen3Config.from_hf(preset_hf_config(name), name=name)) for name in QWEN3_PRESETS
}


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
            g = _from_config(load_config(path))
        except ConfigError as e:
            raise ValueError(f"geometry {spec!r}: {e}") from None
    g.check()
    return g
