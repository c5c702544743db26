"""SourceMap positions and format_path."""

import pytest

from kern_schema import Position, SourceMap, SourceScanError, format_path

TEXT = '{\n  "a": [1, {"b": "x:y"}],\n  "c d": {"e": -1.5e3, "f": null, "g": true},\n  "a": false\n}\n'


def test_format_path():
    assert format_path(()) == "$"
    assert format_path(("programs", "decode", "calls", 12, "args", 3)) == "programs.decode.calls[12].args[3]"
    assert format_path(("buffers", "model.norm.weight", "shape", 0)) == 'buffers["model.norm.weight"].shape[0]'
    assert format_path(("a", 'q"\\')) == 'a["q\\"\\\\"]'
    assert format_path((0,)) == "[0]"
    assert format_path(("_x1",)) == "_x1"


def test_positions_of_values_and_keys():
    sm = SourceMap.build(TEXT)
    assert sm.values[()] == Position(1, 1, 0)
    assert sm.keys[("c d",)] == Position(3, 3, TEXT.index('"c d"'))
    assert sm.values[("c d",)] == Position(3, 10, TEXT.index('{"e"'))
    # a duplicated key: the map holds the last occurrence (duplicates are listed apart)
    assert sm.keys[("a",)] == Position(4, 3, TEXT.rindex('"a"'))
    assert sm.values[("a",)].line == 4
    assert sm.values[("a", 1, "b")] == Position(2, 18, TEXT.index('"x:y"'))
    assert sm.values[("c d", "e")] == Position(3, 16, sm.text.index("-1.5e3"))
    assert sm.values[("c d", "g")].col == TEXT.splitlines()[2].index("true") + 1
    assert sm.line_text(3) == '  "c d": {"e": -1.5e3, "f": null, "g": true},'
    assert sm.locate(("a", 1, "b", "missing", 3)) == sm.values[("a", 1, "b")]
    assert sm.locate(("nope",)) == sm.values[()]


def test_duplicates_are_listed():
    sm = SourceMap.build(TEXT)
    (d,) = sm.duplicates
    assert (d.path, d.key) == ((), "a")
    assert (d.first.line, d.first.col, d.second.line, d.second.col) == (2, 3, 4, 3)


def test_bytes_and_escaped_keys():
    sm = SourceMap.build(b'{"k\\u00e9": 1, "k\\u00e9": 2}')
    assert sm.duplicates[0].key == "ké"


@pytest.mark.parametrize("text, line, col", [
    ("", 1, 1), ("{", 1, 2), ('{"a" 1}', 1, 6), ("[1 2]", 1, 4), ("{} x", 1, 4), ("[NaN]", 1, 2),
    ('{"a": 1,}', 1, 9), ("\n\n  @", 3, 3),
])
def test_scan_errors_have_positions(text, line, col):
    with pytest.raises(SourceScanError) as e:
        SourceMap.build(text)
    assert (e.value.position.line, e.value.position.col) == (line, col)
