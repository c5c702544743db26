// The screened lm_head for greedy decode (sm_90): the token of argmax_r bf16(xn · w[r]) as gemv.cu's
// kern_gemv_norm_m1 at ksplit 1 then argmax.cu compute it, bit for bit, while reading about half the head's bytes.
//
// Why it is exact. The provider ships, beside the bf16 head w [n, k], an int8 copy q [n, k] and a per-row table
// (tools/export_weights.py --screened-head: `lm_head.screen.q8`, `lm_head.screen.rows` f32 [n, 4] = (s, e, nw, snq)): the
// scale s[r], and upper bounds e ≥ ‖w[r] − s·q[r]‖₂, nw ≥ ‖w[r]‖₂, snq ≥ s·‖q[r]‖₂. Stage 1 (screen) quantizes the
// normalized x too, per 16-element vector v: x̃_v = s_v·x̂_v with x̂_v int8 and s_v = max|x_v|/127, so each row's
// dot is a sum of exact int8 dot products (dp4a) scaled by s_v: a = Σ_v s_v·(x̂_v·q_v[r]) in fp32. For real numbers
//     xn·w = (xn − x̃)·w + x̃·(w − s·q) + s·(x̃·q),
// so by Cauchy–Schwarz |xn·w − s·(x̃·q)| ≤ ‖xn − x̃‖·nw + ‖x̃‖·e; a's fp32 chain is within γ_c·‖x̃‖·snq/s of x̃·q, and
// the fp32 dot that gemv.cu computes, fl(xn·w), within γ_d·‖xn‖·nw of xn·w (the standard bound γₙ·Σ|aᵢbᵢ| on a
// dot product summed in any order). Stage 1 computes the interval [lo, hi] around s·a that holds fl(xn·w) for
// every row, with margins for its own roundings (the norms of xn − x̃, x̃ and xn rounded up). bf16 round-to-nearest
// is monotone, so bf16(dense[r]) lies in [bf16(lo[r]), bf16(hi[r])], and the maximum bf16 logit is at least
// B = max_r bf16(lo[r]). A row with bf16(hi[r]) < B cannot be the argmax, nor tie with it; every other row is a
// candidate. Stage 2 (pick) computes the candidates' dense logits exactly as gemv.cu does (the same normalized x,
// the same per-lane order, the same warp sum and rounding) and their argmax (ties: the smallest index, argmax.cu's
// packed key); argmax.cu's argmax_reduce finishes over the stage's per-block keys. The result never depends on how
// tight the bound is: a loose one only adds candidates, and when x is not finite every row is one (the dense
// argmax, slowly). Rows holding a non-finite weight must carry a NaN table row (the export does): always candidates.
//
//   kern_lmhead_screen_m1(x, norm_w, q8, rows, xn, keys, bpart, n, k, eps)
//   kern_lmhead_screen_m1_r8, kern_lmhead_screen_m1_p18, kern_lmhead_screen_m1_r8_p9 (the same params)
//       x: bf16 [k] (the residual), norm_w: bf16 [k], q8: int8 [n, k], rows: f32 [n, 4] (s, e, nw, snq);
//       xn: bf16 [k] out (block 0 writes the normalized x, for stage 2), keys: u16 [n] out (the order of
//       bf16(hi[r]), argmax_key.cuh's argmax_order; 0xFFFF: always a candidate), bpart: u32 [nb1] out (per row
//       group of 8·R rows, nb1 = ceil_div(n, 8·R): the max order of bf16(lo[r]) over its finite lo; 0 when none, or
//       when xn is not finite).
//       xn = HF Qwen3RMSNorm(x)·norm_w through gemv.cu's own norm_to_smem (the same bits as the dense GEMV's).
//       grid (ceil_div(nb1, P), 1, 1), block 256: 8 warps × R rows per row group, R = 4 (and U = 5 int8 16-byte
//       loads per row per stage) or, in the `_r8` entries, R = 8 (U = 2: every load of a k ≤ 1,024 row in one stage,
//       and half the groups, so half the per-block prologues, which dominate short rows); P row groups per block:
//       1, or 18 / 9 in the `_pP` entries (the prologue once per block; see SCREEN_ENTRY); dynamic shared memory
//       4·k bytes (xn at 0, its int8 x̂ at 2·k, the vectors' f32 scales at 3·k: 3.25·k used).
//       k: a multiple of 16; pointers 16-byte aligned. The first U 16-byte int8 loads of each of a lane's rows go
//       out before griddepcontrol.wait (weights only); k ≤ 16·32·U puts every load there (later stages wait a
//       latency each).
//   kern_lmhead_pick_m1(xn, w, keys, bpart, nb1, partial, n, k)
//       xn: bf16 [k] from stage 1, w: bf16 [n, k] (the dense head), keys, bpart: stage 1's (nb1 its row groups),
//       partial: u64 [grid.x] out, argmax.cu's packed key of the best candidate of the block's rows (0: none).
//       grid (ceil_div(n, LS_PICK_ROWS), 1, 1), block 256; dynamic shared memory 2·k bytes. k: a multiple of 8.
//   Then argmax.cu's argmax_reduce(partial, out, parts = grid.x of stage 2).
//
// Programmatic dependent launch: both entries execute griddepcontrol.wait before reading anything a kernel
// writes (stage 1 issues only its int8 weight loads before it) and write nothing before it; both trigger their
// dependents right away (the next launch may be scheduled; it waits for this grid's completion itself).
#define GEMV_NO_ENTRIES
#include "gemv.cu"
#include "argmax_key.cuh"

