// Persistent decode GEMV kernels for sm_90 (m = 1): the four ops of gemv.cu with the same
// arithmetic and roundings (HF bf16 Qwen3), built to keep HBM busy across kernel boundaries.
//
// Why: gemv.cu gives each block a fixed slice (2 rows per warp) and lets the grid be as large
// as the shape needs; each block pays its own ramp (first bytes ~1 µs after it starts) and the
// next kernel cannot start streaming until the last block exits (its blocks fill the register
// file). The 4B token's GEMVs then take 2.3–2.4 ms in a graph, 80–84% of the floor, the small
// shapes 56–77% (BENCHMARKS.md).
//
// Here one block per SM streams a contiguous range of output columns (block b of G: outputs
// [n·b/G, n·(b+1)/G), so blocks differ by at most one column) through shared memory, filled by
// the Hopper bulk-copy engine (cp.async.bulk, completion counted in bytes on an mbarrier), so up
// to all the slots (~100 KB per SM) are in flight without holding registers. Each of the 8 warps
// owns every 8th column of the block and sums its rows alone (no block barrier per column): its
// columns stream through its own FIFO of `fifo` slots (one weight-row piece of `piece_chunks`
// chunks each), which its lane 0 fills at start and refills as soon as the warp has read a slot.
// Per-warp FIFOs keep every mbarrier waiter at most one phase ahead (with one ring shared by a
// producer warp, a consumer could wait two phases ahead, where parity waits alias: it hung).
// With programmatic dependent launch the first fills go out before griddepcontrol.wait (weights
// are written by no kernel): a block uses under half an SM's shared memory, so the next GEMV's
// block can fit beside this one's and fill its FIFOs while this kernel drains.
//
// A chunk is 256 elements of a row (one 16-byte shared-memory load per lane); a row of
// cpr = k/256 chunks is cut into ceil(cpr / piece_chunks) pieces (the last may be shorter);
// norm_silu's column is its gate row's pieces, then its up row's. A warp sums a column
// in fp32 over two alternating chunk chains (even, odd), adds them, reduces over the warp, and
// lane 0 applies the epilogue: the same bits on every run, any grid, any timing.
//
// Entries (extern "C"; block [256, 1, 1]: 8 warps; any grid.x ≥ 1,
// one block per SM is the design point; k a multiple of 256; every pointer 16-byte aligned):
//   kern_gemvp_m1(x, w, y, n, k, piece_chunks)                    y[j] = bf16(Σ x·w[j])
//   kern_gemvp_norm_m1(x, norm_w, w, y, n, k, eps, piece_chunks)
//       y[j] = bf16(Σ xn·w[j]),  xn = bf16(norm_w · bf16(x · rsqrt(mean(x²) + eps)))
//   kern_gemvp_norm_silu_m1(x, norm_w, w, y, n, k, eps, piece_chunks)
//       w has 2n rows (gate 0..n-1, up n..2n-1); y[j] = bf16(bf16(silu(bf16(g))) · bf16(u))
//   kern_gemvp_residual_m1(x, w, residual, n, k, piece_chunks)
//       residual[j] = bf16(residual[j] + bf16(Σ x·w[j]))      (in place)
// Dynamic shared memory: 2·k bytes (x or its norm), then the slots: the kernel uses
// slots = min(64, (bytes − 2k) / (piece_chunks · 512)), fifo = slots / 8 per warp; at least 1.
// tools/gemv_plan.py picks piece_chunks and the size; a launch that breaks these rules traps.
//
// Programmatic dependent launch: every thread calls griddepcontrol.launch_dependents first;
// each warp issues its first GEMVP_PRE_FILLS (2) weight copies at once; every thread executes
// griddepcontrol.wait before x or the residual is read, and nothing is written to global memory
// before it (a no-op without the launch attribute); each warp fills the rest of its FIFO once x is
// in shared memory (filling the whole FIFO first queued x's reads behind every SM's copies: the 4B
// GEMV chain with PDL took 2.64 ms with all fills first, 2.51 with 2; NOTES.md 20).
#include <cuda_bf16.h>
#include <stdint.h>

#define WARPS 8
#define THREADS (WARPS * 32)
#define CHUNK 256                     // elements of k per warp-wide 16-byte load (32 lanes × 8 bf16)
#define MAX_SLOTS 64                  // slots (one mbarrier each): 8 per-warp FIFOs
#ifndef GEMVP_PRE_FILLS
#define GEMVP_PRE_FILLS 2             // slots each warp fills before griddepcontrol.wait (-1: its whole FIFO)
#endif

