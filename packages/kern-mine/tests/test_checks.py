"""Failed launches and implausible records (``kern_capture.checks``, shared with ``kern-capture
summary``). A failed launch keeps its index (the JSON's launch ranges are line numbers) but nothing
mined from its pass reaches the facts; a suspicious capture is mined with warnings, the same ones
``kern-capture summary`` gives; an impossible record is a malformed capture."""

import json

import msgspec
import pytest

from kern_capture.cli import main as capture_main
from kern_mine.capture import load_capture
from kern_mine.cli import main
from kern_mine.mine import mine
from kern_mine.report import MineReport, render_text, to_json

FAILED_PASS = 11  # the 16-token prefill of the third request, launches [330, 360)
ODD_GRID = 999_999  # a grid no pass ran: the failed launch's


def _copy(standard, tmp_path, edit, name="cap"):
    d = tmp_path / name
    d.mkdir()
    recs = [msgspec.json.decode(line) for line in (standard[0] / "launches.jsonl").read_bytes().splitlines()]
    edit(recs)
    (d / "launches.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in recs))
    return d


def _rms_norm_of_pass(standard):
    p = next(p for w in standard[2].requests for p in w.passes if p.index == FAILED_PASS)
    recs = [msgspec.json.decode(line) for line in (standard[0] / "launches.jsonl").read_bytes().splitlines()]
    return next(i for i in range(*p.launches) if recs[i]["symbol"] == "rms_norm")


def _fail(i, result):
    def edit(recs):
        recs[i]["grid"] = [ODD_GRID, 1, 1]
        recs[i]["result"] = result
    return edit


def _samples(report):
    return {v for s in report.sites for f in [*s.grid, *(x.fit for x in s.scalars)] for _, v in f.samples}


def test_a_failed_launch_keeps_its_index_and_is_left_out_of_the_facts(standard, tmp_path):
    i = _rms_norm_of_pass(standard)
    r0 = standard[2]
    # the same edit without a failure: the odd grid is mined as a fact (an unfit rms_norm grid)
    ran = mine(_copy(standard, tmp_path, _fail(i, 0), "ran"))
    assert ODD_GRID in _samples(ran)
    r = mine(_copy(standard, tmp_path, _fail(i, 700)))
    # launch indices unchanged: every launch still there, every window where it was
    assert r.summary.launches == r0.summary.launches
    assert sorted(w.launches for w in r.requests + r.other_windows) == \
        sorted(w.launches for w in r0.requests + r0.other_windows)
    passes = {p.index: p for w in r.requests + r.other_windows for p in w.passes}
    p = passes[FAILED_PASS]
    assert p.failed == 1 and not p.regular and p.shape is None and p.tokens is None
    assert p.note.startswith(f"1 failed launch (non-zero CUDA result; the first: launch {i} rms_norm, result 700)")
    assert all(q.failed == 0 and q.regular for k, q in passes.items() if k != FAILED_PASS)
    # nothing of the failed pass is a fact: not its grid, not its token count, not its pointers
    assert ODD_GRID not in _samples(r)
    assert all(16 not in s.token_counts for s in r.sites)
    assert all(s.passes == 18 for s in r.sites if s.symbol == "rms_norm")
    assert {pt.site for pt in r.pointers} == {pt.site for pt in r0.pointers}
    # the request holding it is not a request any more (one of its passes did not run)
    assert r.summary.requests == r0.summary.requests - 1
    assert r.summary.regular_passes == r0.summary.regular_passes - 1
    # flagged in the summary and named in checks
    assert r.summary.failed_launches == 1
    e = r.checks.failed_launches.first[0]
    assert (e.launch, e.line, e.symbol, e.detail) == (i, i + 1, "rms_norm", "result 700")
    text = render_text(r)
    warned = [l for l in text.splitlines() if l.startswith("  warning: ")]
    assert len(warned) == 1 and f"launch {i} rms_norm (result 700)" in warned[0]
    assert "leaves the passes holding them out of shapes, sites, the token reference, fits and pointers" in warned[0]
    # a clean capture: none of it
    assert r0.summary.failed_launches == 0 and r0.checks.failed_launches.count == 0
    assert "warning:" not in render_text(r0)
    assert all(q.failed == 0 for w in r0.requests for q in w.passes)


def test_failed_launches_in_the_json_and_on_stderr_once(standard, tmp_path, capsys):
    i = _rms_norm_of_pass(standard)

    def edit(recs):  # a sticky error: every launch from i on fails
        for r in recs[i:]:
            r["result"] = 700
    d = _copy(standard, tmp_path, edit)
    n = 570 - i
    assert main([str(d), "--json"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kern-mine: warning: {n} failed launches (non-zero CUDA result")
    assert f"launch {i} rms_norm (result 700) at {d / 'launches.jsonl'}:{i + 1}" in lines[0]
    assert f"and {n - 3} more" in lines[0]
    doc = json.loads(out)
    assert doc["summary"]["failed_launches"] == n
    assert doc["checks"]["failed_launches"]["count"] == n
    assert [e["launch"] for e in doc["checks"]["failed_launches"]["first"]] == [i, i + 1, i + 2]
    failed = [p for w in doc["requests"] + doc["other_windows"] for p in w["passes"] if p.get("failed")]
    assert sum(p["failed"] for p in failed) == n and all(not p["regular"] for p in failed)
    assert doc["summary"]["requests"] == 2  # the first two requests ran before the fault
    # the document decodes, and an older one (no checks, no failed_launches) still does
    assert msgspec.json.decode(out, type=MineReport).checks.failed_launches.count == n
    old = json.loads(out)
    del old["checks"], old["summary"]["failed_launches"]
    assert msgspec.json.decode(json.dumps(old), type=MineReport).summary.failed_launches == 0


def _spliced(recs):
    recs[100]["seq"] = recs[99]["seq"]  # a repeat
    recs[200]["pid"] = 11  # a second process
    recs[300]["t_ns"] = recs[299]["t_ns"] - 50  # time going back within the thread


def test_suspicious_records_are_mined_with_the_warnings_summary_gives(standard, tmp_path, capsys):
    d = _copy(standard, tmp_path, _spliced)
    assert main([str(d), "--json"]) == 0
    out, err = capsys.readouterr()
    mined = [l.removeprefix("kern-mine: warning: ") for l in err.splitlines()]
    assert len(mined) == 3
    src = d / "launches.jsonl"
    assert mined[0].startswith("1 record whose seq does not increase") and f"{src}:101 (launch 100, " in mined[0]
    assert mined[1].startswith("1 record of another process") and f"{src}:201 " in mined[1]
    assert mined[2].startswith("1 record whose t_ns is earlier") and f"{src}:301 " in mined[2]
    checks = json.loads(out)["checks"]
    assert [checks[k]["count"] for k in ("seq_not_increasing", "second_pid", "time_backwards")] == [1, 1, 1]
    # the same lines as kern-capture summary's (shared code)
    assert capture_main(["summary", str(d)]) == 0
    summary = [l.removeprefix("kern-capture: warning: ") for l in capsys.readouterr().err.splitlines()]
    assert summary == mined
    assert capture_main(["summary", "--json", str(d)]) == 0
    assert json.loads(capsys.readouterr().out)["checks"] == checks
    # the readable report says them too
    assert main([str(d)]) == 0
    assert [l.removeprefix("  warning: ") for l in capsys.readouterr().out.splitlines()
            if l.startswith("  warning: ")] == mined


def test_the_library_checks_launches_given_in_memory(standard, tmp_path):
    from kern_mine.mine import mine_launches

    cap = load_capture(_copy(standard, tmp_path, _spliced))
    r = mine_launches(cap.launches, "mem")
    assert r.checks.seq_not_increasing.count == 1 and r.checks.source == "mem"
    assert r.checks.seq_not_increasing.first[0].line == 101


@pytest.mark.parametrize("field, value", [("grid", [4, -1, 1]), ("block", [-128, 1, 1])])
def test_negative_geometry_is_a_malformed_capture(standard, tmp_path, capsys, field, value):
    def edit(recs):
        recs[42][field] = value
    d = _copy(standard, tmp_path, edit)
    assert main([str(d)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith(f"kern-mine: error: malformed capture: {d / 'launches.jsonl'}:43: ") and "negative" in err


def test_negative_grid_on_the_unterminated_last_line_is_not_taken_for_a_cut(standard, tmp_path, capsys):
    def edit(recs):
        recs[-1]["grid"] = [-1, 1, 1]
    d = _copy(standard, tmp_path, edit)
    (d / "launches.jsonl").write_bytes((d / "launches.jsonl").read_bytes().rstrip(b"\n"))
    assert main([str(d)]) == 1
    assert f"launches.jsonl:570: " in capsys.readouterr().err


def test_the_committed_fixture_is_clean():
    from pathlib import Path

    cap = load_capture(Path(__file__).parent / "fixtures" / "qwen3-0.6b-compile")
    assert cap.checks.clean and cap.checks.launches == 50624
