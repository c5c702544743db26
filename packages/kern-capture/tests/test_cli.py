"""The kern-capture CLI: summary output, argument errors, run without CUDA."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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
    # the fixture holds the old wording ("per-parameter capture not possible"): shown as today's
    assert ("params null: parameters passed through the packed extra buffer (CU_LAUNCH_PARAM_BUFFER_POINTER); "
            "raw bytes in extra_hex: LaunchRecord.params_from_extra(layout) cuts them") in out
    assert "not possible" not in out
    assert "1 launch with no module id" in out
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
    assert f"{tmp_path / 'nope'}: no such directory" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["summary", str(tmp_path / "f")]) == 2
    assert f"{tmp_path / 'f'}: not a directory" in capsys.readouterr().err
    assert main(["summary", str(tmp_path)]) == 2
    assert "kern-capture directory" in capsys.readouterr().err


def test_summary_of_a_trimmed_capture(fixtures, tmp_path, capsys):
    d = tmp_path / "trimmed"
    d.mkdir()
    shutil.copy(fixtures / "capture_torch" / "modules.jsonl", d)
    (d / "launches.jsonl.gz").write_bytes(gzip.compress((fixtures / "capture_torch" / "launches.jsonl").read_bytes()))
    assert main(["summary", str(d)]) == 0
    assert "9 launches of 6 kernels, 3 modules" in capsys.readouterr().out


def test_summary_without_launch_file_is_an_error(fixtures, tmp_path, capsys):
    d = tmp_path / "cap"
    d.mkdir()
    shutil.copy(fixtures / "capture_torch" / "modules.jsonl", d)
    assert main(["summary", str(d)]) == 2
    err = capsys.readouterr().err
    assert str(d) in err and "neither launches.jsonl nor launches.jsonl.gz" in err


def test_summary_singular(fixtures, tmp_path, capsys):
    d = tmp_path / "one"
    d.mkdir()
    first = (fixtures / "capture_torch" / "launches.jsonl").read_bytes().splitlines(keepends=True)[0]
    (d / "launches.jsonl").write_bytes(first)
    (d / "modules.jsonl").write_bytes(
        (fixtures / "capture_torch" / "modules.jsonl").read_bytes().splitlines(keepends=True)[0])
    shutil.copy(fixtures / "capture_torch" / "module_1.fatbin", d)
    assert main(["summary", str(d)]) == 0
    out = capsys.readouterr().out
    assert "1 launch of 1 kernel, 1 module (1 fatbin); 1 launch with all parameters, 0 without" in out
    (d / "launches.jsonl").write_bytes(b"")
    assert main(["summary", str(d)]) == 0
    assert "0 launches of 0 kernels, 1 module" in capsys.readouterr().out


def test_summary_max_grids_must_be_positive(fixtures, capsys):
    for bad, why in (("0", "0 is below 1"), ("-2", "-2 is below 1"), ("x", "'x' is not a whole number")):
        with pytest.raises(SystemExit) as exc:
            main(["summary", "--max-grids", bad, str(fixtures / "capture_torch")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "--max-grids" in err and why in err and ">= 1" in err
    assert main(["summary", "--max-grids", "1", str(fixtures / "capture_torch")]) == 0
    assert "[4,1,1]x1 (+2 more)" in capsys.readouterr().out


def test_summary_exit_code_reflects_a_failed_subcapture(fixtures, tmp_path, capsys):
    d = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", d)
    shutil.copytree(fixtures / "capture_error", d / "pid4242")
    assert main(["summary", str(d)]) == 3
    out = capsys.readouterr().out
    assert "9 launches of 6 kernels" in out and "ERROR: CUPTI already has a subscriber" in out
    assert main(["summary", "--json", str(d)]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["error"] is None and data["subcaptures"][0]["error"]["error"] == "multiple_subscribers"


def test_summary_into_a_closed_pipe_exits_quietly(fixtures):
    # `kern-capture summary --json DIR | head`: the reader is gone before the first write
    r, w = os.pipe()
    os.close(r)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for extra in (["--json"], []):
        proc = subprocess.run([sys.executable, "-m", "kern_capture.cli", "summary", *extra,
                               str(fixtures / "capture_torch")], stdout=w, stderr=subprocess.PIPE,
                              env=env, timeout=60, text=True)
        assert proc.stderr == "" and proc.returncode == 0
    os.close(w)


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


@pytest.fixture
def no_build(monkeypatch):
    """`run` without building: the commands below never initialise CUDA, the library is never loaded."""
    import kern_capture.cli as cli

    monkeypatch.setattr(cli, "build_library", lambda cc=None: Path("/nonexistent/libkern_capture.so"))
    return cli


@pytest.mark.parametrize("driver", [True, False])
def test_run_nothing_captured(tmp_path, capsys, no_build, monkeypatch, driver):
    monkeypatch.setattr(no_build, "_cuda_driver_loadable", lambda: driver)
    rc = main(["run", "--out", str(tmp_path / "o"), "--", sys.executable, "-c", "raise SystemExit(7)"])
    assert rc == 7
    err = capsys.readouterr().err
    assert "nothing captured" in err and "exited with 7" in err
    assert "holds what ran before that" not in err  # there is no capture to speak of
    assert ("is there a CUDA driver on this machine?" in err) is (not driver)
    assert main(["run", "--out", str(tmp_path / "p"), "--", sys.executable, "-c", "pass"]) == 3
    assert ("is there a CUDA driver on this machine?" in capsys.readouterr().err) is (not driver)


def test_run_failure_after_a_capture_points_at_it(tmp_path, capsys, no_build):
    # the command "initialises CUDA" (writes capture.json as the library would), then fails
    out = tmp_path / "o"
    code = "import os, sys; open(os.path.join(os.environ['KERN_CAPTURE_OUT'], 'capture.json'), 'w').write('{}'); sys.exit(5)"
    assert main(["run", "--out", str(out), "--", sys.executable, "-c", code]) == 5
    err = capsys.readouterr().err
    assert f"exited with 5; the capture in {out} holds what ran before that" in err
    assert "nothing captured" not in err


def test_run_command_not_found(tmp_path, capsys, built_library, monkeypatch):
    monkeypatch.setenv("KERN_CAPTURE_CACHE", str(built_library.parent.parent.parent))
    assert main(["run", "--out", str(tmp_path / "o"), "--", "/nonexistent/prog"]) == 2
    assert "command not found" in capsys.readouterr().err
