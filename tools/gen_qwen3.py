#!/usr/bin/env python3
"""Generate the kern manifest (schema 4) of a Qwen3 dense model.

Usage::

    python tools/gen_qwen3.py (--preset 4b | --config config.json) --kernels DIR --out M.json
                              [--chunk 2048] [--max-positions 40960] [--model NAME] [--no-pdl]
                              [--fused-attention] [--gemv gemv|gemv-fma|persistent]
                              [--decode-attention rope-cluster|cluster|cuda|triton] [--cuda-attention]
                              [--lm-head dense|screened]

DIR is a kernels directory written by `tools/build_kernels.py` (cubins + `index.json`);
every kernel is wired by the NAME, parameter names and types the index gives, and every
module is pinned by the sha256 of its file. The manifest has two programs over the same
op entries (tools/README.md is the contract):

- `prefill`: a chunk of `tokens` (1 .. --chunk) prompt tokens through every layer; it writes
  only the KV state. (The last layer stops after its KV write: nothing after it reaches the
  state.)
- `decode`: one token (`tokens` = 1): every layer through the fused decode GEMV ops of
  `gemv_tc.cu`'s tensor-core entries (by default, where `gemv_plan.gemv_tensor_core` says so: k a multiple of 128,
  every op of every Qwen3 dense geometry), `gemv.cu` or `gemv_persist.cu` (`--gemv`; norm + qkv,
  o + residual add, norm + gate_up + SiLU-and-mul, down + residual add:
  5 launches per layer with the default decode attention, which does the attention prologue's decode work
  too; 6 with `--decode-attention cluster` and its own prologue launch), then the
  final norm + lm_head (the embedding when tied) and a greedy argmax into `next_token` (i64 [1]): by default
  the screened head below; with `--lm-head dense` a GEMV into `logits` [1, V] and a GPU argmax. Each GEMV op is fixed
  to its shape: n, k, and on gemv_tc.cu (`gemv_plan.gemv_tensor_core`: k a multiple of 128) `kern_gemvtc_*_m1` (`_u5` where `gemv_plan.gemv_tc_unroll` says so: in 4B, gate_up and a dense
  lm_head) at ksplit 1, grid ceil_div(n, 16) (gate_up: ceil_div(n, 8)); otherwise `ksplit` (`gemv_ksplit`), the
  gemv.cu entry (`kern_*_m1`, or `kern_*_m1_u5` where five loads per row per stage put a lane's whole
  row before the PDL wait and the next launch is not the attention: `gemv_plan.gemv_entry_unroll`; in 4B, gate_up
  and lm_head; for the GEMV before the attention, `kern_gemv_norm_m1_p2` of `gemv_p2.cubin`, two 16-row units per
  block, where its default grid is more than one wave of two blocks per SM: `gemv_plan.gemv_passes`; in 4B, qkv;
  for a norm GEMV, its batched-prologue form `NAME_nb2` where `gemv_plan.gemv_norm_batched(k)`: in 4B, qkv on
  `kern_gemv_norm_m1_nb2_p2` and gate_up on `kern_gemv_norm_silu_m1_u5_nb2`)
  or the persistent plan's `piece_chunks` (tools/gemv_plan.py), grid and dynamic shared memory are
  literals of its one launch. By default (`--pdl`; `--no-pdl` turns it off) every decode launch but
  the embedding is a programmatic dependent launch of the kernels' PDL forms.

`--lm-head screened` (the default since session 24) ends decode with one op, `norm_lm_head_argmax_screened`, in
place of `gemv_norm_lm_head` + `argmax`: kernels-src/lm_head_screen.cu bounds every row's logit from an int8 copy of
the head that the weights file carries (tools/export_weights.py writes `lm_head.screen.q8` and `lm_head.screen.rows`
by default), computes only the candidate rows' logits as kern_gemv_norm_m1 does, and argmax_reduce picks among them:
the same token bit for bit as `--lm-head dense`, from about half the head's bytes (4B −0.057 ms/token, 0.6B −0.017 on
the H200, NOTES.md 64-65). The manifest then has no `logits` buffer: a caller that reads the logits (sampling, the
e2e test's logit checks) needs `--lm-head dense`, and a weights file exported with `--no-screened-head`.

Every kernel launch carries its index entry's `carveout` (the preferred shared-memory carveout, percent),
and none where the entry has none: in the default build only `decode_attention_rope_cluster_pdl`'s, 0
(catalog `DA_ROPE_CARVEOUT`: its 2-page ring fits the 100 KB configuration, which leaves the GEMVs beside it
their L1; NOTES.md 55). An index entry whose carveout is not an int 0..100 is refused.

Before writing, the generator checks its own wiring (`check_wiring`): the q/k/v column
ranges of the fused qkv buffer lie inside a row and do not overlap, and every kernel that
addresses them agrees with that one layout; each layer's calls use that layer's weights
and no other call does; each layer's KV offset lies inside its page and matches the page
stride passed to the kernels; parameters the kernels require 16-byte aligned are; each GEMV
launch's grid, ksplit and shared memory follow its kernel's rules (a persistent GEMV's grid,
piece_chunks and shared memory are tools/gemv_plan.py's plan) and its call's buffers have
its n and k; in decode, `residual` is written only by the embedding and then in place by the
gemv_residual ops (o, down of each layer, in order); each kernel launch's carveout is its index entry's; every
declaration is used. The output is deterministic: the same config and index give the same bytes.

Decode attention (`--decode-attention`; default `rope-cluster`, below): the op `attention_decode` has one
interface and three impls:
`cluster` is one launch of `decode_attention_cluster` (tools/kernels-src/decode_attention.cu:
a cluster of 8 CTAs per kv head splits the keys and merges through distributed shared memory; no
scratch); `cuda` (`--cuda-attention`) is `decode_attention_split` + `decode_attention_merge` (two
launches, split-KV partials in impl scratch); `triton` is attention.py's `paged_decode_attention` +
`paged_decode_reduce` (two launches, the impl before 2026-11-29). Only the op's impl differs: the same
calls, buffers and interface (tools/bench_kernels.py times all three, BENCHMARKS.md). `rope-cluster`
(the default since session 8) is instead its own op `attention_decode_rope` (qk_norm_rope_kv's params, then
attention's): one launch of `decode_attention_rope_cluster` per layer does the prologue's decode work and
the cluster attention, so the decode layer has no `qk_norm_rope` call (5 launches instead of 6). Its PDL
form issues its first K|V pages before its griddepcontrol.wait, i.e. while the qkv GEMV finishes: kern-run
4B on the H200 2.57 ms/token against 2.62 for `cluster` after `qk_norm_rope_kv_pdl` (NOTES.md 29).

`--fused-attention` (opt-in, implies `--decode-attention triton`): decode attention is one launch of
`paged_decode_attention_fused` (tools/kernels-src/attention.py: split-KV stage 1, and the last
program of each kv head merges the splits) instead of stage 1 + reduce. That kernel needs
counters that persist between runs and start at zero, which impl scratch is not (it is not
kept between runs, and may not be read before written), so the manifest gains a state
`attn_counters` (`bytes_per_seq` = L·NKV·4, i32 per layer and kv head; with a var `seqs`
{max 1} that sizes it) and `attention_decode`'s interface gains an `inout ptr counters` param
(each layer's call passes `attn_counters` + l·NKV·4, its own counters). kern-driver zeroes the
whole arena, states included, at load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kern_schema as ks
from kern_schema import Arg, Buffer, Call, ExprNode, Impl, Launch, Manifest, Module, Op, Program, Scratch, State, Var

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_plan import (GEMV_NORM_NB, GEMV_NORM_NB_SUFFIX, GEMV_TC_STEP, GEMV_UNROLL_SUFFIX, gemv_blocks,  # noqa: E402
                       gemv_entry_unroll, gemv_norm_entry_name, gemv_pass_entry, gemv_passes, gemv_tc_entry,
                       gemv_tc_unroll, gemv_tensor_core, plan_gemvp)
from export_weights import SCREEN_Q8, SCREEN_ROWS  # noqa: E402  (the names of the screened head's weights)
from qwen3_config import KV_PAGE_TOKENS, ConfigError, Qwen3Config, load_config  # noqa: E402

__all__ = ["GenError", "WiringError", "Kernel", "load_index", "Layout", "View", "make_layout",
           "build_manifest", "check_wiring", "kernels_by_op", "generate", "main"]

GEMM = "cublaslt.gemm_bf16_tn"
#: Triton's two hidden trailing params (global / profile scratch): always 0 (kernels-src/README.md).
TRITON_HIDDEN = ("global_scratch", "profile_scratch")
#: Logits per block of the argmax's first stage (kernels-src: recommended 2048 → 75 blocks for V=151936).
ARGMAX_BLOCK_LOGITS = 2048
#: Key splits of decode attention (kernels-src recommends 32): NKV × 32 = 256 programs ≥ the H200's 132 SMs.
DECODE_SPLITS = 32
#: The impls of the one `attention_decode` interface (same params; only kernels, launches and scratch differ):
#: `cuda` decode_attention_split + decode_attention_merge (decode_attention.cu, 2 launches), `cluster`
#: decode_attention_cluster (decode_attention.cu, one launch, no scratch), `triton` paged_decode_attention +
#: paged_decode_reduce (attention.py, 2 launches; with --fused-attention one launch and a counters state).
#: `rope-cluster` is not an impl of that interface but its own op, `attention_decode_rope`: one launch of
#: decode_attention_rope_cluster per layer does the attention prologue's decode work (q/k norm, rotary, the
#: token's k/v into the cache: qk_norm_rope_kv) and the cluster attention (5 launches per layer instead of 6).
DECODE_ATTENTION_IMPLS = ("cuda", "cluster", "rope-cluster", "triton")
#: The op of `rope-cluster` and its interface: qk_norm_rope_kv's params (qkv read only), then attention's.
ROPE_ATTENTION_OP = "attention_decode_rope"
DEFAULT_DECODE_ATTENTION = "rope-cluster"
#: Split stride of decode_attention_split (grid.y and the scratch; the kernel uses fewer splits on short contexts).
CUDA_DECODE_SPLITS = 32
#: decode_attention_cluster's compiled cluster (1, 8, 1): its grid.y.
CLUSTER_SPLITS = 8
#: The decode GEMV impls (`--gemv`): `gemv` (the default) every decode GEMV op that tools/gemv_plan.py
#: `gemv_tensor_core` picks on gemv_tc.cu's tensor-core entries (k a multiple of 128: every Qwen3 op; 4B −0.108
#: ms/token against session 30's o and down alone on them, 0.6B −0.004, session 32, NOTES.md 74), the others through
#: gemv.cu; `gemv-fma` every one through gemv.cu (the manifests before session 30); `persistent`
#: every one through gemv_persist.cu (one block per SM streaming its columns through bulk-copy FIFOs; gemv.cu
#: where tools/gemv_plan.py has no plan, e.g. 32B's down). Measured on the H200 (kern-run decode,
#: tools/bench_decode.py, --pdl; NOTES.md 20, 22): 0.6B 0.685 ms/token gemv.cu vs 0.815 persistent (gemv.cu
#: with two pipeline stages issued before the PDL wait; with one, 0.865 vs 0.820), 4B 2.675 vs 3.261.
GEMV_IMPLS = ("gemv", "gemv-fma", "persistent")
DEFAULT_GEMV = "gemv"
#: The decode program's last step, final norm + lm_head + greedy argmax (`--lm-head`): `dense` = the GEMV op
#: `gemv_norm_lm_head` into `logits`, then the op `argmax`; `screened` = the op LM_HEAD_SCREENED_OP, three launches
#: of lm_head_screen.cu + argmax.cu over an int8 copy of the head that the weights file carries
#: (tools/export_weights.py `lm_head.screen.q8`, `lm_head.screen.rows`): the token of kern_gemv_norm_m1 at ksplit 1
#: (the dense op's impl with `--gemv gemv`, the default) + argmax, bit for bit, from about
#: half the head's bytes (the proof: lm_head_screen.cu's header).
LM_HEAD_IMPLS = ("dense", "screened")
DEFAULT_LM_HEAD = "screened"
LM_HEAD_SCREENED_OP = "norm_lm_head_argmax_screened"
#: The screened head's entries of lm_head_screen.cubin (the same for every geometry).
LM_SCREEN_ENTRIES = ("kern_lmhead_screen_m1", "kern_lmhead_screen_m1_r8", "kern_lmhead_pick_m1")
#: The screened head's derived weights (tools/export_weights.py): int8 [V, H] and f32 [V, 4] (scale, error norm, row
#: norm, scale × int8 row norm).
LM_SCREEN_WEIGHTS = (SCREEN_Q8, SCREEN_ROWS)
#: Persistent GEMV entries by gemv.cu variant.
GEMVP_ENTRY = {"gemv_norm": "kern_gemvp_norm_m1", "gemv_norm_silu": "kern_gemvp_norm_silu_m1",
               "gemv_residual": "kern_gemvp_residual_m1"}
#: The opt-in one-launch decode attention (build_kernels.py --fused-attention) and its counters' state.
FUSED_ATTENTION = "paged_decode_attention_fused"
ATTN_COUNTERS = "attn_counters"
#: Bytes of one counter (i32) of the fused decode attention: one per (layer, kv head) for one sequence.
COUNTER_BYTES = 4
#: The decode GEMV k-split rule (`gemv_ksplit`; tools/kernels-src/README.md), from tools/bench_gemv.py on the H200.
GEMV_SMS = 132
#: Warps a GEMV launch needs to give every SM at least one 8-warp block.
GEMV_MIN_WARPS = 8 * GEMV_SMS
#: Elements of k a warp keeps after a split: 3 warp-wide 16-byte loads per row (below that, the split lost).
GEMV_MIN_K_PER_WARP = 768
#: ksplit values the GEMV kernels accept (divisors of their 8 warps).
GEMV_KSPLITS = (1, 2, 4, 8)


class GenError(ValueError):
    """The inputs (config, kernel index) cannot make a manifest; the message names what is at fault."""


class WiringError(AssertionError):
    """The manifest's wiring contradicts the layout it was built for (a generator bug)."""


