"""Every rule, violated alone: each case mutates a clean fixture once and expects exactly
the listed (code, location) diagnostics."""

from __future__ import annotations

import copy

import pytest

from verify_helpers import NAMES, check, fixture, found
from kern_schema import SourceMap
from kern_verify import CODES

L0 = ("ops", "rms_norm", "impl", "launches", 0)


def launch(d, op, i=0):
    return d["ops"][op]["impl"]["launches"][i]


def call(d, prog, i=0):
    return d["programs"][prog]["calls"][i]


def s(**kw):
    return kw


def _gemm_then_pdl_kernel(d, pdl_index=0):
    """The gemm fixture plus a kernel call after the GEMM built-in whose launch has `pdl`."""
    ln = fixture("launch")
    d["modules"].update(ln["modules"])
    d["ops"]["rms_norm"] = ln["ops"]["rms_norm"]
    d["ops"]["rms_norm"]["impl"]["launches"][0]["pdl"] = True
    d["buffers"]["y"] = {"dtype": "bf16", "shape": ["tokens", 2560], "class": "output"}
    d["buffers"]["norm.weight"] = {"dtype": "bf16", "shape": [2560], "class": "weight"}
    d["programs"]["decode"]["calls"].append(
        {"label": "l0.norm", "op": "rms_norm", "args": [{"buf": "y"}, {"buf": "x"}, {"buf": "norm.weight"}, {"var": "tokens"}]})


def _extern_then_pdl_launch_in_one_op(d):
    _gemm_then_pdl_kernel(d)
    d["ops"]["rms_norm"]["impl"]["launches"][0]["pdl"] = False
    # one op: the GEMM built-in, then a pdl kernel reading its output
    gemm = d["ops"]["gemm"]
    k = copy.deepcopy(d["ops"]["rms_norm"]["impl"]["launches"][0])
    k.update(pdl=True, args=[{"param": 2}, {"param": 0}, {"i64": 2560}, {"i64": 0}, {"i64": 0}, {"i64": 0}, {"i64": 0},
                             {"param": 0}, {"i64": 0}, {"f32": 1e-6}, {"param": 3}, {"i32": 2560}])
    k["params"][0] = "inout buffer<bf16>"
    gemm["impl"]["launches"].append(k)


