"""Helpers shared by the GPU tests of this folder (the fixtures `ks` and `_seed` are in conftest.py).

Imported by every kernel test module of this folder (after putting this folder on sys.path: pytest runs
with --import-mode=importlib), first thing: importing it skips the importing module where torch, a CUDA
GPU or cuda-bindings is missing (pytest.importorskip / pytest.skip at module level), and puts tools/ and
tools/kernels-src/ first on sys.path (cubin_launch, build_kernels, the catalog). Also exports ROOT (the
repository) and torch.

- kernels_dir: the kernels a test module launches ($KERN_KERNELS_DIR or a fresh build);
- launch_gemv: one launch of a decode GEMV entry (256 threads) on torch's stream;
- nan_like, bits, rope_table: small tensor helpers;
- the KV layout (kv_geom, slot_offsets, kv_offsets, row_offsets, changed_outside): the one place that knows
  where a token's k and v are in the paged cache; every test that reads or writes a slot goes through it;
- the float64 reference of paged decode attention (pool, gather_kv, ref_attention) and
  DecodeContext, one sequence's KV pool and launch arguments (test_decode_attention_gpu.py,
  test_fused_attention_gpu.py; test_kernels_gpu.py uses kv_geom, slot_offsets and gather_kv);
- ref_norm_rope, rope_reference: the float64 reference of the rope-cluster decode attention (q/k RMS norm,
  rotary, the token's k/v row, attention; test_rope_attention_gpu.py, test_qkv_attention_gpu.py);
- decode_chains, run_generations: a generated decode program run end to end through kern-run (the 0.6B
  chains of test_decode_attention_gpu.py and test_fused_attention_gpu.py).

Paged KV layout (the kernels' contract, tools/README.md "KV layout"; head-major, the only one): bf16, 16-token
pages, each holding `layers` layers one after the other (layer l's part at l * layer_elems, the offset a kernel's
kv argument gets); a layer's part is `nkv` heads one after the other, each 16 token slots of one 512-byte k|v row
(k: D elements, then v: D elements), and slot s's row is swizzled: its logical 16-byte chunk c (k chunks 0..15,
v chunks 16..31) at chunk c ^ (s % 8). So k element d of kv head h of physical slot s is at
(s // 16) * page_elems + h * 16 * 2 * D + (s % 16) * 2 * D + (d ^ ((s % 8) * 8)) from the layer's offset, and
its v element d at + D from there (the XOR only touches the low three bits of the chunk index).
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


def built_cubins(jobs: dict) -> dict:
    """{key: cubin bytes} of tools/kernels-src modules built here with nvcc (tools/build_kernels.py's flags); jobs: {key:
    (source, defines, cubin file name)}, all started before the first is waited for. Makes torch's primary context
    current (for loading them). Skips the calling test where nvcc is missing."""
    import tempfile

    import build_kernels

    try:
        build_kernels._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    torch.zeros(1, device=DEV)  # torch's primary context current
    with tempfile.TemporaryDirectory() as t:
        started = {key: build_kernels.start_cuda(src, t, defines, name) for key, (src, defines, name) in jobs.items()}
        return {key: build_kernels.finish_cuda(job) for key, job in started.items()}


def built_modules(jobs: dict) -> dict:
    """{key: CUmodule}: `built_cubins(jobs)` loaded in torch's primary context."""
    from cuda.bindings import driver as cu
    from cubin_launch import check

    return {key: check(cu.cuModuleLoadData(cubin)) for key, cubin in built_cubins(jobs).items()}


def module_functions(module, entries) -> dict:
    """{entry: CUfunction} of `entries` in a loaded CUmodule."""
    from cuda.bindings import driver as cu
    from cubin_launch import check

    return {e: check(cu.cuModuleGetFunction(module, e.encode())) for e in entries}


