"""load → dump → load gives an equal manifest, and dump is deterministic (property tests)."""

from __future__ import annotations

import json

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kern_schema import (
    BUFFER_CLASSES,
    DTYPES,
    LITERAL_KEYS,
    SCALARS,
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
    dump,
    to_builtins,
)

# Names exercise the JSON escaper and the duplicate check: dots, colons, quotes,
# backslashes, non-ASCII.
names = st.text(alphabet=st.sampled_from('abcxyz_.:0"\\é模 /'), min_size=1, max_size=8)
ints = st.integers(min_value=-(2**70), max_value=2**70)
small_ints = st.integers(min_value=0, max_value=1 << 20)
floats = st.floats(allow_nan=False, allow_infinity=False)
param_types = st.one_of(
    st.builds(lambda d, t: f"{d} buffer<{t}>", st.sampled_from(["in", "out", "inout"]), st.sampled_from(list(DTYPES))),
    st.builds(lambda d: f"{d} ptr", st.sampled_from(["in", "out", "inout"])),
    st.sampled_from(list(SCALARS)),
    st.text(max_size=6),  # malformed types are the verifier's business: they round-trip too
)
ops_ = st.one_of(
    st.tuples(st.just("ceil_div"), st.integers(min_value=-5, max_value=300)),
    st.tuples(st.just("mul"), ints),
)


def _chain(leaf, steps):
    for op, c in steps:
        leaf = ExprNode(**{op: (leaf, c)})
    return leaf


exprs = st.builds(_chain, st.one_of(ints, names), st.lists(ops_, max_size=4))
shapes = st.lists(st.one_of(small_ints, names), max_size=4)


def _literal(key: str):
    return st.builds(lambda v: Arg(**{key: v}), floats if key.startswith("f") else ints)


args = st.one_of(
    st.builds(lambda i: Arg(param=i), small_ints),
    st.builds(lambda n, o: Arg(scratch=n, offset=o), names, st.none() | small_ints),
    st.builds(lambda n, o: Arg(buf=n, offset=o), names, st.none() | small_ints),
    st.builds(lambda n, o: Arg(state=n, offset=o), names, st.none() | small_ints),
    st.builds(lambda n: Arg(var=n), names),
    st.builds(lambda e: Arg(expr=e), exprs),
    *[_literal(k) for k in LITERAL_KEYS],
)
arg_lists = st.lists(args, max_size=5)
kernel_launches = st.builds(
    Launch,
    module=names, entry=names, params=st.lists(param_types, max_size=4),
    block=st.lists(small_ints, min_size=3, max_size=3), grid=st.lists(exprs, min_size=3, max_size=3),
    shared_mem=st.none() | small_ints, carveout=st.none() | small_ints, pdl=st.booleans(), args=arg_lists,
)
extern_launches = st.builds(Launch, extern=names, args=arg_lists)
impls = st.builds(
    Impl,
    scratch=st.dictionaries(names, st.builds(Scratch, dtype=st.sampled_from(list(DTYPES)), shape=shapes), max_size=2),
    launches=st.lists(kernel_launches | extern_launches, max_size=3),
)
manifests = st.builds(
    Manifest,
    schema_version=st.integers(min_value=0, max_value=9),
    model=st.text(max_size=10),
    vars=st.dictionaries(names, st.builds(Var, min=ints, max=ints), max_size=3),
    states=st.dictionaries(names, st.one_of(
        st.builds(State, bytes_per_token=small_ints, align=small_ints),
        st.builds(State, bytes_per_seq=small_ints),
        st.builds(State),
    ), max_size=3),
    buffers=st.dictionaries(names, st.builds(
        Buffer, dtype=st.sampled_from(list(DTYPES)), shape=shapes, class_=st.sampled_from(BUFFER_CLASSES)
    ), max_size=4),
    modules=st.dictionaries(names, st.builds(Module, source=st.text(max_size=20),
                                             sha256=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64)),
                            max_size=3),
    ops=st.dictionaries(names, st.builds(Op, params=st.lists(param_types, max_size=4), impl=impls), max_size=3),
    programs=st.dictionaries(names, st.builds(Program, calls=st.lists(
        st.builds(Call, label=names, op=names, args=arg_lists), max_size=4)), max_size=2),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests)
def test_random_manifests_round_trip(m):
    text = dump(m)
    again = decode(text)
    assert again == m
    assert dump(again) == text  # deterministic: a fixed point after one round
    assert text.endswith(b"\n") and json.loads(text) == to_builtins(m)
    # the same document with every non-ASCII character escaped (the slow path) is equal too
    escaped = json.dumps(to_builtins(m), ensure_ascii=True, indent=2).encode()
    assert decode(escaped) == m


def test_dump_layout_is_stable():
    m = Manifest(schema_version=4, model="m", vars={"t": Var(max=8)}, states={}, buffers={
        "b": Buffer(dtype="f32", shape=["t", 2], class_="output")}, modules={}, ops={}, programs={})
    assert dump(m) == (
        b'{\n "schema_version": 4,\n "model": "m",\n "vars": {\n  "t": {\n   "max": 8\n  }\n },\n'
        b' "states": {},\n "buffers": {\n  "b": {\n   "dtype": "f32",\n   "shape": [\n    "t",\n    2\n   ],\n'
        b'   "class": "output"\n  }\n },\n "modules": {},\n "ops": {},\n "programs": {}\n}\n'
    )


def test_dump_keeps_map_order_and_omits_defaults():
    m = decode(b'{"schema_version": 4, "model": "m", "vars": {"z": {"min": 1, "max": 2}, "a": {"max": 3}},'
               b' "states": {"s": {"bytes_per_seq": 8, "align": 256}}, "buffers": {}, "modules": {},'
               b' "ops": {"o": {"params": [], "impl": {"scratch": {}, "launches": []}}}, "programs": {}}')
    doc = json.loads(dump(m))
    assert list(doc["vars"]) == ["z", "a"]
    assert doc["vars"]["z"] == {"max": 2}  # min 1 is the default
    assert doc["states"]["s"] == {"bytes_per_seq": 8}
    assert doc["ops"]["o"]["impl"] == {"launches": []}
    assert decode(dump(m)) == m


def test_committed_examples_dump_byte_identically():
    """The optional launch fields (`shared_mem`, `carveout`, `pdl`) are omitted at their defaults, so
    adding a field never changes an existing manifest's canonical text."""
    from pathlib import Path

    from kern_schema import load

    root = Path(__file__).resolve().parents[3] / "examples"
    files = sorted(root.glob("qwen3-*.json"))
    if not files:
        pytest.skip("examples/ not present")
    for f in files:
        assert dump(load(f)) == f.read_bytes(), f.name