# (id, fixture, mutation, expected [(code, location)])
CASES = [
    # --- decoding ---
    ("missing-field", "launch", lambda d: d["buffers"]["x"].pop("dtype"), [("E0003", "buffers.x")]),
    ("missing-top-level", "launch", lambda d: d.pop("states"), [("E0003", "$")]),
    ("unknown-field", "launch", lambda d: d["vars"]["tokens"].update(maximum=3), [("E0004", "vars.tokens.maximum")]),
    ("wrong-type", "launch", lambda d: d["vars"]["tokens"].update(max="2048"), [("E0005", "vars.tokens.max")]),
    ("two-arg-forms", "launch", lambda d: launch(d, "rms_norm")["args"][0].update(buf="x"),
     [("E0005", "ops.rms_norm.impl.launches[0].args[0]")]),
    ("unknown-expr-form", "launch", lambda d: launch(d, "rms_norm")["grid"].__setitem__(0, {"add": ["tokens", 1]}),
     [("E0021", "ops.rms_norm.impl.launches[0].grid[0].add")]),
    # --- group 1-4 ---
    ("schema-version", "launch", lambda d: d.update(schema_version=3), [("E0010", "schema_version")]),
    ("var-min-gt-max", "launch", lambda d: d["vars"]["tokens"].update(min=10, max=5), [("E0011", "vars.tokens")]),
    ("var-max-zero", "carry", lambda d: d["vars"]["seqs"].update(min=0, max=0), [("E0011", "vars.seqs.max")]),
    ("var-min-negative", "carry", lambda d: d["vars"]["seqs"].update(min=-1), [("E0011", "vars.seqs.min")]),
    ("state-two-units", "carry", lambda d: d["states"]["kv"].update(bytes_per_seq=16), [("E0012", "states.kv")]),
    ("state-no-unit", "carry", lambda d: d["states"]["kv"].pop("bytes_per_token"), [("E0012", "states.kv")]),
    ("state-zero-size", "carry", lambda d: d["states"]["kv"].update(bytes_per_token=0),
     [("E0012", "states.kv.bytes_per_token")]),
    ("state-per-seq-without-seqs", "carry", lambda d: d["vars"].pop("seqs"), [("E0012", "states.pos.bytes_per_seq")]),
    ("state-align", "carry", lambda d: d["states"]["pos"].update(align=48), [("E0013", "states.pos.align")]),
    ("buffer-dtype", "launch", lambda d: d["buffers"]["x"].update(dtype="bfloat16"), [("E0014", "buffers.x.dtype")]),
    ("scratch-dtype", "scratch", lambda d: d["ops"]["paged_attention"]["impl"]["scratch"]["lse"].update(dtype="f31"),
     [("E0014", "ops.paged_attention.impl.scratch.lse.dtype")]),
    ("dim-unknown-var", "launch", lambda d: d["buffers"]["x"]["shape"].__setitem__(0, "tokenz"),
     [("E0015", "buffers.x.shape[0]")]),
    ("dim-zero", "launch", lambda d: d["buffers"]["x"]["shape"].__setitem__(1, 0), [("E0015", "buffers.x.shape[1]")]),
    ("buffer-class", "launch", lambda d: d["buffers"]["x"].update({"class": "scratch"}), [("E0022", "buffers.x.class")]),
    ("size-overflow", "gemm", lambda d: d["buffers"]["model.layers.0.self_attn.qkv_proj.weight"].update(shape=[2**40, 2**40]),
     [("E0016", 'buffers["model.layers.0.self_attn.qkv_proj.weight"].shape')]),
    ("module-absolute", "launch", lambda d: d["modules"]["vllm_layernorm"].update(source="/opt/k/layernorm.cubin"),
     [("E0017", "modules.vllm_layernorm.source")]),
    ("module-dotdot", "launch", lambda d: d["modules"]["vllm_layernorm"].update(source="k/../../layernorm.cubin"),
     [("E0017", "modules.vllm_layernorm.source")]),
    ("module-hf-no-sha", "launch", lambda d: d["modules"]["vllm_layernorm"].update(source="hf:org/repo/ln.cubin") or
     d["modules"]["vllm_layernorm"].pop("sha256"), [("E0017", "modules.vllm_layernorm")]),
    ("module-hf-malformed", "launch", lambda d: d["modules"]["vllm_layernorm"].update(source="hf:org/ln.cubin"),
     [("E0017", "modules.vllm_layernorm.source")]),
    ("sha256-short", "launch", lambda d: d["modules"]["vllm_layernorm"].update(sha256="abc123"),
     [("E0018", "modules.vllm_layernorm.sha256")]),
    ("sha256-not-hex", "launch", lambda d: d["modules"]["vllm_layernorm"].update(sha256="g" * 64),
     [("E0018", "modules.vllm_layernorm.sha256")]),
    ("module-no-sha (warning)", "launch", lambda d: d["modules"]["vllm_layernorm"].pop("sha256"),
     [("E0019", "modules.vllm_layernorm")]),
    # --- types and expressions ---
    ("iface-type", "launch", lambda d: d["ops"]["rms_norm"]["params"].__setitem__(3, "int"),
     [("E0020", "ops.rms_norm.params[3]")]),
    ("iface-no-direction", "launch", lambda d: d["ops"]["rms_norm"]["params"].__setitem__(1, "buffer<bf16>"),
     [("E0020", "ops.rms_norm.params[1]")]),
    ("launch-type", "launch", lambda d: launch(d, "rms_norm")["params"].__setitem__(11, "i65"),
     [("E0020", "ops.rms_norm.impl.launches[0].params[11]")]),
    ("expr-unknown-var", "launch", lambda d: launch(d, "rms_norm")["grid"].__setitem__(0, "tokenz"),
     [("E0021", "ops.rms_norm.impl.launches[0].grid[0]")]),
    ("expr-div-zero", "scratch", lambda d: launch(d, "paged_attention", 1)["grid"].__setitem__(0, {"ceil_div": ["tokens", 0]}),
     [("E0021", "ops.paged_attention.impl.launches[1].grid[0]")]),
    # --- group 5: launches ---
    ("module-undeclared", "launch", lambda d: d["modules"].pop("vllm_layernorm"), [("E0030", "ops.rms_norm.impl.launches[0].module")]),
    ("extern-with-block", "gemm", lambda d: launch(d, "gemm").update(block=[128, 1, 1]),
     [("E0031", "ops.gemm.impl.launches[0]")]),
    ("launch-no-grid", "launch", lambda d: launch(d, "rms_norm").pop("grid"), [("E0031", "ops.rms_norm.impl.launches[0]")]),
    ("block-x", "launch", lambda d: launch(d, "rms_norm").update(block=[2048, 1, 1]),
     [("E0032", "ops.rms_norm.impl.launches[0].block[0]")]),
    ("block-z", "launch", lambda d: launch(d, "rms_norm").update(block=[1, 1, 65]),
     [("E0032", "ops.rms_norm.impl.launches[0].block[2]")]),
    ("block-product", "launch", lambda d: launch(d, "rms_norm").update(block=[64, 32, 1]),
     [("E0032", "ops.rms_norm.impl.launches[0].block")]),
    ("block-dims", "launch", lambda d: launch(d, "rms_norm").update(block=[64, 1]),
     [("E0032", "ops.rms_norm.impl.launches[0].block")]),
    ("grid-y-max", "scratch", lambda d: launch(d, "paged_attention")["grid"].__setitem__(1, {"mul": ["tokens", 2000]}),
     [("E0033", "ops.paged_attention.impl.launches[0].grid[1]")]),
    ("grid-x-max", "launch", lambda d: launch(d, "rms_norm")["grid"].__setitem__(0, {"mul": ["tokens", 2**20]}),
     [("E0033", "ops.rms_norm.impl.launches[0].grid[0]")]),
    ("grid-zero", "launch", lambda d: launch(d, "rms_norm")["grid"].__setitem__(2, 0),
     [("E0033", "ops.rms_norm.impl.launches[0].grid[2]")]),
    ("grid-zero-at-min", "launch", lambda d: d["vars"]["tokens"].update(min=0),
     [("E0033", "ops.rms_norm.impl.launches[0].grid[0]")]),
    ("grid-two-dims", "launch", lambda d: launch(d, "rms_norm")["grid"].pop(), [("E0033", "ops.rms_norm.impl.launches[0].grid")]),
    ("shared-mem", "launch", lambda d: launch(d, "rms_norm").update(shared_mem=232449),
     [("E0034", "ops.rms_norm.impl.launches[0].shared_mem")]),
    ("carveout-over-100", "launch", lambda d: launch(d, "rms_norm").update(carveout=101),
     [("E0095", "ops.rms_norm.impl.launches[0].carveout")]),
    ("carveout-negative", "launch", lambda d: launch(d, "rms_norm").update(carveout=-1),
     [("E0095", "ops.rms_norm.impl.launches[0].carveout")]),
    ("extern-with-carveout", "gemm", lambda d: launch(d, "gemm").update(carveout=0),
     [("E0031", "ops.gemm.impl.launches[0]")]),
    ("launch-arity", "launch", lambda d: launch(d, "rms_norm")["args"].pop(), [("E0035", "ops.rms_norm.impl.launches[0].args")]),
    ("extern-extra-arg", "gemm", lambda d: launch(d, "gemm")["args"].append({"i32": 1}), [("E0035", "ops.gemm.impl.launches[0].args")]),
    ("extern-missing-arg", "gemm", lambda d: launch(d, "gemm")["args"].pop(),
     [("E0035", "ops.gemm.impl.launches[0].args"), ("E0042", "ops.gemm.params[5]")]),
    ("launch-dtype", "scratch", lambda d: launch(d, "paged_attention")["params"].__setitem__(0, "in buffer<f16>"),
     [("E0036", "ops.paged_attention.impl.launches[0].args[0]")]),
    ("launch-state-to-buffer", "scratch", lambda d: launch(d, "paged_attention")["params"].__setitem__(1, "in buffer<bf16>"),
     [("E0036", "ops.paged_attention.impl.launches[0].args[1]")]),
    ("launch-scratch-to-scalar", "scratch", lambda d: launch(d, "paged_attention", 1)["params"].__setitem__(1, "i64"),
     [("E0036", "ops.paged_attention.impl.launches[1].args[1]")]),
    ("launch-nonzero-ptr-literal", "scratch", lambda d: launch(d, "paged_attention")["args"].__setitem__(7, {"i64": 8}),
     [("E0036", "ops.paged_attention.impl.launches[0].args[7]")]),
    ("launch-writes-in-param", "launch", lambda d: launch(d, "rms_norm")["params"].__setitem__(1, "inout buffer<bf16>"),
     [("E0037", "ops.rms_norm.impl.launches[0].args[1]")]),
    ("param-index", "launch", lambda d: launch(d, "rms_norm")["args"].__setitem__(8, {"param": 9}),
     [("E0038", "ops.rms_norm.impl.launches[0].args[8].param")]),
    ("extern-unknown", "gemm", lambda d: launch(d, "gemm").update(extern="cublaslt.gemm"), [("E0039", "ops.gemm.impl.launches[0].extern")]),
    ("extern-type", "gemm", lambda d: launch(d, "gemm")["args"].__setitem__(3, {"f32": 1.0}) or
     launch(d, "gemm")["args"].append({"param": 3}) or launch(d, "gemm")["args"].pop(),
     [("E0042", "ops.gemm.params[3]"), ("E0053", "ops.gemm.impl.launches[0].args[3].f32")]),
    ("launch-buf-arg", "launch", lambda d: launch(d, "rms_norm")["args"].__setitem__(2, {"buf": "x"}),
     [("E0040", "ops.rms_norm.impl.launches[0].args[2]")]),
    ("call-param-arg", "launch", lambda d: call(d, "decode")["args"].__setitem__(3, {"param": 0}),
     [("E0040", "programs.decode.calls[0].args[3]")]),
    # --- group 6: impl against interface ---
    ("out-never-written", "carry", lambda d: launch(d, "take_last")["params"].__setitem__(1, "in buffer<bf16>"),
     [("E0041", "ops.take_last.params[1]")]),
    ("iface-param-unused", "gemm", lambda d: launch(d, "gemm")["args"].__setitem__(4, {"i32": 6144}),
     [("E0042", "ops.gemm.params[4]")]),
    ("scratch-offset-misaligned", "scratch", lambda d: launch(d, "paged_attention", 1)["args"][1].update(offset=6),
     [("E0043", "ops.paged_attention.impl.launches[1].args[1].offset")]),
    ("scratch-offset-oob", "scratch", lambda d: launch(d, "paged_attention", 1)["args"][1].update(offset=64 * 32 * 16 * 4),
     [("E0043", "ops.paged_attention.impl.launches[1].args[1].offset")]),
    ("scratch-dtype-mismatch", "scratch", lambda d: launch(d, "paged_attention", 1)["params"].__setitem__(1, "in buffer<f16>"),
     [("E0043", "ops.paged_attention.impl.launches[1].args[1]")]),
    ("scratch-read-before-write", "scratch",
     lambda d: launch(d, "paged_attention")["params"].__setitem__(3, "inout buffer<f32>"),
     [("E0044", "ops.paged_attention.impl.launches[0].args[3]")]),
    ("scratch-launch-order", "scratch", lambda d: d["ops"]["paged_attention"]["impl"]["launches"].reverse(),
     [("E0044", "ops.paged_attention.impl.launches[0].args[0]"), ("E0044", "ops.paged_attention.impl.launches[0].args[1]")]),
    ("scratch-unused", "scratch", lambda d: d["ops"]["paged_attention"]["impl"]["scratch"].update(spare={"dtype": "f32", "shape": [4]}),
     [("E0045", "ops.paged_attention.impl.scratch.spare")]),
    ("out-read-first (extern acc)", "gemm", lambda d: launch(d, "gemm").update(extern="cublaslt.gemm_bf16_tn_acc"),
     [("E0046", "ops.gemm.impl.launches[0].args[2]")]),
    ("inout-never-written (warning)", "carry", lambda d: launch(d, "fill_kv")["params"].__setitem__(1, "in ptr"),
     [("E0047", "ops.fill_kv.params[1]")]),
    # --- group 7: calls ---
    ("op-unknown", "carry", lambda d: d["programs"]["decode"]["calls"].append({"label": "x", "op": "nope", "args": []}),
     [("E0050", "programs.decode.calls[1].op")]),
    ("call-arity", "gemm", lambda d: call(d, "decode")["args"].append({"i32": 1}), [("E0051", "programs.decode.calls[0].args")]),
    ("call-dtype", "gemm", lambda d: d["buffers"]["qkv"].update(dtype="f16"), [("E0052", "programs.decode.calls[0].args[2]")]),
    ("call-state-to-scalar", "carry", lambda d: call(d, "prefill")["args"].__setitem__(3, {"state": "kv"}),
     [("E0052", "programs.prefill.calls[0].args[3]")]),
    ("call-buffer-to-ptr", "carry", lambda d: call(d, "prefill", 1)["args"].__setitem__(2, {"buf": "h"}),
     [("E0052", "programs.prefill.calls[1].args[2]"), ("E0071", "states.pos")]),
    ("u8-from-tokens-2048", "launch", lambda d: d["ops"]["rms_norm"]["params"].__setitem__(3, "u8") or
     launch(d, "rms_norm")["params"].__setitem__(10, "u8"), [("E0053", "programs.decode.calls[0].args[3].var")]),
    ("literal-out-of-own-range", "gemm", lambda d: call(d, "decode")["args"].__setitem__(4, {"i32": 2**31}),
     [("E0053", "programs.decode.calls[0].args[4].i32")]),
    ("literal-out-of-param-range", "gemm", lambda d: call(d, "decode")["args"].__setitem__(4, {"i64": 2**40}),
     [("E0053", "programs.decode.calls[0].args[4].i64")]),
    ("literal-float-to-int", "gemm", lambda d: call(d, "decode")["args"].__setitem__(4, {"f32": 6144.0}),
     [("E0053", "programs.decode.calls[0].args[4].f32")]),
    ("launch-literal-u8", "carry", lambda d: launch(d, "lm_head_argmax", 1)["args"].__setitem__(2, {"u16": 70000}),
     [("E0053", "ops.lm_head_argmax.impl.launches[1].args[2].u16")]),
    ("expr-range", "carry", lambda d: call(d, "prefill", 2)["args"].__setitem__(2, {"expr": {"mul": ["tokens", 2**30]}}),
     [("E0053", "programs.prefill.calls[2].args[2].expr")]),
    ("launch-expr-range", "scratch", lambda d: launch(d, "paged_attention", 1)["args"].__setitem__(3, {"expr": {"mul": ["tokens", 2**30]}}),
     [("E0053", "ops.paged_attention.impl.launches[1].args[3].expr")]),
    ("iface-scalar-wider", "launch", lambda d: d["ops"]["rms_norm"]["params"].__setitem__(3, "i64"),
     [("E0053", "ops.rms_norm.impl.launches[0].args[10]")]),
    ("unknown-buffer", "carry", lambda d: call(d, "decode")["args"].__setitem__(1, {"buf": "embed.weights"}),
     [("E0054", "programs.decode.calls[0].args[1].buf")]),
    ("unknown-var", "launch", lambda d: call(d, "decode")["args"].__setitem__(3, {"var": "tokenz"}),
     [("E0054", "programs.decode.calls[0].args[3].var")]),
    ("buf-offset-misaligned", "scratch", lambda d: call(d, "decode")["args"][0].update(offset=3),
     [("E0055", "programs.decode.calls[0].args[0].offset")]),
    ("buf-offset-negative", "scratch", lambda d: call(d, "decode")["args"][0].update(offset=-2),
     [("E0055", "programs.decode.calls[0].args[0].offset")]),
    ("state-offset-misaligned", "scratch", lambda d: call(d, "decode")["args"][1].update(offset=8),
     [("E0055", "programs.decode.calls[0].args[1].offset")]),
    ("buf-offset-oob", "scratch", lambda d: call(d, "decode")["args"][0].update(offset=64 * 32 * 128 * 2),
     [("E0056", "programs.decode.calls[0].args[0].offset")]),
    ("state-offset-oob-per-seq", "carry", lambda d: call(d, "prefill", 1)["args"][2].update(offset=256),
     [("E0056", "programs.prefill.calls[1].args[2].offset")]),
    ("state-offset-over-int64", "carry", lambda d: call(d, "prefill", 1)["args"][1].update(offset=2**64),
     [("E0056", "programs.prefill.calls[1].args[1].offset")]),
    ("duplicate-label", "carry", lambda d: call(d, "prefill", 1).update(label="embed"),
     [("E0057", "programs.prefill.calls[1].label")]),
    ("empty-label", "carry", lambda d: call(d, "prefill", 1).update(label=" "), [("E0058", "programs.prefill.calls[1].label")]),
    # --- group 8: dataflow ---
    ("workspace-read-first", "carry", lambda d: call(d, "decode")["args"].__setitem__(0, {"buf": "h"}),
     [("E0060", "programs.decode.calls[0].args[0]")]),
    ("write-input", "launch", lambda d: d["ops"]["rms_norm"]["params"].__setitem__(1, "inout buffer<bf16>") or
     launch(d, "rms_norm")["params"].__setitem__(1, "inout buffer<bf16>"), [("E0061", "programs.decode.calls[0].args[1]")]),
    ("write-weight", "launch", lambda d: d["ops"]["rms_norm"]["params"].__setitem__(2, "inout buffer<bf16>") or
     launch(d, "rms_norm")["params"].__setitem__(7, "inout buffer<bf16>"), [("E0061", "programs.decode.calls[0].args[2]")]),
    ("carry-never-written", "carry", lambda d: d["buffers"]["token_ids"].update({"class": "carry"}),
     [("E0062", "buffers.token_ids")]),
    ("output-never-written", "carry", lambda d: d["buffers"]["token_ids"].update({"class": "output"}),
     [("E0062", "buffers.token_ids"), ("E0063", "programs.prefill.calls[0].args[0]")]),
    # --- group 9: unused declarations ---
    ("unused-var", "launch", lambda d: d["vars"].update(batch={"max": 8}), [("E0070", "vars.batch")]),
    ("unused-state", "launch", lambda d: d["states"].update(kv={"bytes_per_token": 1024}), [("E0071", "states.kv")]),
    ("unused-buffer", "launch", lambda d: d["buffers"].update(tmp={"dtype": "f32", "shape": [4], "class": "workspace"}),
     [("E0072", "buffers.tmp")]),
    ("unused-weight", "gemm", lambda d: d["buffers"].update({"lm_head.weight": {"dtype": "bf16", "shape": [8, 8], "class": "weight"}}),
     [("E0072", 'buffers["lm_head.weight"]')]),
    ("unused-module", "launch", lambda d: d["modules"].update(old={"source": "old.cubin", "sha256": "0" * 64}),
     [("E0073", "modules.old")]),
    ("unused-op", "launch", lambda d: d["ops"].update(rms_norm2=d["ops"]["rms_norm"]), [("E0074", "ops.rms_norm2")]),
    ("op-without-launches", "scratch", lambda d: d["ops"]["paged_attention"]["impl"].update(launches=[]),
     [("E0048", "ops.paged_attention.impl.launches"), ("E0073", "modules.attn")]),  # no E0042 per param, no E0045
    ("empty-program", "carry", lambda d: d["programs"].update(warmup={"calls": []}),
     [("E0075", "programs.warmup.calls")]),
    # --- launch attributes: programmatic dependent launch ---
    ("pdl-on-extern", "gemm", lambda d: launch(d, "gemm").update(pdl=True), [("E0090", "ops.gemm.impl.launches[0].pdl")]),
    ("pdl-first-launch-of-program (warning)", "carry", lambda d: launch(d, "embed").update(pdl=True),
     [("E0091", "programs.prefill.calls[0]")]),
    ("pdl-after-extern-call (warning)", "gemm", _gemm_then_pdl_kernel, [("E0091", "programs.decode.calls[1]")]),
    ("pdl-after-extern-launch (warning)", "gemm", _extern_then_pdl_launch_in_one_op,
     [("E0091", "ops.gemm.impl.launches[1].pdl")]),
]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_is_clean(name):
    assert check(fixture(name)) == []


