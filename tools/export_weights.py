#!/usr/bin/env python3
"""Export a Hugging Face Qwen3 checkpoint to one kern weights file (safetensors).

Usage::

    python tools/export_weights.py CHECKPOINT_DIR --out W.safetensors [--rope-positions 40960]
                                   [--no-screened-head | --only-screened-head]

CHECKPOINT_DIR holds `config.json` and either `model.safetensors` or the shards
listed by `model.safetensors.index.json`. The output follows the provider contract
(tools/README.md), tensor by tensor:

- `model.layers.{l}.self_attn.qkv_proj.weight` [NQ*D + 2*NKV*D, H]: q rows, k rows, v rows;
- `model.layers.{l}.mlp.gate_up_proj.weight` [2I, H]: gate rows, then up rows;
- every other weight under its HF name (norms, o/down projections, embedding, final norm);
- `lm_head.weight` only when `tie_word_embeddings` is false (tied: the manifest passes
  `model.embed_tokens.weight` to the lm_head GEMM, so nothing is duplicated);
- `rope.cos_sin` f32 [positions, D]: row p is cos(p·f_0..f_{D/2-1}) then sin(...), with
  f_j = rope_theta^(-2j/D) computed as transformers does (float32 inverse frequencies,
  float32 angle p·f_j), the cos/sin of that angle evaluated in float64 and rounded to f32;
- by default (for a `gen_qwen3.py --lm-head screened` manifest, the default since session 24; `--no-screened-head`
  leaves them out, for a `--lm-head dense` manifest: kern binds a weights file to a manifest exactly and refuses a
  tensor the manifest does not declare), `lm_head.screen.q8` i8 [V, H] and `lm_head.screen.rows` f32 [V, 4]:
  derived from the head (`lm_head.weight`, or `model.embed_tokens.weight` when tied, as
  written here in bf16) for the screened greedy lm_head (kernels-src/lm_head_screen.cu):
  an int8 copy q of each row w and a float4 (s, e, nw, snq) per row: its scale s, the
  copy's error e ≥ ‖w − s·q‖₂, nw ≥ ‖w‖₂ and snq ≥ s·‖q‖₂ (rounded up), so that for any x
  and any x̃ (the kernel's dequantized x) |x·w − s·(x̃·q)| ≤ ‖x − x̃‖₂·nw + ‖x̃‖₂·e, nw and
  snq also bounding the fp32 rounding of either dot product (`screen_head_rows` has the
  definitions). A row holding a non-finite weight gets q = 0 and all four NaN (always a
  candidate). Computed a few hundred rows at a time; the file's metadata says
  `screened_head` (true/false).
  `--only-screened-head` writes these two tensors alone (a file loaded beside a
  `--no-screened-head` export, for a manifest that declares them; metadata
  `screened_head_only`: true).

numpy only, no torch: bf16 is moved as raw 16-bit words. float32 and float16
checkpoints are converted to bf16 with round-to-nearest-even (what torch's
`.to(torch.bfloat16)` does; NaN becomes the canonical quiet NaN); other dtypes are
refused. Concatenating row-major tensors along their rows is concatenating their
bytes, so the export streams: each tensor is copied in chunks of at most 64 MiB
straight from the source file to the output, and an 8 GB checkpoint needs no 8 GB of
RAM. Everything is checked before a byte is written (every tensor present, its
shape what config.json implies, its dtype supported, nothing unexpected left over),
the output is written to a temporary file beside `--out` and renamed into place at
the end, so a failed or interrupted export (a full disk included: the free space is
checked first) leaves nothing half-written, and no temporary file or folder made for
`--out`. `--out` is a file path, never one of the checkpoint's own files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_config import ConfigError, Qwen3Config  # noqa: E402

__all__ = ["ExportError", "SafetensorsFile", "Checkpoint", "plan_export", "export", "rope_cos_sin", "f32_to_bf16",
           "screen_head_rows", "main"]

CHUNK_BYTES = 64 << 20

#: safetensors dtype -> (numpy dtype of the stored words, element size)
_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),  # raw bf16 words
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
}

#: dtypes the export writes -> numpy dtype of the written elements
_OUT_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),  # raw bf16 words
    "F32": np.dtype("<f4"),
    "I8": np.dtype("i1"),
}

#: the screened lm_head's derived tensors (after `rope.cos_sin`, in this order)
SCREEN_Q8 = "lm_head.screen.q8"
SCREEN_ROWS = "lm_head.screen.rows"
#: the `screened_head_rows` metadata: the columns of SCREEN_ROWS (a reader of an older table can tell it apart)
SCREEN_ROWS_FORMAT = "s,e,nw,snq"


#: bytes per element of every safetensors dtype with whole-byte elements (the header's spans are checked against it)
_DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}


class ExportError(ValueError):
    """The checkpoint cannot be exported; the message names the tensor or file at fault."""


# ---------------------------------------------------------------------------------------
# Reading safetensors without a framework: an 8-byte little-endian header length, a JSON
# header {name: {dtype, shape, data_offsets: [begin, end]}}, then the data.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors spelling: BF16, F16, F32, ...
    shape: tuple[int, ...]
    path: Path
    start: int  # absolute byte offsets in `path`
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class SafetensorsFile:
    """The header of one safetensors file and raw access to its tensors.

    The header is checked whole (every entry an object with a dtype, a shape of
    non-negative integers and data_offsets [begin, end] inside the file, the byte span
    matching dtype × shape, no two tensors' bytes overlapping), so that a damaged or
    truncated file is named here, before anything is written.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        damaged = "the file is damaged (an interrupted download or copy?): fetch it again"
        with _reading(self.path, "a safetensors file"), open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) != 8:
                raise ExportError(f"{self.path}: not a safetensors file ({size} bytes, shorter than the "
                                  f"8-byte header length); {damaged}")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ExportError(f"{self.path}: not a safetensors file (header length {n} runs past the end "
                                  f"of the file, {size} bytes); {damaged}")
            raw = f.read(n)
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ExportError(f"{self.path}: not a safetensors file (header is not JSON: {e})") from None
        if not isinstance(header, dict):
            raise ExportError(f"{self.path}: not a safetensors file (header is a JSON {type(header).__name__}, "
                              "not an object)")
        meta = header.pop("__metadata__", None)
        self.metadata: dict[str, str] = meta if isinstance(meta, dict) else {}
        base = 8 + n
        self.tensors: dict[str, TensorInfo] = {}
        spans: list[tuple[int, int, str]] = []
        for name, h in header.items():
            at = f"{self.path}: tensor `{name}`"
            if not isinstance(h, dict):
                raise ExportError(f"{at}: header entry {h!r} is not an object; {damaged}")
            dtype, shape, offsets = h.get("dtype"), h.get("shape"), h.get("data_offsets")
            if not isinstance(dtype, str):
                raise ExportError(f"{at}: header entry has no dtype string (dtype={dtype!r}); {damaged}")
            if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
                raise ExportError(f"{at}: shape {shape!r} is not a list of non-negative integers; {damaged}")
            if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
                    or offsets[0] > offsets[1]):
                raise ExportError(f"{at}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end; "
                                  f"{damaged}")
            b, e = offsets
            if base + e > size:
                raise ExportError(f"{at}: its data ends at byte {base + e}, but the file has only {size} bytes: "
                                  f"truncated; {damaged}")
            item = _DTYPE_SIZES.get(dtype)
            if item is not None and e - b != math.prod(shape) * item:
                raise ExportError(f"{at}: data_offsets {offsets} span {e - b} bytes, but {dtype} {shape} is "
                                  f"{math.prod(shape) * item} bytes; {damaged}")
            spans.append((b, e, name))
            self.tensors[name] = TensorInfo(name, dtype, tuple(shape), self.path, base + b, base + e)
        spans.sort()
        reach, owner = 0, ""
        for b, e, name in spans:  # each tensor must begin at or after every earlier one ends
            if b < reach and b < e:
                raise ExportError(f"{self.path}: tensors `{owner}` and `{name}` overlap (`{name}` begins at data "
                                  f"offset {b}, before `{owner}` ends at {reach}); {damaged}")
            if e > reach:
                reach, owner = e, name

    def array(self, name: str) -> np.ndarray:
        """A read-only memory map of tensor `name` (bf16 as uint16 words)."""
        t = self.tensors[name]
        dt = _DTYPES.get(t.dtype)
        if dt is None:
            raise ExportError(f"tensor `{name}` in {self.path.name}: dtype {t.dtype} is not supported here")
        if t.nbytes == 0:
            return np.zeros(t.shape, dt)
        return np.memmap(self.path, dtype=dt, mode="r", offset=t.start, shape=t.shape)


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@contextlib.contextmanager
def _reading(path: Path, what: str) -> Iterator[None]:
    """Reads of `path` (`what` it should be, e.g. "a JSON file") inside the block: an OSError becomes an ExportError
    naming the file (missing, a directory, or unreadable and why)."""
    try:
        yield
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ExportError(f"{path}: a directory, not {what}") from None
    except OSError as e:
        raise ExportError(f"{path}: cannot read it: {e.strerror or e}") from None


