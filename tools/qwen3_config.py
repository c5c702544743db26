"""Qwen3 dense configuration: the real Hugging Face presets and a strict config.json reader.

Shared by the provider tools (`gen_qwen3.py`, `export_weights.py`,
`make_random_checkpoint.py`). Every geometry number the manifest or the weights
depend on comes from here; none is a constant baked for one model.

`PRESETS` holds the published `config.json` of each Qwen/Qwen3-* dense model
(transformers 4.51 format, 2025-04). `Qwen3Config.from_hf` accepts those and the
transformers 5 form (`rope_parameters` instead of `rope_theta`), and refuses what
the kern Qwen3 provider cannot serve (another architecture, attention biases,
sliding windows, scaled rotary) with a message naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "Qwen3Config", "PRESETS", "preset_hf_config", "load_config", "KV_PAGE_TOKENS"]

#: Tokens per KV page (tools/README.md "KV layout": `[page][layer][NKV][16 tokens][k|v][D]`, rows swizzled).
KV_PAGE_TOKENS = 16

BF16_BYTES = 2


class ConfigError(ValueError):
    """A config.json the Qwen3 provider cannot serve; the message names the field."""


#: The JSON types a field may have, in words (for messages).
_EXPECTED = {int: "an integer", (int, float): "a number", bool: "a boolean (true or false)",
             dict: "an object", list: "a list"}


def _json_kind(v: Any) -> str:
    """What a JSON value is, in words."""
    if v is None:
        return "null"
    for typ, words in ((bool, "a boolean"), (int, "an integer"), (float, "a decimal number"), (str, "a string"),
                       (list, "a list"), (dict, "an object")):
        if isinstance(v, typ):
            return words
    return type(v).__name__


def _json_text(v: Any, limit: int = 60) -> str:
    """The value as config.json spells it (cut at ``limit`` characters)."""
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_type(where: str, key: str, v: Any, typ: type | tuple[type, ...]) -> Any:
    """``v`` when it is a ``typ`` (a JSON boolean is no number), else a ConfigError naming the field,
    the type expected in words and the value given."""
    if (isinstance(v, bool) and typ is not bool) or not isinstance(v, typ):
        kind = "" if v is None else f" ({_json_kind(v)})"
        raise ConfigError(f"{where}: field `{key}` must be {_EXPECTED[typ]}, got {_json_text(v)}{kind}")
    return v


def _hf(hidden: int, heads: int, inter: int, layers: int, tie: bool) -> dict[str, Any]:
    # Fields every published Qwen3 dense config.json shares (Qwen/Qwen3-0.6B ... Qwen3-32B).
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": tie,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


#: name -> the model's published config.json (as a dict).
PRESETS: dict[str, dict[str, Any]] = {
    "0.6b": _hf(1024, 16, 3072, 28, True),
    "1.7b": _hf(2048, 16, 6144, 28, True),
    "4b": _hf(2560, 32, 9728, 36, True),
    "8b": _hf(4096, 32, 12288, 36, False),
    "14b": _hf(5120, 40, 17408, 40, False),
    "32b": _hf(5120, 64, 25600, 64, False),
}


def preset_hf_config(name: str) -> dict[str, Any]:
    """A copy of the published config.json of preset `name` (`4b`, `qwen3-4b`, `Qwen3-4B`)."""
    key = name.lower().removeprefix("qwen3-")
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return json.loads(json.dumps(PRESETS[key]))


@dataclass(frozen=True)
class Qwen3Config:
    """The geometry of a Qwen3 dense model (tools/README.md names: H, NQ, NKV, D, I, L, V)."""

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
    max_position_embeddings: int

    # -- derived sizes (elements unless the name says bytes) --

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        """N = NQ*D + 2*NKV*D: rows of the fused qkv weight, columns of the qkv activation."""
        return self.q_size + 2 * self.kv_size

    @property
    def kv_token_layer_bytes(self) -> int:
        """One token of one layer in the KV state: NKV heads × (k|v) × D × bf16."""
        return self.num_key_value_heads * 2 * self.head_dim * BF16_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        """`bytes_per_token` of the `kv` state: L × NKV × 2 × D × 2."""
        return self.num_hidden_layers * self.kv_token_layer_bytes

    @property
    def kv_layer_block_bytes(self) -> int:
        """One layer's block inside a page (16 tokens): 65,536 for NKV=8, D=128."""
        return KV_PAGE_TOKENS * self.kv_token_layer_bytes

    @property
    def kv_page_bytes(self) -> int:
        """One page: every layer's 16-token block, `L * kv_layer_block_bytes`."""
        return self.num_hidden_layers * self.kv_layer_block_bytes

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], *, name: str, where: str = "config.json") -> Qwen3Config:
        """Read an HF Qwen3 config dict strictly. Raises ConfigError naming the field at fault."""

        def field(key: str, typ: type | tuple[type, ...]) -> Any:
            if key not in cfg:
                raise ConfigError(f"{where}: missing field `{key}`")
            return _check_type(where, key, cfg[key], typ)

        archs = cfg.get("architectures") or []
        if "model_type" not in cfg and "Qwen3ForCausalLM" in archs:
            raise ConfigError(f"{where}: missing field `model_type` (a Qwen3ForCausalLM config has "
                              f"\"model_type\": \"qwen3\")")
        if cfg.get("model_type") != "qwen3" or "Qwen3ForCausalLM" not in archs:
            raise ConfigError(
                f"{where}: unsupported architecture (model_type={cfg.get('model_type')!r}, "
                f"architectures={archs!r}); the kern Qwen3 provider serves `Qwen3ForCausalLM` (model_type `qwen3`)"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{where}: field `hidden_act` = {cfg['hidden_act']!r}; only `silu` is supported")
        if cfg.get("attention_bias", False):
            raise ConfigError(f"{where}: field `attention_bias` is true; q/k/v/o biases are not supported")
        if cfg.get("use_sliding_window", False):
            raise ConfigError(f"{where}: field `use_sliding_window` is true; sliding-window attention is not supported")
        layer_types = cfg.get("layer_types")
        if layer_types is not None:
            _check_type(where, "layer_types", layer_types, list)
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise ConfigError(f"{where}: field `layer_types` has non-`full_attention` layers; not supported")

        # Rotary: transformers 4 writes `rope_theta` (+ `rope_scaling`), transformers 5 `rope_parameters`.
        rope = cfg.get("rope_parameters")
        if rope is not None:
            _check_type(where, "rope_parameters", rope, dict)
            if "rope_theta" not in rope:
                raise ConfigError(f"{where}: field `rope_parameters` has no `rope_theta`")
            if rope.get("rope_type", "default") != "default":
                raise ConfigError(
                    f"{where}: field `rope_parameters.rope_type` = {rope['rope_type']!r}; "
                    "only plain rotary is supported"
                )
            theta = _check_type(where, "rope_parameters.rope_theta", rope["rope_theta"], (int, float))
        else:
            theta = field("rope_theta", (int, float))
            scaling = cfg.get("rope_scaling")
            if scaling is not None:
                _check_type(where, "rope_scaling", scaling, dict)
            if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
                raise ConfigError(f"{where}: field `rope_scaling` = {scaling!r}; only plain rotary is supported")

        nq = field("num_attention_heads", int)
        c = cls(
            name=name,
            hidden_size=field("hidden_size", int),
            num_attention_heads=nq,
            num_key_value_heads=field("num_key_value_heads", int),
            head_dim=field("head_dim", int),
            intermediate_size=field("intermediate_size", int),
            num_hidden_layers=field("num_hidden_layers", int),
            vocab_size=field("vocab_size", int),
            rms_norm_eps=float(field("rms_norm_eps", (int, float))),
            rope_theta=float(theta),
            tie_word_embeddings=_check_type(where, "tie_word_embeddings", cfg.get("tie_word_embeddings", False), bool),
            max_position_embeddings=field("max_position_embeddings", int),
        )
        for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "num_hidden_layers", "vocab_size", "max_position_embeddings"):
            if getattr(c, key) <= 0:
                raise ConfigError(f"{where}: field `{key}` = {getattr(c, key)} must be positive")
        if not (c.rms_norm_eps > 0 and c.rms_norm_eps < float("inf")):  # also NaN
            raise ConfigError(f"{where}: field `rms_norm_eps` = {c.rms_norm_eps} must be a positive finite number "
                              "(the RMS norm divides by sqrt(mean(x^2) + eps))")
        if nq % c.num_key_value_heads:
            raise ConfigError(
                f"{where}: field `num_attention_heads` = {nq} is not a multiple of "
                f"`num_key_value_heads` = {c.num_key_value_heads}"
            )
        if c.head_dim % 2:
            raise ConfigError(f"{where}: field `head_dim` = {c.head_dim} must be even (rotate-half rotary)")
        return c

    @classmethod
    def preset(cls, name: str) -> Qwen3Config:
        key = name.lower().removeprefix("qwen3-")
        return cls.from_hf(preset_hf_config(key), name=f"qwen3-{key}", where=f"preset {key}")


def load_config(path: str | Path, *, name: str | None = None) -> Qwen3Config:
    """Read a config.json (or a checkpoint directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p}: not a JSON object")
    return Qwen3Config.from_hf(cfg, name=name or p.parent.name or "qwen3", where=str(p))
