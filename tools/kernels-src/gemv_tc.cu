// Decode GEMVs on the tensor cores (sm_90, M = 1, 2, 4, 8 inputs): gemv.cu's four variants with the same params and
// roundings, the dot products by mma.sync.m16n8k16 (bf16 in, fp32 accumulate) instead of 16·M FMAs and 8 converts per
// 16-byte load.
//
// Why (NOTES.md 27, 72): in gemv.cu a lane's next weight loads are issued only after the FMAs of the stage they
// replace, so the stream loop's own instructions delay the weight stream at every kernel boundary; a probe measured
// the FMA form of the dots at +3.5 µs per launch and an mma form at +0.9. One mma here consumes one 16-byte load per
// lane: per step a lane issues two weight loads, one x load and two mma (M ≤ 4; M = 8: two x loads, four mma); a step
// is 128 elements of k of two rows in the M = 1 runs layout, 32 of two rows in the tile layout.
//
// Two layouts of a block's 16-row tile. M = 1 uses the runs layout (tc_tile_runs below: each warp reads two rows in
// 256-byte runs, B's columns carrying four chunks of k); M > 1 the tile layout, described here.
// Tile layout. A block owns one tile of 16 rows; its 8 warps split k into 8 contiguous ranges of whole 32-element steps.
// Lane (g, t) = (lane / 4, lane % 4) loads, in step s, the 8 elements e = 32·s + 8·t … + 7 of row g and of row
// g + 8 of the tile, and x's same 8 elements X. Each 16-byte row load is the A operand of one mma.m16n8k16 as it
// lands (no register moves): the fragment's registers (PTX ISA, "Matrix Fragments for mma.m16n8k16", .bf16) are
// a0a1 = (A row g, k slots 2t, 2t+1), a2a3 = (A row g+8, slots 2t, 2t+1), a4a5 = (A row g, 2t+8, 2t+9), a6a7 =
// (A row g+8, 2t+8, 2t+9), so A's row g holds the weight row's elements 8t+{0,1,4,5} and A's row g+8 its elements
// 8t+{2,3,6,7}, i.e. an 8-row tile whose two halves of k sit in A's two row halves. B's columns carry x in both
// orders: the lanes of even g (columns 0, 2, …) hold X's elements {0,1} and {4,5} (b0b1 = X.x, b2b3 = X.z), the
// lanes of odd g X's {2,3} and {6,7} (X.y, X.w). Then C[g][even column] is row g's dot over 8t+{0,1,4,5} and
// C[g+8][odd column] its dot over 8t+{2,3,6,7}: the lane's c0 + c3 is the row's partial sum (a dot product does
// not depend on the order of k). Two mma per step (row g's load, row g+8's), four accumulators (two per row,
// alternating with u within a stage); they, then the 8 warps' partials, are summed in a fixed order: results are deterministic,
// but not gemv.cu's bits (the tensor core sums its products in its own order and precision).
// M inputs (x: [M, k], y and residual: [M, n]; TcInputs): B's column pairs carry different inputs — for M = 4 columns
// 2i, 2i + 1 are input i (lanes of g = 2i, 2i + 1 load input i's X), for M = 2 columns 4i … 4i + 3 — so one mma per
// loaded row serves up to 4 inputs at M = 1's instruction count, and lane (g, t)'s c0 + c3 is row g's sum for input t
// (M = 4) or t / 2 (M = 2). M = 8 issues two mma per loaded row (inputs 0–3, then 4–7) into 8 accumulators; U = 2
// there (catalog.py GEMV_TC_UNROLL) keeps it within 128 registers. The norm variants normalize each input on its own.
//
//   kern_gemvtc_m{M}(x, w, y, n, k, ksplit)                       y[m, j] = bf16(x[m]·w[j])
//   kern_gemvtc_norm_m{M}(x, norm_w, w, y, n, k, eps, ksplit)     y[m, j] = bf16(xn[m]·w[j]), xn as gemv.cu's norm
//   kern_gemvtc_norm_silu_m{M}(x, norm_w, w, y, n, k, eps, ksplit) y[m, j] = bf16(bf16(silu(g)) · u), the tile's
//       rows g < 8 are gate rows j0 + g, rows g + 8 up rows n + j0 + g (8 output columns per block)
//   kern_gemvtc_residual_m{M}(x, w, residual, n, k, ksplit)       residual[m, j] = bf16(residual[m, j] + bf16(x[m]·w[j]))
//   for M in 1, 2, 4, 8; M = 1 also `_u5` (U = 5).
// Launch: block 256, grid.x = ceil_div(n, 16) (norm_silu: ceil_div(n, 8)), ksplit must be 1 (the warps always
// split k: the launch geometry of gemv.cu's entries at ksplit 1); k a multiple of the step (M = 1: 128, the runs
// layout; M > 1: 32; the index constexpr TC_STEP); pointers 16-byte aligned; the norm variants take M·k·2 bytes of
// dynamic shared memory. U (4, 5 in `_u5`, 2 for M = 8) steps per pipeline stage (2U weight loads per lane), two
// stages issued before griddepcontrol.wait, as gemv.cu. A launch with ksplit ≠ 1 or k not a multiple of the step traps.
#define GEMV_NO_ENTRIES
#include "gemv.cu"

