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
    r2.checks.source = r.checks.source  # the file read (launches.jsonl.gz): the rest is the same
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


# --- where trim may write, and what it keeps ------------------------------------------------


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_trim_refuses_its_own_input_directory(standard, tmp_path, capsys):
    """OUT = IN used to write launches.jsonl.gz into the capture, then die copying modules.jsonl onto itself."""
    src = tmp_path / "cap"
    src.mkdir()
    (src / "launches.jsonl").write_bytes((standard[0] / "launches.jsonl").read_bytes())
    (src / "modules.jsonl").write_text("")
    for argv in (["trim", str(src), str(src)], ["trim", str(src / "launches.jsonl"), str(src) + "/"]):
        assert main(argv) == 2
        assert "OUT is the capture being trimmed; give another directory" in _one_error(capsys)
    assert sorted(p.name for p in src.iterdir()) == ["launches.jsonl", "modules.jsonl"]  # untouched


def test_trim_refuses_a_file_and_an_untrimmed_capture_as_out(standard, tmp_path, capsys):
    d, _, _ = standard
    (tmp_path / "file").write_text("x")
    assert main(["trim", str(d), str(tmp_path / "file")]) == 2  # was a FileExistsError traceback
    assert _one_error(capsys).endswith("file: exists and is not a directory; give a new or empty directory for OUT")
    assert main(["trim", str(d), str(tmp_path / "file" / "sub")]) == 2
    assert _one_error(capsys).endswith("file/sub: Not a directory")
    # another capture's directory: its launches.jsonl would shadow the trimmed file (read first), and
    # its modules.jsonl was silently replaced by ours
    other = tmp_path / "other"
    other.mkdir()
    (other / "launches.jsonl").write_text("{}\n")
    (other / "modules.jsonl").write_text("theirs\n")
    (other / "module_3.cubin").write_bytes(b"\x7fELF")
    assert main(["trim", str(d), str(other)]) == 2
    line = _one_error(capsys)
    assert "holds an untrimmed capture (launches.jsonl, module_3.cubin)" in line and "mix two captures" in line
    assert not (other / "launches.jsonl.gz").exists() and (other / "modules.jsonl").read_text() == "theirs\n"


def test_trim_replaces_an_earlier_trim_without_stale_files(standard, tmp_path):
    d, _, r = standard
    out = tmp_path / "t"
    out.mkdir()
    (out / "README.md").write_text("kept")
    (out / "modules.jsonl").write_text("from an earlier trim of another capture\n")
    trim(d, out)  # the standard capture has no modules.jsonl: the earlier one must not stay
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "launches.jsonl.gz"]
    trim(d, out)  # again: replaced
    r2 = mine(out)
    r2.capture = r.capture
    r2.checks.source = r.checks.source  # the file read (launches.jsonl.gz): the rest is the same
    assert to_json(r2) == to_json(r)


def test_trim_max_bytes_must_be_positive(standard, tmp_path, capsys):
    for value in ("0", "-1", "x"):
        try:
            main(["trim", str(standard[0]), str(tmp_path / "o"), "--max-bytes", value])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"--max-bytes {value} accepted")
        assert "kern-mine trim: error: argument --max-bytes: " in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_trim_keeps_the_result_of_a_failed_launch(standard, tmp_path):
    """`result` is dropped as mining never reads it, but a non-zero one says the launch failed: keep it."""
    src = tmp_path / "cap"
    src.mkdir()
    lines = (standard[0] / "launches.jsonl").read_bytes().split(b"\n")
    recs = [json.loads(x) for x in lines if x]
    for k, rec in enumerate(recs):
        rec["result"] = 1 if k == 5 else 0
    (src / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    trim(src, tmp_path / "t")
    out = [json.loads(x) for x in gzip.decompress((tmp_path / "t" / "launches.jsonl.gz").read_bytes()).splitlines()]
    assert out[5]["result"] == 1 and all("result" not in x for k, x in enumerate(out) if k != 5)
