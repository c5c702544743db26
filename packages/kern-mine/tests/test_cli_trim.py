import gzip
import json
from collections import Counter
from pathlib import Path

import msgspec

from kern_mine.cli import main
from kern_mine.fit import Fit, field_status
from kern_mine.mine import mine
from kern_mine.report import FORMAT, MineReport, render_text, to_json
from kern_mine.trim import DROPPED_FIELDS, trim


def test_json_document(standard, capsys):
    d, _, _ = standard
    assert main([str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == FORMAT
    assert set(doc) >= {"requests", "reference", "sites", "pointers", "summary", "other_windows",
                        "pass_split", "shapes"}
    p = doc["requests"][0]["passes"][0]
    assert p == {"index": 3, "kind": "prefill", "tokens": 1, "launches": [90, 120],
                 "t_ns": p["t_ns"], "regular": True, "shape": 0}
    assert doc["pass_split"]["start_kernels"] == [{"symbol": "embed", "windows": 5, "passes": 19}]
    assert doc["shapes"] == [{"id": 0, "passes": 19, "token_counts": [1, 3, 5, 16, 17, 30, 64], "kernels": 12,
                              "sites": 30, "flat_sites": 20, "flat_sites_grid_fitted": 19}]
    attn = next(s for s in doc["sites"] if s["symbol"] == "attn")
    assert attn["grid"][0] == {"status": "fit", "expr": {"ceil_div": ["tokens", 16]},
                               "samples": [[1, 1], [3, 1], [5, 1], [16, 1], [17, 2], [30, 2], [64, 4]]}
    kv = next(p for p in doc["pointers"] if p["site"] == attn["id"] and p["param"] == 1)
    assert kv["class"] == "state" and kv["alloc_offset"] == 0
    ref = doc["reference"]
    assert (ref["symbol"], ref["field"], ref["axis"], ref["param"]) == ("embed", "grid.x", "x", None)
    assert len(ref["candidates"]) == 8
    sm = doc["summary"]  # one program for prefill and decode: the requests' shape is shape 0
    assert (sm["request_shapes"], sm["flat_sites_request_shapes"], sm["flat_sites_request_shapes_grid_fitted"]) == (
        [0], 20, 19)
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
    assert "flat sites of the requests' pass shapes (shape 0): 19 of 20 with a fitted grid (95.0%)" in out


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
    assert "extra_hex" not in DROPPED_FIELDS  # library GEMMs' pointers are in it
    r2 = mine(out)
    r2.capture = r.capture
    assert to_json(r2) == to_json(r)  # a trimmed capture mines exactly like the original


def test_trim_budget(standard, tmp_path, capsys):
    d, _, _ = standard
    assert main(["trim", str(d), str(tmp_path / "x"), "--max-bytes", "100"]) == 1
    assert "over --max-bytes 100" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_errors_are_prefixed(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kern-mine: error: ") and "no such directory" in err
    assert main(["trim", str(tmp_path), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("kern-mine trim: error: ")


def test_per_process_subdirectories_are_named(tmp_path, standard, capsys):
    d, _, _ = standard
    (tmp_path / "pid42").mkdir()
    (tmp_path / "pid42" / "launches.jsonl").write_bytes((d / "launches.jsonl").read_bytes())
    assert main([str(tmp_path)]) == 2
    assert "per-process captures: pid42" in capsys.readouterr().err


CAPTURE_ERROR = Path(__file__).resolve().parents[2] / "kern-capture" / "tests" / "fixtures" / "capture_error"


def test_failed_capture_reports_its_error_json(tmp_path, capsys):
    if (CAPTURE_ERROR / "error.json").is_file():
        src = CAPTURE_ERROR
    else:  # the same content kern-capture writes when CUPTI is taken
        src = tmp_path / "cap"
        src.mkdir()
        (src / "error.json").write_text(json.dumps({
            "error": "multiple_subscribers", "code": 39, "pid": 5150,
            "message": "CUPTI already has a subscriber in this process (a profiler such as nsys, ncu or "
                       "torch.profiler holds it); kern-capture cannot subscribe. Run without the profiler."}))
    err_doc = json.loads((src / "error.json").read_text())
    assert main([str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kern-mine: error: {src}: the capture failed (error.json): ")
    assert err_doc["message"] in err and err_doc["error"] in err and str(err_doc["code"]) in err
    assert "no launches.jsonl" not in err
    assert main(["trim", str(src), str(tmp_path / "t")]) == 2
    assert err_doc["message"] in capsys.readouterr().err


def test_unobserved_fields_are_counted_and_explained(standard):
    _, _, r = standard
    # the summary counts exactly the statuses of the report's fields
    fits = [f for s in r.sites for f in s.grid + [x.fit for x in s.scalars]]
    assert r.summary.fields == dict(Counter(field_status(f) for f in fits))
    never = Fit("underdetermined", [], candidates=[], reason="never observed with a known token count")
    assert field_status(never) == "unobserved"
    assert field_status(Fit("underdetermined", [(1, 1)], candidates=[1, "tokens"])) == "underdetermined"
    r2 = msgspec.json.decode(to_json(r), type=MineReport)
    r2.sites[0].grid[1] = never
    r2.summary.fields = {"fit": 3, "underdetermined": 2, "unobserved": 1, "unfit": 0}
    text = render_text(r2)
    assert "fields: 3 fit, 2 underdetermined, 1 unobserved, 0 unfit" in text
    assert "?(unobserved) = never seen in a pass with a known token count" in text
    assert "?(unobserved)" in next(line for line in text.splitlines() if line.strip().startswith(f"{r2.sites[0].id} "))