# ---------------------------------------------------------------------------------------
# The kernel index (tools/build_kernels.py, format 1)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    name: str
    module: str  # cubin file in the kernels dir
    sha256: str
    entry: str
    params: tuple[str, ...]
    param_names: tuple[str, ...]
    aligned16: frozenset[str]
    block: tuple[int, int, int]
    shared_mem: int
    constexprs: dict[str, Any]
    doc: str
    #: dynamic shared memory that grows with a scalar param: shared_mem + Σ coeff × value (index format 1)
    shared_mem_per: dict[str, int] = field(default_factory=dict)
    #: the launch's preferred shared-memory carveout (percent 0..100, the manifest field `carveout`), or None
    carveout: int | None = None


def load_index(kernels_dir: str | Path, *, check_files: bool = True) -> dict[str, Kernel]:
    """Read DIR/index.json. With `check_files`, each module must exist with the index's sha256."""
    d = Path(kernels_dir)
    if d.is_file():
        raise GenError(f"{d}: a file; --kernels is the kernels directory"
                       + (f" ({d.parent})" if d.name == "index.json" else " (holding index.json)"))
    path = d / "index.json"
    rebuild = f"rebuild it with tools/build_kernels.py --out {d}"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise GenError(f"{path}: no kernel index (build one with tools/build_kernels.py --out {d})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GenError(f"{path}: not JSON ({e}); damaged or cut short? {rebuild}") from None
    if not isinstance(raw, dict):
        raise GenError(f"{path}: not a kernel index (a JSON {type(raw).__name__}, not an object); {rebuild}")
    if raw.get("format") != 1 or raw.get("target") != "sm_90":
        raise GenError(f"{path}: format {raw.get('format')!r} target {raw.get('target')!r}; expected 1, sm_90")
    if not isinstance(raw.get("kernels"), dict):
        raise GenError(f"{path}: no `kernels` object; {rebuild}")
    out: dict[str, Kernel] = {}
    hashes: dict[str, str] = {}
    for name, e in raw["kernels"].items():
        if not isinstance(e, dict):
            raise GenError(f"{path}: kernel `{name}` is not an object; {rebuild}")
        try:
            k = Kernel(name=name, module=e["module"], sha256=e["sha256"], entry=e["entry"],
                       params=tuple(e["params"]), param_names=tuple(e["param_names"]),
                       aligned16=frozenset(e.get("aligned16", ())), block=tuple(e["block"]),
                       shared_mem=int(e.get("shared_mem", 0)), constexprs=dict(e.get("constexprs", {})),
                       doc=e.get("doc", ""),
                       shared_mem_per={p: int(c) for p, c in e.get("shared_mem_per", {}).items()},
                       carveout=e.get("carveout"))
        except KeyError as missing:
            raise GenError(f"{path}: kernel `{name}` has no field {missing}") from None
        if k.carveout is not None and (type(k.carveout) is not int or not 0 <= k.carveout <= 100):
            raise GenError(f"{path}: kernel `{name}`: carveout {k.carveout!r} is not an int percent 0..100 (the launch's "
                           f"preferred shared-memory carveout; absent: the driver's choice); {rebuild}")
        if len(k.params) != len(k.param_names):
            raise GenError(f"{path}: kernel `{name}`: {len(k.params)} params but {len(k.param_names)} param_names")
        if not set(k.shared_mem_per) <= set(k.param_names):
            raise GenError(f"{path}: kernel `{name}`: shared_mem_per names {sorted(k.shared_mem_per)}, "
                           f"not all of them params")
        if not re.fullmatch(r"[0-9a-f]{64}", k.sha256):
            raise GenError(f"{path}: kernel `{name}`: sha256 {k.sha256!r} is not 64 hex digits")
        if hashes.setdefault(k.module, k.sha256) != k.sha256:
            raise GenError(f"{path}: module `{k.module}` has two different sha256 in the index")
        out[name] = k
    if check_files:
        for mod, sha in sorted(hashes.items()):
            f = d / mod
            if not f.is_file():
                raise GenError(f"{path}: module `{mod}` is not in {d}")
            if hashlib.sha256(f.read_bytes()).hexdigest() != sha:
                raise GenError(f"{path}: module `{mod}` does not have the index's sha256 (stale index?)")
    return out


# ---------------------------------------------------------------------------------------
# Layout: where things live inside the fused qkv buffer and inside a KV page
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """A column range of a row-major [tokens, row] buffer: starts `offset` bytes into each row."""

    buffer: str
    offset: int  # bytes from the row start (the call's `offset` for row 0)
    width: int  # elements


@dataclass(frozen=True)
class Layout:
    qkv: dict[str, View]  # "q", "k", "v" inside the fused qkv activation
    kv_layer_offsets: tuple[int, ...]  # byte offset of layer l's block inside a KV page
    kv_layer_bytes: int  # one layer's block: 16 tokens × NKV × (k|v) × D × bf16
    kv_page_bytes: int  # page stride passed to the attention kernels


def make_layout(cfg: Qwen3Config) -> Layout:
    """The layout the exporter and the kernels agree on (tools/README.md)."""
    q, kv = cfg.q_size, cfg.kv_size
    return Layout(
        qkv={"q": View("qkv", 0, q), "k": View("qkv", 2 * q, kv), "v": View("qkv", 2 * (q + kv), kv)},
        kv_layer_offsets=tuple(l * cfg.kv_layer_block_bytes for l in range(cfg.num_hidden_layers)),
        kv_layer_bytes=cfg.kv_layer_block_bytes,
        kv_page_bytes=cfg.kv_page_bytes,
    )


# ---------------------------------------------------------------------------------------
# Building blocks: ops wired from the index by parameter name; programs as named calls
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class P:
    """Launch arg source: forward interface param `name`."""

    name: str


@dataclass(frozen=True)
class S:
    """Launch arg source: the impl's scratch `name` (+ byte offset)."""

    name: str
    offset: int = 0


def launch_shared_mem(k: Kernel, args: Sequence[Arg], where: str) -> int:
    """Dynamic shared memory of one launch of `k`: the index's fixed bytes plus, for each param
    of `shared_mem_per`, its coefficient × the literal the launch passes (a manifest launch's
    `shared_mem` is a constant, so that param must be a literal)."""
    total = k.shared_mem
    for pname, coeff in sorted(k.shared_mem_per.items()):
        value = args[k.param_names.index(pname)].literal
        if not isinstance(value, int):
            raise GenError(f"{where}: `{pname}` sizes the dynamic shared memory, so it must be an integer literal")
        total += coeff * value
    return total


def gemv_ksplit(warps: int, k: int, *, after_attention: bool = False) -> int:
    """How many warps of a decode GEMV block split k (gemv.cu's `ksplit`), for a launch of
    `warps` warp groups (n/2 row pairs; n output columns for the SiLU variant) over `k`.

    A split costs every block a shared-memory reduction and a barrier, and shortens each warp's
    weight stream; it pays only when the launch would otherwise leave SMs idle. So: 1 when the
    launch has at least GEMV_MIN_WARPS warps (one 8-warp block per SM); else the smallest
    ksplit that reaches GEMV_MIN_WARPS while each warp keeps at least GEMV_MIN_K_PER_WARP
    elements of k; if none does, 1. Measured best ksplit standalone (tools/bench_gemv.py, H200,
    2026-11-29) and this base rule: 4B qkv, o, gate_up, down, lm_head: 1 (rule: 1);
    0.6B qkv 1, o 1 (512 warps: ksplit 4 would leave 512 of k per warp), down 4 (rule: same),
    gate_up 2 (rule: 1; 3072 warps already fill the GPU), lm_head 1. In the decode program
    the o-proj takes 2 instead (`after_attention`, below) where it runs on gemv.cu (`--gemv gemv-fma`; by default
    every decode GEMV of a Qwen3 geometry runs on gemv_tc.cu at ksplit 1, gemv_plan.gemv_tensor_core).

    `after_attention`: the GEMV that follows the decode attention in the decode program (the o-proj,
    GEMV_OPS_AFTER_ATTENTION) splits k at least in 2 where each warp keeps GEMV_MIN_K_PER_WARP of it.
    Measured in the program, not in a chain of GEMVs (kern-run Qwen3-4B decode, H200, session 10,
    NOTES.md 32): o at ksplit 2 2.481 ms/token against 2.535–2.536 at 1 in two alternating rounds
    (down at 2 or 4: 2.62–2.63; qkv at 2: 2.62–2.63; gate_up at 2: 2.58), while in the GEMV chain, where
    o follows the qkv GEMV, 1 was the faster. The attention's 64 CTAs held 137 KB of shared memory on
    their SMs (70.5 KB in sessions 19–20, 68.75 KB since 21), so o's blocks cannot fill the GPU evenly when they
    launch; twice as many blocks of half the work each balance it (a reading of the result, not measured
    separately). Measured with the PDL manifests only; `--no-pdl` manifests get the same split, unmeasured.

    Raises:
        GenError: `warps` or `k` not positive.
    """
    if warps <= 0 or k <= 0:
        raise GenError(f"GEMV of {warps} warps over k = {k}")
    if warps >= GEMV_MIN_WARPS:
        split = 1
    else:
        split = next((s for s in GEMV_KSPLITS[1:] if warps * s >= GEMV_MIN_WARPS), 1)
        if k // split < GEMV_MIN_K_PER_WARP:
            split = 1
    if after_attention and split == 1 and k // 2 >= GEMV_MIN_K_PER_WARP:
        split = 2
    return split


def ceil_div(e: ks.Expr, c: int) -> ExprNode:
    return ExprNode(ceil_div=(e, c))


# call-side arguments
def buf(name: str, offset: int = 0) -> Arg:
    return Arg(buf=name, offset=offset or None)


def state(name: str, offset: int) -> Arg:
    return Arg(state=name, offset=offset)


def var(name: str) -> Arg:
    return Arg(var=name)


def i32(v: int) -> Arg:
    return Arg(i32=v)


_SCALARS = set(ks.SCALARS)


def _literal(ptype: str, value: int | float, where: str) -> Arg:
    if ptype not in _SCALARS:
        raise GenError(f"{where}: a literal cannot fill a `{ptype}` parameter")
    if ptype in ("f32", "f64"):
        return Arg(**{ptype: float(value)})
    if value != int(value):
        raise GenError(f"{where}: {value!r} is not an integer for `{ptype}`")
    return Arg(**{ptype: int(value)})


def _kind(ptype: str) -> tuple[str, str]:
    """('buffer', dtype) / ('ptr', '') / ('scalar', type), ignoring direction."""
    t = ks.parse_param_type(ptype)
    return (t.kind, t.dtype or "") if t.kind != "scalar" else ("scalar", ptype)


class ManifestBuilder:
    """Accumulates declarations in first-use order, so the output is deterministic."""

    def __init__(self, cfg: Qwen3Config, index: dict[str, Kernel]):
        self.cfg = cfg
        self.index = index
        self.buffers: dict[str, Buffer] = {}
        self.modules: dict[str, Module] = {}
        self.ops: dict[str, Op] = {}
        self.iface: dict[str, list[tuple[str, str]]] = {}  # op -> [(param name, type)]
        self.programs: dict[str, Program] = {}

    # -- declarations --

    def buffer(self, name: str, dtype: str, shape: list[int | str], cls: str) -> None:
        assert name not in self.buffers, f"buffer `{name}` declared twice"
        self.buffers[name] = Buffer(dtype=dtype, shape=shape, class_=cls)

    def kernel(self, name: str) -> Kernel:
        k = self.index.get(name)
        if k is None:
            if name in LM_SCREEN_ENTRIES:  # not per geometry: an index built before the screened lm_head existed
                raise GenError(
                    f"the kernel index has no `{name}` (the screened lm_head, gen_qwen3's default --lm-head, needs "
                    "lm_head_screen.cubin); rebuild the kernels with the current tools/build_kernels.py, or generate "
                    "with --lm-head dense")
            raise GenError(
                f"the kernel index has no `{name}` (needed for hidden_size {self.cfg.hidden_size}); "
                f"rebuild it with tools/build_kernels.py --geometry for this model"
            )
        return k

    def constexpr(self, kname: str, name: str) -> int:
        """A compile-time constant of index kernel `kname` that the launch geometry depends on."""
        cx = self.kernel(kname).constexprs
        if name not in cx:
            raise GenError(f"kernel `{kname}`: the index gives no constexpr `{name}` (needed for its grid)")
        return int(cx[name])

    def launch(self, op: str, iface: list[tuple[str, str]], kname: str, grid: Sequence[ks.Expr],
               **wiring: P | S | int | float | str | ExprNode) -> Launch:
        """A launch of index kernel `kname`, its args built in the kernel's parameter order from
        `wiring` (kernel param name -> source). Every kernel param must be wired, nothing else."""
        k = self.kernel(kname)
        names = [n for n, _ in iface]
        args: list[Arg] = []
        for pname, ptype in zip(k.param_names, k.params):
            where = f"op `{op}`, kernel `{kname}`, param `{pname}` ({ptype})"
            if pname in TRITON_HIDDEN:
                args.append(Arg(u64=0))
                continue
            if pname not in wiring:
                raise GenError(f"{where}: not wired by the generator (kernel ABI changed?)")
            src = wiring[pname]
            if isinstance(src, P):
                if src.name not in names:
                    raise GenError(f"{where}: forwards `{src.name}`, which op `{op}` does not declare")
                itype = iface[names.index(src.name)][1]
                if _kind(itype) != _kind(ptype):
                    raise GenError(f"{where}: op param `{src.name}` is `{itype}`")
                args.append(Arg(param=names.index(src.name)))
            elif isinstance(src, S):
                args.append(Arg(scratch=src.name, offset=src.offset or None))
            elif isinstance(src, (str, ExprNode)):
                args.append(Arg(expr=src))
            else:
                if pname in k.aligned16 and int(src) % 16:
                    raise GenError(f"{where}: {src} must be a multiple of 16 (aligned16)")
                args.append(_literal(ptype, src, where))
        extra = sorted(set(wiring) - set(k.param_names))
        if extra:
            raise GenError(f"op `{op}`, kernel `{kname}`: wires {extra}, which the kernel does not have")
        mod = Path(k.module).stem
        self.modules.setdefault(mod, Module(source=k.module, sha256=k.sha256))
        return Launch(module=mod, entry=k.entry, params=list(k.params), block=list(k.block), grid=list(grid),
                      shared_mem=launch_shared_mem(k, args, f"op `{op}`, kernel `{kname}`") or None,
                      carveout=k.carveout, args=args)

    def op(self, name: str, iface: list[tuple[str, str]], launches: list[Launch],
           scratch: dict[str, Scratch] | None = None) -> None:
        assert name not in self.ops, f"op `{name}` declared twice"
        self.iface[name] = iface
        self.ops[name] = Op(params=[t for _, t in iface], impl=Impl(scratch=scratch or {}, launches=launches))

    def program(self, name: str) -> ProgramBuilder:
        pb = ProgramBuilder(self)
        self.programs[name] = Program(calls=pb.calls)
        return pb

    def manifest(self, model: str, chunk: int, *, fused_attention: bool = False) -> Manifest:
        """`fused_attention`: also the fused decode attention's counters, a per-sequence state sized by a
        var `seqs` (max 1: the provider serves one sequence), which no program passes to a kernel."""
        vars_ = {"tokens": Var(max=chunk)}
        states = {"kv": State(bytes_per_token=self.cfg.kv_bytes_per_token)}
        if fused_attention:
            vars_["seqs"] = Var(max=1)
            states[ATTN_COUNTERS] = State(bytes_per_seq=counter_layer_bytes(self.cfg) * self.cfg.num_hidden_layers)
        return Manifest(
            schema_version=ks.SCHEMA_VERSION, model=model, vars=vars_, states=states,
            buffers=self.buffers, modules=self.modules, ops=self.ops, programs=self.programs,
        )


@dataclass
class ProgramBuilder:
    b: ManifestBuilder
    calls: list[Call] = field(default_factory=list)

    def __call__(self, label: str, op: str, **args: Arg) -> None:
        """Append a call; `args` are keyed by the op's parameter names, in any order."""
        iface = self.b.iface[op]
        names = [n for n, _ in iface]
        if set(args) != set(names):
            raise GenError(f"call `{label}` to `{op}`: args {sorted(args)} != params {names}")
        assert all(c.label != label for c in self.calls), f"label `{label}` used twice"
        self.calls.append(Call(label=label, op=op, args=[args[n] for n in names]))


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

BF16_IN, BF16_OUT, BF16_INOUT = "in buffer<bf16>", "out buffer<bf16>", "inout buffer<bf16>"


def declare_buffers(b: ManifestBuilder, max_positions: int, *, lm_head: str = DEFAULT_LM_HEAD) -> None:
    """Every buffer of the manifest. `lm_head` (LM_HEAD_IMPLS): `screened` adds the head's int8 copy and its row
    table (LM_SCREEN_WEIGHTS) and has no `logits`."""
    c = b.cfg
    H, N, I, V, D = c.hidden_size, c.qkv_size, c.intermediate_size, c.vocab_size, c.head_dim
    T = "tokens"
    # Written by the caller before each run (tools/README.md).
    b.buffer("token_ids", "i64", [T], "input")
    b.buffer("positions", "i64", [T], "input")
    b.buffer("slot_mapping", "i64", [T], "input")
    b.buffer("seq_lens", "i32", [1], "input")
    b.buffer("cu_seqlens_q", "i32", [2], "input")
    b.buffer("block_table", "i32", [math.ceil(max_positions / KV_PAGE_TOKENS)], "input")
    b.buffer("next_token", "i64", [1], "output")
    # Activations.
    b.buffer("residual", "bf16", [T, H], "workspace")  # the residual stream
    b.buffer("x", "bf16", [T, H], "workspace")  # normed input of a sublayer
    b.buffer("qkv", "bf16", [T, N], "workspace")  # [q | k | v] per token; q rewritten in place by the prologue
    b.buffer("attn", "bf16", [T, c.q_size], "workspace")  # attention output
    b.buffer("h", "bf16", [T, H], "workspace")  # a sublayer's output, added into the residual next
    b.buffer("gate_up", "bf16", [T, 2 * I], "workspace")
    b.buffer("act", "bf16", [T, I], "workspace")
    if lm_head == "dense":
        b.buffer("logits", "bf16", [1, V], "workspace")  # decode only: last token
    # Weights (kern weights file, tools/export_weights.py).
    b.buffer("model.embed_tokens.weight", "bf16", [V, H], "weight")
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}."
        b.buffer(p + "input_layernorm.weight", "bf16", [H], "weight")
        b.buffer(p + "self_attn.qkv_proj.weight", "bf16", [N, H], "weight")
        b.buffer(p + "self_attn.q_norm.weight", "bf16", [D], "weight")
        b.buffer(p + "self_attn.k_norm.weight", "bf16", [D], "weight")
        b.buffer(p + "self_attn.o_proj.weight", "bf16", [H, c.q_size], "weight")
        b.buffer(p + "post_attention_layernorm.weight", "bf16", [H], "weight")
        b.buffer(p + "mlp.gate_up_proj.weight", "bf16", [2 * I, H], "weight")
        b.buffer(p + "mlp.down_proj.weight", "bf16", [H, I], "weight")
    b.buffer("model.norm.weight", "bf16", [H], "weight")
    if not c.tie_word_embeddings:
        b.buffer("lm_head.weight", "bf16", [V, H], "weight")
    b.buffer("rope.cos_sin", "f32", [max_positions, D], "weight")
    if lm_head == "screened":
        b.buffer(LM_SCREEN_WEIGHTS[0], "i8", [V, H], "weight")
        b.buffer(LM_SCREEN_WEIGHTS[1], "f32", [V, 4], "weight")


