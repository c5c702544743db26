"""kern-run's command line: one-line errors, notes, the run end to end on a fake kern_driver."""

import json
import sys
import types

import pytest

from fake_runtime import FakeRuntime, info, manifest_json, reference_generate
from kern_run import cli


class FakeDriverError(Exception):
    pass


@pytest.fixture
def files(tmp_path):
    m = tmp_path / "qwen3.json"
    m.write_text(json.dumps(manifest_json(tokens_max=256, max_pages=64, vocab=151936)))  # 1024 positions
    k = tmp_path / "kernels"
    k.mkdir()
    w = tmp_path / "w.safetensors"
    w.write_bytes(b"")
    return ["--manifest", str(m), "--kernels", str(k), "--weights", str(w)]


@pytest.fixture
def driver(monkeypatch):
    """A fake `kern_driver` module; `driver.loaded` holds each Runtime.load call's runtime."""
    mod = types.ModuleType("kern_driver")
    mod.KernDriverError = FakeDriverError
    mod.loaded = []
    mod.fail = None

    class Runtime:
        @staticmethod
        def load(manifest, kernels, weights, *, device=0, capacity_tokens=4096, verify=True):
            if mod.fail:
                raise FakeDriverError(mod.fail)
            rt = FakeRuntime(info(tokens_max=256, max_pages=64, vocab=151936), capacity_tokens)
            rt.load_args = (manifest, kernels, weights, device, capacity_tokens)
            mod.loaded.append(rt)
            return rt

    mod.Runtime = Runtime
    monkeypatch.setitem(sys.modules, "kern_driver", mod)
    return mod


