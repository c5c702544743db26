"""tools/gen_qwen3.py: manifests for every Qwen3 dense geometry, verified; its own wiring check.

Two kernel indexes are used:
- `fake_kernels`: an index written here from the kernel catalog (tools/kernels-src/catalog.py,
  the ABI source of truth) with placeholder cubins: fast, covers all six geometries, and lets a
  test tamper with the ABI;
- `built_kernels` (conftest.py): the real build of tools/build_kernels.py, for the committed
  examples and `kern-verify --kernels`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import kern_schema as ks
import kern_verify
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))

import gen_qwen3 as gen  # noqa: E402
import gemv_plan  # noqa: E402
from gemv_plan import plan_gemvp  # noqa: E402
from qwen3_config import PRESETS, Qwen3Config  # noqa: E402

GEOMETRIES = list(PRESETS)


def write_fake_index(d: Path, geometries: list[str]) -> Path:
    """index.json from the catalog's ABI, each module a placeholder file pinned by its sha256."""
    import catalog
    import geometries as kgeom

    d.mkdir(parents=True, exist_ok=True)
    kernels = {}
    for k in catalog.instances([kgeom.load_geometry(g) for g in geometries], pdl=True, fused_attention=True):
        module = k.module
        blob = f"placeholder {module}".encode()
        (d / module).write_bytes(blob)
        params = [p.type for p in k.params] + ([t for _, t in catalog.TRITON_HIDDEN] if k.lang == "triton" else [])
        names = [p.name for p in k.params] + ([n for n, _ in catalog.TRITON_HIDDEN] if k.lang == "triton" else [])
        kernels[k.name] = {
            "module": module, "sha256": hashlib.sha256(blob).hexdigest(), "entry": k.entry,
            "params": params, "param_names": names, "aligned16": [p.name for p in k.params if p.div16],
            "block": k.block, "shared_mem": 0, "shared_mem_per": dict(k.shared_mem_per), "grid": k.grid,
            "constexprs": dict(k.constexprs), "doc": k.doc, **({"pdl": True} if k.pdl else {}),
            **({"carveout": k.carveout} if k.carveout is not None else {}),  # only where set, as build_kernels
        }
    (d / "index.json").write_text(json.dumps({"format": 1, "target": "sm_90", "kernels": kernels}, indent=1))
    return d


@pytest.fixture(scope="module")
def fake_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_index(tmp_path_factory.mktemp("fake-kernels"), GEOMETRIES)


def _build(preset: str, kernels: Path, **kw) -> ks.Manifest:
    """build_manifest of a preset; without PDL unless `pdl=True` is given, with the `cluster` decode attention
    (its own prologue call) unless `decode_attention` is given, and with the dense lm_head (`gemv_norm_lm_head` into
    `logits`, then `argmax`) unless `lm_head` is given (the API's and CLI's defaults are --pdl, rope-cluster and the
    screened lm_head: the tests name the variant they check; test_pdl_every_geometry, test_screened_lm_head,
    test_default_is_rope_cluster_pdl and the examples cover the defaults)."""
    kw.setdefault("pdl", False)
    kw.setdefault("lm_head", "dense")
    if not kw.get("fused_attention"):  # (the fused form is a Triton impl: the API picks it)
        kw.setdefault("decode_attention", "cluster")
    return gen.build_manifest(Qwen3Config.preset(preset), gen.load_index(kernels), **kw)


# ------------------------------------------------------------------ every geometry verifies


@pytest.mark.parametrize("preset", GEOMETRIES)
def test_every_geometry_verifies(preset: str, fake_kernels: Path) -> None:
    cfg = Qwen3Config.preset(preset)
    m = _build(preset, fake_kernels)
    text = ks.dump(m)
    diags = kern_verify.verify(ks.load(text), text.decode())
    assert diags == [], "\n".join(map(str, diags))

    L, H = cfg.num_hidden_layers, cfg.hidden_size
    assert m.vars == {"tokens": ks.Var(max=2048)}
    assert m.states["kv"].bytes_per_token == L * 8 * 2 * 128 * 2
    decode = [c.label for c in m.programs["decode"].calls]
    prefill = [c.label for c in m.programs["prefill"].calls]
    per_layer = ["input_norm", "qkv_proj", "qk_norm_rope", "attn", "o_proj", "post_norm", "gate_up_proj", "act",
                 "down_proj"]
    all_prefill = ["embed"] + [f"l{l}.{s}" for l in range(L) for s in per_layer]
    assert prefill == all_prefill[: 1 + 9 * (L - 1) + 3]  # ... up to the last layer's KV write
    # decode: 6 calls (6 launches: decode attention in one) per layer through the fused GEMV ops
    per_layer = ["norm_qkv", "qk_norm_rope", "attn", "o_proj_add", "norm_gate_up_silu", "down_proj_add"]
    assert decode == ["embed"] + [f"l{l}.{s}" for l in range(L) for s in per_layer] + ["norm_lm_head", "sample"]
    assert len(set(decode)) == len(decode)
    launches = {name: len(op.impl.launches) for name, op in m.ops.items()}
    assert sum(launches[c.op] for c in m.programs["decode"].calls if c.label.startswith("l3.")) == 6
    assert {c.op for c in m.programs["decode"].calls} == {
        "embedding", "gemv_norm_qkv", "qk_norm_rope_kv", "attention_decode", "gemv_residual_o_proj",
        "gemv_norm_silu_gate_up", "gemv_residual_down_proj", "gemv_norm_lm_head", "argmax"}
    assert {c.op for c in m.programs["prefill"].calls} == {
        "embedding", "rms_norm", "add_rms_norm", "gemm", "qk_norm_rope_kv", "attention_prefill", "silu_and_mul"}
    # tied models read the embedding in lm_head; untied (8b and larger) their own lm_head.weight
    lm = next(c for c in m.programs["decode"].calls if c.label == "norm_lm_head")
    assert lm.args[2].buf == ("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight")
    assert ("lm_head.weight" in m.buffers) == (not cfg.tie_word_embeddings)
    assert m.buffers["logits"].shape == [1, 151936] and m.buffers["next_token"].shape == [1]
    assert m.buffers["rope.cos_sin"].shape == [40960, 128] and m.buffers["block_table"].shape == [2560]
    # each layer's kernels get the state at layer*65536
    for c in m.programs["decode"].calls:
        for a in c.args:
            if a.state is not None:
                assert a.state == "kv" and a.offset == int(c.label.split(".")[0][1:]) * 65536
    assert all(mod.sha256 for mod in m.modules.values())
    assert H in {1024, 2048, 2560, 4096, 5120}


def test_4b_wiring_details(fake_kernels: Path) -> None:
    m = _build("4b", fake_kernels)
    calls = {c.label: c for c in m.programs["prefill"].calls}
    qkv = calls["l3.qkv_proj"]
    assert [a.buf or a.var or a.i32 for a in qkv.args] == [
        "x", "model.layers.3.self_attn.qkv_proj.weight", "qkv", "tokens", 32 * 128 + 2 * 8 * 128, 2560]
    calls = {c.label: c for c in m.programs["decode"].calls}
    assert [a.buf for a in calls["l3.norm_qkv"].args] == [
        "residual", "model.layers.3.input_layernorm.weight", "model.layers.3.self_attn.qkv_proj.weight", "qkv"]
    assert [a.buf for a in calls["l3.o_proj_add"].args] == [
        "attn", "model.layers.3.self_attn.o_proj.weight", "residual"]
    assert [a.buf for a in calls["l3.norm_gate_up_silu"].args] == [
        "residual", "model.layers.3.post_attention_layernorm.weight", "model.layers.3.mlp.gate_up_proj.weight", "act"]
    assert [a.buf for a in calls["l3.down_proj_add"].args] == ["act", "model.layers.3.mlp.down_proj.weight", "residual"]
    assert [a.buf for a in calls["norm_lm_head"].args] == [
        "residual", "model.norm.weight", "model.embed_tokens.weight", "logits"]
    attn = m.ops["attention_decode"].impl
    assert [la.entry for la in attn.launches] == ["decode_attention_cluster"] and attn.scratch == {}
    assert attn.launches[0].grid == [8, gen.CLUSTER_SPLITS, 1]
    tri = _build("4b", fake_kernels, decode_attention="triton").ops["attention_decode"].impl
    assert len(tri.launches) == 2 and set(tri.scratch) == {"part_acc", "part_ml"}
    # the literal geometry the kernels get
    rope = m.ops["qk_norm_rope_kv"].impl.launches[0]
    k = gen.load_index(fake_kernels)["qk_norm_rope_kv"]
    lit = {n: a.literal for n, a in zip(k.param_names, rope.args) if a.literal is not None}
    assert lit["num_q_heads"] == 32 and lit["num_kv_heads"] == 8 and lit["page_bytes"] == 36 * 65536
    assert lit["eps"] == pytest.approx(1e-6)
    assert rope.args[-2:] == [ks.Arg(u64=0), ks.Arg(u64=0)]  # Triton's hidden params
    assert m.ops["gemm"].impl.launches == [ks.Launch(extern="cublaslt.gemm_bf16_tn", args=[ks.Arg(param=i) for i in range(6)])]


def _gemv(m: ks.Manifest, op: str, index) -> tuple[str, list, int | None, dict]:
    la = m.ops[op].impl.launches[0]
    k = next(k for k in index.values() if k.entry == la.entry)
    return la.entry, la.grid, la.shared_mem, {n: a.literal for n, a in zip(k.param_names, la.args)
                                              if a.literal is not None}