def pdl_kernel(b: ManifestBuilder, kname: str, pdl: bool) -> str:
    """`kname`, or with `pdl` its PDL form `kname_pdl` (built by tools/build_kernels.py unless --no-pdl)."""
    if not pdl:
        return kname
    name = kname + "_pdl"
    if name not in b.index:
        raise GenError(f"the kernel index has no `{name}` (the PDL form of `{kname}`, needed by --pdl, the "
                       f"default); rebuild it with tools/build_kernels.py --pdl (its default), or pass --no-pdl")
    if b.index[name].entry != b.index[kname].entry or b.index[name].params != b.index[kname].params:
        raise GenError(f"kernel `{name}` does not have the entry and params of `{kname}`")
    return name


def counter_layer_bytes(cfg: Qwen3Config) -> int:
    """Bytes of one layer's counters of the fused decode attention: one i32 per kv head (one sequence)."""
    return cfg.num_key_value_heads * COUNTER_BYTES


def fused_attention_kernel(b: ManifestBuilder, pdl: bool) -> str:
    """The fused decode attention's index NAME (`_pdl` form with `pdl`), which must be in the index."""
    name = FUSED_ATTENTION + ("_pdl" if pdl else "")
    if name not in b.index:
        flags = "--fused-attention" + (" --pdl" if pdl else "")
        raise GenError(f"the kernel index has no `{name}` (needed by --fused-attention{' --pdl' if pdl else ''}); "
                       f"rebuild it with tools/build_kernels.py {flags}")
    if pdl and (b.index[name].entry != b.index[FUSED_ATTENTION].entry
                or b.index[name].params != b.index[FUSED_ATTENTION].params):
        raise GenError(f"kernel `{name}` does not have the entry and params of `{FUSED_ATTENTION}`")
    return name


def _pdl(launch: Launch, pdl: bool) -> Launch:
    if pdl:
        launch.pdl = True
    return launch


