"""The PDL forms of the decode-path kernels (build_kernels.py --pdl, `NAME_pdl`) on the GPU.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_pdl_chain_gpu.py -q

1. Twins: each `NAME_pdl` launched normally (no PDL attribute: its griddepcontrol
   instructions are no-ops) equals `NAME` bit for bit on fresh random inputs, outputs
   poisoned identically (both kernels see the same bytes; every byte they leave must match); the
   prologue's PDL form also stores each written slot's v at its head-major swizzled positions (gpu_helpers).
2. The whole decode chain: the 0.6B manifest generated with `gen_qwen3.py --pdl` and `--no-pdl`
   (same kernels dir, built with --pdl; random weights written here from the manifest's own
   weight declarations, the rotary table real) runs the same prompt: the greedy tokens and
   the logits of every decode step are identical (bitwise), eager and in a CUDA graph, and the
   --pdl decode graph has programmatic edges (the --no-pdl one none; prefill graphs have cuBLASLt's own
   either way). The kernels are the same
   arithmetic, so any difference is a race: a kernel reading its predecessor's output before
   its griddepcontrol.wait.

Kernels: $KERN_KERNELS_DIR if its index has the `_pdl` entries, else built here (0.6b, 4b, --pdl).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]  # _seed, ks: conftest.py

# gpu_helpers skips this module without torch, a CUDA GPU or cuda-bindings, and puts tools/ and
# tools/kernels-src/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import ROOT, torch, BF, D, DEV, bits, kernels_dir, kv_geom, rope_table, slot_offsets  # noqa: E402

PDL_BASE = ("embedding", "qk_norm_rope_kv", "paged_decode_attention", "paged_decode_reduce",
            "argmax_partial", "argmax_reduce")


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    # the chain also needs the default decode attention's PDL form and the persistent GEMVs
    need = [n + "_pdl" for n in PDL_BASE + ("decode_attention_cluster",)] + ["kern_gemvp_norm_m1"]
    return kernels_dir(tmp_path_factory, "kernels-pdl", ["0.6b", "4b"], need, pdl=True)


def twins(ks, name: str, grid, make_args, outputs):
    """Launch `name` and `name_pdl` on identical copies of the inputs; every output equal bytewise.

    make_args(): a fresh list of args (tensors cloned from the same source), `outputs`: indices
    of the args to compare after the launch.
    """
    a, b = make_args(), make_args()
    ks.launch(name, grid, a)
    ks.launch(name + "_pdl", grid, b)
    torch.cuda.synchronize()
    for i in outputs:
        assert torch.equal(bits(a[i]), bits(b[i])), f"{name}_pdl differs from {name} in arg {i}"


def test_pdl_entries_have_twins(ks):
    for n in PDL_BASE:
        k, t = ks.kernels[n + "_pdl"], ks.kernels[n]
        assert k.get("pdl") is True and k["entry"] == t["entry"] and k["params"] == t["params"], n
        assert k["block"] == t["block"] and k["shared_mem"] == t["shared_mem"], n


@pytest.mark.parametrize("T", [1, 7, 512])
@pytest.mark.parametrize("H", [1024, 2560, 5120])
def test_embedding_twin(ks, T, H):
    V = 151936
    table = torch.randn(V, H, device=DEV).to(BF)
    ids = torch.randint(0, V, (T,), device=DEV)
    if T > 2:
        ids[1] = V  # out of range: zero row
        ids[2] = -3
    poison = torch.full((T, H), float("nan"), dtype=BF, device=DEV)
    twins(ks, "embedding", (T,), lambda: [ids, table, poison.clone(), H, V], [2])


@pytest.mark.parametrize("rows,n,parts", [(1, 151936, 75), (3, 151936, 75), (1, 1001, 1), (2, 4096, 200)])
def test_argmax_twin(ks, rows, n, parts):
    x = torch.randn(rows, n, device=DEV).to(BF)
    for r in range(rows):
        i = torch.randint(0, n, (3,)).sort().values.tolist()
        x[r, i] = 8.0 + r
    partial = torch.full((rows * parts,), -1, dtype=torch.int64, device=DEV)
    out = torch.full((rows,), -7, dtype=torch.int64, device=DEV)
    twins(ks, "argmax_partial", (parts, rows), lambda: [x, partial.clone(), n, parts], [1])
    p = partial.clone()
    ks.launch("argmax_partial", (parts, rows), [x, p, n, parts])
    twins(ks, "argmax_reduce", (rows,), lambda: [p, out.clone(), parts], [1])
    o = out.clone()
    ks.launch("argmax_reduce_pdl", (rows,), [p, o, parts])
    torch.cuda.synchronize()
    assert o.cpu().tolist() == np.argmax(x.float().cpu().numpy(), axis=1).tolist()


@pytest.mark.parametrize("T", [1, 7, 512])
@pytest.mark.parametrize("nq", [16, 32, 64])
def test_qk_norm_rope_kv_twin(ks, T, nq):
    nkv, layers, layer, eps = 8, 4, 2, 1e-6
    layer_elems, page_elems = kv_geom(layers, nkv=nkv)
    cos_sin = rope_table()
    pos0 = 30000 + int(torch.randint(0, 5000, (1,)))
    pos = torch.arange(pos0, pos0 + T, device=DEV)
    slots = pos.clone()
    if T > 3:
        slots[2] = -1
    npages = (pos0 + T) // 16 + 2
    kv = torch.randn(npages * page_elems, device=DEV).to(BF)
    qkv = torch.randn(T, (nq + 2 * nkv) * D, device=DEV).to(BF)
    qw, kw = (torch.rand(D, device=DEV) + 0.5).to(BF), (torch.rand(D, device=DEV) + 0.5).to(BF)
    held = []

    def args():
        k = kv.clone()
        held.append(k)
        return [qkv.clone(), pos, slots, qw, kw, cos_sin, k[layer * layer_elems:], nq, nkv, eps, page_elems * 2]

    twins(ks, "qk_norm_rope_kv", (T, nkv), args, [0])
    assert torch.equal(bits(held[0]), bits(held[1])), "KV state differs"
    # and the PDL form stored the written slots' v at their head-major swizzled positions (gpu_helpers), bit for bit
    written = slots >= 0
    idx = layer * layer_elems + slot_offsets(slots[written], page_elems, nkv) + D
    assert torch.equal(bits(held[1][idx]), bits(qkv[written, (nq + nkv) * D:].reshape(-1, nkv, D)))


@pytest.mark.parametrize("nq", [16, 32, 64])
@pytest.mark.parametrize("L,S", [(1, 32), (17, 8), (1000, 64), (4096, 32), (40000, 32)])
def test_decode_attention_twin(ks, nq, L, S):
    nkv, layers, layer = 8, 3, 1
    layer_elems, page_elems = kv_geom(layers, nkv=nkv)
    n = -(-L // 16)
    kv = torch.randn((n + 5) * page_elems, device=DEV).to(BF)
    bt = torch.randperm(n + 5, device=DEV)[:n].to(torch.int32)
    kv_layer = kv[layer * layer_elems:]
    q_stride = (nq + 2 * nkv) * D
    qkv = torch.randn(1, q_stride, device=DEV).to(BF)
    seq = torch.tensor([L], dtype=torch.int32, device=DEV)
    acc = torch.full((nq * S * D,), float("nan"), device=DEV)
    ml = torch.full((nq * S * 2,), float("nan"), device=DEV)
    scale = 1 / math.sqrt(D)
    common = [nq, nkv, q_stride, bt.numel(), page_elems * 2, scale]
    twins(ks, "paged_decode_attention", (nkv, S, 1),
          lambda: [qkv, kv_layer, bt, seq, acc.clone(), ml.clone()] + common, [4, 5])
    a, m = acc.clone(), ml.clone()
    ks.launch("paged_decode_attention", (nkv, S, 1), [qkv, kv_layer, bt, seq, a, m] + common)
    out = torch.full((1, nq * D), float("nan"), dtype=BF, device=DEV)
    twins(ks, "paged_decode_reduce", (nq, 1), lambda: [a, m, out.clone(), nq, S], [2])


# ---------------------------------------------------------------- the whole decode chain (kern_driver)

GEOMETRY = "0.6b"
CAPACITY = 2048
PROMPT = 300  # crosses pages; decode attention reads 300+ keys
STEPS = 24


def random_weights(manifest: Path, out: Path, theta: float) -> None:
    """A safetensors file with every weight buffer of the manifest: N(0, 0.02) matrices (the
    embedding, which is also the tied lm_head, N(0, 0.2): logits of a few units), norm weights
    near 1, the real rotary table (tools/README.md). bf16 written as raw words (numpy only)."""
    from export_weights import f32_to_bf16, rope_cos_sin

    m = json.loads(manifest.read_text())
    rng = np.random.default_rng(0)
    header, blobs, off = {}, [], 0
    for name, b in m["buffers"].items():
        if b["class"] != "weight":
            continue
        shape = tuple(b["shape"])
        if name == "rope.cos_sin":
            arr, dt = np.ascontiguousarray(rope_cos_sin(shape[0], shape[1], theta), np.float32), "F32"
            assert arr.shape == shape
        else:
            assert b["dtype"] == "bf16", name
            x = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)) if len(shape) == 1 else \
                (0.2 if name == "model.embed_tokens.weight" else 0.02) * rng.standard_normal(shape, dtype=np.float32)
            arr, dt = f32_to_bf16(x), "BF16"
        data = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for data in blobs:
            f.write(data)


@pytest.fixture(scope="module")
def chain(kdir, tmp_path_factory):
    d = tmp_path_factory.mktemp("pdl-chain")
    gen = [sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", GEOMETRY, "--kernels", str(kdir),
           "--max-positions", str(CAPACITY), "--lm-head", "dense"]  # dense: run_chain reads every step's logits
    # pairs of manifests that differ only in --pdl: the default GEMVs (gemv.cu; o, and 4B's down, on gemv_tc.cu), gemv.cu's
    # alone (--gemv gemv-fma), and the persistent ones (gemv_persist.cu);
    # the plain ones need --no-pdl (--pdl is the generator's default)
    out = {}
    for name, flags in (("plain", ["--gemv", "gemv", "--no-pdl"]), ("pdl", ["--gemv", "gemv", "--pdl"]),
                        ("fma", ["--gemv", "gemv-fma", "--no-pdl"]), ("fma_pdl", ["--gemv", "gemv-fma", "--pdl"]),
                        ("persistent", ["--gemv", "persistent", "--no-pdl"]),
                        ("persistent_pdl", ["--gemv", "persistent", "--pdl"])):
        out[name] = d / f"{name}.json"
        subprocess.run(gen + ["--out", str(out[name]), *flags], check=True, capture_output=True)
    from qwen3_config import Qwen3Config

    weights = d / "weights.safetensors"
    random_weights(out["plain"], weights, Qwen3Config.preset(GEOMETRY).rope_theta)
    return {**out, "weights": weights, "kernels": kdir}


def run_chain(chain, which: str, graph: bool):
    """Greedy tokens and every decode step's logits of one manifest."""
    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    rt = Runtime.load(chain[which], chain["kernels"], chain["weights"], capacity_tokens=CAPACITY)
    try:
        s = Qwen3Session(rt, ManifestInfo.read(chain[which]), capacity=CAPACITY, graph=graph,
                         pipeline=False)  # logits read after each token: that step's
        rng = np.random.default_rng(1)
        prompt = rng.integers(0, 151936, PROMPT).tolist()
        tokens, logits = [], []
        for t in s.generate(prompt, STEPS, 128):
            tokens.append(t)
            logits.append(rt.read_buffer("logits").reshape(-1).copy())
        # programmatic edges per captured graph, by program (prefill's come from cuBLASLt's own launches:
        # it uses PDL on Hopper whatever the manifest says, H200 2026-11-29: 27 in a --no-pdl prefill graph)
        edges = {g.program: g.programmatic_edges for g in rt.graphs} if graph else {}
        return tokens, np.stack(logits), edges
    finally:
        rt.close()


