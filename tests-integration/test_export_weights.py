"""tools/export_weights.py on tiny random HF-format Qwen3 checkpoints written here.

The checkpoints are written with the safetensors library itself (`serialize_file`,
bf16 given as raw 16-bit words) and the export is read back with
`safetensors.deserialize`, so neither side relies on the exporter's own reader.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import export_weights as ew  # noqa: E402

# 2 layers, hidden 64, 4 heads, 2 kv heads, head_dim 16, intermediate 96, vocab 100.
TINY = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}


def hf_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A random HF Qwen3 state dict as bf16 words (uint16)."""
    rng = np.random.default_rng(seed)
    H, NQ, NKV, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    I, V = cfg["intermediate_size"], cfg["vocab_size"]

    def w(*shape: int) -> np.ndarray:
        return ew.f32_to_bf16(rng.standard_normal(shape, dtype=np.float32))

    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": w(H)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t |= {
            p + "input_layernorm.weight": w(H),
            p + "post_attention_layernorm.weight": w(H),
            p + "self_attn.q_proj.weight": w(NQ * D, H),
            p + "self_attn.k_proj.weight": w(NKV * D, H),
            p + "self_attn.v_proj.weight": w(NKV * D, H),
            p + "self_attn.o_proj.weight": w(H, NQ * D),
            p + "self_attn.q_norm.weight": w(D),
            p + "self_attn.k_norm.weight": w(D),
            p + "mlp.gate_proj.weight": w(I, H),
            p + "mlp.up_proj.weight": w(I, H),
            p + "mlp.down_proj.weight": w(H, I),
        }
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(V, H)
    return t


_ST_DTYPE = {np.dtype(np.uint16): "bfloat16", np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
             np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    keep = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    specs = {
        k: safetensors.TensorSpec(dtype=_ST_DTYPE[v.dtype], shape=list(v.shape), data_ptr=v.ctypes.data,
                                  data_len=v.nbytes)
        for k, v in keep.items()
    }
    safetensors.serialize_file(specs, str(path), metadata={"format": "pt"})


def write_checkpoint(d: Path, cfg: dict, tensors: dict[str, np.ndarray], shards: int = 1) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    if shards == 1:
        write_safetensors(d / "model.safetensors", tensors)
        return d
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]  # interleaved: a layer's q/k/v land in different shards
        write_safetensors(d / fname, {k: tensors[k] for k in part})
        weight_map |= {k: fname for k in part}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def read_export(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    raw = path.read_bytes()
    out = {}
    for name, t in safetensors.deserialize(raw):
        dt = {"BF16": np.uint16, "F32": np.float32, "I8": np.int8}[t["dtype"]]
        out[name] = np.frombuffer(bytes(t["data"]), dt).reshape(t["shape"])
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8 : 8 + n])["__metadata__"]
    return out, meta


