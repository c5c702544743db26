"""The seed article's manifest snippets (shared/seeds/003_*.txt §7) load as written.

`fixtures/article.json` wraps them into one complete manifest, adding only the
declarations they reference (ops `embedding` and `gemm`, modules `vllm_layernorm` and
`embedding`, the buffers, a `prefill` program). The snippets below are copied verbatim
from the article, comments included; JSON has no comments, so the fixture carries them
without their `// ...` remarks. The tests check that each snippet, so stripped, is the
same JSON as the corresponding part of the fixture, and that its text appears in the
fixture unchanged (up to indentation).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from kern_schema import ExprNode, Manifest, State, decode, dump, load, parse_param_type, to_builtins

FIXTURE = Path(__file__).parent / "fixtures" / "article.json"

HEADER = """{
 "schema_version": 4,
 "model": "qwen3-4b-dspark",
 "vars": {
  "tokens": { "max": 2048 },   // chunk prefill 上限
  "seqs":   { "max": 256 }     // max batch size
 }
}"""

STATES_4B = """"states": {
 "kv":       { "bytes_per_token": 147456 },
 "draft_kv": { "bytes_per_token": 20480 }
}"""

STATES_GDN = """"states": {
 "kv":       { "bytes_per_token": 65536 },
 "gdn":      { "bytes_per_seq": 163577856 },
 "draft_kv": { "bytes_per_token": 20480 }
}"""

MODULES = """"argmax": {
 "source": "argmax.cubin",
 "sha256": "25374575bd35dbd9fe07f90982d0da0c2d4a72cc6ac88df5ec92cdb62a3beb16"
},
"cache": {
 "source": "cache.cubin",
 "sha256": "93d7768f15ce02e252ad208dca2f6803d8ad65296d57f3444dccb9d1e6b88ac5"
},
"chunk_h": {
 "source": "chunk_h.cubin",
 "sha256": "f0b2bd305bc428b03b06f7073efb3c73d0161fc8c1613c1047e169eae423f32c"
},