@pytest.mark.parametrize("case, fix, mutate, expected", CASES, ids=[c[0] for c in CASES])
def test_rule(case, fix, mutate, expected):
    d = fixture(fix)
    mutate(d)
    diags = check(d)
    assert found(diags) == sorted(expected), "\n".join(str(x) for x in diags)
    for diag in diags:
        assert diag.line is not None and diag.column is not None, diag
        assert diag.severity == CODES[diag.code].severity
        assert diag.message


def test_every_rule_code_is_tested():
    tested = {code for *_, exp in CASES for code, _ in exp}
    # test_text.py; test_kernels.py (the cubin checks, E0080-E0089, the clusters' E0092-E0093 and the static shared
    # memory's E0094, need real cubins)
    untestable_here = {"E0001", "E0002", "E0099", "E0092", "E0093", "E0094"} | {f"E008{i}" for i in range(10)}
    assert set(CODES) - tested - untestable_here == set()


@pytest.mark.parametrize("mutate", [
    lambda d: launch(d, "fill_kv").update(pdl=True),             # after embed's kernel
    lambda d: launch(d, "lm_head_argmax", 1).update(pdl=True),   # after the op's own first kernel
    lambda d: launch(d, "lm_head_argmax", 0).update(pdl=True),   # decode's first launch: warned
    lambda d: launch(d, "fill_kv").update(pdl=False),            # explicit false: nothing at all
], ids=["after-kernel-call", "after-kernel-launch", "program-start", "explicit-false"])
def test_pdl_after_a_kernel_is_clean(mutate):
    d = fixture("carry")
    mutate(d)
    diags = check(d)
    if launch(d, "lm_head_argmax", 0).get("pdl"):
        assert found(diags) == [("E0091", "programs.decode.calls[0]")]
    else:
        assert diags == []