#define LS_PICK_ROWS 1024    // rows per block in the pick (4 keys per thread)
#define PICK_BATCH 10        // a candidate row's 16-byte loads per lane in flight at once (k ≤ 2,560: all of them)

static_assert(WARPS == 8, "norm_to_smem and the launches assume 8 warps of 32 threads");

namespace {

// a += s_v · (x̂_v · q_v): the exact int8 dot of one 16-element vector (four dp4a), then one fp32 FMA.
__device__ __forceinline__ void acc16_q(float &a, const uint4 q, const uint4 xq, const float sv) {
    int d = __dp4a((int)q.x, (int)xq.x, 0);
    d = __dp4a((int)q.y, (int)xq.y, d);
    d = __dp4a((int)q.z, (int)xq.z, d);
    d = __dp4a((int)q.w, (int)xq.w, d);
    a = fmaf(sv, (float)d, a);  // |d| ≤ 16·127·127 < 2²⁴: exact as a float
}

__device__ __forceinline__ uint32_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// The max of v (unsigned) over the block, in every thread: a warp butterfly, one shared slot per warp, a barrier.
template <typename T>
__device__ __forceinline__ T block_max(T v, T (&slot)[WARPS]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = v;
    __syncthreads();
    T m = 0;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) m = slot[i] > m ? slot[i] : m;
    return m;
}

// One int8 load of stage s for each of the warp's NR rows row0 + r (a row past n reads row n − 1 instead: its
// result is not stored), predicated off past the lane's nl loads.
template <int NR, int NU>
__device__ __forceinline__ void screen_stage(uint4 (&buf)[NR][NU], const uint4 *__restrict__ q, long row0, int n,
                                             int kv, int lane, int s, int nl) {
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const uint4 *p = q + (row0 + r < n ? row0 + r : n - 1) * kv + lane;
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            const int j = s * NU + u;
            buf[r][u] = ldg_stage_if<false>(p + 32 * j, j < nl, 0);
        }
    }
}

