"""Text entry points, the CLI (human and JSON output, exit codes, --explain, --plan)."""

from __future__ import annotations

import json

import pytest

from verify_helpers import FIXTURES, fixture, found, text_of
from kern_verify import CODES, explain, verify_path, verify_text
from kern_verify.cli import main


def test_not_json():
    (d,) = verify_text('{"schema_version": 4,}')
    assert d.code == "E0001" and d.line == 1 and d.column is not None


def test_not_utf8():
    (d,) = verify_text(b'{"model": "\xff"}')
    assert d.code == "E0001" and "UTF-8" in d.message


def test_duplicate_names_all_reported():
    text = text_of(fixture("launch")).replace(
        '"residual": {', '"x": {"dtype": "bf16", "shape": [1], "class": "output"},\n  "residual": {', 1)
    text = text.replace('"tokens": {', '"tokens": {"max": 8}, "tokens": {', 1)
    diags = verify_text(text)
    assert found(diags) == [("E0002", "buffers.x"), ("E0002", "vars.tokens")]
    assert all(d.line is not None for d in diags)


def test_all_decode_issues_at_once():
    d = fixture("carry")
    d["vars"]["tokens"]["maximum"] = 3
    del d["buffers"]["h"]["dtype"]
    d["states"]["kv"]["bytes_per_token"] = "4096"
    assert [x.code for x in verify_text(text_of(d))] == ["E0004", "E0005", "E0003"]


def test_verify_path(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(text_of(fixture("gemm")))
    assert verify_path(p) == []
    with pytest.raises(OSError):
        verify_path(tmp_path / "missing.json")


def run(capsys, *argv):
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_clean(capsys):
    code, out, _ = run(capsys, FIXTURES / "carry.json")
    assert code == 0
    assert out.strip() == "ok: manifest verified (4 ops, 4 calls)"


def test_cli_errors_human(capsys, tmp_path):
    d = fixture("scratch")
    d["programs"]["decode"]["calls"][0]["args"][0]["offset"] = 3
    d["vars"]["extra"] = {"max": 3}
    p = tmp_path / "bad.json"
    p.write_text(text_of(d))
    code, out, _ = run(capsys, p)
    assert code == 1
    lines = out.splitlines()
    assert lines[-1] == "error: 2 errors"
    i = lines.index(next(x for x in lines if x.startswith("error[E0055]")))
    assert "call `l3.attn` arg 0" in lines[i]
    assert lines[i + 1].startswith(f"  --> {p}: programs.decode.calls[0].args[0].offset (line ")
    src, caret = lines[i + 3], lines[i + 4]
    assert '"offset": 3' in src
    # the caret sits under the value
    assert src[caret.index("^")] == "3"
    assert lines[i + 5].startswith("  = hint: ")


def test_cli_warning_only_exits_zero(capsys, tmp_path):
    d = fixture("launch")
    del d["modules"]["vllm_layernorm"]["sha256"]
    p = tmp_path / "w.json"
    p.write_text(text_of(d))
    code, out, _ = run(capsys, p)
    assert code == 0
    assert "warning[E0019]" in out and out.strip().endswith("ok: manifest verified (1 ops, 1 calls), 1 warning")


def test_cli_json(capsys, tmp_path):
    d = fixture("gemm")
    d["programs"]["decode"]["calls"][0]["args"][4] = {"i32": 2**31}
    p = tmp_path / "bad.json"
    p.write_text(text_of(d))
    code, out, _ = run(capsys, p, "--format", "json")
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["errors"] == 1 and doc["warnings"] == 0
    (diag,) = doc["diagnostics"]
    assert diag["code"] == "E0053"
    assert diag["location"] == "programs.decode.calls[0].args[4].i32"
    assert diag["path"] == ["programs", "decode", "calls", 0, "args", 4, "i32"]
    assert isinstance(diag["line"], int) and diag["hint"]


def test_cli_unreadable_and_not_json(capsys, tmp_path):
    code, _, err = run(capsys, tmp_path / "nope.json")
    assert code == 2 and "cannot read" in err
    p = tmp_path / "bad.json"
    p.write_text("{ not json")
    code, out, _ = run(capsys, p)
    assert code == 2 and "error[E0001]" in out


def test_cli_decode_errors_exit_1(capsys, tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"schema_version": 4}')
    code, out, _ = run(capsys, p)
    assert code == 1 and "E0003" in out


def test_cli_integer_of_thousands_of_digits_is_a_value_error_not_bad_json(capsys, tmp_path):
    d = fixture("launch")
    d["vars"]["tokens"]["max"] = 7
    p = tmp_path / "m.json"
    p.write_text(text_of(d).replace('"max": 7', '"max": ' + "9" * 5000))
    code, out, _ = run(capsys, p)
    assert code == 1 and "error[E0005]" in out and "vars.tokens.max" in out
    assert "set_int_max_str_digits" not in out


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_explains(code, capsys):
    rc, out, _ = run(capsys, "--explain", code)
    assert rc == 0
    c = CODES[code]
    assert out.startswith(f"{code}: {c.title}")
    assert c.description in out and "Example:" in out and c.example in out
    assert len(c.description) > 40


def test_explain_unknown_and_list(capsys):
    rc, _, err = run(capsys, "--explain", "E9999")
    assert rc == 2 and "unknown code" in err
    rc, out, _ = run(capsys, "--explain", "list")
    assert rc == 0 and len(out.splitlines()) == len(CODES)
    assert explain("e0053").startswith("E0053")


def test_cli_plan(capsys):
    rc, out, _ = run(capsys, FIXTURES / "scratch.json", "--plan", "--capacity", "1000")
    assert rc == 0
    assert "memory plan" in out and "paged_attention" in out and "kv" in out
    assert "140.62 MiB" in out  # 147456 B/token x 1000 tokens


def test_cli_kernels_missing_dir(capsys, tmp_path):
    rc, out, _ = run(capsys, FIXTURES / "launch.json", "--kernels", tmp_path)
    assert rc == 1 and "E0080" in out


def test_cli_plan_json(capsys):
    rc, out, _ = run(capsys, FIXTURES / "carry.json", "--plan", "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["ok"] is True and doc["plan"]["capacity_tokens"] == 512
    names = [b["name"] for b in doc["plan"]["buffers"]]
    assert names[0] == "token_ids" and doc["plan"]["buffers"][0]["nbytes"] == 512 * 8