def _read_json(path: Path) -> object:
    """The JSON value in `path`; ExportError naming the file when it cannot be read or parsed."""
    with _reading(path, "a JSON file"):
        data = path.read_bytes()
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not JSON ({e}); damaged or cut short?") from None


def _read_config(path: Path, name: str) -> Qwen3Config:
    """config.json, strictly: what qwen3_config checks, and the field types it leaves to its callers."""
    raw = _read_json(path)
    if not isinstance(raw, dict):
        raise ExportError(f"{path}: not a JSON object (a JSON {type(raw).__name__})")
    q = raw.get("quantization_config")
    if q is not None:
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise ExportError(f"{path}: field `quantization_config` (quant_method {method!r}): a quantized checkpoint; "
                          "kern exports bf16, f16 or f32 checkpoints (use the unquantized release)")
    # Types the reader below relies on without checking (a wrong one was a traceback or a silent misread).
    typed: list[tuple[str, tuple[type, ...], str]] = [
        ("architectures", (list,), "a list of class names"),
        ("rope_scaling", (dict,), "an object or null"),
        ("rope_parameters", (dict,), "an object or null"),
        ("layer_types", (list,), "a list or null"),
        ("tie_word_embeddings", (bool,), "true or false"),
    ]
    for key, types, what in typed:
        v = raw.get(key)
        if v is not None and not isinstance(v, types):
            raise ExportError(f"{path}: field `{key}` = {v!r} is not {what}")
    rope = raw.get("rope_parameters")
    if rope is not None:
        key, theta = "rope_parameters.rope_theta", rope.get("rope_theta")
    else:
        key, theta = "rope_theta", raw.get("rope_theta")
    if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float))):
        raise ExportError(f"{path}: field `{key}` = {theta!r} is not a number (Qwen3: 1000000)")
    try:
        cfg = Qwen3Config.from_hf(raw, name=name, where=str(path))
    except ConfigError as e:
        raise ExportError(str(e)) from None
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:  # a type from_hf does not expect
        raise ExportError(f"{path}: a field has a value of an unexpected type ({type(e).__name__}: {e})") from None
    if not (math.isfinite(cfg.rope_theta) and cfg.rope_theta > 0):
        raise ExportError(f"{path}: field `{key}` = {cfg.rope_theta!r} must be a positive number "
                          "(Qwen3: 1000000)")
    return cfg