def fused_reference(cfg: dict, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ref = {"model.embed_tokens.weight": t["model.embed_tokens.weight"], "model.norm.weight": t["model.norm.weight"]}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a, m = p + "self_attn.", p + "mlp."
        ref |= {
            p + "input_layernorm.weight": t[p + "input_layernorm.weight"],
            p + "post_attention_layernorm.weight": t[p + "post_attention_layernorm.weight"],
            a + "qkv_proj.weight": np.concatenate([t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]),
            a + "o_proj.weight": t[a + "o_proj.weight"],
            a + "q_norm.weight": t[a + "q_norm.weight"],
            a + "k_norm.weight": t[a + "k_norm.weight"],
            m + "gate_up_proj.weight": np.concatenate([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
            m + "down_proj.weight": t[m + "down_proj.weight"],
        }
    if not cfg["tie_word_embeddings"]:
        ref["lm_head.weight"] = t["lm_head.weight"]
    return ref


def rope_reference(positions: int, d: int, theta: float) -> np.ndarray:
    """The contract's formula, straight: row p = cos(p·f_j) then sin(p·f_j), f_j = theta^(-2j/D)."""
    out = np.empty((positions, d), np.float64)
    for p in range(positions):
        for j in range(d // 2):
            a = p * theta ** (-2 * j / d)
            out[p, j], out[p, d // 2 + j] = math.cos(a), math.sin(a)
    return out


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("shards", [1, 3], ids=["single", "sharded"])
def test_export_equals_fused_reference(tmp_path: Path, tied: bool, shards: int) -> None:
    cfg = TINY | {"tie_word_embeddings": tied}
    t = hf_tensors(cfg)
    ckpt = write_checkpoint(tmp_path / "ckpt", cfg, t, shards=shards)
    out = tmp_path / "w.safetensors"
    ew.export(ckpt, out, screened_head=False, progress=False)

    got, meta = read_export(out)
    ref = fused_reference(cfg, t)
    assert set(got) == set(ref) | {"rope.cos_sin"}
    assert ("lm_head.weight" in got) == (not tied)
    for name, want in ref.items():
        assert got[name].dtype == np.uint16 and got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    # Fused rows in the contract's order: q, k, v / gate, up.
    qkv = got["model.layers.1.self_attn.qkv_proj.weight"]
    assert qkv.shape == (4 * 16 + 2 * 2 * 16, 64)
    np.testing.assert_array_equal(qkv[64:96], t["model.layers.1.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(got["model.layers.0.mlp.gate_up_proj.weight"][96:], t["model.layers.0.mlp.up_proj.weight"])

    cs = got["rope.cos_sin"]
    assert cs.dtype == np.float32 and cs.shape == (64, 16)  # max_position_embeddings rows by default
    np.testing.assert_allclose(cs, rope_reference(64, 16, 10000.0), rtol=0, atol=2e-5)
    assert meta["tie_word_embeddings"] == str(tied).lower() and meta["rope_positions"] == "64"
    assert meta["screened_head"] == "false"  # (--no-screened-head)
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


def test_rope_positions_option_and_large_angles(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", TINY, hf_tensors(TINY))
    out = tmp_path / "w.safetensors"
    assert ew.main([str(ckpt), "--out", str(out), "--rope-positions", "300", "--quiet"]) == 0
    got, _ = read_export(out)
    assert got["rope.cos_sin"].shape == (300, 16)
    # Real Qwen3 angles (theta 1e6, D 128) at the far end of a 40,960-token capacity stay accurate.
    big = ew.rope_cos_sin(40960, 128, 1e6)
    ref = rope_reference(1, 128, 1e6)
    np.testing.assert_allclose(big[:1], ref, atol=1e-7)
    p = 40959
    f = np.float32(1.0) / np.float32(1e6) ** (np.arange(0, 128, 2).astype(np.float32) / np.float32(128))
    np.testing.assert_allclose(big[p, :64], np.cos(p * f.astype(np.float64)), atol=1e-2)  # f32 angle rounding
    assert np.all(np.abs(big) <= 1.0)


def test_f32_and_f16_checkpoints_round_to_nearest_even(tmp_path: Path) -> None:
    # Values chosen on the bf16 rounding boundaries: ties go to the even word.
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 3.0e38, np.inf, 1e-40], np.float32)
    words = ew.f32_to_bf16(x)
    assert words.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F62, 0x7F80, 0x0001]
    assert ew.f32_to_bf16(np.array([np.nan], np.float32)).tolist() == [0x7FC0]

    t = hf_tensors(TINY)
    f32 = {k: (v.astype(np.uint32) << 16).view(np.float32) + np.float32(0.0) for k, v in t.items()}
    # add sub-bf16 noise that must round away
    f32 = {k: v * np.float32(1 + 2**-12) for k, v in f32.items()}
    ew.export(write_checkpoint(tmp_path / "f32", TINY, f32), tmp_path / "a.safetensors", progress=False)
    got, meta = read_export(tmp_path / "a.safetensors")
    ref = fused_reference(TINY, {k: ew.f32_to_bf16(v) for k, v in f32.items()})
    for name, want in ref.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    assert meta["source_dtypes"] == "F32"

    f16 = {k: v.astype(np.float16) for k, v in f32.items()}
    ew.export(write_checkpoint(tmp_path / "f16", TINY, f16), tmp_path / "b.safetensors", progress=False)
    got16, _ = read_export(tmp_path / "b.safetensors")
    name = "model.layers.0.self_attn.qkv_proj.weight"
    want = ew.f32_to_bf16(np.concatenate([f16[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]).astype(np.float32))
    np.testing.assert_array_equal(got16[name], want)


def test_streams_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors larger than a chunk are copied piecewise and still come out whole."""
    monkeypatch.setattr(ew, "CHUNK_BYTES", 1000)  # embedding is 12,800 bytes, q_proj 8,192
    cfg = TINY | {"tie_word_embeddings": False}
    t = hf_tensors(cfg, seed=3)
    ew.export(write_checkpoint(tmp_path / "c", cfg, t, shards=2), tmp_path / "w.safetensors", progress=False)
    got, _ = read_export(tmp_path / "w.safetensors")
    for name, want in fused_reference(cfg, t).items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


# ------------------------------------------------------------------ bad input


def _export_error(tmp_path: Path, cfg: dict, tensors: dict, shards: int = 1) -> str:
    ckpt = write_checkpoint(tmp_path / "bad", cfg, tensors, shards=shards)
    out = tmp_path / "out" / "w.safetensors"
    with pytest.raises(ew.ExportError) as e:
        ew.export(ckpt, out, progress=False)
    assert not out.exists()
    if out.parent.exists():
        assert list(out.parent.iterdir()) == []
    return str(e.value)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    t = hf_tensors(TINY)
    del t["model.layers.1.self_attn.k_proj.weight"]
    assert "`model.layers.1.self_attn.k_proj.weight` is missing" in _export_error(tmp_path, TINY, t, shards=2)


def test_untied_without_lm_head_is_named(tmp_path: Path) -> None:
    cfg = TINY | {"tie_word_embeddings": False}
    msg = _export_error(tmp_path, cfg, hf_tensors(TINY))
    assert "`lm_head.weight` is missing" in msg and "tie_word_embeddings is false" in msg


def test_tied_checkpoint_with_stored_lm_head_is_accepted(tmp_path: Path) -> None:
    t = hf_tensors(TINY | {"tie_word_embeddings": False})  # has lm_head.weight
    ew.export(write_checkpoint(tmp_path / "c", TINY, t), tmp_path / "w.safetensors", progress=False)
    got, _ = read_export(tmp_path / "w.safetensors")
    assert "lm_head.weight" not in got


def test_shape_disagreeing_with_config_is_named(tmp_path: Path) -> None:
    t = hf_tensors(TINY)
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"][:, :80].copy()
    msg = _export_error(tmp_path, TINY, t)
    assert "`model.layers.0.mlp.down_proj.weight` has shape [64, 80], but config.json implies [64, 96]" in msg


def test_config_with_fewer_layers_than_checkpoint(tmp_path: Path) -> None:
    msg = _export_error(tmp_path, TINY | {"num_hidden_layers": 1}, hf_tensors(TINY))
    assert "unexpected tensor `model.layers.1." in msg and "num_hidden_layers=1" in msg


def test_unsupported_dtype_is_named(tmp_path: Path) -> None:
    t = hf_tensors(TINY)
    t["model.norm.weight"] = np.zeros(64, np.int8)
    msg = _export_error(tmp_path, TINY, t)
    assert "`model.norm.weight` has dtype I8" in msg


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "unsupported architecture"),
        ({"attention_bias": True}, "`attention_bias`"),
        ({"use_sliding_window": True}, "`use_sliding_window`"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "`rope_scaling`"),
        ({"hidden_size": "64"}, "`hidden_size`"),
    ],
)
def test_unsupported_config_is_named(tmp_path: Path, patch: dict, field: str) -> None:
    assert field in _export_error(tmp_path, TINY | patch, hf_tensors(TINY))


def test_transformers5_rope_parameters(tmp_path: Path) -> None:
    cfg = {k: v for k, v in TINY.items() if k != "rope_theta"} | {
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    ew.export(write_checkpoint(tmp_path / "c", cfg, hf_tensors(cfg)), tmp_path / "w.safetensors", progress=False)
    got, _ = read_export(tmp_path / "w.safetensors")
    np.testing.assert_allclose(got["rope.cos_sin"], rope_reference(64, 16, 500.0), atol=2e-5)


def test_missing_shard_and_no_weights(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "c", TINY, hf_tensors(TINY), shards=2)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ew.ExportError, match="shard `model-00002-of-00002.safetensors`.* is missing"):
        ew.export(ckpt, tmp_path / "w.safetensors", progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(ew.ExportError, match="no model.safetensors"):
        ew.export(empty, tmp_path / "w.safetensors", progress=False)


def test_cli_reports_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = hf_tensors(TINY)
    del t["model.norm.weight"]
    ckpt = write_checkpoint(tmp_path / "c", TINY, t)
    assert ew.main([str(ckpt), "--out", str(tmp_path / "w.safetensors"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "export_weights: error: tensor `model.norm.weight` is missing from the checkpoint"


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = write_checkpoint(tmp_path / "c", TINY, hf_tensors(TINY))
    out = tmp_path / "o" / "w.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"previous export")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ew, "rope_cos_sin", boom)  # fails after every weight has been written
    with pytest.raises(KeyboardInterrupt):
        ew.export(ckpt, out, progress=False)
    assert out.read_bytes() == b"previous export"
    assert [p.name for p in out.parent.iterdir()] == ["w.safetensors"]


# ------------------------------------------------------------------ with torch + transformers (GPU machine)


@pytest.mark.slow
def test_random_checkpoint_exports_to_the_hf_tensors(tmp_path: Path) -> None:
    """make_random_checkpoint → export_weights equals the fused state dict transformers loads.

    Needs torch and transformers (the GPU machine; runs on its CPU too): skipped elsewhere.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import subprocess

    make = [sys.executable, str(ROOT / "tools" / "make_random_checkpoint.py"), "--geometry", "0.6b", "--seed", "7"]
    one, two = tmp_path / "l1", tmp_path / "l2"
    subprocess.run(make + ["--layers", "1", "--out", str(one)], check=True)
    subprocess.run(make + ["--layers", "2", "--out", str(two), "--max-shard-size", "200MB"], check=True)
    assert (two / "model.safetensors.index.json").is_file()  # sharded

    ew.export(two, tmp_path / "w.safetensors", progress=False)
    got, meta = read_export(tmp_path / "w.safetensors")
    assert meta["tie_word_embeddings"] == "true" and "lm_head.weight" not in got

    model = transformers.Qwen3ForCausalLM.from_pretrained(two, dtype=torch.bfloat16)
    sd = {k: v.contiguous().view(torch.int16).numpy().view(np.uint16) for k, v in model.state_dict().items()}
    cfg = {"num_hidden_layers": 2, "tie_word_embeddings": True}
    for name, want in fused_reference(cfg, sd).items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    # not degenerate: matrices ~ N(0, 0.02), norm weights around 1 but not all ones
    q = (got["model.layers.0.self_attn.qkv_proj.weight"].astype(np.uint32) << 16).view(np.float32)
    assert 0.015 < q.std() < 0.025
    n = (got["model.layers.1.input_layernorm.weight"].astype(np.uint32) << 16).view(np.float32)
    assert 0.05 < n.std() < 0.15 and abs(n.mean() - 1) < 0.05
    # per-tensor seeds: the 1-layer checkpoint is the first layer of the 2-layer one
    ew.export(one, tmp_path / "w1.safetensors", progress=False)
    got1, _ = read_export(tmp_path / "w1.safetensors")
    for name, arr in got1.items():
        np.testing.assert_array_equal(arr, got[name], err_msg=name)


# ------------------------------------------------------------------ a user pointing the tool at the wrong things


def _rewrite_header(path: Path, edit) -> None:
    """Rewrite the JSON header of safetensors file `path` through `edit(header)`, keeping the data bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n :])


def _cli_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], ckpt: Path, out: Path | str | None = None,
               *extra: str) -> str:
    """Run the CLI expecting a failure: exit 1, one line on stderr, no traceback, nothing written."""
    out = tmp_path / "o" / "w.safetensors" if out is None else out
    before = sorted(p for p in tmp_path.rglob("*"))
    assert ew.main([str(ckpt), "--out", str(out), "--quiet", *extra]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("export_weights: error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert sorted(p for p in tmp_path.rglob("*")) == before  # no temp file, no new directory, no output
    return lines[0].removeprefix("export_weights: error: ")


def _good(tmp_path: Path, shards: int = 1, cfg: dict = TINY) -> Path:
    return write_checkpoint(tmp_path / "ck", cfg, hf_tensors(cfg), shards=shards)


def _set(key: str, value):
    def edit(h: dict) -> None:
        h["model.norm.weight"][key] = value
    return edit


def _overlap(h: dict) -> None:  # layer 1's input norm made to read layer 0's bytes
    h["model.layers.1.input_layernorm.weight"]["data_offsets"] = list(h["model.layers.0.input_layernorm.weight"]["data_offsets"])


def _short_span(h: dict) -> None:
    b, e = h["model.norm.weight"]["data_offsets"]
    h["model.norm.weight"]["data_offsets"] = [b, e - 2]


@pytest.mark.parametrize(
    "edit, expect",
    [
        (_overlap, "tensors `model.layers.0.input_layernorm.weight` and `model.layers.1.input_layernorm.weight` overlap"),
        (_short_span, "tensor `model.norm.weight`: data_offsets [136320, 136446] span 126 bytes, but BF16 [64] is 128 bytes"),
        (_set("shape", None), "tensor `model.norm.weight`: shape None is not a list of non-negative integers"),
        (_set("shape", [-64]), "tensor `model.norm.weight`: shape [-64] is not a list of non-negative integers"),
        (_set("data_offsets", [5]), "tensor `model.norm.weight`: data_offsets [5] is not [begin, end]"),
        (_set("data_offsets", ["0", "128"]), "data_offsets ['0', '128'] is not [begin, end]"),
        (_set("dtype", None), "tensor `model.norm.weight`: header entry has no dtype string"),
        (lambda h: h.__setitem__("model.norm.weight", 5), "tensor `model.norm.weight`: header entry 5 is not an object"),
    ],
    ids=["overlap", "span-vs-shape", "no-shape", "negative-shape", "short-offsets", "string-offsets", "no-dtype",
         "entry-not-object"],
)
def test_damaged_safetensors_header_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, expect: str) -> None:
    """Was: overlapping tensors exported silently (rc 0), a span shorter than its shape failed mid-write
    ("wrote 126 bytes, expected 128"), and a malformed entry was a KeyError/TypeError/ValueError traceback."""
    ckpt = _good(tmp_path)
    _rewrite_header(ckpt / "model.safetensors", edit)
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert msg.startswith(f"{ckpt / 'model.safetensors'}: ") and expect in msg and "damaged" in msg


@pytest.mark.parametrize(
    "damage, expect",
    [
        (lambda raw: raw[:-100], "its data ends at byte 138912, but the file has only 138812 bytes: truncated"),
        (lambda raw: (10**15).to_bytes(8, "little") + raw[8:], "header length 1000000000000000 runs past the end"),
        (lambda raw: raw[:8] + b"{" * int.from_bytes(raw[:8], "little") + raw[8 + int.from_bytes(raw[:8], "little"):],
         "header is not JSON"),
        (lambda raw: raw[:8] + b"[1]".ljust(int.from_bytes(raw[:8], "little")) + raw[8 + int.from_bytes(raw[:8], "little"):],
         "header is a JSON list, not an object"),
        (lambda raw: raw[:5], "5 bytes, shorter than the 8-byte header length"),
    ],
    ids=["truncated", "header-length-past-eof", "header-not-json", "header-a-list", "five-bytes"],
)
def test_truncated_or_corrupt_safetensors_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage,
                                                   expect: str) -> None:
    """Was: a header that is a JSON list was a TypeError traceback; the others named the file but not how to fix it."""
    ckpt = _good(tmp_path)
    f = ckpt / "model.safetensors"
    f.write_bytes(damage(f.read_bytes()))
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert msg.startswith(f"{f}: ") and expect in msg


def test_fp8_checkpoint_is_refused_as_quantized(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = hf_tensors(TINY)
    t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].astype(np.uint8)  # same shape
    ckpt = write_checkpoint(tmp_path / "ck", TINY, t)
    _rewrite_header(ckpt / "model.safetensors",
                    lambda h: h["model.layers.0.mlp.up_proj.weight"].__setitem__("dtype", "F8_E4M3"))
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert "tensor `model.layers.0.mlp.up_proj.weight` has dtype F8_E4M3 (in model.safetensors)" in msg
    assert "quantized checkpoint cannot be exported" in msg
    # an fp8 release says so in config.json: refused there, before any tensor is looked at
    cfg = TINY | {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert "field `quantization_config` (quant_method 'fp8'): a quantized checkpoint" in msg


@pytest.mark.parametrize(
    "patch, expect",
    [
        ({"tie_word_embeddings": "false"}, "field `tie_word_embeddings` = 'false' is not true or false"),
        ({"rope_theta": 0}, "field `rope_theta` = 0.0 must be a positive number"),
        ({"rope_theta": -1.0}, "field `rope_theta` = -1.0 must be a positive number"),
        ({"rope_theta": float("nan")}, "field `rope_theta` = nan must be a positive number"),
        ({"rope_theta": "1e6"}, "field `rope_theta` = '1e6' is not a number"),
        ({"rope_scaling": "yarn"}, "field `rope_scaling` = 'yarn' is not an object or null"),
        ({"layer_types": 5}, "field `layer_types` = 5 is not a list or null"),
        ({"architectures": "Qwen3ForCausalLM"}, "field `architectures` = 'Qwen3ForCausalLM' is not a list"),
        ({"rope_parameters": {"rope_theta": "x"}}, "field `rope_parameters.rope_theta` = 'x' is not a number"),
        ({"rope_parameters": {"rope_theta": 0.0}}, "field `rope_parameters.rope_theta` = 0.0 must be a positive"),
    ],
)
def test_config_field_of_wrong_type_or_value_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict,
                                                      expect: str) -> None:
    """Was: `"false"` read as tied (a stored lm_head silently dropped), rope_theta <= 0 or NaN wrote a NaN table
    with rc 0, a string rope_scaling / int layer_types / string rope_parameters.rope_theta were tracebacks."""
    t = hf_tensors(TINY | {"tie_word_embeddings": False})
    cfg = TINY | patch
    if "rope_parameters" in patch:
        cfg = {k: v for k, v in cfg.items() if k != "rope_theta"}
    ckpt = write_checkpoint(tmp_path / "ck", cfg, t)
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert msg.startswith(f"{ckpt / 'config.json'}: ") and expect in msg


def test_unreadable_config_json_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: a non-UTF-8 config.json a UnicodeDecodeError traceback, config.json a directory IsADirectoryError."""
    ckpt = _good(tmp_path)
    cfg = ckpt / "config.json"
    cfg.write_bytes(b"\xff\xfe\x00 not json")
    assert _cli_error(tmp_path, capsys, ckpt).startswith(f"{cfg}: not JSON")
    cfg.unlink()
    cfg.mkdir()
    assert _cli_error(tmp_path, capsys, ckpt) == f"{cfg}: a directory, not a JSON file"
    cfg.rmdir()
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert msg.startswith(f"{cfg}: no such file; CHECKPOINT must be an HF checkpoint directory holding config.json")
    # the safetensors file given in place of its directory
    msg = _cli_error(tmp_path, capsys, ckpt / "model.safetensors")
    assert msg.startswith(f"{ckpt / 'model.safetensors'}: a file; CHECKPOINT is the HF checkpoint directory")


@pytest.mark.parametrize(
    "index, expect",
    [
        (b'{"weight_map": [1]}', "not a safetensors index (no `weight_map` object"),
        (b'{"weight_map": {"model.norm.weight": 5}}', "not a safetensors index (no `weight_map` object"),
        (b"\xff\xfe", "not JSON"),
    ],
    ids=["weight-map-a-list", "shard-not-a-string", "not-utf8"],
)
def test_damaged_index_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], index: bytes, expect: str) -> None:
    """Was: AttributeError / TypeError / UnicodeDecodeError tracebacks."""
    ckpt = _good(tmp_path, shards=2)
    (ckpt / "model.safetensors.index.json").write_bytes(index)
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert msg.startswith(f"{ckpt / 'model.safetensors.index.json'}: ") and expect in msg


def test_index_shard_missing_not_a_file_or_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _good(tmp_path, shards=3)
    shard2 = ckpt / "model-00002-of-00003.safetensors"
    shard2.unlink()
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert "shard `model-00002-of-00003.safetensors` (holding `" in msg and "is missing (an incomplete download?)" in msg
    shard2.mkdir()
    assert "shard `model-00002-of-00003.safetensors` (holding `" in _cli_error(tmp_path, capsys, ckpt)
    assert _cli_error(tmp_path, capsys, ckpt).endswith(", ...) is not a file")  # was: "is missing"
    # an index that maps a tensor to a shard that does not hold it
    ckpt2 = write_checkpoint(tmp_path / "ck2", TINY, hf_tensors(TINY), shards=2)
    idx = json.loads((ckpt2 / "model.safetensors.index.json").read_text())
    wrong = {"model-00001-of-00002.safetensors": "model-00002-of-00002.safetensors",
             "model-00002-of-00002.safetensors": "model-00001-of-00002.safetensors"}
    idx["weight_map"]["model.norm.weight"] = wrong[idx["weight_map"]["model.norm.weight"]]
    (ckpt2 / "model.safetensors.index.json").write_text(json.dumps(idx))
    msg = _cli_error(tmp_path, capsys, ckpt2)
    assert msg.startswith("model.safetensors.index.json: tensor `model.norm.weight` is mapped to `model-0000")
    assert msg.endswith(", which does not hold it")


@pytest.mark.parametrize("shards, victim", [(1, "model.safetensors"), (2, "model-00002-of-00002.safetensors"),
                                            (2, "model.safetensors.index.json"), (1, "config.json")])
def test_out_that_is_an_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int,
                                         victim: str) -> None:
    """Was: `--out CKPT/model.safetensors` (or a shard) exported with rc 0 over the checkpoint's own weights."""
    ckpt = _good(tmp_path, shards=shards)
    before = (ckpt / victim).read_bytes()
    msg = _cli_error(tmp_path, capsys, ckpt, ckpt / victim)
    assert msg.startswith(f"--out {ckpt / victim}: that is the checkpoint's own {victim}; writing there would destroy")
    assert (ckpt / victim).read_bytes() == before
    # the same file reached through another path (a symlink to the directory)
    (tmp_path / "alias").symlink_to(ckpt)
    assert "that is the checkpoint's own" in _cli_error(tmp_path, capsys, ckpt, tmp_path / "alias" / victim)


def test_out_that_is_a_directory_or_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: IsADirectoryError / FileExistsError / 'Device or resource busy' tracebacks; `--out new/` wrote a file
    named `new`."""
    ckpt = _good(tmp_path)
    (tmp_path / "d").mkdir()
    assert _cli_error(tmp_path, capsys, ckpt, tmp_path / "d") == (
        f"--out '{tmp_path / 'd'}': a directory; give the weights file's path (e.g. {tmp_path / 'd' / 'model.safetensors'})")
    assert _cli_error(tmp_path, capsys, ckpt, str(tmp_path / "new") + "/").startswith(f"--out '{tmp_path / 'new'}/': a directory")
    assert _cli_error(tmp_path, capsys, ckpt, "").startswith("--out '': a directory")
    (tmp_path / "f").write_text("x")
    assert _cli_error(tmp_path, capsys, ckpt, tmp_path / "f" / "sub" / "w.safetensors") == (
        f"--out {tmp_path / 'f' / 'sub' / 'w.safetensors'}: {tmp_path / 'f'} is a file, not a directory")


def test_out_under_missing_folders_is_created_and_removed_on_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = _good(tmp_path)
    out = tmp_path / "a" / "b" / "w.safetensors"
    def io_error(*a, **k):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ew, "rope_cos_sin", io_error)  # fails after every weight has been written
    msg = _cli_error(tmp_path, capsys, ckpt, out)  # the folders made for it are gone again
    assert msg == f"--out {out}: writing failed: Input/output error; nothing was written"
    monkeypatch.undo()
    assert ew.main([str(ckpt), "--out", str(out), "--quiet"]) == 0 and out.is_file()


def test_rope_positions_below_one_is_named_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: the tensors were checked first, so a checkpoint problem hid the bad option (and the option was
    reported only once the checkpoint was fixed)."""
    t = hf_tensors(TINY)
    del t["model.norm.weight"]
    ckpt = write_checkpoint(tmp_path / "ck", TINY, t)
    for n in ("0", "-3"):
        msg = _cli_error(tmp_path, capsys, ckpt, None, "--rope-positions", n)
        assert msg.startswith(f"--rope-positions {n}: must be >= 1")


def test_disk_full_before_and_during_the_write(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: no check of the free space (an 8 GB export failed near its end), and ENOSPC was an OSError traceback."""
    import errno
    import shutil
    from collections import namedtuple

    ckpt = _good(tmp_path)
    out = tmp_path / "o" / "w.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"previous export")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 1000, 1000))
    msg = _cli_error(tmp_path, capsys, ckpt, out)
    assert msg.startswith(f"--out {out}: the export is 0.00 GiB, but only 0.00 GiB is free on {out.parent}'s file system")
    monkeypatch.undo()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    msg = _cli_error(tmp_path, capsys, ckpt, out)
    assert msg == f"--out {out}: writing failed: No space left on device; nothing was written"
    assert out.read_bytes() == b"previous export"


def test_interrupt_is_one_line_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = _good(tmp_path)
    out = tmp_path / "new" / "w.safetensors"

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ew, "rope_cos_sin", interrupt)
    assert ew.main([str(ckpt), "--out", str(out), "--quiet"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"export_weights: interrupted; {out} not written (no partial file left)"
    assert not (tmp_path / "new").exists()


def test_progress_bar_without_tqdm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: ModuleNotFoundError traceback where tqdm is not installed (the default shows a progress bar)."""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
    ckpt = _good(tmp_path)
    ew.export(ckpt, tmp_path / "w.safetensors", progress=True)
    assert (tmp_path / "w.safetensors").is_file()


def test_rope_table_is_written_in_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long table is computed and written a slice at a time, the same bits as computed whole."""
    monkeypatch.setattr(ew, "CHUNK_BYTES", 4096)  # 16-position slices of a [1000, 16] table
    calls = []
    real = ew.rope_cos_sin
    monkeypatch.setattr(ew, "rope_cos_sin", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    ckpt = _good(tmp_path)
    ew.export(ckpt, tmp_path / "w.safetensors", rope_positions=1000, progress=False)
    got, _ = read_export(tmp_path / "w.safetensors")
    assert len(calls) > 10
    np.testing.assert_array_equal(got["rope.cos_sin"], real(1000, 16, 10000.0))


# ------------------------------------------------------------------ the docstring's numerics, against independent references


def _bf16_reference(word: int) -> int:
    """bf16 word of the float32 with bits `word`, from exact arithmetic: round to 8 significant bits (the
    subnormal spacing 2**-133 below 2**-126), ties to even, |x| >= 2**128 - 2**119 (past the largest finite bf16
    by half its spacing or more) to inf; every NaN to 0x7FC0 (torch's `.to(torch.bfloat16)`)."""
    from fractions import Fraction

    x = float(np.uint32(word).view(np.float32))
    if math.isnan(x):
        return 0x7FC0
    sign = 0x8000 if word >> 31 else 0
    if math.isinf(x):
        return sign | 0x7F80
    v = abs(Fraction(x))
    if v == 0:
        return sign
    e = max(math.frexp(abs(x))[1] - 1, -126)  # v in [2**e, 2**(e+1)) for normals
    ulp = Fraction(2) ** (e - 7)
    q, r = divmod(v, ulp)
    n = int(q) + (1 if r > ulp / 2 or (r == ulp / 2 and int(q) % 2) else 0)
    y = n * ulp
    if y >= Fraction(2) ** 128:
        return sign | 0x7F80
    bits = int(np.float32(float(y)).view(np.uint32))  # y has 8 significant bits: exact in float32
    assert bits & 0xFFFF == 0 and Fraction(float(np.float32(float(y)))) == y
    return sign | (bits >> 16) & 0x7FFF


def test_f32_to_bf16_matches_exact_rounding() -> None:
    """Round to nearest, ties to even, over random bit patterns, every tie/near-tie low half, both signs,
    subnormals, overflow to inf, infinities and NaNs (signalling, negative, with payload) -> 0x7FC0."""
    rng = np.random.default_rng(11)
    hi = rng.integers(0, 1 << 16, 3000, dtype=np.uint32)
    near_ties = (hi[:, None] << 16) | np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    special = np.array([
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x00800000,
        0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7EFFFF, 0x7F7E8000,  # largest finite / overflow
        0x7F800000, 0xFF800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0xFFC00000, 0xFFFFFFFF, 0x7F80FFFF,  # inf, NaN
        0x3F808000, 0x3F818000, 0x3F80FFFF,
    ], np.uint32)
    words = np.concatenate([rng.integers(0, 1 << 32, 6000, dtype=np.uint32), near_ties.ravel(), special])
    got = ew.f32_to_bf16(words.view(np.float32))
    assert got.dtype == np.uint16
    want = np.array([_bf16_reference(int(w)) for w in words], np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(words[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]


def test_rope_table_against_float64() -> None:
    """The real geometry (D 128, theta 1e6, 40,960 positions) against the contract's formula in float64,
    p * theta**(-2j/D): every entry within what the float32 angle (float32 frequencies and products, as
    transformers forms them) allows, and where the angle is exact (j = 0: f_0 = 1, p < 2**24) cos/sin
    evaluated in float64 and rounded once, bit for bit."""
    P, D, theta = 40960, 128, 1e6
    table = ew.rope_cos_sin(P, D, theta)
    assert table.shape == (P, D) and table.dtype == np.float32
    p = np.arange(P, dtype=np.float64)[:, None]
    angle = p * theta ** (-2.0 * np.arange(D // 2) / D)[None, :]
    ref = np.concatenate([np.cos(angle), np.sin(angle)], axis=1)
    # float32 frequency: pow + divide, a few ulp; the float32 product: half an ulp; then one float32 rounding
    bound = np.concatenate([angle, angle], axis=1) * 2.0**-21 + 2.0**-24
    err = np.abs(table.astype(np.float64) - ref)
    assert np.all(err <= bound), np.unravel_index(np.argmax(err - bound), err.shape)
    np.testing.assert_array_equal(table[:, 0], np.cos(np.arange(P, dtype=np.float64)).astype(np.float32))
    np.testing.assert_array_equal(table[:, D // 2], np.sin(np.arange(P, dtype=np.float64)).astype(np.float32))
    # and not merely close: a float32 cos/sin (not float64 rounded once) is off in some entries
    assert np.any(np.cos(np.arange(P, dtype=np.float32)) != table[:, 0])
    # where the angle is small (high j) the float32 angle is accurate: the table is the formula to float32
    np.testing.assert_allclose(table[:, D // 2 - 1], np.cos(angle[:, -1]), rtol=0, atol=2.0**-23)
    # the angle itself is transformers' float32 one (torch: inv_freq = 1 / theta ** (arange(0, D, 2).float() / D),
    # freqs = position.float() * inv_freq), not the float64 angle: far positions tell them apart
    inv32 = np.float32(1.0) / np.float32(theta) ** (np.arange(0, D, 2).astype(np.float32) / np.float32(D))
    rows = np.array([1, 4097, 30001, P - 1])
    a32 = (rows.astype(np.float32)[:, None] * inv32[None, :]).astype(np.float64)
    np.testing.assert_array_equal(table[rows], np.concatenate([np.cos(a32), np.sin(a32)], axis=1).astype(np.float32))
    assert np.any(table[rows] != ref[rows].astype(np.float32))


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/../../x.safetensors"])
def test_index_shard_outside_the_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       shard: str) -> None:
    """An index naming a shard outside the checkpoint directory (`../`, an absolute path) was followed; a shard is a
    file name in that directory."""
    ckpt = _good(tmp_path, shards=2)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(ckpt / "model-00002-of-00002.safetensors", outside)
    idx = json.loads((ckpt / "model.safetensors.index.json").read_text())
    idx["weight_map"] = {k: (shard if v == "model-00002-of-00002.safetensors" else v) for k, v in idx["weight_map"].items()}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(idx))
    msg = _cli_error(tmp_path, capsys, ckpt)
    assert f"shard `{shard}` (holding `" in msg and "is outside the checkpoint directory" in msg


# ------------------------------------------------------------------ the screened lm_head's derived tensors


def _bf16_values(words: np.ndarray) -> np.ndarray:
    """bf16 words -> their values as float32 (exact)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def _screen_test_rows(H: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """bf16 words [rows, H] of many kinds of rows, and which rows are all finite.

    Rows 16, 17: zeros; 21: ties; 22, 23: e = 0; 24..27: not finite; 28: near the bf16 maximum (nw and snq
    overflow float32: +inf)."""
    rows = [
        rng.standard_normal((6, H)),  # normal
        rng.standard_normal((6, H)) * np.exp(3 * rng.standard_normal(6))[:, None],  # log-normal row scales
        rng.standard_t(2, (4, H)),  # heavy-tailed values
        np.zeros((1, H)),  # all zero: s = e = nw = snq = 0
        -np.zeros((1, H)),
        rng.standard_normal((1, H)) * 1e-20,  # tiny
        rng.standard_normal((1, H)) * 1e4,  # large
    ]
    outlier = rng.standard_normal(H) * 0.02
    outlier[H // 3] = 50.0  # one weight dominates the scale: the rest quantize coarsely
    rows.append(outlier[None])
    ties = np.zeros(H)  # amax 127: s = 1 exactly, and w / s = k + 1/2 rounds half to even
    ties[:8] = [127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5]
    rows.append(ties[None])
    ints = np.rint(rng.uniform(-127, 127, (2, H)))  # exactly s·q (e = 0)
    ints[:, 0] = 127
    rows.append(ints * np.array([[1.0], [2.0**-3]]))
    bad = rng.standard_normal((4, H))
    bad[0, 1], bad[1, H - 1], bad[2, 0], bad[3, :] = np.inf, -np.inf, np.nan, np.nan
    rows.append(bad)
    rows.append(rng.choice([-1.0, 1.0], (1, H)) * rng.uniform(1e38, 3e38, (1, H)))  # ‖w‖ > float32 max
    words = ew.f32_to_bf16(np.concatenate(rows).astype(np.float32))
    finite = np.isfinite(_bf16_values(words)).all(axis=1)
    assert finite.sum() == len(words) - 4 and not finite[24:28].any()
    return words, finite


def _x_vectors(H: int, rng: np.random.Generator) -> list[np.ndarray]:
    """~20 bf16-representable vectors (as float32): plain, with a large dynamic range, sparse, one-hot."""
    xs = [rng.standard_normal(H) for _ in range(6)]
    xs += [rng.choice([-1.0, 1.0], H) * 2.0 ** rng.uniform(-20, 20, H) for _ in range(6)]  # 2^±20 magnitudes
    xs += [rng.standard_normal(H) * (rng.random(H) < 0.05) * 1e3 for _ in range(3)]  # sparse
    xs += [np.eye(H)[rng.integers(H)], np.ones(H), np.full(H, -3.0), rng.standard_t(1, H)]
    xs += [np.where(np.arange(H) % 2 == 0, 1e6, 1e-6) * rng.choice([-1.0, 1.0], H)]
    return [_bf16_values(ew.f32_to_bf16(x.astype(np.float32))) for x in xs]


def _quantize_x(x: np.ndarray) -> np.ndarray:
    """x̃, float64: x quantized to int8 per 16-element group, x̃ = s_v·rint(x/s_v), s_v = max|x_v|/127 (float64)."""
    g = x.astype(np.float64).reshape(-1, 16)
    sv = np.abs(g).max(axis=1, keepdims=True) / 127
    live = sv > 0
    return np.where(live, np.rint(g / np.where(live, sv, 1.0)) * sv, 0.0).reshape(-1)


def _fl32_dots(x: np.ndarray, m: np.ndarray) -> list[np.ndarray]:
    """fp32 dots x·m[r] in three summation orders: forward, reverse (sequential float32 sums) and numpy's pairwise."""
    prod = x[None, :].astype(np.float32) * m.astype(np.float32)  # products rounded to float32 (exact for bf16·bf16)
    return [np.cumsum(prod, axis=1, dtype=np.float32)[:, -1], np.cumsum(prod[:, ::-1], axis=1, dtype=np.float32)[:, -1],
            prod.sum(axis=1, dtype=np.float32)]


def _times(a: float, b: float) -> float:
    """a·b with 0·inf = 0 (a bound of +inf on a term whose other factor is 0 bounds it by 0)."""
    return 0.0 if a == 0 or b == 0 else a * b


def _is_f32_up(f: np.float32, v: float, rel: float = 1e-13) -> bool:
    """f is v rounded up to float32: f >= v and the next float32 down is below v (`rel`: slack for the reference's
    own float64 summation order; v = 0 exactly: f = 0)."""
    if v == 0:
        return float(f) == 0.0
    below = float(np.nextafter(f, np.float32(-np.inf)))
    return float(f) >= v * (1 - rel) and below < v * (1 + rel)


@pytest.mark.parametrize("H", [16, 1024])
def test_screen_head_rows_definitions(H: int) -> None:
    """screen_head_rows: q within ±127, s = float32(max|w|/127), q, e, nw and snq as defined against a per-row
    float64 reference (e, nw, snq times 1 + 1e-12, rounded up; +inf past float32), non-finite rows all NaN and
    q = 0, all-zero rows all 0."""
    rng = np.random.default_rng(H)
    words, finite = _screen_test_rows(H, rng)
    q, sc = ew.screen_head_rows(words)
    assert q.dtype == np.int8 and q.shape == words.shape
    assert sc.dtype == np.float32 and sc.shape == (len(words), 4)
    assert q.min() >= -127 and q.max() <= 127
    assert np.isnan(sc[~finite]).all() and np.all(q[~finite] == 0)
    w = _bf16_values(words).astype(np.float64)
    for r in np.flatnonzero(finite):  # the definitions, row by row
        s, e, nw, snq = sc[r]
        amax = float(np.max(np.abs(w[r])))
        assert s == np.float32(amax / 127), r
        s64 = float(s)
        want_q = np.zeros(H) if s64 == 0 else np.clip(np.rint(w[r] / s64), -127, 127)
        np.testing.assert_array_equal(q[r], want_q.astype(np.int8), err_msg=f"row {r}")
        ref = {"e": math.sqrt(math.fsum((w[r] - s64 * want_q) ** 2)), "nw": math.sqrt(math.fsum(w[r] ** 2)),
               "snq": s64 * math.sqrt(math.fsum(want_q**2))}
        for name, got in zip(ref, (e, nw, snq)):
            assert float(got) >= ref[name], (r, name, float(got), ref[name])  # a bound on the exact value
            assert _is_f32_up(got, ref[name] * (1 + 1e-12)), (r, name, float(got), ref[name])
    assert sc[16].tolist() == sc[17].tolist() == [0.0] * 4  # the all-zero rows (of 0.0 and of -0.0)
    assert sc[22, 1] == sc[23, 1] == 0  # w = s·q exactly
    assert np.isinf(sc[28, 2]) and np.isinf(sc[28, 3]) and np.isfinite(sc[28, :2]).all()  # overflow rounds up to +inf
    ties = 21
    assert sc[ties, 0] == 1.0 and q[ties, :8].tolist() == [127, 2, -4, 0, 0, 2, 126, -126]  # half to even


@pytest.mark.parametrize("H", [16, 1024])
def test_screen_head_rows_bound(H: int) -> None:
    """The guarantee: |x·w − s·(x̃·q)| ≤ ‖x − x̃‖₂·nw + ‖x̃‖₂·e for ~20 vectors x and x̃ = x quantized to int8 per
    16 elements, every finite row (float64, slack 1e-9 relative to the terms' magnitudes for float64's own
    rounding); nearly met by x̃ = x along a row's own quantization error; and nw bounds the fp32 rounding of the
    dense dot, |fl32(x·w) − x·w| ≤ γ_H·‖x‖₂·nw, whatever order it is summed in."""
    rng = np.random.default_rng(100 + H)
    words, finite = _screen_test_rows(H, rng)
    q, sc = ew.screen_head_rows(words)
    w = _bf16_values(words).astype(np.float64)
    qf = q.astype(np.float64)
    fin = np.flatnonzero(finite)
    gamma = H * 2.0**-24 / (1 - H * 2.0**-24)
    for x32 in _x_vectors(H, rng):
        x = x32.astype(np.float64)
        xt = _quantize_x(x32)
        dx, nxt = float(np.linalg.norm(x - xt)), float(np.linalg.norm(xt))
        for r in fin:
            s, e, nw = (float(v) for v in sc[r, :3])
            xw = math.fsum(x * w[r])  # bf16·bf16 products: exact in float64
            xq = math.fsum(xt * qf[r])
            gap = abs(xw - s * xq)
            bound = _times(dx, nw) + _times(nxt, e)
            slack = 1e-9 * (bound + math.fsum(np.abs(x * w[r])) + s * math.fsum(np.abs(xt * qf[r])))
            assert gap <= bound + slack, (r, gap, bound)
        # nw also bounds the fp32 GEMV's own rounding
        ok = fin[np.isfinite(sc[fin, 2])]
        exact = np.array([math.fsum(x * w[r]) for r in ok])
        for dw in _fl32_dots(x32, w[ok].astype(np.float32)):
            err = np.abs(dw.astype(np.float64) - exact)
            assert np.all(err <= gamma * float(np.linalg.norm(x)) * sc[ok, 2].astype(np.float64)), ok[np.argmax(err)]
        # snq bounds the int8 dot's: s·|fl32(x̃·q) − x̃·q| ≤ γ_H·‖x̃‖₂·snq (x̃ in float32 here)
        xt32 = xt.astype(np.float32)
        exact_q = np.array([math.fsum(xt32.astype(np.float64) * qf[r]) for r in ok])
        for dq in _fl32_dots(xt32, q[ok]):
            err = sc[ok, 0].astype(np.float64) * np.abs(dq.astype(np.float64) - exact_q)
            lim = gamma * float(np.linalg.norm(xt32.astype(np.float64))) * sc[ok, 3].astype(np.float64)
            assert np.all(err <= lim), ok[np.argmax(err - lim)]
    # x̃ = x along a row's own quantization residual w − s·q (the worst direction): the bound holds and is nearly met
    for r in fin[sc[fin, 0] > 0]:
        if r in (22, 23):
            continue  # no residual
        s, e = float(sc[r, 0]), float(sc[r, 1])
        x = _bf16_values(ew.f32_to_bf16((w[r] - s * qf[r]).astype(np.float32))).astype(np.float64)
        gap = abs(math.fsum(x * w[r]) - s * math.fsum(x * qf[r]))
        ratio = gap / (float(np.linalg.norm(x)) * e)
        assert 0.95 < ratio <= 1.0 + 1e-9, (r, ratio)


def test_screen_head_rows_is_tight_for_normal_rows() -> None:
    """Normal rows of Qwen3-4B's width: e / nw stays below 0.02 (int8 error ~1%), so candidate sets stay small;
    snq is about nw."""
    rng = np.random.default_rng(5)
    words = ew.f32_to_bf16((rng.standard_normal((64, 2560)) * 0.02).astype(np.float32))
    _, sc = ew.screen_head_rows(words)
    nw = np.linalg.norm(_bf16_values(words).astype(np.float64), axis=1)
    ratio = sc[:, 1] / sc[:, 2]
    assert np.all(ratio < 0.02) and np.all(ratio > 0.001), (ratio.min(), ratio.max())
    assert np.all(sc[:, 2] >= nw) and np.allclose(sc[:, 2], nw, rtol=1e-6, atol=0)
    assert np.allclose(sc[:, 3] / nw, 1, atol=0.02)


def test_screen_head_rows_slices_agree_and_reject_bad_input() -> None:
    rng = np.random.default_rng(9)
    words = ew.f32_to_bf16(rng.standard_normal((50, 32)).astype(np.float32))
    q, sc = ew.screen_head_rows(words)
    parts = [ew.screen_head_rows(words[a : a + 7]) for a in range(0, 50, 7)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), q)
    assert np.concatenate([p[1] for p in parts]).tobytes() == sc.tobytes()
    with pytest.raises(ValueError, match="uint16"):
        ew.screen_head_rows(words.astype(np.float32))


def _data_offsets(path: Path) -> tuple[int, dict[str, tuple[str, list[int], list[int]]]]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    return 8 + n, {k: (v["dtype"], v["shape"], v["data_offsets"]) for k, v in header.items()}


def _head_words(tied: bool) -> tuple[dict, dict[str, np.ndarray], str]:
    cfg = TINY | {"tie_word_embeddings": tied}
    t = hf_tensors(cfg, seed=4)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    h = t[head].copy()
    h[3] = 0  # an all-zero row
    h[5, 7] = 0x7F80  # +inf
    h[9, 1] = 0x7FC0  # NaN
    h[11, 0] = 0x4700  # an outlier, 32768
    t[head] = h
    return cfg, t, head


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_export_writes_the_screened_head(tmp_path: Path, tied: bool) -> None:
    """The default export (= --screened-head): q8 (I8 [V, H]) and rows (F32 [V, 4]) after rope.cos_sin, equal to
    screen_head_rows of the exported head; every other tensor's bytes and order as in a --no-screened-head export
    (which omits both). The API's default is the CLI's."""
    cfg, t, head = _head_words(tied)
    ckpt = write_checkpoint(tmp_path / "c", cfg, t, shards=2)
    on, off = tmp_path / "on.safetensors", tmp_path / "off.safetensors"
    assert ew.main([str(ckpt), "--out", str(on), "--quiet"]) == 0
    plan = ew.plan_export(ew.Checkpoint(ckpt), cfg["max_position_embeddings"])
    assert ew.main([str(ckpt), "--out", str(off), "--quiet", "--no-screened-head"]) == 0
    for flag in ("--screened-head", None):  # the explicit flag, and the API's default
        again = tmp_path / "again.safetensors"
        if flag:
            assert ew.main([str(ckpt), "--out", str(again), "--quiet", flag]) == 0
        else:
            ew.export(ckpt, again, progress=False)
        assert again.read_bytes() == on.read_bytes(), flag
        again.unlink()

    got, meta = read_export(on)
    base, meta_off = read_export(off)
    assert meta["screened_head"] == "true" and meta_off["screened_head"] == "false"
    assert set(got) == set(base) | {"lm_head.screen.q8", "lm_head.screen.rows"}
    assert "lm_head.screen.q8" not in base and "lm_head.screen.rows" not in base
    for name, arr in base.items():
        assert got[name].tobytes() == arr.tobytes(), name
    q8, rows = got["lm_head.screen.q8"], got["lm_head.screen.rows"]
    assert q8.dtype == np.int8 and q8.shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert rows.dtype == np.float32 and rows.shape == (cfg["vocab_size"], 4)
    want_q, want_sc = ew.screen_head_rows(got[head])
    np.testing.assert_array_equal(got[head], t[head])
    assert q8.tobytes() == want_q.tobytes() and rows.tobytes() == want_sc.tobytes()
    assert np.isnan(rows[5]).all() and np.isnan(rows[9]).all() and (q8[5] == 0).all() and (q8[9] == 0).all()
    assert rows[3].tolist() == [0.0] * 4 and rows[11, 0] == np.float32(32768 / 127)
    assert np.isfinite(np.delete(rows, [5, 9], axis=0)).all()

    # file order: the same tensors at the same places, the two new ones after the rope table; size = header + plan
    start_on, h_on = _data_offsets(on)
    start_off, h_off = _data_offsets(off)
    order = sorted(h_on, key=lambda k: h_on[k][2][0])
    assert order[-3:] == ["rope.cos_sin", "lm_head.screen.q8", "lm_head.screen.rows"]
    assert order[:-2] == sorted(h_off, key=lambda k: h_off[k][2][0])
    assert all(h_on[k] == v for k, v in h_off.items())
    raw_on, raw_off = on.read_bytes(), off.read_bytes()
    assert raw_on[start_on : start_on + len(raw_off) - start_off] == raw_off[start_off:]
    assert len(raw_on) == start_on + sum(o.nbytes for o in plan)
    assert h_on["lm_head.screen.q8"][0] == "I8" and h_on["lm_head.screen.rows"][0] == "F32"


def test_screened_head_from_an_f32_checkpoint(tmp_path: Path) -> None:
    """The derived tensors come from the head as the export writes it: after f32 -> bf16 rounding."""
    cfg, t, head = _head_words(False)
    f32 = {k: _bf16_values(v) * np.float32(1 + 2**-12) for k, v in t.items()}  # sub-bf16 noise to round away
    ew.export(write_checkpoint(tmp_path / "c", cfg, f32), tmp_path / "w.safetensors", screened_head=True,
              progress=False)
    got, _ = read_export(tmp_path / "w.safetensors")
    np.testing.assert_array_equal(got[head], ew.f32_to_bf16(f32[head]))
    want_q, want_sc = ew.screen_head_rows(ew.f32_to_bf16(f32[head]))
    assert got["lm_head.screen.q8"].tobytes() == want_q.tobytes()
    assert got["lm_head.screen.rows"].tobytes() == want_sc.tobytes()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_screened_head_is_written_in_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool) -> None:
    """With small chunks the head is read and screened a few rows at a time (never whole), and the derived tensors
    are byte-identical to an export with the default chunk size."""
    cfg, t, head = _head_words(tied)
    ckpt = write_checkpoint(tmp_path / "c", cfg, t, shards=3)
    ew.export(ckpt, tmp_path / "big.safetensors", screened_head=True, progress=False)
    want = (tmp_path / "big.safetensors").read_bytes()

    monkeypatch.setattr(ew, "CHUNK_BYTES", 20000)  # 9 rows of 64 at 32 bytes of temporaries an element
    calls: list[int] = []
    real = ew.screen_head_rows
    monkeypatch.setattr(ew, "screen_head_rows", lambda w: calls.append(len(w)) or real(w))
    ew.export(ckpt, tmp_path / "small.safetensors", screened_head=True, progress=False)
    assert len(calls) >= 10 and max(calls) < cfg["vocab_size"] and sum(calls) == cfg["vocab_size"]  # one pass
    assert (tmp_path / "small.safetensors").read_bytes() == want

    monkeypatch.setattr(ew, "CHUNK_BYTES", 1000)  # one row a slice, the source read in 1000-byte pieces
    calls.clear()
    ew.export(ckpt, tmp_path / "tiny.safetensors", screened_head=True, progress=False)
    assert calls == [1] * cfg["vocab_size"]
    assert (tmp_path / "tiny.safetensors").read_bytes() == want


def test_only_screened_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--only-screened-head: a file of the two derived tensors alone, the same bytes as in a --screened-head export;
    with --screened-head or --no-screened-head too it is refused (one or the other)."""
    cfg, t, _ = _head_words(False)
    ckpt = write_checkpoint(tmp_path / "c", cfg, t)
    ew.export(ckpt, tmp_path / "full.safetensors", screened_head=True, progress=False)
    assert ew.main([str(ckpt), "--out", str(tmp_path / "s.safetensors"), "--quiet", "--only-screened-head"]) == 0
    full, _ = read_export(tmp_path / "full.safetensors")
    got, meta = read_export(tmp_path / "s.safetensors")
    assert set(got) == {"lm_head.screen.q8", "lm_head.screen.rows"}
    for name, arr in got.items():
        assert arr.tobytes() == full[name].tobytes(), name
    assert meta["screened_head"] == "true" and meta["screened_head_only"] == "true" and "rope_positions" not in meta
    assert meta["source_dtypes"] == "BF16"
    ew.export(ckpt, tmp_path / "api.safetensors", only_screened_head=True, progress=False)  # the API needs no other flag
    assert (tmp_path / "api.safetensors").read_bytes() == (tmp_path / "s.safetensors").read_bytes()
    for other in ("--screened-head", "--no-screened-head"):
        with pytest.raises(SystemExit):
            ew.main([str(ckpt), "--out", str(tmp_path / "x.safetensors"), "--only-screened-head", other])
        assert "not allowed with argument" in capsys.readouterr().err
        assert not (tmp_path / "x.safetensors").exists()
