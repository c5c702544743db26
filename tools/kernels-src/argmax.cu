// Two-stage row argmax over bf16 logits [rows, n]; ties go to the smallest index
// (a CPU left-to-right scan with `>`); -0.0 == +0.0; a NaN (either sign) counts as the
// maximum (as torch.argmax).  Launches (one op, two launches, u64 scratch `partial`):
//
//   argmax_partial(const uint16_t* logits,  in  buffer<bf16> [rows, n] (16-byte aligned)
//                  uint64_t*       partial, out buffer<u64>  [rows, parts]  (impl scratch)
//                  int             n,       i32, row length (vocab)
//                  int             parts)   i32, == grid.x
//     grid (parts, rows, 1), block (ARGMAX_THREADS, 1, 1).  Block b of row r scans the
//     contiguous range [b*chunk, min(n, (b+1)*chunk)), chunk = ceil(ceil(n/parts)/8)*8,
//     with 16-byte loads when n % 8 == 0 (scalar loads otherwise), and writes one packed key.
//     Recommended parts = ceil_div(n, 2048) (one 16-byte load per thread; 75 for n=151936).
//
//   argmax_reduce(const uint64_t* partial,  in  buffer<u64> [rows, parts]
//                 int64_t*        out,      out buffer<i64> [rows]
//                 int             parts)    i32, same value as in stage 1
//     grid (rows, 1, 1), block (ARGMAX_THREADS, 1, 1).
//
// Packed key (u64): high 32 bits = an order-preserving map of the bf16 bit pattern
// (sign-magnitude -> unsigned), low 32 bits = ~index.  The max key is the max value
// with the smallest index, so both stages are plain u64 max-reductions.  An empty
// block writes 0, which loses to every element.
//
// PDL form (compiled with -DKERN_PDL into its own module, index NAMEs `argmax_partial_pdl`,
// `argmax_reduce_pdl`; the default build has none of it): every block of both stages
// executes `griddepcontrol.wait` first (everything they read, logits or partial, is an
// earlier launch's output), then `griddepcontrol.launch_dependents`; the logits and partial
// are read with L2-coherent loads (__ldcg, ld.global.cg) instead of __ldg / plain loads of
// `const __restrict__` data (which the compiler may turn into the non-coherent read-only
// path), since they were written by a grid that may still have been running when this one
// started.
#include <cstdint>

#define ARGMAX_THREADS 256

#ifdef KERN_PDL
#define KERN_PDL_WAIT_AND_TRIGGER()                          \
    do {                                                     \
        asm volatile("griddepcontrol.wait;" ::: "memory");   \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#define ARGMAX_LDG(p) __ldcg(p)
#define ARGMAX_LD(p) __ldcg(p)
#else
#define ARGMAX_LDG(p) __ldg(p)
#define ARGMAX_LD(p) (*(p))
#endif

#include "argmax_key.cuh"

__device__ __forceinline__ uint64_t umax64(uint64_t a, uint64_t b) { return a > b ? a : b; }

__device__ __forceinline__ uint64_t block_max(uint64_t v) {
    __shared__ uint64_t warp_best[ARGMAX_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = umax64(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) warp_best[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < ARGMAX_THREADS / 32 ? warp_best[lane] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = umax64(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;  // valid in thread 0
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_partial(const uint16_t* __restrict__ logits, uint64_t* __restrict__ partial, int n, int parts) {
#ifdef KERN_PDL
    KERN_PDL_WAIT_AND_TRIGGER();
#endif
    const int64_t row = blockIdx.y;
    const uint16_t* x = logits + row * n;
    const int per = (n + parts - 1) / parts;
    const int chunk = (per + 7) & ~7;
    const int lo = blockIdx.x * chunk;
    const int hi = min(n, lo + chunk);
    uint64_t best = 0;
    if ((n & 7) == 0) {
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int v = (lo >> 3) + threadIdx.x; v < (hi >> 3); v += ARGMAX_THREADS) {
            const uint4 w = ARGMAX_LDG(xv + v);
            const uint32_t words[4] = {w.x, w.y, w.z, w.w};
            const uint32_t i0 = uint32_t(v) << 3;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                best = umax64(best, argmax_key(words[j] & 0xFFFFu, i0 + 2 * j));
                best = umax64(best, argmax_key(words[j] >> 16, i0 + 2 * j + 1));
            }
        }
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) best = umax64(best, argmax_key(ARGMAX_LD(x + i), i));
    }
    best = block_max(best);
    if (threadIdx.x == 0) partial[row * parts + blockIdx.x] = best;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_reduce(const uint64_t* __restrict__ partial, int64_t* __restrict__ out, int parts) {
#ifdef KERN_PDL
    KERN_PDL_WAIT_AND_TRIGGER();
#endif
    const int64_t row = blockIdx.x;
    uint64_t best = 0;
    for (int i = threadIdx.x; i < parts; i += ARGMAX_THREADS) best = umax64(best, ARGMAX_LD(partial + row * parts + i));
    best = block_max(best);
    if (threadIdx.x == 0) out[row] = int64_t(~uint32_t(best & 0xFFFFFFFFu));
}