class Checkpoint:
    """An HF checkpoint directory: config.json plus one safetensors file or an indexed set of shards."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            if self.dir.is_file():
                raise ExportError(f"{self.dir}: a file; CHECKPOINT is the HF checkpoint directory "
                                  f"(holding config.json and the safetensors), e.g. {self.dir.parent}")
            raise ExportError(f"{self.dir}: no such directory")
        config = self.dir / "config.json"
        if not config.exists():
            raise ExportError(f"{config}: no such file; CHECKPOINT must be an HF checkpoint directory holding "
                              "config.json and model.safetensors (or model.safetensors.index.json and its shards)")
        self.config: Qwen3Config = _read_config(config, self.dir.name or "qwen3")
        #: every file the export reads (config.json, the index, the shards): --out must be none of them
        self.inputs: list[Path] = [config]
        index = self.dir / "model.safetensors.index.json"
        single = self.dir / "model.safetensors"
        self.tensors: dict[str, TensorInfo] = {}
        if index.is_file():
            self.inputs.append(index)
            raw = _read_json(index)
            weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
                raise ExportError(f"{index}: not a safetensors index (no `weight_map` object of tensor name -> "
                                  "shard file name)")
            shards: dict[str, SafetensorsFile] = {}
            for shard in sorted(set(weight_map.values())):
                if Path(shard).is_absolute() or ".." in Path(shard).parts:
                    users = sorted(k for k, v in weight_map.items() if v == shard)
                    raise ExportError(f"{index.name}: shard `{shard}` (holding `{users[0]}`, ...) is outside the "
                                      "checkpoint directory: an index names its shards by file name in that directory")
                if not (self.dir / shard).is_file():
                    users = sorted(k for k, v in weight_map.items() if v == shard)
                    what = "is not a file" if (self.dir / shard).exists() else "is missing (an incomplete download?)"
                    raise ExportError(f"{index.name}: shard `{shard}` (holding `{users[0]}`, ...) {what}")
                shards[shard] = SafetensorsFile(self.dir / shard)
                self.inputs.append(self.dir / shard)
            for name, shard in weight_map.items():
                if name not in shards[shard].tensors:
                    raise ExportError(f"{index.name}: tensor `{name}` is mapped to `{shard}`, which does not hold it")
                self.tensors[name] = shards[shard].tensors[name]
            for shard, sf in shards.items():
                for name in sf.tensors:
                    if weight_map.get(name) != shard:
                        raise ExportError(
                            f"{shard}: tensor `{name}` is not in {index.name}'s weight_map for this shard")
        elif single.is_file():
            self.tensors = SafetensorsFile(single).tensors
            self.inputs.append(single)
        else:
            raise ExportError(f"{self.dir}: no model.safetensors and no model.safetensors.index.json")


# ---------------------------------------------------------------------------------------
# Conversions
# ---------------------------------------------------------------------------------------


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 words (uint16), round to nearest, ties to even; NaN → 0x7FC0."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def rope_cos_sin(positions: int, head_dim: int, theta: float, first: int = 0) -> np.ndarray:
    """The `rope.cos_sin` table, f32 [positions, head_dim]: cos of each angle, then sin.

    Angles are formed as transformers' `Qwen3RotaryEmbedding` forms them (float32
    inverse frequencies `1 / theta ** (arange(0, D, 2) / D)`, integer positions cast to
    float32, float32 products p·f_j); cos/sin are then evaluated in float64 and rounded
    once to float32. `first` > 0 gives rows first..positions-1 only (the export writes
    the table in slices, so a long one needs no table-sized RAM); every row is the same
    whichever slice computes it.
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / (np.float32(theta) ** exponent)
    pos = np.arange(first, positions, dtype=np.int64).astype(np.float32)
    angle = pos[:, None] * inv_freq[None, :]  # float32 products
    angle64 = angle.astype(np.float64)
    return np.concatenate([np.cos(angle64), np.sin(angle64)], axis=1).astype(np.float32)


