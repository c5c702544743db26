// The decode MLP as one launch (sm_90, M = 1), and the GEMV forms around it that carry its output.
//
// In the default decode program a layer's MLP is two launches, gate_up (RMS norm + gate/up GEMV + SiLU-and-mul)
// then down (GEMV + residual add), and the down GEMV waits at a grid-wide boundary for all 9,728 activations.
// Here a thread-block cluster of 8 CTAs owns 64 intermediate columns: each CTA computes 8 of them exactly as
// kern_gemv_norm_silu_m1_u5 does with ksplit 1 (one warp per column: its gate row and up row), pushes its 8
// activations into every CTA of the cluster (distributed shared memory, after a cluster barrier wait whose arrive
// each CTA made at entry, so that every CTA has started), and after a second cluster barrier (release/acquire) CTA r
// multiplies the 64 activations by its share of the down weight's 64 columns (rows [r·k/8, (r+1)·k/8) of
// W_down [k, n]: 128-byte runs, loads issued before the barriers) and adds its k/8 partial sums into a fixed-point
// accumulator in global memory with one bulk reduction (cp.reduce.async.bulk .add.u64). No kernel boundary between
// gate_up and down.
//
// The accumulator `acc` (i64 [k], fixed point with 32 fraction bits: value = acc · 2^-32) makes the sum over the
// n/64 clusters exact and independent of their order (integer adds), so results are deterministic. Each partial
// (64 products, fp32 in a fixed order) is rounded to the nearest 2^-32 (cvt.rni.s64.f32). Limits, not checked: the
// accumulated value (start + the sum of the partials) must stay within ±2^31 — beyond it the 64-bit adds wrap and
// the result flips sign (a partial of 2^31 or more converts saturated, then wraps the same way); a NaN or infinite
// partial converts to a finite integer, so the MLP does not propagate NaN/Inf as gemv.cu's forms do. A bf16 model's
// down projections stay many orders below 2^31; this is an experiment (NOTES.md 42), not a default.
// The down output is then bf16(acc · 2^-32), the rounding HF's bf16 down_proj applies to its fp32 result, and it
// is added to the residual by the next layer's launches (deferred residual):
//   kern_gemv_norm_acc_m1{,_u5}(x, acc, norm_w, w, y, n, k, eps, ksplit)   (the next qkv, and the final lm_head)
//       x' = bf16(x + bf16(acc · 2^-32)) (HF's residual add), then kern_gemv_norm_m1 on x' (x and acc unchanged)
//   kern_gemv_residual_acc_m1(x, w, residual, acc, n, k, ksplit)            (the next o_proj)
//       residual[j] = bf16(bf16(residual[j] + bf16(acc[j] · 2^-32)) + bf16(Σ x·w[j])); acc[j] = 0 (j < n = k of
//       the MLP): the MLP's residual add and the attention's, in HF's order, and the accumulator cleared for the
//       layer's MLP
//   kern_embedding_acc(ids, table, out, acc, hidden, vocab)   the decode step's embedding (as embedding.cu's, one
//       row per block, grid = tokens) that also zeroes acc[0, hidden) (block 0), for layer 0's qkv
// and kern_mlp_m1(x, norm_w, w_gu, w_down, acc, n, k, eps): x = the residual after o_proj; n intermediate columns
// (n % 64 == 0), k hidden (k % 256 == 0, k ≤ 8192); w_gu [2n, k] (gate rows then up rows), w_down [k, n]; adds the
// MLP's down output into acc (which must be zero). grid (n/8, 1, 1) in clusters of (8, 1, 1), block 256, dynamic
// shared memory k·2 bytes (the -DMLP_DOWN_PREWAIT=1 build names it kern_mlp_m1_prewait: k·18 bytes).
//
// The norm prologue and the residual epilogue below are near-copies of gemv.cu's norm_to_smem and gemv_rows with the
// accumulator added, not parameterizations of them: gemv.cu's default cubin is pinned by sha256 in the committed
// examples, and this experiment was measured in this form (NOTES.md 42).
//
// PDL: every entry but the embedding issues weight loads, then griddepcontrol.wait, before reading anything a
// previous launch wrote (gemv.cu's pdl_gate); they trigger their dependents as gemv.cu's default build does.
#if defined(GEMV_TIMELINE) || defined(GEMV_TMA) || defined(GEMV_L2_PREFETCH)
#error "gemv_mlp.cu: build it without gemv.cu's GEMV_TIMELINE, GEMV_TMA or GEMV_L2_PREFETCH (its entries use the default form)"
#endif
#define GEMV_NO_ENTRIES
#include "gemv.cu"