namespace {

#include "gemv_common.cuh"


__device__ __forceinline__ unsigned smem_u32(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// mbarrier and bulk copy (PTX ISA 8.0, sm_90).
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    asm volatile(
        "{\n\t.reg .pred p;\n"
        "WAIT_%=:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra WAIT_%=;\n\t}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// Global → shared bulk copy of `bytes` (multiple of 16, both ends 16-byte aligned), completing
// as transaction bytes on `bar`.
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
        "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

// Writes x (k elements) into shared memory.
__device__ __forceinline__ void x_to_smem(const __nv_bfloat16 *__restrict__ x, uint4 *xs, int k) {
    for (int v = threadIdx.x; v < (k >> 3); v += THREADS) xs[v] = reinterpret_cast<const uint4 *>(x)[v];
}

// Writes rmsnorm(x)·norm_w (HF Qwen3RMSNorm rounding) into shared memory.
__device__ __forceinline__ void norm_to_smem(const __nv_bfloat16 *__restrict__ x,
                                             const __nv_bfloat16 *__restrict__ norm_w, uint4 *xs, int k,
                                             float eps) {
    __shared__ float wsum[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    float ss = 0.f;
    for (int v = threadIdx.x; v < kv; v += THREADS) sumsq8(ss, reinterpret_cast<const uint4 *>(x)[v]);
    ss = warp_sum(ss);
    if (lane == 0) wsum[warp] = ss;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) s += wsum[i];
    const float inv = rsqrtf(s / (float)k + eps);
    for (int v = threadIdx.x; v < kv; v += THREADS) {
        const uint4 wv = reinterpret_cast<const uint4 *>(norm_w)[v];
        const uint4 xv = reinterpret_cast<const uint4 *>(x)[v];
        xs[v] = rms_scale8(xv, wv, inv);
    }
}

enum Kind { PLAIN, RESIDUAL, NORM, NORM_SILU };

#ifdef GEMVP_TIMELINE
// Diagnostic build (-DGEMVP_TIMELINE; tools/gpu/gemvp_timeline.py): %globaltimer (ns) of lane 0 of
// each warp at 5 points — entry, its first FIFO fill issued, x in shared memory, its first piece
// landed, exit — for blocks < 256: gemvp_timeline[(block · 8 + warp) · 5 + point].
}  // namespace
extern "C" __device__ unsigned long long gemvp_timeline[256 * WARPS * 5];  // unmangled: cuModuleGetGlobal
namespace {
#define TIMELINE(point)                                                                          \
    do {                                                                                       \
        if ((threadIdx.x & 31) == 0 && blockIdx.x < 256) {                                     \
            unsigned long long t_;                                                             \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                             \
            gemvp_timeline[(blockIdx.x * WARPS + (threadIdx.x >> 5)) * 5 + (point)] = t_;      \
        }                                                                                      \
    } while (0)
#else
#define TIMELINE(point) \
    do {                \
    } while (0)
#endif

template <Kind KIND>
__device__ __forceinline__ void gemvp(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,
                                      const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n,
                                      int k, float eps, int piece_chunks) {
    constexpr bool SILU = KIND == NORM_SILU;
    constexpr int SEGS = SILU ? 2 : 1;  // weight rows per output column: gate and up
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) uint64_t full[MAX_SLOTS];

    TIMELINE(0);
    griddep_launch_dependents();
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const int cpr = k / CHUNK;
    const int pc = piece_chunks;
    const unsigned xbytes = (unsigned)k * 2u, slot_bytes = (unsigned)pc * CHUNK * 2u;
    const int slots = pc < 1 || dyn < xbytes + slot_bytes ? 0 : min(MAX_SLOTS, (int)((dyn - xbytes) / slot_bytes));
    if (k < CHUNK || k % CHUNK != 0 || slots < WARPS) __trap();  // tools/gemv_plan.py's rules were not followed
    const int fifo = slots / WARPS;            // slots of each warp's own FIFO
    const int pieces = (cpr + pc - 1) / pc;  // per weight row

    uint4 *xs = reinterpret_cast<uint4 *>(smem);
    unsigned char *ring = smem + xbytes;
    const long lo = (long)n * blockIdx.x / gridDim.x, hi = (long)n * (blockIdx.x + 1) / gridDim.x;
    const long cols = hi - lo;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x < slots) mbar_init(&full[threadIdx.x], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();

    // This warp's pieces, in order: its columns warp, warp + 8, ...; per column the pieces of
    // its gate (or only) row, then of its up row. The issue cursor runs `fifo` pieces ahead.
    const long my_pieces = cols > warp ? (cols - warp + WARPS - 1) / WARPS * SEGS * pieces : 0;
    long icol = warp, issued = 0;
    int iseg = 0, ip = 0;
    auto issue_next = [&](int slot) {  // lane 0: the next piece into `slot`
        const unsigned bytes = (unsigned)min(pc, cpr - ip * pc) * CHUNK * 2u;
        mbar_expect_tx(&full[slot], bytes);
        const long row = (iseg ? (long)n : 0) + lo + icol;
        bulk_copy(ring + (size_t)slot * slot_bytes, w + row * k + (long)ip * pc * CHUNK, bytes, &full[slot]);
        ++issued;
        if (++ip == pieces) {
            ip = 0;
            if (++iseg == SEGS) {
                iseg = 0;
                icol += WARPS;
            }
        }
    };
    const int pre = GEMVP_PRE_FILLS < 0 ? fifo : min(fifo, GEMVP_PRE_FILLS);
    if (lane == 0)
        for (int f = 0; f < pre && issued < my_pieces; ++f) issue_next(warp * fifo + f);
    TIMELINE(1);

    griddep_wait();
    if (KIND == NORM || KIND == NORM_SILU)
        norm_to_smem(x, norm_w, xs, k, eps);
    else
        x_to_smem(x, xs, k);
    __syncthreads();
    if (lane == 0)
        for (int f = pre; f < fifo && issued < my_pieces; ++f) issue_next(warp * fifo + f);
    TIMELINE(2);

    int f = 0;           // FIFO position of the next piece
    unsigned phase = 0;  // its fill's parity
    for (long i = warp; i < cols; i += WARPS) {
        const long jo = lo + i;
        __nv_bfloat16 r_in = __float2bfloat16_rn(0.f);
        if (KIND == RESIDUAL && lane == 0) r_in = y[jo];  // issued early: its latency hides under the dot
        float sum[SEGS];
#pragma unroll
        for (int seg = 0; seg < SEGS; ++seg) {
            float a0 = 0.f, a1 = 0.f;  // even / odd chunks: two independent FMA chains
            for (int p = 0; p < pieces; ++p) {
                const int slot = warp * fifo + f;
                mbar_wait(&full[slot], phase);
#ifdef GEMVP_TIMELINE
                if (i == warp && seg == 0 && p == 0) TIMELINE(3);
#endif
                const uint4 *st = reinterpret_cast<const uint4 *>(ring + (size_t)slot * slot_bytes);
                const int kc0 = p * pc, chunks = min(pc, cpr - kc0);
                int c = 0;
                for (; c + 1 < chunks; c += 2) {
                    const uint4 w0 = st[c * 32 + lane], w1 = st[(c + 1) * 32 + lane];
                    const uint4 x0 = xs[(kc0 + c) * 32 + lane], x1 = xs[(kc0 + c + 1) * 32 + lane];
                    acc8(a0, w0, x0);
                    acc8(a1, w1, x1);
                }
                if (c < chunks) acc8(a0, st[c * 32 + lane], xs[(kc0 + c) * 32 + lane]);
                __syncwarp();  // every lane has read the slot: refill it
                if (lane == 0 && issued < my_pieces) {
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    issue_next(slot);
                }
                if (++f == fifo) {
                    f = 0;
                    phase ^= 1u;
                }
            }
            sum[seg] = warp_sum(a0 + a1);
        }
        if (lane == 0) {
            if (KIND == NORM_SILU) {
                const float g = bf(tobf(sum[0]));
                const float u = bf(tobf(sum[SEGS - 1]));
                y[jo] = tobf(bf(tobf(silu(g))) * u);
            } else if (KIND == RESIDUAL) {
                y[jo] = tobf(bf(r_in) + bf(tobf(sum[0])));
            } else {
                y[jo] = tobf(sum[0]);
            }
        }
    }
    TIMELINE(4);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    kern_gemvp_m1(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,
                  __nv_bfloat16 *__restrict__ y, int n, int k, int piece_chunks) {
    gemvp<PLAIN>(x, nullptr, w, y, n, k, 0.f, piece_chunks);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    kern_gemvp_residual_m1(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,
                           __nv_bfloat16 *__restrict__ residual, int n, int k, int piece_chunks) {
    gemvp<RESIDUAL>(x, nullptr, w, residual, n, k, 0.f, piece_chunks);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    kern_gemvp_norm_m1(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,
                       const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps,
                       int piece_chunks) {
    gemvp<NORM>(x, norm_w, w, y, n, k, eps, piece_chunks);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    kern_gemvp_norm_silu_m1(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,
                            const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,
                            float eps, int piece_chunks) {
    gemvp<NORM_SILU>(x, norm_w, w, y, n, k, eps, piece_chunks);
}