namespace {

// c += A·B for one m16n8k16 tile (bf16 inputs, fp32 accumulators; PTX ISA mma.sync.aligned.m16n8k16.row.col).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Stage s of a lane's weight loads: steps j = s·U + u < ns, rows g (buf[0]) and g + 8 (buf[1]); p0/p1 point at the
// lane's first vector of its warp's range in each row; a step is STRIDE vectors (4: 32 elements; the runs layout's
// 16: 128 elements).
template <int U, int STRIDE = 4>
__device__ __forceinline__ void tc_stage_load(uint4 (&buf)[2][U], const uint4 *p0, const uint4 *p1, int s, int ns) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int j = s * U + u;
        buf[0][u] = ldg_stage_if<false>(p0 + STRIDE * j, j < ns, 0);
        buf[1][u] = ldg_stage_if<false>(p1 + STRIDE * j, j < ns, 0);
    }
}

// B's 8 columns carry x for TcInputs<M>::MB inputs per mma, each in both orders (see the header): column c holds input
// (c·MB) >> 3 of its group, so for MB = 4 columns 2i and 2i + 1 are input i, for MB = 2 columns 4i … 4i + 3, for MB = 1
// all eight; M = 8 takes two groups (two mma per loaded row: inputs 0…3, then 4…7). Lane (g, t)'s C columns 2t and
// 2t + 1 then belong to input (t·MB) >> 2 of each group: its c0 + c3 is row g's sum for that input.
template <int M>
struct TcInputs {
    static_assert(M == 1 || M == 2 || M == 4 || M == 8, "gemv_tc.cu: M in 1, 2, 4, 8");
    static constexpr int MB = M < 4 ? M : 4;  // inputs per mma
    static constexpr int NG = M / MB;         // mma groups per loaded row
    // the input whose x vector lane (g, ·) supplies as B column g in group h
    __host__ __device__ static constexpr int col_input(int g, int h) { return MB == 1 ? h : h * MB + ((g * MB) >> 3); }
    // the input of lane (·, t)'s C columns 2t, 2t + 1 in group h; only the first lane of each run of 4 / MB stores it
    __host__ __device__ static constexpr int out_input(int t, int h) { return MB == 1 ? h : h * MB + ((t * MB) >> 2); }
    __host__ __device__ static constexpr bool out_lane(int t) { return (t & (4 / MB - 1)) == 0; }
    // The mapping's invariants, checked at compile time: lane (g, t)'s c0 (C column 2t, fed by B column 2t: even, X's
    // elements {0,1,4,5}) and c3 (column 2t + 1: odd, {2,3,6,7}) belong to the input out_input(t, h) stores, and the
    // storing lanes cover every input exactly once.
    __host__ __device__ static constexpr bool consistent() {
        int stored[8] = {};
        for (int h = 0; h < NG; ++h)
            for (int t = 0; t < 4; ++t) {
                if (col_input(2 * t, h) != out_input(t, h) || col_input(2 * t + 1, h) != out_input(t, h)) return false;
                if (out_lane(t)) ++stored[out_input(t, h)];
            }
        for (int m = 0; m < 8; ++m)
            if (stored[m] != (m < M ? 1 : 0)) return false;
        return true;
    }
};
static_assert(TcInputs<1>::consistent() && TcInputs<2>::consistent() && TcInputs<4>::consistent() &&
                  TcInputs<8>::consistent(),
              "gemv_tc.cu: TcInputs' B columns and stored C columns disagree");