def launch_gemv(f, grid: int, args: list, smem: int) -> None:
    """cuLaunchKernel of a decode GEMV function `f` (gemv.cu, gemv_tc.cu: 256 threads) with grid (grid, 1, 1) on
    torch's current stream; args: tensors (16-byte aligned pointers), ints (i32) and floats (f32)."""
    import ctypes

    from cuda.bindings import driver as cu
    from cubin_launch import allow_dynamic_smem, launch_function

    vals, types = [], []
    for a in args:
        if torch.is_tensor(a):
            assert a.data_ptr() % 16 == 0
            vals.append(a.data_ptr())
            types.append(ctypes.c_void_p)
        elif isinstance(a, float):
            vals.append(a)
            types.append(ctypes.c_float)
        else:
            vals.append(a)
            types.append(ctypes.c_int)
    allow_dynamic_smem(f, smem)  # the M > 1 norm entries' M·k·2 bytes plus their static ones pass 48 KB for large k
    launch_function(f, (grid, 1, 1), (256, 1, 1), smem, cu.CUstream(torch.cuda.current_stream().cuda_stream),
                    (tuple(vals), tuple(types)))


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


# ---------------------------------------------------------------- the KV layout; paged decode attention in float64


def kv_geom(layers, nkv=NKV):
    """(layer_elems, page_elems): elements of one layer's part of a page (16 token slots of `nkv` heads' k|v; layer
    l's part starts at l * layer_elems, the offset a kernel's kv argument gets), and elements per page (all
    `layers` layers). Sizes only: a slot's elements are where slot_offsets says."""
    layer_elems = nkv * 16 * 2 * D
    return layer_elems, layers * layer_elems