def declare_ops(b: ManifestBuilder, layout: Layout, *, pdl: bool = False, fused_attention: bool = False,
                decode_attention: str = DEFAULT_DECODE_ATTENTION, lm_head: str = DEFAULT_LM_HEAD) -> None:
    """The ops other than the decode GEMVs. `decode_attention`: the impl of `attention_decode`
    (DECODE_ATTENTION_IMPLS). `fused_attention` (with `triton`): `attention_decode` is one launch of the
    fused kernel, with an extra interface param `counters` (module docstring). `pdl`: the decode-only
    ops (attention_decode, argmax)
    launch the PDL kernel forms with `"pdl": true`, and (unless the impl is rope-cluster, whose one launch
    does that work) decode's attention prologue is its own op `qk_norm_rope_kv_pdl` (prefill keeps
    `qk_norm_rope_kv`: there it follows a cuBLASLt built-in,
    after which the flag buys nothing, kern-verify E0091). The embedding, decode's first launch,
    stays an ordinary launch (a root of the graph: E0091 too)."""
    c = b.cfg
    H, D, NQ, NKV, V = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.vocab_size
    eps, T = c.rms_norm_eps, "tokens"
    q_stride = c.qkv_size  # elements between two tokens' q (the fused qkv row)
    max_pages = b.buffers["block_table"].shape[0]

    # What the attention kernels were compiled for must fit this geometry.
    group = NQ // NKV
    if decode_attention not in DECODE_ATTENTION_IMPLS:
        raise GenError(f"decode attention `{decode_attention}`: one of {', '.join(DECODE_ATTENTION_IMPLS)}")
    if fused_attention and decode_attention != "triton":
        raise GenError(f"--fused-attention is the Triton one-launch form: not with decode attention `{decode_attention}`")
    fused = fused_attention_kernel(b, pdl) if fused_attention else None
    decode_kernels = {"triton": ("paged_decode_attention", "paged_decode_reduce"),
                      "cuda": ("decode_attention_split", "decode_attention_merge"),
                      "cluster": ("decode_attention_cluster",),
                      "rope-cluster": ("decode_attention_rope_cluster",)}[decode_attention]
    for kname in ("qk_norm_rope_kv", "paged_prefill_attention") + decode_kernels + ((fused,) if fused else ()):
        if (d := b.constexpr(kname, "D")) != D:
            raise GenError(f"kernel `{kname}` is compiled for head_dim {d}; the config has head_dim {D}")
    group_limit = (("paged_decode_attention", "BLOCK_H"),) if decode_attention == "triton" else \
        ((decode_kernels[0], "MAX_G"),)
    for kname, cx in (("qk_norm_rope_kv", "BLOCK_G"),) + group_limit \
            + (((fused, "BLOCK_H"),) if fused else ()):
        if group > (n := b.constexpr(kname, cx)):
            raise GenError(f"kernel `{kname}` handles at most {n} q heads per kv head ({cx}); "
                           f"the config has {NQ}/{NKV} = {group}")

    iface = [("ids", "in buffer<i64>"), ("table", BF16_IN), ("out", BF16_OUT)]
    b.op("embedding", iface, [
        b.launch("embedding", iface, "embedding", [T, 1, 1],
                 ids=P("ids"), table=P("table"), out=P("out"), hidden=H, vocab=V),
    ])

    iface = [("x", BF16_IN), ("w", BF16_IN), ("out", BF16_OUT)]
    b.op("rms_norm", iface, [
        b.launch("rms_norm", iface, f"rms_norm_h{H}", [T, 1, 1], x=P("x"), w=P("w"), out=P("out"), eps=eps),
    ])

    iface = [("residual", BF16_INOUT), ("x", BF16_IN), ("w", BF16_IN), ("out", BF16_OUT)]
    b.op("add_rms_norm", iface, [
        b.launch("add_rms_norm", iface, f"add_rms_norm_h{H}", [T, 1, 1],
                 residual=P("residual"), x=P("x"), w=P("w"), out=P("out"), eps=eps),
    ])

    # C[m, n] = A[m, k] · W[n, k]ᵀ through the runtime's cuBLASLt built-in.
    iface = [("a", BF16_IN), ("w", BF16_IN), ("c", BF16_OUT), ("m", "i32"), ("n", "i32"), ("k", "i32")]
    b.op("gemm", iface, [Launch(extern=GEMM, args=[Arg(param=i) for i in range(6)])])

    # q/k RMS norm + rotary on q (in place) and k, k/v into the paged KV: one program per (token, kv head).
    iface = [("qkv", BF16_INOUT), ("positions", "in buffer<i64>"), ("slot_mapping", "in buffer<i64>"),
             ("q_norm_w", BF16_IN), ("k_norm_w", BF16_IN), ("cos_sin", "in buffer<f32>"), ("kv", "inout ptr")]
    # (with rope-cluster decode attention does decode's part: only prefill's op)
    for op_name, kname in [("qk_norm_rope_kv", "qk_norm_rope_kv")] + \
            ([("qk_norm_rope_kv_pdl", pdl_kernel(b, "qk_norm_rope_kv", pdl))]
             if pdl and decode_attention != "rope-cluster" else []):
        b.op(op_name, iface, [_pdl(
            b.launch(op_name, iface, kname, [T, NKV, 1],
                     qkv=P("qkv"), positions=P("positions"), slot_mapping=P("slot_mapping"),
                     q_norm_w=P("q_norm_w"), k_norm_w=P("k_norm_w"), cos_sin=P("cos_sin"), kv=P("kv"),
                     num_q_heads=NQ, num_kv_heads=NKV, eps=eps, page_bytes=layout.kv_page_bytes),
            kname != "qk_norm_rope_kv")])

    common = dict(num_q_heads=NQ, num_kv_heads=NKV, q_stride=q_stride, bt_stride=max_pages,
                  page_bytes=layout.kv_page_bytes, sm_scale=1.0 / math.sqrt(D))

    # Prefill: causal flash attention of the chunk against the cache (which already holds it).
    iface = [("q", BF16_IN), ("kv", "in ptr"), ("block_table", "in buffer<i32>"), ("seq_lens", "in buffer<i32>"),
             ("cu_seqlens_q", "in buffer<i32>"), ("out", BF16_OUT)]
    block_m = b.constexpr("paged_prefill_attention", "BLOCK_M")
    b.op("attention_prefill", iface, [
        b.launch("attention_prefill", iface, "paged_prefill_attention", [ceil_div(T, block_m), NQ, 1],
                 q=P("q"), kv=P("kv"), block_table=P("block_table"), seq_lens=P("seq_lens"),
                 cu_seqlens_q=P("cu_seqlens_q"), out=P("out"), **common),
    ])

    # Decode: split-KV partial results into private scratch, then a reduce. Fixed shapes (one token).
    if decode_attention != "triton":
        declare_cuda_decode_attention(b, decode_attention, pdl, common)
    else:
        splits = min(DECODE_SPLITS, b.constexpr("paged_decode_reduce", "MAX_SPLITS"))
        scratch = {"part_acc": Scratch(dtype="f32", shape=[NQ * splits * D]),
                   "part_ml": Scratch(dtype="f32", shape=[NQ * splits * 2])}
        if fused:
            # One launch: the last program of each kv head merges the splits; its counters are a state.
            if splits > (n := b.constexpr(fused, "MAX_SPLITS")):
                raise GenError(f"kernel `{fused}` merges at most {n} splits (MAX_SPLITS); decode uses {splits}")
            iface = [("q", BF16_IN), ("kv", "in ptr"), ("block_table", "in buffer<i32>"), ("seq_lens", "in buffer<i32>"),
                     ("counters", "inout ptr"), ("out", BF16_OUT)]
            b.op("attention_decode", iface, [
                _pdl(b.launch("attention_decode", iface, fused, [NKV, splits, 1],
                              q=P("q"), kv=P("kv"), block_table=P("block_table"), seq_lens=P("seq_lens"),
                              part_acc=S("part_acc"), part_ml=S("part_ml"), counters=P("counters"), out=P("out"),
                              **common), pdl),
            ], scratch=scratch)
        else:
            iface = [("q", BF16_IN), ("kv", "in ptr"), ("block_table", "in buffer<i32>"), ("seq_lens", "in buffer<i32>"),
                     ("out", BF16_OUT)]
            b.op("attention_decode", iface, [
                _pdl(b.launch("attention_decode", iface, pdl_kernel(b, "paged_decode_attention", pdl), [NKV, splits, 1],
                              q=P("q"), kv=P("kv"), block_table=P("block_table"), seq_lens=P("seq_lens"),
                              part_acc=S("part_acc"), part_ml=S("part_ml"), **common), pdl),
                _pdl(b.launch("attention_decode", iface, pdl_kernel(b, "paged_decode_reduce", pdl), [NQ, 1, 1],
                              part_acc=S("part_acc"), part_ml=S("part_ml"), out=P("out"), num_q_heads=NQ,
                              num_splits=splits), pdl),
            ], scratch=scratch)

    iface = [("gate_up", BF16_IN), ("out", BF16_OUT)]
    block = b.constexpr("silu_and_mul", "BLOCK")
    b.op("silu_and_mul", iface, [
        b.launch("silu_and_mul", iface, "silu_and_mul", [T, ceil_div(c.intermediate_size, block), 1],
                 gate_up=P("gate_up"), out=P("out"), inter=c.intermediate_size),
    ])

    if lm_head == "screened":
        declare_lm_head_screened(b, pdl)
        return
    # Greedy sampling over one row of logits: two stages through private scratch.
    parts = math.ceil(V / ARGMAX_BLOCK_LOGITS)
    iface = [("logits", BF16_IN), ("out", "out buffer<i64>")]
    b.op("argmax", iface, [
        _pdl(b.launch("argmax", iface, pdl_kernel(b, "argmax_partial", pdl), [parts, 1, 1],
                      logits=P("logits"), partial=S("partial"), n=V, parts=parts), pdl),
        _pdl(b.launch("argmax", iface, pdl_kernel(b, "argmax_reduce", pdl), [1, 1, 1], partial=S("partial"),
                      out=P("out"), parts=parts), pdl),
    ], scratch={"partial": Scratch(dtype="u64", shape=[parts])})


def lm_screen_entry(b: ManifestBuilder, k: int) -> str:
    """The screen entry for rows of k elements: `kern_lmhead_screen_m1_r8` where one stage of its loads holds a lane's
    whole row (k ≤ 16·32·LOADS_PER_STAGE: 1,024; twice the rows per block, half the per-block prologues, measured
    faster for short rows), else `kern_lmhead_screen_m1`; then its row-group form `_pP` (P = lm_screen_groups of the
    head's row groups) where the index has it and a row's loads are one stage (k ≤ 16·32·LOADS_PER_STAGE: 2,560 for
    the default entry; longer rows, untimed in that form, keep one group per block)."""
    def one_stage(entry: str) -> bool:  # a lane's loads of a k-element row fit one of the entry's stages
        return k <= 16 * 32 * b.constexpr(entry, "LOADS_PER_STAGE")

    r8 = "kern_lmhead_screen_m1_r8"
    base = r8 if r8 in b.index and one_stage(r8) else "kern_lmhead_screen_m1"
    if not one_stage(base):  # rows of two or more load stages (8B, 14B, 32B): the row-group forms were measured
        return base  # on one-stage rows only (4B, 0.6B; NOTES.md 68)
    rows_per_group = b.constexpr(base, "WARPS") * b.constexpr(base, "ROWS_PER_WARP")
    groups = lm_screen_groups(math.ceil(b.cfg.vocab_size / rows_per_group))
    return f"{base}_p{groups}" if groups > 1 and f"{base}_p{groups}" in b.index else base


def lm_screen_groups(nb1: int, sms: int = GEMV_SMS) -> int:
    """Row groups per screen block for a head of nb1 groups (rows / (8 warps × rows per warp)): the fewest that make
    the screen one wave of two blocks per SM, ceil_div(nb1, 2·sms) (the Qwen3 vocabulary: 18 groups of 32 rows, or 9
    of 64, on the H200's 132 SMs). H200, kern-run decode at 128 cached tokens, tokens identical (NOTES.md 68): 4B
    P = 2 −0.007 ms/token, 4 −0.012, 8 −0.006, 18 −0.016; 0.6B (`_r8`) P = 2 +0.001, 4 +0.002, 9 −0.006: a
    partial last wave costs what the fewer per-block prologues give. The generator uses the `_pP` entry when the
    index has it (lm_head_screen.cu builds P = 18 and, for `_r8`, 9), else the one-group entry."""
    return max(1, math.ceil(nb1 / (2 * sms)))


def declare_lm_head_screened(b: ManifestBuilder, pdl: bool) -> None:
    """The op LM_HEAD_SCREENED_OP (x, norm_w, q8, rows, w, out): next_token = argmax_v bf16(rmsnorm(x)·norm_w ·
    w[v]), bit for bit the token of kern_gemv_norm_m1 at ksplit 1 + argmax (`gemv_norm_lm_head` + `argmax` with
    `--gemv gemv`), in three launches: kern_lmhead_screen_m1 or the form `lm_screen_entry` picks (bounds
    from the int8 copy q8 [V, H] with rows f32 [V, 4]; grid ceil_div(row groups, PASSES)), kern_lmhead_pick_m1
    (the candidates' dense logits from w), argmax_reduce (over the pick's per-block keys). Scratch: the normalized
    x, the bounds' keys, the screen's and the pick's per-block results. The three are PDL launches with `pdl` (the
    screen follows the last down GEMV)."""
    c = b.cfg
    H, V, eps = c.hidden_size, c.vocab_size, c.rms_norm_eps
    if H % 16:
        raise GenError(f"--lm-head screened: hidden_size {H} is not a multiple of 16 (kern_lmhead_screen_m1 loads 16 "
                       "int8 at a time); use --lm-head dense")
    screen, pick = lm_screen_entry(b, H), "kern_lmhead_pick_m1"
    rows_per_group = b.constexpr(screen, "WARPS") * b.constexpr(screen, "ROWS_PER_WARP")
    nb1, parts = math.ceil(V / rows_per_group), math.ceil(V / b.constexpr(pick, "PICK_ROWS"))
    groups = b.constexpr(screen, "PASSES") if "PASSES" in b.kernel(screen).constexprs else 1  # (older indexes: 1)
    iface = [("x", BF16_IN), ("norm_w", BF16_IN), ("q8", "in buffer<i8>"), ("rows", "in buffer<f32>"),
             ("w", BF16_IN), ("out", "out buffer<i64>")]
    op = LM_HEAD_SCREENED_OP
    b.op(op, iface, [
        _pdl(b.launch(op, iface, screen, [math.ceil(nb1 / groups), 1, 1], x=P("x"), norm_w=P("norm_w"), q8=P("q8"),
                      rows=P("rows"), xn=S("xn"), keys=S("keys"), bpart=S("bpart"), n=V, k=H, eps=eps), pdl),
        _pdl(b.launch(op, iface, pick, [parts, 1, 1], xn=S("xn"), w=P("w"), keys=S("keys"), bpart=S("bpart"),
                      nb1=nb1, partial=S("partial"), n=V, k=H), pdl),
        _pdl(b.launch(op, iface, pdl_kernel(b, "argmax_reduce", pdl), [1, 1, 1], partial=S("partial"),
                      out=P("out"), parts=parts), pdl),
    ], scratch={"xn": Scratch(dtype="bf16", shape=[H]), "keys": Scratch(dtype="u16", shape=[V]),
                "bpart": Scratch(dtype="u32", shape=[nb1]), "partial": Scratch(dtype="u64", shape=[parts])})