// The mma of stage s: for step j = s·U + u, per group h one mma per loaded row (buf[0]: row g, buf[1]: row g + 8),
// into accumulators c[h][u & 1] and c[h][2 + (u & 1)]; `xv(m, j)` is input m's 16-byte x vector of the lane for step
// j, `odd` = g & 1 picks the half of it that the lane's B column holds (see the header). ns is the same for the warp's
// 32 lanes (mma.sync wants them all).
template <int M, int U, typename XV>
__device__ __forceinline__ void tc_stage_mma(float (&c)[TcInputs<M>::NG][4][4], const uint4 (&buf)[2][U], int s,
                                             int ns, int g, const XV &xv) {
    const bool odd = g & 1;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int j = s * U + u;
        if (j < ns) {
            const uint4 a = buf[0][u], b = buf[1][u];
#pragma unroll
            for (int h = 0; h < TcInputs<M>::NG; ++h) {
                const uint4 x = xv(TcInputs<M>::col_input(g, h), j);
                const uint32_t b0 = odd ? x.y : x.x, b1 = odd ? x.w : x.z;
                mma_bf16(c[h][u & 1], a.x, a.y, a.z, a.w, b0, b1);
                mma_bf16(c[h][2 + (u & 1)], b.x, b.y, b.z, b.w, b0, b1);
            }
        }
    }
}

