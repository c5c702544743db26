// Decode GEMV kernels for sm_90: y[m, n] = x[m, k] · W[n, k]ᵀ, bf16 in and out,
// fp32 accumulation, m ≤ 8 (M is a template parameter: one entry per M).
//
// Decode is weight streaming: every weight byte is read exactly once, with
// 16-byte loads coalesced across the warp; a block owns a few rows and its 8 warps
// split k, each lane keeping ~16 loads in flight before the first use. x is tiny (≤ 80 KB) and is read from
// shared memory (norm variants, where the normalized x is computed once per
// block) or through the read-only path (plain variants; it stays in L1/L2).
//
// Variants (all extern "C", entry names below; K must be a multiple of 8):
//   kern_gemv_m{M}(x, w, y, n, k)
//       y[m, j] = bf16(Σ_k x[m,k] w[j,k])                       y: [M, n]
//   kern_gemv_norm_m{M}(x, norm_w, w, y, n, k, eps)
//       xn = rmsnorm(x) as HF Qwen3RMSNorm computes it:
//            xn[k] = bf16(norm_w[k] · bf16(x[k] · rsqrt(mean(x²) + eps)))
//       y[m, j] = bf16(Σ_k xn[m,k] w[j,k])                      dyn. smem = M·k·2 bytes
//   kern_gemv_norm_silu_m{M}(x, norm_w, w, y, n, k, eps)
//       w has 2n rows (gate rows 0..n-1, then up rows n..2n-1);
//       g = bf16(xn·w[j]), u = bf16(xn·w[n+j]); y[m, j] = bf16(bf16(silu(g)) · u)
//                                                               y: [M, n], smem = M·k·2
//   kern_gemv_residual_m{M}(x, w, residual, n, k)
//       residual[m, j] = bf16(residual[m, j] + bf16(Σ_k x[m,k] w[j,k]))   (in place)
//
// Roundings follow HF transformers' bf16 Qwen3 exactly where it rounds (GEMM
// output, SiLU, product, residual add), so decode tokens track the reference.
//
// Launch: block = [256, 1, 1] (8 warps splitting k); grid.x = ceil_div(n, rows per block):
//   plain, norm: ceil_div(n, 8); residual: ceil_div(n, 4); norm_silu: ceil_div(n, 4)
//   (n = output columns; the SiLU block reads 4 gate rows and their 4 up rows).
// Dynamic shared memory: norm variants M·k·2 bytes, others 0.
#include <cuda_bf16.h>
#include <stdint.h>

#define WARPS 8

