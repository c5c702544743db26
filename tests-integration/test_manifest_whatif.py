"""CPU checks of tools/manifest_whatif.py (NOTES.md 45): the examples' decode programs without their attention verify
against the built kernels, with the attention's output carried and prefill untouched; drops that would leave the
manifest unloadable or unverifiable are refused by name; --module and --op-module load what-if builds of a module
(gemv.cu -DGEMV_NO_WAIT), --op-grid sets an op's grid for one (gemv.cu -DGEMV_PASSES=2 on the qkv, NOTES.md 54)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import manifest_whatif as mw  # noqa: E402
from manifest_variants import VariantError  # noqa: E402

EXAMPLES = {g: ROOT / "examples" / f"qwen3-{g}.json" for g in ("0.6b", "4b")}
SCREENED = "norm_lm_head_argmax_screened"  # the examples' lm_head (gen_qwen3's default); `dense_4b`: the dense form
#: what a refusal about the lm_head's ops adds on a screened manifest (manifest_variants.lm_head_note)
SCREENED_NOTE = (f"; this manifest has the screened lm_head (tools/gen_qwen3.py's default): one op `{SCREENED}` (short "
                 "name `lm_head`) of three launches, the screen and pick of lm_head_screen.cubin and argmax_reduce, in "
                 "place of the dense `gemv_norm_lm_head` + `argmax`: for those, pass a manifest of "
                 "`tools/gen_qwen3.py --lm-head dense`")
#: what-if builds of gemv.cu the tests load (file in the kernels dir: macros)
WHATIF_BUILDS = {"gemv_nowait.cubin": ("GEMV_NO_WAIT",), "gemv_p2.cubin": ("GEMV_PASSES=2",)}


@pytest.fixture(scope="module")
def whatif_cubins(tmp_path_factory) -> dict[str, bytes]:
    """{file: cubin bytes} of WHATIF_BUILDS, nvcc runs started together."""
    import build_kernels as bk

    tmp = tmp_path_factory.mktemp("whatif_builds")
    jobs = {f: bk.start_cuda("gemv.cu", str(tmp), macros, f) for f, macros in WHATIF_BUILDS.items()}
    return {f: bk.finish_cuda(job) for f, job in jobs.items()}


def _kernels_with(built_kernels: Path, cubins: dict[str, bytes], tmp_path: Path) -> Path:
    """A copy of the built kernels dir with the what-if cubins added."""
    import shutil

    k = tmp_path / "kernels"
    shutil.copytree(built_kernels, k)
    for f, data in cubins.items():
        (k / f).write_bytes(data)
    return k


@pytest.mark.parametrize("geometry", sorted(EXAMPLES))
def test_no_attention_verifies(built_kernels, geometry):
    from kern_verify.verify import verify_text

    m = json.loads(EXAMPLES[geometry].read_text())
    out, carried = mw.drop_ops(m, ["attn"])
    assert carried == ["attn"] and out["buffers"]["attn"]["class"] == "carry"
    assert m["buffers"]["attn"]["class"] == "workspace"  # the input manifest is not modified
    assert not [str(d) for d in verify_text(json.dumps(out), kernels_dir=built_kernels) if d.severity == "error"]
    before = m["programs"]["decode"]["calls"]
    after = out["programs"]["decode"]["calls"]
    assert len(before) - len(after) == {"0.6b": 28, "4b": 36}[geometry]  # one attention per layer
    assert after == [c for c in before if c["op"] != "attention_decode_rope"]
    assert "attention_decode_rope" not in out["ops"]  # pruned: no program calls it now
    assert out["programs"]["prefill"] == m["programs"]["prefill"]


def test_full_op_name_and_several_drops(built_kernels):
    from kern_verify.verify import verify_text

    m = json.loads(EXAMPLES["4b"].read_text())
    out, carried = mw.drop_ops(m, ["attention_decode_rope", "embedding"])
    assert carried == ["residual", "attn"]  # the embedding wrote layer 0's residual; now stale from the last step
    assert not [str(d) for d in verify_text(json.dumps(out), kernels_dir=built_kernels) if d.severity == "error"]
    assert {c["op"] for c in out["programs"]["decode"]["calls"]}.isdisjoint({"attention_decode_rope", "embedding"})


@pytest.mark.parametrize("drop,program,needle", [
    (["o"], "decode", "leaves 1 weight buffer(s) that only the dropped calls read (first: `model.layers.35.self_attn.o_proj"),
    (["gate_up"], "decode", "leaves 2 weight buffer(s)"),
    (["o"], "decode", "bound this op's work with --module"),
    (["gemm"], "decode", "program `decode` does not call it; prefill does (add --program prefill)"),
    # the screened lm_head reads the final norm's weight and the screen's two, which no other call reads
    (["lm_head"], "decode", "leaves 3 weight buffer(s) that only the dropped calls read (first: `model.norm.weight`)"),
    (["argmax"], "decode", "--drop argmax: program `decode` calls no op of that name (its ops: attention_decode_rope,"),
    (["argmax"], "decode", SCREENED_NOTE),  # ... the argmax is the screened op's, `argmax` a dense manifest's
    (["attention_prefill"], "prefill", "input buffer `cu_seqlens_q` would be used by no call"),  # layer 35's norm and gate_up: prefill ends at its KV
    (["foo"], "decode", "program `decode` calls no op of that name"),
    (["attn"], "nope", "--program nope: the manifest has no such program"),
    ([], "decode", "nothing to drop"),
])
def test_refusals(drop, program, needle):
    with pytest.raises(VariantError) as e:
        mw.drop_ops(json.loads(EXAMPLES["4b"].read_text()), drop, program)
    assert needle in str(e.value)
    if drop != ["argmax"]:
        assert SCREENED_NOTE not in str(e.value)


@pytest.mark.parametrize("drop,needle", [
    (["argmax"], "--drop argmax: output buffer `next_token` would be used by no call (the dropped op was its only "
                 "user): a program must still produce its outputs"),
    (["lm_head"], "leaves 1 weight buffer(s) that only the dropped calls read (first: `model.norm.weight`)"),
])
def test_refusals_on_the_dense_lm_head(dense_4b, drop, needle):
    """A `--lm-head dense` manifest: the argmax is `next_token`'s only writer, the lm_head GEMV the final norm's only
    reader (its head is the tied embedding, which the embedding reads too)."""
    with pytest.raises(VariantError) as e:
        mw.drop_ops(json.loads(dense_4b.read_text()), drop, "decode")
    assert needle in str(e.value) and SCREENED_NOTE not in str(e.value)


def test_command_line(built_kernels, dense_4b, tmp_path, capsys):
    out = tmp_path / "noattn.json"
    assert mw.main([str(EXAMPLES["4b"]), "--kernels", str(built_kernels), "--drop", "attn", "--out", str(out)]) == 0
    assert "now carried (stale contents): attn" in capsys.readouterr().out
    assert json.loads(out.read_text())["buffers"]["attn"]["class"] == "carry"
    # a dense manifest's argmax is next_token's only writer: refused, and nothing is written
    bad = tmp_path / "noargmax.json"
    assert mw.main([str(dense_4b), "--kernels", str(built_kernels), "--drop", "argmax", "--out", str(bad)]) == 1
    assert "output buffer `next_token`" in capsys.readouterr().err and not bad.exists()
    # the example's lm_head is screened: it has no op `argmax`, and says so
    assert mw.main([str(EXAMPLES["4b"]), "--kernels", str(built_kernels), "--drop", "argmax", "--out", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "--drop argmax: program `decode` calls no op of that name" in err and SCREENED_NOTE in err
    assert not bad.exists()
    # a repeated drop is one drop
    assert mw.main([str(EXAMPLES["4b"]), "--kernels", str(built_kernels), "--drop", "attn", "--drop", "attn",
                    "--out", str(out)]) == 0
    assert "calls of attn (timing" in capsys.readouterr().out
    assert mw.main([str(EXAMPLES["4b"]), "--kernels", str(built_kernels), "--drop", "o", "--out", str(bad)]) == 1
    assert "weights file would not load" in capsys.readouterr().err


def test_module_repointed(built_kernels, whatif_cubins, tmp_path, capsys, fma_4b):
    """--module gemv=FILE: the gemv module loaded from another cubin of the kernels dir (gemv.cu built with
    -DGEMV_NO_WAIT: the same entries and params, other bytes), pinned by its sha256; with --drop too; bad specs, a
    module the drop leaves unused and an unknown --program refused by name; nothing to change is a usage error."""
    import hashlib

    k = _kernels_with(built_kernels, whatif_cubins, tmp_path)
    data = whatif_cubins["gemv_nowait.cubin"]
    assert data != (k / "gemv.cubin").read_bytes()
    out = tmp_path / "w.json"
    assert mw.main([str(fma_4b), "--kernels", str(k), "--drop", "attn", "--module", "gemv=gemv_nowait.cubin",
                    "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["modules"]["gemv"] == {"source": "gemv_nowait.cubin", "sha256": hashlib.sha256(data).hexdigest()}
    assert m["buffers"]["attn"]["class"] == "carry"
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    for argv, needle in (
            (["--module", "gemv"], "expected NAME=FILE"), (["--module", "nope=gemv.cubin"], "no module `nope`"),
            (["--module", "gemv=missing.cubin"], "missing.cubin: not found"),
            (["--drop", "attn", "--module", "decode_attention_pdl=decode_attention_pdl.cubin"],
             "the drop leaves module `decode_attention_pdl` used by no launch"),
            (["--program", "nope", "--module", "gemv=gemv_nowait.cubin"], "--program nope: the manifest has no such")):
        assert mw.main([str(fma_4b), "--kernels", str(k), *argv, "--out", str(bad)]) == 1, argv
        assert needle in capsys.readouterr().err, argv
        assert not bad.exists()
    with pytest.raises(SystemExit) as e:
        mw.main([str(fma_4b), "--kernels", str(k), "--out", str(out)])
    assert e.value.code == 2 and "nothing to change" in capsys.readouterr().err


def test_drop_of_a_buffers_only_writer_is_refused():
    """Prefill's gemm calls are the only writers of buffers other calls read (e.g. `h`): dropping them would leave a
    carry nothing fills."""
    with pytest.raises(VariantError, match=r"--drop gemm: `prefill` would read buffer `\w+` that no call of any "
                                           r"program writes any more"):
        mw.drop_ops(json.loads(EXAMPLES["4b"].read_text()), ["gemm"], "prefill")


def test_inputs_refused_before_anything_is_written(built_kernels, tmp_path, capsys, fma_4b):
    """A manifest kern-verify refuses (no traceback), --out onto the manifest, a --kernels that is not a directory,
    abbreviated options, the same --module twice, and a --module cubin built for another architecture."""
    import shutil

    import build_kernels as bk

    m = json.loads(fma_4b.read_text())
    m["programs"]["decode"]["calls"][1]["op"] = "nosuchop"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(m))
    out = tmp_path / "w.json"
    assert mw.main([str(broken), "--kernels", str(built_kernels), "--drop", "attn", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "kern-verify refuses the manifest itself" in err and "nosuchop" in err and "Traceback" not in err
    for argv, needle in (
            ([str(broken), "--kernels", str(built_kernels), "--drop", "attn", "--out", str(broken)], "the manifest itself"),
            ([str(fma_4b), "--kernels", str(tmp_path / "none"), "--drop", "attn", "--out", str(out)],
             "not a directory (build one with tools/build_kernels.py"),
            ([str(fma_4b), "--kern", str(built_kernels), "--drop", "attn", "--out", str(out)], "required")):
        with pytest.raises(SystemExit) as e:
            mw.main(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err, argv
    assert not out.exists()
    k = tmp_path / "kernels"
    shutil.copytree(built_kernels, k)
    for argv, needle in (
            (["--module", "gemv=gemv.cubin", "--module", "gemv=gemv.cubin"], "module `gemv` is given twice"),
            (["--module", "gemv=missing.cubin"], "build it there, e.g. cd tools/kernels-src && nvcc")):
        assert mw.main([str(fma_4b), "--kernels", str(k), *argv, "--out", str(out)]) == 1
        assert needle in capsys.readouterr().err, argv
    subprocess.run([bk._nvcc(), "-cubin", "-arch=sm_80", "-O3", "-std=c++17", "-o", str(k / "embedding_sm80.cubin"),
                    "embedding.cu"], cwd=ROOT / "tools" / "kernels-src", check=True, capture_output=True)
    assert mw.main([str(fma_4b), "--kernels", str(k), "--module", "embedding=embedding_sm80.cubin",
                    "--out", str(out)]) == 1
    assert "built for sm_80, module `embedding` for sm_90 (rebuild it with -arch=sm_90)" in capsys.readouterr().err


def test_op_module_repoints_one_op(built_kernels, whatif_cubins, dense_fma_4b, fma_4b, tmp_path, capsys):
    """--op-module down=FILE: only the down-proj's launches load the what-if build (a new module `gemv__<op>`), the
    other GEMV ops keep `gemv`; several ops with a --drop; the result verifies; every GEMV op moved prunes `gemv` (four
    in the gemv.cu manifest, five in its dense form). Refused by name: a malformed spec, an op the program does
    not call, a built-in op, an op of two modules (the screened lm_head), an op given twice or also dropped, a missing
    file, a cubin for another architecture. On the 4B example with gemv.cu for every GEMV (conftest.py `fma_examples`:
    the example's GEMVs are on gemv_tc.cu, which gemv_nowait.cubin has no entry of)."""
    import hashlib

    import build_kernels as bk

    k = _kernels_with(built_kernels, whatif_cubins, tmp_path)
    data = whatif_cubins["gemv_nowait.cubin"]
    base = json.loads(fma_4b.read_text())
    out = tmp_path / "w.json"
    assert mw.main([str(fma_4b), "--kernels", str(k), "--op-module", "down=gemv_nowait.cubin",
                    "--out", str(out)]) == 0
    assert "op `gemv_residual_down_proj` now loads module `gemv__gemv_residual_down_proj`" in capsys.readouterr().out
    m = json.loads(out.read_text())
    pin = {"source": "gemv_nowait.cubin", "sha256": hashlib.sha256(data).hexdigest()}
    assert m["modules"]["gemv__gemv_residual_down_proj"] == pin and m["modules"]["gemv"] == base["modules"]["gemv"]
    for op, impl in m["ops"].items():
        mods = {ln.get("module") for ln in impl["impl"]["launches"]}
        want = {"gemv__gemv_residual_down_proj"} if op == "gemv_residual_down_proj" else \
            {ln.get("module") for ln in base["ops"][op]["impl"]["launches"]}
        assert mods == want, op
    # everything but the module names is the input manifest's
    for ln in m["ops"]["gemv_residual_down_proj"]["impl"]["launches"]:
        ln["module"] = "gemv"
    del m["modules"]["gemv__gemv_residual_down_proj"]
    assert m == base
    # two ops, with --drop: verifies (rewrite_main verifies before writing)
    assert mw.main([str(fma_4b), "--kernels", str(k), "--op-module", "o=gemv_nowait.cubin", "--op-module",
                    "gemv_norm_qkv=gemv_nowait.cubin", "--drop", "attn", "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert {"gemv__gemv_residual_o_proj", "gemv_p2__gemv_norm_qkv", "gemv"} <= set(m["modules"])
    # every gemv op repointed: the shared module is pruned (the example's lm_head is screened: not a gemv op)
    assert mw.main([str(fma_4b), "--kernels", str(k), *[a for op in ("qkv", "o", "gu", "down")
                    for a in ("--op-module", f"{op}=gemv_nowait.cubin")], "--out", str(out)]) == 0
    assert "gemv" not in json.loads(out.read_text())["modules"]
    # a dense manifest (`--lm-head dense --gemv gemv-fma`): its lm_head is a fifth gemv op beside qkv, o, gate_up
    # and down; with those four alone, `gemv` stays for it
    five = [a for op in ("qkv", "o", "gu", "down", "lm_head") for a in ("--op-module", f"{op}=gemv_nowait.cubin")]
    assert mw.main([str(dense_fma_4b), "--kernels", str(k), *five, "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert "gemv" not in m["modules"] and m["modules"]["gemv__gemv_norm_lm_head"] == pin
    assert mw.main([str(dense_fma_4b), "--kernels", str(k), *five[:-2], "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert {ln["module"] for ln in m["ops"]["gemv_norm_lm_head"]["impl"]["launches"]} == {"gemv"}
    capsys.readouterr()
    subprocess.run([bk._nvcc(), "-cubin", "-arch=sm_80", "-O3", "-std=c++17", "-o", str(k / "gemv_sm80.cubin"),
                    "embedding.cu"], check=True, cwd=ROOT / "tools" / "kernels-src")
    bad = tmp_path / "bad.json"
    for argv, needle in (
            (["--op-module", "down"], "--op-module down: expected OP=FILE"),
            (["--op-module", "gemm=gemv_nowait.cubin"], "--op-module gemm: program `decode` does not call it; "
                                                       "prefill does"),
            (["--op-module", "gemm=gemv_nowait.cubin", "--program", "prefill"], "no module (a built-in"),
            (["--op-module", "lm_head=gemv_nowait.cubin"],
             f"--op-module lm_head=gemv_nowait.cubin: op `{SCREENED}`'s launches use modules lm_head_screen, "
             "argmax_pdl; one cubin can stand for one module (build a what-if of each and use --module)" + SCREENED_NOTE),
            (["--op-module", "down=gemv_nowait.cubin", "--op-module", "gemv_residual_down_proj=gemv_nowait.cubin"],
             "op `gemv_residual_down_proj` is given twice"),
            (["--op-module", "attn=gemv_nowait.cubin", "--drop", "attn"], "--drop removes every `decode` call"),
            (["--op-module", "down=missing.cubin"], "missing.cubin: not found"),
            (["--op-module", "down=gemv_sm80.cubin"], "built for sm_80, module `gemv` for sm_90")):
        assert mw.main([str(fma_4b), "--kernels", str(k), *argv, "--out", str(bad)]) == 1, argv
        assert needle in capsys.readouterr().err, argv
        assert not bad.exists()


def test_module_left_unused_by_op_module_is_refused(tmp_path, monkeypatch, capsys, fma_4b):
    """--module gemv=FILE with every gemv op moved by --op-module (qkv, o, gate_up, down: the example's lm_head is
    screened): the pruned `gemv` made --module a no-op that the summary still named; now refused as the drop's case
    was (no built kernels: verification is stubbed, the cubin is one small nvcc build)."""
    import build_kernels as bk
    import manifest_variants

    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    k = tmp_path / "kernels"
    k.mkdir()
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-o", str(k / "x.cubin"), "embedding.cu"],
                   check=True, cwd=ROOT / "tools" / "kernels-src")
    monkeypatch.setattr(mw, "verify", lambda m, kernels, *a: [])
    monkeypatch.setattr(manifest_variants, "verify", lambda m, kernels, *a: [])
    out = tmp_path / "w.json"
    ops = [a for op in ("qkv", "o", "gu", "down") for a in ("--op-module", f"{op}=x.cubin")]
    assert mw.main([str(fma_4b), "--kernels", str(k), "--module", "gemv=x.cubin", *ops, "--out", str(out)]) == 1
    assert "--module gemv=x.cubin: --op-module leaves module `gemv` used by no launch" in capsys.readouterr().err
    assert not out.exists()
    assert mw.main([str(fma_4b), "--kernels", str(k), "--module", "gemv=x.cubin", *ops[:2],
                    "--out", str(out)]) == 0


def test_op_grid_with_the_passes_module(built_kernels, whatif_cubins, dense_fma_4b, tmp_path, capsys, fma_4b):
    """NOTES.md 54's kind of what-if: --op-module lm_head=gemv_p2.cubin --op-grid lm_head=4748 (gemv.cu -DGEMV_PASSES=2:
    32 rows per block, so the 4B lm_head's n = 151,936 takes 4,748 blocks; 4B's qkv is on the row-pass module already,
    gemv_p2, since session 18) on a `--lm-head dense` manifest: only the lm_head launch's module and grid change, and
    the result verifies against the kernels (rewrite_main verifies before writing); with several ops, all three axes
    and --drop too, on the example. A grid kern-verify refuses (a cluster kernel's grid.y off its cluster shape, grid.z
    over CUDA's limit) is refused as the result, and nothing is written; so is the grid of an op of several launches
    (a dense argmax, the example's screened lm_head)."""
    import hashlib

    k = _kernels_with(built_kernels, whatif_cubins, tmp_path)
    base = json.loads(dense_fma_4b.read_text())
    out = tmp_path / "p2.json"
    assert mw.main([str(dense_fma_4b), "--kernels", str(k), "--op-module", "lm_head=gemv_p2.cubin",
                    "--op-grid", "lm_head=4748", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "op `gemv_norm_lm_head` now launches grid [4748, 1, 1] (was [9496, 1, 1])" in printed
    assert "op grid lm_head=4748" in printed
    m = json.loads(out.read_text())
    launch = m["ops"]["gemv_norm_lm_head"]["impl"]["launches"][0]
    assert launch["grid"] == [4748, 1, 1] and launch["module"] == "gemv__gemv_norm_lm_head"
    assert launch["args"][-1] == {"i32": 1}  # ksplit 1, as the pass form needs
    assert m["modules"]["gemv__gemv_norm_lm_head"] == {
        "source": "gemv_p2.cubin", "sha256": hashlib.sha256(whatif_cubins["gemv_p2.cubin"]).hexdigest()}
    # everything but the lm_head launch's module and grid is the input manifest's
    launch["grid"], launch["module"] = [9496, 1, 1], "gemv"
    del m["modules"]["gemv__gemv_norm_lm_head"]
    assert m == base
    # the grid alone, two ops (one with all three axes), and a drop
    base = json.loads(fma_4b.read_text())
    assert mw.main([str(fma_4b), "--kernels", str(k), "--op-grid", "o=160,1,1", "--op-grid",
                    "gemv_norm_qkv=192", "--drop", "attn", "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["ops"]["gemv_residual_o_proj"]["impl"]["launches"][0]["grid"] == [160, 1, 1]
    assert m["ops"]["gemv_norm_qkv"] == base["ops"]["gemv_norm_qkv"] and "attention_decode_rope" not in m["ops"]
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    for argv, needle in (
            (["--op-grid", "attn=8,4"], "E0089"),  # the decode attention's clusters are 8 CTAs along y
            (["--op-grid", "qkv=192,1,70000"], "E0033"),
            (["--op-grid", "attn=8,8", "--drop", "attn"],
             "--op-grid attn=8,8: --drop removes every `decode` call of `attention_decode_rope`"),
            (["--op-grid", "qkv=0"], "--op-grid qkv=0: grid x 0: every grid axis must be a positive integer"),
            (["--op-grid", "lm_head=4748"], f"op `{SCREENED}` has 3 launches; --op-grid sets the grid of an op's one "
                                            "launch" + SCREENED_NOTE),
            (["--op-grid", "argmax=1", dense_fma_4b], "op `argmax` has 2 launches")):
        manifest = argv.pop() if isinstance(argv[-1], Path) else EXAMPLES["4b"]
        assert mw.main([str(manifest), "--kernels", str(k), *argv, "--out", str(bad)]) == 1, argv
        err = capsys.readouterr().err
        assert needle in err, (argv, err)
        assert not bad.exists()


@pytest.mark.parametrize("specs,program,needle", [
    (["qkv"], "decode", "--op-grid qkv: expected OP=GX[,GY,GZ]"),
    (["qkv="], "decode", "--op-grid qkv=: expected OP=GX[,GY,GZ]"),
    (["=192"], "decode", "--op-grid =192: expected OP=GX[,GY,GZ]"),
    (["qkv=abc"], "decode", "--op-grid qkv=abc: expected OP=GX[,GY,GZ] (one to three integers"),
    (["qkv=1.5"], "decode", "one to three integers"),
    (["qkv=1,,2"], "decode", "one to three integers"),
    (["qkv=1,2,3,4"], "decode", "one to three integers"),
    (["qkv=0"], "decode", "grid x 0: every grid axis must be a positive integer"),
    (["qkv=192,-1"], "decode", "--op-grid qkv=192,-1: grid y -1: every grid axis must be a positive integer"),
    (["qkv=-2,1,0"], "decode", "grid x -2, z 0"),
    (["lm_head=4748"], "decode", f"--op-grid lm_head=4748: op `{SCREENED}` has 3 launches; --op-grid sets the grid of "
                                 "an op's one launch" + SCREENED_NOTE),
    (["argmax=75"], "decode", "--op-grid argmax: program `decode` calls no op of that name (its ops: "),
    (["argmax=75"], "decode", SCREENED_NOTE),
    (["argmax=75"], "dense", "--op-grid argmax=75: op `argmax` has 2 launches; --op-grid sets the grid of an "
                             "op's one launch"),
    (["gemm=4"], "decode", "--op-grid gemm: program `decode` does not call it; prefill does"),
    (["gemm=4"], "prefill", "--op-grid gemm=4: op `gemm`'s launch has no grid (a built-in"),
    (["nope=4"], "decode", "--op-grid nope: program `decode` calls no op of that name"),
    (["qkv=192", "gemv_norm_qkv=96"], "decode", "--op-grid gemv_norm_qkv=96: op `gemv_norm_qkv` is given twice"),
])
def test_op_grid_refusals(specs, program, needle, request):
    """On the 4B example; program `dense`: decode of its `--lm-head dense` form (conftest.py's dense_4b)."""
    path = request.getfixturevalue("dense_4b") if program == "dense" else EXAMPLES["4b"]
    with pytest.raises(VariantError) as e:
        mw.set_op_grids(json.loads(path.read_text()), specs, "decode" if program == "dense" else program)
    assert needle in str(e.value)
    if program == "dense" or not specs[0].startswith(("lm_head", "argmax")):
        assert SCREENED_NOTE not in str(e.value)


def test_op_grid_notes_other_programs():
    """An op both programs call (the embedding) changes in both: the note says so; the input is not modified."""
    m = json.loads(EXAMPLES["4b"].read_text())
    out, notes = mw.set_op_grids(m, ["embedding=4,2"])
    assert out["ops"]["embedding"]["impl"]["launches"][0]["grid"] == [4, 2, 1]
    assert m["ops"]["embedding"]["impl"]["launches"][0]["grid"] == ["tokens", 1, 1]
    assert notes == ["op `embedding` now launches grid [4, 2, 1] (was [\"tokens\", 1, 1]); it changes in prefill too"]