def declare_cuda_decode_attention(b: ManifestBuilder, impl: str, pdl: bool, common: dict) -> None:
    """`attention_decode` through decode_attention.cu, the same interface as the Triton pair: `cuda` =
    decode_attention_split (grid [NKV, CUDA_DECODE_SPLITS, 1], partials into private scratch; it uses fewer
    splits on short contexts) + decode_attention_merge ([NQ, 1, 1]); `cluster` = decode_attention_cluster
    (grid [NKV, 8, 1], its compiled cluster; no scratch); `rope-cluster` = the op ROPE_ATTENTION_OP, one launch
    of decode_attention_rope_cluster (the same grid; qk_norm_rope_kv's interface and work, then attention's).
    `pdl`: their `_pdl` forms, launched with the flag."""
    c = b.cfg
    NQ, NKV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    if impl == "rope-cluster":
        kname = pdl_kernel(b, "decode_attention_rope_cluster", pdl)
        if (n := b.constexpr(kname, "CLUSTER")) != CLUSTER_SPLITS:
            raise GenError(f"kernel `{kname}` is compiled for clusters of {n}; the generator launches {CLUSTER_SPLITS}")
        iface = [("qkv", BF16_IN), ("positions", "in buffer<i64>"), ("slot_mapping", "in buffer<i64>"),
                 ("q_norm_w", BF16_IN), ("k_norm_w", BF16_IN), ("cos_sin", "in buffer<f32>"), ("kv", "inout ptr"),
                 ("block_table", "in buffer<i32>"), ("seq_lens", "in buffer<i32>"), ("out", BF16_OUT)]
        b.op(ROPE_ATTENTION_OP, iface, [
            _pdl(b.launch(ROPE_ATTENTION_OP, iface, kname, [NKV, CLUSTER_SPLITS, 1],
                          **{name: P(name) for name, _ in iface}, **common, eps=c.rms_norm_eps), pdl),
        ])
        return
    iface = [("q", BF16_IN), ("kv", "in ptr"), ("block_table", "in buffer<i32>"), ("seq_lens", "in buffer<i32>"),
             ("out", BF16_OUT)]
    io = dict(q=P("q"), kv=P("kv"), block_table=P("block_table"), seq_lens=P("seq_lens"))
    if impl == "cluster":
        kname = pdl_kernel(b, "decode_attention_cluster", pdl)
        if (n := b.constexpr(kname, "CLUSTER")) != CLUSTER_SPLITS:
            raise GenError(f"kernel `{kname}` is compiled for clusters of {n}; the generator launches {CLUSTER_SPLITS}")
        b.op("attention_decode", iface, [
            _pdl(b.launch("attention_decode", iface, kname, [NKV, CLUSTER_SPLITS, 1], out=P("out"), **io, **common),
                 pdl),
        ])
        return
    splits = min(CUDA_DECODE_SPLITS, b.constexpr("decode_attention_merge", "MAX_SPLITS"))
    scratch = {"part_acc": Scratch(dtype="f32", shape=[NQ * splits * D]),
               "part_ml": Scratch(dtype="f32", shape=[NQ * splits * 2])}
    b.op("attention_decode", iface, [
        _pdl(b.launch("attention_decode", iface, pdl_kernel(b, "decode_attention_split", pdl), [NKV, splits, 1],
                      part_acc=S("part_acc"), part_ml=S("part_ml"), **io, **common), pdl),
        _pdl(b.launch("attention_decode", iface, pdl_kernel(b, "decode_attention_merge", pdl), [NQ, 1, 1],
                      part_acc=S("part_acc"), part_ml=S("part_ml"), seq_lens=P("seq_lens"), out=P("out"),
                      num_q_heads=NQ, num_splits=splits), pdl),
    ], scratch=scratch)


#: Decode GEMV ops (one token): op name -> gemv.cu variant. Each op's impl is one launch of
#: `kern_{variant}_m1` whose n, k, ksplit, grid and shared memory are fixed for its shape.
GEMV_OPS = {
    "gemv_norm_qkv": "gemv_norm",
    "gemv_residual_o_proj": "gemv_residual",
    "gemv_norm_silu_gate_up": "gemv_norm_silu",
    "gemv_residual_down_proj": "gemv_residual",
    "gemv_norm_lm_head": "gemv_norm",
}
#: The decode GEMV op whose next launch in the decode program is the decode attention (or, for the
#: impls that are not fused with it, its qk-norm/rotary/KV prologue kernel): qkv. gemv_plan.gemv_entry_unroll keeps the
#: U = 4 entries for it; every other decode GEMV (followed by a GEMV, or lm_head by the argmax) may take `_u5`.
GEMV_OPS_BEFORE_ATTENTION = frozenset({"gemv_norm_qkv"})
#: The decode GEMV op launched right after the decode attention: `gemv_ksplit(..., after_attention=True)`.
GEMV_OPS_AFTER_ATTENTION = frozenset({"gemv_residual_o_proj"})


def gemv_norm_entry(b: ManifestBuilder, kname: str, k: int, threads: int) -> str:
    """The entry of the norm GEMV `kname` over `k` (gemv_plan.gemv_norm_entry_name: its batched-prologue form where
    gemv_norm_batched picks it and the index has it, else `kname`). Raises GenError where the index's `_nb2` entry is
    not the form this generator knows (NORM_NB ≠ GEMV_NORM_NB: a stale index)."""
    nb = gemv_norm_entry_name(kname, k, lambda name: name in b.index, threads)
    if nb == kname:
        return kname
    if (got := b.constexpr(nb, "NORM_NB")) != GEMV_NORM_NB:
        raise GenError(f"kernel `{nb}` in the index has NORM_NB {got}, not {GEMV_NORM_NB}: a stale index; rebuild the "
                       f"kernels with tools/build_kernels.py")
    return nb


def declare_gemv(b: ManifestBuilder, op: str, n: int, k: int, eps: float, *, pdl: bool = False,
                 persistent: bool = False, tensor_core: bool = True) -> None:
    """One decode GEMV op (m = 1) over a weight of n output columns by k.

    Interfaces: `gemv_norm` and `gemv_norm_silu` take (x, norm_w, w, out): out = rmsnorm(x)·norm_w
    times wᵀ (the SiLU variant: silu(gate)·up, w holding 2n rows); `gemv_residual` takes
    (x, w, residual): residual += x·wᵀ in place. Every pointer is a whole manifest buffer
    (256-byte aligned, so 16-byte aligned as gemv.cu requires); k must be a multiple of 8.
    `persistent`: the impl is gemv_persist.cu's entry (GEMVP_ENTRY) with tools/gemv_plan.py's plan
    (grid one block per SM, `piece_chunks`, dynamic shared memory), the same interface and roundings;
    where the plan does not apply (k not a multiple of 256, or fewer than 2 slots per warp fit beside x:
    32B's down) gemv.cu's entry instead. Otherwise, with `tensor_core`, the ops that gemv_plan.gemv_tensor_core picks
    (k a multiple of 128) launch gemv_tc.cu's M = 1 entry
    (`kern_gemvtc_*`, the same interface and roundings, the dots on the tensor cores; `_u5` where
    gemv_plan.gemv_tc_unroll says so; grid ceil_div(n, 16), gate_up ceil_div(n, 8); ksplit 1) where the index has it,
    and every other op gemv.cu's.
    With `pdl`, the launch is a programmatic dependent launch (manifest `"pdl": true`):
    both GEMV sources issue their first weight loads, then `griddepcontrol.wait`, so they stream weights
    while the kernel before drains. Every decode GEMV follows a kernel launch, never a
    built-in, so the attribute always has an effect (kern-verify E0091).
    """
    variant = GEMV_OPS[op]
    if k % 8:
        raise GenError(f"op `{op}`: k = {k} is not a multiple of 8 (gemv.cu loads 8 bf16 at a time)")
    if variant == "gemv_residual":
        iface = [("x", BF16_IN), ("w", BF16_IN), ("residual", BF16_INOUT)]
        wiring: dict[str, P | int | float] = dict(x=P("x"), w=P("w"), residual=P("residual"))
    else:
        iface = [("x", BF16_IN), ("norm_w", BF16_IN), ("w", BF16_IN), ("out", BF16_OUT)]
        wiring = dict(x=P("x"), norm_w=P("norm_w"), w=P("w"), y=P("out"), eps=eps)
    plan = plan_gemvp(n, k, variant == "gemv_norm_silu", sms=GEMV_SMS) if persistent else None
    if plan is not None:
        if GEMVP_ENTRY[variant] not in b.index:
            raise GenError(f"the kernel index has no `{GEMVP_ENTRY[variant]}` (gemv_persist.cu, needed by "
                           f"--gemv persistent); rebuild it with tools/build_kernels.py, or pass --gemv gemv")
        launch = b.launch(op, iface, GEMVP_ENTRY[variant], [plan.grid, 1, 1], n=n, k=k,
                          piece_chunks=plan.piece_chunks, **wiring)
        launch.shared_mem = plan.smem
    elif tensor_core and (tc := gemv_tc_entry(f"kern_{variant}_m1")) in b.index and gemv_tensor_core(variant, k):
        # gemv_tc.cu (an index built before session 30 has none: gemv.cu's entry below)
        if (step := b.constexpr(tc, "TC_STEP")) != GEMV_TC_STEP or b.constexpr(tc, "M") != 1:
            raise GenError(f"kernel `{tc}` in the index has TC_STEP {step}, M {b.constexpr(tc, 'M')} (this generator "
                           f"knows TC_STEP {GEMV_TC_STEP}, M 1): a stale index; rebuild the kernels with "
                           f"tools/build_kernels.py")
        unroll = gemv_tc_unroll(k, op in GEMV_OPS_BEFORE_ATTENTION)
        if (tcu := tc + GEMV_UNROLL_SUFFIX[unroll]) not in b.index or b.constexpr(tcu, "UNROLL") != unroll:
            raise GenError(f"op `{op}` (k = {k}) wants `{tcu}` ({unroll} steps per stage), which the kernel index lacks "
                           "or builds with another UNROLL: rebuild the kernels with tools/build_kernels.py")
        grid = [gemv_blocks(n, b.constexpr(tcu, "COLS_PER_WARP"), b.constexpr(tcu, "WARPS"), 1), 1, 1]
        launch = b.launch(op, iface, tcu, grid, n=n, k=k, ksplit=1, **wiring)
    else:
        base = f"kern_{variant}_m1"
        if (m := b.constexpr(base, "M")) != 1:
            raise GenError(f"kernel `{base}` is compiled for M = {m}; decode runs one token")
        cols, warps_per_block = b.constexpr(base, "COLS_PER_WARP"), b.constexpr(base, "WARPS")
        ksplit = gemv_ksplit(math.ceil(n / cols), k, after_attention=op in GEMV_OPS_AFTER_ATTENTION)
        unroll = gemv_entry_unroll(k, ksplit, op in GEMV_OPS_BEFORE_ATTENTION)
        kname = base + GEMV_UNROLL_SUFFIX[unroll]
        if kname not in b.index:
            raise GenError(f"op `{op}` (k = {k}, ksplit {ksplit}) wants `{kname}` ({unroll} loads per row per stage), "
                           f"which the kernel index lacks: rebuild the kernels with tools/build_kernels.py")
        if (got := b.constexpr(kname, "UNROLL")) != unroll:
            raise GenError(f"kernel `{kname}` in the index has UNROLL {got}, not {unroll}: a stale index; rebuild the "
                           f"kernels with tools/build_kernels.py")
        if variant != "gemv_residual":
            kname = gemv_norm_entry(b, kname, k, 32 * warps_per_block)
        assert warps_per_block % ksplit == 0, (kname, warps_per_block, ksplit)
        passes = gemv_passes(n, cols, warps_per_block, ksplit, sms=GEMV_SMS) if op in GEMV_OPS_BEFORE_ATTENTION else 1
        try:  # the row-pass module where gemv_plan.gemv_passes says so: room for the attention's CTAs beside it
            kname = gemv_pass_entry(kname, passes, lambda nm: b.index[nm].constexprs if nm in b.index else None,
                                    who=f"op `{op}` (n = {n}, ksplit {ksplit})")
        except ValueError as e:
            raise GenError(str(e)) from None
        grid = [gemv_blocks(n, cols, warps_per_block, ksplit, passes), 1, 1]
        launch = b.launch(op, iface, kname, grid, n=n, k=k, ksplit=ksplit, **wiring)
    if pdl:
        launch.pdl = True
    b.op(op, iface, [launch])


def declare_gemv_ops(b: ManifestBuilder, *, pdl: bool = False, gemv: str = DEFAULT_GEMV,
                     lm_head: str = DEFAULT_LM_HEAD) -> None:
    """The decode program's fused GEMV ops (prefill keeps cuBLASLt and the norm kernels); `gemv` picks
    their impls (GEMV_IMPLS); with `lm_head` screened there is no `gemv_norm_lm_head`."""
    if gemv not in GEMV_IMPLS:
        raise GenError(f"--gemv {gemv!r}: one of {', '.join(GEMV_IMPLS)}")
    c = b.cfg
    H, I, eps = c.hidden_size, c.intermediate_size, c.rms_norm_eps
    for op, (n, k) in {"gemv_norm_qkv": (c.qkv_size, H), "gemv_residual_o_proj": (H, c.q_size),
                       "gemv_norm_silu_gate_up": (I, H), "gemv_residual_down_proj": (H, I),
                       "gemv_norm_lm_head": (c.vocab_size, H)}.items():
        if op == "gemv_norm_lm_head" and lm_head != "dense":
            continue
        declare_gemv(b, op, n, k, eps, pdl=pdl, persistent=gemv == "persistent", tensor_core=gemv == "gemv")