def run(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kern-run: error: ")
    return lines[0]


def test_generates_ids_without_a_tokenizer(files, driver, capsys):
    rc, out, err = run([*files, "--prompt-ids", "5,6,7,8", "--steps", "8", "--capacity", "512"], capsys)
    assert rc == 0, err
    prompt, gen = out.strip().split(" | ")
    assert prompt == "5 6 7 8"
    assert [int(t) for t in gen.split()] == reference_generate([5, 6, 7, 8], 8)
    rt = driver.loaded[0]
    assert rt.load_args[3:] == (0, 512) and rt.closed
    assert "fake runtime: 2 programs" in err  # rt.describe()
    assert "graph: decode (tokens=1) captured" in err
    assert "prompt: 4 tokens in" in err and "prefill 3 tokens in 1 chunk, then the last through decode" in err
    assert "decode: 7 tokens in" in err and "ms/token" in err and "CUDA graph" in err


def test_defaults_are_clamped_silently(files, driver, capsys):
    ids = ",".join(str(i) for i in range(300))
    rc, out, err = run([*files, "--prompt-ids", ids, "--steps", "2"], capsys)
    assert rc == 0, err
    assert "note:" not in err
    assert driver.loaded[0].load_args[4] == 1024  # min(4096, the manifest's 64 pages x 16)
    assert [r[2] for r in driver.loaded[0].runs() if r[0] == "prefill"] == [256, 256, 43]  # chunk min(512, 256); the first run captures the graph


def test_eager_flag(files, driver, capsys):
    rc, out, err = run([*files, "--prompt-ids", "1,2", "--steps", "3", "--eager", "--capacity", "64"], capsys)
    assert rc == 0, err
    assert not driver.loaded[0].graphs and "captured" not in err and "(eager)" in err


def test_prompt_text_uses_the_shipped_tokenizer(files, driver, capsys):
    rc, out, err = run([*files, "--prompt", "The capital of France is", "--steps", "4", "-q", "--capacity", "64"], capsys)
    assert rc == 0, err
    assert out.startswith("The capital of France is")
    assert "fake runtime" not in err  # --quiet


def test_chunk_above_the_manifest_max_is_clamped_with_a_note(files, driver, capsys):
    ids = ",".join(str(i) for i in range(300))
    rc, out, err = run([*files, "--prompt-ids", ids, "--steps", "2", "--chunk", "1000", "--capacity", "5000"], capsys)
    assert rc == 0, err
    assert "note: --chunk 1000 is more than the manifest's `tokens` max; using 256" in err
    assert "note: --capacity 5000 is more than this manifest addresses; using 1024" in err
    assert [r[2] for r in driver.loaded[0].runs() if r[0] == "prefill"] == [256, 256, 43]
    assert "graph: prefill (tokens=256) captured" in err


def test_prompt_longer_than_capacity_is_one_line_before_loading(files, driver, capsys):
    ids = ",".join(["1"] * 60)
    rc, out, err = run([*files, "--prompt-ids", ids, "--steps", "10", "--capacity", "64"], capsys)
    assert rc == 1
    assert "prompt (60 tokens) + steps (10) = 70 tokens exceeds the capacity of 64 tokens" in one_error_line(err)
    assert driver.loaded == []


def test_token_ids_outside_the_vocabulary_are_refused_before_loading(files, driver, capsys):
    rc, out, err = run([*files, "--prompt-ids", "1,151936"], capsys)
    assert rc == 1
    assert one_error_line(err).endswith("prompt token id 151936 is out of range for this model's vocabulary (0..151935)")
    assert driver.loaded == []


@pytest.mark.parametrize("flag", ["--manifest", "--kernels", "--weights"])
def test_missing_files(files, driver, capsys, flag, tmp_path):
    argv = list(files)
    argv[argv.index(flag) + 1] = str(tmp_path / "missing")
    rc, out, err = run([*argv, "--prompt-ids", "1"], capsys)
    assert rc == 1
    assert one_error_line(err).startswith(f"kern-run: error: {flag}: ")
    assert "not found" in err


def test_missing_tokenizer(files, driver, capsys, tmp_path):
    rc, out, err = run([*files, "--prompt", "hi", "--tokenizer", str(tmp_path / "t.json")], capsys)
    assert rc == 1 and "tokenizer not found" in one_error_line(err)


def test_not_a_qwen3_manifest(files, driver, capsys, tmp_path):
    m = tmp_path / "other.json"
    m.write_text(json.dumps({"vars": {}, "programs": {"main": {}}, "buffers": {}}))
    argv = list(files)
    argv[1] = str(m)
    rc, out, err = run([*argv, "--prompt-ids", "1"], capsys)
    assert rc == 1 and "not a Qwen3 caller manifest: needs programs `prefill` and `decode`" in one_error_line(err)


def test_driver_errors_are_one_line(files, driver, capsys):
    driver.fail = "no CUDA device: cuInit failed (CUDA_ERROR_NO_DEVICE)"
    rc, out, err = run([*files, "--prompt-ids", "1,2,3"], capsys)
    assert rc == 1
    assert one_error_line(err) == "kern-run: error: no CUDA device: cuInit failed (CUDA_ERROR_NO_DEVICE)"


def test_driver_not_importable(files, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "kern_driver", None)
    rc, out, err = run([*files, "--prompt-ids", "1,2,3"], capsys)
    assert rc == 1 and "kern-driver cannot be imported" in one_error_line(err)


@pytest.mark.parametrize("args,msg", [
    (["--prompt-ids", "1,x"], "--prompt-ids must be integers"),
    (["--prompt-ids", ","], "--prompt-ids is empty"),
    (["--prompt-ids", "1", "--steps", "0"], "--steps must be >= 1"),
    (["--prompt-ids", "1", "--chunk", "0"], "--chunk must be >= 1"),
    (["--prompt-ids", "1", "--stop-at-eos"], "--stop-at-eos needs a tokenizer"),
    (["--prompt", ""], "the prompt is empty"),
])
def test_argument_errors(files, driver, capsys, args, msg):
    rc, out, err = run([*files, *args], capsys)
    assert rc == 1 and msg in one_error_line(err)


def test_prompt_and_prompt_ids_are_exclusive(files, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*files, "--prompt", "a", "--prompt-ids", "1"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_weights_repeated_loads_every_file(files, driver, capsys, tmp_path):
    """--weights twice: both files reach Runtime.load, in order (a model's weights and the screened head's file);
    a missing second file is named."""
    screen = tmp_path / "lm_head_screen.safetensors"
    screen.write_bytes(b"")
    rc, out, err = run([*files, "--weights", str(screen), "--prompt-ids", "1", "--steps", "2", "-q"], capsys)
    assert rc == 0, err
    w = files[files.index("--weights") + 1]
    assert [str(x) for x in driver.loaded[0].load_args[2]] == [w, str(screen)]
    rc, out, err = run([*files, "--weights", str(tmp_path / "nope.safetensors"), "--prompt-ids", "1"], capsys)
    assert rc == 1 and one_error_line(err) == f"kern-run: error: --weights: file not found: {tmp_path / 'nope.safetensors'}"
