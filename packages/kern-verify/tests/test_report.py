"""How diagnostics are reported: one cause gives one diagnostic (folded call sites, a
note at the declaration), root causes come first, and each points at the exact token."""

from __future__ import annotations

import json
import subprocess
import sys

from verify_helpers import FIXTURES, check, fixture, found, text_of
from kern_verify.cli import main
from kern_verify.render import human, summary


def calls(d, prog):
    return d["programs"][prog]["calls"]


def at(text: str, diag_or_note) -> str:
    """The text from the diagnostic's (or note's) line and column on."""
    return text.splitlines()[diag_or_note.line - 1][diag_or_note.column - 1:]


def test_wrong_buffer_dtype_is_one_diagnostic_at_the_first_use_with_a_note_at_the_declaration():
    d = fixture("carry")
    d["buffers"]["h"]["dtype"] = "f16"  # three prefill calls pass `h` where bf16 is expected
    text = text_of(d)
    (diag,) = check(d)
    assert (diag.code, diag.location) == ("E0052", "programs.prefill.calls[0].args[2]")  # path unchanged
    assert at(text, diag).startswith('"h"')  # the caret is on the `buf` value, not the `{`
    assert [x.location for x in diag.folded] == ["programs.prefill.calls[1].args[0]", "programs.prefill.calls[2].args[0]"]
    decl, more = sorted(diag.notes, key=lambda n: n.path is None)
    assert decl.location == "buffers.h.dtype" and at(text, decl).startswith('"f16"')
    assert more.message == "2 more call sites pass `h` where buffer<bf16> is expected: `kv` arg 0, `last` arg 0"
    assert "declare `h` with dtype bf16" in diag.hint
    out = human([diag], text, "m.json")
    assert "note: buffer `h` is declared f16 here\n  --> m.json: buffers.h.dtype (line " in out
    assert "  = note: 2 more call sites" in out
    assert summary([diag]) == "error: 1 error (2 more sites with the same cause folded into it)"
    js = diag.to_json()
    assert len(js["folded"]) == 2 and js["notes"][0]["location"] == "buffers.h.dtype"


def test_dtype_mismatch_of_one_call_keeps_the_plain_hint():
    d = fixture("carry")
    d["ops"]["take_last"]["params"][0] = "in buffer<f16>"
    d["ops"]["take_last"]["impl"]["launches"][0]["params"][0] = "in buffer<f16>"
    diags = [x for x in check(d) if x.code == "E0052"]
    (diag,) = diags
    assert not diag.folded and diag.hint == "pass a buffer<f16>; dtypes must match exactly"


def test_renamed_var_gives_one_diagnostic_per_rule_and_the_unused_declaration_last():
    d = fixture("carry")
    d["vars"]["ntokens"] = d["vars"].pop("tokens")
    diags = check(d)
    assert [x.code for x in diags] == ["E0015", "E0021", "E0054", "E0070"]
    assert sum(len(x.folded) for x in diags) > 0
    for x in diags[:3]:
        assert x.hint == "did you mean `ntokens`?"
    unused = diags[-1]
    assert unused.location == "vars.ntokens" and "the undeclared var `tokens`" in unused.notes[0].message


def test_misspelled_op_reports_the_unknown_op_before_the_unused_one():
    d = fixture("carry")
    calls(d, "prefill")[2]["op"] = "take_lst"
    diags = check(d)
    # no follow-on E0060/E0062: the unknown call may have written anything
    assert [(x.code, x.location) for x in diags] == [("E0050", "programs.prefill.calls[2].op"), ("E0074", "ops.take_last")]
    assert diags[0].hint == "did you mean `take_last`?"
    assert "call `last` (program `prefill`) names the undeclared op `take_lst`" in diags[1].notes[0].message


def test_errors_before_warnings():
    d = fixture("launch")
    del d["modules"]["vllm_layernorm"]["sha256"]  # E0019 warning, near the top
    d["vars"]["extra"] = {"max": 3}                # E0070 error, above it
    d["programs"]["decode"]["calls"][0]["args"][3] = {"var": "tokenz"}
    assert [x.code for x in check(d)] == ["E0054", "E0070", "E0019"]


def test_unknown_var_in_an_expression_points_at_the_name():
    d = fixture("launch")
    d["ops"]["rms_norm"]["impl"]["launches"][0]["grid"][0] = {"ceil_div": [{"mul": ["tokenz", 2]}, 4]}
    text = text_of(d)
    (diag,) = check(d)
    assert (diag.code, diag.location) == ("E0021", "ops.rms_norm.impl.launches[0].grid[0]")
    assert at(text, diag).startswith('"tokenz"')
    assert diag.hint == "did you mean `tokens`?"


def test_bad_divisor_points_at_the_divisor():
    d = fixture("scratch")
    d["ops"]["paged_attention"]["impl"]["launches"][1]["grid"][0] = {"ceil_div": ["tokens", 0]}
    text = text_of(d)
    (diag,) = check(d)
    assert diag.code == "E0021" and at(text, diag).startswith("0")