def forward(b: ManifestBuilder, layout: Layout, program: str, *, pdl: bool = False,
            fused_attention: bool = False, rope_attention: bool = False, lm_head: str = DEFAULT_LM_HEAD) -> None:
    """One program: `prefill` (KV only) or `decode` (KV, then next_token). `rope_attention`: decode's
    attention is ROPE_ATTENTION_OP (with the prologue) instead of qk_norm_rope_kv + attention_decode."""
    c = b.cfg
    H, N, I, L = c.hidden_size, c.qkv_size, c.intermediate_size, c.num_hidden_layers
    decode = program == "decode"
    call = b.program(program)
    tokens = var("tokens")
    q = layout.qkv["q"]

    call("embed", "embedding", ids=buf("token_ids"), table=buf("model.embed_tokens.weight"), out=buf("residual"))
    if decode:
        return decode_layers(b, layout, call, pdl=pdl, fused_attention=fused_attention,
                             rope_attention=rope_attention, lm_head=lm_head)
    for l in range(L):
        w = f"model.layers.{l}."
        # residual = embedding (layer 0) or residual + previous MLP output; x = rmsnorm(residual) * w
        if l == 0:
            call("l0.input_norm", "rms_norm", x=buf("residual"), w=buf(w + "input_layernorm.weight"), out=buf("x"))
        else:
            call(f"l{l}.input_norm", "add_rms_norm", residual=buf("residual"), x=buf("h"),
                 w=buf(w + "input_layernorm.weight"), out=buf("x"))
        call(f"l{l}.qkv_proj", "gemm", a=buf("x"), w=buf(w + "self_attn.qkv_proj.weight"), c=buf("qkv"),
             m=tokens, n=i32(N), k=i32(H))
        call(f"l{l}.qk_norm_rope", "qk_norm_rope_kv", qkv=buf("qkv"), positions=buf("positions"),
             slot_mapping=buf("slot_mapping"), q_norm_w=buf(w + "self_attn.q_norm.weight"),
             k_norm_w=buf(w + "self_attn.k_norm.weight"), cos_sin=buf("rope.cos_sin"),
             kv=state("kv", layout.kv_layer_offsets[l]))
        if l == L - 1:
            break  # prefill: the last layer's KV is written; everything after feeds only logits
        kv = state("kv", layout.kv_layer_offsets[l])
        call(f"l{l}.attn", "attention_prefill", q=buf(q.buffer, q.offset), kv=kv,
             block_table=buf("block_table"), seq_lens=buf("seq_lens"), cu_seqlens_q=buf("cu_seqlens_q"),
             out=buf("attn"))
        call(f"l{l}.o_proj", "gemm", a=buf("attn"), w=buf(w + "self_attn.o_proj.weight"), c=buf("h"),
             m=tokens, n=i32(H), k=i32(c.q_size))
        call(f"l{l}.post_norm", "add_rms_norm", residual=buf("residual"), x=buf("h"),
             w=buf(w + "post_attention_layernorm.weight"), out=buf("x"))
        call(f"l{l}.gate_up_proj", "gemm", a=buf("x"), w=buf(w + "mlp.gate_up_proj.weight"), c=buf("gate_up"),
             m=tokens, n=i32(2 * I), k=i32(H))
        call(f"l{l}.act", "silu_and_mul", gate_up=buf("gate_up"), out=buf("act"))
        call(f"l{l}.down_proj", "gemm", a=buf("act"), w=buf(w + "mlp.down_proj.weight"), c=buf("h"),
             m=tokens, n=i32(H), k=i32(I))


#: Per-layer call labels of the decode program (6 kernel launches with the default decode attention, 7 with
#: a two-launch one; with rope-cluster 5: no `qk_norm_rope`).
DECODE_LAYER_CALLS = ("norm_qkv", "qk_norm_rope", "attn", "o_proj_add", "norm_gate_up_silu", "down_proj_add")


def decode_layers(b: ManifestBuilder, layout: Layout, call: ProgramBuilder, *, pdl: bool = False,
                  fused_attention: bool = False, rope_attention: bool = False,
                  lm_head: str = DEFAULT_LM_HEAD) -> None:
    """Decode after the embedding: every layer through the fused GEMV ops, then logits and argmax.
    `fused_attention`: each layer's attention also gets its own counters, `attn_counters` + l·NKV·4.
    `rope_attention`: each layer's `attn` call is ROPE_ATTENTION_OP on the whole qkv row (it also does
    `qk_norm_rope`'s work, which then has no call).

    `residual` holds the hidden state throughout (the embedding wrote it): each layer reads it
    normed inside `gemv_norm_qkv`, and the two `gemv_residual` ops add the attention and MLP
    outputs into it in place, rounding where HF rounds.
    """
    c = b.cfg
    q = layout.qkv["q"]
    for l in range(c.num_hidden_layers):
        w = f"model.layers.{l}."
        kv = state("kv", layout.kv_layer_offsets[l])
        call(f"l{l}.norm_qkv", "gemv_norm_qkv", x=buf("residual"), norm_w=buf(w + "input_layernorm.weight"),
             w=buf(w + "self_attn.qkv_proj.weight"), out=buf("qkv"))
        prologue = dict(qkv=buf("qkv"), positions=buf("positions"), slot_mapping=buf("slot_mapping"),
                        q_norm_w=buf(w + "self_attn.q_norm.weight"), k_norm_w=buf(w + "self_attn.k_norm.weight"),
                        cos_sin=buf("rope.cos_sin"), kv=kv)
        if rope_attention:
            call(f"l{l}.attn", ROPE_ATTENTION_OP, **prologue, block_table=buf("block_table"),
                 seq_lens=buf("seq_lens"), out=buf("attn"))
        else:
            call(f"l{l}.qk_norm_rope", "qk_norm_rope_kv_pdl" if pdl else "qk_norm_rope_kv", **prologue)
        counters = {"counters": state(ATTN_COUNTERS, l * counter_layer_bytes(c))} if fused_attention else {}
        if not rope_attention:
            call(f"l{l}.attn", "attention_decode", q=buf(q.buffer, q.offset), kv=kv,
                 block_table=buf("block_table"), seq_lens=buf("seq_lens"), out=buf("attn"), **counters)
        call(f"l{l}.o_proj_add", "gemv_residual_o_proj", x=buf("attn"), w=buf(w + "self_attn.o_proj.weight"),
             residual=buf("residual"))
        call(f"l{l}.norm_gate_up_silu", "gemv_norm_silu_gate_up", x=buf("residual"),
             norm_w=buf(w + "post_attention_layernorm.weight"), w=buf(w + "mlp.gate_up_proj.weight"),
             out=buf("act"))
        call(f"l{l}.down_proj_add", "gemv_residual_down_proj", x=buf("act"), w=buf(w + "mlp.down_proj.weight"),
             residual=buf("residual"))
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    if lm_head == "screened":
        call("norm_lm_head_argmax", LM_HEAD_SCREENED_OP, x=buf("residual"), norm_w=buf("model.norm.weight"),
             q8=buf(LM_SCREEN_WEIGHTS[0]), rows=buf(LM_SCREEN_WEIGHTS[1]), w=buf(head), out=buf("next_token"))
        return
    call("norm_lm_head", "gemv_norm_lm_head", x=buf("residual"), norm_w=buf("model.norm.weight"), w=buf(head),
         out=buf("logits"))
    call("sample", "argmax", logits=buf("logits"), out=buf("next_token"))


def build_manifest(cfg: Qwen3Config, index: dict[str, Kernel], *, chunk: int = 2048,
                   max_positions: int | None = None, layout: Layout | None = None,
                   model: str | None = None, pdl: bool = True, fused_attention: bool = False,
                   decode_attention: str | None = None, gemv: str = DEFAULT_GEMV,
                   lm_head: str = DEFAULT_LM_HEAD) -> Manifest:
    """The manifest of `cfg`, checked by `check_wiring` against `layout` (default: `make_layout(cfg)`).
    `pdl` (default True, as the CLI's --pdl; False = --no-pdl): every decode launch but the first (the
    embedding) is a programmatic dependent launch:
    the GEMVs (see `declare_gemv`) and the PDL kernel forms of the attention prologue, decode
    attention and argmax (see `declare_ops`; the index must have the PDL forms: build_kernels.py without --no-pdl).
    `fused_attention`: decode attention in one launch with per-layer counters in the state
    `attn_counters` (module docstring; the index must come from build_kernels.py --fused-attention).
    `decode_attention`: the impl of the `attention_decode` op (DECODE_ATTENTION_IMPLS; default
    DEFAULT_DECODE_ATTENTION, `triton` with `fused_attention`). `gemv`: the impls of the decode GEMV
    ops (GEMV_IMPLS; see `declare_gemv`). `lm_head`: the decode program's final norm + lm_head + argmax
    (LM_HEAD_IMPLS; `screened` needs the weights file's LM_SCREEN_WEIGHTS)."""
    if lm_head not in LM_HEAD_IMPLS:
        raise GenError(f"--lm-head {lm_head!r}: one of {', '.join(LM_HEAD_IMPLS)}")
    decode_attention = decode_attention or ("triton" if fused_attention else DEFAULT_DECODE_ATTENTION)
    if not 1 <= chunk <= 1 << 20:
        raise GenError(f"--chunk {chunk}: must be in 1 .. {1 << 20}")
    if max_positions is not None and max_positions < 1:  # 0 once meant the default, -5 a [-5, 128] table
        raise GenError(f"--max-positions {max_positions}: must be >= 1 (omit it for the config's "
                       f"max_position_embeddings, {cfg.max_position_embeddings})")
    if model is not None and not model.strip():
        raise GenError(f"--model {model!r}: an empty label (omit it for {cfg.name!r})")
    positions = max_positions if max_positions is not None else cfg.max_position_embeddings
    layout = layout or make_layout(cfg)
    b = ManifestBuilder(cfg, index)
    declare_buffers(b, positions, lm_head=lm_head)
    declare_ops(b, layout, pdl=pdl, fused_attention=fused_attention, decode_attention=decode_attention,
                lm_head=lm_head)
    declare_gemv_ops(b, pdl=pdl, gemv=gemv, lm_head=lm_head)
    forward(b, layout, "prefill")
    forward(b, layout, "decode", pdl=pdl, fused_attention=fused_attention,
            rope_attention=decode_attention == "rope-cluster", lm_head=lm_head)
    m = b.manifest(model or cfg.name, chunk, fused_attention=fused_attention)
    check_wiring(m, cfg, layout, index)
    return m


# ---------------------------------------------------------------------------------------
# The generator's own wiring check
# ---------------------------------------------------------------------------------------

_LAYER_LABEL = re.compile(r"l(\d+)\.")
_LAYER_WEIGHT = re.compile(r"model\.layers\.(\d+)\.")
#: Weights every layer reads (the rotary table); all others belong to one layer or to none.
SHARED_WEIGHTS = frozenset({"rope.cos_sin"})


def kernels_by_op(m: Manifest, index: dict[str, Kernel]) -> dict[str, list[Kernel]]:
    """Each op's kernel launches (externs skipped) as index entries, found by (module file, entry)."""
    by_launch = {(Path(k.module).stem, k.entry): k for k in index.values()}
    out: dict[str, list[Kernel]] = {}
    for name, op in m.ops.items():
        out[name] = []
        for i, la in enumerate(op.impl.launches):
            if la.extern:
                continue
            k = by_launch.get((la.module or "", la.entry or ""))
            if k is None:
                raise WiringError(
                    f"ops.{name}.impl.launches[{i}]: `{la.entry}` of module `{la.module}` is not in the index")
            out[name].append(k)
    return out