def slot_offsets(slots, page_elems, nkv=NKV):
    """Element offsets, int64 [n, nkv, D], of the k of physical token slots `slots` (an int tensor of n slots, or
    one int) of one layer, from the layer's offset, in the head-major swizzled layout (module docstring): k element
    d of kv head h of slot s at (s // 16) * page_elems + h * 16 * 2 * D + (s % 16) * 2 * D + (d ^ ((s % 8) * 8));
    its v element d is at the same offset + D."""
    s = torch.as_tensor(slots, device=DEV).long().reshape(-1)
    row = (s // 16) * page_elems + (s % 16) * (2 * D)  # [n]: slot s's row of kv head 0
    head = torch.arange(nkv, device=s.device) * (16 * 2 * D)  # [nkv]: a head's 16 rows
    d = torch.arange(D, device=s.device)
    return row[:, None, None] + head[None, :, None] + (d[None, None, :] ^ ((s % 8) * 8)[:, None, None])


def kv_offsets(bt, pos, page_elems, nkv=NKV):
    """slot_offsets [n, nkv, D] of logical positions `pos` (int tensor [n]) of the sequence whose block-table row is
    `bt` (position p: page bt[p // 16], slot bt[p // 16] * 16 + p % 16); v at + D."""
    pos = torch.as_tensor(pos, device=DEV).long().reshape(-1)
    return slot_offsets(bt[pos // 16].long() * 16 + pos % 16, page_elems, nkv)


def row_offsets(slot, page_elems, nkv=NKV):
    """Every element offset of physical token slot `slot` (an int) in one layer, from the layer's offset: k and v of
    its `nkv` heads (int64 [2 * nkv * D], k's then v's): what storing that token's row writes, and all it may."""
    k = slot_offsets(int(slot), page_elems, nkv)[0]  # [nkv, D]
    return torch.cat([k, k + D]).reshape(-1)


def changed_outside(new, old, idx):
    """How many elements of `new` differ from `old` bit for bit (both flat bf16 tensors of one size) at element
    offsets other than `idx` (an int64 tensor of offsets)."""
    diff = new.view(torch.int16) != old.view(torch.int16)
    diff[idx] = False
    return int(diff.sum())


def pool(L, layers):
    """A layer-interleaved KV pool holding L tokens for `layers` layers (NKV heads), pages in random order.

    Returns (kv, bt, layer_elems, page_elems): kv bf16 [npages * page_elems] random (npages = ceil(L/16) + 3; random
    values, so the layout is the reader's: gather_kv), bt int32 [ceil(L/16) + 5] the block table (5 junk entries
    past the end), layer_elems and page_elems as kv_geom.
    """
    layer_elems, page_elems = kv_geom(layers)
    n = -(-L // 16)
    npages = n + 3
    kv = torch.randn(npages * page_elems, device=DEV).to(BF)
    bt = torch.randperm(npages, device=DEV)[:n].to(torch.int32)
    bt = torch.cat([bt, torch.full((5,), 10**6, dtype=torch.int32, device=DEV)])  # junk past the end
    return kv, bt, layer_elems, page_elems


def gather_kv(kv_layer, page_elems, bt, L, nkv=NKV):
    """K, V as float64 [L, nkv, D] for logical positions 0..L-1 (kv_layer = the pool from the layer's
    offset, bf16; bt: int32 block-table row), read through kv_offsets (the head-major layout)."""
    idx = kv_offsets(bt, torch.arange(L, device=DEV), page_elems, nkv)
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
        self.kv, self.bt, self.layer_elems, self.page_elems = pool(L, layers)
        self.q_stride = (nq + 2 * NKV) * D  # one token's qkv row, elements
        self.seq = torch.tensor([L], dtype=torch.int32, device=DEV)

    def layer_kv(self, l):
        """The pool from layer l's offset (bf16, flat)."""
        return self.kv[l * self.layer_elems:]

    def tail(self):
        """The trailing scalar args: num_q_heads, num_kv_heads, q_stride, bt_stride, page_bytes, sm_scale."""
        return [self.nq, NKV, self.q_stride, self.bt.numel(), self.page_elems * 2, 1 / math.sqrt(D)]


# ---------------------------------------------------------------- a decode program end to end (kern-run)


def decode_chains(kdir: Path, out_dir: Path, chains: dict[str, list[str]], weights_from: str, geometry: str,
                  capacity: int) -> dict[str, Path]:
    """Manifests of `geometry` from tools/gen_qwen3.py on `kdir`, one per entry of `chains` (name -> extra
    generator flags; every one with --max-positions `capacity`, --gemv gemv and --lm-head dense (`run_generations`
    reads every step's `logits`), so that the chains differ only in their flags), and one seeded random weights file
    for them all (test_pdl_chain_gpu.random_weights over the manifest `weights_from`). Returns {name: manifest,
    "kernels": kdir, "weights": the weights file}."""
    import subprocess

    from qwen3_config import Qwen3Config
    from test_pdl_chain_gpu import random_weights

    gen = [sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", geometry, "--kernels", str(kdir),
           "--max-positions", str(capacity), "--gemv", "gemv", "--lm-head", "dense"]
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


def rope_reference(qkv_row, kv, off, page_elems, bt_row, L, nq, qw, kw, cs, slot):
    """float64 (out [1, nq*D], k [NKV, D]): q, k = rope(rmsnorm(.) * w) of the bf16 inputs; attention over the
    cache (the whole pool `kv`, the layer from element offset `off`) whose row at physical slot `slot` holds bf16(k)
    and v, written where slot_offsets puts them, as the kernels store them."""
    x = qkv_row.double()
    q = ref_norm_rope(x[: nq * D].view(nq, D), qw, cs)
    k = ref_norm_rope(x[nq * D:(nq + NKV) * D].view(NKV, D), kw, cs)
    kv = kv.clone()
    idx = off + slot_offsets(int(slot), page_elems)[0]  # [NKV, D]: the token's k; its v at + D
    kv[idx] = k.to(BF)
    kv[idx + D] = qkv_row[(nq + NKV) * D:].view(NKV, D)
    K, V = gather_kv(kv[off:], page_elems, bt_row, L)
    G = nq // NKV
    s = torch.einsum("hd,lhd->hl", q, K.repeat_interleave(G, 1)) / math.sqrt(D)
    return torch.einsum("hl,lhd->hd", s.softmax(-1), V.repeat_interleave(G, 1)).reshape(1, nq * D), k
