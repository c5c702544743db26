"""tools/make_random_checkpoint.py's argument checks, on the CPU: each bad argument is one usage error
before torch is imported (torch is made unimportable here, so reaching the import shows as its own error)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import make_random_checkpoint as mrc  # noqa: E402

NO_TORCH = "make_random_checkpoint: needs torch and transformers"


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setitem(sys.modules, "transformers", None)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int | str, str]:
    with pytest.raises(SystemExit) as e:
        mrc.main(list(argv))
    err = capsys.readouterr().err.strip()
    return e.value.code, err.splitlines()[-1] if err else ""


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, last = _run(capsys, *argv)
    assert code == 2, (code, last)
    assert ": error: " in last and "Traceback" not in last  # argparse's `PROG: error: MESSAGE`
    return last.split(": error: ", 1)[1]


def test_valid_arguments_reach_the_torch_import(tmp_path: Path) -> None:
    """The checks do not refuse good arguments (geometry in any case, an empty --out directory); without torch
    the run ends in one line naming what is missing (was: a ModuleNotFoundError traceback)."""
    (tmp_path / "empty").mkdir()
    for argv in (["--geometry", "4b", "--out", str(tmp_path / "new")],
                 ["--geometry", "Qwen3-4B", "--out", str(tmp_path / "empty"), "--seed", "3", "--layers", "36",
                  "--max-shard-size", "200MB", "--logit-std", "0"]):
        with pytest.raises(SystemExit) as e:
            mrc.main(argv)
        assert str(e.value.code).startswith(NO_TORCH)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--geometry", "5b"], "argument --geometry: unknown geometry '5b'; known: 0.6b, 1.7b, 4b, 8b, 14b, 32b"),
        (["--geometry", "4b", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        (["--geometry", "4b", "--seed", "x"], "argument --seed: not an integer: 'x'"),
        (["--geometry", "4b", "--layers", "0"], "--layers 0: must be in 1..36 for 4b"),
        (["--geometry", "0.6b", "--layers", "29"], "--layers 29: must be in 1..28 for 0.6b"),
        (["--geometry", "4b", "--logit-std", "-1"], "--logit-std -1.0: must be >= 0"),
        (["--geometry", "4b", "--logit-std", "nan"], "--logit-std nan: must be >= 0"),
        (["--geometry", "4b", "--max-shard-size", "5XB"], "argument --max-shard-size: '5XB': give a positive integer"),
        (["--geometry", "4b", "--max-shard-size", "1.5GB"], "argument --max-shard-size: '1.5GB': give a positive"),
        (["--geometry", "4b", "--max-shard-size", "200mb"], "argument --max-shard-size: '200mb': give a positive"),
        (["--geometry", "4b", "--max-shard-size", "0GB"], "argument --max-shard-size: '0GB': give a positive"),
    ],
)
def test_bad_argument_is_a_usage_error_before_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                                    expect: str) -> None:
    """Was: --layers out of range and a bad --max-shard-size were found only after importing torch (and the
    latter after drawing every weight); --seed -1 and --logit-std < 0 or nan were taken; `4B` was refused."""
    msg = _usage_error(capsys, *argv, "--out", str(tmp_path / "ck"))
    assert msg.startswith(expect), msg
    assert not (tmp_path / "ck").exists()


def test_bad_out_is_a_usage_error_before_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: --out a file or under one a FileExistsError traceback after the weights were drawn; an --out holding
    an older checkpoint was written into, its stale shards or index.json left beside the new ones."""
    f = tmp_path / "f"
    f.write_text("x")
    assert _usage_error(capsys, "--geometry", "4b", "--out", str(f)) == (
        f"--out '{f}': exists and is not a directory (the checkpoint is a directory)")
    assert _usage_error(capsys, "--geometry", "4b", "--out", str(f / "ck")) == (
        f"--out {f / 'ck'}: {f} is a file, not a directory")
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors.index.json").write_text("{}")
    assert _usage_error(capsys, "--geometry", "4b", "--out", str(old)) == (
        f"--out {old}: a directory that is not empty; remove it or choose a new one")
    assert f.read_text() == "x" and [p.name for p in old.iterdir()] == ["model.safetensors.index.json"]


def test_bad_tokenizer_is_a_usage_error_before_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: found after every weight had been drawn and written (minutes for 32B), the checkpoint left without
    its kern_random_init.json."""
    out = str(tmp_path / "ck")
    assert _usage_error(capsys, "--geometry", "4b", "--out", out, "--tokenizer", str(tmp_path / "nope")) == (
        f"--tokenizer {tmp_path / 'nope'}: not a directory")
    (tmp_path / "tok").mkdir()
    assert _usage_error(capsys, "--geometry", "4b", "--out", out, "--tokenizer", str(tmp_path / "tok")) == (
        f"--tokenizer {tmp_path / 'tok'}: no tokenizer.json there")


def test_shard_size_digits_are_bytes() -> None:
    """save_pretrained takes an int as bytes but refuses a string of digits: the option passes an int."""
    assert mrc._shard_size("1000000") == 1000000 and mrc._shard_size("5GB") == "5GB"
    assert mrc._shard_size("512MiB") == "512MiB"