def test_decode_gemv_ops(fake_kernels: Path) -> None:
    """Shapes, entry, grid, ksplit and shared memory of every decode GEMV op, 4B and 0.6B: by default every one on
    gemv_tc.cu's M = 1 entry (gemv_plan.gemv_tensor_core: k a multiple of 128), `_u5` where gemv_plan.gemv_tc_unroll
    says so (a warp's 9–10 steps fit two stages of 5 and the next launch is not the attention), ksplit 1, one 16-row
    tile per block; with `--gemv gemv-fma` gemv.cu's (gen.gemv_ksplit, gemv_plan.gemv_entry_unroll, the row passes of
    gemv_plan.gemv_passes and the batched prologue of gemv_plan.gemv_norm_batched)."""
    index = gen.load_index(fake_kernels)
    m = _build("4b", fake_kernels)
    eps = pytest.approx(1e-6)
    assert {op: m.ops[op].impl.launches[0].module for op in gen.GEMV_OPS} == dict.fromkeys(gen.GEMV_OPS, "gemv_tc")
    assert {op: _gemv(m, op, index) for op in gen.GEMV_OPS} == {
        # followed by the attention: U = 4 (gemv_tc_unroll), 384 tiles
        "gemv_norm_qkv": ("kern_gemvtc_norm_m1", [6144 // 16, 1, 1], 2 * 2560,
                          {"n": 6144, "k": 2560, "eps": eps, "ksplit": 1}),
        "gemv_residual_o_proj": ("kern_gemvtc_residual_m1", [2560 // 16, 1, 1], None,
                                 {"n": 2560, "k": 4096, "ksplit": 1}),
        # k = 2,560: 10 steps of 128 per warp (two k halves), two stages of 5
        "gemv_norm_silu_gate_up": ("kern_gemvtc_norm_silu_m1_u5", [9728 // 8, 1, 1], 2 * 2560,
                                   {"n": 9728, "k": 2560, "eps": eps, "ksplit": 1}),
        "gemv_residual_down_proj": ("kern_gemvtc_residual_m1", [160, 1, 1], None, {"n": 2560, "k": 9728, "ksplit": 1}),
        "gemv_norm_lm_head": ("kern_gemvtc_norm_m1_u5", [151936 // 16, 1, 1], 2 * 2560,
                              {"n": 151936, "k": 2560, "eps": eps, "ksplit": 1})}
    # --gemv gemv-fma: gemv.cu's entries for every op (the manifests before session 30). qkv: 384 blocks of 16 rows
    # would be 1.45 waves of two blocks per SM, so the row-pass module (gemv_plan.gemv_passes): 192 blocks of 2 × 16
    # rows, the same entry name in gemv_p2.cubin; k = 2,560 (320 vectors over 256 threads) takes the batched norm
    # prologue (gemv_plan.gemv_norm_batched: `_nb2`)
    fma = _build("4b", fake_kernels, gemv="gemv-fma")
    assert {op: fma.ops[op].impl.launches[0].module for op in gen.GEMV_OPS} == {
        **dict.fromkeys(gen.GEMV_OPS, "gemv"), "gemv_norm_qkv": "gemv_p2"}
    assert {op: _gemv(fma, op, index) for op in gen.GEMV_OPS} == {
        "gemv_norm_qkv": ("kern_gemv_norm_m1_nb2", [6144 // 32, 1, 1], 2 * 2560,
                          {"n": 6144, "k": 2560, "eps": eps, "ksplit": 1}),
        # after the attention: ksplit 2 (gen.gemv_ksplit)
        "gemv_residual_o_proj": ("kern_gemv_residual_m1", [2560 // 8, 1, 1], None, {"n": 2560, "k": 4096, "ksplit": 2}),
        "gemv_norm_silu_gate_up": ("kern_gemv_norm_silu_m1_u5_nb2", [9728 // 8, 1, 1], 2 * 2560,
                                   {"n": 9728, "k": 2560, "eps": eps, "ksplit": 1}),
        "gemv_residual_down_proj": ("kern_gemv_residual_m1", [160, 1, 1], None, {"n": 2560, "k": 9728, "ksplit": 1}),
        "gemv_norm_lm_head": ("kern_gemv_norm_m1_u5_nb2", [9496, 1, 1], 2 * 2560,  # followed by the argmax: `_u5`
                              {"n": 151936, "k": 2560, "eps": eps, "ksplit": 1})}
    # --gemv persistent: tools/gemv_plan.py's plan
    assert _gemv(_build("4b", fake_kernels, gemv="persistent"), "gemv_norm_lm_head", index) == (
        "kern_gemvp_norm_m1", [132, 1, 1], 2 * 2560 + 40 * 5 * 512,
        {"n": 151936, "k": 2560, "eps": eps, "piece_chunks": 5})
    assert m.ops["gemv_residual_o_proj"].params == ["in buffer<bf16>", "in buffer<bf16>", "inout buffer<bf16>"]
    assert m.ops["gemv_norm_qkv"].params == ["in buffer<bf16>"] * 3 + ["out buffer<bf16>"]
    assert all(m.ops[op].params == fma.ops[op].params for op in gen.GEMV_OPS)

    # the small model (k = 1,024 and 2,048: at most 4 steps per warp) on U = 4 everywhere; down (k = 3,072) on 64
    # tiles too, where gemv.cu splits k 4 ways to fill the GPU (measured faster on the tensor cores: NOTES.md 74)
    tc = _build("0.6b", fake_kernels)
    assert {op: _gemv(tc, op, index) for op in gen.GEMV_OPS} == {
        "gemv_norm_qkv": ("kern_gemvtc_norm_m1", [256, 1, 1], 2 * 1024, {"n": 4096, "k": 1024, "eps": eps, "ksplit": 1}),
        "gemv_residual_o_proj": ("kern_gemvtc_residual_m1", [64, 1, 1], None, {"n": 1024, "k": 2048, "ksplit": 1}),
        "gemv_norm_silu_gate_up": ("kern_gemvtc_norm_silu_m1", [384, 1, 1], 2 * 1024,
                                   {"n": 3072, "k": 1024, "eps": eps, "ksplit": 1}),
        "gemv_residual_down_proj": ("kern_gemvtc_residual_m1", [64, 1, 1], None, {"n": 1024, "k": 3072, "ksplit": 1}),
        "gemv_norm_lm_head": ("kern_gemvtc_norm_m1", [9496, 1, 1], 2 * 1024,
                              {"n": 151936, "k": 1024, "eps": eps, "ksplit": 1})}
    m = _build("0.6b", fake_kernels, gemv="gemv-fma")
    # qkv's 256 blocks are one wave: no row passes (gemv_plan.gemv_passes); every GEMV on gemv.cubin
    assert {m.ops[op].impl.launches[0].module for op in gen.GEMV_OPS} == {"gemv"}
    # the small model (k = 1024 and 2048: at most 8 loads per lane and row) keeps the 4-load entries, and its norm
    # GEMVs (k = 1,024: one x vector per thread) the loop prologue of the plain entries
    assert {_gemv(m, op, index)[0] for op in gen.GEMV_OPS} == {"kern_gemv_norm_m1", "kern_gemv_residual_m1",
                                                               "kern_gemv_norm_silu_m1"}
    # the small model: down (512 row pairs over k = 3072) splits k to fill the GPU, o because it follows the attention
    assert _gemv(m, "gemv_residual_down_proj", index)[1:] == ([1024 * 4 // 16, 1, 1], None,
                                                              {"n": 1024, "k": 3072, "ksplit": 4})
    assert _gemv(m, "gemv_residual_o_proj", index)[1:] == ([1024 * 2 // 16, 1, 1], None,
                                                           {"n": 1024, "k": 2048, "ksplit": 2})
    assert {op: _gemv(m, op, index)[3]["ksplit"] for op in gen.GEMV_OPS} == {
        "gemv_norm_qkv": 1, "gemv_residual_o_proj": 2, "gemv_norm_silu_gate_up": 1, "gemv_residual_down_proj": 4,
        "gemv_norm_lm_head": 1}


@pytest.mark.parametrize("preset", ["0.6b", "1.7b", "4b", "8b", "14b", "32b"])
def test_gemv_persistent(fake_kernels: Path, preset: str) -> None:
    """--gemv persistent: every decode GEMV op through gemv_persist.cu with tools/gemv_plan.py's plan (grid one
    block per SM, piece_chunks, shared memory ≤ 112 KB), the same interfaces, calls and buffers as --gemv gemv;
    the manifest verifies with no diagnostic; --gemv gemv has no persistent launch, nor has the default, with
    or without PDL."""
    index = gen.load_index(fake_kernels)
    cfg = Qwen3Config.preset(preset)
    m, plain = (_build(preset, fake_kernels, gemv=g) for g in ("persistent", "gemv-fma"))
    default, default_pdl = _build(preset, fake_kernels), _build(preset, fake_kernels, pdl=True)
    assert kern_verify.verify(m) == []
    shapes = {"gemv_norm_qkv": (cfg.qkv_size, cfg.hidden_size, False),
              "gemv_residual_o_proj": (cfg.hidden_size, cfg.q_size, False),
              "gemv_norm_silu_gate_up": (cfg.intermediate_size, cfg.hidden_size, True),
              "gemv_residual_down_proj": (cfg.hidden_size, cfg.intermediate_size, False),
              "gemv_norm_lm_head": (cfg.vocab_size, cfg.hidden_size, False)}
    for op, (n, k, silu) in shapes.items():
        plan = plan_gemvp(n, k, silu)
        entry, grid, smem, lit = _gemv(m, op, index)
        if plan is None:  # 32B down (k = 25600): x leaves under 2 slots per warp; gemv.cu's form instead
            assert (preset, op) == ("32b", "gemv_residual_down_proj") and entry == "kern_gemv_residual_m1"
            continue
        assert entry == gen.GEMVP_ENTRY[gen.GEMV_OPS[op]]
        assert (grid, smem, lit["n"], lit["k"], lit["piece_chunks"]) == (
            [plan.grid, 1, 1], plan.smem, n, k, plan.piece_chunks)
        assert smem <= 112 * 1024 and m.ops[op].params == plain.ops[op].params
        assert _gemv(plain, op, index)[0].startswith("kern_gemv_")
        tc = gemv_plan.gemv_tensor_core(gen.GEMV_OPS[op], k)
        assert tc == (k % 128 == 0)  # every Qwen3 geometry's GEMVs
        assert _gemv(default, op, index)[0].startswith("kern_gemvtc_" if tc else "kern_gemv_")
        assert _gemv(default_pdl, op, index)[0].startswith("kern_gemvtc_" if tc else "kern_gemv_")
    assert m.programs == plain.programs and m.buffers == plain.buffers


def test_gemv_persistent_wiring_checked(fake_kernels: Path) -> None:
    """check_wiring refuses a persistent GEMV launch whose grid, piece_chunks or shared memory leave the plan."""
    index = gen.load_index(fake_kernels)
    cfg = Qwen3Config.preset("0.6b")
    m = _build("0.6b", fake_kernels, gemv="persistent")
    la = m.ops["gemv_norm_qkv"].impl.launches[0]
    la.shared_mem -= 512
    with pytest.raises(gen.WiringError, match=r"ops.gemv_norm_qkv kernel `kern_gemvp_norm_m1`: grid .* plan"):
        gen.check_wiring(m, cfg, gen.make_layout(cfg), index)
    with pytest.raises(gen.GenError, match="--gemv 'fast'"):
        _build("0.6b", fake_kernels, gemv="fast")


@pytest.mark.parametrize(("warps", "k", "ksplit"), [
    (1056, 1024, 1),    # one 8-warp block per SM already: no split
    (75968, 2560, 1),   # lm_head
    (1280, 9728, 1),    # 4B down
    (512, 3072, 4),     # 0.6B down: 2048 warps, 768 of k each
    (512, 2048, 1),     # 0.6B o: ksplit 4 would leave 512 of k per warp; ksplit 2 reaches only 1024 warps
    (1024, 2048, 2),    # 1.7B o / down-like: 2048 warps, 1024 of k each
    (200, 8192, 8),     # a tiny n: 1600 warps
    (100, 8192, 1),     # not even ksplit 8 fills the GPU
])
def test_gemv_ksplit_rule(warps: int, k: int, ksplit: int) -> None:
    assert gen.gemv_ksplit(warps, k) == ksplit


@pytest.mark.parametrize(("warps", "k", "ksplit"), [
    (1280, 4096, 2),    # 4B o: 1 by the base rule, 2 after the attention
    (512, 2048, 2),     # 0.6B o
    (1024, 1024, 1),    # 512 of k per warp at 2: below GEMV_MIN_K_PER_WARP, no split
    (512, 3072, 4),     # the base rule's split is kept
    (200, 8192, 8),
])
def test_gemv_ksplit_after_attention(warps: int, k: int, ksplit: int) -> None:
    assert gen.gemv_ksplit(warps, k, after_attention=True) == ksplit
    assert gen.GEMV_OPS_AFTER_ATTENTION == {"gemv_residual_o_proj"}


@pytest.mark.parametrize(("k", "ksplit", "loads", "unroll"), [
    (2560, 1, 10, 5),   # 4B qkv, gate_up, lm_head: two stages of 5 hold a lane's whole row
    (2304, 1, 9, 5),
    (2296, 1, 9, 5),    # 287 vectors: lane 0 has 9 loads, lane 31 8
    (2048, 1, 8, 4),    # two stages of 4 already do
    (2816, 1, 11, 4),   # a third stage either way
    (4096, 1, 16, 4),   # 4B o
    (9728, 1, 38, 4),   # 4B down: 8 stages instead of 10 measured slower
    (5120, 2, 10, 5),   # 14B qkv-like at ksplit 2
    (3072, 4, 3, 4),    # 0.6B down
    (8, 1, 1, 4),
])
def test_gemv_unroll_rule(k: int, ksplit: int, loads: int, unroll: int) -> None:
    assert gemv_plan.gemv_lane_loads(k, ksplit) == loads
    assert gemv_plan.gemv_unroll(k, ksplit) == unroll


def test_gemv_entry_unroll_not_before_the_attention() -> None:
    """`_u5` (where a lane's row fits two stages of 5) for every decode GEMV but the one followed by the decode
    attention (measured in the 4B program: qkv lost with it, lm_head before the argmax gained, NOTES.md 33)."""
    assert gemv_plan.gemv_entry_unroll(2560, 1, False) == 5
    assert gemv_plan.gemv_entry_unroll(2560, 1, True) == 4
    assert gemv_plan.gemv_entry_unroll(4096, 1, False) == 4
    assert gen.GEMV_OPS_BEFORE_ATTENTION == {"gemv_norm_qkv"}
    assert gen.GEMV_OPS_BEFORE_ATTENTION < set(gen.GEMV_OPS)


def test_gemv_norm_batched_rule() -> None:
    """The batched norm prologue (`_nb2`) where each of the block's 256 threads holds 2 of x's 16-byte vectors: k/8 in
    (256, 512] (4B's 2,560 and 8B's 4,096; not 0.6B's 1,024, 1.7B's 2,048 or 14B's 5,120); bad inputs refused."""
    assert [gemv_plan.gemv_norm_batched(k) for k in (1024, 2048, 2056, 2560, 4096, 4104, 5120)] == \
        [False, False, True, True, True, False, False]
    assert gemv_plan.gemv_norm_batched(2048, threads=128) and not gemv_plan.gemv_norm_batched(2560, nb=1)
    assert gemv_plan.GEMV_NORM_NB_SUFFIX == gen.GEMV_NORM_NB_SUFFIX == "_nb2"
    for args in ((0,), (1020,), (1024, 0), (1024, 256, 0)):
        with pytest.raises(ValueError, match="k must be a positive multiple of 8, threads and nb ≥ 1"):
            gemv_plan.gemv_norm_batched(*args)


def test_gemv_norm_entry_without_batched_forms(fake_kernels: Path, tmp_path: Path) -> None:
    """An index without the `_nb2` entries (built before session 29: its plain entries are correct for every k) gives
    the plain entries; one whose `_nb2` entry has another NORM_NB is a stale index, refused."""
    idx = json.loads((fake_kernels / "index.json").read_text())
    kernels = idx["kernels"] if "kernels" in idx else idx
    saved = {n: kernels.pop(n) for n in list(kernels) if "_nb2" in n}
    assert len(saved) == 5  # norm, norm_silu × "", _u5, and the row-pass kern_gemv_norm_m1_nb2_p2
    old = tmp_path / "old"
    shutil.copytree(fake_kernels, old)
    (old / "index.json").write_text(json.dumps(idx))
    m = _build("4b", old, gemv="gemv-fma")  # the default's norm GEMVs are gemv_tc.cu's (no `_nb2` forms)
    entries = {op: m.ops[op].impl.launches[0].entry for op in ("gemv_norm_qkv", "gemv_norm_silu_gate_up")}
    assert entries == {"gemv_norm_qkv": "kern_gemv_norm_m1", "gemv_norm_silu_gate_up": "kern_gemv_norm_silu_m1_u5"}
    kernels.update(saved)
    kernels["kern_gemv_norm_silu_m1_u5_nb2"]["constexprs"]["NORM_NB"] = 3
    stale = tmp_path / "stale"
    shutil.copytree(fake_kernels, stale)
    (stale / "index.json").write_text(json.dumps(idx))
    with pytest.raises(gen.GenError, match="`kern_gemv_norm_silu_m1_u5_nb2` in the index has NORM_NB 3, not 2: a stale"):
        _build("4b", stale, gemv="gemv-fma")


def test_gemv_tensor_core_rule() -> None:
    """gemv_tc.cu for every decode GEMV variant where k is a multiple of its 128-element M = 1 step (NOTES.md 74); its
    `_u5` entries where a warp's steps (k / 128 / 2) fill two stages of 5 and not of 4, except before the attention;
    entry names; bad inputs refused."""
    assert [gemv_plan.gemv_tensor_core("gemv_residual", k) for k in (1024, 4096, 9728, 25600, 1000, 1032, 3072, 992)] \
        == [True, True, True, True, False, False, True, False]
    assert all(gemv_plan.gemv_tensor_core(v, 2560) for v in ("gemv_norm", "gemv_norm_silu", "gemv_residual"))
    assert not gemv_plan.gemv_tensor_core("gemv", 4096)  # the plain variant: no decode op launches it
    assert gemv_plan.GEMV_TC_STEP == 128 and set(gemv_plan.GEMV_TC_VARIANTS) == set(gen.GEMV_OPS.values())
    # k = 2,176…2,560: 9–10 steps per warp, two stages of 5 (U = 4 needs three); before the attention U = 4
    assert [gemv_plan.gemv_tc_unroll(k, False) for k in (1024, 2048, 2176, 2304, 2560, 2688, 4096, 9728)] == \
        [4, 4, 5, 5, 5, 4, 4, 4]
    assert gemv_plan.gemv_tc_unroll(2560, True) == 4
    for bad in (0, 1000, 1024 + 32):
        with pytest.raises(ValueError, match=f"k = {bad} must be a positive multiple of 128"):
            gemv_plan.gemv_tc_unroll(bad, False)
    assert [gemv_plan.gemv_tc_entry(n) for n in ("kern_gemv_residual_m1", "kern_gemv_norm_silu_m1_u5_nb2",
                                                  "kern_gemv_m1")] == [
        "kern_gemvtc_residual_m1", "kern_gemvtc_norm_silu_m1_u5", "kern_gemvtc_m1"]
    with pytest.raises(ValueError, match="`kern_gemvp_m1` is not a gemv.cu entry"):
        gemv_plan.gemv_tc_entry("kern_gemvp_m1")
    assert [gemv_plan.gemv_entry_inputs(n) for n in ("kern_gemvtc_norm_m4", "kern_gemv_residual_m1_u5",
                                                      "kern_gemv_norm_m1_nb2_p2", "kern_gemvtc_m8")] == [4, 1, 1, 8]
    for bad in ("kern_gemv_m3", "rms_norm_h2560"):
        with pytest.raises(ValueError, match=f"`{bad}` is not a gemv.cu or gemv_tc.cu entry"):
            gemv_plan.gemv_entry_inputs(bad)
    for k in (1020, 0):
        with pytest.raises(ValueError, match=f"k = {k}: k must be a positive multiple of 8"):
            gemv_plan.gemv_tensor_core("gemv_residual", k)


def test_gemv_tensor_core_index_old_or_stale(fake_kernels: Path, tmp_path: Path) -> None:
    """An index without gemv_tc.cu's entries (built before session 30) gives gemv.cu's entries, as `--gemv gemv-fma`
    does; one whose tensor-core entry has another TC_STEP (e.g. 32: the tile layout, built before session 32) is a
    stale index, refused."""
    idx = json.loads((fake_kernels / "index.json").read_text())
    kernels = idx["kernels"] if "kernels" in idx else idx
    saved = {n: kernels.pop(n) for n in list(kernels) if n.startswith("kern_gemvtc")}
    assert len(saved) == 20  # plain, norm, norm_silu, residual × (M = 1 "", _u5; M = 2, 4, 8)
    old = tmp_path / "old"
    shutil.copytree(fake_kernels, old)
    (old / "index.json").write_text(json.dumps(idx))
    m, fma = _build("4b", old), _build("4b", fake_kernels, gemv="gemv-fma")
    assert all(m.ops[op] == fma.ops[op] for op in gen.GEMV_OPS)
    kernels.update(saved)
    kernels["kern_gemvtc_residual_m1"]["constexprs"]["TC_STEP"] = 32
    stale = tmp_path / "stale"
    shutil.copytree(fake_kernels, stale)
    (stale / "index.json").write_text(json.dumps(idx))
    with pytest.raises(gen.GenError, match="kernel `kern_gemvtc_residual_m1` in the index has TC_STEP 32, M 1 .*: a "
                                           "stale index"):
        _build("4b", stale)


def test_tensor_core_gemv_wiring_checked(fake_kernels: Path) -> None:
    """check_wiring holds a tensor-core launch to its rule (ksplit 1, k a multiple of its index TC_STEP, grid
    ceil_div(n, 16)), naming the launch."""
    cfg = Qwen3Config.preset("4b")
    lay, index = gen.make_layout(cfg), gen.load_index(fake_kernels)
    m = _build("4b", fake_kernels)
    gen.check_wiring(m, cfg, lay, index)
    t = ks.load(ks.dump(m))
    la = t.ops["gemv_residual_o_proj"].impl.launches[0]
    la.args[-1] = ks.Arg(i32=2)
    la.grid = [320, 1, 1]  # gemv.cu's grid at ksplit 2
    with pytest.raises(gen.WiringError) as e:
        gen.check_wiring(t, cfg, lay, index)
    assert ("ops.gemv_residual_o_proj kernel `kern_gemvtc_residual_m1`: ksplit 2, k = 4096 with "
            "`kern_gemvtc_residual_m1` (gemv_tc.cu, mma steps of 128 elements): the tensor-core form takes ksplit 1 "
            "and k a multiple of 128 (any other launch traps)") in str(e.value)


def test_gemv_passes_rule() -> None:
    """Two row passes (`kern_gemv_norm_m1_p2`) where, at ksplit 1, the default grid is more than one wave of two
    8-warp blocks per SM (NOTES.md 54: 4B's qkv; 0.6B's, one wave, lost with them); bad inputs are refused."""
    assert gemv_plan.gemv_passes(6144, 2, 8, 1) == gemv_plan.QKV_PASSES == 2  # 4B qkv: 384 blocks > 264 -> 192
    assert gemv_plan.gemv_passes(4096, 2, 8, 1) == 1                           # 0.6B qkv: 256 blocks, one wave
    assert gemv_plan.gemv_passes(16 * 264, 2, 8, 1) == 1                       # exactly one wave
    assert gemv_plan.gemv_passes(16 * 264 + 1, 2, 8, 1) == 2                   # one block more
    assert gemv_plan.gemv_passes(6144, 2, 8, 2) == 1                           # the row-pass form takes ksplit 1
    assert gemv_plan.gemv_passes(4096, 2, 8, 1, sms=100) == 2                  # the wave follows the SM count
    assert gemv_plan.gemv_blocks(6144, 2, 8, 1, 2) == 192 and gemv_plan.gemv_blocks(6145, 2, 8, 1, 2) == 193
    for args in ((0, 2, 8, 1), (6144, 0, 8, 1), (6144, 2, 8, 0), (6144, 2, 8, 3), (6144, 2, 8, 1, 0)):
        with pytest.raises(ValueError, match="each must be ≥ 1 and ksplit must divide warps"):
            gemv_plan.gemv_passes(*args)
    with pytest.raises(ValueError, match="0 row passes per block"):
        gemv_plan.gemv_blocks(6144, 2, 8, 1, 0)


def test_row_pass_gemv_wiring_checked(fake_kernels: Path) -> None:
    """check_wiring holds 4B's qkv launch on the row-pass entry (`--gemv gemv-fma`) to that entry's rule (grid
    ceil_div(n, 32), ksplit 1): the default entry's grid, another ksplit and an index whose `_p2` entry lost (or contradicts) its PASSES are
    refused, naming the launch."""
    cfg = Qwen3Config.preset("4b")
    lay = gen.make_layout(cfg)
    index = gen.load_index(fake_kernels)
    m = _build("4b", fake_kernels, gemv="gemv-fma")  # the default's qkv is gemv_tc.cu's
    assert gen.kernels_by_op(m, index)["gemv_norm_qkv"] == [index["kern_gemv_norm_m1_nb2_p2"]]
    gen.check_wiring(m, cfg, lay, index)  # as built: clean

    def refused(edit=None, idx=index) -> str:
        t = ks.load(ks.dump(m))
        if edit:
            edit(t.ops["gemv_norm_qkv"].impl.launches[0])
        with pytest.raises(gen.WiringError) as e:
            gen.check_wiring(t, cfg, lay, idx)
        return str(e.value)

    where = "ops.gemv_norm_qkv kernel `kern_gemv_norm_m1_nb2_p2`"

    def default_grid(la):
        la.grid = [384, 1, 1]
    assert (f"{where}: grid [384, 1, 1] != [192, 1, 1] (n = 6144, 2 columns per warp group, ksplit 1, 2 row "
            "passes)") in refused(default_grid)

    def ksplit_2(la):
        la.args[-1] = ks.Arg(i32=2)
        la.grid = [768, 1, 1]  # the default entry's grid at ksplit 2
    assert f"{where}: ksplit 2 with `kern_gemv_norm_m1_nb2_p2` (2 row passes per block): the row-pass form takes ksplit 1" \
        in refused(ksplit_2)

    p2 = index["kern_gemv_norm_m1_nb2_p2"]
    for cx, said in (({c: v for c, v in p2.constexprs.items() if c != "PASSES"}, "None"),
                     (p2.constexprs | {"PASSES": 3}, "3"), (p2.constexprs | {"PASSES": 0}, "0")):
        stale = index | {p2.name: replace(p2, constexprs=cx)}
        assert (f"{where}: index constexpr PASSES {said} where its name says 2 row passes per block: a stale or "
                "damaged index; rebuild the kernels with tools/build_kernels.py") in refused(idx=stale)


def test_gemv_unroll_rejects_bad_k() -> None:
    with pytest.raises(ValueError, match="k = 12 at ksplit 1: k must be a positive multiple of 8"):
        gemv_plan.gemv_unroll(12, 1)


def test_gemv_u5_entry_missing_from_index(fake_kernels: Path, tmp_path: Path) -> None:
    """An index without the `_u5` entries (built before them) is refused with the entry named, not
    silently replaced by the 4-load entry: gemv_tc.cu's (the default) and gemv.cu's (`--gemv gemv-fma`)."""
    d = tmp_path / "k"
    d.mkdir()
    for f in fake_kernels.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    idx = json.loads((d / "index.json").read_text())
    idx["kernels"] = {n: e for n, e in idx["kernels"].items() if not n.endswith("_u5")}
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(gen.GenError, match=r"op `gemv_norm_silu_gate_up` \(k = 2560, ksplit 1\) wants `kern_gemv_norm_silu_m1_u5` "
                                           r"\(5 loads per row per stage\), which the kernel index lacks: rebuild"):
        _build("4b", d, gemv="gemv-fma")
    with pytest.raises(gen.GenError, match=r"op `gemv_norm_silu_gate_up` \(k = 2560\) wants `kern_gemvtc_norm_silu_m1_u5` "
                                           r"\(5 steps per stage\), which the kernel index lacks or builds with another "
                                           r"UNROLL: rebuild"):
        _build("4b", d)
    _build("0.6b", d)  # 0.6B needs none of them
    _build("0.6b", d, gemv="gemv-fma")


def test_gemv_row_pass_entry_missing_or_stale(fake_kernels: Path, tmp_path: Path) -> None:
    """An index without the row-pass entry (built before it) is refused for 4B's `--gemv gemv-fma` manifest, whose qkv
    needs it, with the entry named, not silently replaced by the default entry; one whose `_p2` entry has another
    PASSES is a stale index. 0.6B needs none, nor does the default (gemv_tc.cu's qkv)."""
    d = tmp_path / "k"
    d.mkdir()
    for f in fake_kernels.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    full = json.loads((d / "index.json").read_text())
    idx = copy.deepcopy(full)
    del idx["kernels"]["kern_gemv_norm_m1_nb2_p2"]
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(gen.GenError, match=r"op `gemv_norm_qkv` \(n = 6144, ksplit 1\) wants `kern_gemv_norm_m1_nb2_p2` "
                                           r"\(gemv.cu in 2 row passes, tools/gemv_plan.py gemv_passes\), which the "
                                           r"kernel index lacks: rebuild the kernels with tools/build_kernels.py"):
        _build("4b", d, gemv="gemv-fma")
    _build("0.6b", d, gemv="gemv-fma")
    _build("4b", d)
    idx = copy.deepcopy(full)
    idx["kernels"]["kern_gemv_norm_m1_nb2_p2"]["constexprs"]["PASSES"] = 3
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(gen.GenError, match=r"kernel `kern_gemv_norm_m1_nb2_p2` in the index has PASSES 3, not 2: a stale "
                                           r"index; rebuild the kernels with tools/build_kernels.py"):
        _build("4b", d, gemv="gemv-fma")


def test_gemv_k_must_be_a_multiple_of_8(fake_kernels: Path) -> None:
    b = gen.ManifestBuilder(Qwen3Config.preset("0.6b"), gen.load_index(fake_kernels))
    with pytest.raises(gen.GenError, match=r"op `gemv_residual_down_proj`: k = 3076 is not a multiple of 8"):
        gen.declare_gemv(b, "gemv_residual_down_proj", 1024, 3076, 1e-6)
    gen.declare_gemv(b, "gemv_residual_down_proj", 1024, 3080, 1e-6)  # a multiple of 8 is fine


def test_deterministic_and_chunk(fake_kernels: Path, tmp_path: Path) -> None:
    a = ks.dump(_build("0.6b", fake_kernels))
    b = ks.dump(_build("0.6b", fake_kernels))
    assert a == b
    m = _build("0.6b", fake_kernels, chunk=512, max_positions=4096)
    assert m.vars["tokens"].max == 512
    assert m.buffers["rope.cos_sin"].shape == [4096, 128] and m.buffers["block_table"].shape == [256]
    out = tmp_path / "m.json"
    assert gen.main(["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(out), "--no-pdl",
                     "--decode-attention", "cluster", "--lm-head", "dense"]) == 0
    assert out.read_bytes() == a
    assert gen.main(["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(out)]) == 0  # CLI defaults
    assert out.read_bytes() == ks.dump(_build("0.6b", fake_kernels, pdl=True, decode_attention="rope-cluster",
                                              lm_head="screened"))


def test_config_json_path_matches_preset(fake_kernels: Path, tmp_path: Path) -> None:
    cfg = copy.deepcopy(PRESETS["1.7b"])
    del cfg["rope_theta"]  # transformers 5 form
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "m.json"
    assert gen.main(["--config", str(tmp_path / "config.json"), "--kernels", str(fake_kernels), "--out", str(out),
                     "--model", "qwen3-1.7b"]) == 0
    # the CLI's defaults: --pdl, rope-cluster, the screened lm_head
    assert out.read_bytes() == ks.dump(_build("1.7b", fake_kernels, pdl=True, decode_attention="rope-cluster",
                                              lm_head="screened"))


# ------------------------------------------------------------------ the CLI's answers to bad input


def _cli_error(capsys, argv: list[str], code: int = 1) -> str:
    """gen.main's exit code and its one stderr line (no traceback; argparse's usage line aside)."""
    try:
        rc = gen.main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    assert rc == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_cli_out_path_errors(fake_kernels: Path, tmp_path: Path, capsys) -> None:
    """--out a directory was an IsADirectoryError traceback that left OUT.tmp behind; under a file, a FileExistsError."""
    k = ["--preset", "0.6b", "--kernels", str(fake_kernels)]
    line = _cli_error(capsys, [*k, "--out", str(tmp_path)])
    assert line == f"gen_qwen3: error: --out {tmp_path}: a directory; give the manifest's file name (e.g. " \
                   f"{tmp_path / 'qwen3-0.6b.json'})"
    assert not Path(str(tmp_path) + ".tmp").exists()
    (tmp_path / "f").write_text("x")
    line = _cli_error(capsys, [*k, "--out", str(tmp_path / "f" / "sub" / "m.json")])
    assert line == f"gen_qwen3: error: --out {tmp_path / 'f' / 'sub' / 'm.json'}: {tmp_path / 'f'} is a file, not a directory"
    # a missing directory is made
    assert gen.main([*k, "--out", str(tmp_path / "new" / "dir" / "m.json")]) == 0
    assert [p.name for p in (tmp_path / "new" / "dir").iterdir()] == ["m.json"]


@pytest.mark.parametrize("value", ["0", "-5"])
def test_cli_max_positions_must_be_positive(fake_kernels: Path, tmp_path: Path, capsys, value: str) -> None:
    """0 was silently the config's default, -5 wrote a manifest with a [-5, 128] rotary table (rc 0)."""
    line = _cli_error(capsys, ["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(tmp_path / "m.json"),
                               "--max-positions", value])
    assert line == f"gen_qwen3: error: --max-positions {value}: must be >= 1 (omit it for the config's " \
                   "max_position_embeddings, 40960)"
    assert not (tmp_path / "m.json").exists()
    assert _build("0.6b", fake_kernels, max_positions=1).buffers["rope.cos_sin"].shape == [1, 128]


def test_cli_empty_model_label_is_refused(fake_kernels: Path, tmp_path: Path, capsys) -> None:
    """--model "" was silently replaced by the default label."""
    line = _cli_error(capsys, ["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(tmp_path / "m.json"),
                               "--model", ""])
    assert line == "gen_qwen3: error: --model '': an empty label (omit it for 'qwen3-0.6b')"


def test_cli_cuda_attention_contradicting_decode_attention(fake_kernels: Path, tmp_path: Path, capsys) -> None:
    """--cuda-attention --decode-attention triton silently took the last one given."""
    base = ["--preset", "0.6b", "--kernels", str(fake_kernels), "--no-pdl"]
    for flags in (["--cuda-attention", "--decode-attention", "triton"], ["--decode-attention", "cluster", "--cuda-attention"]):
        line = _cli_error(capsys, [*base, "--out", str(tmp_path / "x.json"), *flags], code=2)
        assert "--cuda-attention (= --decode-attention cuda) contradicts --decode-attention " in line
    assert not (tmp_path / "x.json").exists()
    assert gen.main([*base, "--out", str(tmp_path / "a.json"), "--cuda-attention", "--decode-attention", "cuda"]) == 0
    assert gen.main([*base, "--out", str(tmp_path / "b.json"), "--decode-attention", "cuda"]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_cli_damaged_kernel_index(fake_kernels: Path, tmp_path: Path, capsys) -> None:
    """A cut-short or foreign index.json was a JSONDecodeError / AttributeError traceback; --kernels naming
    the index file itself, a NotADirectoryError."""
    d = tmp_path / "k"
    d.mkdir()
    text = (fake_kernels / "index.json").read_text()
    argv = ["--preset", "0.6b", "--kernels", str(d), "--out", str(tmp_path / "m.json")]
    for content, says in ((text[:1000], "not JSON (Expecting"), ("[]", "not a kernel index (a JSON list, not an object)"),
                          ('{"format": 1, "target": "sm_90"}', "no `kernels` object"),
                          ('{"format": 1, "target": "sm_90", "kernels": {"x": 3}}', "kernel `x` is not an object")):
        (d / "index.json").write_text(content)
        line = _cli_error(capsys, argv)
        assert line.startswith(f"gen_qwen3: error: {d / 'index.json'}: {says}"), line
        assert line.endswith(f"rebuild it with tools/build_kernels.py --out {d}")
    line = _cli_error(capsys, [*argv[:3], str(fake_kernels / "index.json"), *argv[4:]])
    assert line == f"gen_qwen3: error: {fake_kernels / 'index.json'}: a file; --kernels is the kernels directory " \
                   f"({fake_kernels})"


# ------------------------------------------------------------------ the exporter writes what the manifest binds


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no-pdl"])
@pytest.mark.parametrize("preset", GEOMETRIES)
def test_screened_lm_head(preset: str, fake_kernels: Path, pdl: bool) -> None:
    """--lm-head screened: decode ends in one call of the screened op (screen, pick, argmax_reduce: grids and
    counts consistent), its derived weights declared, no `logits`, no dense lm_head op or argmax op; it verifies."""
    cfg = Qwen3Config.preset(preset)
    V, H = cfg.vocab_size, cfg.hidden_size
    m = _build(preset, fake_kernels, lm_head="screened", pdl=pdl, decode_attention="rope-cluster" if pdl else "cluster")
    text = ks.dump(m)
    assert kern_verify.verify(ks.load(text), text.decode()) == []
    calls = m.programs["decode"].calls
    assert [c.label for c in calls[-2:]] == [f"l{cfg.num_hidden_layers - 1}.down_proj_add", "norm_lm_head_argmax"]
    last = calls[-1]
    assert last.op == gen.LM_HEAD_SCREENED_OP
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    assert [a.buf for a in last.args] == ["residual", "model.norm.weight", "lm_head.screen.q8", "lm_head.screen.rows",
                                          head, "next_token"]
    assert "logits" not in m.buffers and "gemv_norm_lm_head" not in m.ops and "argmax" not in m.ops
    assert (m.buffers["lm_head.screen.q8"].dtype, m.buffers["lm_head.screen.q8"].shape) == ("i8", [V, H])
    assert (m.buffers["lm_head.screen.rows"].dtype, m.buffers["lm_head.screen.rows"].shape) == ("f32", [V, 4])
    op = m.ops[gen.LM_HEAD_SCREENED_OP]
    screen, pick, red = op.impl.launches
    # short rows (k ≤ 1,024: 0.6B) take the 8-rows-per-warp entry, the others the default one; rows of one load stage
    # (k ≤ 2,560) in the row-group form that makes the screen one wave of 2 × 132 blocks (the vocabulary's 2,374
    # groups of 64 rows in 9s, 4,748 of 32 in 18s), longer rows one group per block
    entry, grid = (("kern_lmhead_screen_m1_r8_p9", 264) if H <= 1024 else ("kern_lmhead_screen_m1_p18", 264)
                   if H <= 2560 else ("kern_lmhead_screen_m1", 4748))
    assert [la.entry for la in op.impl.launches] == [entry, "kern_lmhead_pick_m1", "argmax_reduce"]
    assert all(bool(la.pdl) == pdl for la in op.impl.launches) and red.module == ("argmax_pdl" if pdl else "argmax")
    nb1, parts = math.ceil(V / (64 if H <= 1024 else 32)), math.ceil(V / 1024)
    assert (screen.grid, pick.grid, red.grid) == ([grid, 1, 1], [parts, 1, 1], [1, 1, 1])
    assert pick.args[gen.load_index(fake_kernels)["kern_lmhead_pick_m1"].param_names.index("nb1")].i32 == nb1
    assert (screen.shared_mem, pick.shared_mem) == (4 * H, 2 * H)
    assert op.impl.scratch["bpart"].shape == [nb1] and op.impl.scratch["partial"].shape == [parts]
    assert op.impl.scratch["keys"] == ks.Scratch(dtype="u16", shape=[V])
    # the screened lm_head is the default (the API's, so the CLI's)
    assert gen.DEFAULT_LM_HEAD == "screened"
    kw = {"pdl": pdl, "decode_attention": "rope-cluster" if pdl else "cluster"}
    assert gen.build_manifest(cfg, gen.load_index(fake_kernels), **kw) == m
    # the dense manifest (--lm-head dense) has the dense ops and no screen weights; the rest is the same
    dense = _build(preset, fake_kernels, lm_head="dense", **kw)
    assert "logits" in dense.buffers and "lm_head.screen.q8" not in dense.buffers
    assert {"gemv_norm_lm_head", "argmax"} <= set(dense.ops) and gen.LM_HEAD_SCREENED_OP not in dense.ops
    assert dense.programs["decode"].calls[:-2] == calls[:-1] and dense.programs["prefill"] == m.programs["prefill"]


def test_lm_screen_groups_rule() -> None:
    """Row groups per screen block: the fewest that make one wave of two blocks per SM; at least 1."""
    assert [gen.lm_screen_groups(n) for n in (4748, 2374, 264, 265, 1)] == [18, 9, 1, 2, 1]
    assert gen.lm_screen_groups(4748, sms=114) == 21


def test_lm_screen_entry_without_group_forms(fake_kernels: Path, tmp_path: Path) -> None:
    """An index without the `_pP` forms (built before them) gives the one-group entry, on its own grid."""
    idx = json.loads((fake_kernels / "index.json").read_text())
    kernels = idx["kernels"] if "kernels" in idx else idx
    for name in ("kern_lmhead_screen_m1_p18", "kern_lmhead_screen_m1_r8_p9"):
        kernels.pop(name)
    old = tmp_path / "old"
    shutil.copytree(fake_kernels, old)
    (old / "index.json").write_text(json.dumps(idx))
    for preset, entry, grid in (("4b", "kern_lmhead_screen_m1", 4748), ("0.6b", "kern_lmhead_screen_m1_r8", 2374)):
        screen = _build(preset, old, lm_head="screened").ops[gen.LM_HEAD_SCREENED_OP].impl.launches[0]
        assert (screen.entry, screen.grid) == (entry, [grid, 1, 1]), preset


def test_lm_screen_entry_keeps_long_rows_on_one_group(fake_kernels: Path) -> None:
    """Rows of more than one load stage (hidden 4,096 and 5,120: 8B, 14B, 32B) keep the one-group screen entry: the
    row-group forms were measured on one-stage rows only."""
    for preset in ("8b", "14b"):
        screen = _build(preset, fake_kernels, lm_head="screened").ops[gen.LM_HEAD_SCREENED_OP].impl.launches[0]
        assert (screen.entry, screen.grid) == ("kern_lmhead_screen_m1", [4748, 1, 1]), preset


def test_screened_lm_head_grid_checked(fake_kernels: Path) -> None:
    """check_wiring refuses a screen grid that does not match its entry's row groups per block: the `_p18` form on
    the one-group grid (18 times too many blocks) and the one-group entry on the `_p18` grid (rows left unscreened)."""
    cfg = Qwen3Config.preset("4b")
    index = gen.load_index(fake_kernels)
    for entry, grid, want in (("kern_lmhead_screen_m1_p18", 4748, 264), ("kern_lmhead_screen_m1", 264, 4748)):
        m = _build("4b", fake_kernels, lm_head="screened")
        screen = m.ops[gen.LM_HEAD_SCREENED_OP].impl.launches[0]
        screen.entry, screen.grid = entry, [grid, 1, 1]
        with pytest.raises(gen.WiringError) as e:
            gen.check_wiring(m, cfg, gen.make_layout(cfg), index)
        assert f"`{entry}`: grid [{grid}, 1, 1], expected [{want}, 1, 1]" in str(e.value), entry


def test_screened_lm_head_wiring_checked(fake_kernels: Path) -> None:
    """check_wiring catches a screened op whose launches disagree (the pick's nb1, the reduce's parts)."""
    cfg = Qwen3Config.preset("4b")
    index = gen.load_index(fake_kernels)
    m = _build("4b", fake_kernels, lm_head="screened")
    op = m.ops[gen.LM_HEAD_SCREENED_OP]
    pick = op.impl.launches[1]
    k = index["kern_lmhead_pick_m1"]
    pick.args[k.param_names.index("nb1")] = ks.Arg(i32=7)
    op.impl.launches[2].grid = [2, 1, 1]
    op.impl.scratch["bpart"] = ks.Scratch(dtype="u32", shape=[100])
    with pytest.raises(gen.WiringError) as e:
        gen.check_wiring(m, cfg, gen.make_layout(cfg), index)
    assert "nb1 = 7, expected 4748" in str(e.value) and "grid [2, 1, 1], expected [1, 1, 1]" in str(e.value)
    assert "scratch `bpart` must be u32 [4748]" in str(e.value)


def test_screen_constants_match_the_source() -> None:
    """The catalog's rows per warp, loads per stage, row groups per block and pick rows are lm_head_screen.cu's own
    (SCREEN_ENTRY's arguments, LS_PICK_ROWS): the generator sizes grids and counts from them, so a mismatch would
    leave rows unread."""
    import catalog

    src = (ROOT / "tools" / "kernels-src" / "lm_head_screen.cu").read_text()
    entries = {name: (int(r), int(u), int(p)) for name, r, u, p in
               re.findall(r"^SCREEN_ENTRY\((\w+), (\d+), (\d+), (\d+), \d+\)", src, re.M)}
    kernels = {k.name: k for k in catalog._lm_head_screen_kernels()}
    assert entries and set(entries) == {n for n in kernels if "screen" in n}
    for name, (rows, loads, passes) in entries.items():
        cx = kernels[name].constexprs
        assert (cx["ROWS_PER_WARP"], cx["LOADS_PER_STAGE"], cx["PASSES"], cx["WARPS"]) == (rows, loads, passes, 8), \
            name
    pick_rows = int(re.search(r"^#define LS_PICK_ROWS (\d+)", src, re.M).group(1))
    assert kernels["kern_lmhead_pick_m1"].constexprs["PICK_ROWS"] == pick_rows


def test_cli_lm_head_option(fake_kernels: Path, tmp_path: Path, capsys) -> None:
    """--lm-head screened (the default) and dense; each says what its weights file needs and how to export it."""
    out = tmp_path / "m.json"
    for flags in ([], ["--lm-head", "screened"]):
        assert gen.main(["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(out), *flags]) == 0
        assert "lm_head.screen.q8" in ks.load(out).buffers, flags
        printed = capsys.readouterr().out  # the weights file it needs, and that the exporter's default writes it
        assert ("note: its weights file must hold lm_head.screen.q8 and lm_head.screen.rows (the screened lm_head): "
                "`tools/export_weights.py CKPT --out W.safetensors` writes them by default") in printed, flags
    assert gen.main(["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(out), "--lm-head", "dense"]) == 0
    dense = ks.load(out)
    assert "lm_head.screen.q8" not in dense.buffers and "logits" in dense.buffers
    assert "--no-screened-head" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gen.main(["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(out), "--lm-head", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err


@pytest.mark.parametrize("lm_head", ["dense", "screened"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_exported_weights_are_the_manifest_weights(tmp_path: Path, tied: bool, lm_head: str) -> None:
    """Names, dtypes and shapes of tools/export_weights.py's output == the manifest's weight buffers (the dense
    lm_head's manifest with an export without the screened head's tensors, the screened one's with them)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_export_weights import TINY, hf_tensors, read_export, write_checkpoint

    hf = TINY | {"hidden_size": 256, "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 256,
                 "tie_word_embeddings": tied}
    ckpt = write_checkpoint(tmp_path / "ckpt", hf, hf_tensors(hf))
    gen_qwen3_index = write_fake_index(tmp_path / "kernels", [str(ckpt / "config.json")])
    out = tmp_path / "m.json"
    assert gen.main(["--config", str(ckpt), "--kernels", str(gen_qwen3_index), "--out", str(out),
                     "--lm-head", lm_head]) == 0
    m = ks.load(out)
    assert kern_verify.verify(m) == []

    import export_weights

    export_weights.export(ckpt, tmp_path / "w.safetensors", progress=False, screened_head=lm_head == "screened")
    got, _ = read_export(tmp_path / "w.safetensors")
    dt = {"bf16": "uint16", "f32": "float32", "i8": "int8"}
    weights = {n: (dt[b.dtype], b.shape) for n, b in m.buffers.items() if b.class_ == "weight"}
    assert weights == {n: (str(a.dtype), list(a.shape)) for n, a in got.items()}


# ------------------------------------------------------------------ the generator's own checks


def test_q_view_overlapping_k_trips_the_wiring_check(fake_kernels: Path) -> None:
    cfg = Qwen3Config.preset("4b")
    lay = gen.make_layout(cfg)
    bad = replace(lay, qkv=lay.qkv | {"q": replace(lay.qkv["q"], width=cfg.q_size + 128)})
    with pytest.raises(gen.WiringError, match=r"view `k` \[8192, 10240\) overlaps view `q` \[0, 8448\)"):
        gen.build_manifest(cfg, gen.load_index(fake_kernels), layout=bad)


def test_attention_reading_k_as_q_trips_the_wiring_check(fake_kernels: Path) -> None:
    cfg = Qwen3Config.preset("0.6b")
    index = gen.load_index(fake_kernels)
    lay = gen.make_layout(cfg)
    swapped = replace(lay, qkv={"q": lay.qkv["k"], "k": lay.qkv["q"], "v": lay.qkv["v"]})
    with pytest.raises(gen.WiringError) as e:
        gen.build_manifest(cfg, index, layout=swapped)
    msg = str(e.value)
    assert "view `q` is 1024 wide, but the qkv weight has 2048 `q` rows" in msg
    assert "views q|k|v must tile a qkv row in that order" in msg


def test_tampered_manifest_trips_the_wiring_check(fake_kernels: Path) -> None:
    cfg = Qwen3Config.preset("0.6b")
    # gemv.cu for every decode GEMV, whose ksplit and grid rules are tampered with below (the tensor-core entries'
    # rule: test_tensor_core_gemv_wiring_checked)
    m = _build("0.6b", fake_kernels, gemv="gemv-fma")
    lay = gen.make_layout(cfg)
    index = gen.load_index(fake_kernels)
    kof = gen.kernels_by_op(m, index)
    gen.check_wiring(m, cfg, lay, index)  # as built: clean

    def tampered(edit) -> str:
        t = ks.load(ks.dump(m))
        edit(t)
        with pytest.raises(gen.WiringError) as e:
            gen.check_wiring(t, cfg, lay, index)
        return str(e.value)

    def calls(t, prog="decode"):
        return {c.label: c for c in t.programs[prog].calls}

    # attention reads the k columns as q
    def q_at_k(t):
        calls(t)["l5.attn"].args[0] = ks.Arg(buf="qkv", offset=lay.qkv["k"].offset)
    assert "`l5.attn`: attention reads view `k` as q" in tampered(q_at_k)

    # layer 7 writes its KV into layer 6's block
    def kv_of_6(t):
        calls(t, "prefill")["l7.qk_norm_rope"].args[6] = ks.Arg(state="kv", offset=6 * 65536)
    assert "`l7.qk_norm_rope`: KV offset 393216 != layer 7's block at 458752" in tampered(kv_of_6)

    # layer 2 multiplies by layer 1's down projection
    def w_of_1(t):
        calls(t, "prefill")["l2.down_proj"].args[1] = ks.Arg(buf="model.layers.1.mlp.down_proj.weight")
        calls(t)["l2.down_proj_add"].args[1] = ks.Arg(buf="model.layers.1.mlp.down_proj.weight")
    msg = tampered(w_of_1)
    assert "uses weight `model.layers.1.mlp.down_proj.weight`, which is not a weight of layer 2" in msg
    assert ("programs.prefill: weight `model.layers.1.mlp.down_proj.weight` is used by "
            "['l1.down_proj', 'l2.down_proj']") in msg
    assert ("programs.decode: weight `model.layers.1.mlp.down_proj.weight` is used by "
            "['l1.down_proj_add', 'l2.down_proj_add']") in msg
    assert "buffer `model.layers.2.mlp.down_proj.weight` is declared but no call uses it" in msg

    # o_proj with n and k swapped
    def swapped_nk(t):
        a = calls(t, "prefill")["l4.o_proj"].args
        a[4], a[5] = a[5], a[4]
    assert ("`l4.o_proj`: gemm m=tokens n=2048 k=1024 does not fit a attn ['tokens', 2048], "
            "w model.layers.4.self_attn.o_proj.weight [1024, 2048], c h ['tokens', 1024]") in tampered(swapped_nk)

    # a page stride that is not 16 × bytes_per_token
    def stride(t):
        la = t.ops["attention_decode"].impl.launches[0]
        i = kof["attention_decode"][0].param_names.index("page_bytes")
        la.args[i] = ks.Arg(**{kof["attention_decode"][0].params[i]: 65536})
    assert "page_bytes 65536 != page stride 1835008" in tampered(stride)

    # an unaligned view offset into a 16-byte-specialised parameter
    def unaligned(t):
        calls(t, "prefill")["l0.act"].args[0] = ks.Arg(buf="gate_up", offset=8)
    msg = tampered(unaligned)
    assert "`gate_up` at byte offset 8: only qkv has views" in msg
    assert "`silu_and_mul` needs `gate_up` 16-byte aligned, gets offset 8" in msg

    # decode GEMV: the o projection multiplies by the down projection (wrong shape, and used twice)
    def o_by_down(t):
        calls(t)["l4.o_proj_add"].args[1] = ks.Arg(buf="model.layers.4.mlp.down_proj.weight")
    msg = tampered(o_by_down)
    assert ("`l4.o_proj_add`: `kern_gemv_residual_m1` w = `model.layers.4.mlp.down_proj.weight` [1024, 3072] does "
            "not fit n = 1024, k = 2048, M = 1 (wants [1024, 2048])") in msg

    # the MLP output lands in the residual stream through a non-residual op
    def silu_into_residual(t):
        calls(t)["l3.norm_gate_up_silu"].args[3] = ks.Arg(buf="residual")
    msg = tampered(silu_into_residual)
    assert ("programs.decode `l3.norm_gate_up_silu`: writes `residual` through `gemv_norm_silu_gate_up`; in decode "
            "only the embedding and the gemv_residual ops do") in msg
    assert "`kern_gemv_norm_silu_m1` y = `residual` ['tokens', 1024] does not fit n = 3072" in msg

    # the down projection writes into a scratch activation instead of adding into the residual
    def down_elsewhere(t):
        calls(t)["l5.down_proj_add"].args[2] = ks.Arg(buf="h")
    assert "`residual` is written by ['embed', 'l0.o_proj_add'" in tampered(down_elsewhere)

    # the norm prologue's shared memory is not M·k·2
    def smem(t):
        t.ops["gemv_norm_qkv"].impl.launches[0].shared_mem = 1024
    assert "ops.gemv_norm_qkv kernel `kern_gemv_norm_m1`: shared_mem 1024 != the 2048 bytes it needs" in tampered(smem)

    # ksplit changed without the grid, and a ksplit that does not divide the block's warps
    def ksplit(value):
        def edit(t):
            la = t.ops["gemv_residual_o_proj"].impl.launches[0]
            la.args[kof["gemv_residual_o_proj"][0].param_names.index("ksplit")] = ks.Arg(i32=value)
        return edit
    assert ("ops.gemv_residual_o_proj kernel `kern_gemv_residual_m1`: grid [128, 1, 1] != [64, 1, 1] (n = 1024, "
            "2 columns per warp group, ksplit 1)") in tampered(ksplit(1))
    assert "ksplit 3 must divide the block's 8 warps" in tampered(ksplit(3))

    # an unaligned view into a GEMV's 16-byte vector loads
    def gemv_unaligned(t):
        calls(t)["l0.o_proj_add"].args[0] = ks.Arg(buf="attn", offset=8)
    assert "`kern_gemv_residual_m1` needs `x` 16-byte aligned, gets offset 8" in tampered(gemv_unaligned)

    # a launch whose carveout is not its index entry's (the entry has none; and one that lost the entry's)
    def carveout(t):
        t.ops["gemv_residual_o_proj"].impl.launches[0].carveout = 50
    assert ("ops.gemv_residual_o_proj kernel `kern_gemv_residual_m1`: carveout 50 != its index entry's absent "
            "(ManifestBuilder.launch copies the entry's `carveout`)") in tampered(carveout)

    # an unused declaration
    def unused(t):
        t.buffers["spare"] = ks.Buffer(dtype="bf16", shape=[4], class_="workspace")
    assert "buffer `spare` is declared but no call uses it" in tampered(unused)

    # decode-only logits sized by the chunk bound
    def big_logits(t):
        t.buffers["logits"] = ks.Buffer(dtype="bf16", shape=["tokens", 151936], class_="workspace")
    assert "decode-only buffer `logits` is sized by a var" in tampered(big_logits)


def test_kernel_abi_drift_names_the_param(fake_kernels: Path, tmp_path: Path) -> None:
    index = json.loads((fake_kernels / "index.json").read_text())

    def with_index(edit) -> str:
        idx = copy.deepcopy(index)
        edit(idx["kernels"])
        d = tmp_path / f"k{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for f in fake_kernels.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        (d / "index.json").write_text(json.dumps(idx))
        with pytest.raises(gen.GenError) as e:
            gen.build_manifest(Qwen3Config.preset("4b"), gen.load_index(d))
        return str(e.value)

    def new_param(k):
        k["silu_and_mul"]["params"].insert(3, "i32")
        k["silu_and_mul"]["param_names"].insert(3, "stride")
    assert "kernel `silu_and_mul`, param `stride` (i32): not wired by the generator" in with_index(new_param)

    def renamed(k):
        k["embedding"]["param_names"][4] = "vocab_size"
    msg = with_index(renamed)
    assert "param `vocab_size` (i32): not wired" in msg

    def no_norm(k):
        del k["rms_norm_h2560"]
    assert "the kernel index has no `rms_norm_h2560`" in with_index(no_norm)

    def no_screen(k):  # an index built before lm_head_screen.cu existed: not a per-geometry kernel
        for name in gen.LM_SCREEN_ENTRIES:
            del k[name]
    msg = with_index(no_screen)
    assert "the kernel index has no `kern_lmhead_screen_m1` (the screened lm_head" in msg
    assert "--lm-head dense" in msg and "--geometry" not in msg

    def retyped(k):
        k["embedding"]["params"][0] = "in buffer<i32>"
    assert "param `ids` (in buffer<i32>): op param `ids` is `in buffer<i64>`" in with_index(retyped)


def test_presets_agree_with_the_kernel_build() -> None:
    """tools/qwen3_config.py and tools/kernels-src/geometries.py list the same six geometries."""
    import geometries as kgeom

    assert set(kgeom.PRESETS) == set(PRESETS)
    for name, g in kgeom.PRESETS.items():
        c = Qwen3Config.preset(name)
        for f in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "num_hidden_layers", "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings"):
            assert getattr(g, f) == getattr(c, f), (name, f)


def test_geometry_the_kernels_cannot_serve(fake_kernels: Path) -> None:
    cfg = replace(Qwen3Config.preset("4b"), num_attention_heads=8 * 17)
    with pytest.raises(gen.GenError, match=r"`qk_norm_rope_kv` handles at most 16 q heads per kv head \(BLOCK_G\)"):
        gen.build_manifest(cfg, gen.load_index(fake_kernels))
    cfg = replace(Qwen3Config.preset("4b"), head_dim=64)
    with pytest.raises(gen.GenError, match="compiled for head_dim 128; the config has head_dim 64"):
        gen.build_manifest(cfg, gen.load_index(fake_kernels))


def test_stale_index_is_refused(fake_kernels: Path, tmp_path: Path) -> None:
    d = tmp_path / "k"
    d.mkdir()
    for f in fake_kernels.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "embedding.cubin").write_bytes(b"rebuilt")
    with pytest.raises(gen.GenError, match="module `embedding.cubin` does not have the index's sha256"):
        gen.load_index(d)
    with pytest.raises(gen.GenError, match="no kernel index"):
        gen.load_index(tmp_path)


@pytest.mark.parametrize("value", [101, -1, 50.0, "0", True, [0]])
def test_index_carveout_must_be_an_int_percent(fake_kernels: Path, tmp_path: Path, value) -> None:
    """An index entry's `carveout` becomes the manifest launch's: anything but an int 0..100 (JSON: a float, a string,
    a bool) is refused at load, naming the file, the kernel and the value, with the way to rebuild the index."""
    index = json.loads((fake_kernels / "index.json").read_text())
    index["kernels"]["decode_attention_rope_cluster_pdl"]["carveout"] = value
    d = tmp_path / "k"
    d.mkdir()
    (d / "index.json").write_text(json.dumps(index))
    with pytest.raises(gen.GenError) as e:
        gen.load_index(d, check_files=False)
    assert str(e.value) == (f"{d / 'index.json'}: kernel `decode_attention_rope_cluster_pdl`: carveout {value!r} is not "
                            "an int percent 0..100 (the launch's preferred shared-memory carveout; absent: the driver's "
                            f"choice); rebuild it with tools/build_kernels.py --out {d}")


def test_index_carveout_reaches_the_launch(fake_kernels: Path, tmp_path: Path) -> None:
    """The generator copies each entry's carveout as it is (0 and 100 alike; absent stays absent) and adds none: an
    index that gives the qkv GEMV's entry 100 and takes the attention's away gives a manifest that says exactly that."""
    index = json.loads((fake_kernels / "index.json").read_text())
    index["kernels"]["kern_gemvtc_norm_m1"]["carveout"] = 100
    del index["kernels"]["decode_attention_rope_cluster_pdl"]["carveout"]
    d = tmp_path / "k"
    d.mkdir()
    (d / "index.json").write_text(json.dumps(index))
    m = gen.build_manifest(Qwen3Config.preset("4b"), gen.load_index(d, check_files=False))
    assert {(op, la.entry, la.carveout) for op, o in m.ops.items() for la in o.impl.launches
            if la.carveout is not None} == {("gemv_norm_qkv", "kern_gemvtc_norm_m1", 100)}
    assert kern_verify.verify(m) == []


# ------------------------------------------------------------------ the committed examples

EXAMPLES = {"0.6b": ROOT / "examples" / "qwen3-0.6b.json", "4b": ROOT / "examples" / "qwen3-4b.json"}


@pytest.mark.parametrize("preset", list(EXAMPLES))
def test_example_regenerates_byte_identically(preset: str, built_kernels: Path, tmp_path: Path) -> None:
    out = tmp_path / EXAMPLES[preset].name
    gen_cmd = [sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", preset, "--kernels"]
    subprocess.run(gen_cmd + [str(built_kernels), "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == EXAMPLES[preset].read_bytes(), (
        f"examples/{EXAMPLES[preset].name} is stale; regenerate it (examples/README.md):\n"
        f"  uv run python tools/gen_qwen3.py --preset {preset} --kernels build/kernels --out examples/{out.name}"
    )


@pytest.mark.parametrize("preset", list(EXAMPLES))
def test_example_verifies_with_kernels(preset: str, built_kernels: Path) -> None:
    cli = Path(sys.executable).parent / "kern-verify"  # the console script of this environment
    r = subprocess.run([str(cli), str(EXAMPLES[preset]), "--kernels", str(built_kernels)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    diags = kern_verify.verify_path(EXAMPLES[preset], kernels_dir=built_kernels)
    assert diags == [], "\n".join(map(str, diags))


# ------------------------------------------------------------------ --pdl: the whole decode chain


def decode_launches(m: ks.Manifest) -> list[tuple[str, int, ks.Launch]]:
    """(call label, launch index, launch) of every launch of the decode program, in order."""
    return [(c.label, i, la) for c in m.programs["decode"].calls for i, la in enumerate(m.ops[c.op].impl.launches)]


#: Modules of one form, PDL-ready (griddepcontrol in their entries; no `_pdl` twin): the decode GEMVs and the screened
#: lm_head's screen and pick.
PDL_READY = ("gemv.cubin", "gemv_p2.cubin", "gemv_tc.cubin", "gemv_persist.cubin", "lm_head_screen.cubin")


def check_pdl_manifest(m: ks.Manifest) -> None:
    """Every decode launch but the first (the embedding) has pdl and runs a PDL kernel form; prefill none."""
    launches = decode_launches(m)
    assert launches[0][0] == "embed" and not launches[0][2].pdl
    assert all(la.pdl for _, _, la in launches[1:]), [(lb, i) for lb, i, la in launches[1:] if not la.pdl]
    for label, i, la in launches[1:]:
        mod = m.modules[la.module].source
        assert mod in PDL_READY or mod.endswith("_pdl.cubin"), (label, i, mod)
    assert not any(m.ops[c.op].impl.launches[i].pdl for c in m.programs["prefill"].calls
                   for i in range(len(m.ops[c.op].impl.launches)))
    # decode_attention_cluster_pdl reads its first K|V pages before its wait (decode_attention.cu's header): the
    # launch right before it must be qk_norm_rope_kv_pdl (writes only the current token's row, triggers after its wait)
    for (_, _, prev), (label, _, la) in zip(launches, launches[1:]):
        if m.modules[la.module].source == "decode_attention_pdl.cubin" and la.entry == "decode_attention_cluster":
            assert (m.modules[prev.module].source, prev.entry) == ("qk_norm_rope_kv_pdl.cubin", "qk_norm_rope_kv"), label


@pytest.mark.parametrize("preset", GEOMETRIES)
def test_pdl_every_geometry(preset: str, fake_kernels: Path) -> None:
    """--pdl for every geometry: verifies (no diagnostic at all: no E0091 warning either) and every
    decode launch but the first is a PDL launch; prefill is the default manifest's."""
    m = _build(preset, fake_kernels, pdl=True)
    diags = kern_verify.verify(m)
    assert diags == [], "\n".join(map(str, diags))
    check_pdl_manifest(m)
    d = _build(preset, fake_kernels)
    assert d.programs["prefill"] == m.programs["prefill"]
    assert [c.label for c in d.programs["decode"].calls] == [c.label for c in m.programs["decode"].calls]
    assert set(m.ops) - set(d.ops) == {"qk_norm_rope_kv_pdl"}


def test_pdl_needs_the_pdl_build(tmp_path: Path) -> None:
    d = tmp_path / "k"
    write_fake_index(d, ["0.6b"])
    idx = json.loads((d / "index.json").read_text())
    idx["kernels"] = {n: k for n, k in idx["kernels"].items() if not n.endswith("_pdl")}
    (d / "index.json").write_text(json.dumps(idx))
    _build("0.6b", d)  # pdl=False (the CLI's --no-pdl) does not need them
    with pytest.raises(gen.GenError, match=r"needed by --pdl, the default\); rebuild .* or pass --no-pdl"):
        _build("0.6b", d, pdl=True)


def test_persistent_gemv_needs_the_gemvp_entries(tmp_path: Path) -> None:
    """An index without gemv_persist.cu's entries: --gemv persistent says which flag needs them; the default
    (--gemv gemv) does not need them, with or without --pdl."""
    d = tmp_path / "k"
    write_fake_index(d, ["0.6b", "4b"])
    idx = json.loads((d / "index.json").read_text())
    idx["kernels"] = {n: k for n, k in idx["kernels"].items() if not n.startswith("kern_gemvp")}
    (d / "index.json").write_text(json.dumps(idx))
    _build("0.6b", d, pdl=True)
    _build("4b", d)
    with pytest.raises(gen.GenError, match=r"no `kern_gemvp_norm_m1` .*--gemv persistent.* or pass --gemv gemv"):
        _build("0.6b", d, pdl=True, gemv="persistent")


@pytest.fixture(scope="session")
def built_kernels_pdl(built_kernels: Path) -> Path:
    """The real kernels of the example geometries with the PDL forms: build_kernels.py's default build."""
    return built_kernels


@pytest.mark.parametrize("preset", list(EXAMPLES))
def test_pdl_manifest_verifies_with_kernels(preset: str, built_kernels_pdl: Path, tmp_path: Path) -> None:
    """gen_qwen3.py --pdl on the real --pdl build: kern-verify --kernels finds nothing (E0088: every pdl
    entry contains griddepcontrol.wait); it is the CLI's default, so the committed example; --no-pdl verifies too."""
    out = tmp_path / f"pdl-{preset}.json"
    gen_cmd = [sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", preset, "--kernels",
               str(built_kernels_pdl)]
    subprocess.run(gen_cmd + ["--out", str(out), "--pdl"], check=True, capture_output=True)
    cli = Path(sys.executable).parent / "kern-verify"
    r = subprocess.run([str(cli), str(out), "--kernels", str(built_kernels_pdl)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    diags = kern_verify.verify_path(out, kernels_dir=built_kernels_pdl)
    assert diags == [], "\n".join(map(str, diags))
    check_pdl_manifest(ks.load(out.read_bytes()))
    default = tmp_path / f"default-{preset}.json"
    subprocess.run(gen_cmd + ["--out", str(default)], check=True, capture_output=True)
    assert default.read_bytes() == out.read_bytes() == EXAMPLES[preset].read_bytes()
    plain = tmp_path / f"plain-{preset}.json"
    subprocess.run(gen_cmd + ["--out", str(plain), "--no-pdl"], check=True, capture_output=True)
    assert kern_verify.verify_path(plain, kernels_dir=built_kernels_pdl) == []
    assert not any(la.pdl for op in ks.load(plain.read_bytes()).ops.values() for la in op.impl.launches)


# ------------------------------------------------------------------ --fused-attention: one-launch decode attention


def check_fused_manifest(m: ks.Manifest, d: ks.Manifest, cfg: Qwen3Config, pdl: bool) -> None:
    """`m` (--fused-attention) against `d` (the same without it): only decode attention differs. It is one
    launch of the fused kernel with the interface param `counters`; each layer passes the state
    `attn_counters` at its own offset l*NKV*4; the state is L*NKV*4 bytes per sequence, `seqs` max 1."""
    L, NKV = cfg.num_hidden_layers, cfg.num_key_value_heads
    assert m.programs["prefill"] == d.programs["prefill"]
    assert [c.label for c in m.programs["decode"].calls] == [c.label for c in d.programs["decode"].calls]
    assert set(m.ops) == set(d.ops)
    assert {n: o for n, o in m.ops.items() if n != "attention_decode"} == \
        {n: o for n, o in d.ops.items() if n != "attention_decode"}
    assert m.vars == {**d.vars, "seqs": ks.Var(max=1)}
    assert m.states == {**d.states, "attn_counters": ks.State(bytes_per_seq=L * NKV * 4)}
    op, old = m.ops["attention_decode"], d.ops["attention_decode"]
    assert op.params == old.params[:4] + ["inout ptr"] + old.params[4:]
    assert op.impl.scratch == old.impl.scratch
    (la,) = op.impl.launches
    assert la.entry == "paged_decode_attention_fused" and bool(la.pdl) == pdl
    assert m.modules[la.module].source == "paged_decode_attention_fused" + ("_pdl" if pdl else "") + ".cubin"
    assert la.grid == old.impl.launches[0].grid  # the same splits
    offsets = []
    for c, c0 in zip(m.programs["decode"].calls, d.programs["decode"].calls):
        if c.op != "attention_decode":
            assert c == c0
            continue
        assert c.args[:4] + c.args[5:] == c0.args
        assert c.args[4].state == "attn_counters"
        offsets.append(c.args[4].offset)
    assert offsets == [l * NKV * 4 for l in range(L)]
    launches = {name: len(o.impl.launches) for name, o in m.ops.items()}
    assert sum(launches[c.op] for c in m.programs["decode"].calls if c.label.startswith("l3.")) == 6


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("preset", GEOMETRIES)
def test_fused_attention_every_geometry(preset: str, pdl: bool, fake_kernels: Path) -> None:
    """--fused-attention (with and without --pdl) for every geometry: verifies with no diagnostic at all
    (every declaration used: the state, the var `seqs`), and only decode attention changes."""
    cfg = Qwen3Config.preset(preset)
    m = _build(preset, fake_kernels, fused_attention=True, pdl=pdl)
    diags = kern_verify.verify(m)
    assert diags == [], "\n".join(map(str, diags))
    check_fused_manifest(m, _build(preset, fake_kernels, pdl=pdl, decode_attention="triton"), cfg, pdl)
    if pdl:
        check_pdl_manifest(m)


def test_fused_attention_needs_the_fused_build(tmp_path: Path) -> None:
    d = tmp_path / "k"
    write_fake_index(d, ["0.6b"])
    idx = json.loads((d / "index.json").read_text())
    idx["kernels"] = {n: k for n, k in idx["kernels"].items() if "fused" not in n}
    (d / "index.json").write_text(json.dumps(idx))
    _build("0.6b", d)  # the default manifest does not need it
    _build("0.6b", d, pdl=True)
    with pytest.raises(gen.GenError, match="build_kernels.py --fused-attention"):
        _build("0.6b", d, fused_attention=True)
    with pytest.raises(gen.GenError, match="--fused-attention --pdl"):
        _build("0.6b", d, fused_attention=True, pdl=True)


def test_fused_attention_counters_wiring(fake_kernels: Path) -> None:
    """Two layers sharing counters (or counters anywhere but decode attention) trip the wiring check."""
    cfg = Qwen3Config.preset("0.6b")
    index = gen.load_index(fake_kernels)
    m = _build("0.6b", fake_kernels, fused_attention=True)
    t = copy.deepcopy(m)
    call = next(c for c in t.programs["decode"].calls if c.label == "l2.attn")
    call.args[4] = ks.Arg(state="attn_counters", offset=1 * 8 * 4)  # layer 1's counters
    with pytest.raises(gen.WiringError, match="counters offset 32 != layer 2's at 64"):
        gen.check_wiring(t, cfg, gen.make_layout(cfg), index)
    t = copy.deepcopy(m)
    t.states["attn_counters"] = ks.State(bytes_per_seq=8)
    with pytest.raises(gen.WiringError, match="attn_counters"):
        gen.check_wiring(t, cfg, gen.make_layout(cfg), index)


@pytest.fixture(scope="session")
def built_kernels_fused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real kernels of the example geometries with the opt-in forms (--fused-attention --pdl)."""
    d = tmp_path_factory.mktemp("kernels-fused")
    cmd = [sys.executable, str(ROOT / "tools" / "build_kernels.py"), "--out", str(d), "-q", "--fused-attention", "--pdl"]
    subprocess.run(cmd + [a for g in EXAMPLES for a in ("--geometry", g)], check=True)
    return d


@pytest.mark.parametrize("preset", list(EXAMPLES))
def test_fused_attention_manifest_verifies_with_kernels(preset: str, built_kernels_fused: Path, tmp_path: Path) -> None:
    """gen_qwen3.py --fused-attention [--pdl] on the real build: kern-verify --kernels finds nothing (no error,
    no warning: the fused launch's params match the cubin's, the `_pdl` entry waits); without the flags the
    same index still gives the committed example byte for byte."""
    gen_cmd = [sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", preset, "--kernels",
               str(built_kernels_fused)]
    cli = Path(sys.executable).parent / "kern-verify"
    for flags in (["--fused-attention", "--no-pdl"], ["--fused-attention"]):
        out = tmp_path / f"{'-'.join(f.strip('-') for f in flags)}-{preset}.json"
        subprocess.run(gen_cmd + ["--out", str(out), *flags], check=True, capture_output=True)
        r = subprocess.run([str(cli), str(out), "--kernels", str(built_kernels_fused)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        diags = kern_verify.verify_path(out, kernels_dir=built_kernels_fused)
        assert diags == [], "\n".join(map(str, diags))
        m = ks.load(out.read_bytes())
        assert m.ops["attention_decode"].impl.launches[0].entry == "paged_decode_attention_fused"
    plain = tmp_path / f"plain-{preset}.json"
    subprocess.run(gen_cmd + ["--out", str(plain)], check=True, capture_output=True)
    assert plain.read_bytes() == EXAMPLES[preset].read_bytes()


# ------------------------------------------------------------------ --decode-attention: the impls of attention_decode


def check_decode_attention_impl(m: ks.Manifest, t: ks.Manifest, cfg: Qwen3Config, impl: str, pdl: bool) -> None:
    """`m` (--decode-attention impl) against `t` (the same with triton): only the impl of `attention_decode`
    differs (its interface, every call, every other op, state and var are the same); its launches, grids,
    literals and scratch are the impl's."""
    NQ, NKV = cfg.num_attention_heads, cfg.num_key_value_heads
    assert m.programs == t.programs and m.states == t.states and m.vars == t.vars and m.buffers == t.buffers
    assert {n: o for n, o in m.ops.items() if n != "attention_decode"} == \
        {n: o for n, o in t.ops.items() if n != "attention_decode"}
    op = m.ops["attention_decode"]
    assert op.params == t.ops["attention_decode"].params
    sfx = "_pdl" if pdl else ""
    assert all(bool(la.pdl) == pdl for la in op.impl.launches)
    if impl == "cluster":
        (la,) = op.impl.launches
        assert la.entry == "decode_attention_cluster" and la.grid == [NKV, gen.CLUSTER_SPLITS, 1]
        assert m.modules[la.module].source == f"decode_attention{sfx}.cubin"
        assert op.impl.scratch == {}
        assert [a.param for a in la.args[:5]] == [0, 1, 2, 3, 4]
    else:
        split, merge = op.impl.launches
        S = gen.CUDA_DECODE_SPLITS
        assert (split.entry, merge.entry) == ("decode_attention_split", "decode_attention_merge")
        assert split.module == merge.module and m.modules[split.module].source == f"decode_attention{sfx}.cubin"
        assert split.grid == [NKV, S, 1] and merge.grid == [NQ, 1, 1]
        assert op.impl.scratch == {"part_acc": ks.Scratch(dtype="f32", shape=[NQ * S * 128]),
                                   "part_ml": ks.Scratch(dtype="f32", shape=[NQ * S * 2])}
        assert [a.param for a in split.args[:4]] == [0, 1, 2, 3]
        assert [a.scratch for a in split.args[4:6]] == ["part_acc", "part_ml"]
        assert [a.scratch for a in merge.args[:2]] == ["part_acc", "part_ml"]
        assert [a.param for a in merge.args[2:4]] == [3, 4]  # seq_lens, out
        assert [a.literal for a in merge.args[4:]] == [NQ, S]  # num_q_heads, num_splits = the split grid.y


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("impl", ["cuda", "cluster"])
@pytest.mark.parametrize("preset", GEOMETRIES)
def test_decode_attention_impls_every_geometry(preset: str, impl: str, pdl: bool, fake_kernels: Path) -> None:
    """--decode-attention cuda / cluster (with and without --pdl) for every geometry: verifies with no
    diagnostic at all, and only the impl of `attention_decode` differs from the triton manifest."""
    cfg = Qwen3Config.preset(preset)
    m = _build(preset, fake_kernels, decode_attention=impl, pdl=pdl)
    diags = kern_verify.verify(m)
    assert diags == [], "\n".join(map(str, diags))
    check_decode_attention_impl(m, _build(preset, fake_kernels, decode_attention="triton", pdl=pdl), cfg, impl, pdl)
    if pdl:
        check_pdl_manifest(m)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("preset", GEOMETRIES)
def test_rope_attention_every_geometry(preset: str, pdl: bool, fake_kernels: Path) -> None:
    """--decode-attention rope-cluster: verifies with no diagnostic; prefill, buffers and states are the cluster
    manifest's; decode has 5 calls per layer (no `qk_norm_rope`), each layer's `attn` calls attention_decode_rope
    with exactly the args of the cluster manifest's qk_norm_rope call, then its attention call's block_table,
    seq_lens and out; one launch of decode_attention_rope_cluster (its `_pdl` form with --pdl), grid [NKV, 8, 1],
    the cluster launch's literals and eps; no attention_decode or qk_norm_rope_kv_pdl op is left."""
    cfg = Qwen3Config.preset(preset)
    m = _build(preset, fake_kernels, decode_attention="rope-cluster", pdl=pdl)
    c = _build(preset, fake_kernels, decode_attention="cluster", pdl=pdl)
    diags = kern_verify.verify(m)
    assert diags == [], "\n".join(map(str, diags))
    assert m.programs["prefill"] == c.programs["prefill"] and m.buffers == c.buffers and m.states == c.states
    assert "attention_decode" not in m.ops and "qk_norm_rope_kv_pdl" not in m.ops
    (la,) = m.ops[gen.ROPE_ATTENTION_OP].impl.launches
    (cla,) = c.ops["attention_decode"].impl.launches
    assert la.entry == "decode_attention_rope_cluster" and la.grid == [cfg.num_key_value_heads, gen.CLUSTER_SPLITS, 1]
    assert m.modules[la.module].source == f"decode_attention{'_pdl' if pdl else ''}.cubin" and bool(la.pdl) == pdl
    assert la.carveout == (0 if pdl else None) and cla.carveout is None  # the PDL module's entry has one (catalog)
    assert [a.param for a in la.args[:10]] == list(range(10))
    assert la.args[10:16] == cla.args[5:] and la.args[16].literal == cfg.rms_norm_eps
    calls = {call.label: call for call in c.programs["decode"].calls}
    got = m.programs["decode"].calls
    assert len(got) == len(calls) - cfg.num_hidden_layers
    for l in range(cfg.num_hidden_layers):
        layer = [call for call in got if call.label.startswith(f"l{l}.")]
        assert [call.label for call in layer] == [f"l{l}.{n}" for n in gen.DECODE_LAYER_CALLS if n != "qk_norm_rope"]
        attn = layer[1]
        assert attn.op == gen.ROPE_ATTENTION_OP
        assert attn.args == calls[f"l{l}.qk_norm_rope"].args + calls[f"l{l}.attn"].args[2:]
    if pdl:
        check_pdl_manifest(m)


def test_decode_attention_impl_errors(fake_kernels: Path) -> None:
    with pytest.raises(gen.GenError, match="--fused-attention is the Triton one-launch form"):
        _build("0.6b", fake_kernels, decode_attention="cuda", fused_attention=True)
    with pytest.raises(gen.GenError, match="decode attention `flash`"):
        _build("0.6b", fake_kernels, decode_attention="flash")
    cfg = replace(Qwen3Config.preset("4b"), num_attention_heads=8 * 9)  # G = 9 > MAX_G
    for impl in ("cuda", "cluster", "rope-cluster"):
        with pytest.raises(gen.GenError, match=r"handles at most 8 q heads per kv head \(MAX_G\)"):
            gen.build_manifest(cfg, gen.load_index(fake_kernels), decode_attention=impl)
    gen.build_manifest(cfg, gen.load_index(fake_kernels), decode_attention="triton")  # BLOCK_H = 16


def test_decode_attention_cli(fake_kernels: Path, tmp_path: Path) -> None:
    """--cuda-attention is --decode-attention cuda; --fused-attention alone keeps the Triton impl."""
    outs = {}
    for name, flags in {"alias": ["--cuda-attention"], "cuda": ["--decode-attention", "cuda"],
                        "fused": ["--fused-attention"], "default": []}.items():
        outs[name] = tmp_path / f"{name}.json"
        assert gen.main(["--preset", "0.6b", "--kernels", str(fake_kernels), "--out", str(outs[name]), *flags]) == 0
    assert outs["alias"].read_bytes() == outs["cuda"].read_bytes()
    fused = ks.load(outs["fused"].read_bytes())
    assert fused.ops["attention_decode"].impl.launches[0].entry == "paged_decode_attention_fused"
    default = ks.load(outs["default"].read_bytes())
    op, want = {"cuda": ("attention_decode", "decode_attention_split"),
                "cluster": ("attention_decode", "decode_attention_cluster"),
                "triton": ("attention_decode", "paged_decode_attention"),
                "rope-cluster": (gen.ROPE_ATTENTION_OP, "decode_attention_rope_cluster")}[gen.DEFAULT_DECODE_ATTENTION]
    assert default.ops[op].impl.launches[0].entry == want


@pytest.mark.parametrize("preset", GEOMETRIES)
def test_default_is_rope_cluster_pdl(preset: str, fake_kernels: Path) -> None:
    """The generator's defaults (--pdl, --decode-attention rope-cluster, --lm-head screened, as the examples): 5
    decode calls per layer, the attention prologue's decode work inside the attention's one launch (no qk_norm_rope
    call in decode, qk_norm_rope_kv only in prefill), one call of the screened lm_head at the end, the same prefill
    and the same other decode calls as `cluster`."""
    assert gen.DEFAULT_DECODE_ATTENTION == "rope-cluster"
    cfg = Qwen3Config.preset(preset)
    m = gen.build_manifest(cfg, gen.load_index(fake_kernels))
    diags = kern_verify.verify(m)
    assert diags == [], "\n".join(map(str, diags))
    check_pdl_manifest(m)
    L = cfg.num_hidden_layers
    per_layer = ["norm_qkv", "attn", "o_proj_add", "norm_gate_up_silu", "down_proj_add"]
    decode = [c.label for c in m.programs["decode"].calls]
    assert decode == ["embed"] + [f"l{l}.{s}" for l in range(L) for s in per_layer] + ["norm_lm_head_argmax"]
    assert m.programs["decode"].calls[-1].op == gen.LM_HEAD_SCREENED_OP and "logits" not in m.buffers
    assert {c.op for c in m.programs["decode"].calls if c.label.endswith(".attn")} == {gen.ROPE_ATTENTION_OP}
    assert m.ops[gen.ROPE_ATTENTION_OP].impl.launches[0].entry == "decode_attention_rope_cluster"
    assert m.ops[gen.ROPE_ATTENTION_OP].impl.launches[0].pdl
    # the attention's index entry's carveout (catalog.DA_ROPE_CARVEOUT, 0) on its launch, and on no other launch
    import catalog

    assert m.ops[gen.ROPE_ATTENTION_OP].impl.launches[0].carveout == catalog.DA_ROPE_CARVEOUT == 0
    assert [(op, i) for op, o in m.ops.items() for i, la in enumerate(o.impl.launches) if la.carveout is not None] \
        == [(gen.ROPE_ATTENTION_OP, 0)]
    assert ks.dump(m).count(b'"carveout"') == 1  # absent elsewhere, not null
    lost = ks.load(ks.dump(m))
    lost.ops[gen.ROPE_ATTENTION_OP].impl.launches[0].carveout = None
    with pytest.raises(gen.WiringError, match=rf"ops.{gen.ROPE_ATTENTION_OP} kernel `decode_attention_rope_cluster_pdl`: "
                                              r"carveout absent != its index entry's 0"):
        gen.check_wiring(lost, cfg, gen.make_layout(cfg), gen.load_index(fake_kernels))
    cl = _build(preset, fake_kernels, pdl=True, lm_head="screened")
    assert m.programs["prefill"] == cl.programs["prefill"]
    assert [c for c in m.programs["decode"].calls if not c.label.endswith(".attn")] == \
        [c for c in cl.programs["decode"].calls if not c.label.endswith((".attn", ".qk_norm_rope"))]


@pytest.mark.parametrize("preset", list(EXAMPLES))
def test_decode_attention_impls_verify_with_kernels(preset: str, built_kernels: Path, tmp_path: Path) -> None:
    """Every impl on the real default build (which has both decode attentions): kern-verify --kernels finds
    nothing (the launches' params match the cubins' parameter tables)."""
    for impl in gen.DECODE_ATTENTION_IMPLS:
        out = tmp_path / f"{impl}-{preset}.json"
        assert gen.main(["--preset", preset, "--kernels", str(built_kernels), "--out", str(out),
                         "--decode-attention", impl]) == 0
        diags = kern_verify.verify_path(out, kernels_dir=built_kernels)
        assert diags == [], f"{impl}: " + "\n".join(map(str, diags))


def test_cli_unknown_preset_is_a_usage_error(fake_kernels: Path, tmp_path: Path, capsys) -> None:
    """An unknown --preset exits 2 like build_kernels.py's --geometry (it exited 1), lists the presets and says what
    serves another geometry."""
    line = _cli_error(capsys, ["--preset", "7b", "--kernels", str(fake_kernels), "--out", str(tmp_path / "m.json")],
                      code=2)
    assert line.endswith(": error: --preset: unknown preset '7b'; known: 0.6b, 1.7b, 4b, 8b, 14b, 32b (another "
                         "Qwen3 geometry: --config with its HF config.json)")  # after argparse's prog
    assert not (tmp_path / "m.json").exists()
