"""What the command line says about bad input: damaged or cut-short capture files, empty
captures, wrong paths, out-of-range options. Every error is one ``kern-mine: error: ...`` line
(no traceback) saying what is wrong and what to do; warnings are one line too."""

import gzip
import importlib.metadata
import json
import shutil

import msgspec
import pytest

import kern_mine
from kern_mine.capture import NoLaunchesError, load_capture
from kern_mine.cli import main
from kern_mine.mine import MineOptions, mine
from kern_mine.reference import TokensMaxError
from kern_mine.report import CANDIDATES_SHOWN, MineReport, render_text, to_json
from kern_mine.trim import trim

LARGEST = 64  # the standard capture's largest token count (its first warm-up pass)


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def gz_capture(standard, tmp_path):
    """The standard capture trimmed (``launches.jsonl.gz``), and its compressed bytes."""
    d = tmp_path / "gz"
    trim(standard[0], d)
    return d, (d / "launches.jsonl.gz").read_bytes()


# --- damaged gzip (kern-mine and kern-mine trim) --------------------------------------------


def test_gzip_cut_short_is_one_line(gz_capture, tmp_path, capsys):
    d, data = gz_capture
    (d / "launches.jsonl.gz").write_bytes(data[: len(data) // 2])
    assert main([str(d)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"kern-mine: error: malformed capture: {d / 'launches.jsonl.gz'}: "
                           "truncated gzip stream (file cut short?); copy it again")
    assert main(["trim", str(d), str(tmp_path / "out")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("kern-mine trim: error: malformed capture: ") and "truncated gzip stream" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, says", [
    (lambda data, plain: b"this is not gzip\n", "not gzip data (damaged?); copy it again"),
    (lambda data, plain: plain, "plain JSON lines, not gzip: rename it to launches.jsonl"),
    (lambda data, plain: data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:], "corrupt gzip data"),
])
def test_gzip_damaged_is_one_line(gz_capture, tmp_path, capsys, damage, says):
    d, data = gz_capture
    (d / "launches.jsonl.gz").write_bytes(damage(data, gzip.decompress(data)))
    for argv, prefix in (([str(d)], "kern-mine"), (["trim", str(d), str(tmp_path / "o")], "kern-mine trim")):
        assert main(argv) == 1
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"{prefix}: error: malformed capture: {d / 'launches.jsonl.gz'}: ") and says in line


def test_gzip_named_plain_is_named(gz_capture, capsys):
    d, _ = gz_capture
    (d / "launches.jsonl.gz").rename(d / "launches.jsonl")
    assert main([str(d)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "launches.jsonl:1: " in line and "(gzip data: rename it to launches.jsonl.gz)" in line


# --- a plain launches.jsonl cut mid-line; an empty one -------------------------------------


def _cut_mid_last_line(standard, tmp_path):
    d = tmp_path / "cut"
    d.mkdir()
    data = (standard[0] / "launches.jsonl").read_bytes()
    n = data.count(b"\n")
    (d / "launches.jsonl").write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 40])  # 39 bytes of the last line
    return d, n


def test_truncated_last_line_is_dropped_with_a_warning_and_flagged(standard, tmp_path, capsys):
    d, n = _cut_mid_last_line(standard, tmp_path)
    assert main([str(d), "--json"]) == 0
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert line.startswith(f"kern-mine: warning: {d / 'launches.jsonl'}:{n}: last line cut short")
    assert f"mining the {n - 1} launches before it" in line
    doc = json.loads(out)
    assert doc["summary"]["truncated_last_line"] is True and doc["summary"]["launches"] == n - 1
    assert msgspec.json.decode(out, type=MineReport).summary.truncated_last_line
    # the library flags it too, and the readable report says so
    r = mine(d)
    assert r.summary.truncated_last_line and "last line was cut short" in render_text(r)
    # a clean capture: the flag is false (present in the document: the format's default)
    assert standard[2].summary.truncated_last_line is False
    assert json.loads(to_json(standard[2]))["summary"]["truncated_last_line"] is False
    assert "cut short" not in render_text(standard[2])
    # an older kern-mine/2 document (no such field) still decodes
    old = json.loads(to_json(standard[2]))
    del old["summary"]["truncated_last_line"]
    assert msgspec.json.decode(json.dumps(old), type=MineReport).summary.truncated_last_line is False


def test_trim_warns_about_a_truncated_last_line(standard, tmp_path, capsys):
    d, n = _cut_mid_last_line(standard, tmp_path)
    assert main(["trim", str(d), str(tmp_path / "t")]) == 0
    out, err = capsys.readouterr()
    assert _one_line(err).startswith(f"kern-mine trim: warning: {d / 'launches.jsonl'}:{n}: last line cut short")
    assert f"{n - 1} launches" in out
    assert load_capture(tmp_path / "t").truncated_line is None  # the copy ends cleanly


@pytest.mark.parametrize("content, says", [
    (b"", "no launch to mine: the file is empty"),
    (b"\n\n", "no launch to mine: the file is empty"),
    (b'{"seq": 0, "t_ns": 1', "no launch to mine: its only line, line 1, is cut short"),
])
def test_empty_capture_is_one_error_line(tmp_path, capsys, content, says):
    (tmp_path / "launches.jsonl").write_bytes(content)
    assert main([str(tmp_path)]) == 2
    assert _one_line(capsys.readouterr().err) == f"kern-mine: error: {tmp_path / 'launches.jsonl'}: {says}" + (
        " (the target launched no kernel, or it was cut short)" if "empty" in says else
        " (the target crashed or was still writing?)")
    with pytest.raises(NoLaunchesError):
        mine(tmp_path)
    (tmp_path / "launches.jsonl").unlink()
    (tmp_path / "launches.jsonl.gz").write_bytes(gzip.compress(b""))
    assert main([str(tmp_path)]) == 2
    assert "no launch to mine" in _one_line(capsys.readouterr().err)


# --- --tokens-max and --gap-ms -------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-3", "abc"])
def test_tokens_max_below_one_is_rejected(standard, capsys, value):
    with pytest.raises(SystemExit) as e:
        main([str(standard[0]), "--tokens-max", value])
    assert e.value.code == 2
    assert "kern-mine: error: argument --tokens-max: " in capsys.readouterr().err
    if value != "abc":
        with pytest.raises(ValueError, match="tokens_max must be >= 1"):
            MineOptions(tokens_max=int(value))


def test_tokens_max_below_the_largest_count_is_rejected(standard, capsys):
    assert main([str(standard[0]), "--tokens-max", str(LARGEST - 1)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (f"kern-mine: error: --tokens-max {LARGEST - 1} is below the largest token count in the capture "
                    f"({LARGEST}): the fits cover every pass seen; pass --tokens-max {LARGEST} or more, or omit it")
    with pytest.raises(TokensMaxError) as e:
        mine(standard[0], MineOptions(tokens_max=3))
    assert e.value.largest == LARGEST


def test_tokens_max_above_the_largest_count_warns(standard, capsys):
    assert main([str(standard[0]), "--tokens-max", str(LARGEST), "--json"]) == 0
    assert capsys.readouterr().err == ""  # at the largest count: nothing to say
    assert main([str(standard[0]), "--tokens-max", "4096", "--json"]) == 0
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert line.startswith(f"kern-mine: warning: --tokens-max 4096 is above the largest token count in the capture "
                           f"({LARGEST}): ")
    assert line.endswith("capture a pass at 4096 tokens")
    assert json.loads(out)["options"]["tokens_max"] == 4096


def test_help_says_what_the_options_do(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "[1, N]" in out and "below that count is an error" in out and "capture a pass at N tokens" in out
    assert "> 0" in out and "default: auto" in out


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "x"])
def test_gap_ms_must_be_positive(standard, capsys, value):
    with pytest.raises(SystemExit) as e:
        main([str(standard[0]), "--gap-ms", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "kern-mine: error: argument --gap-ms: " in err
    if value != "x":
        assert "must be > 0 ms (omit it for auto)" in err
        with pytest.raises(ValueError, match="gap_ms must be > 0"):
            MineOptions(gap_ms=float(value))


# --- paths and --version -------------------------------------------------------------------


def test_missing_directory_says_what_to_pass(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"kern-mine: error: {tmp_path / 'nope'}: no such directory; pass the --out directory of "
        "`kern-capture run` (or a pid<N>/ inside it)")
    assert main([str(tmp_path)]) == 2  # a directory without a capture
    assert "--out directory of `kern-capture run`" in _one_line(capsys.readouterr().err)


def test_empty_argument_is_an_error_not_the_cwd(standard, monkeypatch, capsys):
    monkeypatch.chdir(standard[0])  # a capture in the cwd must not be mined by ""
    for argv in ([""], ["trim", "", "out"], ["trim", str(standard[0]), ""]):
        assert main(argv) == 2
        assert "empty" in _one_line(capsys.readouterr().err)
    assert not (standard[0] / "out").exists() and not (standard[0] / "launches.jsonl.gz").exists()


def test_a_file_suggests_its_directory_and_a_launches_file_is_mined(standard, tmp_path, capsys):
    d, _, r = standard
    (tmp_path / "capture.json").write_text("{}")
    assert main([str(tmp_path / "capture.json")]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"kern-mine: error: {tmp_path / 'capture.json'}: a file, not a capture directory; "
        f"pass its directory ({tmp_path}) or a launches.jsonl[.gz] file")
    r2 = mine(d / "launches.jsonl")  # the launches file itself: its directory is the capture
    r2.capture = r.capture
    assert to_json(r2) == to_json(r)
    trim(d / "launches.jsonl", tmp_path / "t")
    assert main([str(tmp_path / "t" / "launches.jsonl.gz"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["requests"] == r.summary.requests


def test_per_process_gzip_captures_are_named(gz_capture, tmp_path, capsys):
    d, _ = gz_capture
    top = tmp_path / "top"
    (top / "pid7").mkdir(parents=True)
    shutil.copy(d / "launches.jsonl.gz", top / "pid7")
    (top / "pid9").mkdir()  # no capture in it
    assert main([str(top)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "per-process captures: pid7; mine one of them" in line and "pid9" not in line


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"kern-mine {kern_mine.__version__}"
    assert kern_mine.__version__ == importlib.metadata.version("kern-mine")


# --- the readable report's reference candidates ---------------------------------------------


def test_report_says_how_many_candidates_are_only_in_the_json(standard):
    r = msgspec.json.decode(to_json(standard[2]), type=MineReport)
    assert len(r.reference.candidates) == CANDIDATES_SHOWN
    assert "more in --json" not in render_text(r)
    r.reference.candidates += r.reference.candidates[:3]
    text = render_text(r)
    assert "      (3 more in --json)" in text
    rows = [line for line in text.splitlines() if line.startswith("      site ")]
    assert len(rows) == CANDIDATES_SHOWN


# --- a damaged parameter inside a line -----------------------------------------------------


def _damage_line(standard, tmp_path, lineno, old, new):
    d = tmp_path / "damaged"
    d.mkdir()
    lines = (standard[0] / "launches.jsonl").read_bytes().split(b"\n")
    assert old in lines[lineno - 1]
    lines[lineno - 1] = lines[lineno - 1].replace(old, new, 1)
    (d / "launches.jsonl").write_bytes(b"\n".join(lines))
    return d


@pytest.mark.parametrize("new, says", [
    (b'"hex":"zz', "Expected `str` matching regex"),   # not hex digits: once a traceback from bytes.fromhex
    (b'"hex":"00', "hex digits, but a "),              # one byte more than the parameter's size: once read silently
])
def test_damaged_param_hex_names_the_line(standard, tmp_path, capsys, new, says):
    lines = (standard[0] / "launches.jsonl").read_bytes().split(b"\n")
    n = next(i for i, line in enumerate(lines, 1) if b'"hex":"' in line and i > 40)
    d = _damage_line(standard, tmp_path, n, b'"hex":"', new)
    for argv, prefix in (([str(d)], "kern-mine"), (["trim", str(d), str(tmp_path / "o")], "kern-mine trim")):
        assert main(argv) == 1
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"{prefix}: error: malformed capture: {d / 'launches.jsonl'}:{n}: ") and says in line
        assert "$.params[" in line