@pytest.mark.parametrize("gemv", ["plain", "fma", "persistent"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_decode_chain_pdl_equals_plain(chain, graph, gemv):
    """gen_qwen3.py --pdl gives the same bits as without, for the default GEMVs (gemv.cu, o on gemv_tc.cu), gemv.cu's
    alone (`--gemv gemv-fma`) and the persistent ones."""
    t0, l0, edges0 = run_chain(chain, gemv, graph)
    t1, l1, edges = run_chain(chain, "pdl" if gemv == "plain" else gemv + "_pdl", graph)
    assert t0 == t1, f"tokens differ: {t0} vs {t1}"
    assert np.array_equal(l0.view(np.uint16), l1.view(np.uint16)), \
        f"logits differ at steps {sorted(set(np.nonzero(l0.view(np.uint16) != l1.view(np.uint16))[0].tolist()))}"
    # not a frozen chain: every step's logits differ from the step before (with tied random
    # embeddings the greedy token can repeat, H200 2026-11-29, but the KV cache and the
    # position still change every step's logits)
    same = [i for i in range(1, len(l0)) if np.array_equal(l0[i], l0[i - 1])]
    assert not same, f"logits of steps {same} equal those of the step before: the chain did not advance"
    if graph:
        assert edges.get("decode", 0) > 0, f"the --pdl decode graph has no programmatic edge: {edges}"
        assert edges0.get("decode", 1) == 0, f"the --no-pdl decode graph has programmatic edges: {edges0}"
