"""Launch plans of the persistent decode GEMVs (tools/kernels-src/gemv_persist.cu).

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