@pytest.mark.parametrize("carveout", [0, 50, 100])
def test_carveout_in_range_is_clean(carveout):
    d = fixture("launch")
    launch(d, "rms_norm").update(carveout=carveout, shared_mem=1024)
    assert check(d) == []


def test_carveout_error_names_op_launch_and_value():
    d = fixture("launch")
    launch(d, "rms_norm").update(carveout=150)
    (diag,) = check(d)
    assert diag.code == "E0095" and diag.severity == "error"
    assert "op `rms_norm` launch 0" in diag.message and "carveout 150 is outside 0..100" in diag.message
    assert "0 (the most L1)" in diag.hint and "100 (the most shared memory)" in diag.hint
    assert "omit it for the driver's choice" in diag.hint


@pytest.mark.parametrize("field", ["shared_mem", "carveout"])
def test_extern_launch_with_kernel_field_set_in_python_is_e0031(field):
    """Decoding refuses `shared_mem`/`carveout` on an extern (E0031 above); a Launch changed after construction
    (its `__post_init__` does not run again) still gets E0031 from the rule, at the field."""
    from kern_schema import decode
    from kern_verify import verify
    from verify_helpers import text_of

    m = decode(text_of(fixture("gemm")))
    setattr(m.ops["gemm"].impl.launches[0], field, 0)
    assert found(verify(m)) == [("E0031", f"ops.gemm.impl.launches[0].{field}")]