def run(capsys, *argv):
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_json_uses_the_manifest_field_names(capsys):
    rc, out, _ = run(capsys, FIXTURES / "carry.json", "--plan", "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["manifest"] == str(FIXTURES / "carry.json")
    b = doc["plan"]["buffers"][0]
    assert b["class"] == "input" and "class_" not in b
    assert doc["plan"]["total_bytes"] == doc["plan"]["arena_bytes"] + doc["plan"]["state_bytes"]


def test_capacity_must_be_positive_and_needs_plan(capsys):
    rc, out, err = run(capsys, FIXTURES / "carry.json", "--plan", "--capacity", "0")
    assert rc == 2 and out == "" and "--capacity must be at least 1" in err
    rc, out, err = run(capsys, FIXTURES / "carry.json", "--capacity", "100")
    assert rc == 2 and out == "" and "add --plan" in err


def test_kernels_dir_that_does_not_exist_is_one_error(capsys, tmp_path):
    rc, out, err = run(capsys, FIXTURES / "launch.json", "--kernels", tmp_path / "nope")
    assert rc == 2 and out == ""
    assert err.strip() == f"kern-verify: error: kernels directory {tmp_path / 'nope'} does not exist"


def test_output_into_a_closed_pipe_ends_without_a_traceback(tmp_path):
    d = fixture("launch")
    for i in range(2000):  # ~2000 distinct errors, far more than a pipe buffer holds
        d["vars"][f"v{i}"] = {"max": 3}
    p = tmp_path / "m.json"
    p.write_text(text_of(d))
    proc = subprocess.Popen([sys.executable, "-m", "kern_verify.cli", str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"error[E0070]")
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_readme_code_table_matches_the_registry():
    """Every code in the README's table exists with that severity and title, and vice versa."""
    import re
    from pathlib import Path

    from kern_verify import CODES

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    rows = {m[0]: (m[1], m[2].strip()) for m in re.findall(r"^\| `(E\d{4})` \| [^|]+ \| (\w+) \| ([^|]+) \|$", readme, re.M)}
    assert rows == {c.code: (c.severity, c.title) for c in CODES.values()}


def test_unknown_buffer_class_is_refused_with_a_suggestion():
    d = fixture("launch")
    d["buffers"]["x"]["class"] = "workspce"
    (diag,) = check(d)
    assert diag.code == "E0022" and "`workspce`" in diag.message and diag.hint == "did you mean `workspace`?"


def test_scratch_read_before_written_is_reported_once_per_scratch():
    """Both launches read `partial` before anything writes it (the writer declared `in`): one E0044, at the first."""
    d = fixture("scratch")
    d["ops"]["paged_attention"]["impl"]["launches"][0]["params"][3] = "in buffer<f32>"
    assert found(check(d)) == [("E0044", "ops.paged_attention.impl.launches[0].args[3]")]


def test_misspelled_scratch_is_one_error_not_also_a_read_before_write():
    """The writer names `partal`: E0043 with a suggestion, and no E0044 for the reader of `partial`."""
    d = fixture("scratch")
    d["ops"]["paged_attention"]["impl"]["launches"][0]["args"][3] = {"scratch": "partal"}
    (diag,) = check(d)
    assert (diag.code, diag.location) == ("E0043", "ops.paged_attention.impl.launches[0].args[3].scratch")
    assert diag.hint == "did you mean `partial`?"


def test_impl_writing_an_in_param_is_one_error_not_also_dataflow_follow_ons():
    """op `embed` declares its output `in` while the kernel writes it: E0037 only, not also
    E0060 at every later reader of `h` (the call's accesses are unknown)."""
    d = fixture("carry")
    d["ops"]["embed"]["params"][2] = "in buffer<bf16>"
    assert found(check(d)) == [("E0037", "ops.embed.impl.launches[0].args[2]")]


def test_var_too_wide_for_a_scalar_type_is_one_diagnostic_per_type():
    """`tokens` max 2^31 passed to two i32 params: one E0053 with a note naming the other site."""
    d = fixture("carry")
    d["vars"]["tokens"]["max"] = 2**31
    diags = [x for x in check(d) if x.code == "E0053" and x.location.endswith(".var")]
    (diag,) = diags
    assert diag.location == "programs.prefill.calls[0].args[3].var" and len(diag.folded) == 1
    assert "pass var `tokens` to i32 params: `kv` arg 3" in diag.notes[-1].message


def test_refused_var_bounds_are_one_error_not_also_their_consequences():
    """tokens max 2^63 (E0011): no E0016 sizes, E0053 ranges or E0033 grids computed from it."""
    d = fixture("carry")
    d["vars"]["tokens"]["max"] = 2**63
    assert found(check(d)) == [("E0011", "vars.tokens.max")]
    d = fixture("launch")
    d["vars"]["tokens"].update(min=3000, max=2048)
    assert found(check(d)) == [("E0011", "vars.tokens")]


def test_grids_zero_at_the_var_minima_fold_by_var():
    d = fixture("carry")
    d["vars"]["tokens"]["min"] = 0
    (diag,) = check(d)
    assert (diag.code, diag.location) == ("E0033", "ops.embed.impl.launches[0].grid[0]")
    assert "computed from `tokens`, is < 1 at the var minima: `fill_kv` launch 0" in diag.notes[-1].message
