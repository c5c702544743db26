"""Every struct and every argument form, decoded from JSON and constructed in Python."""

from __future__ import annotations

import json

import msgspec
import pytest

from kern_schema import (
    LITERAL_KEYS,
    Arg,
    Buffer,
    Call,
    ExprNode,
    Impl,
    Launch,
    Manifest,
    Module,
    Op,
    Program,
    Scratch,
    State,
    Var,
    decode,
)



def to_bytes(doc) -> bytes:
    return json.dumps(doc, indent=1).encode()


def dec(tp, doc):
    return msgspec.json.decode(to_bytes(doc), type=tp)


def test_small_manifest_decodes_into_every_struct(small):
    m = decode(to_bytes(small))
    assert isinstance(m, Manifest) and m.schema_version == 4 and m.model == "tiny"
    assert m.vars == {"tokens": Var(min=1, max=64), "seqs": Var(min=1, max=4)}
    assert m.states["kv"] == State(bytes_per_token=1024)
    assert m.states["ssm"] == State(bytes_per_seq=4096, align=512)
    assert m.states["kv"].align == 256
    assert m.buffers["x"] == Buffer(dtype="bf16", shape=["tokens", 64], class_="workspace")
    assert m.modules["hub"] == Module(source="hf:org/repo/k.cubin", sha256="cd" * 32)
    op = m.ops["scale"]
    assert isinstance(op, Op) and isinstance(op.impl, Impl)
    assert op.impl.scratch == {"tmp": Scratch(dtype="f32", shape=["tokens", 4])}
    (launch,) = op.impl.launches
    assert not launch.is_extern and launch.module == "k" and launch.block == [128, 1, 1]
    assert launch.grid == [ExprNode(ceil_div=("tokens", 4)), ExprNode(mul=("seqs", 2)), 1]
    assert launch.shared_mem == 49152
    assert [a.kind for a in launch.args] == ["param", "param", "param", "scratch", "param", "f32", "u8", "i64"]
    gemm = m.ops["gemm"].impl
    assert gemm.scratch == {} and gemm.launches[0].is_extern
    assert gemm.launches[0].extern == "cublaslt.gemm_bf16_tn" and gemm.launches[0].module is None
    prog = m.programs["decode"]
    assert isinstance(prog, Program) and [c.label for c in prog.calls] == ["proj", "scale"]
    call = prog.calls[1]
    assert isinstance(call, Call) and call.op == "scale"
    assert [a.kind for a in call.args] == ["buf", "buf", "state", "expr"]
    assert call.args[0].offset == 128 and call.args[1].offset is None and call.args[2].offset == 256
    assert call.args[3].expr == ExprNode(mul=(ExprNode(ceil_div=("tokens", 2)), 3))


def test_var_min_defaults_to_one():
    assert dec(Var, {"max": 8}) == Var(min=1, max=8)
    assert dec(Var, {"min": 0, "max": 8}).min == 0
    with pytest.raises(msgspec.ValidationError, match="missing required field `max`"):
        dec(Var, {"min": 1})


