// The screened lm_head for greedy decode (sm_90): the token of argmax_r bf16(xn · w[r]) (gemv.cu's
// kern_gemv_norm_m1 then argmax.cu, bit for bit the same token) while reading about half the head's bytes.
//
// Why it is exact. The provider ships, beside the bf16 head w [n, k], an int8 copy q [n, k] with a per-row
// scale s[r] and a per-row error coefficient c[r] (tools/export_weights.py `lm_head.screen.q8` and
// `lm_head.screen.rows`, float32 [n, 2] = (s, c)). c[r] is an upper bound (float64, rounded up) on
//     ‖w[r] − s[r]·q[r]‖₂ + γ·(s[r]·‖q[r]‖₂ + ‖w[r]‖₂),   γ = (k + 64)·2⁻²⁴·1.001,
// so for any vector xn (Cauchy–Schwarz, and the standard bound γₖ·Σ|aᵢbᵢ| on an fp32 dot product summed in any
// order): the fp32 dot that gemv.cu computes, fl(xn·w[r]), lies within ‖xn‖₂·c[r] of s[r]·fl(xn·q[r]).
// Stage 1 (screen) computes that interval [lo, hi] for every row from the int8 copy (k bytes a row instead of 2k),
// with margins for its own fp32 roundings. bf16 round-to-nearest is monotone, so bf16(dense[r]) lies in
// [bf16(lo[r]), bf16(hi[r])], and the maximum bf16 logit is at least B = max_r bf16(lo[r]). A row with
// bf16(hi[r]) < B cannot be the argmax, nor tie with it; every other row is a candidate. Stage 2 (pick) computes
// the candidates' dense logits exactly as gemv.cu does (the same normalized x, the same per-lane order, the same
// warp sum and rounding) and their argmax (ties: the smallest index, argmax.cu's packed key); argmax.cu's
// argmax_reduce finishes over the stage's per-block keys. The result never depends on how tight the bound is:
// a loose one only adds candidates, and when x is not finite every row is one (the dense argmax, slowly).
// Rows holding a non-finite weight must carry s = c = NaN (the export does): they are always candidates.
//
//   kern_lmhead_screen_m1(x, norm_w, q8, rows, xn, keys, bpart, n, k, eps)
//       x: bf16 [k] (the residual), norm_w: bf16 [k], q8: int8 [n, k], rows: f32 [n, 2] (s, c);
//       xn: bf16 [k] out (block 0 writes the normalized x, for stage 2), keys: u16 [n] out (the order of
//       bf16(hi[r]), argmax_key.cuh's argmax_order; 0xFFFF: always a candidate), bpart: u32 [grid.x] out (per
//       block, the max order of bf16(lo[r]) over its finite lo; 0 when none, or when xn is not finite).
//       xn = HF Qwen3RMSNorm(x)·norm_w through gemv.cu's own norm_to_smem (the same bits as the dense GEMV's).
//       grid (ceil_div(n, 32), 1, 1), block 256: 8 warps × 4 rows; dynamic shared memory 2·k bytes.
//       k: a multiple of 16; pointers 16-byte aligned. The first LS_U 16-byte int8 loads of each of a lane's rows
//       go out before griddepcontrol.wait (weights only); k ≤ 16·32·LS_U = 2,560 puts every load there.
//   kern_lmhead_pick_m1(xn, w, keys, bpart, nb1, partial, n, k)
//       xn: bf16 [k] from stage 1, w: bf16 [n, k] (the dense head), keys, bpart: stage 1's (nb1 = its grid.x),
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

#define LS_ROWS 4            // rows per warp in the screen
#define LS_U 5               // int8 16-byte loads per row per stage (stage 0 goes out before the wait)
#define LS_PICK_ROWS 1024    // rows per block in the pick (4 keys per thread)

static_assert(WARPS == 8, "norm_to_smem and the launches assume 8 warps of 32 threads");

namespace {

// q as float for the byte `i` of `t`, t = a word of four int8 xor 0x80808080 (so byte b = q + 128): the float with
// bits 0x4B0000bb is 2²³ + b exactly; minus 2²³ + 128 gives q exactly.
__device__ __forceinline__ float s8_at(uint32_t t, int i) {
    return __uint_as_float(__byte_perm(t, 0x4B000000u, 0x7540u | i)) - 8388736.f;
}

// acc[r] += Σ over the 16 int8 of w[r] · the 16 x values xf (any order: stage 1's sums are bounded, not matched).
__device__ __forceinline__ void acc16_s8(float &acc, const uint4 w, const float (&xf)[16]) {
    const uint32_t words[4] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u, w.w ^ 0x80808080u};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc = fmaf(xf[4 * j + i], s8_at(words[j], i), acc);
}