def _f32_up(v: np.ndarray) -> np.ndarray:
    """float64 values rounded up to float32: the least float32 >= v (overflow: +inf)."""
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    low = f.astype(np.float64) < v
    f[low] = np.nextafter(f[low], np.float32(np.inf))
    return f


def screen_head_rows(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The screened lm_head's derived rows of a slice of the head: (q, sc).

    `words`: the head's rows as bf16 words, uint16 [rows, H]. Returns q, int8 [rows, H]
    (`lm_head.screen.q8`), and sc, float32 [rows, 4] (`lm_head.screen.rows`: s, e, nw, snq,
    a float4 per row). Each row is computed from its own words only, so slicing the head
    gives the same bytes.

    Per row, w = the row's bf16 values as float64:

    - s = float32(max|w| / 127) (round to nearest), s64 = float64(s): the row's scale;
    - q = clip(rint(w / s64), -127, 127) (rint: half to even; the clip guards ±128),
      q = 0 where s == 0 (an all-zero row);
    - e = ‖w − s64·q‖₂: the int8 copy's error;
    - nw = ‖w‖₂: the row's norm;
    - snq = s64·‖q‖₂: the scaled int8 copy's norm;
    - e, nw and snq are computed in float64, multiplied by 1 + 1e-12 (covering the float64
      evaluation) and rounded up to float32 (overflow: +inf, still a bound); an all-zero
      row has s = e = nw = snq = 0;
    - a row holding a non-finite weight: s = e = nw = snq = NaN and q = 0 (the kernel then
      always takes the row as a candidate).

    The guarantee they serve: for any real vector x (the lm_head's input) and any x̃ (the
    kernel's dequantized x, e.g. int8 with a scale per 16 elements),
        |x·w − s·(x̃·q)| ≤ ‖x − x̃‖₂·nw + ‖x̃‖₂·e,
    since x·w − s·(x̃·q) = (x − x̃)·w + x̃·(w − s·q) (Cauchy–Schwarz on each term). The
    kernel adds the fp32 rounding of both dot products itself: s·‖q‖₂ ≤ snq bounds its own
    summation error term γ·‖x̃‖₂·snq, and nw the dense GEMV's, γ·‖x‖₂·nw (γ = γ_H =
    H·u/(1 − H·u), u = 2⁻²⁴; products are assumed not to underflow). The caller bounds RAM
    by the slice: about 24 bytes of temporaries per element.
    """
    words = np.asarray(words)
    if words.dtype != np.uint16 or words.ndim != 2:
        raise ValueError(f"screen_head_rows: want bf16 words, uint16 [rows, H]; got {words.dtype} {list(words.shape)}")
    n, H = words.shape
    u = words.astype(np.uint32)
    u <<= np.uint32(16)
    w32 = u.view(np.float32)
    finite = np.isfinite(w32).all(axis=1)
    w = w32.astype(np.float64)
    del u, w32
    if not finite.all():
        w[~finite] = 0.0  # computed as zeros, then marked NaN below
    if H:
        amax = np.maximum(w.max(axis=1), -w.min(axis=1))
    else:
        amax = np.zeros(n)
    s = (amax / 127.0).astype(np.float32)
    s64 = s.astype(np.float64)
    live = s64 > 0
    t = w / np.where(live, s64, 1.0)[:, None]
    np.rint(t, out=t)
    np.clip(t, -127.0, 127.0, out=t)
    t[~live] = 0.0
    q = t.astype(np.int8)
    nq = np.sqrt(np.einsum("ij,ij->i", t, t))
    nw = np.sqrt(np.einsum("ij,ij->i", w, w))
    t *= s64[:, None]  # s·q, exact in float64 (24 + 8 significant bits)
    np.subtract(w, t, out=t)
    e = np.sqrt(np.einsum("ij,ij->i", t, t))
    del t, w
    slack = 1 + 1e-12
    sc = np.stack([s, _f32_up(e * slack), _f32_up(nw * slack), _f32_up(s64 * nq * slack)], axis=1)
    sc[~finite] = np.nan
    q[~finite] = 0
    return q, sc


# ---------------------------------------------------------------------------------------
# The export plan: what each output tensor is made of
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str  # "BF16", "F32" or "I8"
    shape: tuple[int, ...]
    parts: tuple[str, ...] = ()  # source tensors concatenated along rows (bf16 outputs)
    make: Callable[[int, int], np.ndarray] | None = None  # computed outputs (rope table, screen): rows [a, b)
    #: computed outputs: bytes of temporaries `make` needs per row (0: about 4x the row's output bytes); sets the
    #: row slices so that one slice's temporaries stay within about CHUNK_BYTES
    work_row_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _OUT_DTYPES[self.dtype].itemsize


def expected_hf_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF Qwen3ForCausalLM checkpoint of this config holds, with its shape."""
    H, D, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (cfg.q_size, H),
            p + "self_attn.k_proj.weight": (cfg.kv_size, H),
            p + "self_attn.v_proj.weight": (cfg.kv_size, H),
            p + "self_attn.q_norm.weight": (D,),
            p + "self_attn.k_norm.weight": (D,),
            p + "self_attn.o_proj.weight": (H, cfg.q_size),
            p + "post_attention_layernorm.weight": (H,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        }
    shapes["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def plan_export(ckpt: Checkpoint, rope_positions: int, screened_head: bool = True,
                only_screened_head: bool = False) -> list[OutTensor]:
    """The output tensors, in file order, after checking every source tensor.

    `screened_head`: also the screened lm_head's derived tensors (`lm_head.screen.q8`,
    `lm_head.screen.rows`), computed from the head's bf16 rows, last. `only_screened_head`:
    those two alone.

    Raises ExportError naming the first missing, misshapen, badly typed or unexpected tensor.
    """
    cfg = ckpt.config
    want = expected_hf_shapes(cfg)
    for name, shape in want.items():
        t = ckpt.tensors.get(name)
        if t is None:
            hint = " (config.json says tie_word_embeddings is false)" if name == "lm_head.weight" else ""
            raise ExportError(f"tensor `{name}` is missing from the checkpoint{hint}")
        if t.shape != shape:
            raise ExportError(
                f"tensor `{name}` has shape {list(t.shape)}, but config.json implies {list(shape)}"
            )
        if t.dtype not in _DTYPES:
            quantized = t.dtype.startswith(("F8", "F4", "F6", "I8", "U8", "I4", "U4"))
            raise ExportError(
                f"tensor `{name}` has dtype {t.dtype} (in {t.path.name}); supported: BF16 (copied), F32 and F16 "
                "(rounded to bf16)"
                + ("; a quantized checkpoint cannot be exported: use the model's bf16 release" if quantized else "")
            )
    for name in ckpt.tensors:
        if name in want or name.endswith(".rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: the manifest uses the embedding; a stored copy is redundant
        raise ExportError(
            f"unexpected tensor `{name}` in {ckpt.tensors[name].path.name}: not part of a Qwen3 dense checkpoint "
            f"with this config.json (num_hidden_layers={cfg.num_hidden_layers})"
        )
    if rope_positions <= 0:
        raise ExportError(f"--rope-positions must be positive, not {rope_positions}")

    H, D = cfg.hidden_size, cfg.head_dim
    out = [OutTensor("model.embed_tokens.weight", "BF16", (cfg.vocab_size, H), ("model.embed_tokens.weight",))]
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."

        def same(n: str) -> OutTensor:
            return OutTensor(p + n, "BF16", want[p + n], (p + n,))

        out += [
            same("input_layernorm.weight"),
            OutTensor(p + "self_attn.qkv_proj.weight", "BF16", (cfg.qkv_size, H),
                      tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
            same("self_attn.q_norm.weight"),
            same("self_attn.k_norm.weight"),
            same("self_attn.o_proj.weight"),
            same("post_attention_layernorm.weight"),
            OutTensor(p + "mlp.gate_up_proj.weight", "BF16", (2 * cfg.intermediate_size, H),
                      (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")),
            same("mlp.down_proj.weight"),
        ]
    out.append(OutTensor("model.norm.weight", "BF16", (H,), ("model.norm.weight",)))
    if not cfg.tie_word_embeddings:
        out.append(OutTensor("lm_head.weight", "BF16", (cfg.vocab_size, H), ("lm_head.weight",)))
    out.append(OutTensor("rope.cos_sin", "F32", (rope_positions, D),
                         make=lambda a, b: rope_cos_sin(b, D, cfg.rope_theta, first=a)))
    if screened_head or only_screened_head:
        head = _ScreenedHead(ckpt.tensors["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"])
        work = 32 * H  # bf16 words, their f32 and f64 values, the f64 quotients, q, a read buffer
        out += [OutTensor(SCREEN_Q8, "I8", (cfg.vocab_size, H), make=head.q8, work_row_bytes=work),
                OutTensor(SCREEN_ROWS, "F32", (cfg.vocab_size, 4), make=head.rows, work_row_bytes=work)]
    for o in out:  # the plan's own wiring: each fused tensor is exactly its parts stacked
        if o.parts:
            rows = sum(want[s][0] for s in o.parts)
            assert (rows, *want[o.parts[0]][1:]) == o.shape, f"{o.name}: parts {o.parts} do not stack to {o.shape}"
    return out[-2:] if only_screened_head else out


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


def _chunks_bf16(t: TensorInfo, begin: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bf16 bytes of source tensor `t` (of its source bytes [begin, end), whole elements), in chunks of at most
    CHUNK_BYTES."""
    src_dt = _DTYPES[t.dtype]
    step = CHUNK_BYTES - CHUNK_BYTES % src_dt.itemsize
    end = t.nbytes if end is None else end
    assert 0 <= begin <= end <= t.nbytes and begin % src_dt.itemsize == 0 == end % src_dt.itemsize, (t.name, begin, end)
    try:
        f = open(t.path, "rb")
    except OSError as e:
        raise ExportError(f"{t.path}: cannot read tensor `{t.name}`: {e.strerror or e}") from None
    with f:
        f.seek(t.start + begin)
        left = end - begin
        while left:
            try:
                raw = f.read(min(step, left))
            except OSError as e:
                raise ExportError(f"{t.path}: cannot read tensor `{t.name}`: {e.strerror or e}") from None
            if not raw:
                raise ExportError(f"tensor `{t.name}`: {t.path} ends before its data does (changed or truncated "
                                  "during the export?)")
            left -= len(raw)
            if t.dtype == "BF16":
                yield raw
            else:
                yield f32_to_bf16(np.frombuffer(raw, src_dt).astype(np.float32)).tobytes()


def _computed_chunks(o: OutTensor) -> Iterator[bytes]:
    """The bytes of a computed output, in row slices of at most about CHUNK_BYTES of temporaries (RAM bounded)."""
    assert o.make is not None
    rows = o.shape[0]
    row_bytes = max(1, o.nbytes // max(rows, 1))
    # float64 intermediates are a few times the output (or what the tensor declares)
    step = max(1, CHUNK_BYTES // max(4 * row_bytes, o.work_row_bytes))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        data = np.ascontiguousarray(o.make(a, b))
        assert data.shape == (b - a, *o.shape[1:]) and data.dtype == _OUT_DTYPES[o.dtype], o.name
        yield data.tobytes()


def _rows_bf16(t: TensorInfo, a: int, b: int) -> np.ndarray:
    """Rows [a, b) of source matrix `t` as bf16 words, uint16 [b - a, cols] (converted as the export writes them)."""
    cols = math.prod(t.shape[1:])
    row = cols * _DTYPES[t.dtype].itemsize
    raw = b"".join(_chunks_bf16(t, a * row, b * row))
    return np.frombuffer(raw, np.uint16).reshape(b - a, cols)


class _ScreenedHead:
    """The screened lm_head's two derived tensors from head matrix `t`, a row slice at a time.

    `q8(a, b)` reads rows [a, b) of the head (in bf16, as the export writes them) and keeps their (s, e, nw, snq)
    rows (16 bytes a row: 2.4 MB for a 151,936-token vocabulary), so `rows(a, b)`, written after the whole q8
    tensor, reads the head again only for rows it does not hold (it holds them all when the q8 pass ran first,
    as it does in the export).
    """

    def __init__(self, t: TensorInfo):
        self.t = t
        self.sc = np.empty((t.shape[0], 4), np.float32)
        self.done = np.zeros(t.shape[0], bool)

    def _compute(self, a: int, b: int) -> np.ndarray:
        q, sc = screen_head_rows(_rows_bf16(self.t, a, b))
        self.sc[a:b] = sc
        self.done[a:b] = True
        return q

    def q8(self, a: int, b: int) -> np.ndarray:
        return self._compute(a, b)

    def rows(self, a: int, b: int) -> np.ndarray:
        if not self.done[a:b].all():
            self._compute(a, b)
        return self.sc[a:b].copy()


def _header(plan: list[OutTensor], metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata}
    at = 0
    for o in plan:
        header[o.name] = {"dtype": o.dtype, "shape": list(o.shape), "data_offsets": [at, at + o.nbytes]}
        at += o.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(blob)) + blob


def _check_out(out_arg: str | Path) -> Path:
    """--out as a path to write, or ExportError: not a directory, not under a file."""
    text = os.fspath(out_arg)
    out = Path(text)
    if not text or text.endswith(("/", os.sep)) or out.is_dir() or out.name in ("", ".", ".."):
        raise ExportError(f"--out {text!r}: a directory; give the weights file's path "
                          f"(e.g. {Path(text or '.') / 'model.safetensors'})")
    if blocker := next((q for q in out.parents if q.exists() and not q.is_dir()), None):
        raise ExportError(f"--out {out}: {blocker} is a file, not a directory")
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def export(checkpoint_dir: str | Path, out: str | Path, *, rope_positions: int | None = None,
           screened_head: bool = True, only_screened_head: bool = False, progress: bool = True) -> list[OutTensor]:
    """Export `checkpoint_dir` to `out`. Returns the plan written. Raises ExportError.

    `screened_head` (default on, as the CLI): also write `lm_head.screen.q8` and `lm_head.screen.rows`;
    `only_screened_head`: write those two alone.

    Any failure (a bad input, a full disk, an interrupt) leaves `out` as it was and no
    temporary file behind; directories created for `out` are removed again.
    """
    if rope_positions is not None and rope_positions < 1:
        raise ExportError(f"--rope-positions {rope_positions}: must be >= 1 (the rope table's rows, i.e. the KV "
                          "capacity in tokens; omit it for config.json's max_position_embeddings)")
    out = _check_out(out)
    ckpt = Checkpoint(checkpoint_dir)
    for src in ckpt.inputs:
        if _same_file(out, src):
            raise ExportError(f"--out {out}: that is the checkpoint's own {src.name}; writing there would destroy "
                              f"the input. Write the kern weights elsewhere "
                              f"(e.g. {ckpt.dir.parent / 'weights.safetensors'})")
    positions = rope_positions if rope_positions is not None else ckpt.config.max_position_embeddings
    plan = plan_export(ckpt, positions, screened_head=screened_head, only_screened_head=only_screened_head)
    src_dtypes = sorted({ckpt.tensors[s].dtype for s in expected_hf_shapes(ckpt.config)})
    metadata = {
        "producer": "kern tools/export_weights.py",
        "model_type": "qwen3",
        "source_dtypes": ",".join(src_dtypes),
        "tie_word_embeddings": str(ckpt.config.tie_word_embeddings).lower(),
        "rope_positions": str(positions),
        "screened_head": str(bool(screened_head or only_screened_head)).lower(),
        **({"screened_head_rows": SCREEN_ROWS_FORMAT} if screened_head or only_screened_head else {}),
    }
    if only_screened_head:  # no rope table in this file
        del metadata["rope_positions"]
        metadata["screened_head_only"] = "true"
    header = _header(plan, metadata)
    total = sum(o.nbytes for o in plan)
    rope_bytes = sum(o.nbytes for o in plan if o.name == "rope.cos_sin")

    created: list[Path] = []  # directories made for --out, removed again if the export fails
    for d in reversed(out.parents):
        if not d.exists():
            try:
                d.mkdir()
            except OSError as e:
                _remove_dirs(created)
                raise ExportError(f"--out {out}: cannot create the directory {d}: {e.strerror or e}") from None
            created.append(d)
    tmp: str | None = None
    bar = None
    try:
        free = shutil.disk_usage(out.parent).free
        if free < len(header) + total:
            raise ExportError(f"--out {out}: the export is {_gib(len(header) + total)}, but only {_gib(free)} is "
                              f"free on {out.parent}'s file system; free some space or write elsewhere"
                              + (f" (the rope table alone is {_gib(rope_bytes)}: {positions} positions, "
                                 "set by --rope-positions or config.json's max_position_embeddings)"
                                 if rope_bytes > total // 2 else ""))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
        except OSError as e:
            raise ExportError(f"--out {out}: cannot create a file in {out.parent}: {e.strerror or e}") from None
        if progress:
            try:
                from tqdm import tqdm
            except ImportError:  # no progress bar without tqdm
                pass
            else:
                bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=out.name, file=sys.stderr)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                for o in plan:
                    written = 0
                    if o.make is not None:
                        chunks: Iterator[bytes] = _computed_chunks(o)
                    else:
                        chunks = (c for s in o.parts for c in _chunks_bf16(ckpt.tensors[s]))
                    for c in chunks:
                        f.write(c)
                        written += len(c)
                        if bar is not None:
                            bar.update(len(c))
                    if written != o.nbytes:
                        raise ExportError(f"tensor `{o.name}`: wrote {written} bytes, expected {o.nbytes}")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        except OSError as e:  # source read errors are ExportErrors already (_chunks_bf16): this is the output
            raise ExportError(f"--out {out}: writing failed: {e.strerror or e}; nothing was written") from None
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        _remove_dirs(created)
        raise
    finally:
        if bar is not None:
            bar.close()
    return plan


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            break


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="HF Qwen3 checkpoint directory (config.json + safetensors)")
    ap.add_argument("--out", required=True, help="kern weights file to write (.safetensors)")
    ap.add_argument("--rope-positions", type=int, default=None,
                    help="rows of the rope.cos_sin table, i.e. the KV capacity in tokens "
                         "(default: config.json max_position_embeddings, 40960 for every Qwen3)")
    screen = ap.add_mutually_exclusive_group()
    screen.add_argument("--screened-head", action=argparse.BooleanOptionalAction, default=True,
                        help="also write lm_head.screen.q8 and lm_head.screen.rows (the int8 copy of the head, with "
                             "per-row scale, error and norms, that a gen_qwen3.py --lm-head screened manifest, the "
                             "default, declares); on by default. --no-screened-head leaves them out, for a "
                             "--lm-head dense manifest (kern refuses a tensor the manifest does not declare)")
    screen.add_argument("--only-screened-head", action="store_true",
                        help="write lm_head.screen.q8 and lm_head.screen.rows alone (a file to load beside a "
                             "--no-screened-head export)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        plan = export(args.checkpoint, args.out, rope_positions=args.rope_positions,
                      screened_head=args.screened_head, only_screened_head=args.only_screened_head,
                      progress=not args.quiet)
    except ExportError as e:
        print(f"export_weights: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"export_weights: interrupted; {args.out} not written (no partial file left)", file=sys.stderr)
        return 130
    total = sum(o.nbytes for o in plan)
    print(f"wrote {args.out}: {len(plan)} tensors, {total / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