namespace {

__device__ __forceinline__ float bf(const __nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __nv_bfloat16 tobf(const float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ void acc8(float &s, const uint4 w, const uint4 x) {
    const __nv_bfloat162 *wp = reinterpret_cast<const __nv_bfloat162 *>(&w);
    const __nv_bfloat162 *xp = reinterpret_cast<const __nv_bfloat162 *>(&x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 wf = __bfloat1622float2(wp[i]);
        const float2 xf = __bfloat1622float2(xp[i]);
        s = fmaf(wf.x, xf.x, s);
        s = fmaf(wf.y, xf.y, s);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ uint4 ldg_stream(const uint4 *p) {
    // Weights are read once: bypass L1.
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// 16-byte weight loads per row per lane issued before first use, so that each lane
// keeps ~16 loads (256 B) in flight whatever the number of rows R per block.
#ifndef LOADS_IN_FLIGHT
#define LOADS_IN_FLIGHT 16
#endif
template <int M, int R>
struct Unroll {
    static constexpr int t = LOADS_IN_FLIGHT / (R * (M > 2 ? 2 : 1));
    static constexpr int v = t > 0 ? t : 1;
};

// Block-wide dot products: out[r][m] = Σ_k x[m, k] · w[rows[r], k] for R rows.
// The block's WARPS warps split k (each warp a contiguous range of 16-byte vectors,
// lanes strided inside it), so a few rows keep the whole block — and many loads —
// busy; partial sums meet in shared memory. Every thread gets the R·M results.
// xs: x as 16-byte vectors ([M][kv]), shared or global. rows[r] < 0: row skipped.
template <int M, int R>
__device__ __forceinline__ void block_dot(const uint4 *__restrict__ xs, const uint4 *__restrict__ w,
                                          const long rows[R], int kv, float out[R][M]) {
    constexpr int U = Unroll<M, R>::v;
    __shared__ float partial[WARPS][R * M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int per = (kv + WARPS - 1) / WARPS;
    per += per & 1;  // even: each warp's range starts on a 32-byte sector
    const int v0 = warp * per;
    const int v1 = min(kv, v0 + per);
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    int v = v0 + lane;
    for (; v + 32 * (U - 1) < v1; v += 32 * U) {
        uint4 wv[R][U];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < U; ++u)
                wv[r][u] = rows[r] >= 0 ? ldg_stream(w + rows[r] * kv + v + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const uint4 xv = xs[m * kv + v + 32 * u];
#pragma unroll
                for (int r = 0; r < R; ++r) acc8(acc[r][m], wv[r][u], xv);
            }
    }
    for (; v < v1; v += 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            wv[r] = rows[r] >= 0 ? ldg_stream(w + rows[r] * kv + v) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4 xv = xs[m * kv + v];
#pragma unroll
            for (int r = 0; r < R; ++r) acc8(acc[r][m], wv[r], xv);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const float s = warp_sum(acc[r][m]);
            if (lane == 0) partial[warp][r * M + m] = s;
        }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < WARPS; ++i) s += partial[i][r * M + m];
            out[r][m] = s;
        }
}

// Writes xn = rmsnorm(x[m]) · norm_w into shared memory (bf16, [M, k]), HF rounding.
template <int M>
__device__ __forceinline__ void norm_to_smem(const __nv_bfloat16 *__restrict__ x,
                                             const __nv_bfloat16 *__restrict__ norm_w,
                                             __nv_bfloat16 *xs, int k, float eps) {
    __shared__ float partial[M][WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) ss[m] = 0.f;
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4 xv = reinterpret_cast<const uint4 *>(x + (long)m * k)[v];
            const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&xv);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 f = __bfloat1622float2(p[i]);
                ss[m] = fmaf(f.x, f.x, ss[m]);
                ss[m] = fmaf(f.y, f.y, ss[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float s = warp_sum(ss[m]);
        if (lane == 0) partial[m][warp] = s;
    }
    __syncthreads();
    float inv[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) s += partial[m][i];
        inv[m] = rsqrtf(s / (float)k + eps);
    }
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
        const uint4 wv = reinterpret_cast<const uint4 *>(norm_w)[v];
        const __nv_bfloat16 *wp = reinterpret_cast<const __nv_bfloat16 *>(&wv);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4 xv = reinterpret_cast<const uint4 *>(x + (long)m * k)[v];
            const __nv_bfloat16 *xp = reinterpret_cast<const __nv_bfloat16 *>(&xv);
            uint4 out;
            __nv_bfloat16 *op = reinterpret_cast<__nv_bfloat16 *>(&out);
#pragma unroll
            for (int i = 0; i < 8; ++i) op[i] = tobf(bf(wp[i]) * bf(tobf(bf(xp[i]) * inv[m])));
            reinterpret_cast<uint4 *>(xs + (long)m * k)[v] = out;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

}  // namespace

// Rows per block of each variant (the grid is ceil_div(n, rows per block)).
#ifndef R_PLAIN
#define R_PLAIN 8
#endif
#ifndef R_RESIDUAL
#define R_RESIDUAL 4
#endif
#ifndef R_SILU
#define R_SILU 8  // 4 gate rows + their 4 up rows: 4 output columns per block
#endif

template <int R>
__device__ __forceinline__ void block_rows(long rows[R], int n) {
    const long row0 = (long)blockIdx.x * R;
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = row0 + r < n ? row0 + r : -1;
}

// ---- plain: y = x · Wᵀ -------------------------------------------------------
template <int M>
__device__ __forceinline__ void gemv_plain(const __nv_bfloat16 *__restrict__ x,
                                           const __nv_bfloat16 *__restrict__ w,
                                           __nv_bfloat16 *__restrict__ y, int n, int k) {
    long rows[R_PLAIN];
    block_rows<R_PLAIN>(rows, n);
    float acc[R_PLAIN][M];
    block_dot<M, R_PLAIN>(reinterpret_cast<const uint4 *>(x), reinterpret_cast<const uint4 *>(w), rows, k >> 3, acc);
    const int t = threadIdx.x;
#pragma unroll
    for (int r = 0; r < R_PLAIN; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (t == r * M + m && rows[r] >= 0) y[(long)m * n + rows[r]] = tobf(acc[r][m]);
}

// ---- residual: residual += bf16(x · Wᵀ) ----------------------------------------
template <int M>
__device__ __forceinline__ void gemv_residual(const __nv_bfloat16 *__restrict__ x,
                                              const __nv_bfloat16 *__restrict__ w,
                                              __nv_bfloat16 *__restrict__ residual, int n, int k) {
    long rows[R_RESIDUAL];
    block_rows<R_RESIDUAL>(rows, n);
    float acc[R_RESIDUAL][M];
    block_dot<M, R_RESIDUAL>(reinterpret_cast<const uint4 *>(x), reinterpret_cast<const uint4 *>(w), rows, k >> 3, acc);
    const int t = threadIdx.x;
#pragma unroll
    for (int r = 0; r < R_RESIDUAL; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (t == r * M + m && rows[r] >= 0) {
                const long i = (long)m * n + rows[r];
                residual[i] = tobf(bf(residual[i]) + bf(tobf(acc[r][m])));
            }
}

// ---- norm: y = rmsnorm(x) · Wᵀ ---------------------------------------------------
template <int M>
__device__ __forceinline__ void gemv_norm(const __nv_bfloat16 *__restrict__ x,
                                          const __nv_bfloat16 *__restrict__ norm_w,
                                          const __nv_bfloat16 *__restrict__ w,
                                          __nv_bfloat16 *__restrict__ y, int n, int k, float eps) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);
    norm_to_smem<M>(x, norm_w, xs, k, eps);
    long rows[R_PLAIN];
    block_rows<R_PLAIN>(rows, n);
    float acc[R_PLAIN][M];
    block_dot<M, R_PLAIN>(reinterpret_cast<const uint4 *>(xs), reinterpret_cast<const uint4 *>(w), rows, k >> 3, acc);
    const int t = threadIdx.x;
#pragma unroll
    for (int r = 0; r < R_PLAIN; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (t == r * M + m && rows[r] >= 0) y[(long)m * n + rows[r]] = tobf(acc[r][m]);
}

// ---- norm + SiLU-and-mul: y = silu(rmsnorm(x)·Wgᵀ) * (rmsnorm(x)·Wuᵀ) ------------
// A block owns R_SILU/2 output columns j and computes gate rows j and up rows n + j
// together, so the loads of both are in flight at once.
template <int M>
__device__ __forceinline__ void gemv_norm_silu(const __nv_bfloat16 *__restrict__ x,
                                               const __nv_bfloat16 *__restrict__ norm_w,
                                               const __nv_bfloat16 *__restrict__ w,
                                               __nv_bfloat16 *__restrict__ y, int n, int k, float eps) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);
    norm_to_smem<M>(x, norm_w, xs, k, eps);
    constexpr int C = R_SILU / 2;
    long rows[R_SILU];
    const long j0 = (long)blockIdx.x * C;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        rows[c] = j0 + c < n ? j0 + c : -1;
        rows[C + c] = j0 + c < n ? n + j0 + c : -1;
    }
    float acc[R_SILU][M];
    block_dot<M, R_SILU>(reinterpret_cast<const uint4 *>(xs), reinterpret_cast<const uint4 *>(w), rows, k >> 3, acc);
    const int t = threadIdx.x;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (t == c * M + m && rows[c] >= 0) {
                const float g = bf(tobf(acc[c][m]));
                const float u = bf(tobf(acc[C + c][m]));
                y[(long)m * n + j0 + c] = tobf(bf(tobf(silu(g))) * u);
            }
}

#define INSTANTIATE(M)                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_m##M(                      \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                \
        __nv_bfloat16 *__restrict__ y, int n, int k) {                                            \
        gemv_plain<M>(x, w, y, n, k);                                                             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_residual_m##M(             \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                \
        __nv_bfloat16 *__restrict__ residual, int n, int k) {                                     \
        gemv_residual<M>(x, w, residual, n, k);                                                   \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_m##M(                 \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,           \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,        \
        float eps) {                                                                              \
        gemv_norm<M>(x, norm_w, w, y, n, k, eps);                                                 \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_silu_m##M(            \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,           \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,        \
        float eps) {                                                                              \
        gemv_norm_silu<M>(x, norm_w, w, y, n, k, eps);                                            \
    }

INSTANTIATE(1)
INSTANTIATE(2)
INSTANTIATE(4)
INSTANTIATE(8)
