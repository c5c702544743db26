"""Launch plans of the decode GEMVs: gemv.cu's entry choice by k (`gemv_unroll`) and the persistent
GEMVs' plans (tools/kernels-src/gemv_persist.cu).

A persistent GEMV launch has one block per SM; block b computes outputs [n·b/G, n·(b+1)/G),
each of its 8 warps every 8th column, streaming the weight rows through its own FIFO of
shared-memory slots filled by bulk copies. `plan_gemvp(n, k, silu)` picks the slot size
(`piece_chunks` chunks of 256 elements: a row cut into equal pieces of at most PIECE_CHUNKS)
and the dynamic shared memory (x, then the slots: at most BLOCK_SMEM, so that two blocks —
this GEMV's and the next one's in a PDL chain — can fit on one SM).

No GPU needed; tools/gen_qwen3.py (--gemv persistent), tools/bench_gemv.py and
tools/gpu/gemvp_timeline.py use it.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

#: gemv_persist.cu: warps per block, elements of k per chunk, slots per block (MAX_SLOTS).
WARPS = 8
CHUNK = 256
MAX_SLOTS = 64
#: One block per SM, 256 threads (8 warps, each streaming its own columns through its own FIFO).
THREADS = 256
#: The H200's SMs (cudaDevAttrMultiProcessorCount).
SMS = 132
#: Dynamic shared memory per block at most (x + the slots), bytes: two blocks fit in an SM's
#: 228 KB (sm_90: 227 KB per block, 1 KB reserved per block), so the next GEMV of a PDL chain
#: can be resident and filling its FIFOs while this one drains.
BLOCK_SMEM = 112 * 1024
#: Target chunks (of 512 bytes) per slot: a weight row is cut into ceil(cpr / this)
#: equal pieces.
PIECE_CHUNKS = 8


#: gemv.cu's M = 1 entry suffix by 16-byte loads per row per pipeline stage (catalog.py GEMV_M1_UNROLLS).
GEMV_UNROLL_SUFFIX = {4: "", 5: "_u5"}


def gemv_blocks(n: int, cols_per_warp: int, warps: int, ksplit: int, passes: int = 1) -> int:
    """gemv.cu's grid.x for n output columns: each block's `warps` warps form warps/ksplit groups (ksplit warps
    split k), each producing `cols_per_warp` columns (the index's COLS_PER_WARP and WARPS constexprs), `passes`
    times over (the row-pass module's PASSES constexpr, gemv.cu -DGEMV_PASSES; 1 for the default entries).
    Raises ValueError for passes < 1."""
    if passes < 1:
        raise ValueError(f"gemv.cu grid for n = {n}: {passes} row passes per block; 1 for the default entries, the "
                         f"index's PASSES constexpr for a row-pass entry (gemv.cu -DGEMV_PASSES)")
    return -(-n // (cols_per_warp * warps // ksplit * passes))


#: Row passes of the qkv GEMV where its default grid is more than one wave of two blocks per SM (gemv_passes).
QKV_PASSES = 2


def gemv_passes(n: int, cols_per_warp: int, warps: int, ksplit: int, sms: int = SMS) -> int:
    """Row passes per block (gemv.cu -DGEMV_PASSES; for 2, the index entry `kern_gemv_norm_m1_p2` of gemv_p2.cubin)
    for the GEMV launched right before the decode attention: QKV_PASSES where, at ksplit 1, the default grid is more
    than one wave of two blocks per SM and the pass grid still covers every SM; else 1. The default grid then holds
    every SM's registers (two 30,720-register blocks) until its last wave drains, so the attention's CTAs (21,504
    registers; 137 KB of shared memory in session 18, 70.5 KB in sessions 19–20, 68.75 KB since 21) cannot be
    resident, or issue the K|V pages they read before their PDL wait, while the GEMV streams.

    Measured (H200, kern-run decode, one runtime per process, identical tokens; NOTES.md 54, BENCHMARKS.md
    "Session 18"): Qwen3-4B's qkv (n = 6,144: 384 blocks → 192) with the attention's whole ring of 4 pages before
    its wait (its ring since session 19: 2 pages, all before the wait; NOTES.md 55), −0.010 ms/token at 128 cached tokens and −0.018…−0.020 at 4,096 (4 pages alone −0.002 / −0.004);
    3 passes (128 blocks, one per SM) +0.054 / +0.034; Qwen3-0.6B's qkv (n = 4,096: 256 blocks, one wave) in 2 passes
    (128 blocks) +0.026 at 128: the rule keeps it at 1. The lm_head in 2 or 4 passes: nothing (+0.003 / +0.001).
    Raises ValueError unless n, cols_per_warp, warps and sms are ≥ 1 and ksplit ≥ 1 divides warps."""
    if min(n, cols_per_warp, warps, ksplit, sms) < 1 or warps % ksplit:
        raise ValueError(f"gemv_passes: n = {n}, cols_per_warp = {cols_per_warp}, warps = {warps}, ksplit = {ksplit}, "
                         f"sms = {sms}: each must be ≥ 1 and ksplit must divide warps (the index's WARPS constexpr)")
    blocks = gemv_blocks(n, cols_per_warp, warps, ksplit)
    if ksplit == 1 and blocks > 2 * sms and gemv_blocks(n, cols_per_warp, warps, ksplit, QKV_PASSES) >= sms:
        return QKV_PASSES
    return 1


def gemv_pass_entry(name: str, passes: int, constexprs_of=None, who: str = "this launch") -> str:
    """The kernel index name of entry `name` in `passes` row passes per block: `name` itself for 1, else its row-pass
    instance `NAME_pP` (catalog._gemv_passes_kernels: `kern_gemv_norm_m1_p2`, whose PASSES constexpr is P).

    `constexprs_of` (optional): index name -> that kernel's constexprs, or None where the index has no such kernel.
    Given it, a row-pass name is also checked against the index (gen_qwen3 and bench_kernels launch it so). Raises
    ValueError: the index lacks it ("`who` wants `NAME_pP` ..."), gives it no PASSES, or another PASSES (a stale
    index); each message says to rebuild the kernels."""
    if passes == 1:
        return name
    pname = f"{name}_p{passes}"
    if constexprs_of is None:
        return pname
    cx = constexprs_of(pname)
    if cx is None:
        raise ValueError(f"{who} wants `{pname}` (gemv.cu in {passes} row passes, tools/gemv_plan.py gemv_passes), which the "
                         f"kernel index lacks: rebuild the kernels with tools/build_kernels.py")
    if "PASSES" not in cx:
        raise ValueError(f"kernel `{pname}`: the index gives no constexpr `PASSES` (needed for its grid); rebuild the "
                         f"kernels with tools/build_kernels.py")
    if (got := int(cx["PASSES"])) != passes:
        raise ValueError(f"kernel `{pname}` in the index has PASSES {got}, not {passes}: a stale index; rebuild the "
                         f"kernels with tools/build_kernels.py")
    return pname


def gemv_lane_loads(k: int, ksplit: int) -> int:
    """16-byte weight loads per row of gemv.cu's busiest lane (lane 0 of the first k part) in a GEMV
    over `k` (a multiple of 8) split `ksplit` ways: a part is ceil(k/8 / ksplit) 16-byte vectors
    rounded up to whole warp-wide loads (gemv.cu `warp_rows`), spread over 32 lanes."""
    kv = k // 8
    per = -(-kv // ksplit)
    per = -(-per // 32) * 32
    return -(-min(kv, per) // 32)


def gemv_unroll(k: int, ksplit: int) -> int:
    """Loads per row per pipeline stage (gemv.cu's U) of the m = 1 entry to launch over `k` at `ksplit`:
    5 (the `_u5` entries) where that puts all of a lane's loads into the two stages gemv.cu issues before
    griddepcontrol.wait and 4 does not (9 or 10 loads per row: k = 2,304…2,560 at ksplit 1, e.g.
    Qwen3-4B's qkv, gate_up and lm_head), else 4 (GEMV_UNROLL_SUFFIX gives the entry's suffix).

    Measured (H200, one 4B decode token's GEMVs as a PDL chain in a CUDA graph, session 7, NOTES.md 28):
    2.218–2.240 ms with U = 5 on the three k = 2,560 shapes vs 2.324–2.336 with U = 4 everywhere; U = 5
    also on o (16 loads: four stages either way) or down (38 loads: 8 stages instead of 10) was slower.
    Whether a launch should use it also depends on what follows it: `gemv_entry_unroll`.
    Raises ValueError unless k is a positive multiple of 8 and ksplit ≥ 1."""
    if k < 8 or k % 8 or ksplit < 1:
        raise ValueError(f"gemv.cu over k = {k} at ksplit {ksplit}: k must be a positive multiple of 8, ksplit ≥ 1")
    return 5 if 2 * 4 < gemv_lane_loads(k, ksplit) <= 2 * 5 else 4


def gemv_entry_unroll(k: int, ksplit: int, before_attention: bool) -> int:
    """Loads per row per stage of the gemv.cu entry a decode program should launch: `gemv_unroll(k, ksplit)`,
    except 4 for a launch followed by the decode attention (or its prologue kernel): `before_attention`.

    Measured (H200, kern-run Qwen3-4B decode): session 7 (NOTES.md 28, tools/bench_decode.py, three alternating
    rounds per manifest) found the `_u5` entry on gate_up (followed by the down GEMV) neutral and on qkv and
    lm_head slower, although in a chain of GEMVs alone qkv gained as gate_up did; session 11 (NOTES.md 33,
    tools/gpu/program_sweep.py, the pipelined loop, rounds within ±0.002 ms) found qkv's still slower (+0.025
    ms/token) but lm_head's (followed by the argmax) faster: −0.007/−0.008 at 128 cached tokens, −0.004 at 4,096,
    same tokens; one runtime per process (NOTES.md 34) −0.002/−0.003 at 128. Raises ValueError as gemv_unroll
    does."""
    unroll = gemv_unroll(k, ksplit)
    return 4 if before_attention else unroll


#: gemv.cu's batched-prologue form of an M = 1 norm entry: suffix, and the most x vectors per thread it batches
#: (catalog.py GEMV_NORM_NB_SUFFIX / GEMV_NORM_NB, the index constexpr NORM_NB).
GEMV_NORM_NB_SUFFIX, GEMV_NORM_NB = "_nb2", 2


def gemv_norm_batched(k: int, threads: int = 256, nb: int = GEMV_NORM_NB) -> bool:
    """Whether an M = 1 norm GEMV over `k` should launch the batched-prologue entry (`NAME_nb2`): where each of the
    block's `threads` threads holds 2…`nb` of x's 16-byte vectors (threads < k/8 ≤ nb·threads: k = 2,056…4,096 with
    256 threads), which the loop form loads one L2 round trip per vector and again after the block barrier. With one
    vector per thread the loop is one trip, and the plain entry (the loop alone) is faster.

    Measured (H200, kern-run decode, program_sweep, tokens identical): Qwen3-4B (k = 2,560: qkv, gate_up, the screen)
    −0.045 ms/token (session 28, NOTES.md 70); Qwen3-0.6B (k = 1,024) with the batched path compiled into the plain
    entries +0.017, though its k takes the loop (session 29, NOTES.md 71). Raises ValueError unless k is a positive
    multiple of 8 and threads, nb ≥ 1."""
    if k < 8 or k % 8 or threads < 1 or nb < 1:
        raise ValueError(f"gemv_norm_batched: k = {k}, threads = {threads}, nb = {nb}: k must be a positive multiple "
                         f"of 8, threads and nb ≥ 1")
    return threads < k // 8 <= nb * threads


def gemv_norm_entry_name(name: str, k: int, has=lambda name: True, threads: int = 256) -> str:
    """The entry an M = 1 norm GEMV over `k` launches for plain entry `name`: its batched-prologue form `name_nb2`
    where gemv_norm_batched(k, threads) and `has(name_nb2)` (an index or module that holds it; an index built before
    session 29 has none, and its plain entries are correct for every k), else `name`. Raises ValueError as
    gemv_norm_batched does."""
    nb = name + GEMV_NORM_NB_SUFFIX
    return nb if gemv_norm_batched(k, threads) and has(nb) else name


def gemv_plain_entry(name: str) -> str:
    """`name` without its batched-prologue suffix (`kern_gemv_norm_m1_nb2` -> `kern_gemv_norm_m1`): the plain entry of
    the same params, grid and bits, whose twins the experiment builds (gemv.cu's flag, MLP, TMA, L2-prefetch forms)
    are; any other name unchanged."""
    return name[: -len(GEMV_NORM_NB_SUFFIX)] if name.endswith(GEMV_NORM_NB_SUFFIX) else name


#: gemv_tc.cu, the decode GEMVs on the tensor cores: its entries are gemv.cu's names with this prefix in place of
#: `kern_gemv` (`kern_gemvtc_residual_m1`), and k must be a multiple of its step (the index constexpr TC_STEP): 128
#: for the M = 1 entries decode launches (the runs layout: a warp's step is four 32-element chunks of two rows).
GEMV_TC_PREFIX, GEMV_TC_STEP = "kern_gemvtc", 128
#: The decode GEMV variants (tools/gen_qwen3.py GEMV_OPS values) the generator puts on gemv_tc.cu (gemv_tensor_core).
GEMV_TC_VARIANTS = frozenset({"gemv_norm", "gemv_norm_silu", "gemv_residual"})


def gemv_tc_entry(name: str) -> str:
    """gemv_tc.cu's entry for gemv.cu's entry `name`, any M (`kern_gemv_residual_m1` -> `kern_gemvtc_residual_m1`,
    `kern_gemv_norm_m4` -> `kern_gemvtc_norm_m4`; `_u5` kept, a batched-prologue suffix dropped: the tensor-core M = 1
    norm entries compile norm_to_smem's batched prologue, NB = 2, which batches for k/8 in (256, 512] and loops
    otherwise; their index constexpr NORM_NB says so). Raises ValueError for a name that is not a gemv.cu entry."""
    base = gemv_plain_entry(name)
    if not base.startswith("kern_gemv_"):
        raise ValueError(f"gemv_tc_entry: `{name}` is not a gemv.cu entry (kern_gemv*_m{{1,2,4,8}}*)")
    return GEMV_TC_PREFIX + base[len("kern_gemv"):]


def gemv_entry_inputs(name: str) -> int:
    """M, the input rows of a gemv.cu or gemv_tc.cu entry, from its name (`kern_gemvtc_norm_m4` -> 4,
    `kern_gemv_residual_m1_u5` -> 1). Raises ValueError for a name without an `_m{1,2,4,8}` part."""
    m = re.search(r"_m([1248])(?:_|$)", name)
    if not name.startswith("kern_gemv") or m is None:
        raise ValueError(f"gemv_entry_inputs: `{name}` is not a gemv.cu or gemv_tc.cu entry (kern_gemv*_m{{1,2,4,8}}*)")
    return int(m.group(1))


def gemv_tensor_core(variant: str, k: int) -> bool:
    """Whether the decode GEMV `variant` (gemv.cu's name, tools/gen_qwen3.py GEMV_OPS: "gemv_norm", "gemv_norm_silu",
    "gemv_residual") over k is launched on gemv_tc.cu's M = 1 entry (one 16-row tile per block, each warp reading two
    rows in 256-byte runs over half of k, the dots on mma.sync; ksplit 1) instead of gemv.cu's: every one of these
    variants where k is a multiple of GEMV_TC_STEP (every Qwen3 dense geometry's GEMVs).

    Measured (H200, kern-run decode, program_sweep, tokens identical). Session 30 (NOTES.md 72), the tile layout's
    64-byte runs: Qwen3-4B o_proj −0.069 ms/token, o_proj and down_proj −0.081, but qkv +0.013 / ±0 and gate_up
    +0.026 (the large streams lost to the short runs), and 0.6B's down (64 blocks where gemv.cu's ksplit 4 has 256)
    +0.008, so only the residual GEMVs where gemv.cu's base ksplit is 1 took it. Session 32 (NOTES.md 74), the runs
    layout: Qwen3-4B with o and down on it 2.147 ms/token against 2.219 on the tile layout's (the manifest of the
    same call), with qkv added 2.134, with gate_up added 2.116, all four 2.110 (−0.109; 2.095 against 2.203 in the
    next call); Qwen3-0.6B with qkv, o and gate_up on it 0.568, down too 0.564, gate_up back on gemv.cu 0.567 (the
    manifest of session 31: 0.568). Raises ValueError unless k is a positive multiple of 8."""
    if k < 8 or k % 8:
        raise ValueError(f"gemv_tensor_core: k = {k}: k must be a positive multiple of 8")
    return variant in GEMV_TC_VARIANTS and k % GEMV_TC_STEP == 0


def gemv_tc_unroll(k: int, before_attention: bool) -> int:
    """Steps per pipeline stage (U) of the gemv_tc.cu M = 1 entry to launch over `k`: 5 (the `_u5` entries) where that
    puts all of a warp's steps (k / GEMV_TC_STEP / 2: the block's warps take k in two halves) into the two stages
    issued before griddepcontrol.wait and 4 does not (9 or 10 steps: k = 2,176…2,560, e.g. Qwen3-4B's qkv, gate_up and
    lm_head), else 4; and 4 for the launch followed by the decode attention (`before_attention`), as
    `gemv_entry_unroll` keeps for gemv.cu. GEMV_UNROLL_SUFFIX gives the entry's suffix.

    Measured (H200, session 32, NOTES.md 74; tools/gpu/gemv_tc_probe.py, standalone µs per launch, U = 4 / 5):
    gate_up 28.38 / 26.77, lm_head 176.7 / 174.4, qkv 12.08 / 12.11, o 7.73 / 8.24, down 14.42 / 14.52; one 4B
    token's GEMVs as a PDL chain 2.182 ms with U = 4 everywhere, 2.115 with `_u5` everywhere. In the program qkv was
    timed at U = 4 and gate_up at 5. Raises ValueError unless k is a positive multiple of GEMV_TC_STEP."""
    if k < GEMV_TC_STEP or k % GEMV_TC_STEP:
        raise ValueError(f"gemv_tc_unroll: k = {k} must be a positive multiple of {GEMV_TC_STEP} (gemv_tc.cu's M = 1 "
                         "step)")
    steps = -(-(k // GEMV_TC_STEP) // 2)
    return 5 if not before_attention and 2 * 4 < steps <= 2 * 5 else 4


class GemvPlan(NamedTuple):
    """piece_chunks: chunks per slot (the kernels' last param); grid: blocks (grid.x, one
    per SM); smem: dynamic shared memory in bytes (x, then the slots); slots: slots the
    kernel will use: (smem − 2k) // (piece_chunks · 512), at most MAX_SLOTS."""

    piece_chunks: int
    grid: int
    smem: int
    slots: int


def plan_gemvp(n: int, k: int, silu: bool = False, sms: int = SMS, piece_target: int = PIECE_CHUNKS,
               block_smem: int = BLOCK_SMEM) -> GemvPlan | None:
    """The launch plan of a persistent GEMV (gemv_persist.cu) with n output columns over k
    (silu: the fused gate/up form, whose weight has 2n rows), or None where the form does not
    apply (k not a multiple of 256, or fewer than 2 slots per warp fit) — use gemv.cu there.

    Raises ValueError unless n ≥ 1 and k ≥ 8 is a multiple of 8 (every GEMV form's rule).
    """
    if n < 1 or k < 8 or k % 8:
        raise ValueError(f"persistent GEMV of n = {n}, k = {k}: n must be ≥ 1 and k a positive multiple of 8")
    if k % CHUNK:
        return None
    cpr = k // CHUNK
    pc = math.ceil(cpr / math.ceil(cpr / piece_target))
    slot = pc * CHUNK * 2
    slots = min(MAX_SLOTS, (block_smem - 2 * k) // slot) // WARPS * WARPS  # 8 FIFOs of equal length
    if slots < 2 * WARPS:
        return None
    return GemvPlan(piece_chunks=pc, grid=min(sms, n), smem=2 * k + slots * slot, slots=slots)