__device__ __forceinline__ void bf16x8_to_float(const uint4 v, float *f) {
    const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(p[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ uint32_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

// One int8 load of stage s for each of the LS_ROWS rows (predicated off past the lane's nl loads).
__device__ __forceinline__ void screen_stage(uint4 (&buf)[LS_ROWS][LS_U], const uint4 *__restrict__ q,
                                             const long (&rows)[LS_ROWS], int kv, int lane, int s, int nl) {
#pragma unroll
    for (int r = 0; r < LS_ROWS; ++r)
#pragma unroll
        for (int u = 0; u < LS_U; ++u) {
            const int j = s * LS_U + u;
            buf[r][u] = ldg_stage_if<false>(q + rows[r] * kv + lane + 32 * j, j < nl, 0);
        }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) kern_lmhead_screen_m1(
    const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w, const int8_t *__restrict__ q8,
    const float2 *__restrict__ rows_sc, __nv_bfloat16 *__restrict__ xn, uint16_t *__restrict__ keys,
    uint32_t *__restrict__ bpart, int n, int k, float eps) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);
    __shared__ uint32_t warp_lo[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 4;  // 16-byte int8 vectors per row
    const long row0 = ((long)blockIdx.x * WARPS + warp) * LS_ROWS;
    long rows[LS_ROWS];
#pragma unroll
    for (int r = 0; r < LS_ROWS; ++r) rows[r] = row0 + r < n ? row0 + r : n - 1;
    const int nl = lane_loads(0, kv, lane), stages = (nl + LS_U - 1) / LS_U;
    const uint4 *q = reinterpret_cast<const uint4 *>(q8);
    uint4 buf[LS_ROWS][LS_U];
    screen_stage(buf, q, rows, kv, lane, 0, nl);
    griddep_launch_dependents();
    griddep_wait();
    norm_to_smem<1>(x, norm_w, xs, k, eps);
    if (blockIdx.x == 0)
        for (int v = threadIdx.x; v < (k >> 3); v += blockDim.x)
            reinterpret_cast<uint4 *>(xn)[v] = reinterpret_cast<const uint4 *>(xs)[v];
    // ‖xn‖₂ squared, per warp over all of xs (no block barrier needed)
    float ss = 0.f;
    for (int v = lane; v < (k >> 3); v += 32) sumsq8(ss, reinterpret_cast<const uint4 *>(xs)[v]);
    ss = warp_sum(ss);
    float acc[LS_ROWS];
#pragma unroll
    for (int r = 0; r < LS_ROWS; ++r) acc[r] = 0.f;
    const uint4 *xv = reinterpret_cast<const uint4 *>(xs);
    for (int s = 0; s < stages; ++s) {
        if (s > 0) screen_stage(buf, q, rows, kv, lane, s, nl);
#pragma unroll
        for (int u = 0; u < LS_U; ++u) {
            const int j = s * LS_U + u;
            if (j < nl) {
                const int v = lane + 32 * j;
                float xf[16];
                bf16x8_to_float(xv[2 * v], xf);
                bf16x8_to_float(xv[2 * v + 1], xf + 8);
#pragma unroll
                for (int r = 0; r < LS_ROWS; ++r) acc16_s8(acc[r], buf[r][u], xf);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < LS_ROWS; ++r) acc[r] = warp_sum(acc[r]);
    // ‖xn‖₂ rounded up: the fp32 sum of squares is within (k + 64)·2⁻²⁴ of the exact one (relative, all terms
    // positive), the square root and the product within an ulp each.
    const float nrm = sqrtf(ss * (1.f + (float)(k + 64) * 1.2e-7f)) * (1.f + 2.4e-7f);
    const bool x_ok = isfinite(nrm);
    uint32_t lo_ord = 0;
#pragma unroll
    for (int r = 0; r < LS_ROWS; ++r)
        if (lane == r && row0 + r < n) {
            const float2 sc = rows_sc[rows[r]];
            const float center = sc.x * acc[r];
            // margin: ‖xn‖·c, plus slack for the roundings of s·acc, of ‖xn‖·c and of center ± margin
            const float m = nrm * sc.y * (1.f + 4e-6f) + fabsf(center) * 5e-7f + 1e-30f;
            const float hi = center + m, lo = center - m;
            uint32_t key = 0xFFFFu;  // not finite: always a candidate
            if (x_ok && isfinite(hi)) key = argmax_order(bf16_bits(hi));
            keys[row0 + r] = (uint16_t)key;
            if (x_ok && isfinite(lo)) lo_ord = argmax_order(bf16_bits(lo));
        }
    lo_ord = warp_max_u32(lo_ord);
    if (lane == 0) warp_lo[warp] = lo_ord;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t b = 0;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) b = max(b, warp_lo[i]);
        bpart[blockIdx.x] = b;
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_lmhead_pick_m1(
    const __nv_bfloat16 *__restrict__ xn, const __nv_bfloat16 *__restrict__ w, const uint16_t *__restrict__ keys,
    const uint32_t *__restrict__ bpart, int nb1, uint64_t *__restrict__ partial, int n, int k) {
    extern __shared__ __align__(16) unsigned char smem[];
    uint4 *xs = reinterpret_cast<uint4 *>(smem);
    __shared__ uint32_t warp_b[WARPS];
    __shared__ uint64_t warp_best[WARPS];
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
    b = warp_max_u32(b);
    if (lane == 0) warp_b[warp] = b;
    __syncthreads();
    b = 0;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) b = max(b, warp_b[i]);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    uint64_t best = 0;
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
            float acc = 0.f;
            for (int v = lane; v < kv; v += 32) acc8(acc, __ldg(wv + r * kv + v), xs[v]);
            acc = warp_sum(acc);
            const uint64_t kr = argmax_key(bf16_bits(acc), (uint32_t)r);
            best = kr > best ? kr : best;
        }
    }
    best = warp_max_u64(best);
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t m = 0;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) m = warp_best[i] > m ? warp_best[i] : m;
        partial[blockIdx.x] = m;
    }
}
