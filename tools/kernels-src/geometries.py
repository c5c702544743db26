"""Qwen3 dense geometries: named presets (real Hugging Face config.json values) and a loader.

A geometry is the subset of an HF ``config.json`` the kernels care about.  The
kernel build (``tools/build_kernels.py --geometry``) accepts either a preset
name below or a path to a ``config.json``.

Values checked against the published Qwen/Qwen3-* configs (2025-04, transformers
4.51): every dense Qwen3 has head_dim 128, 8 kv heads, vocab 151936,
rms_norm_eps 1e-6, rope_theta 1e6, max_position_embeddings 40960.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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


def _p(name, h, nq, i, layers, tie):
    return Geometry(name, h, nq, 8, 128, i, layers, 151936, 1e-6, 1e6, tie)


PRESETS: dict[str, Geometry] = {
    g.name: g
    for g in (
        _p("0.6b", 1024, 16, 3072, 28, True),
        _p("1.7b", 2048, 16, 6144, 28, True),
        _p("4b", 2560, 32, 9728, 36, True),
        _p("8b", 4096, 32, 12288, 36, False),
        _p("14b", 5120, 40, 17408, 40, False),
        _p("32b", 5120, 64, 25600, 64, False),
    )
}


def load_geometry(spec: str) -> Geometry:
    """A preset name (``4b``, case-insensitive, optional ``qwen3-`` prefix) or a config.json path."""
    key = spec.lower().removeprefix("qwen3-")
    if key in PRESETS:
        g = PRESETS[key]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"geometry {spec!r}: not a preset ({', '.join(PRESETS)}) and not a file")
        cfg = json.loads(path.read_text())
        nq = cfg["num_attention_heads"]
        g = Geometry(
            name=path.parent.name or path.stem,
            hidden_size=cfg["hidden_size"],
            num_attention_heads=nq,
            num_key_value_heads=cfg.get("num_key_value_heads", nq),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // nq,
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 1e6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
    g.check()
    return g