// x̂ and the scales of the 16-element vectors of xs (one thread per vector): s_v = max|x|/127 (0 for a zero vector,
// NaN if any x is), x̂ = rint(x / s_v) in [-127, 127]; returns this thread's Σ (x − s_v·x̂)², Σ (s_v·x̂)², Σ x² as
// fp32 sums (rounded: the caller bounds them).
__device__ __forceinline__ void quantize_x(const __nv_bfloat16 *xs, uint4 *xq, float *sv, int kv, float3 &sums) {
    const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162 *>(xs);
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
        float amax = 0.f;
        bool bad = false;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float2 f = __bfloat1622float2(x2[8 * v + i]);
            amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
            bad |= !(fabsf(f.x) <= 3.4e38f) || !(fabsf(f.y) <= 3.4e38f);
        }
        // s_v ≈ amax/127 and x̂ = rint(x/s_v), clamped: any rounding of either is fine, since the bound is computed
        // from the s_v and x̂ the kernel uses (no IEEE division: its slow path would spill beside the weight stage)
        const float s = bad ? __int_as_float(0x7fc00000) : amax * (1.f / 127.f);  // NaN or inf in x: NaN
        const float inv = s > 0.f ? __fdividef(1.f, s) : 0.f;
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // re-read from shared memory: fewer live registers beside the weight stage
            const float2 f = __bfloat1622float2(x2[8 * v + i]);
            const float t0 = fminf(fmaxf(rintf(f.x * inv), -127.f), 127.f);
            const float t1 = fminf(fmaxf(rintf(f.y * inv), -127.f), 127.f);
            const uint32_t pair = ((uint32_t)(int)t0 & 0xFFu) | (((uint32_t)(int)t1 & 0xFFu) << 8);
            if (i & 1) w[i >> 1] |= pair << 16; else w[i >> 1] = pair;
            const float d0 = fmaf(-s, t0, f.x), d1 = fmaf(-s, t1, f.y);
            const float y0 = s * t0, y1 = s * t1;
            sums.x = fmaf(d0, d0, sums.x);
            sums.x = fmaf(d1, d1, sums.x);
            sums.y = fmaf(y0, y0, sums.y);
            sums.y = fmaf(y1, y1, sums.y);
            sums.z = fmaf(f.x, f.x, sums.z);
            sums.z = fmaf(f.y, f.y, sums.z);
        }
        xq[v] = make_uint4(w[0], w[1], w[2], w[3]);
        sv[v] = s;
    }
}

// Stage 1 with NR rows per warp and NU int8 loads per row per stage (the entries below), each block over P groups of
// 8·NR rows (P = 1: one group; the `_p` entries: P consecutive groups, the norm and x's quantization done once and each
// group's first loads issued as soon as the group before it has consumed its own, before that group's bounds). Group
// g of block b is what block b·P + g of a P = 1 launch computes, and its result goes where that block's went
// (bpart[b·P + g]), so the pick reads the same nb1 = ceil(n / (8·NR)) entries whatever P is.
template <int NR, int NU, int P>
__device__ __forceinline__ void screen_rows(
    const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w, const int8_t *__restrict__ q8,
    const float4 *__restrict__ rows_sc, __nv_bfloat16 *__restrict__ xn, uint16_t *__restrict__ keys,
    uint32_t *__restrict__ bpart, int n, int k, float eps) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);
    const int kv = k >> 4;  // 16-byte int8 vectors per row (16 elements each)
    uint4 *xq = reinterpret_cast<uint4 *>(smem + 2 * k);
    float *sv = reinterpret_cast<float *>(smem + 3 * k);
    __shared__ float3 warp_sums[WARPS];
    __shared__ uint32_t warp_lo[P > 1 ? 2 : 1][WARPS];  // block_max's slots, alternating between groups
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long nb1 = (n + WARPS * NR - 1) / (WARPS * NR);  // groups of the head (a P = 1 launch's blocks)
    const long g0 = (long)blockIdx.x * P;
    long row0 = (g0 * WARPS + warp) * NR;
    const int nl = lane_loads(0, kv, lane), stages = (nl + NU - 1) / NU;
    const uint4 *q = reinterpret_cast<const uint4 *>(q8);
    uint4 buf[NR][NU];
    screen_stage(buf, q, row0, n, kv, lane, 0, nl);
    griddep_launch_dependents();
    griddep_wait();
    norm_to_smem<1, false, 2>(x, norm_w, xs, k, eps);  // the batched prologue (gemv.cu's _nb2); ends with a block barrier
    if (blockIdx.x == 0)
        for (int v = threadIdx.x; v < (k >> 3); v += blockDim.x)
            reinterpret_cast<uint4 *>(xn)[v] = reinterpret_cast<const uint4 *>(xs)[v];
    float3 sums = make_float3(0.f, 0.f, 0.f);
    quantize_x(xs, xq, sv, kv, sums);
    sums.x = warp_sum(sums.x);
    sums.y = warp_sum(sums.y);
    sums.z = warp_sum(sums.z);
    if (lane == 0) warp_sums[warp] = sums;
    __syncthreads();
    float3 tot = make_float3(0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < WARPS; ++i) {
        tot.x += warp_sums[i].x;
        tot.y += warp_sums[i].y;
        tot.z += warp_sums[i].z;
    }
