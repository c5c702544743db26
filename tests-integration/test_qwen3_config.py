"""tools/qwen3_config.py: a field of the wrong type is named with the type expected in words and
the value given as config.json spells it (not ``is not (<class 'int'>, <class 'float'>)``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from qwen3_config import PRESETS, ConfigError, Qwen3Config, load_config, preset_hf_config  # noqa: E402


def _refused(edit) -> str:
    cfg = preset_hf_config("0.6b")
    edit(cfg)
    with pytest.raises(ConfigError) as exc:
        Qwen3Config.from_hf(cfg, name="x")
    msg = str(exc.value)
    assert "<class" not in msg and "Traceback" not in msg
    return msg


def _set(key, value):
    def edit(cfg):
        cfg[key] = value
    return edit


@pytest.mark.parametrize("key, value, says", [
    ("rms_norm_eps", "1e-6", 'field `rms_norm_eps` must be a number, got "1e-6" (a string)'),
    ("rms_norm_eps", None, "field `rms_norm_eps` must be a number, got null"),
    ("rms_norm_eps", True, "field `rms_norm_eps` must be a number, got true (a boolean)"),
    ("rope_theta", [1000000], "field `rope_theta` must be a number, got [1000000] (a list)"),
    ("hidden_size", 1024.0, "field `hidden_size` must be an integer, got 1024.0 (a decimal number)"),
    ("hidden_size", "1024", 'field `hidden_size` must be an integer, got "1024" (a string)'),
    ("num_hidden_layers", True, "field `num_hidden_layers` must be an integer, got true (a boolean)"),
    ("vocab_size", {"n": 1}, 'field `vocab_size` must be an integer, got {"n": 1} (an object)'),
    ("tie_word_embeddings", "false", 'field `tie_word_embeddings` must be a boolean (true or false), '
                                     'got "false" (a string)'),
    ("rope_scaling", "yarn", 'field `rope_scaling` must be an object, got "yarn" (a string)'),
    ("layer_types", "full_attention", 'field `layer_types` must be a list, got "full_attention" (a string)'),
])
def test_wrong_type_names_field_expected_type_and_value(key, value, says):
    assert _refused(_set(key, value)) == f"config.json: {says}"


def test_rope_parameters_theta_of_the_wrong_type():
    def edit(cfg):
        del cfg["rope_theta"]
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": "1e6"}
    assert _refused(edit) == ('config.json: field `rope_parameters.rope_theta` must be a number, '
                              'got "1e6" (a string)')

    def not_an_object(cfg):
        cfg["rope_parameters"] = [1e6]
    assert _refused(not_an_object) == "config.json: field `rope_parameters` must be an object, got [1000000.0] (a list)"


def test_a_long_value_is_cut():
    msg = _refused(_set("hidden_size", "x" * 500))
    assert msg == 'config.json: field `hidden_size` must be an integer, got "' + "x" * 58 + '… (a string)'


def test_the_file_is_named(tmp_path):
    import json

    cfg = preset_hf_config("4b")
    cfg["rms_norm_eps"] = "1e-6"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"^" + str(tmp_path / "config.json") + ": field `rms_norm_eps` must be a number"):
        load_config(tmp_path)


def test_right_types_still_load():
    for key in PRESETS:
        Qwen3Config.preset(key)
    cfg = preset_hf_config("0.6b")
    cfg["rms_norm_eps"] = 1  # an integer is a number
    cfg["rope_theta"] = 1e6
    c = Qwen3Config.from_hf(cfg, name="x")
    assert c.rms_norm_eps == 1.0 and c.rope_theta == 1e6 and c.tie_word_embeddings is True
    del cfg["tie_word_embeddings"]  # absent: untied, as before
    assert Qwen3Config.from_hf(cfg, name="x").tie_word_embeddings is False


@pytest.mark.parametrize("eps", [0, -1e-6, float("nan"), float("inf")])
def test_rms_norm_eps_must_be_positive_and_finite(eps):
    """A negative, zero, NaN or infinite eps was accepted (the exporter never uses it; the kernels would divide by
    sqrt(mean(x^2) + eps))."""
    msg = _refused(_set("rms_norm_eps", eps))
    assert msg.startswith("config.json: field `rms_norm_eps` = ") and "must be a positive finite number" in msg


def test_missing_model_type_is_named():
    """A Qwen3ForCausalLM config without `model_type` names the missing field (it said "unsupported architecture
    (model_type=None, architectures=['Qwen3ForCausalLM'])", which contradicts itself); another architecture is still
    refused as unsupported."""
    cfg = preset_hf_config("0.6b")
    del cfg["model_type"]
    with pytest.raises(ConfigError) as exc:
        Qwen3Config.from_hf(cfg, name="x")
    assert str(exc.value) == 'config.json: missing field `model_type` (a Qwen3ForCausalLM config has "model_type": "qwen3")'
    cfg["architectures"] = ["LlamaForCausalLM"]
    with pytest.raises(ConfigError, match="unsupported architecture"):
        Qwen3Config.from_hf(cfg, name="x")
