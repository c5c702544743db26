"""Property tests: random bytes, random JSON and mutated manifests never crash or hang the
verifier; each run ends in diagnostics (never an internal error, E0099) or success."""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verify_helpers import NAMES, fixture, text_of
from kern_verify import verify_text
from kern_verify.plan import PlanError, plan

SETTINGS = settings(max_examples=int(__import__("os").environ.get("KERN_FUZZ_EXAMPLES", "150")), deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])

# Values that hit edges: names that exist in the fixtures, huge/negative ints, expression forms.
NAMES_USED = ["tokens", "seqs", "x", "h", "kv", "q", "partial", "lse", "rms_norm", "gemm", "attn", "k", "in ptr",
              "out buffer<bf16>", "inout buffer<f32>", "i32", "u8", "f32", "bf16", "workspace", "output", "carry"]
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(NAMES_USED), st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(["param", "buf", "state", "var", "expr", "offset", "i32", "u8",
                                                   "f32", "ceil_div", "mul", "scratch", "extern", "min", "max"]),
                                  st.text(max_size=5)), inner, max_size=3),
    ),
    max_leaves=12,
)


def _no_internal_error(diags) -> None:
    internal = [d for d in diags if d.code == "E0099"]
    assert not internal, internal


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


@st.composite
def mutated_manifests(draw):
    doc = fixture(draw(st.sampled_from(NAMES)))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = _get(doc, path[:-1])
        action = draw(st.sampled_from(["replace", "delete", "duplicate", "add"]))
        key = path[-1]
        if action == "replace":
            parent[key] = draw(json_values)
        elif action == "delete":
            del parent[key]
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(json.loads(json.dumps(parent[key])))
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(NAMES_USED))] = draw(json_values)
    return doc


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes(data):
    _no_internal_error(verify_text(data))


@SETTINGS
@given(json_values)
def test_random_json(value):
    _no_internal_error(verify_text(json.dumps(value)))


@SETTINGS
@given(mutated_manifests())
def test_mutated_manifests(doc):
    diags = verify_text(text_of(doc))
    _no_internal_error(diags)
    for d in diags:
        assert d.code.startswith("E") and d.message and d.severity in ("error", "warning")
    if not any(d.is_error for d in diags):  # a manifest that verifies can be planned
        from kern_schema import decode

        try:
            plan(decode(text_of(doc)), 1000)
        except PlanError as e:  # pragma: no cover - would be a verifier hole
            raise AssertionError(f"verified manifest cannot be planned: {e}") from None


@SETTINGS
@given(st.sampled_from(NAMES), st.data())
def test_mutated_text(name, data):
    text = text_of(fixture(name))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 6)))
        text = text[:i] + data.draw(st.sampled_from(["", "{", "}", "[", "]", ",", '"', "0", "-1", "null", "\\", "é"])) + text[j:]
    _no_internal_error(verify_text(text))


def test_deep_nesting_is_an_error_not_a_crash():
    deep = '{"ceil_div": [' * 5000 + '"tokens"' + ", 2]}" * 5000
    text = text_of(fixture("launch")).replace('"grid": [\n       "tokens"', '"grid": [\n       ' + deep, 1)
    diags = verify_text(text)
    assert diags and all(d.code != "E0099" for d in diags)
    diags = verify_text("[" * 100_000 + "]" * 100_000)
    assert [d.code for d in diags] == ["E0001"]
