"""tools/build_kernels.py's answers to bad options: one `build_kernels.py: error: ...` line, exit 2, before
anything is compiled or written (a bad --geometry was a ValueError traceback; --out a file, a FileExistsError
traceback; -j 0 silently the default and -j -1 one job)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import build_kernels  # noqa: E402


@pytest.fixture
def no_build(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["build_kernels.py"])  # argparse's prog, as when run as a script
    def refuse(*a, **kw):
        raise AssertionError("build() reached with bad options")
    monkeypatch.setattr(build_kernels, "build", refuse)


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        build_kernels.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_bad_geometry(no_build, tmp_path, capsys):
    out = tmp_path / "k"
    line = _error(capsys, ["--out", str(out), "--geometry", "4b", "--geometry", "7b"])
    assert line == ("build_kernels.py: error: --geometry: geometry '7b': not a preset (0.6b, 1.7b, 4b, 8b, 14b, 32b) "
                    "and not a file")
    (tmp_path / "c.json").write_text("{bad")
    line = _error(capsys, ["--out", str(out), "--geometry", str(tmp_path / "c.json")])
    assert line.startswith(f"build_kernels.py: error: --geometry: geometry '{tmp_path / 'c.json'}': ") and "not JSON" in line
    assert not out.exists()


def test_out_under_or_at_a_file(no_build, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert _error(capsys, ["--out", str(tmp_path / "f")]) == \
        f"build_kernels.py: error: --out {tmp_path / 'f'}: exists and is not a directory"
    assert _error(capsys, ["--out", str(tmp_path / "f" / "k")]) == \
        f"build_kernels.py: error: --out {tmp_path / 'f' / 'k'}: {tmp_path / 'f'} is a file, not a directory"


@pytest.mark.parametrize("value, says", [("0", "must be >= 1"), ("-1", "must be >= 1"), ("x", "not an integer")])
def test_jobs_must_be_positive(no_build, tmp_path, capsys, value, says):
    line = _error(capsys, ["--out", str(tmp_path / "k"), "-j", value])
    assert line.startswith("build_kernels.py: error: argument -j/--jobs: ") and says in line


@pytest.mark.parametrize("value", ["head-major", "token-major"])
def test_kv_layout_is_refused_by_name(no_build, tmp_path, capsys, value):
    """--kv-layout (an opt-in of session 20, removed when head-major became the only layout) says why, not argparse's
    "unrecognized arguments"; --help does not list it."""
    out = tmp_path / "k"
    line = _error(capsys, ["--out", str(out), "--kv-layout", value])
    assert line == (f"build_kernels.py: error: --kv-layout {value}: removed; every kernel is built for the one KV "
                    'layout, head-major (tools/README.md, "KV layout"): drop the option')
    assert not out.exists()
    with pytest.raises(SystemExit):
        build_kernels.main(["--help"])
    assert "--kv-layout" not in capsys.readouterr().out
