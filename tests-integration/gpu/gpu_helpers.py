"""Helpers shared by the GPU tests of this folder (the fixtures `ks` and `_seed` are in conftest.py).

Imported by every kernel test module of this folder (after putting this folder on sys.path: pytest runs
with --import-mode=importlib), first thing: importing it skips the importing module where torch, a CUDA
GPU or cuda-bindings is missing (pytest.importorskip / pytest.skip at module level), and puts tools/ and
tools/kernels-src/ first on sys.path (cubin_launch, build_kernels, the catalog). Also exports ROOT (the
repository) and torch.

- kernels_dir: the kernels a test module launches ($KERN_KERNELS_DIR or a fresh build);
- nan_like, bits, rope_table: small tensor helpers;
- the float64 reference of paged decode attention (kv_geom, pool, gather_kv, ref_attention) and
  DecodeContext, one sequence's KV pool and launch arguments (test_decode_attention_gpu.py,
  test_fused_attention_gpu.py; test_kernels_gpu.py uses kv_geom and gather_kv);
- ref_norm_rope, rope_reference: the float64 reference of the rope-cluster decode attention (q/k RMS norm,
  rotary, the token's k/v row, attention; test_rope_attention_gpu.py, test_qkv_attention_gpu.py);
- decode_chains, run_generations: a generated decode program run end to end through kern-run (the 0.6B
  chains of test_decode_attention_gpu.py and test_fused_attention_gpu.py).

Paged KV layout (the kernels' contract): 16-token pages, each holding `layers` layers one after the
other; a layer's token is `nkv` heads of K (D elements) then V (D elements), bf16.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
pytest.importorskip("cuda.bindings.driver")

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "tools" / "kernels-src", ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

D = 128  # head dimension
NKV = 8  # KV heads in the attention tests
BF = torch.bfloat16
DEV = "cuda"


def kernels_dir(tmp_path_factory, name: str, presets: list[str] | None, needed=None, **flags) -> Path:
    """$KERN_KERNELS_DIR when it is set and its index.json has every kernel in `needed` (None: taken
    unchecked), else build_kernels.build(out, presets, quiet=True, **flags) into a fresh pytest temp
    dir named `name` (presets None: all of build_kernels' presets); returns that directory."""
    d = os.environ.get("KERN_KERNELS_DIR")
    if d and (needed is None or all(n in json.loads((Path(d) / "index.json").read_text())["kernels"]
                                    for n in needed)):
        return Path(d)
    import build_kernels

    if presets is None:
        presets = list(build_kernels.load_geometry.__globals__["PRESETS"])
    out = tmp_path_factory.mktemp(name)
    build_kernels.build(out, presets, quiet=True, **flags)
    return out


def nan_like(shape, dtype=BF):
    """A tensor of `shape` and `dtype` (bf16 by default) on the GPU, every element NaN (poison)."""
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (NaN == NaN when the bit patterns agree)."""
    return t.contiguous().view(torch.uint8)


def rope_table(positions=40960, theta=1e6):
    """The rotary table, float32 [positions, D] on the GPU: cos | sin of p * theta^(-2i/D), i < D/2
    (computed in float64)."""
    f = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(positions, dtype=torch.float64)[:, None] * f[None]
    return torch.cat([ang.cos(), ang.sin()], -1).float().to(DEV)


# ---------------------------------------------------------------- paged decode attention, float64 reference


def kv_geom(layers, nkv=NKV):
    """(tok, page_elems): elements per token of one layer, elements per page (all `layers` layers)."""
    tok = nkv * 2 * D  # elements per token of one layer
    return tok, layers * 16 * tok  # page elements


def pool(L, layers):
    """A layer-interleaved KV pool holding L tokens for `layers` layers (NKV heads), pages in random order.

    Returns (kv, bt, tok, page_elems): kv bf16 [npages * page_elems] random (npages = ceil(L/16) + 3),
    bt int32 [ceil(L/16) + 5] the block table (5 junk entries past the end), tok and page_elems as kv_geom.
    """
    tok, page_elems = kv_geom(layers)
    n = -(-L // 16)
    npages = n + 3
    kv = torch.randn(npages * page_elems, device=DEV).to(BF)
    bt = torch.randperm(npages, device=DEV)[:n].to(torch.int32)
    bt = torch.cat([bt, torch.full((5,), 10**6, dtype=torch.int32, device=DEV)])  # junk past the end
    return kv, bt, tok, page_elems


def gather_kv(kv_layer, page_elems, bt, L, nkv=NKV):
    """K, V as float64 [L, nkv, D] for logical positions 0..L-1 (kv_layer = the pool from the layer's
    offset, bf16; bt: int32 block-table row)."""
    pos = torch.arange(L, device=DEV)
    tok = bt[pos // 16].long() * page_elems + (pos % 16) * (nkv * 2 * D)
    hs = torch.arange(nkv, device=DEV) * 2 * D
    dd = torch.arange(D, device=DEV)
    idx = tok[:, None, None] + hs[None, :, None] + dd
    return kv_layer[idx].double(), kv_layer[idx + D].double()  # [L, nkv, D]


def ref_attention(qrow, kv_layer, page_elems, bt, L, nq):
    """Decode attention in float64, float64 [1, nq * D]: softmax(q K^T / sqrt(D)) V over positions 0..L-1.

    qrow: one token's bf16 qkv row (its first nq * D elements are the nq query heads); kv_layer, bt: as
    gather_kv (NKV heads); query head h reads KV head h // (nq // NKV) (GQA).
    """
    K, V = gather_kv(kv_layer, page_elems, bt, L)
    q = qrow[: nq * D].double().view(nq, D)
    G = nq // NKV
    s = torch.einsum("hd,lhd->hl", q, K.repeat_interleave(G, 1)) / math.sqrt(D)
    return torch.einsum("hl,lhd->hd", s.softmax(-1), V.repeat_interleave(G, 1)).reshape(1, nq * D)


class DecodeContext:
    """One sequence of L tokens in a pool of `layers` layers (pool), and the decode attention launch
    arguments common to every impl. Subclasses add their scratch and launches."""

    def __init__(self, ks, nq, L, S, layers):
        self.ks, self.nq, self.L, self.S, self.layers = ks, nq, L, S, layers
        self.kv, self.bt, self.tok, self.page_elems = pool(L, layers)
        self.q_stride = (nq + 2 * NKV) * D  # one token's qkv row, elements
        self.seq = torch.tensor([L], dtype=torch.int32, device=DEV)

    def layer_kv(self, l):
        """The pool from layer l's offset (bf16, flat)."""
        return self.kv[l * 16 * self.tok:]

    def tail(self):
        """The trailing scalar args: num_q_heads, num_kv_heads, q_stride, bt_stride, page_bytes, sm_scale."""
        return [self.nq, NKV, self.q_stride, self.bt.numel(), self.page_elems * 2, 1 / math.sqrt(D)]


# ---------------------------------------------------------------- a decode program end to end (kern-run)


def decode_chains(kdir: Path, out_dir: Path, chains: dict[str, list[str]], weights_from: str, geometry: str,
                  capacity: int) -> dict[str, Path]:
    """Manifests of `geometry` from tools/gen_qwen3.py on `kdir`, one per entry of `chains` (name -> extra
    generator flags; every one with --max-positions `capacity` and --gemv gemv, so that the chains differ only
    in their flags), and one seeded random weights file for them all (test_pdl_chain_gpu.random_weights over the
    manifest `weights_from`). Returns {name: manifest, "kernels": kdir, "weights": the weights file}."""
    import subprocess

    from qwen3_config import Qwen3Config
    from test_pdl_chain_gpu import random_weights

    gen = [sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", geometry, "--kernels", str(kdir),
           "--max-positions", str(capacity), "--gemv", "gemv"]
    out: dict[str, Path] = {"kernels": kdir}
    for which, flags in chains.items():
        out[which] = out_dir / f"{which}.json"
        subprocess.run(gen + ["--out", str(out[which]), *flags], check=True, capture_output=True)
    out["weights"] = out_dir / "weights.safetensors"
    random_weights(out[weights_from], out["weights"], Qwen3Config.preset(geometry).rope_theta)
    return out


def run_generations(chain: dict[str, Path], which: str, graph: bool, *, capacity: int, prompt: int, steps: int,
                    generations: int = 2, after=None):
    """kern-run greedy decoding of manifest `chain[which]`: `generations` seeded random prompts of `prompt` tokens
    in a row on one runtime, `steps` tokens each (CUDA graph or eager). Returns (tokens, logits) per generation:
    lists of [steps] token ids and [steps, vocab] bf16 words of every step's logits. `after(rt)`: called with the
    runtime once the generations are done, before it closes."""
    import numpy as np
    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    rt = Runtime.load(chain[which], chain["kernels"], chain["weights"], capacity_tokens=capacity)
    try:
        tokens, logits = [], []
        for gi in range(generations):
            s = Qwen3Session(rt, ManifestInfo.read(chain[which]), capacity=capacity, graph=graph,
                             pipeline=False)  # logits read after each token: that step's
            ids = np.random.default_rng(1 + gi).integers(0, 151936, prompt).tolist()
            tk, lg = [], []
            for t in s.generate(ids, steps, 128):
                tk.append(t)
                lg.append(rt.read_buffer("logits").reshape(-1).copy())
            tokens.append(tk)
            logits.append(np.stack(lg))
        if after is not None:
            after(rt)
        return tokens, logits
    finally:
        rt.close()


def ref_norm_rope(x, w, cs, eps=1e-6):
    """x float64 [h, D], cs [D] (cos|sin) -> rope(rmsnorm(x) * w), float64 (Qwen3's q_norm/k_norm, then neox rotary)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    cos, sin = cs[: D // 2].double(), cs[D // 2:].double()
    return torch.cat([y[:, : D // 2] * cos - y[:, D // 2:] * sin, y[:, D // 2:] * cos + y[:, : D // 2] * sin], -1)


def rope_reference(qkv_row, kv, off, page_elems, tok, bt_row, L, nq, qw, kw, cs, slot):
    """float64 (out [1, nq*D], k [NKV, D]): q, k = rope(rmsnorm(.) * w) of the bf16 inputs; attention over the
    cache (from layer offset `off`) whose row at `slot` holds bf16(k) and v, as the kernels store them."""
    x = qkv_row.double()
    q = ref_norm_rope(x[: nq * D].view(nq, D), qw, cs)
    k = ref_norm_rope(x[nq * D:(nq + NKV) * D].view(NKV, D), kw, cs)
    kv = kv.clone()
    row = slot // 16 * page_elems + slot % 16 * tok + off
    kv[row: row + tok].view(NKV, 2, D)[:, 0] = k.to(BF)
    kv[row: row + tok].view(NKV, 2, D)[:, 1] = qkv_row[(nq + NKV) * D:].view(NKV, D)
    K, V = gather_kv(kv[off:], page_elems, bt_row, L)
    G = nq // NKV
    s = torch.einsum("hd,lhd->hl", q, K.repeat_interleave(G, 1)) / math.sqrt(D)
    return torch.einsum("hl,lhd->hd", s.softmax(-1), V.repeat_interleave(G, 1)).reshape(1, nq * D), k