def test_buffer_class_is_spelled_class_in_json():
    b = dec(Buffer, {"dtype": "f32", "shape": [], "class": "input"})
    assert b.class_ == "input" and b.shape == []
    assert msgspec.json.decode(msgspec.json.encode(b)) == {"dtype": "f32", "shape": [], "class": "input"}
    with pytest.raises(msgspec.ValidationError, match="unknown field `class_`"):
        dec(Buffer, {"dtype": "f32", "shape": [], "class_": "input"})
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int \| str`, got `float`"):
        dec(Buffer, {"dtype": "f32", "shape": [1.5], "class": "input"})


def test_module_sha_is_optional_in_the_schema():
    # `hf:` without sha256 is the verifier's error, not a form error
    assert dec(Module, {"source": "a.cubin"}) == Module(source="a.cubin")


@pytest.mark.parametrize(
    "doc, kind, value",
    [
        ({"param": 3}, "param", 3),
        ({"scratch": "tmp"}, "scratch", "tmp"),
        ({"buf": "x"}, "buf", "x"),
        ({"state": "kv"}, "state", "kv"),
        ({"var": "tokens"}, "var", "tokens"),
        ({"expr": 4}, "expr", 4),
        ({"expr": "tokens"}, "expr", "tokens"),
        ({"expr": {"ceil_div": ["tokens", 8]}}, "expr", ExprNode(ceil_div=("tokens", 8))),
    ]
    + [({k: 7}, k, 7) for k in LITERAL_KEYS],
)
def test_every_arg_form(doc, kind, value):
    a = dec(Arg, doc)
    assert a.kind == kind
    assert getattr(a, kind) == value
    assert a.literal == (value if kind in LITERAL_KEYS else None)
    assert msgspec.json.decode(msgspec.json.encode(a)) == msgspec.json.decode(to_bytes(doc))


@pytest.mark.parametrize("kind", ["scratch", "buf", "state"])
def test_offset_goes_with_memory_forms(kind):
    a = dec(Arg, {kind: "n", "offset": 64})
    assert a.kind == kind and a.offset == 64
    assert Arg(**{kind: "n", "offset": 0}).offset == 0


@pytest.mark.parametrize("kind", ["param", "var", "expr", "i32", "f32"])
def test_offset_with_other_forms_is_refused(kind):
    value = "t" if kind == "var" else 1
    with pytest.raises(msgspec.ValidationError, match=f"`offset` applies to buf, state and scratch arguments, not to `{kind}`"):
        dec(Arg, {kind: value, "offset": 8})
    with pytest.raises(ValueError, match="`offset` applies"):
        Arg(**{kind: value, "offset": 8})


def test_arg_needs_exactly_one_form():
    with pytest.raises(msgspec.ValidationError, match="needs exactly one of: param, scratch"):
        dec(Arg, {})
    with pytest.raises(msgspec.ValidationError, match="needs exactly one of"):
        dec(Arg, {"offset": 8})
    with pytest.raises(msgspec.ValidationError, match="this one has `buf`, `i32`"):
        dec(Arg, {"buf": "x", "i32": 1})
    with pytest.raises(ValueError, match="this one has `param`, `var`, `f64`"):
        Arg(param=0, var="t", f64=1.0)
    with pytest.raises(msgspec.ValidationError, match="unknown field `bufer`"):
        dec(Arg, {"bufer": "x"})


def test_literal_values():
    assert dec(Arg, {"f32": 9.999999974752427e-07}).f32 == 9.999999974752427e-07
    one = dec(Arg, {"f32": 1})
    assert one.f32 == 1.0 and isinstance(one.f32, float)  # a JSON int is accepted as a float literal
    assert isinstance(dec(Arg, {"f64": -3}).f64, float)
    big = dec(Arg, {"u64": 2**64 - 1})
    assert big.u64 == 2**64 - 1
    assert dec(Arg, {"i64": -(2**63)}).literal == -(2**63)
    # out-of-range integers decode (as Python ints); the verifier reports the range
    assert dec(Arg, {"i8": 300}).i8 == 300 and dec(Arg, {"u64": 2**70}).u64 == 2**70
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int \| null`, got `bool`"):
        dec(Arg, {"i32": True})
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int \| null`, got `float`"):
        dec(Arg, {"i32": 1.0})
    with pytest.raises(msgspec.ValidationError, match=r"Expected `float \| null`, got `bool`"):
        dec(Arg, {"f32": False})
    with pytest.raises(msgspec.ValidationError, match=r"Expected `float \| null`, got `str`"):
        dec(Arg, {"f32": "1e-6"})
    with pytest.raises(msgspec.ValidationError, match=r"got `bool`"):
        dec(Arg, {"param": True})


KERNEL = {"module": "m", "entry": "e", "params": ["i32"], "block": [32, 1, 1], "grid": [1, 1, 1],
          "args": [{"i32": 1}]}


def test_kernel_launch_and_extern_launch():
    launch = dec(Launch, KERNEL)
    assert launch.shared_mem is None and not launch.is_extern and launch.extern is None
    ext = dec(Launch, {"extern": "cublaslt.gemm_bf16_tn_acc", "args": []})
    assert ext.is_extern and ext.block is None and ext.args == []


@pytest.mark.parametrize("missing", ["module", "entry", "params", "block", "grid"])
def test_kernel_launch_needs_its_fields(missing):
    doc = {k: v for k, v in KERNEL.items() if k != missing}
    with pytest.raises(msgspec.ValidationError, match=f"a kernel launch needs `{missing}`"):
        dec(Launch, doc)


def test_kernel_launch_lists_all_missing_fields():
    with pytest.raises(msgspec.ValidationError, match="needs `module`, `entry`, `params`, `block`, `grid`"):
        dec(Launch, {"args": []})
    with pytest.raises(msgspec.ValidationError, match="missing required field `args`"):
        dec(Launch, {k: v for k, v in KERNEL.items() if k != "args"})


@pytest.mark.parametrize("extra", ["module", "entry", "params", "block", "grid", "shared_mem", "carveout"])
def test_extern_launch_refuses_kernel_fields(extra):
    doc = {"extern": "cublaslt.gemm_bf16_tn", "args": [], extra: KERNEL.get(extra, 0)}
    with pytest.raises(msgspec.ValidationError, match=f"only `extern` and `args`; remove `{extra}`"):
        dec(Launch, doc)


def test_pdl_defaults_to_false_and_is_omitted_when_false():
    launch = dec(Launch, KERNEL)
    assert launch.pdl is False
    assert "pdl" not in msgspec.json.decode(msgspec.json.encode(launch))  # existing manifests dump unchanged
    assert "pdl" not in msgspec.json.decode(msgspec.json.encode(dec(Launch, {**KERNEL, "pdl": False})))
    on = dec(Launch, {**KERNEL, "pdl": True})
    assert on.pdl is True and msgspec.json.decode(msgspec.json.encode(on))["pdl"] is True
    assert dec(Launch, msgspec.json.decode(msgspec.json.encode(on))) == on


def test_pdl_is_a_boolean():
    with pytest.raises(msgspec.ValidationError, match="Expected `bool`, got `int`"):
        dec(Launch, {**KERNEL, "pdl": 1})


def test_pdl_on_an_extern_decodes_for_the_verifier_to_refuse():
    # the form is valid (a boolean on a launch); kern-verify reports E0090 with its own hint
    ext = dec(Launch, {"extern": "cublaslt.gemm_bf16_tn", "args": [], "pdl": True})
    assert ext.is_extern and ext.pdl is True


def test_carveout_is_optional_and_omitted_when_absent():
    launch = dec(Launch, KERNEL)
    assert launch.carveout is None
    assert "carveout" not in msgspec.json.decode(msgspec.json.encode(launch))  # existing manifests dump unchanged
    for pct in (0, 50, 100):
        on = dec(Launch, {**KERNEL, "carveout": pct})
        assert on.carveout == pct and msgspec.json.decode(msgspec.json.encode(on))["carveout"] == pct
        assert dec(Launch, msgspec.json.decode(msgspec.json.encode(on))) == on
    # the range 0..100 is the verifier's (E0095), like shared_mem's: the form only asks for an int
    assert dec(Launch, {**KERNEL, "carveout": 101}).carveout == 101


@pytest.mark.parametrize("value, got", [(50.0, "float"), ("50", "str"), (True, "bool")])
def test_carveout_is_an_int(value, got):
    with pytest.raises(msgspec.ValidationError, match=rf"Expected `int \| null`, got `{got}`"):
        dec(Launch, {**KERNEL, "carveout": value})


def test_carveout_on_an_extern_is_refused_at_decode():
    with pytest.raises(msgspec.ValidationError, match="only `extern` and `args`; remove `carveout`"):
        dec(Launch, {"extern": "cublaslt.gemm_bf16_tn", "args": [], "carveout": 0})
    with pytest.raises(ValueError, match="remove `shared_mem`, `carveout`"):
        Launch(extern="cublaslt.gemm_bf16_tn", args=[], shared_mem=0, carveout=100)


@pytest.mark.parametrize("field", ["block", "grid"])
@pytest.mark.parametrize("n", [0, 2, 4])
def test_launch_dims_have_three_entries(field, n):
    with pytest.raises(msgspec.ValidationError, match="length"):
        dec(Launch, {**KERNEL, field: [1] * n})


def test_grid_takes_expressions_block_takes_ints():
    launch = dec(Launch, {**KERNEL, "grid": ["tokens", {"mul": ["seqs", 4]}, 2]})
    assert launch.grid == ["tokens", ExprNode(mul=("seqs", 4)), 2]
    with pytest.raises(msgspec.ValidationError, match="Expected `int`, got `str`"):
        dec(Launch, {**KERNEL, "block": ["tokens", 1, 1]})


def test_impl_scratch_defaults_to_empty_and_is_omitted_on_encode():
    impl = dec(Impl, {"launches": []})
    assert impl.scratch == {}
    assert msgspec.json.decode(msgspec.json.encode(impl)) == {"launches": []}


def test_manifest_needs_every_top_level_key(small):
    for key in list(small):
        doc = {k: v for k, v in small.items() if k != key}
        with pytest.raises(msgspec.ValidationError, match=f"missing required field `{key}`"):
            dec(Manifest, doc)


@pytest.mark.parametrize("tp, doc", [
    (Var, {"max": 1}), (State, {"bytes_per_token": 1}), (Buffer, {"dtype": "f32", "shape": [], "class": "input"}),
    (Module, {"source": "a"}), (Scratch, {"dtype": "f32", "shape": [1]}), (Arg, {"param": 0}),
    (Launch, KERNEL), (Impl, {"launches": []}), (Op, {"params": [], "impl": {"launches": []}}),
    (Call, {"label": "l", "op": "o", "args": []}), (Program, {"calls": []}), (ExprNode, {"mul": [1, 2]}),
])
def test_every_struct_refuses_unknown_fields(tp, doc):
    assert dec(tp, doc) is not None
    with pytest.raises(msgspec.ValidationError, match="unknown field `zz`"):
        dec(tp, {**doc, "zz": 1})