#pragma unroll 1
    for (int p = 0; p < P; ++p) {
        const long g = g0 + p;  // block-uniform
        if (P > 1 && g >= nb1) break;
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.f;
        for (int s = 0; s < stages; ++s) {
            if (s > 0) screen_stage(buf, q, row0, n, kv, lane, s, nl);
#pragma unroll
            for (int u = 0; u < NU; ++u) {
                const int j = s * NU + u;
                if (j < nl) {
                    const int v = lane + 32 * j;
                    const uint4 xv = xq[v];
                    const float sc = sv[v];
#pragma unroll
                    for (int r = 0; r < NR; ++r) acc16_q(acc[r], buf[r][u], xv, sc);
                }
            }
        }
        const long row_this = row0;
        if (P > 1 && p + 1 < P && g + 1 < nb1) {  // the next group's first loads, before this group's bounds
            row0 += (long)WARPS * NR;
            screen_stage(buf, q, row0, n, kv, lane, 0, nl);
        }
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
        // Norms rounded up (per group: where the P = 1 entries always had them): each sum of squares has at most
        // k + 64 roundings of positive terms (relative error below (k + 64)·2⁻²⁴, taken twice over), its square root
        // and the products below within an ulp each (the 1 + 2⁻²¹); + 1e-36 for what underflow loses (at most 2⁻¹⁵⁰ a
        // rounding: squares of elements below 2⁻⁶³ vanish).
        const float up = 1.f + (float)(k + 64) * 1.2e-7f;
        const float nd = sqrtf(tot.x * up + 1e-36f) * (1.f + 4.8e-7f);   // ‖xn − x̃‖
        const float nxt = sqrtf(tot.y * up + 1e-36f) * (1.f + 4.8e-7f);  // ‖x̃‖
        const float nx = sqrtf(tot.z * up + 1e-36f) * (1.f + 4.8e-7f);   // ‖xn‖
        // γ of the screen's chain (at most nl_max FMAs of exact products + 5 warp-sum additions per row; lane 0 has
        // the most loads) and of the dense dot (any order over k terms), each with room to spare
        const int nl_max = lane_loads(0, kv, 0);
        const float gc = (float)(nl_max + 40) * 1.2e-7f, gd = (float)(k + 64) * 1.2e-7f;
        const bool x_ok = isfinite(nd) && isfinite(nxt) && isfinite(nx);
        uint32_t lo_ord = 0;
#pragma unroll
        for (int r = 0; r < NR; ++r)
            if (lane == r && row_this + r < n) {
                const float4 t = rows_sc[row_this + r];  // (s, e, nw, snq); row_this + r < n here
                const float center = t.x * acc[r];
                // margin: the bound's three terms and the dense rounding, plus slack for this arithmetic's own
                // roundings, and for what underflow loses in the screen's chain (2⁻¹⁵⁰ a rounding, times s) and in
                // the dense one
                const float m = (nd * t.z + nxt * t.y + gc * nxt * t.w + gd * nx * t.z) * (1.f + 4e-6f) +
                                fabsf(center) * 5e-7f + fabsf(t.x) * 1e-40f + 1e-30f;
                const float hi = center + m, lo = center - m;
                // the dense fp32 dot may overflow (its partial sums are bounded only by ‖xn‖·‖w‖) into ±inf or NaN,
                // which this interval does not hold: such a row is always a candidate, and gives no lower bound
                const bool fits = nx * t.z < 1e38f;
                uint32_t key = 0xFFFFu;  // not finite: always a candidate
                if (x_ok && fits && isfinite(hi)) key = argmax_order(bf16_bits(hi));
                keys[row_this + r] = (uint16_t)key;
                if (x_ok && fits && isfinite(lo)) lo_ord = argmax_order(bf16_bits(lo));
            }
        lo_ord = block_max(lo_ord, warp_lo[p & (P > 1 ? 1 : 0)]);
        if (threadIdx.x == 0) bpart[g] = lo_ord;
    }
}

}  // namespace

#define SCREEN_ENTRY(NAME, NR_, NU_, P_, MINB)                                                                     \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB) NAME(                                         \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                            \
        const int8_t *__restrict__ q8, const float4 *__restrict__ rows_sc, __nv_bfloat16 *__restrict__ xn,       \
        uint16_t *__restrict__ keys, uint32_t *__restrict__ bpart, int n, int k, float eps) {                    \
        screen_rows<NR_, NU_, P_>(x, norm_w, q8, rows_sc, xn, keys, bpart, n, k, eps);                               \
    }