def test_pdl_warning_names_the_builtin():
    d = fixture("gemm")
    _gemm_then_pdl_kernel(d)
    (diag,) = check(d)
    assert "cublaslt.gemm_bf16_tn" in diag.message and diag.severity == "warning"
    assert "correctness is not affected" in diag.hint


def test_line_and_column_point_at_the_value():
    d = fixture("scratch")
    call(d, "decode")["args"][0]["offset"] = 3
    from verify_helpers import text_of
    text = text_of(d)
    (diag,) = check(d)
    pos = SourceMap.build(text).values[diag.path]
    assert (diag.line, diag.column) == (pos.line, pos.col)
    assert text.splitlines()[diag.line - 1][diag.column - 1:].startswith("3")


def test_hint_for_in_param_written():
    d = fixture("launch")
    launch(d, "rms_norm")["params"][1] = "inout buffer<bf16>"
    (diag,) = check(d)
    assert diag.hint == "declared `in buffer<bf16>` but the kernel writes it: make the interface param `out` or `inout`"


def test_u8_message_names_range():
    d = fixture("launch")
    d["ops"]["rms_norm"]["params"][3] = "u8"
    launch(d, "rms_norm")["params"][10] = "u8"
    (diag,) = check(d)
    assert "call `l0.input_norm`" in diag.message
    assert "[1, 2048]" in diag.message and "u8 [0, 255]" in diag.message