// 直接声明 HF 上的路径也是 ok 的
"activation": {
 "source": "hf:kernels-community/activation/build/torch29-cxx11-cu130-aarch64-linux/activation/_activation_320b408.abi3.so",
 "sha256": "73748b54059552f5983322f7dedc36ed349b38ad6fb9318301bb4965b1fe49aa"
}"""

OPS = """"ops": {
 "rms_norm": {
  "params": [
   "out buffer<bf16>",
   "in buffer<bf16>",
   "in buffer<bf16>",
   "i32"
  ],
  "impl": {
   "launches": [
    {
     "module": "vllm_layernorm",
     "entry": "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii",
     "params": [
      "out buffer<bf16>",
      "in buffer<bf16>",
      "i64", "i64", "i64", "i64", "i64",
      "in buffer<bf16>",
      "i64",
      "f32",
      "i32",
      "i32"
     ],
     "block": [320, 1, 1],
     "grid": ["tokens", 1, 1],
     "args": [
      { "param": 0 },
      { "param": 1 },
      { "i64": 2560 },
      { "i64": 0 },
      { "i64": 0 },
      { "i64": 0 },
      { "i64": 0 },
      { "param": 2 },
      { "i64": 0 },
      { "f32": 9.999999974752427e-07 },
      { "param": 3 },
      { "i32": 2560 }
     ]
    }
   ]
  }
 }
}"""

CALLS = """"calls": [
 {
  "label": "embed",
  "op": "embedding",
  "args": [
   { "buf": "token_ids" },
   { "buf": "model.embed_tokens.weight" },
   { "buf": "residual" },
   { "var": "tokens" }
  ]
 },
 {
  "label": "l0.input_norm",
  "op": "rms_norm",
  "args": [
   { "buf": "x" },
   { "buf": "residual" },
   { "buf": "model.layers.0.input_layernorm.weight" },
   { "var": "tokens" }
  ]
 },
 {
  "label": "l0.qkv_proj",
  "op": "gemm",
  "args": [
   { "buf": "x" },
   { "buf": "model.layers.0.self_attn.qkv_proj.weight" },
   { "buf": "qkv" },
   { "var": "tokens" },
   { "i32": 6144 },
   { "i32": 2560 }
  ]
 }
]"""


def strip_comments(snippet: str) -> str:
    return "\n".join(re.sub(r"\s*//.*$", "", line) for line in snippet.splitlines())


def as_object(snippet: str) -> dict:
    """A snippet that is a list of members (`"ops": {...}`) as a JSON object."""
    text = strip_comments(snippet)
    return json.loads(text if text.lstrip().startswith("{") else "{" + text + "}")


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load(FIXTURE)


def test_fixture_loads_as_written(manifest):
    assert manifest.schema_version == 4 and manifest.model == "qwen3-4b-dspark"
    assert list(manifest.ops) == ["rms_norm", "embedding", "gemm"]
    assert [c.label for c in manifest.programs["prefill"].calls] == ["embed", "l0.input_norm", "l0.qkv_proj"]


@pytest.mark.parametrize("snippet, path, inner", [
    (HEADER, (), None), (STATES_4B, (), None), (MODULES, ("modules",), None), (OPS, ("ops",), "ops"),
    (CALLS, ("programs", "prefill"), None),
])
def test_each_snippet_is_part_of_the_fixture(raw, snippet, path, inner):
    part = raw
    for p in path:
        part = part[p]
    obj = as_object(snippet)
    for key, value in (obj[inner] if inner else obj).items():
        assert part[key] == value, key  # each member exactly as in the article
    body = squash(strip_comments(snippet).strip("{}") if snippet.startswith("{") else strip_comments(snippet))
    if inner:  # the fixture's object goes on after the article's last member
        body = body.rsplit("}", 1)[0].rstrip()
    assert body in squash(FIXTURE.read_text())


def test_rms_norm_op(manifest):
    op = manifest.ops["rms_norm"]
    assert [str(parse_param_type(p)) for p in op.params] == ["out buffer<bf16>", "in buffer<bf16>",
                                                             "in buffer<bf16>", "i32"]
    (launch,) = op.impl.launches
    assert launch.module == "vllm_layernorm" and launch.entry.startswith("_ZN4vllm15rms_norm_kernel")
    assert len(launch.params) == len(launch.args) == 12
    assert launch.block == [320, 1, 1] and launch.grid == ["tokens", 1, 1]
    assert [a.kind for a in launch.args] == ["param", "param"] + ["i64"] * 4 + ["i64", "param", "i64", "f32",
                                                                                "param", "i32"]
    assert launch.args[9].f32 == 9.999999974752427e-07


def test_calls(manifest):
    embed, norm, qkv = manifest.programs["prefill"].calls
    assert embed.op == "embedding" and [a.buf for a in embed.args[:3]] == [
        "token_ids", "model.embed_tokens.weight", "residual"]
    assert norm.args[3].var == "tokens"
    assert qkv.op == "gemm" and [a.literal for a in qkv.args[4:]] == [6144, 2560]
    names = set(manifest.buffers)
    for call in (embed, norm, qkv):
        assert call.op in manifest.ops
        assert {a.buf for a in call.args if a.buf} <= names


def test_hf_module(manifest):
    act = manifest.modules["activation"]
    assert act.source.startswith("hf:kernels-community/activation/") and len(act.sha256) == 64


def test_the_other_states_example_decodes():
    states = msgspec.json.decode(json.dumps(as_object(STATES_GDN)["states"]), type=dict[str, State])
    assert states["gdn"] == State(bytes_per_seq=163577856)
    assert states["kv"].bytes_per_token == 65536 and states["kv"].align == 256


def test_fixture_round_trips(manifest):
    again = decode(dump(manifest))
    assert again == manifest and dump(again) == dump(manifest)
    assert to_builtins(manifest)["ops"]["rms_norm"] == as_object(OPS)["ops"]["rms_norm"]
    assert not any(isinstance(g, ExprNode) for g in manifest.ops["rms_norm"].impl.launches[0].grid)
