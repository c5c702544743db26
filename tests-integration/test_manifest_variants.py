"""tools/manifest_variants.py and tools/gpu/program_sweep.py --dry-run on the committed 4B example and the real
kernel build (`built_kernels`, conftest.py): no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import manifest_variants as mv  # noqa: E402
import program_sweep  # noqa: E402

EXAMPLE = ROOT / "examples" / "qwen3-4b.json"


@pytest.fixture(scope="module")
def base(fma_4b: Path) -> dict:
    """The 4B example with gemv.cu for every decode GEMV (conftest.py `fma_examples`: its o at ksplit 2, the ksplit
    and entry changes below are gemv.cu's); the example itself, with every decode GEMV on gemv_tc.cu: `example`."""
    return json.loads(fma_4b.read_text())


@pytest.fixture(scope="module")
def example() -> dict:
    return json.loads(EXAMPLE.read_text())


def test_tensor_core_launches(example, index, built_kernels):
    """The example's GEMVs on gemv_tc.cu: ksplit 1 is all they take (another is refused, naming the way back to
    gemv.cu's), `entry=` moves between the module's entries (U = 4 and `_u5`), not to gemv.cu's."""
    assert launch(example, "gemv_residual_o_proj")["entry"] == "kern_gemvtc_residual_m1"
    with pytest.raises(mv.VariantError) as e:
        mv.apply(example, "o.ksplit=2", index)
    assert ("`o.ksplit=2`: `kern_gemvtc_residual_m1` (op `gemv_residual_o_proj`) is gemv_tc.cu's tensor-core form, one "
            "16-row tile per block with its 8 warps splitting k: it takes ksplit 1 only (another traps); for gemv.cu's "
            "ksplit, generate the manifest with `tools/gen_qwen3.py --gemv gemv-fma`") == str(e.value)
    m = mv.apply(example, "down.entry=kern_gemvtc_residual_m1_u5", index)
    assert launch(m, "gemv_residual_down_proj")["entry"] == "kern_gemvtc_residual_m1_u5"
    assert launch(m, "gemv_residual_down_proj")["grid"] == [160, 1, 1] and mv.verify(m, built_kernels) == []
    with pytest.raises(mv.VariantError, match="no entry `kern_gemv_residual_m1` in module gemv_tc.cubin"):
        mv.apply(example, "o.entry=kern_gemv_residual_m1", index)


@pytest.fixture(scope="module")
def index(built_kernels: Path) -> dict:
    return mv.load_index(built_kernels)


def launch(m: dict, op: str) -> dict:
    return m["ops"][op]["impl"]["launches"][0]


def test_ksplit_sets_the_literal_and_the_grid(base, index, built_kernels):
    assert launch(base, "gemv_residual_o_proj")["grid"] == [320, 1, 1]  # the example: o at ksplit 2
    m = mv.apply(base, "o.ksplit=1+down.ksplit=4", index)
    o, down = launch(m, "gemv_residual_o_proj"), launch(m, "gemv_residual_down_proj")
    assert (o["grid"], o["args"][-1]) == ([160, 1, 1], {"i32": 1})
    assert (down["grid"], down["args"][-1]) == ([640, 1, 1], {"i32": 4})  # 2560 rows, 4 per block
    gu = mv.apply(base, "gate_up.ksplit=2", index)
    assert launch(gu, "gemv_norm_silu_gate_up")["grid"] == [9728 // 4, 1, 1]  # one column per 2-warp group
    assert mv.verify(m, built_kernels) == [] and mv.verify(gu, built_kernels) == []
    assert launch(base, "gemv_residual_o_proj")["grid"] == [320, 1, 1]  # the input is not changed


def test_tc_moves_a_launch_between_gemv_cu_and_gemv_tc_cu(example, base, index, built_kernels):
    """`OP.tc=1` puts a gemv.cu launch (module gemv, or gemv_p2's row-pass qkv) on gemv_tc.cu's twin entry (`_u5` and
    the batched prologue mapped as gemv_plan.gemv_tc_entry does) at ksplit 1 with that entry's grid and shared memory,
    declaring the module where the manifest lacks it and dropping the one left unused; `OP.tc=0` goes back to gemv.cu's
    plain twin at ksplit 1. The results verify against the kernels; bad values and launches are refused, named."""
    m = mv.apply(base, "qkv.tc=1+gu.tc=1+o.tc=1+down.tc=1", index)
    got = {op: (launch(m, op)["module"], launch(m, op)["entry"], launch(m, op)["grid"], launch(m, op).get("shared_mem"),
                launch(m, op)["args"][-1]) for op in ("gemv_norm_qkv", "gemv_norm_silu_gate_up",
                                                      "gemv_residual_o_proj", "gemv_residual_down_proj")}
    assert got == {"gemv_norm_qkv": ("gemv_tc", "kern_gemvtc_norm_m1", [384, 1, 1], 5120, {"i32": 1}),
                   "gemv_norm_silu_gate_up": ("gemv_tc", "kern_gemvtc_norm_silu_m1_u5", [1216, 1, 1], 5120, {"i32": 1}),
                   "gemv_residual_o_proj": ("gemv_tc", "kern_gemvtc_residual_m1", [160, 1, 1], None, {"i32": 1}),
                   "gemv_residual_down_proj": ("gemv_tc", "kern_gemvtc_residual_m1", [160, 1, 1], None, {"i32": 1})}
    assert "gemv_p2" not in m["modules"] and mv.verify(m, built_kernels) == []
    assert {op: launch(m, op) for op in got} == {op: launch(example, op) for op in got}  # the generator's choice
    back = mv.apply(example, "qkv.tc=0+o.tc=0", index)
    assert (launch(back, "gemv_norm_qkv")["module"], launch(back, "gemv_norm_qkv")["entry"],
            launch(back, "gemv_norm_qkv")["grid"]) == ("gemv", "kern_gemv_norm_m1", [384, 1, 1])
    assert (launch(back, "gemv_residual_o_proj")["entry"], launch(back, "gemv_residual_o_proj")["grid"]) == (
        "kern_gemv_residual_m1", [160, 1, 1]) and mv.verify(back, built_kernels) == []
    for spec, needle in (("o.tc=1", "op `gemv_residual_o_proj` already launches `kern_gemvtc_residual_m1` (gemv_tc.cu's "
                                    "tensor-core form)"),
                         ("o.tc=2", "tc is 1 (gemv_tc.cu's tensor-core entry) or 0 (gemv.cu's)"),
                         ("attn.tc=1", "launches `decode_attention_rope_cluster`, not a gemv.cu or gemv_tc.cu entry")):
        with pytest.raises(mv.VariantError, match=__import__("re").escape(needle)):
            mv.apply(example, spec, index)
    assert launch(example, "gemv_residual_o_proj")["module"] == "gemv_tc"  # the input is not changed
    # a gemv_persist.cu launch is neither form: refused with what it is
    persistent = json.loads(json.dumps(base))
    launch(persistent, "gemv_residual_o_proj")["entry"] = "kern_gemvp_residual_m1"
    for v in ("1", "0"):
        with pytest.raises(mv.VariantError, match=r"`o.tc=%s`: op `gemv_residual_o_proj` launches "
                                                  r"`kern_gemvp_residual_m1`, not a gemv.cu or gemv_tc.cu entry "
                                                  r"\(gemv_persist.cu's" % v):
            mv.apply(persistent, f"o.tc={v}", index)
    # tc=1 takes the generator's unroll, not the gemv.cu entry's: o at `_u5` goes to U = 4 (k = 4,096)
    o5 = mv.apply(base, "o.entry=kern_gemv_residual_m1_u5+o.tc=1", index)
    assert launch(o5, "gemv_residual_o_proj")["entry"] == "kern_gemvtc_residual_m1"


def test_known_launch_twin_of_a_tensor_core_launch(example, capsys):
    """The experiment rewrites' twin of a gemv_tc.cu launch (known_launch / plain_twin): a copy on gemv.cu's entry and
    module with the launch's own grid and args (gemv.cu's valid ksplit-1 launch), the input untouched, and one note
    naming the fair control; a refusal that lists gemv.cu entries says their tensor-core forms are known too."""
    mv._NOTED.clear()
    ln = launch(example, "gemv_residual_o_proj")
    twin = mv.known_launch(example, "gemv_residual_o_proj", ("kern_gemv_residual_m1",))
    assert twin == {**ln, "entry": "kern_gemv_residual_m1", "module": "gemv"} and ln["module"] == "gemv_tc"
    assert mv.twin_entry("kern_gemvtc_norm_silu_m1_u5") == "kern_gemv_norm_silu_m1_u5"
    assert mv.twin_entry("kern_gemv_norm_m1_nb2") == "kern_gemv_norm_m1" and mv.twin_entry("embedding") == "embedding"
    mv.known_launch(example, "gemv_residual_o_proj", ("kern_gemv_residual_m1",))
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and ("time it against a manifest of `tools/gen_qwen3.py --gemv gemv-fma` with the "
                                        "variant `gemv_residual_o_proj.ksplit=1`") in err
    with pytest.raises(mv.VariantError) as e:
        mv.known_launch(example, "gemv_residual_o_proj", ("kern_gemv_m1",))
    assert str(e.value).endswith("this rewrite knows kern_gemv_m1 (or gemv_tc.cu's `kern_gemvtc` forms of them)")
    with pytest.raises(mv.VariantError) as e:
        mv.known_launch(example, "embedding", ("argmax",))
    assert str(e.value).endswith("this rewrite knows argmax")


@pytest.fixture(scope="module")
def dense(dense_4b: Path) -> dict:
    """The 4B example's `--lm-head dense` form (conftest.py): the dense lm_head GEMV and the two-launch argmax."""
    return json.loads(dense_4b.read_text())


def test_entry_follows_the_index_shared_memory_and_pdl_flag(dense, index, built_kernels):
    """On the dense lm_head's manifest: its GEMV, `_u5` before the argmax, goes back to the 4-step entry; gate_up from
    its `_u5` entry to the 4-step one (gemv_tc.cu's, whose entries differ in their UNROLL only)."""
    m = mv.apply(dense, "gu.entry=kern_gemvtc_norm_silu_m1+attn.pdl=0+lm_head.entry=kern_gemvtc_norm_m1", index)
    assert launch(m, "gemv_norm_silu_gate_up")["entry"] == "kern_gemvtc_norm_silu_m1"
    assert launch(m, "gemv_norm_silu_gate_up")["shared_mem"] == 2 * 2560  # x in shared memory, as before
    assert launch(dense, "gemv_norm_lm_head")["entry"] == "kern_gemvtc_norm_m1_u5"
    assert launch(m, "gemv_norm_lm_head")["entry"] == "kern_gemvtc_norm_m1"
    assert "pdl" not in launch(m, "attention_decode_rope") and launch(dense, "attention_decode_rope")["pdl"] is True
    assert launch(mv.apply(m, "attn.pdl=1", index), "attention_decode_rope")["pdl"] is True
    assert mv.verify(m, built_kernels) == []


def test_lm_head_is_the_screened_op_in_the_default_manifest(base, dense, index, built_kernels):
    """The example's lm_head is screened (gen_qwen3's default): `lm_head` names its one op, whose first launch (the
    screen) a change reaches, its pick and reduce keep their flags; a dense manifest's `lm_head` stays its GEMV.
    `argmax`, the GEMV's options and the dense op's full name are refused on the screened op with what it is and the
    way to a dense manifest."""
    op = mv.SCREENED_LM_HEAD
    assert op in base["ops"] and "gemv_norm_lm_head" not in base["ops"] and "argmax" not in base["ops"]
    m = mv.apply(base, "lm_head.pdl=0", index)
    screen, pick, reduce = m["ops"][op]["impl"]["launches"]
    assert screen["entry"] == "kern_lmhead_screen_m1_p18" and "pdl" not in screen
    assert [pick, reduce] == base["ops"][op]["impl"]["launches"][1:] and pick["pdl"] is reduce["pdl"] is True
    assert {k: o for k, o in m["ops"].items() if k != op} == {k: o for k, o in base["ops"].items() if k != op}
    assert mv.verify(m, built_kernels) == []
    assert launch(mv.apply(m, "lm_head.pdl=1", index), op) == launch(base, op)
    assert mv.apply(dense, "lm_head.pdl=0", index)["ops"]["gemv_norm_lm_head"]["impl"]["launches"][0].get("pdl") is None
    note = (f"this manifest has the screened lm_head (tools/gen_qwen3.py's default): one op `{op}` (short name "
            "`lm_head`) of three launches, the screen and pick of lm_head_screen.cubin and argmax_reduce, in place of "
            "the dense `gemv_norm_lm_head` + `argmax`: for those, pass a manifest of `tools/gen_qwen3.py --lm-head "
            "dense`")
    for spec, needle in (
            ("argmax.pdl=0", "`argmax.pdl=0`: no op `argmax` in the manifest (short names: qkv, o,"),
            ("gemv_norm_lm_head.pdl=0", "`gemv_norm_lm_head.pdl=0`: no op `gemv_norm_lm_head` in the manifest"),
            ("lm_head.ksplit=2", f"`lm_head.ksplit=2`: `kern_lmhead_screen_m1_p18` (op `{op}`) has no ksplit param"),
            ("lm_head.entry=kern_gemv_norm_m1", "the kernel index has no entry `kern_gemv_norm_m1` in module "
                                                "lm_head_screen.cubin (it has: kern_lmhead_pick_m1,")):
        with pytest.raises(mv.VariantError) as e:
            mv.apply(base, spec, index)
        assert needle in str(e.value) and str(e.value).endswith("; " + note), spec
    for spec in ("o.ksplit=3", "foo.pdl=0"):  # an error of another op says nothing of the lm_head
        with pytest.raises(mv.VariantError) as e:
            mv.apply(base, spec, index)
        assert note not in str(e.value), spec


def test_entry_takes_the_new_entrys_carveout_from_the_index(base, index, built_kernels):
    """`entry=` sets the launch's carveout to the new entry's (the default build gives one to the rope attention's PDL
    entry only, so an index with one on a GEMV entry stands in for a kernel author's) and removes it where the new
    entry has none; the other changes keep it."""
    assert launch(base, "attention_decode_rope")["carveout"] == 0  # the example, from its index entry
    assert "carveout" not in launch(base, "gemv_norm_silu_gate_up")
    idx = {key: dict(k) for key, k in index.items()}
    idx[("gemv.cubin", "kern_gemv_norm_silu_m1")]["carveout"] = 25
    m = mv.apply(base, "gu.entry=kern_gemv_norm_silu_m1", idx)
    assert launch(m, "gemv_norm_silu_gate_up")["carveout"] == 25
    assert "carveout" not in launch(mv.apply(m, "gu.entry=kern_gemv_norm_silu_m1_u5", idx), "gemv_norm_silu_gate_up")
    kept = mv.apply(base, "attn.pdl=0", index)
    assert launch(kept, "attention_decode_rope")["carveout"] == 0
    assert mv.verify(m, built_kernels) == [] and mv.verify(kept, built_kernels) == []


def test_carveout_sets_or_removes_the_launch_field(base, index, built_kernels):
    m = mv.apply(base, "attn.carveout=none+o.carveout=100", index)
    assert "carveout" not in launch(m, "attention_decode_rope")
    assert launch(m, "gemv_residual_o_proj")["carveout"] == 100
    assert launch(mv.apply(m, "attn.carveout=0", index), "attention_decode_rope")["carveout"] == 0
    assert mv.verify(m, built_kernels) == []
    assert launch(base, "attention_decode_rope")["carveout"] == 0  # the input is not changed


def test_ksplit_on_the_row_pass_entry(base, index, built_kernels):
    """4B's qkv runs on the row-pass module (gemv_p2.cubin, PASSES 2: 32 rows per block, ksplit 1 only): ksplit 1
    keeps its 192 blocks (not the default entry's 384), another ksplit (which the kernel traps on) is refused with the
    way to try one."""
    assert launch(base, "gemv_norm_qkv")["grid"] == [192, 1, 1]
    m = mv.apply(base, "qkv.ksplit=1", index)
    assert launch(m, "gemv_norm_qkv") == launch(base, "gemv_norm_qkv")
    for ks in (2, 4, 8):
        with pytest.raises(mv.VariantError) as e:
            mv.apply(base, f"qkv.ksplit={ks}", index)
        assert (f"`qkv.ksplit={ks}`: `kern_gemv_norm_m1_nb2` of module gemv_p2.cubin (op `gemv_norm_qkv`) is the row-pass "
                "form, 2 units of 16 rows per block (gemv.cu -DGEMV_PASSES=2): it takes ksplit 1 only") in str(e.value)
        assert "tools/manifest_whatif.py --op-module qkv=gemv.cubin --op-grid qkv=384" in str(e.value)


@pytest.mark.parametrize(("spec", "needle"), [
    ("o.ksplit=3", "`o.ksplit=3`: ksplit must be one of 1, 2, 4, 8"),
    ("o.ksplit", "a change is OP.OPTION=VALUE"),
    ("foo.ksplit=2", "no op `foo` in the manifest (short names: qkv, o,"),
    ("attn.ksplit=2", "`decode_attention_rope_cluster` (op `attention_decode_rope`) has no ksplit param"),
    ("o.entry=kern_gemv_m1", "only an entry with the same params can replace it"),
    ("o.entry=kern_gemv_residual_m2", "`kern_gemv_residual_m2` is not `kern_gemv_residual_m1` with another unroll "
                                      "or norm prologue (their M 1 vs 2"),
    ("gu.entry=kern_gemv_norm_m1", "(their COLS_PER_WARP 1 vs 2)"),
    ("embedding.pdl=1", "op `embedding` is also called by prefill; a variant changes decode-only ops: "
                        "attention_decode_rope, gemv_norm_qkv, gemv_norm_silu_gate_up, gemv_residual_down_proj, "
                        "gemv_residual_o_proj, norm_lm_head_argmax_screened"),
    ("rms_norm.pdl=1", "op `rms_norm` is not called by decode"),
    ("gu.entry=nope", "the kernel index has no entry `nope` in module gemv.cubin (it has: kern_gemv_m1,"),
    # 4B's qkv runs on the row-pass module, which holds that entry (plain and `_nb2`) alone
    ("qkv.entry=kern_gemv_norm_m1_u5", "no entry `kern_gemv_norm_m1_u5` in module gemv_p2.cubin (it has: kern_gemv_norm_m1, "
     "kern_gemv_norm_m1_nb2)"),
    ("o.grid=2", "unknown option `grid` (ksplit, entry, tc, pdl, carveout)"),
    ("attn.pdl=2", "pdl is 0 or 1"),
    ("attn.carveout=101", "`attn.carveout=101`: carveout is a percent 0..100 of the maximum shared memory per SM (0: "
                          "the most L1), or `none` for the driver's choice"),
    ("attn.carveout=-1", "`attn.carveout=-1`: carveout is a percent 0..100"),
    ("attn.carveout=50%", "`attn.carveout=50%`: carveout is a percent 0..100"),
    ("o.ksplit=2+o.ksplit=x", "`o.ksplit=x`: ksplit must be one of"),
])
def test_bad_changes_say_what_is_wrong(base, index, spec, needle):
    with pytest.raises(mv.VariantError) as e:
        mv.apply(base, spec, index)
    assert needle in str(e.value)


def test_merge_pairs():
    """The rewrites' pair merge (tools/gpu/mlp_variant.py, qkv_attention_variant.py): each `a` call and the `b` call
    right after it become merge's one call, the others stay; a pair out of order is refused by the call's label."""
    def call(label, op):
        return {"label": label, "op": op, "args": []}

    def merge(c, d):
        return {"label": c["label"] + "+" + d["label"], "op": "ab", "args": []}

    src = [call("e", "x"), call("l0.a", "a"), call("l0.b", "b"), call("m", "x"), call("l1.a", "a"), call("l1.b", "b")]
    before = json.dumps(src)
    out = mv.merge_pairs(src, "a", "b", merge, "MISSING", "STRAY")
    assert [c["label"] for c in out] == ["e", "l0.a+l0.b", "m", "l1.a+l1.b"] and out[0] is src[0]
    assert json.dumps(src) == before  # the input list is left as it was
    assert mv.merge_pairs([], "a", "b", merge, "MISSING", "STRAY") == []
    for calls, needle in [([call("l0.a", "a"), call("m", "x"), call("l0.b", "b")], "call `l0.a`: MISSING"),
                          ([call("l0.a", "a")], "call `l0.a`: MISSING"),
                          ([call("l0.b", "b"), call("l0.a", "a")], "call `l0.b`: STRAY"),
                          ([call("l0.a", "a"), call("l0.b", "b"), call("l1.b", "b")], "call `l1.b`: STRAY")]:
        with pytest.raises(mv.VariantError) as e:
            mv.merge_pairs(calls, "a", "b", merge, "MISSING", "STRAY")
        assert str(e.value) == needle

    def refuse(c, d):
        raise mv.VariantError(f"call `{d['label']}`: refused")

    with pytest.raises(mv.VariantError, match="call `l0.b`: refused"):
        mv.merge_pairs(src, "a", "b", refuse, "MISSING", "STRAY")


def test_cli_writes_a_verified_variant_and_refuses_a_bad_one(built_kernels, tmp_path, capsys, fma_4b):
    out = tmp_path / "v.json"
    assert mv.main([str(fma_4b), "--kernels", str(built_kernels), "--variant", "o.ksplit=1", "--out", str(out)]) == 0
    assert launch(json.loads(out.read_text()), "gemv_residual_o_proj")["grid"] == [160, 1, 1]
    assert mv.main([str(fma_4b), "--kernels", str(tmp_path), "--variant", "o.ksplit=1", "--out", str(out)]) == 1
    assert "cannot read the kernel index" in capsys.readouterr().err
    for manifest, needle in ((tmp_path / "none.json", "cannot read the manifest"), (ROOT / "README.md", "not JSON")):
        assert mv.main([str(manifest), "--kernels", str(built_kernels), "--variant", "o.ksplit=1", "--out",
                        str(out)]) == 1
        assert needle in capsys.readouterr().err
    assert mv.main([str(fma_4b), "--kernels", str(built_kernels), "--variant", "o.ksplit=2", "--out", str(out)]) == 0
    assert "`o.ksplit=2` changes nothing" in capsys.readouterr().err
    for extra, needle in ((["--variant", "o.ksplit=1", "--variant", "attn.pdl=0", "--out", str(out)], "one --variant"),
                          (["--variant", "o.ksplit=1", "--out", str(tmp_path / "no" / "v.json")], "no folder"),
                          (["--variant", "o.ksplit=1", "--out", str(tmp_path)], "is a directory")):
        with pytest.raises(SystemExit):
            mv.main([str(fma_4b), "--kernels", str(built_kernels), *extra])
        assert needle in capsys.readouterr().err


def test_program_sweep_dry_run_builds_and_verifies(built_kernels, tmp_path, capsys):
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    (work / "qwen3-4b" / "manifest.json").write_bytes(EXAMPLE.read_bytes())
    args = ["--work", str(work), "--geometry", "4b", "--dry-run"]
    assert program_sweep.main(args + ["--variant", "o.ksplit=1", "--variant", "attn.pdl=0",
                                      "--variant", "attn.carveout=none"]) == 0
    assert capsys.readouterr().out.splitlines() == ["manifest: verified; 3 variant(s)", "variant o.ksplit=1: verified",
                                                    "variant attn.pdl=0: verified", "variant attn.carveout=none: verified"]
    assert program_sweep.main(args + ["--variant", "o.ksplit=5"]) == 1
    assert "ksplit must be one of" in capsys.readouterr().err
    assert program_sweep.main(["--work", str(tmp_path), "--geometry", "4b", "--dry-run"]) == 1
    assert "run tools/gpu/prepare.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        program_sweep.main(args + ["--steps", "0"])
    assert "--steps must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        program_sweep.main(args + ["--variant", "o.ksplit=1", "--variant", "o.ksplit=1"])


def test_program_sweep_rounds_on_a_fake_runtime(built_kernels, dense_4b, tmp_path, capsys, monkeypatch, fma_4b):
    """--in-process without a GPU: kern_driver.Runtime.load returns kern-run's contract-checking fake runtime
    (packages/kern-run/tests/fake_runtime.py), one per manifest; every round generates on each, in turn. Each loads
    the work dir's weights its manifest declares (prepare.weights_for): the screened lm_head's file beside the weights
    for the example, not for its dense form (a --manifest-variant)."""
    pytest.importorskip("kern_driver")
    sys.path.insert(0, str(ROOT / "packages" / "kern-run" / "tests"))
    from fake_runtime import FakeRuntime

    import kern_driver
    from kern_run.generator import ManifestInfo

    loaded = []

    def fake_load(manifest, kernels, weights, *, capacity_tokens):
        m = json.loads(manifest)
        loaded.append((m, Path(kernels), [Path(w) for w in weights], capacity_tokens))  # prepare.weights_for
        return FakeRuntime(ManifestInfo.from_json(m), capacity_tokens)

    monkeypatch.setattr(kern_driver.Runtime, "load", staticmethod(fake_load))
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    (work / "qwen3-4b" / "manifest.json").write_bytes(fma_4b.read_bytes())
    md = tmp_path / "sweep.md"
    args = ["--work", str(work), "--geometry", "4b", "--variant", "o.ksplit=1", "--variant", "attn.pdl=0",
            "--manifest-variant", f"dense={dense_4b}",
            "--context", "40", "--steps", "6", "--rounds", "2", "--append", str(md), "--in-process"]
    assert program_sweep.main(args) == 0
    # the gemv.cu manifest at ksplit 2, its o.ksplit=1 variant, and the dense variant (the default --gemv: o on gemv_tc)
    assert [launch(m, "gemv_residual_o_proj")["grid"][0] for m, *_ in loaded] == [320, 160, 320, 160]
    assert [("gemv_norm_lm_head" in m["ops"], k.name, tuple(x.name for x in w), c) for m, k, w, c in loaded] == [
        (False, "kernels", ("weights.safetensors", "lm_head_screen.safetensors"), 4096)] * 3 + [
        (True, "kernels", ("weights.safetensors",), 4096)]
    table = md.read_text()
    assert "kern-run 4b decode, ms/token: 6 steps after a 40-token prompt, 2 alternating rounds" in table
    assert "all in one process (--in-process)" in table
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| manifest")]
    assert [r.split(" | ")[0] for r in rows] == ["| (manifest)", "| o.ksplit=1", "| attn.pdl=0", "| dense"]
    assert rows[0].endswith("| +0.000 | — |") and all(r.endswith("| identical |") for r in rows[1:])
    assert "round 2: (manifest)" in capsys.readouterr().out


def test_program_sweep_kernels_variant_rehashes_the_differing_modules(built_kernels, tmp_path, capsys):
    """--kernels-variant: the manifest against a copy of the kernels dir with one cubin built otherwise (here the
    plain decode attention module, same ABI, standing in for the PDL one): that module's sha256 follows the copy,
    the result verifies there; a dir without every module, or a taken name, is refused with the reason."""
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    (work / "qwen3-4b" / "manifest.json").write_bytes(EXAMPLE.read_bytes())
    kdir = tmp_path / "kernels-b"
    kdir.mkdir()
    for f in built_kernels.iterdir():
        (kdir / f.name).symlink_to(f)
    (kdir / "decode_attention_pdl.cubin").unlink()
    (kdir / "decode_attention_pdl.cubin").write_bytes((built_kernels / "decode_attention.cubin").read_bytes())
    args = ["--work", str(work), "--geometry", "4b", "--dry-run"]
    assert program_sweep.main(args + ["--kernels-variant", f"plain-attn={kdir}",
                                      "--kernels-variant", f"same={built_kernels}"]) == 0
    out = capsys.readouterr().out
    assert f"kernels variant plain-attn: {kdir}, modules differing: decode_attention_pdl\n" in out
    assert "kernels variant same: " in out and "no module differs (a control run)" in out
    assert "variant plain-attn: verified" in out

    base = json.loads(EXAMPLE.read_text())
    m, changed = program_sweep.against_kernels(base, built_kernels, "plain-attn", kdir)
    assert changed == ["decode_attention_pdl"]
    assert {k for k in m["modules"] if m["modules"][k] != base["modules"][k]} == {"decode_attention_pdl"}

    (kdir / "argmax_pdl.cubin").unlink()
    assert program_sweep.main(args + ["--kernels-variant", f"b={kdir}"]) == 1
    assert "kernels variant `b`" in (err := capsys.readouterr().err) and "no argmax_pdl.cubin (module `argmax_pdl`)" in err
    assert program_sweep.main(args + ["--kernels-variant", f"b={tmp_path / 'nope'}"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert program_sweep.main(args + ["--kernels-variant", f"b={EXAMPLE}"]) == 1
    assert "not a folder" in capsys.readouterr().err
    for bad, needle in ((f"(manifest)={kdir}", "names the manifest itself"), ("b", "NAME=KDIR")):
        with pytest.raises(SystemExit):
            program_sweep.main(args + ["--variant", "o.ksplit=1", "--kernels-variant", bad])
        assert needle in capsys.readouterr().err


def test_program_sweep_manifest_variant_is_verified(built_kernels, tmp_path, capsys):
    """--manifest-variant NAME=PATH: another manifest file, verified against the work's kernels; one that does
    not verify, or is not a manifest, is refused with the reason."""
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    (work / "qwen3-4b" / "manifest.json").write_bytes(EXAMPLE.read_bytes())
    other = json.loads(EXAMPLE.read_text())
    launch(other, "gemv_residual_o_proj")["pdl"] = False
    (tmp_path / "other.json").write_text(json.dumps(other))
    args = ["--work", str(work), "--geometry", "4b", "--dry-run"]
    assert program_sweep.main(args + ["--manifest-variant", f"nopdl-o={tmp_path / 'other.json'}"]) == 0
    assert "variant nopdl-o: verified" in capsys.readouterr().out
    launch(other, "gemv_residual_o_proj")["grid"] = [0, 1, 1]
    (tmp_path / "bad.json").write_text(json.dumps(other, indent=1))  # diagnostics name this file's lines
    assert program_sweep.main(args + ["--manifest-variant", f"bad={tmp_path / 'bad.json'}"]) == 1
    err = capsys.readouterr().err
    assert "manifest variant `bad`" in err and "does not verify against" in err and "line 1," not in err
    other06 = ROOT / "examples" / "qwen3-0.6b.json"
    assert program_sweep.main(args + ["--manifest-variant", f"small={other06}"]) == 1
    assert "is of model `qwen3-0.6b`, the manifest of `qwen3-4b`" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("[1]")
    assert program_sweep.main(args + ["--manifest-variant", f"x={tmp_path / 'x.json'}"]) == 1
    assert "not a kern manifest" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        program_sweep.main(args + ["--manifest-variant", f"a={tmp_path / 'x.json'}", "--kernels-variant", f"a={tmp_path}"])
    assert "the name `a` is already given by --kernels-variant" in capsys.readouterr().err


def test_program_sweep_runs_one_process_per_manifest_and_round_by_default(built_kernels, tmp_path, capsys, monkeypatch, fma_4b):
    """The default: each round starts this script with --child for every manifest (one runtime per process); here
    each 'process' runs the child's work in-process on kern-run's fake runtime; a failing one is named."""
    pytest.importorskip("kern_driver")
    sys.path.insert(0, str(ROOT / "packages" / "kern-run" / "tests"))
    from fake_runtime import FakeRuntime

    import kern_driver
    from kern_run.generator import ManifestInfo

    loads = []

    def fake_load(manifest, kernels, weights, *, capacity_tokens):
        m = json.loads(Path(manifest).read_text())
        loads.append((launch(m, "gemv_residual_o_proj")["grid"][0], Path(kernels)))
        return FakeRuntime(ManifestInfo.from_json(m), capacity_tokens)

    monkeypatch.setattr(kern_driver.Runtime, "load", staticmethod(fake_load))
    calls = []

    def fake_run(cmd, capture_output, text, env):
        calls.append(cmd)
        assert cmd[0] == sys.executable and cmd[1].endswith("program_sweep.py") and "--child" in cmd
        i = cmd.index("--child")
        out = json.dumps(program_sweep.time_one(Path(cmd[cmd.index("--work") + 1]), "4b", Path(cmd[i + 1]),
                                                Path(cmd[i + 2]), int(cmd[cmd.index("--context") + 1]),
                                                int(cmd[cmd.index("--steps") + 1])))
        return subprocess.CompletedProcess(cmd, 0, out + "\n", "")

    monkeypatch.setattr(program_sweep.subprocess, "run", fake_run)
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    (work / "qwen3-4b" / "manifest.json").write_bytes(fma_4b.read_bytes())
    args = ["--work", str(work), "--geometry", "4b", "--variant", "o.ksplit=1", "--context", "40", "--steps", "6",
            "--rounds", "2"]
    assert program_sweep.main(args) == 0
    assert len(calls) == 4 and [g for g, _ in loads] == [320, 160, 320, 160]  # manifest, variant; twice
    out = capsys.readouterr().out
    assert "2 alternating rounds, one process per manifest and round (tools/gpu/program_sweep.py)" in out
    assert "| o.ksplit=1 |" in out and "| identical |" in out

    def failing(cmd, capture_output, text, env):
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nKernDriverError: out of memory\n")

    monkeypatch.setattr(program_sweep.subprocess, "run", failing)
    with pytest.raises(SystemExit) as e:
        program_sweep.main(args)
    assert "the process timing (manifest) (round 1) exited 1" in str(e.value) and "out of memory" in str(e.value)


def test_program_sweep_env_variant(built_kernels, tmp_path, capsys, monkeypatch):
    """--env-variant NAME=VAR=VALUE[,VAR=VALUE]: the manifest itself, timed in processes with those variables set
    (and only those processes); malformed specs, taken names and --in-process are refused with the reason."""
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    (work / "qwen3-4b" / "manifest.json").write_bytes(EXAMPLE.read_bytes())
    args = ["--work", str(work), "--geometry", "4b"]
    assert program_sweep.main(args + ["--dry-run", "--env-variant", "eager=CUDA_MODULE_LOADING=EAGER,KERN_X=1"]) == 0
    out = capsys.readouterr().out
    assert "env variant eager: the manifest with CUDA_MODULE_LOADING=EAGER, KERN_X=1\n" in out
    assert "variant eager: verified" in out
    for bad, needle in (("eager", "NAME=VAR=VALUE"), ("eager=", "NAME=VAR=VALUE"), ("e=X", "NAME=VAR=VALUE"),
                        ("e==1", "NAME=VAR=VALUE"), ("(manifest)=A=1", "is taken")):
        with pytest.raises(SystemExit):
            program_sweep.main(args + ["--dry-run", "--env-variant", bad])
        assert needle in capsys.readouterr().err, bad
    with pytest.raises(SystemExit):
        program_sweep.main(args + ["--dry-run", "--manifest-variant", f"b={EXAMPLE}", "--env-variant", "b=A=1"])
    assert "is taken" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        program_sweep.main(args + ["--in-process", "--env-variant", "eager=CUDA_MODULE_LOADING=EAGER"])
    assert "not with --in-process" in capsys.readouterr().err

    seen = []

    def fake_run(cmd, capture_output, text, env):
        seen.append((Path(cmd[cmd.index("--child") + 1]).name, env.get("CUDA_MODULE_LOADING")))
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({"ms": 2.0, "tokens": [1, 2]}) + "\n", stderr="")

    monkeypatch.setattr(program_sweep.subprocess, "run", fake_run)
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    assert program_sweep.main(args + ["--rounds", "2", "--env-variant", "eager=CUDA_MODULE_LOADING=EAGER"]) == 0
    assert seen == [("manifest-0.json", None), ("manifest-1.json", "EAGER")] * 2
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| eager")]
    assert rows and rows[0].endswith("| +0.000 | identical |")