#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define MLP_CLUSTER 8        // CTAs per cluster; a cluster owns MLP_CLUSTER * WARPS intermediate columns
#define MLP_COLS (MLP_CLUSTER * WARPS)
#ifndef MLP_BATCH
#define MLP_BATCH 10  // down-weight 16-byte loads per thread in flight at once (one per pass of 32 rows)
#endif
#define MLP_MAX_ROWS 1024    // k / MLP_CLUSTER at most (k ≤ 8192)
static_assert(MLP_COLS == 64, "one 128-byte run of down-weight columns per cluster");

namespace {

constexpr float ACC_SCALE = 4294967296.0f;          // 2^32
constexpr float ACC_UNSCALE = 2.3283064365386963e-10f;  // 2^-32

__device__ __forceinline__ float acc_value(long long a) { return __ll2float_rn(a) * ACC_UNSCALE; }

// bf16(x + bf16(acc · 2^-32)) for the 8 elements of a vector: HF's residual add of the down output.
__device__ __forceinline__ uint4 add_acc8(uint4 xv, const long long *acc8) {
    __nv_bfloat16 *xp = reinterpret_cast<__nv_bfloat16 *>(&xv);
#pragma unroll
    for (int i = 0; i < 8; ++i) xp[i] = tobf(bf(xp[i]) + bf(tobf(acc_value(acc8[i]))));
    return xv;
}

// norm_to_smem (gemv.cu) on x' = bf16(x + bf16(acc · 2^-32)): x' staged in shared memory, then normalized in place.
__device__ __forceinline__ void norm_acc_to_smem(const __nv_bfloat16 *__restrict__ x, const long long *acc,
                                                 const __nv_bfloat16 *__restrict__ norm_w, __nv_bfloat16 *xs, int k,
                                                 float eps) {
    __shared__ float partial[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    float ss = 0.f;
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
        const uint4 xv = add_acc8(reinterpret_cast<const uint4 *>(x)[v], acc + 8l * v);
        reinterpret_cast<uint4 *>(xs)[v] = xv;
        sumsq8(ss, xv);
    }
    const float s = warp_sum(ss);
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) tot += partial[i];
    const float inv = rsqrtf(tot / (float)k + eps);
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
        const uint4 wv = reinterpret_cast<const uint4 *>(norm_w)[v];
        reinterpret_cast<uint4 *>(xs)[v] = rms_scale8(reinterpret_cast<const uint4 *>(xs)[v], wv, inv);
    }
    __syncthreads();
}

}  // namespace