// The 16 row sums of the block's tile for each of the M inputs into sums[m][0..15] (shared, valid after the barrier
// this ends with): each warp's two-stage register pipeline over its k range (the first two stages before the PDL
// gate, as gemv.cu's pdl_dot), then its partials through shared memory, summed over the warps in order by threads
// 0..16·M − 1. rows past n are clamped to n − 1 for the loads (their sums are not stored by the callers). `xvec(m, v)`:
// input m's x vector v (8 elements).
template <int M, int U, typename Prologue, typename XV>
__device__ __forceinline__ void tc_tile(const __nv_bfloat16 *__restrict__ w_, long r0, long r1, int k,
                                        Prologue prologue, const XV &xvec, float (*sums)[16]) {
    using In = TcInputs<M>;
    __shared__ float part[WARPS][M][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int kv = k >> 3, steps = k >> 5;
    const int per = (steps + WARPS - 1) / WARPS, s0 = min(steps, warp * per), ns = min(steps - s0, per);
    const uint4 *w = reinterpret_cast<const uint4 *>(w_);
    const uint4 *p0 = w + r0 * kv + 4 * s0 + t, *p1 = w + r1 * kv + 4 * s0 + t;
    const int stages = (ns + U - 1) / U;
    uint4 a[2][U], b[2][U];
    tc_stage_load<U>(a, p0, p1, 0, ns);
    tc_stage_load<U>(b, p0, p1, 1, ns);
    pdl_gate(prologue);
    float c[In::NG][4][4];
#pragma unroll
    for (int h = 0; h < In::NG; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[h][i][e] = 0.f;
    const int xv0 = 4 * s0 + t;
    auto xv = [&](int m, int j) { return xvec(m, xv0 + 4 * j); };
    for (int s = 0; s < stages; s += 2) {
        tc_stage_mma<M, U>(c, a, s, ns, g, xv);
        tc_stage_load<U>(a, p0, p1, s + 2, ns);
        if (s + 1 < stages) {
            tc_stage_mma<M, U>(c, b, s + 1, ns, g, xv);
            tc_stage_load<U>(b, p0, p1, s + 3, ns);
        }
    }
    if (In::out_lane(t)) {
#pragma unroll
        for (int h = 0; h < In::NG; ++h) {
            const int m = In::out_input(t, h);
            part[warp][m][g] = (c[h][0][0] + c[h][0][3]) + (c[h][1][0] + c[h][1][3]);  // row g: even + odd column
            part[warp][m][g + 8] = (c[h][2][0] + c[h][2][3]) + (c[h][3][0] + c[h][3][3]);
        }
    }
    __syncthreads();
    if (threadIdx.x < 16 * M) {
        const int m = M == 1 ? 0 : threadIdx.x >> 4, r = M == 1 ? threadIdx.x : threadIdx.x & 15;
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) acc += part[i][m][r];
        sums[m][r] = acc;
    }
    __syncthreads();
}

// The runs layout, M = 1's (k a multiple of 128). The tile layout above reads each weight row in 64-byte runs per load
// instruction (a warp: 8 rows × 64 bytes), which costs the large streams (gate_up, lm_head) 5–20% against gemv.cu's
// 512-byte runs; this one reads 256-byte runs (a warp: 2 rows × 256 bytes, lane l at the row's elements 128·j +
// 8·(l & 15) in step j) with the same loads, x loads and mma per byte (NOTES.md 74). M = 1 leaves B's column pairs
// free (the tile layout puts the one x vector in all four), so here they carry four k chunks instead of four inputs:
// group g's lanes load chunk g & 3 (32 elements) of row g >> 2, split across A's rows g and g + 8 as in the tile
// layout, and the lanes of B column g load x's chunk g >> 1 (X.x, X.z for even g; X.y, X.w for odd g). Then C[g][2q] +
// C[g + 8][2q + 1] is row g >> 2's dot over chunk q where q = g & 3: lane (g, t) holds it in c0 + c3 when t == g & 3
// (lanes 0, 5, 10, 15 of each half-warp); the other lanes pair a chunk of the row with another chunk of x and are
// dropped. Block: 16 rows; warp w owns tile rows 4·(w >> 1) + {0, 1} (buf[0], half-warps 0 and 1) and 4·(w >> 1) +
// {2, 3} (buf[1]) over k half w & 1. row_of(r): the weight row of tile row r (rows past n clamped by the caller).
// Sums in a fixed order (the four chunk lanes, then the two k halves): deterministic, not the tile layout's bits.
// -DGEMV_TC_M1_TILE (a what-if build) puts the M = 1 entries back on the tile layout.
template <int U, typename RowOf, typename Prologue, typename XV>
__device__ __forceinline__ void tc_tile_runs(const __nv_bfloat16 *__restrict__ w_, RowOf row_of, int k,
                                             Prologue prologue, const XV &xvec, float (*sums)[16]) {
    static_assert(WARPS == 8, "gemv_tc.cu runs layout: 4 row quads × 2 k halves");
    __shared__ float part[2][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int quad = warp >> 1, half = warp & 1, hw = lane >> 4;
    const int kv = k >> 3, steps = k >> 7;
    const int per = (steps + 1) / 2, s0 = min(steps, half * per), ns = min(steps - s0, per);
    const uint4 *w = reinterpret_cast<const uint4 *>(w_);
    const long ra = row_of(4 * quad + hw), rb = row_of(4 * quad + 2 + hw);
    const uint4 *p0 = w + ra * kv + 16 * s0 + (lane & 15), *p1 = w + rb * kv + 16 * s0 + (lane & 15);
    const int stages = (ns + U - 1) / U;
    uint4 a[2][U], b[2][U];
    tc_stage_load<U, 16>(a, p0, p1, 0, ns);
    tc_stage_load<U, 16>(b, p0, p1, 1, ns);
    pdl_gate(prologue);
    float c[1][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[0][i][e] = 0.f;
    const int xv0 = 16 * s0 + 4 * (g >> 1) + t;
    auto xv = [&](int, int j) { return xvec(0, xv0 + 16 * j); };
    for (int s = 0; s < stages; s += 2) {
        tc_stage_mma<1, U>(c, a, s, ns, g, xv);
        tc_stage_load<U, 16>(a, p0, p1, s + 2, ns);
        if (s + 1 < stages) {
            tc_stage_mma<1, U>(c, b, s + 1, ns, g, xv);
            tc_stage_load<U, 16>(b, p0, p1, s + 3, ns);
        }
    }
    const float va = (c[0][0][0] + c[0][0][3]) + (c[0][1][0] + c[0][1][3]);
    const float vb = (c[0][2][0] + c[0][2][3]) + (c[0][3][0] + c[0][3][3]);
    const int base = lane & 16;  // the half-warp's row: its chunk lanes base + 5·q hold chunk q
    float sa = 0.f, sb = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        sa += __shfl_sync(0xffffffffu, va, base + 5 * q);
        sb += __shfl_sync(0xffffffffu, vb, base + 5 * q);
    }
    if ((lane & 15) == 0) {
        part[half][4 * quad + hw] = sa;
        part[half][4 * quad + 2 + hw] = sb;
    }
    __syncthreads();
    if (threadIdx.x < 16) sums[0][threadIdx.x] = part[0][threadIdx.x] + part[1][threadIdx.x];
    __syncthreads();
}

#ifndef GEMV_TC_M1_TILE
constexpr int TC_M1_STEP = 128;  // M = 1's elements of k per step: the runs layout's (catalog.py GEMV_TC_STEPS)
#else
constexpr int TC_M1_STEP = 32;  // the what-if build of M = 1 on the tile layout
#endif

template <int M>
__device__ __forceinline__ void tc_check(int k, int ksplit) {
    // the launch geometry and whole steps of k (see the header: M = 1 128 elements, the runs layout; M > 1 32)
    if (ksplit != 1 || (k & ((M == 1 ? TC_M1_STEP : 32) - 1)) != 0) __trap();
}

// plain (RESIDUAL false) and residual: rows row0 … row0 + 15 of y[m] for the M inputs (y: [M, n]).
template <bool RESIDUAL, int M, int U, typename Prologue, typename XV>
__device__ __forceinline__ void tc_rows(const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n,
                                        int k, Prologue prologue, const XV &xv) {
    __shared__ float sums[M][16];
    const int g = (threadIdx.x & 31) >> 2;
    const long row0 = (long)blockIdx.x * 16;
#ifndef GEMV_TC_M1_TILE
    if constexpr (M == 1) {
        tc_tile_runs<U>(w, [&](int r) { return min(row0 + r, (long)n - 1); }, k, prologue, xv, sums);
    } else
#endif
    {
        const long r0 = min(row0 + g, (long)n - 1), r1 = min(row0 + g + 8, (long)n - 1);
        tc_tile<M, U>(w, r0, r1, k, prologue, xv, sums);
    }
    const unsigned m = M == 1 ? 0 : threadIdx.x >> 4, r = M == 1 ? threadIdx.x : threadIdx.x & 15;
    const long i = row0 + r;
    if (threadIdx.x < 16 * M && i < n) {
        __nv_bfloat16 *ym = M == 1 ? y : y + (long)m * n;
        if (RESIDUAL)
            ym[i] = tobf(bf(ym[i]) + bf(tobf(sums[m][r])));
        else
            ym[i] = tobf(sums[m][r]);
    }
}

// norm + SiLU-and-mul: output columns j0 … j0 + 7 of y[m] (gate rows j0 + g, up rows n + j0 + g).
template <int M, int U, typename Prologue, typename XV>
__device__ __forceinline__ void tc_silu_rows(const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y,
                                             int n, int k, Prologue prologue, const XV &xv) {
    __shared__ float sums[M][16];
    const int g = (threadIdx.x & 31) >> 2;
    const long j0 = (long)blockIdx.x * 8;
#ifndef GEMV_TC_M1_TILE
    if constexpr (M == 1) {
        tc_tile_runs<U>(w, [&](int r) { return (r < 8 ? 0 : (long)n) + min(j0 + (r & 7), (long)n - 1); }, k, prologue,
                        xv, sums);
    } else
#endif
    {
        const long jc = min(j0 + g, (long)n - 1);
        tc_tile<M, U>(w, jc, n + jc, k, prologue, xv, sums);
    }
    const unsigned m = M == 1 ? 0 : threadIdx.x >> 3, c = M == 1 ? threadIdx.x : threadIdx.x & 7;
    const long j = j0 + c;
    if (threadIdx.x < 8 * M && j < n) {
        const float gt = bf(tobf(sums[m][c]));
        const float up = bf(tobf(sums[m][c + 8]));
        (M == 1 ? y : y + (long)m * n)[j] = tobf(bf(tobf(silu(gt))) * up);
    }
}

// Input m's x vector v: through generic loads from global memory (plain, residual: as gemv.cu's PdlGate::x) or from
// the normalized copy in shared memory (norm variants); x and its copy are [M, k], kv = k / 8 vectors per input.
template <int M>
struct XGlobal {
    const uint4 *x;
    int kv;
    __device__ __forceinline__ uint4 operator()(int m, int v) const { return M == 1 ? x[v] : x[(long)m * kv + v]; }
};
template <int M>
struct XShared {
    const uint4 *xs;
    int kv;
    __device__ __forceinline__ uint4 operator()(int m, int v) const { return M == 1 ? xs[v] : xs[m * kv + v]; }
};

}  // namespace

// The four variants for M inputs, U steps per stage; NB: norm_to_smem's batched prologue (2 for M = 1: batched for
// k/8 in (256, 512], the loop otherwise; 1 for M > 1, the loop).
#define INSTANTIATE_TC(M, U, NB, SUFFIX)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) kern_gemvtc_m##M##SUFFIX(                         \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y,  \
        int n, int k, int ksplit) {                                                                               \
        tc_check<M>(k, ksplit);                                                                                   \
        const uint4 *xp = reinterpret_cast<const uint4 *>(x);                                                     \
        asm volatile("" : "+l"(xp)); /* generic loads: a PDL predecessor wrote x */                               \
        tc_rows<false, M, U>(w, y, n, k, [] {}, XGlobal<M>{xp, k >> 3});                                          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) kern_gemvtc_residual_m##M##SUFFIX(                \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                                 \
        __nv_bfloat16 *__restrict__ residual, int n, int k, int ksplit) {                                         \
        tc_check<M>(k, ksplit);                                                                                   \
        const uint4 *xp = reinterpret_cast<const uint4 *>(x);                                                     \
        asm volatile("" : "+l"(xp));                                                                              \
        tc_rows<true, M, U>(w, residual, n, k, [] {}, XGlobal<M>{xp, k >> 3});                                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) kern_gemvtc_norm_m##M##SUFFIX(                    \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                            \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit) { \
        tc_check<M>(k, ksplit);                                                                                   \
        extern __shared__ __align__(16) unsigned char smem[];                                                     \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                                              \
        tc_rows<false, M, U>(w, y, n, k, [&] { norm_to_smem<M, false, NB>(x, norm_w, xs, k, eps); },              \
                             XShared<M>{reinterpret_cast<const uint4 *>(xs), k >> 3});                            \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) kern_gemvtc_norm_silu_m##M##SUFFIX(               \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                            \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit) { \
        tc_check<M>(k, ksplit);                                                                                   \
        extern __shared__ __align__(16) unsigned char smem[];                                                     \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                                              \
        tc_silu_rows<M, U>(w, y, n, k, [&] { norm_to_smem<M, false, NB>(x, norm_w, xs, k, eps); },                \
                           XShared<M>{reinterpret_cast<const uint4 *>(xs), k >> 3});                              \
    }

INSTANTIATE_TC(1, 4, 2, )
INSTANTIATE_TC(1, 5, 2, _u5)
INSTANTIATE_TC(2, 4, 1, )
INSTANTIATE_TC(4, 4, 1, )
INSTANTIATE_TC(8, 2, 1, )
