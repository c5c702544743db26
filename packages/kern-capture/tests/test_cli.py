"""The kern-capture CLI: summary output, argument errors, run without CUDA."""

import json
import shutil
import sys

import pytest

from kern_capture.cli import main


def test_summary_text(fixtures, capsys):
    assert main(["summary", str(fixtures / "capture_torch")]) == 0
    out = capsys.readouterr().out
    assert "9 launches of 6 kernels, 3 modules (2 cubin, 1 fatbin)" in out
    assert "8 launches with all parameters, 1 without" in out
    lines = out.splitlines()
    row = next(l for l in lines if l.endswith("  vec_add"))
    assert row.split()[:4] == ["3", "flat", "3", "4"]
    grids = lines[lines.index(row) + 1]
    assert "[4,1,1]x1 [2,1,1]x1 [1,1,1]x1" in grids and "cuLaunchCooperativeKernel_ptsz" in grids
    gemm = next(l for l in lines if "nvjet_sm90" in l)
    assert gemm.split()[:3] == ["1", "not", "flat"] and gemm.split()[3] == "?"
    assert "not captured: parameters passed through the packed extra buffer" in out
    # order of first launch
    order = [l.split()[-1] for l in lines if l.strip() and l.split()[0].isdigit() and len(l.split()) == 5]
    assert order[:3] == [
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
        "_Z6VecAddPfS_S_",
        "vec_add",
    ]


def test_summary_json(fixtures, capsys):
    assert main(["summary", "--json", str(fixtures / "capture_torch")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["launches"] == 9 and data["modules"] == 3 and data["unresolved_modules"] == 1
    by_symbol = {k["symbol"]: k for k in data["kernels"]}
    assert by_symbol["add_kernel"]["abi"] == "flat"
    assert by_symbol["add_kernel"]["grids"] == [{"grid": [4, 1, 1], "count": 1}, {"grid": [1, 1, 1], "count": 1}]
    assert by_symbol["nvjet_sm90_tst_128x64_64x6_1x2_h_bz_coopB_TNT"]["abi"] == "not flat"


def test_summary_of_failed_capture(fixtures, capsys):
    assert main(["summary", str(fixtures / "capture_error")]) == 3
    assert "ERROR: CUPTI already has a subscriber" in capsys.readouterr().out


def test_summary_errors(tmp_path, capsys):
    assert main(["summary", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["summary", str(tmp_path)]) == 2
    assert "kern-capture directory" in capsys.readouterr().err


def test_no_subcommand(capsys):
    assert main([]) == 2


def test_run_needs_out(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--", "true"])
    assert exc.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_run_needs_a_command(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path / "o")]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path / "o"), "--"]) == 2


def test_run_refuses_non_empty_out(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["run", "--out", str(tmp_path), "--", "true"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), "--force", "--", "true"]) == 2
    assert "refusing to delete" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").exists()


def test_run_force_replaces_previous_capture(fixtures, tmp_path, capsys, built_library, monkeypatch):
    monkeypatch.setenv("KERN_CAPTURE_CACHE", str(built_library.parent.parent.parent))
    out = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", out)
    # `true` never initialises CUDA: nothing captured is a failure (exit 3), with the reason
    assert main(["run", "--out", str(out), "--force", "--", "true"]) == 3
    assert "nothing captured" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_run_reports_command_failure(tmp_path, capsys, built_library, monkeypatch):
    monkeypatch.setenv("KERN_CAPTURE_CACHE", str(built_library.parent.parent.parent))
    rc = main(["run", "--out", str(tmp_path / "o"), "--", sys.executable, "-c", "raise SystemExit(7)"])
    assert rc == 7
    assert "exited with 7" in capsys.readouterr().err


def test_run_command_not_found(tmp_path, capsys, built_library, monkeypatch):
    monkeypatch.setenv("KERN_CAPTURE_CACHE", str(built_library.parent.parent.parent))
    assert main(["run", "--out", str(tmp_path / "o"), "--", "/nonexistent/prog"]) == 2
    assert "command not found" in capsys.readouterr().err
