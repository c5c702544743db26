import pytest

from kern_schema import DTYPES, SCALARS, ParamTypeError, parse_param_type


@pytest.mark.parametrize("direction", ["in", "out", "inout"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_buffer_types(direction, dtype):
    t = parse_param_type(f"{direction} buffer<{dtype}>")
    assert (t.kind, t.direction, t.dtype, t.scalar) == ("buffer", direction, dtype, None)
    assert t.size == 8 and t.is_pointer
    assert t.reads == (direction != "out") and t.writes == (direction != "in")
    assert str(t) == f"{direction} buffer<{dtype}>"


@pytest.mark.parametrize("direction", ["in", "out", "inout"])
def test_ptr_types(direction):
    t = parse_param_type(f"{direction} ptr")
    assert (t.kind, t.direction, t.dtype) == ("ptr", direction, None)
    assert t.size == 8 and t.is_pointer and str(t) == f"{direction} ptr"


@pytest.mark.parametrize("name", list(SCALARS))
def test_scalar_types(name):
    t = parse_param_type(name)
    assert (t.kind, t.direction, t.dtype) == ("scalar", None, None)
    assert t.scalar is SCALARS[name] and t.size == SCALARS[name].size
    assert not t.is_pointer and not t.reads and not t.writes and str(t) == name


def test_extra_whitespace_is_tolerated():
    assert str(parse_param_type("  in   buffer<bf16> ")) == "in buffer<bf16>"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("buffer<bf16>", "lacks a direction: write `in buffer<bf16>`"),
        ("ptr", "lacks a direction: write `in ptr`"),
        ("int", "unknown parameter type `int`: expected a scalar"),
        ("bf16", "unknown parameter type `bf16`"),
        ("", "malformed parameter type ``"),
        ("in", "unknown parameter type `in`"),
        ("inn buffer<bf16>", "unknown direction `inn`"),
        ("IN ptr", "unknown direction `IN`"),
        ("in buffer<bfloat16>", "unknown dtype `bfloat16`"),
        ("in buffer<>", "unknown dtype ``"),
        ("in buffer<bf16", "expected `buffer<dtype>` or `ptr` after `in`"),
        ("in buffer <bf16>", "malformed parameter type"),
        ("in i32", "expected `buffer<dtype>` or `ptr` after `in`"),
        ("out tensor<f32>", "expected `buffer<dtype>` or `ptr` after `out`"),
        ("in buffer<bf16> x", "malformed parameter type"),
    ],
)
def test_malformed_types_say_what_is_wrong(text, fragment):
    with pytest.raises(ParamTypeError) as e:
        parse_param_type(text)
    assert fragment in str(e.value)


def test_non_string_is_refused():
    with pytest.raises(ParamTypeError, match="must be a string, got int"):
        parse_param_type(3)  # type: ignore[arg-type]


def test_json_schema_pattern_accepts_what_the_parser_accepts():
    """The published JSON Schema's param-type pattern and parse_param_type agree: the pattern refused
    `"out  buffer<i64>"` (two spaces), which the verifier accepts. Checked on every well-formed type with
    whitespace variants, and on near misses."""
    import itertools
    import re

    from kern_schema.dtypes import DTYPES, SCALARS
    from kern_schema.manifest import _PARAM_TYPE_PATTERN

    pat = re.compile(_PARAM_TYPE_PATTERN)
    good = [*SCALARS, *(f"{d} {t}" for d in ("in", "out", "inout") for t in ("ptr", *(f"buffer<{x}>" for x in DTYPES)))]
    near = ["buffer<bf16>", "ptr", "int", "in", "in buffer<bf17>", "in buffer< bf16>", "inbuffer<bf16>", "in ptr x",
            "In ptr", "out buffer<bf16> ,", "f 32", ""]
    for text, (pre, mid, post) in itertools.product(good + near, [("", " ", ""), (" ", "  ", "\t"), ("\n", "\t ", " ")]):
        t = pre + text.replace(" ", mid) + post
        try:
            parse_param_type(t)
            ok = True
        except ParamTypeError:
            ok = False
        assert bool(pat.fullmatch(t)) == ok, repr(t)
    assert all(pat.fullmatch(g) for g in good)
