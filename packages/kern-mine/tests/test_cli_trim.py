import gzip
import json

import msgspec

from kern_mine.cli import main
from kern_mine.mine import mine
from kern_mine.report import FORMAT, MineReport, render_text, to_json
from kern_mine.trim import DROPPED_FIELDS, trim


def test_json_document(standard, capsys):
    d, _, _ = standard
    assert main([str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == FORMAT
    assert set(doc) >= {"requests", "reference", "sites", "pointers", "anchor", "summary", "other_windows"}
    p = doc["requests"][0]["passes"][0]
    assert p == {"index": 3, "kind": "prefill", "tokens": 1, "launches": [90, 120],
                 "t_ns": p["t_ns"], "anchor_launches": 7, "regular": True}
    attn = next(s for s in doc["sites"] if s["symbol"] == "attn")
    assert attn["grid"][0] == {"status": "fit", "expr": {"ceil_div": ["tokens", 16]},
                               "samples": [[1, 1], [3, 1], [5, 1], [16, 1], [17, 2], [30, 2], [64, 4]]}
    kv = next(p for p in doc["pointers"] if p["site"] == attn["id"] and p["param"] == 1)
    assert kv["class"] == "state" and kv["alloc_offset"] == 0
    assert doc["reference"]["symbol"] == "embed" and len(doc["reference"]["candidates"]) == 5
    # the document decodes back into the typed report
    assert msgspec.json.decode(json.dumps(doc), type=MineReport).summary.requests == 4


def test_text_report(standard, capsys):
    d, _, r = standard
    assert main([str(d)]) == 0
    out = capsys.readouterr().out
    assert out == render_text(r).replace(str(d), str(d))
    assert "token reference: site 0 embed grid.x" in out
    assert "passes: prefill:30, decode:1, decode:1, decode:1" in out
    assert "grid [ceil_div(tokens, 16), 4, 1] ptr wSw" in out


def test_missing_capture(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no launches.jsonl" in capsys.readouterr().err


def test_trim_roundtrip(standard, tmp_path):
    d, _, r = standard
    out = tmp_path / "t"
    n, size, done = trim(d, out)
    assert n == 570 and (out / "launches.jsonl.gz").stat().st_size == size
    first = json.loads(gzip.decompress((out / "launches.jsonl.gz").read_bytes()).split(b"\n")[0])
    assert not set(DROPPED_FIELDS) & set(first)
    r2 = mine(out)
    r2.capture = r.capture
    assert to_json(r2) == to_json(r)  # a trimmed capture mines exactly like the original


def test_trim_budget(standard, tmp_path, capsys):
    d, _, _ = standard
    assert main(["trim", str(d), str(tmp_path / "x"), "--max-bytes", "100"]) == 1
    assert "over --max-bytes 100" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