// ---- the next layer's qkv (and the final lm_head): RMS norm of x + the MLP's down output ----
template <int U>
__device__ __forceinline__ void gemv_norm_acc(const __nv_bfloat16 *__restrict__ x, const long long *acc,
                                              const __nv_bfloat16 *__restrict__ norm_w,
                                              const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y,
                                              int n, int k, float eps, int ksplit) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);
    gemv_rows<1, false, U>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,
                           [&] { norm_acc_to_smem(x, acc, norm_w, xs, k, eps); }, NoL2Prefetch{});
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
kern_gemv_norm_acc_m1(const __nv_bfloat16 *__restrict__ x, const long long *acc, const __nv_bfloat16 *__restrict__ norm_w,
                      const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps,
                      int ksplit) {
    gemv_norm_acc<4>(x, acc, norm_w, w, y, n, k, eps, ksplit);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
kern_gemv_norm_acc_m1_u5(const __nv_bfloat16 *__restrict__ x, const long long *acc,
                         const __nv_bfloat16 *__restrict__ norm_w, const __nv_bfloat16 *__restrict__ w,
                         __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit) {
    gemv_norm_acc<5>(x, acc, norm_w, w, y, n, k, eps, ksplit);
}

// ---- the next layer's o_proj: both residual adds, and acc cleared --------------------------------------------
extern "C" __global__ void __launch_bounds__(WARPS * 32)
kern_gemv_residual_acc_m1(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,
                          __nv_bfloat16 *__restrict__ residual, long long *acc, int n, int k, int ksplit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    long rows[R];
    bool valid[R];
    int v0, v1;
    warp_rows<R>(rows, valid, blockIdx.x, n, kv, ksplit, v0, v1);
    float a[R][1];
    pdl_dot<1, R, 4>(reinterpret_cast<const uint4 *>(x), reinterpret_cast<const uint4 *>(w), rows, kv, v0, v1, lane,
                     [] {}, a, NoL2Prefetch{}, 0);
    reduce_split<R, 1>(a, ksplit);
    if (warp % ksplit != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (lane == r && valid[r]) {
            const long i = rows[r];
            const float h = bf(tobf(bf(residual[i]) + bf(tobf(acc_value(acc[i])))));
            residual[i] = tobf(h + bf(tobf(a[r][0])));
            acc[i] = 0;
        }
}

// ---- the decode step's embedding, with acc zeroed for layer 0 ----------------------------------------------------
extern "C" __global__ void __launch_bounds__(256)
kern_embedding_acc(const long long *__restrict__ ids, const uint4 *__restrict__ table, uint4 *__restrict__ out,
                   long long *acc, int hidden, int vocab) {
    const long long t = blockIdx.x, id = ids[t];
    const int nvec = hidden >> 3;
    uint4 *dst = out + t * nvec;
    const bool ok = id >= 0 && id < vocab;
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = ok ? __ldg(table + id * nvec + i) : make_uint4(0, 0, 0, 0);
    if (t == 0)
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) acc[i] = 0;
}

// ---- the MLP ----------------------------------------------------------------------------------------------------
// Build options (experiments; the defaults are what the header describes):
//   -DMLP_DOWN_PREWAIT=1  the CTA's down-weight runs go into shared memory through cp.async before griddepcontrol.wait
//                         (with the gate/up stages), instead of into registers after the gate/up dot products
//   -DMLP_RED=1           each row's partial goes to acc by its own red.global.add.u64 (fire and forget) instead of one
//                         bulk reduction per CTA
#ifndef MLP_DOWN_PREWAIT
#define MLP_DOWN_PREWAIT 0
#endif
#ifndef MLP_RED
#define MLP_RED 0
#endif

namespace {
// The hook pdl_dot calls right after the first gate/up stages are issued (gemv.cu's `Pf` interface): with
// MLP_DOWN_PREWAIT, this CTA's down-weight runs, one 16-byte cp.async per pass per thread, into `dst`.
struct DownPrefetch {
    static constexpr bool evict_first = false;
    const uint4 *src;
    uint4 *dst;
    long stride;
    int passes;
    __device__ __forceinline__ unsigned long long policy() const { return 0; }
    template <int POINT>
    __device__ __forceinline__ void at() const {
        if constexpr (POINT == 0 && MLP_DOWN_PREWAIT) {
            for (int p = 0; p < passes; ++p)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             :: "r"(static_cast<unsigned>(__cvta_generic_to_shared(dst + p * blockDim.x + threadIdx.x))),
                                "l"(__cvta_generic_to_global(src + p * stride))
                             : "memory");
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    }
};
}  // namespace

#if MLP_DOWN_PREWAIT
#define MLP_ENTRY kern_mlp_m1_prewait  // its own name: it needs 18·k bytes of dynamic shared memory, not 2·k
#else
#define MLP_ENTRY kern_mlp_m1
#endif
extern "C" __global__ void __cluster_dims__(MLP_CLUSTER, 1, 1) __launch_bounds__(WARPS * 32, 2)
MLP_ENTRY(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,
            const __nv_bfloat16 *__restrict__ w_gu, const __nv_bfloat16 *__restrict__ w_down, long long *acc, int n,
            int k, float eps) {
    extern __shared__ __align__(16) unsigned char smem_x[];
    __shared__ __align__(16) __nv_bfloat16 hbuf[MLP_COLS];
#if !MLP_RED
    __shared__ __align__(16) long long red[MLP_MAX_ROWS];
#endif
    cg::cluster_group cluster = cg::this_cluster();
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");  // this CTA has started
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rank = static_cast<int>(cluster.block_rank());
    const int unit = blockIdx.x / MLP_CLUSTER;  // the cluster's 64 columns: [64·unit, 64·unit + 64)
    const int kv = k >> 3;
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem_x);

    // this CTA's down rows: [rank·rows_per, +rows_per), 32 per pass; thread t loads 16 bytes (8 columns) of row
    // rank·rows_per + 32·p + t/8 at column 64·unit + 8·(t%8)
    const int rows_per = k / MLP_CLUSTER, passes = rows_per / 32;
    const int part = threadIdx.x & 7, rsub = threadIdx.x >> 3;
    const uint4 *wd = reinterpret_cast<const uint4 *>(w_down + ((long)rank * rows_per + rsub) * n + unit * MLP_COLS) + part;
    const long pass_stride = 32l * n / 8;  // 32 rows, in 16-byte vectors
    uint4 *dsm = reinterpret_cast<uint4 *>(smem_x + 2 * k);  // MLP_DOWN_PREWAIT: passes x 256 vectors

    // gate/up: warp `warp` owns column j (kern_gemv_norm_silu_m1 with ksplit 1)
    const long j = (long)blockIdx.x * WARPS + warp;
    long rows[R] = {j, n + j};
    float a[R][1];
    // norm_to_smem's loop prologue (NB = 1), the form this experiment was measured with (not the `_nb2` entries')
    pdl_dot<1, R, 5>(reinterpret_cast<const uint4 *>(xs), reinterpret_cast<const uint4 *>(w_gu), rows, kv, 0, kv, lane,
                     [&] { norm_to_smem<1>(x, norm_w, xs, k, eps); }, a, DownPrefetch{wd, dsm, pass_stride, passes}, 0);

#if !MLP_DOWN_PREWAIT
    uint4 dw[MLP_BATCH];
#pragma unroll
    for (int p = 0; p < MLP_BATCH; ++p)
        if (p < passes) dw[p] = ldg_stage_if<false>(wd + p * pass_stride, true, 0);
#endif

    // the column's activation, HF's roundings (kern_gemv_norm_silu_m1), pushed to every CTA of the cluster
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every CTA has started: its smem may be written
    if (lane == 0) {
        const float g = bf(tobf(a[0][0])), u = bf(tobf(a[1][0]));
        const __nv_bfloat16 h = tobf(bf(tobf(silu(g))) * u);
#pragma unroll
        for (int d = 0; d < MLP_CLUSTER; ++d) cluster.map_shared_rank(hbuf, d)[rank * WARPS + warp] = h;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    const uint4 hv = reinterpret_cast<const uint4 *>(hbuf)[part];  // activations 8·part … 8·part + 7 of the unit
#if MLP_DOWN_PREWAIT
    asm volatile("cp.async.wait_all;" ::: "memory");  // this thread's own runs (it reads only those)
#endif

    for (int p0 = 0; p0 < passes; p0 += MLP_BATCH) {
#if !MLP_DOWN_PREWAIT
        if (p0 > 0)
#pragma unroll
            for (int p = 0; p < MLP_BATCH; ++p)
                if (p0 + p < passes) dw[p] = ldg_stage_if<false>(wd + (p0 + p) * pass_stride, true, 0);
#endif
#pragma unroll
        for (int p = 0; p < MLP_BATCH; ++p) {
            if (p0 + p >= passes) break;
#if MLP_DOWN_PREWAIT
            const uint4 wv = dsm[(p0 + p) * blockDim.x + threadIdx.x];
#else
            const uint4 wv = dw[p];
#endif
            float s = 0.f;
            acc8(s, wv, hv);
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            if (part == 0) {
                const long long q = __float2ll_rn(s * ACC_SCALE);
#if MLP_RED
                asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;"
                             :: "l"(acc + (long)rank * rows_per + (p0 + p) * 32 + rsub), "l"(q) : "memory");
#else
                red[(p0 + p) * 32 + rsub] = q;
#endif
            }
        }
    }
#if !MLP_RED
    // one bulk reduction of the CTA's rows_per partials into acc (integer adds: any order gives the same sum); the
    // CTA waits only until its shared memory has been read
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;"
                     :: "l"(__cvta_generic_to_global(acc + (long)rank * rows_per)),
                        "r"(static_cast<unsigned>(__cvta_generic_to_shared(red))), "r"(rows_per * 8)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
#endif
}