def test_many_errors_at_once():
    d = fixture("carry")
    d["schema_version"] = 5
    d["vars"]["tokens"]["min"] = 9999
    call(d, "decode")["args"][0] = {"buf": "h"}
    d["ops"]["embed"]["params"][3] = "i33"
    codes = {x.code for x in check(d)}
    assert {"E0010", "E0011", "E0060", "E0020"} <= codes


def test_unknown_name_suggestion():
    d = fixture("launch")
    call(d, "decode")["args"][3] = {"var": "tokenz"}
    (diag,) = check(d)
    assert diag.hint == "did you mean `tokens`?"


def test_verify_decoded_manifest_without_source():
    from kern_schema import decode
    from verify_helpers import text_of
    from kern_verify import verify

    d = fixture("scratch")
    call(d, "decode")["args"][0]["offset"] = 3
    (diag,) = verify(decode(text_of(d)))
    assert diag.code == "E0055" and diag.line is None
    assert verify(decode(text_of(fixture("scratch")))) == []


@pytest.mark.parametrize("fix", NAMES)
def test_no_calls_at_all_is_one_cause(fix):
    """`"programs": {}` (or every program's calls empty) gave one E0070-E0074 per declaration (~257 on the Qwen3-4B
    example) and nothing naming the empty programs; now E0075 says it, and the unused declarations of each kind are
    folded into one diagnostic that names the cause and lists the rest."""
    for mutate in (lambda d: d.update(programs={}),
                   lambda d: [p.update(calls=[]) for p in d["programs"].values()]):
        d = fixture(fix)
        kinds = {"ops": "E0074", "buffers": "E0072"}  # modules stay used: declared ops name them
        mutate(d)
        diags = check(d)
        e75 = [x for x in diags if x.code == "E0075"]
        assert e75 and all(x.severity == "error" for x in e75)
        assert len(e75) == (1 if not d["programs"] else len(d["programs"]))
        unused = [x for x in diags if x.code in ("E0070", "E0071", "E0072", "E0073", "E0074")]
        assert len({x.code for x in unused}) == len(unused), "one diagnostic per kind"
        for section, code in kinds.items():
            if d[section]:
                (x,) = [u for u in unused if u.code == code]
                assert any("no program has a call (E0075)" in n.message for n in x.notes), x
                assert len(x.folded) == len(d[section]) - 1
        assert {x.code for x in diags} <= {"E0075", "E0070", "E0071", "E0072", "E0073", "E0074"}, diags