def _check_gemv(m: Manifest, cfg: Qwen3Config, index: dict[str, Kernel], kernels_of: dict[str, list[Kernel]],
                err) -> None:
    """The decode GEMV ops against their buffers, their kernels' launch rules, and the residual stream."""
    # -- every launch's dynamic shared memory is what its kernel needs for the literals it passes --
    for op_name, kerns in kernels_of.items():
        for k, la in zip(kerns, [la for la in m.ops[op_name].impl.launches if not la.extern]):
            try:
                want = launch_shared_mem(k, la.args, f"ops.{op_name} kernel `{k.name}`")
            except GenError as e:
                err(str(e))
                continue
            if k.constexprs.get("PERSISTENT"):
                continue  # x + the slots of its launch plan: checked with the plan below
            if (la.shared_mem or 0) != want:
                err(f"ops.{op_name} kernel `{k.name}`: shared_mem {la.shared_mem or 0} != the {want} bytes it needs")

    # -- each GEMV launch: n, k, ksplit, grid consistent; its call's buffers have those shapes --
    gemv_ops: dict[str, tuple[Kernel, dict[str, Any]]] = {}
    for op_name, kerns in kernels_of.items():
        for k, la in zip(kerns, [la for la in m.ops[op_name].impl.launches if not la.extern]):
            if not k.entry.startswith("kern_gemv"):
                continue
            lit = {pn: a.literal for pn, a in zip(k.param_names, la.args) if a.literal is not None}
            where = f"ops.{op_name} kernel `{k.name}`"
            if k.constexprs.get("PERSISTENT"):
                n, kk = lit.get("n"), lit.get("k")
                if not all(isinstance(v, int) for v in (n, kk, lit.get("piece_chunks"))):
                    err(f"{where}: n, k and piece_chunks must be integer literals (the plan is fixed per shape)")
                    continue
                try:
                    plan = plan_gemvp(n, kk, "norm_silu" in k.entry, sms=GEMV_SMS)
                except ValueError as e:
                    err(f"{where}: {e}")
                    continue
                got = (la.grid, lit["piece_chunks"], la.shared_mem or 0)
                if plan is None or got != ([plan.grid, 1, 1], plan.piece_chunks, plan.smem):
                    err(f"{where}: grid {la.grid}, piece_chunks {lit['piece_chunks']}, shared_mem {la.shared_mem or 0} "
                        f"!= tools/gemv_plan.py's plan for n = {n}, k = {kk}: {plan}")
                gemv_ops[op_name] = (k, lit)
                continue
            n, kk, split = lit.get("n"), lit.get("k"), lit.get("ksplit")
            if not all(isinstance(v, int) for v in (n, kk, split)):
                err(f"{where}: n, k and ksplit must be integer literals (the grid is fixed per shape)")
                continue
            if kk % 8 or kk <= 0 or n <= 0:
                err(f"{where}: k = {kk} must be a positive multiple of 8 and n = {n} positive")
            cols, warps = int(k.constexprs.get("COLS_PER_WARP", 0)), int(k.constexprs.get("WARPS", 0))
            # row passes per block: the index's PASSES (absent: 1), which a row-pass entry's name (`_p2`:
            # declare_gemv's naming) must agree with, else the grid below would be checked against the wrong rule
            passes, named = k.constexprs.get("PASSES", 1), re.search(r"_p(\d+)$", k.name)
            if type(passes) is not int or passes < 1 or (named and int(named[1]) != passes):
                err(f"{where}: index constexpr PASSES {k.constexprs.get('PASSES')!r}"
                    + (f" where its name says {int(named[1])} row passes per block" if named else
                       " (row passes per block: an integer ≥ 1)")
                    + ": a stale or damaged index; rebuild the kernels with tools/build_kernels.py")
                continue
            if split not in GEMV_KSPLITS or not cols or warps % split:
                err(f"{where}: ksplit {split} must divide the block's {warps} warps (one of {GEMV_KSPLITS})")
                continue
            if passes > 1 and split != 1:
                err(f"{where}: ksplit {split} with `{k.name}` ({passes} row passes per block): the row-pass form "
                    f"takes ksplit 1")
            if (step := k.constexprs.get("TC_STEP")) is not None and (split != 1 or kk % step):
                err(f"{where}: ksplit {split}, k = {kk} with `{k.name}` (gemv_tc.cu, mma steps of {step} elements): the "
                    f"tensor-core form takes ksplit 1 and k a multiple of {step} (any other launch traps)")
            grid = [gemv_blocks(n, cols, warps, split, passes), 1, 1]
            if la.grid != grid:
                err(f"{where}: grid {la.grid} != {grid} (n = {n}, {cols} columns per warp group, ksplit {split}"
                    + (f", {passes} row passes" if passes > 1 else "") + ")")
            gemv_ops[op_name] = (k, lit)

    for pname, prog in m.programs.items():
        for ci, call in enumerate(prog.calls):
            if call.op not in gemv_ops:
                continue
            k, lit = gemv_ops[call.op]
            where = f"programs.{pname}.calls[{ci}] `{call.label}`"
            if pname != "decode":
                err(f"{where}: GEMV op `{call.op}` outside decode (it is compiled for one token)")
            n, kk, rows = lit["n"], lit["k"], int(k.constexprs.get("M", 1))
            silu = "norm_silu" in k.entry
            launch = next(la for la in m.ops[call.op].impl.launches if not la.extern)
            want = {"x": [rows, kk], "w": [2 * n if silu else n, kk], "norm_w": [kk], "y": [rows, n],
                    "residual": [rows, n]}
            for pn, la in zip(k.param_names, launch.args):
                if pn not in want or la.param is None:
                    continue
                ca = call.args[la.param]
                shape = m.buffers[ca.buf].shape if ca.buf in m.buffers else None
                if shape is None:
                    continue
                # rows of an activation: its first dim bounds M (tokens = 1 in decode), the rest must match
                got = shape if pn in ("w", "norm_w") else shape[1:]
                exp = want[pn] if pn in ("w", "norm_w") else want[pn][1:]
                if got != exp or (pn not in ("w", "norm_w") and isinstance(shape[0], int) and shape[0] < rows):
                    err(f"{where}: `{k.name}` {pn} = `{ca.buf}` {shape} does not fit n = {n}, k = {kk}, M = {rows} "
                        f"(wants {want[pn]})")

    # -- decode: the residual stream is written by the embedding, then in place only by gemv_residual --
    writers = []
    for call in m.programs["decode"].calls:
        op = m.ops[call.op]
        for ai, a in enumerate(call.args):
            if a.buf == "residual" and ks.parse_param_type(op.params[ai]).direction != "in":
                writers.append(call.label)
                kerns = kernels_of.get(call.op, [])
                ok = call.label == "embed" if call.op == "embedding" else \
                    bool(kerns) and all(kn.entry.startswith(("kern_gemv_residual", "kern_gemvtc_residual", "kern_gemvp_residual"))
                                        for kn in kerns)
                if not ok:
                    err(f"programs.decode `{call.label}`: writes `residual` through `{call.op}`; in decode only the "
                        f"embedding and the gemv_residual ops do")
    want_writers = ["embed"] + [f"l{l}.{s}" for l in range(cfg.num_hidden_layers)
                                for s in ("o_proj_add", "down_proj_add")]
    if writers != want_writers:
        err(f"programs.decode: `residual` is written by {writers}, expected the embedding, then each layer's "
            f"o_proj_add and down_proj_add")


def _check_lm_head_screened(m: Manifest, cfg: Qwen3Config, kerns: list[Kernel], err) -> None:
    """LM_HEAD_SCREENED_OP: its three launches agree on the head's shape and on each other's grids (the pick reads
    `nb1` = the screen's row groups, ceil_div(nb1, PASSES) blocks; the reduce `parts` = the pick's blocks), and the
    derived weights fit the head."""
    where = f"ops.{LM_HEAD_SCREENED_OP}"
    V, H = cfg.vocab_size, cfg.hidden_size
    launches = m.ops[LM_HEAD_SCREENED_OP].impl.launches
    if [k.entry for k in kerns][1:] != ["kern_lmhead_pick_m1", "argmax_reduce"] \
            or not kerns[0].entry.startswith("kern_lmhead_screen_m1"):
        err(f"{where}: launches {[k.entry for k in kerns]}, expected the screen, the pick and argmax_reduce")
        return
    lit = [{pn: a.literal for pn, a in zip(k.param_names, la.args) if a.literal is not None}
           for k, la in zip(kerns, launches)]
    screen, pick = kerns[0].constexprs, kerns[1].constexprs
    nb1 = math.ceil(V / (int(screen.get("WARPS", 0)) * int(screen.get("ROWS_PER_WARP", 0)) or 1))
    parts = math.ceil(V / (int(pick.get("PICK_ROWS", 0)) or 1))
    blocks = math.ceil(nb1 / (int(screen.get("PASSES", 1)) or 1))  # row groups per block
    for i, want in ((0, {"n": V, "k": H}), (1, {"n": V, "k": H, "nb1": nb1}), (2, {"parts": parts})):
        for pn, v in want.items():
            if lit[i].get(pn) != v:
                err(f"{where} kernel `{kerns[i].name}`: {pn} = {lit[i].get(pn)}, expected {v}")
    for i, g in ((0, blocks), (1, parts), (2, 1)):
        if launches[i].grid != [g, 1, 1]:
            err(f"{where} kernel `{kerns[i].name}`: grid {launches[i].grid}, expected [{g}, 1, 1]")
    # the scratch the kernels index by V, nb1 and parts (a smaller one would be read past its end)
    scratch = m.ops[LM_HEAD_SCREENED_OP].impl.scratch
    for name, dtype, shape in (("xn", "bf16", [H]), ("keys", "u16", [V]), ("bpart", "u32", [nb1]),
                               ("partial", "u64", [parts])):
        sc = scratch.get(name)
        if sc is None or sc.dtype != dtype or sc.shape != shape:
            err(f"{where}: scratch `{name}` must be {dtype} {shape}")
    for name, dtype, shape in ((LM_SCREEN_WEIGHTS[0], "i8", [V, H]), (LM_SCREEN_WEIGHTS[1], "f32", [V, 4])):
        b = m.buffers.get(name)
        if b is None or b.dtype != dtype or b.shape != shape or b.class_ != "weight":
            err(f"{where}: weight `{name}` must be {dtype} {shape}")


def _carveout_text(carveout: int | None) -> str:
    """A launch's or index entry's carveout in words: `0`, or `absent` (the driver's choice)."""
    return "absent" if carveout is None else str(carveout)


