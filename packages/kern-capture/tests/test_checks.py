"""Plausibility of a launches file (``kern_capture.checks``): impossible records are format errors,
suspicious ones (failed launches, seq not increasing, a second pid, time going back within a thread)
are counted and the first few named; a cut-short last line is said. ``kern-capture summary`` reports
them on stderr, in its text and in ``--json`` (``checks``)."""

import json
import shutil

import msgspec
import pytest

from kern_capture import Capture, CaptureFormatError, iter_launches
from kern_capture.checks import SHOWN, LaunchChecker
from kern_capture.cli import main
from kern_capture.summary import summarize


def _edited(fixtures, tmp_path, edit, name="cap"):
    """A copy of capture_torch whose records ``edit(recs)`` changed in place; returns the directory."""
    d = tmp_path / name
    shutil.copytree(fixtures / "capture_torch", d)
    recs = [msgspec.json.decode(line) for line in (d / "launches.jsonl").read_bytes().splitlines()]
    edit(recs)
    (d / "launches.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in recs))
    return d


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- impossible: a hard error naming file and line --------------------------------------------


@pytest.mark.parametrize("field, value, says", [
    ("grid", [-4, 1, 1], r"grid \[-4, 1, 1\]: negative, impossible for a launch"),
    ("block", [128, -1, 1], r"block \[128, -1, 1\]: negative"),
    ("shared_mem", -16, r"shared_mem -16: negative"),
])
def test_negative_geometry_is_a_format_error(fixtures, tmp_path, capsys, field, value, says):
    def edit(recs):
        recs[4][field] = value
    d = _edited(fixtures, tmp_path, edit)
    with pytest.raises(CaptureFormatError, match=rf"launches.jsonl:5: .*{says}"):
        list(iter_launches(d))
    assert main(["summary", str(d)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"kern-capture: error: malformed capture: {d / 'launches.jsonl'}:5: ")


def test_negative_grid_on_an_unterminated_last_line_is_not_taken_for_a_cut(fixtures, tmp_path):
    """A last line without its newline that is complete JSON was not cut short: an impossible record
    there is an error too, not silently dropped as a truncated write."""
    def edit(recs):
        recs[-1]["grid"] = [1, -1, 1]
    d = _edited(fixtures, tmp_path, edit)
    data = (d / "launches.jsonl").read_bytes()
    (d / "launches.jsonl").write_bytes(data.rstrip(b"\n"))
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl:9: .*grid \[1, -1, 1\]: negative"):
        list(iter_launches(d))


def test_zero_grid_is_not_impossible(fixtures, tmp_path):
    # a launch with a 0 grid dimension is refused by the driver (a failed launch, recorded as such)
    def edit(recs):
        recs[4]["grid"] = [0, 1, 1]
        recs[4]["result"] = 1
    assert len(list(iter_launches(_edited(fixtures, tmp_path, edit)))) == 9


# --- suspicious: counted, the first few named -------------------------------------------------


def test_clean_capture_has_no_warning(fixtures, capsys):
    s = summarize(Capture.open(fixtures / "capture_torch"))
    assert s.checks.clean and s.checks.launches == 9 and s.warnings() == []
    assert main(["summary", str(fixtures / "capture_torch")]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "warning" not in out
    assert main(["summary", "--json", str(fixtures / "capture_torch")]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks["truncated_line"] is None
    assert all(checks[k] == {"count": 0, "first": []}
               for k in ("failed_launches", "seq_not_increasing", "second_pid", "time_backwards"))


def _spliced(recs):
    recs[2]["seq"], recs[3]["seq"] = recs[3]["seq"], recs[2]["seq"]  # line 4: seq 2 after 3
    recs[5]["seq"] = recs[4]["seq"]  # line 6: a repeat
    recs[6]["pid"] = recs[7]["pid"] = 999  # lines 7, 8: another process
    recs[7]["tid"] = 999
    recs[8]["t_ns"] = recs[5]["t_ns"] - 1000  # line 9: before its thread's previous launch (line 6)
    recs[1]["result"] = 700  # line 2: CUDA_ERROR_ILLEGAL_ADDRESS


def test_suspicious_records_are_counted_and_named(fixtures, tmp_path):
    d = _edited(fixtures, tmp_path, _spliced)
    c = summarize(Capture.open(d)).checks
    src = str(d / "launches.jsonl")
    assert c.source == src and c.launches == 9
    assert c.failed_launches.count == 1
    e = c.failed_launches.first[0]
    assert (e.launch, e.line, e.symbol, e.detail) == (1, 2, "_Z6VecAddPfS_S_", "result 700")
    assert c.seq_not_increasing.count == 2
    assert [(e.line, e.detail) for e in c.seq_not_increasing.first] == [(4, "seq 2 after 3"), (6, "seq 4 after 4")]
    assert c.second_pid.count == 2
    assert [(e.line, e.detail) for e in c.second_pid.first] == [(7, "pid 999, the first record's is 41873"),
                                                                (8, "pid 999, the first record's is 41873")]
    # line 9 (tid 41873) is earlier than line 6 of the same thread; lines 7-8 are other threads
    assert c.time_backwards.count == 1 and c.time_backwards.first[0].line == 9
    assert c.time_backwards.first[0].detail == "t_ns 1000 ns before tid 41873's previous launch"
    w = c.warnings("summarising")
    assert len(w) == 4
    assert w[0].startswith("1 failed launch (non-zero CUDA result: the kernel did not run") and \
        f"launch 1 _Z6VecAddPfS_S_ (result 700) at {src}:2" in w[0]
    assert w[1].startswith(f"2 records whose seq does not increase") and f"{src}:4 (launch 3, " in w[1]
    assert w[2].startswith("2 records of another process than the first record's") and f"{src}:7 " in w[2]
    assert w[3].startswith("1 record whose t_ns is earlier than the previous launch of the same thread") and \
        f"{src}:9 " in w[3]


def test_time_going_back_across_threads_is_not_suspicious(fixtures, tmp_path):
    # t_ns is taken at the call's entry, the record written at its exit: threads interleave
    def edit(recs):
        recs[3]["tid"] = 7
        recs[3]["t_ns"] = recs[2]["t_ns"] - 5000
    c = summarize(Capture.open(_edited(fixtures, tmp_path, edit))).checks
    assert c.clean


def test_seq_gaps_are_not_suspicious(fixtures, tmp_path):
    # kern-mine trim drops whole windows: seq keeps increasing, with gaps
    def edit(recs):
        for r in recs[4:]:
            r["seq"] += 100
    assert summarize(Capture.open(_edited(fixtures, tmp_path, edit))).checks.clean


def test_only_the_first_few_are_named(fixtures, tmp_path):
    def edit(recs):
        for r in recs[1:]:
            r["result"] = 1
    c = summarize(Capture.open(_edited(fixtures, tmp_path, edit))).checks
    assert c.failed_launches.count == 8 and len(c.failed_launches.first) == SHOWN
    assert c.warnings()[0].endswith(f", and {8 - SHOWN} more")


def test_summary_reports_them_on_stderr_in_text_and_json(fixtures, tmp_path, capsys):
    d = _edited(fixtures, tmp_path, _spliced)
    assert main(["summary", str(d)]) == 0  # warnings do not change the exit status
    out, err = capsys.readouterr()
    warned = err.splitlines()
    assert len(warned) == 4 and all(l.startswith("kern-capture: warning: ") for l in warned)
    shown = [l.strip()[len("warning: "):] for l in out.splitlines() if l.strip().startswith("warning: ")]
    assert shown == [l[len("kern-capture: warning: "):] for l in warned]
    assert main(["summary", "--json", str(d)]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks["failed_launches"]["count"] == 1 and checks["seq_not_increasing"]["count"] == 2
    assert checks["second_pid"]["count"] == 2 and checks["time_backwards"]["count"] == 1
    assert checks["failed_launches"]["first"] == [
        {"launch": 1, "line": 2, "symbol": "_Z6VecAddPfS_S_", "detail": "result 700"}]


def test_checker_counts_lines_not_records():
    """Line numbers are the file's (blank lines count), launch indices the records'."""
    from kern_capture.records import LaunchRecord

    rec = LaunchRecord(seq=5, t_ns=1, pid=1, tid=1, ctx=1, stream=0, module_id=None, symbol="k",
                       api="cuLaunchKernel", grid=(1, 1, 1), block=(1, 1, 1), shared_mem=0, attrs=None,
                       params=None, result=2)
    c = LaunchChecker("f")
    c.add(rec, 3)
    c.add(rec, 7)
    r = c.result()
    assert [(e.launch, e.line) for e in r.failed_launches.first] == [(0, 3), (1, 7)]
    assert [(e.launch, e.line) for e in r.seq_not_increasing.first] == [(1, 7)]


# --- a cut-short last line: summary says so too ----------------------------------------------


def test_summary_says_a_cut_short_last_line_was_dropped(fixtures, tmp_path, capsys):
    d = tmp_path / "cut"
    shutil.copytree(fixtures / "capture_torch", d)
    data = (d / "launches.jsonl").read_bytes()
    (d / "launches.jsonl").write_bytes(data + data.splitlines(keepends=True)[0][:57])
    assert main(["summary", str(d)]) == 0
    out, err = capsys.readouterr()
    says = (f"{d / 'launches.jsonl'}:10: last line cut short (the target crashed or was still writing?); "
            "dropped, summarising the 9 launches before it")
    assert _one_line(err) == f"kern-capture: warning: {says}"
    assert f"  warning: {says}" in out.splitlines()
    assert "9 launches of 6 kernels" in out
    assert main(["summary", "--json", str(d)]) == 0
    assert json.loads(capsys.readouterr().out)["checks"]["truncated_line"] == 10


def test_summary_names_the_subcapture_whose_last_line_was_cut(fixtures, tmp_path, capsys):
    d = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", d)
    shutil.copytree(fixtures / "capture_torch", d / "pid77")
    data = (d / "pid77" / "launches.jsonl").read_bytes()
    (d / "pid77" / "launches.jsonl").write_bytes(data[:-30])
    assert main(["summary", str(d)]) == 0
    err = _one_line(capsys.readouterr().err)
    assert err.startswith(f"kern-capture: warning: {d / 'pid77' / 'launches.jsonl'}:9: last line cut short")
