"""`load`/`decode`: every problem reported, each with its path and line/column."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kern_schema import (
    Manifest,
    ManifestDecodeError,
    SourceMap,
    convert,
    decode,
    dump,
    format_path,
    load,
    parse_json,
)


def to_bytes(doc: Any) -> bytes:
    return json.dumps(doc, indent=1).encode()


def object_paths(doc: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every JSON object in `doc` (document order)."""
    out = []
    if isinstance(doc, dict):
        out.append(path)
        for k, v in doc.items():
            out += object_paths(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += object_paths(v, path + (i,))
    return out


def dumps_injecting(doc: Any, target: tuple, extra: list[tuple[str, Any]]) -> tuple[str, int]:
    """Indented JSON of `doc` where the object at `target` gets the members `extra` appended
    (possibly duplicating a key); returns the text and the offset of the first injected key.
    `dumps_injecting.first_key` is left at the offset of the target's first key."""
    parts: list[str] = []
    where = [-1, -1]
    size = [0]

    def emit(s: str) -> None:
        parts.append(s)
        size[0] += len(s)

    def walk(v: Any, path: tuple, ind: int) -> None:
        pad = " " * (ind + 1)
        if isinstance(v, dict):
            members = list(v.items()) + (extra if path == target else [])
            emit("{")
            for n, (k, x) in enumerate(members):
                emit(("," if n else "") + "\n" + pad)
                if path == target and n == len(v):
                    where[0] = size[0]
                if path == target and n == 0:
                    where[1] = size[0]
                emit(json.dumps(k) + ": ")
                walk(x, path + (k,), ind + 1)
            emit("\n" + " " * ind + "}" if members else "}")
        elif isinstance(v, list):
            emit("[")
            for n, x in enumerate(v):
                emit(("," if n else "") + "\n" + pad)
                walk(x, path + (n,), ind + 1)
            emit("\n" + " " * ind + "]" if v else "]")
        else:
            emit(json.dumps(v))

    walk(doc, (), 0)
    dumps_injecting.first_key = where[1]  # type: ignore[attr-defined]
    return "".join(parts), where[0]


def line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def issues_of(data: bytes | str) -> list:
    with pytest.raises(ManifestDecodeError) as e:
        decode(data)
    return e.value.issues


def get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


# ------------------------------------------------------------------ happy paths


def test_load_from_path_bytes_and_str(small, tmp_path):
    data = to_bytes(small)
    f = tmp_path / "m.json"
    f.write_bytes(data)
    m = decode(data)
    assert load(f) == m and load(str(f)) == m and load(data) == m and decode(data.decode()) == m
    assert isinstance(m, Manifest)


def test_escaped_text_takes_the_slow_path_with_the_same_result(small):
    plain = to_bytes(small)
    escaped = json.dumps(small, indent=1, ensure_ascii=True).replace('"tiny"', '"ti\\u006ey"').encode()
    assert b"\\u" in escaped and decode(escaped) == decode(plain)
    small["model"] = "模型 ✓"
    assert decode(json.dumps(small, ensure_ascii=True).encode()).model == "模型 ✓"
    assert decode(json.dumps(small, ensure_ascii=False).encode()).model == "模型 ✓"


def test_colons_inside_strings_do_not_fool_the_duplicate_check(small):
    small["model"] = "a:b::c"
    small["modules"]["hub"]["source"] = "hf:org/repo:with:colons"
    small["buffers"]["name:with:colons"] = {"dtype": "f32", "shape": [1], "class": "input"}
    m = decode(to_bytes(small))
    assert m.model == "a:b::c" and "name:with:colons" in m.buffers


def test_load_missing_file_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        load(tmp_path / "nope.json")


# ------------------------------------------------------------------ duplicate keys


def test_duplicate_keys_at_every_depth(small):
    """A key repeated in any object (maps, structs, args, expression nodes) is an error at
    the second occurrence, whose line/column is reported; the message names the first."""
    paths = object_paths(small)
    assert len(paths) == 57
    for path in paths:
        obj = get(small, path)
        if not obj:
            continue
        key = next(iter(obj))
        text, offset = dumps_injecting(small, path, [(key, obj[key])])
        (issue,) = issues_of(text.encode())
        assert issue.kind == "duplicate_key"
        assert issue.path == path + (key,), format_path(path)
        assert (issue.position.line, issue.position.col) == line_col(text, offset)
        fl, fc = line_col(text, dumps_injecting.first_key)  # type: ignore[attr-defined]
        assert f"duplicate key `{key}` (first at line {fl}, column {fc})" in issue.message


def test_duplicates_are_refused_even_with_different_values(small):
    text, _ = dumps_injecting(small, ("vars",), [("tokens", {"max": 9})])
    (issue,) = issues_of(text)
    assert issue.path == ("vars", "tokens") and "last one wins" in issue.message


def test_every_duplicate_is_listed(small):
    text, _ = dumps_injecting(small, ("buffers",), [("x", {}), ("y", {})])
    issues = issues_of(text)
    assert [i.path for i in issues] == [("buffers", "x"), ("buffers", "y")]


def test_escaped_duplicate_is_still_a_duplicate(small):
    text, _ = dumps_injecting(small, ("vars",), [("tok\\u0065ns", {"max": 9})])
    text = text.replace('"tok\\\\u0065ns"', '"tok\\u0065ns"')
    (issue,) = issues_of(text)
    assert issue.kind == "duplicate_key" and issue.path == ("vars", "tokens")


# ------------------------------------------------------------------ unknown fields


def test_unknown_fields_everywhere(small):
    """An unknown key in any struct object is reported at the key, with its position; in a
    map (vars, buffers, ...) a new key is simply a new entry and fails on its own value."""
    maps = {("vars",), ("states",), ("buffers",), ("modules",), ("ops",), ("programs",),
            ("ops", "scale", "impl", "scratch")}
    struct_paths = [p for p in object_paths(small) if p not in maps]
    checked = 0
    for path in struct_paths:
        text, offset = dumps_injecting(small, path, [("zz_unknown", 1)])
        issues = issues_of(text)
        mine = [i for i in issues if i.path == path + ("zz_unknown",)]
        assert len(mine) == 1, (format_path(path), issues)
        (issue,) = mine
        assert issue.kind == "unknown_field"
        assert "unknown field `zz_unknown`" in issue.message
        assert (issue.position.line, issue.position.col) == line_col(text, offset)
        checked += 1
    assert checked == len(struct_paths) == 50


def test_unknown_field_hint(small):
    small["vars"]["tokens"] = {"mxa": 3}
    (i2, i1) = issues_of(to_bytes(small))  # document order: the object, then its key
    assert i1.kind == "unknown_field" and i1.path == ("vars", "tokens", "mxa")
    assert "did you mean `max`?" in i1.message and "(a Var has: min, max)" in i1.message
    assert i2.kind == "missing_field" and i2.path == ("vars", "tokens")


def test_extra_top_level_key(small):
    small["kernels"] = {}
    (issue,) = issues_of(to_bytes(small))
    assert issue.path == ("kernels",) and issue.kind == "unknown_field"
    assert issue.position.line == len(to_bytes(small).splitlines()) - 1


# ------------------------------------------------------------------ missing fields, types, forms


def test_every_missing_top_level_key_is_listed():
    issues = issues_of(b'{"model": "m"}')
    assert [i.kind for i in issues] == ["missing_field"] * 7
    assert [i.message.split("`")[1] for i in issues] == [
        "schema_version", "vars", "states", "buffers", "modules", "ops", "programs"]
    assert all(i.path == () and (i.position.line, i.position.col) == (1, 1) for i in issues)


@pytest.mark.parametrize("text, what", [
    (b"[]", "got array"), (b"3", "got number"), (b'"m"', "got string"), (b"null", "got null"),
    (b"true", "got boolean"),
])
def test_top_level_must_be_an_object(text, what):
    (issue,) = issues_of(text)
    assert issue.path == () and issue.kind == "invalid"
    assert issue.message == f"expected an object (a Manifest), {what}"


def test_all_problems_reported_together_in_document_order(small):
    small["schema_version"] = "4"
    small["vars"]["tokens"]["max"] = True
    small["buffers"]["x"]["shape"] = [1.5, "t"]
    del small["buffers"]["y"]["dtype"]
    small["ops"]["scale"]["impl"]["launches"][0]["block"] = [1, 1]
    small["ops"]["scale"]["impl"]["launches"][0]["args"][5] = {"f32": "x"}
    small["ops"]["gemm"]["impl"]["launches"][0]["grid"] = [1, 1, 1]
    small["programs"]["decode"]["calls"][0]["args"][0] = {"buf": "x", "var": "t"}
    small["programs"]["decode"]["calls"][1]["args"][3] = {"expr": {"mul": ["t", 2], "ceil_div": ["t", 2]}}
    small["programs"]["decode"]["calls"][1]["args"][2] = {"var": "t", "offset": 8}
    data = to_bytes(small)
    issues = issues_of(data)
    got = [(format_path(i.path), i.kind) for i in issues]
    assert got == [
        ("schema_version", "invalid"),
        ("vars.tokens.max", "invalid"),
        ("buffers.x.shape[0]", "invalid"),
        ("buffers.y", "missing_field"),
        ("ops.scale.impl.launches[0].block", "invalid"),
        ("ops.scale.impl.launches[0].args[5].f32", "invalid"),
        ("ops.gemm.impl.launches[0]", "invalid"),
        ("programs.decode.calls[0].args[0]", "invalid"),
        ("programs.decode.calls[1].args[2]", "invalid"),
        ("programs.decode.calls[1].args[3].expr", "invalid"),
    ]
    msgs = [i.message for i in issues]
    assert msgs[0] == 'Expected `int`, got `str` ("4")'
    assert msgs[1] == "Expected `int`, got `bool` (true)"
    assert msgs[2] == "Expected `int | str`, got `float` (1.5)"
    assert "missing required field `dtype`" in msgs[3]
    assert msgs[4] == "Expected `array` of length >= 3, got 2 entries"
    assert msgs[5] == 'Expected `float`, got `str` ("x")'
    assert "remove `grid`" in msgs[6]
    assert "exactly one form, this one has `buf`, `var`" in msgs[7]
    assert "`offset` applies to buf, state and scratch arguments, not to `var`" in msgs[8]
    assert "exactly one key: `ceil_div` or `mul`" in msgs[9]
    sm = SourceMap.build(data)
    for i in issues:  # each position is the value's own position (or its object's)
        assert i.position == sm.values[i.path]
    err = pytest.raises(ManifestDecodeError, decode, data).value
    assert str(err).startswith("10 problem(s) decoding the manifest:\n  schema_version (line 2, column 20): ")
    assert err.source is not None and err.source.text == data.decode()


def test_convert_without_text_has_paths_but_no_positions(small):
    small["vars"]["tokens"]["max"] = "big"
    with pytest.raises(ManifestDecodeError) as e:
        convert(small)
    (issue,) = e.value.issues
    assert issue.path == ("vars", "tokens", "max") and issue.position is None
    assert e.value.source is None


# ------------------------------------------------------------------ not JSON


@pytest.mark.parametrize("const", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(small, const):
    text = to_bytes(small).decode().replace('"f32": 0.5', f'"f32": {const}')
    (issue,) = issues_of(text)
    assert issue.kind == "json" and "is not a JSON number" in issue.message
    assert (issue.position.line, issue.position.col) == line_col(text, text.index(const))


def test_number_out_of_float_range(small):
    text = to_bytes(small).decode().replace('"f32": 0.5', '"f32": 1e400')
    (issue,) = issues_of(text)
    assert issue.kind == "invalid"
    assert format_path(issue.path) == "ops.scale.impl.launches[0].args[5].f32"
    assert issue.message == "number `1e400` is out of range (not a finite float64)"
    assert (issue.position.line, issue.position.col) == line_col(text, text.index("1e400"))


def test_huge_integers(small):
    small["ops"]["scale"]["impl"]["launches"][0]["args"][7] = {"i64": 10**30}
    assert decode(to_bytes(small)).ops["scale"].impl.launches[0].args[7].i64 == 10**30  # verifier checks range
    small["vars"]["tokens"]["max"] = 10.0**300
    (issue,) = issues_of(to_bytes(small))
    assert issue.path == ("vars", "tokens", "max") and "Expected `int`, got `float`" in issue.message


def test_too_long_integer_literal_is_a_clean_error(small):
    text = to_bytes(small).decode().replace('"max": 64', '"max": ' + "9" * 5000)
    (issue,) = issues_of(text)
    # valid JSON: an out-of-range value at its path, not "not valid JSON" with Python's advice
    assert issue.kind == "invalid" and issue.path == ("vars", "tokens", "max")
    assert issue.message == "integer `999999999999...999999` (5000 digits) is out of range"
    assert (issue.position.line, issue.position.col) == line_col(text, text.index("9" * 5000))


@pytest.mark.parametrize("text, line, col, fragment", [
    (b"", 1, 1, "Expecting value"),
    (b'{"model": "m",}', 1, 15, "Expecting property name"),
    (b'{\n "a": 1\n "b": 2}', 3, 2, "Expecting ',' delimiter"),
    (b"{} {}", 1, 4, "Extra data"),
    (b"{'a': 1}", 1, 2, "Expecting property name"),
])
def test_invalid_json_has_a_position(text, line, col, fragment):
    (issue,) = issues_of(text)
    assert issue.kind == "json" and fragment in issue.message
    assert (issue.position.line, issue.position.col) == (line, col)


def test_not_utf8():
    (issue,) = issues_of(b'{"model": "\xff"}')
    assert issue.kind == "json" and "not UTF-8" in issue.message


def test_deep_nesting_is_a_clean_error():
    (issue,) = issues_of(b"[" * 100_000 + b"]" * 100_000)
    assert issue.kind in ("json", "invalid")


def test_parse_json_returns_plain_data(small):
    assert parse_json(to_bytes(small)) == small
    assert parse_json('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}


def test_dump_of_loaded_manifest_is_loadable(small):
    m = decode(to_bytes(small))
    assert decode(dump(m)) == m


def test_expression_messages_name_the_form_with_its_article(small):
    """`{"div": ...}` and a one-element `ceil_div`: the message says "an expression object"
    (not the class name `a ExprNode`) and "got 1" once."""
    launch = small["ops"]["scale"]["impl"]["launches"][0]
    launch["grid"][0] = {"div": ["tokens", 4]}
    (issue,) = issues_of(to_bytes(small))
    assert issue.message == "unknown field `div` (an expression object has: ceil_div, mul)"
    launch["grid"][0] = {"ceil_div": ["tokens"]}
    (issue,) = issues_of(to_bytes(small))
    assert issue.message == "Expected `array` of length 2, got 1"
    small["ops"]["scale"]["nope"] = 1
    launch["grid"][0] = 1
    (issue,) = issues_of(to_bytes(small))
    assert "(an Op has: params, impl)" in issue.message