def check_wiring(m: Manifest, cfg: Qwen3Config, layout: Layout, index: dict[str, Kernel]) -> None:
    """Assert the manifest's wiring against `layout`. Raises WiringError listing every fault.

    `index` is the kernel index the manifest was built from: launch args are read by the kernels'
    parameter names, and their 16-byte alignment requirements checked.
    """
    errs: list[str] = []
    err = errs.append
    kernels_of = kernels_by_op(m, index)

    # -- the qkv views: inside the row, disjoint, in q|k|v order, matching the weight's row order --
    qkv = m.buffers.get("qkv")
    row_bytes = 2 * cfg.qkv_size  # bf16
    if qkv is None or qkv.dtype != "bf16" or qkv.shape != ["tokens", cfg.qkv_size]:
        err(f"buffer `qkv` must be bf16 [tokens, {cfg.qkv_size}] (NQ*D + 2*NKV*D)")
    want_width = {"q": cfg.q_size, "k": cfg.kv_size, "v": cfg.kv_size}
    spans = []
    for name, v in layout.qkv.items():
        lo, hi = v.offset, v.offset + 2 * v.width
        if v.buffer != "qkv" or lo < 0 or hi > row_bytes or lo % 16:
            err(f"view `{name}` [{lo}, {hi}) bytes is not a 16-byte-aligned range inside a qkv row of {row_bytes}")
        if v.width != want_width[name]:
            err(f"view `{name}` is {v.width} wide, but the qkv weight has {want_width[name]} `{name}` rows")
        spans.append((lo, hi, name))
    spans.sort()
    for (lo1, hi1, n1), (lo2, hi2, n2) in zip(spans, spans[1:]):
        if lo2 < hi1:
            err(f"view `{n2}` [{lo2}, {hi2}) overlaps view `{n1}` [{lo1}, {hi1}) in `qkv`")
    if [n for _, _, n in spans] != ["q", "k", "v"] or sum(h - l for l, h, _ in spans) != row_bytes:
        err("views q|k|v must tile a qkv row in that order (the exporter stacks q, k, v rows)")

    # -- per-call checks --
    page_block = 16 * (m.states["kv"].bytes_per_token or 0)
    if m.states["kv"].bytes_per_token != cfg.kv_bytes_per_token:
        err(f"state `kv` bytes_per_token {m.states['kv'].bytes_per_token} != L*NKV*2*D*2 = {cfg.kv_bytes_per_token}")
    if layout.kv_page_bytes != page_block:
        err(f"page stride {layout.kv_page_bytes} != 16 tokens × bytes_per_token = {page_block}")
    offs = layout.kv_layer_offsets
    if len(offs) != cfg.num_hidden_layers or len(set(offs)) != len(offs):
        err(f"KV layer offsets {offs} are not {cfg.num_hidden_layers} distinct offsets")
    for l, o in enumerate(offs):
        if o % layout.kv_layer_bytes or not 0 <= o <= page_block - layout.kv_layer_bytes:
            err(f"layer {l}'s KV block [{o}, {o + layout.kv_layer_bytes}) is not a block inside "
                f"the page of {page_block}")

    weight_users: dict[str, set[str]] = {}
    states_used: set[str] = set()
    used: set[str] = set()
    ops_used: set[str] = set()
    for pname, prog in m.programs.items():
        for ci, call in enumerate(prog.calls):
            where = f"programs.{pname}.calls[{ci}] `{call.label}`"
            ops_used.add(call.op)
            op = m.ops[call.op]
            lm = _LAYER_LABEL.match(call.label)
            layer = int(lm.group(1)) if lm else None
            for ai, a in enumerate(call.args):
                if a.buf is not None:
                    used.add(a.buf)
                    b = m.buffers[a.buf]
                    if b.class_ == "weight":
                        weight_users.setdefault((pname, a.buf), set()).add(call.label)
                        wm = _LAYER_WEIGHT.match(a.buf)
                        owner = int(wm.group(1)) if wm else None
                        if owner != layer and a.buf not in SHARED_WEIGHTS:
                            err(f"{where}: uses weight `{a.buf}`, which is not a weight of "
                                f"{'layer ' + str(layer) if layer is not None else 'a call outside the layers'}")
                    if a.buf == "qkv" and ks.parse_param_type(op.params[ai]).direction == "in":
                        # a reader of a slice of qkv: must be exactly one of the views
                        views = {v.offset: n for n, v in layout.qkv.items()}
                        at = a.offset or 0
                        if at not in views:
                            err(f"{where}: reads `qkv` at byte {at}, which is no view of the layout")
                        elif views[at] != "q":
                            err(f"{where}: attention reads view `{views[at]}` as q")
                    elif a.offset:
                        err(f"{where}: `{a.buf}` at byte offset {a.offset}: only qkv has views")
                if a.state is not None:
                    states_used.add(a.state)
                    if layer is None or not 0 <= layer < len(offs):
                        err(f"{where}: passes state `{a.state}` outside a layer")
                    elif a.state == ATTN_COUNTERS:
                        # the fused decode attention's counters: this layer's own, inside the state
                        cb = counter_layer_bytes(cfg)
                        if pname != "decode" or call.op != "attention_decode":
                            err(f"{where}: `{ATTN_COUNTERS}` is only decode attention's")
                        elif a.offset != layer * cb:
                            err(f"{where}: counters offset {a.offset} != layer {layer}'s at {layer * cb}")
                    elif a.state != "kv":
                        err(f"{where}: passes unknown state `{a.state}`")
                    elif a.offset != offs[layer]:
                        err(f"{where}: KV offset {a.offset} != layer {layer}'s block at {offs[layer]}")
            # 16-byte alignment the kernels were specialised for
            kerns = iter(kernels_of.get(call.op, []))
            for launch in op.impl.launches:
                if launch.extern:
                    continue
                k = next(kerns)
                for pn, la in zip(k.param_names, launch.args):
                    if pn in k.aligned16 and la.param is not None:
                        ca = call.args[la.param]
                        if (ca.offset or 0) % 16:
                            err(f"{where}: `{k.name}` needs `{pn}` 16-byte aligned, gets offset {ca.offset}")

    # -- GEMM dims agree with the buffers: a [m, k], w [n, k], c [m, n] (m ≤ the rows of a and c) --
    for pname, prog in m.programs.items():
        for ci, call in enumerate(prog.calls):
            if call.op != "gemm":
                continue
            a, w, c, mm, n, k = call.args
            sa, sw, sc = (m.buffers[x.buf].shape for x in (a, w, c))
            rows = mm.var or mm.i32
            if sw != [n.i32, k.i32] or sa[1:] != [k.i32] or sc[1:] != [n.i32] or rows not in (sa[0], 1) \
                    or rows not in (sc[0], 1):
                err(f"programs.{pname}.calls[{ci}] `{call.label}`: gemm m={rows} n={n.i32} k={k.i32} does not fit "
                    f"a {a.buf} {sa}, w {w.buf} {sw}, c {c.buf} {sc}")

    # -- within a program, each weight is bound by one call (the tied embedding by embed and the lm_head) --
    for (pname, w), users in weight_users.items():
        allowed = 2 if (w == "model.embed_tokens.weight" and cfg.tie_word_embeddings and pname == "decode") else 1
        if w not in SHARED_WEIGHTS and len(users) > allowed:
            err(f"programs.{pname}: weight `{w}` is used by {sorted(users)}")

    _check_gemv(m, cfg, index, kernels_of, err)
    if LM_HEAD_SCREENED_OP in m.ops:
        _check_lm_head_screened(m, cfg, kernels_of[LM_HEAD_SCREENED_OP], err)

    # -- the kernels' view of the same layout: head counts, qkv row, page stride; and each launch's carveout --
    for op_name, kerns in kernels_of.items():
        kern_launches = [la for la in m.ops[op_name].impl.launches if not la.extern]
        for k, launch in zip(kerns, kern_launches):
            lit = {pn: a.literal for pn, a in zip(k.param_names, launch.args) if a.literal is not None}
            where = f"ops.{op_name} kernel `{k.name}`"
            if launch.carveout != k.carveout:  # the index entry's, or none where the entry has none
                err(f"{where}: carveout {_carveout_text(launch.carveout)} != its index entry's "
                    f"{_carveout_text(k.carveout)} (ManifestBuilder.launch copies the entry's `carveout`)")
            if "page_bytes" in lit and lit["page_bytes"] != layout.kv_page_bytes:
                err(f"{where}: page_bytes {lit['page_bytes']} != page stride {layout.kv_page_bytes}")
            if "num_q_heads" in lit and "num_kv_heads" in lit:
                nq, nkv = lit["num_q_heads"], lit["num_kv_heads"]
                # q heads, then k heads, then v heads, D each: where the kernel looks for k and v
                k_at, v_at = 2 * nq * cfg.head_dim, 2 * (nq + nkv) * cfg.head_dim
                if k_at != layout.qkv["k"].offset or v_at != layout.qkv["v"].offset:
                    err(f"{where}: heads {nq}/{nkv} place k/v at other columns than the layout's views")
            if "q_stride" in lit and lit["q_stride"] != cfg.qkv_size:
                err(f"{where}: q_stride {lit['q_stride']} != qkv row {cfg.qkv_size}")
            if "bt_stride" in lit and lit["bt_stride"] != m.buffers["block_table"].shape[0]:
                err(f"{where}: bt_stride {lit['bt_stride']} != block_table length")

    # -- every declaration used; decode-only buffers fixed-shape and out of prefill --
    for name in m.buffers:
        if name not in used:
            err(f"buffer `{name}` is declared but no call uses it")
    for name in m.ops:
        if name not in ops_used:
            err(f"op `{name}` is declared but no call uses it")
    for name in m.states:
        if name not in states_used:
            err(f"state `{name}` is declared but no call uses it")
    if ATTN_COUNTERS in m.states:
        want = counter_layer_bytes(cfg) * cfg.num_hidden_layers
        st = m.states[ATTN_COUNTERS]
        if st.bytes_per_seq != want or st.bytes_per_token is not None or m.vars.get("seqs") != Var(max=1):
            err(f"state `{ATTN_COUNTERS}` must be bytes_per_seq = L*NKV*4 = {want} with var `seqs` max 1")
    mods = {la.module for op in m.ops.values() for la in op.impl.launches if la.module}
    for name, mod in m.modules.items():
        if name not in mods:
            err(f"module `{name}` is declared but no launch uses it")
        if not (mod.sha256 and re.fullmatch(r"[0-9a-f]{64}", mod.sha256)):
            err(f"module `{name}` is not pinned by a sha256")
    for name in ("logits", "next_token"):
        if name not in m.buffers:
            continue  # `logits`: not with the screened lm_head
        if any(isinstance(d, str) for d in m.buffers[name].shape):
            err(f"decode-only buffer `{name}` is sized by a var: {m.buffers[name].shape}")
        if any(a.buf == name for c in m.programs["prefill"].calls for a in c.args):
            err(f"prefill uses decode-only buffer `{name}`")
    for l in range(cfg.num_hidden_layers):
        mine = {w for w in m.buffers if w.startswith(f"model.layers.{l}.")}
        if len(mine) != 8:
            err(f"layer {l} has {len(mine)} weights, expected 8")
    if errs:
        raise WiringError("wiring check failed:\n  " + "\n  ".join(errs))


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def generate(cfg: Qwen3Config, kernels_dir: str | Path, out: str | Path, *, chunk: int = 2048,
             max_positions: int | None = None, model: str | None = None, pdl: bool = True,
             fused_attention: bool = False, decode_attention: str | None = None,
             gemv: str = DEFAULT_GEMV, lm_head: str = DEFAULT_LM_HEAD) -> Manifest:
    m = build_manifest(cfg, load_index(kernels_dir), chunk=chunk, max_positions=max_positions, model=model,
                       pdl=pdl, fused_attention=fused_attention, decode_attention=decode_attention, gemv=gemv,
                       lm_head=lm_head)
    data = ks.dump(m)
    out = Path(out)
    if out.is_dir():
        raise GenError(f"--out {out}: a directory; give the manifest's file name (e.g. {out / (m.model + '.json')})")
    if blocker := next((p for p in out.parents if p.exists() and not p.is_dir()), None):
        raise GenError(f"--out {out}: {blocker} is a file, not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as e:
        raise GenError(f"--out {out}: cannot write it: {e.strerror or e} ({e.filename})") from None
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a published Qwen3 geometry: 0.6b 1.7b 4b 8b 14b 32b")
    src.add_argument("--config", type=Path, help="an HF config.json (or the checkpoint directory holding it)")
    ap.add_argument("--kernels", required=True, type=Path, help="kernels dir with index.json (tools/build_kernels.py)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--chunk", type=int, default=2048, help="max tokens per prefill run (var `tokens`)")
    ap.add_argument("--max-positions", type=int, default=None,
                    help="KV capacity bound: rows of rope.cos_sin, block_table pages × 16 "
                         "(default: max_position_embeddings)")
    ap.add_argument("--model", default=None, help="the manifest's `model` label (default: qwen3-<preset>)")
    ap.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                    help="every decode launch but the embedding as a programmatic dependent launch (Hopper; "
                         "manifest `pdl: true`): the GEMVs and the PDL kernel forms (built by build_kernels.py by "
                         "default); default: on (4B decode 2.655 vs 2.734 ms/token on the H200); --no-pdl: none")
    ap.add_argument("--fused-attention", action="store_true",
                    help="decode attention in one launch (paged_decode_attention_fused; build_kernels.py "
                         "--fused-attention): adds the state `attn_counters` and a var `seqs` (max 1); "
                         "with --decode-attention triton")
    ap.add_argument("--decode-attention", choices=DECODE_ATTENTION_IMPLS, default=None,
                    help="the impl of `attention_decode`: cuda (decode_attention.cu split + merge), cluster "
                         "(decode_attention.cu, one launch), triton (attention.py); or rope-cluster (one launch "
                         "that also does qk_norm_rope_kv's decode work: op attention_decode_rope); default "
                         f"{DEFAULT_DECODE_ATTENTION} (triton with --fused-attention)")
    ap.add_argument("--cuda-attention", action="store_true", help="= --decode-attention cuda")
    ap.add_argument("--gemv", choices=GEMV_IMPLS, default=DEFAULT_GEMV,
                    help="the decode GEMV impls: gemv (gemv.cu, and gemv_tc.cu's tensor-core entries for o_proj and "
                         "down_proj: the fastest on the H200), gemv-fma (gemv.cu for every op), persistent "
                         f"(gemv_persist.cu, one block per SM); default {DEFAULT_GEMV}")
    ap.add_argument("--lm-head", choices=LM_HEAD_IMPLS, default=DEFAULT_LM_HEAD,
                    help="decode's final norm + lm_head + argmax: screened (lm_head_screen.cu: the greedy token from "
                         "an int8 copy of the head plus the few candidate rows in bf16; the weights file must carry "
                         "lm_head.screen.q8 and lm_head.screen.rows, which tools/export_weights.py writes by default), "
                         "dense (gemv.cu's GEMV into a `logits` buffer, then argmax.cu: the same token, and the "
                         "logits for a caller that reads them; export with --no-screened-head); default "
                         f"{DEFAULT_LM_HEAD}")
    a = ap.parse_args(argv)
    if a.cuda_attention:
        if a.decode_attention not in (None, "cuda"):
            ap.error(f"--cuda-attention (= --decode-attention cuda) contradicts --decode-attention "
                     f"{a.decode_attention}: give one of them")
        a.decode_attention = "cuda"
    cfg = None
    if a.preset:  # a usage error, like argparse's (exit 2), before anything is read or written
        try:
            cfg = Qwen3Config.preset(a.preset)
        except ConfigError as e:
            ap.error(f"--preset: {e} (another Qwen3 geometry: --config with its HF config.json)")
    try:
        cfg = cfg or load_config(a.config)
        m = generate(cfg, a.kernels, a.out, chunk=a.chunk, max_positions=a.max_positions, model=a.model,
                     pdl=a.pdl, fused_attention=a.fused_attention, decode_attention=a.decode_attention,
                     gemv=a.gemv, lm_head=a.lm_head)
    except (GenError, ConfigError) as e:
        print(f"gen_qwen3: error: {e}", file=sys.stderr)
        return 1
    n = {p: len(prog.calls) for p, prog in m.programs.items()}
    print(f"wrote {a.out}: {m.model}, {len(m.buffers)} buffers, {len(m.ops)} ops, "
          f"prefill {n['prefill']} calls, decode {n['decode']} calls")
    if a.lm_head == "screened":
        print(f"note: its weights file must hold {' and '.join(LM_SCREEN_WEIGHTS)} (the screened lm_head): "
              "`tools/export_weights.py CKPT --out W.safetensors` writes them by default")
    else:
        print(f"note: its weights file must not hold {' or '.join(LM_SCREEN_WEIGHTS)} (kern binds every tensor of a "
              "weights file): export the checkpoint with `tools/export_weights.py CKPT --out W.safetensors "
              "--no-screened-head`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