SCREEN_ENTRY(kern_lmhead_screen_m1, 4, 5, 1, 2)     // k ≤ 2,560: every load before the wait
SCREEN_ENTRY(kern_lmhead_screen_m1_r8, 8, 2, 1, 2)  // k ≤ 1,024: twice the rows per block, half the blocks' prologues
// Row groups per block: P = ceil_div(groups, 2·132), so that the screen is one wave of 264 blocks at two per SM on
// the H200 (the Qwen3 vocabulary: 4,748 groups of 32 rows, 2,374 of 64): grid ceil_div(ceil_div(n, 8·NR), P), the
// same keys and bpart as P = 1. H200, kern-run decode at 128 cached tokens, tokens identical (NOTES.md 68): 4B P = 2
// −0.007 ms/token, 4 −0.012, 8 −0.006, 18 −0.016; 0.6B (`_r8`) P = 2 +0.001, 4 +0.002, 9 −0.006 — a partial last wave
// costs what the fewer prologues give.
SCREEN_ENTRY(kern_lmhead_screen_m1_p18, 4, 5, 18, 2)
SCREEN_ENTRY(kern_lmhead_screen_m1_r8_p9, 8, 2, 9, 2)

extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_lmhead_pick_m1(
    const __nv_bfloat16 *__restrict__ xn, const __nv_bfloat16 *__restrict__ w, const uint16_t *__restrict__ keys,
    const uint32_t *__restrict__ bpart, int nb1, uint64_t *__restrict__ partial, int n, int k) {
    extern __shared__ __align__(16) unsigned char smem[];
    uint4 *xs = reinterpret_cast<uint4 *>(smem);
    __shared__ uint32_t warp_b[WARPS];
    __shared__ unsigned long long warp_best[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;  // 16-byte bf16 vectors per row
    griddep_launch_dependents();
    griddep_wait();
    // Everything read below was written by stage 1 (or earlier): through L2 (ld.global.cg).
    constexpr int PER = LS_PICK_ROWS / (WARPS * 32);
    const long r0 = (long)blockIdx.x * LS_PICK_ROWS;
    uint32_t key[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const long r = r0 + threadIdx.x + i * WARPS * 32;
        key[i] = r < n ? __ldcg(keys + r) : 0u;
    }
    uint32_t b = 0;
    for (int i = threadIdx.x; i < nb1; i += blockDim.x) b = max(b, __ldcg(bpart + i));
    for (int v = threadIdx.x; v < kv; v += blockDim.x) xs[v] = __ldcg(reinterpret_cast<const uint4 *>(xn) + v);
    b = block_max(b, warp_b);  // (its barrier also orders xs's stores before the reads below)
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    unsigned long long best = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const long base = r0 + (long)warp * 32 + (long)i * WARPS * 32;
        const bool cand = base + lane < n && key[i] >= b;
        unsigned mask = __ballot_sync(0xffffffffu, cand);
        while (mask) {
            const long r = base + __ffs(mask) - 1;
            mask &= mask - 1;
            // gemv.cu's dense dot for row r, lane by lane: loads j = 0, 1, ... at vector lane + 32j, acc8 in
            // element order, then warp_sum and one rounding (kern_gemv_norm_m1 with ksplit 1: the same bits)
            // (the row's loads go out PICK_BATCH at a time before their FMAs: one latency per batch, not per load)
            float acc = 0.f;
            const uint4 *row = wv + r * kv;
            for (int v0 = lane; v0 < kv; v0 += 32 * PICK_BATCH) {
                uint4 wl[PICK_BATCH];
#pragma unroll
                for (int i = 0; i < PICK_BATCH; ++i)
                    if (v0 + 32 * i < kv) wl[i] = __ldg(row + v0 + 32 * i);
#pragma unroll
                for (int i = 0; i < PICK_BATCH; ++i)
                    if (v0 + 32 * i < kv) acc8(acc, wl[i], xs[v0 + 32 * i]);
            }
            acc = warp_sum(acc);
            const uint64_t kr = argmax_key(bf16_bits(acc), (uint32_t)r);
            best = kr > best ? kr : best;
        }
    }
    best = block_max(best, warp_best);
    if (threadIdx.x == 0) partial[blockIdx.x] = best;
}