def test_no_program_message_and_hint():
    d = fixture("launch")
    d["programs"] = {}
    (x,) = [y for y in check(d) if y.code == "E0075"]
    assert x.location == "programs" and "declares no program" in x.message and "prefill" in x.hint
    d = fixture("carry")
    d["programs"]["decode"]["calls"] = []
    (x,) = [y for y in check(d) if y.code == "E0075"]
    assert x.message == "program `decode` has no calls: running it would do nothing"
    assert x.hint == "add its calls, or remove `decode` from `programs`"


@pytest.mark.parametrize("doc, keys", [
    ({"format": 1, "target": "sm_90", "kernels": {"k": {"module": "k.cubin"}}}, "`format`, `target`, `kernels`"),
    ({}, None),
])
def test_not_a_manifest_is_one_error(doc, keys):
    """Another tool's JSON object (e.g. a kernels directory's index.json) passed as the manifest: one E0003 that says
    it is not a manifest and where the kernels go, not one E0003 per missing field and one E0004 per key."""
    import json

    from kern_verify import verify_text

    (x,) = verify_text(json.dumps(doc))
    assert x.code == "E0003" and x.severity == "error" and x.location == "$"
    assert x.message.startswith("not a kern manifest: it has none of a manifest's top-level fields (schema_version, ")
    assert (f"; its keys are {keys}" in x.message) if keys else "its keys" not in x.message
    assert "--kernels DIR" in x.hint


def test_a_manifest_missing_fields_keeps_one_error_per_field():
    """With one manifest field present, each missing field is still its own E0003 (the fold is for non-manifests)."""
    import json

    from kern_verify import verify_text

    diags = verify_text(json.dumps({"schema_version": 4, "format": 1}))
    assert sorted(x.code for x in diags) == ["E0003"] * 7 + ["E0004"]
    assert not any("not a kern manifest" in x.message for x in diags)
