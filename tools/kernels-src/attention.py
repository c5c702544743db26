"""Attention-side Triton kernels over the paged KV state (Qwen3, head_dim D = 128).

KV layout (tools/README.md "KV layout"): bf16, pages of 16 tokens interleaved by layer, each
layer's part head-major, ``[page][layer][NKV][16 tokens][k|v][D]``.  A kernel gets
``kv = state + layer*16*NKV*2*D*2`` (bytes; 65,536 for NKV = 8) and
``page_bytes = L * 16 * NKV * 2 * D * 2`` (the byte stride between pages, a multiple of 512).
Within a page, kv head ``h``'s 16-token slice is 16 * 2*D elements (8 KB) contiguous, one
512-byte k|v row per token, and token slot ``s``'s row is swizzled: its logical 16-byte
chunk ``c`` (8 elements; k chunks 0..15, v chunks 16..31) sits at chunk ``c ^ (s % 8)``
(decode_attention.cu copies a page slice with one bulk copy and reads it from
shared memory free of bank conflicts without padding).  So element ``d`` of slot ``s``'s
k for kv head ``h`` is at element offset
``(s // 16) * page_elems + h*16*2*D + (s % 16)*2*D + (d ^ ((s % 8) * 8))``,
``page_elems = page_bytes/2``; its v element ``d`` at ``+ D`` from there.  Attention maps
logical position ``j`` of sequence ``b`` to page ``block_table[b*bt_stride + j//16]``.  All
offsets are computed in int64.

``q`` is read from (and the prologue writes it back into) the fused qkv buffer
``[tokens, (NQ + 2*NKV) * D]``: q heads, then k heads, then v heads.

Kernels:
  qk_norm_rope_kv          fused prologue: q/k RMS norm, neox rotary, k/v -> paged KV
  paged_decode_attention   decode (one query token per sequence), split-KV stage 1
  paged_decode_reduce      decode stage 2: merge the splits -> bf16 output
  paged_decode_attention_fused  opt-in: both decode stages in one launch (the last program
                           of each kv head merges; counters in a persistent state)
  paged_prefill_attention  causal flash attention of a chunk against the cache

Programmatic dependent launch (``PDL: tl.constexpr``, default False): the decode-path
kernels (``qk_norm_rope_kv``, ``paged_decode_attention``, ``paged_decode_reduce``) have a
PDL form, built as separate ``*_pdl`` instances, that keeps the manifest's ``"pdl": true``
contract (packages/kern-schema/README.md): every program first loads only what no launch of
the program writes (inputs the caller wrote before the run: positions, slot_mapping,
seq_lens, block_table; weights: norm weights, the rotary table), then executes
``griddepcontrol.wait`` (``gdc_wait``) unconditionally, before any read of qkv, the KV
state or the split scratch and before any store; no program returns before it.  Where
each kernel executes ``griddepcontrol.launch_dependents`` (``gdc_launch_dependents``) is
said at the kernel.  With ``PDL`` false every ``if PDL:`` branch is pruned at compile time
and the compiled code is that of the kernel without the parameter: the same instructions
(the default instances' sha256 are pinned by examples/*.json;
tests-integration/test_kernels_build.py).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

LOG2E = 1.4426950408889634


@triton.jit
def qk_norm_rope_kv(qkv, positions, slot_mapping, q_norm_w, k_norm_w, cos_sin, kv,
                    num_q_heads, num_kv_heads, eps, page_bytes,
                    D: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr = False):
    """Per-layer attention prologue, one program per (token t, kv head g).

    qkv: bf16 [tokens, (NQ+2*NKV)*D], inout: the q heads g*G .. g*G+G-1 (G = NQ/NKV) are
        replaced by rope(rmsnorm(q) * q_norm_w) in place; k and v are only read.
    positions, slot_mapping: i64 [tokens]; cos_sin: f32 [max_pos, D] (cos of the D/2
        frequencies, then sin); q_norm_w, k_norm_w: bf16 [D].
    kv: the layer's KV base (inout); k head g := rope(rmsnorm(k) * k_norm_w), v head g := v,
        written at slot s = slot_mapping[t] (a negative slot skips the write): kv head g's
        k|v row of s at kv + (s//16)*page_bytes + g*16*512 + (s%16)*512 bytes, its logical
        16-byte chunk c at chunk c ^ (s % 8) (the module docstring's layout).
    Rotary (neox, rotate-half over the full D): out[:D/2] = x1*cos - x2*sin,
    out[D/2:] = x2*cos + x1*sin.  fp32 math, one rounding at each store.

    PDL: positions and the rotary row are loaded, then the wait (qkv is the previous GEMV's
    output), then launch_dependents at once (the next kernel, decode attention, may then get
    its programs resident and read its inputs); the rest is the plain form's code.  The wait
    comes before the norm weights and the slot are loaded, so that after it the PDL form is
    the plain form's instruction stream: loading the weights ahead of the wait let the
    compiler contract the products differently (q differed in the last bf16 bit from the
    plain form, twin test on the H200, 2026-11-29), and the PDL form must compute exactly
    what the plain one does.
    """
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    G = num_q_heads // num_kv_heads
    row = qkv + t * ((num_q_heads + 2 * num_kv_heads) * D)
    d = tl.arange(0, HALF)

    pos = tl.load(positions + t)
    cos = tl.load(cos_sin + pos * D + d)
    sin = tl.load(cos_sin + pos * D + HALF + d)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

    # q heads of this group: a [BLOCK_G, D/2] tile per half, rows >= G masked off
    rows = tl.arange(0, BLOCK_G)
    rmask = rows[:, None] < G
    qp = row + (g * G + rows)[:, None] * D + d[None, :]
    q1 = tl.load(qp, mask=rmask, other=0.0).to(tl.float32)
    q2 = tl.load(qp + HALF, mask=rmask, other=0.0).to(tl.float32)
    r = tl.rsqrt((tl.sum(q1 * q1, axis=1) + tl.sum(q2 * q2, axis=1)) / D + eps)
    a = q1 * r[:, None] * tl.load(q_norm_w + d).to(tl.float32)[None, :]
    b = q2 * r[:, None] * tl.load(q_norm_w + HALF + d).to(tl.float32)[None, :]
    tl.store(qp, (a * cos[None, :] - b * sin[None, :]).to(tl.bfloat16), mask=rmask)
    tl.store(qp + HALF, (b * cos[None, :] + a * sin[None, :]).to(tl.bfloat16), mask=rmask)

    # k head g (normed + rotated) and v head g -> paged KV
    kp = row + num_q_heads * D + g * D
    k1 = tl.load(kp + d).to(tl.float32)
    k2 = tl.load(kp + HALF + d).to(tl.float32)
    rk = tl.rsqrt((tl.sum(k1 * k1, axis=0) + tl.sum(k2 * k2, axis=0)) / D + eps)
    ka = k1 * rk * tl.load(k_norm_w + d).to(tl.float32)
    kb = k2 * rk * tl.load(k_norm_w + HALF + d).to(tl.float32)
    vp = row + (num_q_heads + num_kv_heads) * D + g * D
    v1 = tl.load(vp + d)
    v2 = tl.load(vp + HALF + d)
    slot = tl.load(slot_mapping + t)
    if slot >= 0:
        page_elems = (page_bytes // 512).to(tl.int64) * 256
        dst = kv + (slot // 16) * page_elems + g * (16 * 2 * D) + (slot % 16) * (2 * D)
        c = d // 8  # logical chunk of element d of each 64-element quarter of the row
        e = d % 8
        sw = slot % 8
        tl.store(dst + (c ^ sw) * 8 + e, (ka * cos - kb * sin).to(tl.bfloat16))
        tl.store(dst + ((c + HALF // 8) ^ sw) * 8 + e, (kb * cos + ka * sin).to(tl.bfloat16))
        tl.store(dst + ((c + D // 8) ^ sw) * 8 + e, v1)
        tl.store(dst + ((c + (D + HALF) // 8) ^ sw) * 8 + e, v2)


@triton.jit
def paged_decode_attention(q, kv, block_table, seq_lens, part_acc, part_ml,
                           num_q_heads, num_kv_heads, q_stride, bt_stride, page_bytes, sm_scale,
                           D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                           PDL: tl.constexpr = False):
    """Decode attention, stage 1 (split-KV).  Grid (NKV, S, seqs), S = number of splits.

    Program (h, s, b) handles the G = NQ/NKV q heads of kv head h (padded to BLOCK_H rows so
    the products run on tensor cores) over split s of sequence b's keys: with
    L = seq_lens[b], chunk = ceil(ceil(L/S)/BLOCK_N)*BLOCK_N, keys [s*chunk, min(L, (s+1)*chunk)).
    q: bf16, head j of sequence b at q + b*q_stride + j*D (after the prologue).
    Writes, for each q head j of the group, unnormalized partial results
      part_acc[((b*NQ + j)*S + s)*D + :D] = sum_n p_n v_n   (f32)
      part_ml [((b*NQ + j)*S + s)*2 + 0]  = m (running max of the scores, log2 units)
      part_ml [((b*NQ + j)*S + s)*2 + 1]  = l = sum_n p_n,  p_n = 2^(score_n*log2e - m)
    An empty split writes m = -inf, l = 0, acc = 0.

    PDL: seq_lens (an input) is loaded, then the wait (q and the current token's k/v are
    the prologue's output; the split scratch was read by the previous layer's reduce), then
    launch_dependents (the reduce may get resident and wait).
    """
    h = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    S = tl.num_programs(1)
    G = num_q_heads // num_kv_heads
    L = tl.load(seq_lens + b)
    chunk = tl.cdiv(tl.cdiv(L, S), BLOCK_N) * BLOCK_N
    start = s * chunk
    end = tl.minimum(start + chunk, L)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

    d = tl.arange(0, D)
    rows = tl.arange(0, BLOCK_H)
    rmask = rows < G
    qh = h * G + rows
    qt = tl.load(q + b * q_stride + qh[:, None] * D + d[None, :], mask=rmask[:, None], other=0.0)

    page_elems = (page_bytes // 512).to(tl.int64) * 256
    kvh = kv + h * (16 * 2 * D)
    bt = block_table + b * bt_stride
    scale = sm_scale * 1.4426950408889634

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    tl.static_assert(BLOCK_N % 16 == 0, "BLOCK_N: a multiple of the 16-token page")
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        page = tl.load(bt + offs_n // 16, mask=nmask, other=0).to(tl.int64)
        tok = page * page_elems + (offs_n % 16) * (2 * D)
        # the chunk swizzle as an XOR on the element index, in _prefill_tile's form (16-byte loads); offs_n % 8 is
        # arange % 8 (n0 is a multiple of BLOCK_N: start = s * chunk), which keeps the XOR out of the loop
        sw = ((tl.arange(0, BLOCK_N) % 8) * 8)[:, None]
        koff = tok[:, None] + tl.max_contiguous(tl.multiple_of(d[None, :] ^ sw, [1, 8]), [1, 8])
        voff = tok[:, None] + D + tl.max_contiguous(tl.multiple_of(d[None, :] ^ sw, [1, 8]), [1, 8])
        k = tl.load(kvh + koff, mask=nmask[:, None], other=0.0)
        v = tl.load(kvh + voff, mask=nmask[:, None], other=0.0)
        qk = tl.dot(qt, tl.trans(k)) * scale
        qk = tl.where(nmask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new

    part = (b * num_q_heads + qh) * S + s
    tl.store(part_acc + part[:, None] * D + d[None, :], acc, mask=rmask[:, None])
    tl.store(part_ml + part * 2, m_i, mask=rmask)
    tl.store(part_ml + part * 2 + 1, l_i, mask=rmask)


@triton.jit
def paged_decode_reduce(part_acc, part_ml, out, num_q_heads, num_splits,
                        D: tl.constexpr, MAX_SPLITS: tl.constexpr, PDL: tl.constexpr = False):
    """Decode attention, stage 2.  Grid (NQ, seqs).  num_splits = S of stage 1 (<= MAX_SPLITS).

    out[b, j*D : (j+1)*D] = bf16(sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s), M = max_s m_s.
    out: bf16 [seqs, NQ*D] (contiguous).

    PDL: launch_dependents first, then the wait (everything it reads is stage 1's output).
    Triggering before the wait lets the next launch (the o-projection GEMV, which streams
    its first weight stage before its own wait) become resident while stage 1 still runs;
    the reduce itself is 32 small programs, so holding their slots costs little.
    """
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    j = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    sp = tl.arange(0, MAX_SPLITS)
    smask = sp < num_splits
    base = (b * num_q_heads + j) * num_splits
    m = tl.load(part_ml + (base + sp) * 2, mask=smask, other=float("-inf"))
    l = tl.load(part_ml + (base + sp) * 2 + 1, mask=smask, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))
    d = tl.arange(0, D)
    acc = tl.load(part_acc + (base + sp)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out + (b * num_q_heads + j) * D + d, o.to(tl.bfloat16))



@triton.jit(noinline=True)
def _merge_splits_cg(part_acc, part_ml, out, num_q_heads, num_splits, j, b,
                     D: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """``paged_decode_reduce``'s merge of q head j of sequence b, line for line, except that the
    partials are loaded with ``ld.global.cg`` (cached in L2 only, never L1): see
    ``paged_decode_attention_fused``.  ``noinline``: a function of its own, so Triton gives its
    tiles the layouts it gives ``paged_decode_reduce``'s (the same reduction order, so the same
    bits); inlined, its [MAX_SPLITS, D] tile shares stage 1's [BLOCK_N, D] index tensors and takes
    their layout, which sums the splits in another order
    (tests-integration/test_kernels_build.py checks the layouts)."""
    sp = tl.arange(0, MAX_SPLITS)
    smask = sp < num_splits
    base = (b * num_q_heads + j) * num_splits
    m = tl.load(part_ml + (base + sp) * 2, mask=smask, other=float("-inf"), cache_modifier=".cg")
    l = tl.load(part_ml + (base + sp) * 2 + 1, mask=smask, other=0.0, cache_modifier=".cg")
    w = tl.exp2(m - tl.max(m, axis=0))
    d = tl.arange(0, D)
    acc = tl.load(part_acc + (base + sp)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0,
                  cache_modifier=".cg")
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out + (b * num_q_heads + j) * D + d, o.to(tl.bfloat16))


@triton.jit
def paged_decode_attention_fused(q, kv, block_table, seq_lens, part_acc, part_ml, counters, out,
                                 num_q_heads, num_kv_heads, q_stride, bt_stride, page_bytes, sm_scale,
                                 D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                                 MAX_SPLITS: tl.constexpr, PDL: tl.constexpr = False):
    """Decode attention in ONE launch: split-KV stage 1, and the last program of each
    (sequence, kv head) merges the splits.  Grid (NKV, S, seqs), S <= MAX_SPLITS.

    Every program (h, s, b) runs ``paged_decode_attention`` unchanged (the same code is
    inlined: partial (m, l, acc) of its split for the G q heads of kv head h into part_acc /
    part_ml, the layout documented there).  Then it counts itself in on the counter
    ``counters[b*NKV + h]`` (i32, a persistent STATE, zero between launches).  The program
    whose increment returns S-1 is the last of its group: it merges the S partials of each
    of its G q heads exactly as ``paged_decode_reduce`` does (``_merge_splits_cg``: the same
    tiles and reduction order, so ``out`` is bitwise the two-launch output) into
    ``out[b, (h*G + i)*D : +D]`` (bf16 [seqs, NQ*D]), and stores 0 into the counter, so the
    counters are zero again for the next launch that uses them (the next run of this layer).
    No program ever waits for another one: there is no spin, so no co-residency requirement.

    Memory ordering (PTX memory model, scope gpu):
    1. each program's threads store their partials, then ``tl.debug_barrier()`` (bar.sync):
       every thread's stores precede, in causality order, what thread 0 does next;
    2. thread 0 (Triton issues a scalar atomic from one thread and broadcasts its result to
       the program through shared memory, behind a bar.sync) does
       ``atom.add.acq_rel.gpu`` on the counter.  Its release half makes the program's partial
       stores (ordered before it by 1; release is cumulative) visible at gpu scope before the
       increment, so before any later increment of the same counter (all increments of one
       counter form one modification order);
    3. the program that reads S-1 read the value written by the last of the other S-1
       increments, each of which released its program's partials: its acquire half
       synchronizes with all of them (release sequence of an atomic RMW chain), so all S
       programs' partials happen-before everything after it; the broadcast's bar.sync
       extends that to all of its threads;
    4. its threads read the partials with ``ld.global.cg`` (L2, the point of coherence),
       never from L1, which is not coherent across SMs and could hold a line loaded earlier
       in this launch by another group's last program on the same SM (part_ml lines hold
       entries of several groups) before this group's partials were stored.
    The reset store (``counters[...] = 0``) follows the last increment of the counter, and no
    other program of this launch touches it again; the next launch that reads it (this layer
    in the next run) starts after this one completes (stream order, or with PDL its
    ``griddepcontrol.wait``, transitively through the launches between).  Each layer must
    have its own counters (a per-layer offset into the state): two layers' launches may
    overlap under PDL and must never share a counter.

    Requirement on the caller: the counters are zero before the first launch (kern-driver
    zeroes the arena, states included, at load: kern_driver/runtime.py, cuMemsetD8Async of
    the arena).  A launch that dies mid-way (a fault, a killed process) can leave a counter
    nonzero; every later launch of that layer then merges too early (garbage) or never
    (``out`` not written).  Reload the runtime (which zeroes the states) after any fault.

    PDL: as ``paged_decode_attention`` (seq_lens, then the wait, then launch_dependents);
    every counter access and store comes after the wait.
    """
    paged_decode_attention(q, kv, block_table, seq_lens, part_acc, part_ml,
                           num_q_heads, num_kv_heads, q_stride, bt_stride, page_bytes, sm_scale,
                           D, BLOCK_H, BLOCK_N, PDL)
    h = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    S = tl.num_programs(1)
    G = num_q_heads // num_kv_heads
    tl.debug_barrier()  # every thread's partial stores, before thread 0's release
    cnt = counters + b * num_kv_heads + h
    arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if arrived == S - 1:
        tl.store(cnt, 0)
        for i in range(0, G):
            _merge_splits_cg(part_acc, part_ml, out, num_q_heads, S, h * G + i, b, D, MAX_SPLITS)


@triton.jit
def _prefill_tile(acc, m_i, l_i, qt, kvh, bt, page_elems, n0, pos_m, L, scale,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr):
    """One [BLOCK_N] key tile of paged_prefill_attention (CAUSAL_MASK: the diagonal / last tiles).  kvh: kv head h's
    base (kv + h*16*2*D).  Element d of token t's k (v: + D) is at d ^ ((t % 8) * 8) of its row: the chunk swizzle
    as an XOR on the element index (8 * (c ^ s) + e = (8c + e) ^ 8s); the hints say each run of 8 stays contiguous
    and 8-aligned, so the loads are 16-byte cp.async straight into the dot's operand buffers (98,560 bytes of shared
    memory with the catalog's instance).  Keep this form: a [BLOCK_N, 16, 8] load reshaped to [BLOCK_N, D] staged
    every tile through registers and scalar shared-memory stores (helper-58's PTX review, session 20), and other
    rewrites of these offsets changed the pipelining (49,152 bytes of shared memory)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if CAUSAL_MASK:
        nmask = offs_n < L
        page = tl.load(bt + offs_n // 16, mask=nmask, other=0).to(tl.int64)
    else:
        page = tl.load(bt + offs_n // 16).to(tl.int64)
    tok = page * page_elems + (offs_n % 16) * (2 * D)
    dd = tl.arange(0, D)
    sw = ((offs_n % 8) * 8)[:, None]
    koff = tok[:, None] + tl.max_contiguous(tl.multiple_of(dd[None, :] ^ sw, [1, 8]), [1, 8])
    voff = tok[:, None] + D + tl.max_contiguous(tl.multiple_of(dd[None, :] ^ sw, [1, 8]), [1, 8])
    if CAUSAL_MASK:
        k = tl.load(kvh + koff, mask=nmask[:, None], other=0.0)
    else:
        k = tl.load(kvh + koff)
    qk = tl.dot(qt, tl.trans(k)) * scale
    if CAUSAL_MASK:
        qk = tl.where((offs_n[None, :] <= pos_m[:, None]) & nmask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if CAUSAL_MASK:
        v = tl.load(kvh + voff, mask=nmask[:, None], other=0.0)
    else:
        v = tl.load(kvh + voff)
    acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
    return acc, m_new, l_i


@triton.jit
def paged_prefill_attention(q, kv, block_table, seq_lens, cu_seqlens_q, out,
                            num_q_heads, num_kv_heads, q_stride, bt_stride, page_bytes, sm_scale,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Causal attention of a chunk of queries against the paged cache (flash attention).

    Grid (ceil_div(tokens, BLOCK_M), NQ, seqs).  Sequence b's queries are rows
    cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q (bf16, head j at row*q_stride + j*D);
    with L = seq_lens[b] (cached + chunk, the chunk already written to KV) and
    n = its query count, query i sits at position L - n + i and attends to keys
    0 .. L - n + i.  out: bf16 [tokens, NQ*D], row cu_seqlens_q[b] + i.
    Programs beyond a sequence's queries exit at once.
    """
    mb = tl.program_id(0)
    j = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    q_start = tl.load(cu_seqlens_q + b)
    q_len = tl.load(cu_seqlens_q + b + 1) - q_start
    if mb * BLOCK_M >= q_len:
        return
    L = tl.load(seq_lens + b)
    ctx = L - q_len
    h = j // (num_q_heads // num_kv_heads)

    d = tl.arange(0, D)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = offs_m < q_len
    rowp = (q_start + offs_m).to(tl.int64)
    qt = tl.load(q + rowp[:, None] * q_stride + j * D + d[None, :], mask=mmask[:, None], other=0.0)
    pos_m = ctx + offs_m

    page_elems = (page_bytes // 512).to(tl.int64) * 256
    kvh = kv + h * (16 * 2 * D)
    bt = block_table + b * bt_stride
    scale = sm_scale * 1.4426950408889634

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # keys visible to every query of the block: [0, ctx + mb*BLOCK_M] -> whole tiles unmasked
    full_end = ((ctx + mb * BLOCK_M + 1) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(L, ctx + (mb + 1) * BLOCK_M)
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, qt, kvh, bt, page_elems, n0, pos_m, L, scale, D, BLOCK_N,
                                      False)
    for n0 in range(full_end, hi, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, qt, kvh, bt, page_elems, n0, pos_m, L, scale, D, BLOCK_N,
                                      True)
    o = acc / l_i[:, None]
    tl.store(out + rowp[:, None] * (num_q_heads * D) + j * D + d[None, :], o.to(tl.bfloat16), mask=mmask[:, None])
