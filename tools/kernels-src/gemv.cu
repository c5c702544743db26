// Decode GEMV kernels for sm_90: y[m, n] = x[m, k] · W[n, k]ᵀ, bf16 in and out,
// fp32 accumulation, m ≤ 8 (M is a template parameter: one entry per M).
//
// Decode is weight streaming: every weight byte is read exactly once, with
// 16-byte loads coalesced across the warp; a block owns a few rows and its 8 warps
// split k, each lane keeping 16 loads (two stages) in flight before their first use. x is tiny (≤ 80 KB) and is read from
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
// M = 1 also has `_u5` entries (kern_gemv_m1_u5, kern_gemv_norm_m1_u5, kern_gemv_norm_silu_m1_u5,
// kern_gemv_residual_m1_u5): the same params, arithmetic and bits, with five 16-byte loads per row
// per pipeline stage instead of four (128 registers, still two blocks per SM). For a lane with 9 or
// 10 loads per row (k/8/ksplit rounded up to 32 vectors, over 32 lanes: k = 2,304…2,560 at ksplit 1)
// that puts every weight load in the two stages issued before griddepcontrol.wait, where U = 4 leaves
// a third stage to issue after the wait and wait a memory latency for. H200, one 4B decode token's
// GEMVs as a PDL chain in a CUDA graph (session 7, three calls): 2.218–2.240 ms with `_u5` for qkv,
// gate_up and lm_head (k = 2,560) vs 2.324–2.336 for U = 4 everywhere; `_u5` for o (16 loads: 4
// stages either way) or down (38: 8 stages instead of 10) was slower. In the whole decode program
// (kern-run 4B, NOTES.md 28) gate_up's `_u5` is neutral and qkv's and lm_head's, followed by other
// kernels, lose; tools/gemv_plan.py `gemv_entry_unroll` is the rule the generator applies.
//
// The M = 1 norm entries also have `_nb2` forms (kern_gemv_norm{,_silu}_m1{,_u5}_nb2, INSTANTIATE_NORM_NB): the same
// params, arithmetic and bits, with norm_to_smem's batched prologue (NB = 2) for k/8 in (256, 512]; the generator
// launches them where tools/gemv_plan.py `gemv_norm_batched` says so (4B's qkv and gate_up; NOTES.md 70-71).
//
// Roundings follow HF transformers' bf16 Qwen3 exactly where it rounds (GEMM
// output, SiLU, product, residual add), so decode tokens track the reference.
//
// Programmatic dependent launch (PDL, sm_90): every variant first issues its first
// GEMV_PRE_STAGES pipeline stages of weight loads (weights are written by no kernel), then executes
// `griddepcontrol.wait` (returns once the previous grid has completed and its writes are
// visible; a no-op when the launch has no PDL attribute), and only then reads x, the
// residual or runs the norm prologue. Every block executes the wait, before any early
// exit, and writes nothing before it: that is the manifest's `"pdl": true` contract.
// `griddepcontrol.launch_dependents` lets the next PDL launch be scheduled; where is a
// build option (the launch-attribute contract does not depend on it):
//   -DGEMV_PDL_TRIGGER=0  never (the next kernel launches as this grid's blocks exit)
//   -DGEMV_PDL_TRIGGER=1  right after the first stages are issued (earliest; default: one 4B
//                         token's GEMVs in a graph 2.310 ms vs 2.329 ms for 2 and 2.396 ms
//                         for 0, H200, tools/bench_pdl.py, BENCHMARKS.md)
//   -DGEMV_PDL_TRIGGER=2  after the warp's last weight load was consumed
//
// L2-prefetch forms (opt in: -DGEMV_L2_PREFETCH, build_kernels.py --l2-prefetch; the module then
// holds only these, for M = 1): kern_gemv{,_norm,_norm_silu,_residual}_m1_pf take the default
// form's params plus (const void *pf_ptr, unsigned long long pf_bytes) and compute exactly what it
// computes (bit for bit). Each block's thread 0 also issues cp.async.bulk.prefetch.L2.global over
// the block's contiguous share of [pf_ptr, pf_ptr + pf_bytes) (rounded down to 16 bytes; split
// evenly over gridDim.x in 16-byte units, the first blocks taking the remainder; chunks of at most
// GEMV_PF_CHUNK bytes), meant for the next GEMV's weight so that it starts from L2. pf_bytes = 0:
// nothing. Build options:
//   -DGEMV_PF_AT=0  issue at kernel start, right after the first weight stages (before the wait:
//                   weights only, the PDL contract holds)
//   -DGEMV_PF_AT=1  (default) when the issuing lane's last pipelined weight stage is in flight
//                   (before that stage's FMAs), i.e. overlapping the block's own tail
//   -DGEMV_PF_AT=2  after the issuing lane's last weight load was consumed
//   -DGEMV_PF_EVICT_FIRST=1 (default) the form's own weight loads carry an L2::evict_first policy
//                   (createpolicy + .L2::cache_hint), so that the streamed weight leaves L2 before
//                   the prefetched lines; 0: plain loads
//   -DGEMV_PF_CHUNK=65536ull  bytes per prefetch instruction: a multiple of 16 below 1 MB (sm_90
//                   encodes the size as a 16-bit count of 16-byte units; ptxas turns 1 MB into 0)
//
// Timeline build (-DGEMV_TIMELINE, tools/gpu/gemv_timeline.py; the default module has none of it):
// thread 0 of every block takes a ticket (atomicAdd on gemv_tl_next) and writes, at gemv_tl[ticket * 10],
// [w, n << 32 | blockIdx.x, %smid, then %globaltimer (ns) at entry, after the pre-wait stages were issued,
// when griddepcontrol.wait returned, after the prologue, after its last FMA, and after the ksplit reduce
// (just before the stores)]; tickets past GEMV_TL_MAX (131072: one 4B token has 78,616 blocks) write nothing.
//
// Launch: block = [256, 1, 1]: 8 warps in 8/ksplit groups of ksplit warps; a group owns 2 rows
// (norm_silu: one output column, i.e. its gate row and its up row) and its ksplit warps
// split k. grid.x = ceil_div(n, 2·8/ksplit) for plain, norm and residual, and
// ceil_div(n, 8/ksplit) for norm_silu (n = output columns); ksplit ∈ {1, 2, 4, 8}.
// Dynamic shared memory: norm variants M·k·2 bytes, others 0.
// -DGEMV_NO_ENTRIES: no entries at all, for a source that includes this one for its device helpers (gemv_mlp.cu).
// An experiment build may set -DWARPS=W (block 32·W, 2·W/ksplit rows per block; ksplit must divide W): not indexed
// by build_kernels.py. H200, session 13 (NOTES.md 40): 4 or 5 warps per block were slower in the 4B decode program
// on every GEMV tried (+0.017…+0.051 ms/token).
#include <cuda_bf16.h>
#include <stdint.h>

#ifdef GEMV_TMA  // the bulk-copy form leaves the register pipeline's helpers unreferenced
#pragma nv_diag_suppress 177
#endif

#ifndef WARPS
#define WARPS 8  // warps per block (an experiment build may set it; see the header)
#endif

#ifndef GEMV_PDL_TRIGGER
#define GEMV_PDL_TRIGGER 1
#endif

#ifdef GEMV_L2_PREFETCH
#ifndef GEMV_PF_AT
#define GEMV_PF_AT 1
#endif
#ifndef GEMV_PF_EVICT_FIRST
#define GEMV_PF_EVICT_FIRST 1
#endif
#ifndef GEMV_PF_CHUNK
#define GEMV_PF_CHUNK 65536ull
#endif
static_assert(GEMV_PF_AT >= 0 && GEMV_PF_AT <= 2, "GEMV_PF_AT: 0, 1 or 2");
// sm_90 encodes a bulk prefetch's size as a 16-bit count of 16-byte units (ptxas turns a
// size of 1 MB into 0, seen in the SASS): chunks must stay below 1 MB.
static_assert(GEMV_PF_CHUNK >= 16 && GEMV_PF_CHUNK % 16 == 0 && GEMV_PF_CHUNK < (1ull << 20),
              "GEMV_PF_CHUNK: a multiple of 16 below 1 MB");
#endif

#ifdef GEMV_TIMELINE
#ifndef GEMV_TL_MAX
#define GEMV_TL_MAX 131072
#endif
extern "C" {  // unmangled: cuModuleGetGlobal
__device__ unsigned long long gemv_tl[GEMV_TL_MAX * 10];
__device__ unsigned int gemv_tl_next;
}
#endif

namespace {

#include "gemv_common.cuh"

// The timeline build's stamps (GEMV_TIMELINE; see the header); nothing in the default build.
#ifdef GEMV_TIMELINE
__shared__ unsigned gemv_tl_slot;
__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void tl_begin(const void *w, int n) {
    if (threadIdx.x != 0) return;
    const unsigned s = atomicAdd(&gemv_tl_next, 1u);
    gemv_tl_slot = s;
    if (s >= GEMV_TL_MAX) return;
    unsigned long long *r = gemv_tl + s * 10ull;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    r[0] = reinterpret_cast<unsigned long long>(w);
    r[1] = (static_cast<unsigned long long>(n) << 32) | blockIdx.x;
    r[2] = smid;
    r[3] = globaltimer();
}
__device__ __forceinline__ void tl_stamp(int i) {
    if (threadIdx.x == 0 && gemv_tl_slot < GEMV_TL_MAX) gemv_tl[gemv_tl_slot * 10ull + 3 + i] = globaltimer();
}
#else
__device__ __forceinline__ void tl_begin(const void *, int) {}
__device__ __forceinline__ void tl_stamp(int) {}
#endif

// What a GEMV does besides its own arithmetic, at the points named by `at<POINT>()`
// (0: after the first weight stages are issued, before griddep_wait; 1: when the calling lane's
// last pipelined weight stage is in flight; 2: after the lane's last weight load was consumed),
// and how it loads weights (`evict_first`, `policy()`). The default forms: nothing, plain
// loads (every member compiles to nothing: their code is that of the kernels without it).
#ifndef GEMV_L2_PREFETCH
struct NoL2Prefetch {
    static constexpr bool evict_first = false;
    __device__ __forceinline__ unsigned long long policy() const { return 0; }
    template <int POINT>
    __device__ __forceinline__ void at() const {}
};
#else
// The _pf forms: at point GEMV_PF_AT, thread 0 of each block (lane 0 of warp 0) issues
// `cp.async.bulk.prefetch.L2.global` over the block's share of [pf, pf + bytes): the bytes,
// rounded down to 16, are cut into gridDim.x contiguous runs of whole 16-byte units (the
// first `units % gridDim.x` blocks get one unit more), each issued in chunks of at most
// GEMV_PF_CHUNK bytes. A prefetch is a hint with no completion and no visible effect: the
// arithmetic is the default form's. With GEMV_PF_EVICT_FIRST the weight loads carry an
// L2::evict_first policy.
struct L2Prefetch {
    static constexpr bool evict_first = GEMV_PF_EVICT_FIRST != 0;
    const unsigned char *ptr;
    unsigned long long bytes;
    unsigned long long pol;
    __device__ __forceinline__ unsigned long long policy() const { return pol; }
    template <int POINT>
    __device__ __forceinline__ void at() const {
        if constexpr (POINT == GEMV_PF_AT) {
            if (threadIdx.x != 0) return;
            const unsigned long long units = bytes >> 4, nb = gridDim.x, b = blockIdx.x;
            const unsigned long long q = units / nb, r = units % nb;
            const unsigned long long first = b * q + (b < r ? b : r);
            const unsigned long long len = (q + (b < r ? 1 : 0)) << 4;
            const unsigned char *base = ptr + (first << 4);
            for (unsigned long long off = 0; off < len; off += GEMV_PF_CHUNK) {
                const unsigned size = (unsigned)(len - off < GEMV_PF_CHUNK ? len - off : GEMV_PF_CHUNK);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                             :: "l"(__cvta_generic_to_global(base + off)), "r"(size));
            }
        }
    }
};

__device__ __forceinline__ L2Prefetch l2_prefetch(const void *ptr, unsigned long long bytes) {
    unsigned long long pol = 0;
    if constexpr (L2Prefetch::evict_first) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return L2Prefetch{static_cast<const unsigned char *>(ptr), bytes, pol};
}
#endif

// 16-byte weight loads per row per lane in one pipeline stage (two stages in flight: with R = 2
// rows and M = 1, 16 loads = 256 B per lane, 64 KB per block): the default U of an M; the M = 1
// `_u5` entries use U = 5 (see the header).
template <int M>
struct Unroll {
    static constexpr int v = M == 1 ? 4 : 2;
};

// One 16-byte weight load when `pred`, else nothing (the result is then undefined and must not
// be used); weights are read once: L1 bypassed. Volatile asm keeps program order among the
// loads. A predicated load instead of a branch around a stage's loads: with a branch, ptxas
// rotated the loop and issued them after the current stage's FMAs (one stage in flight
// instead of two, seen in the SASS of the first PDL build). EF = true (the _pf forms with
// GEMV_PF_EVICT_FIRST) adds `.L2::cache_hint` with `policy`, an L2::evict_first policy from
// createpolicy (sm_90 has no `.L2::evict_first` qualifier on 16-byte loads), so that the
// streamed weight is evicted before the lines prefetched for the next GEMV.
template <bool EF>
__device__ __forceinline__ uint4 ldg_stage_if(const uint4 *p, bool pred, unsigned long long policy) {
    uint4 r;
    if constexpr (EF)
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
                     "@q ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %6;\n\t}"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p), "r"((int)pred), "l"(policy));
    else
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
                     "@q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n\t}"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p), "r"((int)pred));
    return r;
}

// Pipeline stages issued before griddepcontrol.wait (-DGEMV_PRE_STAGES=1 or 2). 2 (default):
// H200, one decode token's GEMVs as a PDL chain in a CUDA graph, 4B 2.319 ms vs 2.348 for the
// earlier pipeline (1 stage, then an unpipelined tail loop); 0.6B 0.506 vs 0.692; 1: 4B 2.411,
// 0.6B 0.519 (.gpu probe, NOTES.md entry 22).
#ifndef GEMV_PRE_STAGES
#define GEMV_PRE_STAGES 2
#endif
static_assert(GEMV_PRE_STAGES == 1 || GEMV_PRE_STAGES == 2, "GEMV_PRE_STAGES: 1 or 2");

// A lane's weight loads over the vector range [v0, v1) of k: one 16-byte load per row at
// v0 + lane + 32·j for j < lane_loads(v0, v1, lane) (v counts 16-byte vectors). Stage s of the
// pipeline is loads j = s·U … s·U + U − 1 of each of the R rows (the last stage predicated:
// no separate tail loop, whose loads would each cost a full memory latency).
__device__ __forceinline__ int lane_loads(int v0, int v1, int lane) {
    const int v = v0 + lane;
    return v < v1 ? (v1 - v + 31) >> 5 : 0;
}

// Issues stage s of a lane's weight loads into buf (loads j ≥ nl are not issued; buf's
// registers are then undefined and stage_fma does not read them).
template <int M, int R, int U, typename Pf>
__device__ __forceinline__ void stage_load(uint4 (&buf)[R][U], const uint4 *__restrict__ w,
                                           const long rows[R], int kv, int v, int s, int nl, const Pf &pf) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = s * U + u;
            buf[r][u] = ldg_stage_if<Pf::evict_first>(w + rows[r] * kv + v + 32 * j, j < nl, pf.policy());
        }
}

// acc[r][m] += x[m, v + 32j] · buf[r][u] over the loads j = s·U + u < nl of stage s, in
// (u, m, r) order — the order of the sequential loop over j, so results do not depend on U.
// `gate.x(xp, i)` is the 16-byte x vector i (plain loads for every gate but the tagged one).
template <int M, int R, int U, typename Gate>
__device__ __forceinline__ void stage_fma(float acc[R][M], const uint4 (&buf)[R][U],
                                          const uint4 *__restrict__ xs, int kv, int v, int s, int nl,
                                          const Gate &gate) {
    const uint4 *xp = xs;
    asm volatile("" : "+l"(xp));  // keeps the FMAs below the loads issued before them
    if ((s + 1) * U <= nl) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const uint4 xv = gate.x(xp, m * kv + v + 32 * (s * U + u));
#pragma unroll
                for (int r = 0; r < R; ++r) acc8(acc[r][m], buf[r][u], xv);
            }
    } else {
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (s * U + u < nl)
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const uint4 xv = gate.x(xp, m * kv + v + 32 * (s * U + u));
#pragma unroll
                    for (int r = 0; r < R; ++r) acc8(acc[r][m], buf[r][u], xv);
                }
    }
}

// The PDL-ordered body shared by every variant: acc[r][m] = Σ_{v0 ≤ v < v1} x[m, v] · w[rows[r], v]
// summed over the warp. A lane's loads run through two register buffers (a, b) of one stage each
// (R·U 16-byte loads): the first GEMV_PRE_STAGES stages are issued before griddep_wait() (weights
// are written by no kernel), then trigger (option 1), wait, `prologue()` (the norm variants fill
// shared memory from x), and the loop: FMAs of a stage, then that buffer's next load (stage + 2),
// so two stages are in flight throughout. Every thread of every block executes the wait. Rows must
// be valid (callers clamp out-of-range rows and drop their results). `pf`: NoL2Prefetch for the
// default forms, L2Prefetch for the _pf forms: at<0> right after the first stages, at<1> when the
// lane's last stage is issued (before its FMAs; after the prologue where that stage went out before
// the wait), at<2> after its last weight load was used.
// The gate every form passes once its first weight stages are in flight: the dependents may launch (trigger option
// 1), `wait()` for what the previous grid writes, then the prologue that reads it (x, the norm).
template <typename Wait, typename Prologue>
__device__ __forceinline__ void gate_then(Wait wait, Prologue prologue) {
    tl_stamp(1);
#if GEMV_PDL_TRIGGER == 1
    griddep_launch_dependents();
#endif
    wait();
    tl_stamp(2);
    prologue();
    tl_stamp(3);
}

// The PDL gate: the wait is griddepcontrol.wait.
template <typename Prologue>
__device__ __forceinline__ void pdl_gate(Prologue prologue) {
    gate_then([] { griddep_wait(); }, prologue);
}

// The gate pdl_dot passes once its first weight stages are in flight: PdlGate (every entry of the default module) is
// pdl_gate; the flag-dependency build's waiting entries pass FlagGate (-DGEMV_FLAG_DEP, below).
struct PdlGate {
    template <typename Prologue>
    __device__ __forceinline__ void operator()(Prologue prologue) const { pdl_gate(prologue); }
    // x vector i (8 bf16) and a residual element: plain loads
    __device__ __forceinline__ uint4 x(const uint4 *xp, long i) const { return xp[i]; }
    __device__ __forceinline__ __nv_bfloat16 residual(const __nv_bfloat16 *p) const { return *p; }
};

#ifdef GEMV_FLAG_DEP
// The flag-dependency build (see its entries at the end of the file).
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Counts the calling block in *sig once its output stores are done: the block barrier orders every thread's stores
// before thread 0's release add (red.release.gpu: cumulative, the pattern of cooperative groups' grid sync).
// GEMV_FLAG_FENCE_ALL=1: every thread fences its own stores first (__threadfence) and thread 0 adds relaxed (the
// first form measured; NOTES.md 49).
#ifndef GEMV_FLAG_FENCE_ALL
#define GEMV_FLAG_FENCE_ALL 0
#endif
__device__ __forceinline__ void signal_done(unsigned *sig) {
#if GEMV_FLAG_FENCE_ALL
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(sig, 1u);
#else
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sig) : "memory");
#endif
}
#if !GEMV_FLAG_FENCE_ALL
__device__ __forceinline__ unsigned ld_relaxed_gpu(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
#endif

// The gate of a waiting entry, instead of griddepcontrol.wait: the trigger as pdl_gate's (option 1), then thread 0
// polls wf[0] until `target` producer blocks have signalled (ld.acquire.gpu), the block barrier, then the prologue.
// wf[1] counts the blocks that passed; the last of the grid resets both words to 0 for the next producer, which
// cannot signal before this grid has completed (every launch between them waits on its predecessor's completion).
struct FlagGate : PdlGate {
    unsigned *wf;
    unsigned target;
    __device__ __forceinline__ FlagGate(unsigned *wf_, unsigned target_) : wf(wf_), target(target_) {}
    template <typename Prologue>
    __device__ __forceinline__ void operator()(Prologue prologue) const {
        gate_then([&] {
            if (threadIdx.x == 0) {
#if GEMV_FLAG_FENCE_ALL
                while (ld_acquire_gpu(wf) < target) {
                }
#else
                // relaxed polls (an acquire load invalidates the SM's L1 every time), then one acquire
                while (ld_relaxed_gpu(wf) < target) {
                }
                (void)ld_acquire_gpu(wf);
#endif
                if (atomicAdd(wf + 1, 1u) == gridDim.x - 1) {
                    atomicExch(wf, 0u);
                    atomicExch(wf + 1, 0u);
                }
            }
            __syncthreads();
        }, prologue);
    }
};

// The tagged dependency (NOTES.md 51): the producer stores each output as a 32-bit word, bf16 bits | tag << 16, with
// the tag of its call (its layer + 1: consecutive writers of the buffer differ, and a zeroed buffer never matches);
// the consumer executes no wait at all and checks the tag of every word it reads, re-reading through L2 (.cg) until
// it matches. A single 32-bit store is single-copy atomic, so a word with the expected tag carries its value: no
// fence, no counter, nothing per block on the producer side. The buffer must be the producer's alone (a `carry`).
// GEMV_TAG_SLEEP_NS: the pause before each re-read of a word whose tag is not yet its layer's (0, the default: none).
// Session 16: none +0.091 ms/token (call 7), 256 or 1024 ns +0.166 (call 8; NOTES.md 51).
#ifndef GEMV_TAG_SLEEP_NS
#define GEMV_TAG_SLEEP_NS 0
#endif
// GEMV_TAG_FENCE=1: the block's first act is an acquire fence (TagGate), so that x's first loads miss a stale L1.
#ifndef GEMV_TAG_FENCE
#define GEMV_TAG_FENCE 0
#endif
__device__ __forceinline__ uint4 ld_cg_v4(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(__cvta_generic_to_global(p)));
    return r;
}
__device__ __forceinline__ bool tags_are(const uint4 a, const uint4 b, unsigned tag) {
    return ((a.x >> 16) == tag) & ((a.y >> 16) == tag) & ((a.z >> 16) == tag) & ((a.w >> 16) == tag) &
           ((b.x >> 16) == tag) & ((b.y >> 16) == tag) & ((b.z >> 16) == tag) & ((b.w >> 16) == tag);
}
struct TagGate {
    unsigned tag;
    template <typename Prologue>
    __device__ __forceinline__ void operator()(Prologue prologue) const {
        gate_then([] {  // no wait: every x word is checked as it is read
#if GEMV_TAG_FENCE
            // an acquire fence by one thread, then the block barrier: the SM's L1 lines from before (the previous
            // layer's words at the same addresses) are dropped before the block's first x load
            if (threadIdx.x == 0) asm volatile("fence.acq_rel.gpu;" ::: "memory");
            __syncthreads();
#endif
        }, prologue);
    }
    // x vector i: the 8 tagged words 8i..8i+7 (two 16-byte loads, xp read as the words' uint4s), their bf16 halves
    __device__ __forceinline__ uint4 x(const uint4 *xp, long i) const {
        const uint4 *w = xp + 2 * i;
        uint4 a = w[0], b = w[1];
        while (!tags_are(a, b, tag)) {
#if GEMV_TAG_SLEEP_NS > 0
            __nanosleep(GEMV_TAG_SLEEP_NS);  // every lane of every waiting warp re-reads: spare L2 for the producer
#endif
            a = ld_cg_v4(w);
            b = ld_cg_v4(w + 1);
        }
        return make_uint4(__byte_perm(a.x, a.y, 0x5410), __byte_perm(a.z, a.w, 0x5410), __byte_perm(b.x, b.y, 0x5410),
                          __byte_perm(b.z, b.w, 0x5410));
    }
    // the residual through L2: with no wait, this SM's L1 may hold lines from before the previous GEMV wrote them
    __device__ __forceinline__ __nv_bfloat16 residual(const __nv_bfloat16 *p) const {
        unsigned short v;
        asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(__cvta_generic_to_global(p)));
        return __ushort_as_bfloat16(v);
    }
};
struct TaggedOut {
    static constexpr bool plain = false;
    unsigned tag;
    __device__ __forceinline__ void operator()(__nv_bfloat16 *y, long i, __nv_bfloat16 v) const {
        reinterpret_cast<unsigned *>(y)[i] = (tag << 16) | __bfloat16_as_ushort(v);
    }
};
#endif

// The end of every form's dot products: acc summed over the warp's lanes, then the trigger of option 2.
template <int R, int M>
__device__ __forceinline__ void warp_totals(float acc[R][M]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
#if GEMV_PDL_TRIGGER == 2
    griddep_launch_dependents();
#endif
}

#ifdef GEMV_TMA
// The bulk-copy form (opt in: -DGEMV_TMA, a module of its own; not built by tools/build_kernels.py): the same
// entries, params, launch geometry and bits as the default form, but a warp's weight stages go into shared memory
// through the Tensor Memory Accelerator (cp.async.bulk, one copy per row and stage, completion on an mbarrier)
// instead of into registers through 16-byte loads, so that the loads issued before griddepcontrol.wait do not
// occupy the SM's load path ahead of the reads of x and the residual after it (NOTES.md 26-27). Each warp owns a
// ring of GEMV_TMA_S slots of R rows x GEMV_TMA_C 16-byte vectors; lane 0 issues the first S stages before the
// wait and refills a slot (stage + S) once the warp has read it; every lane waits on the slot's mbarrier. The ring
// lives in dynamic shared memory at byte RING_OFF(M, k) for the norm variants (after their x), 0 otherwise: a
// launch needs WARPS·S·R·C·16 bytes more than the default form's (rounded up to 128 first).
// GEMV_PRE_STAGES does not apply (S stages go out before the wait) and U is unused: the `_u5` entries are the plain
// ones. The plain and residual variants read x from global memory through generic loads, as the default form does.
// H200, session 13 (NOTES.md 39; tools/gpu/gemv_tma_probe.py): the M = 1 entries bit-identical to the default form's
// (ksplit 1, 2, 4); alone, with the best ring (C = 128, S = 2), qkv and o 0.7-0.9 us per launch faster and down
// ~7 us slower (the default ring C = 128, S = 3 is slower for every shape); in the 4B decode program every form
// tried loses (o +0.13-0.29 ms/token: o's own share of the step falls 1.5 us per layer but the next GEMV's,
// gate_up's, rises 6.2 us; NOTES.md 41) but qkv at C = 64, S = 2 (-0.011), which costs 0.6B +0.043: not used by
// the generator.
#ifndef GEMV_TMA_C
#define GEMV_TMA_C 128
#endif
#ifndef GEMV_TMA_S
#define GEMV_TMA_S 3
#endif
#ifdef GEMV_L2_PREFETCH
#error "GEMV_TMA: not with GEMV_L2_PREFETCH (the _pf forms would neither prefetch nor place the ring after x)"
#endif
static_assert(GEMV_TMA_C % 32 == 0 && GEMV_TMA_C > 0, "GEMV_TMA_C: a multiple of 32 vectors");
static_assert(GEMV_TMA_S >= 1, "GEMV_TMA_S: at least one slot");
static_assert(WARPS * GEMV_TMA_S * 2 * GEMV_TMA_C * 16 <= 227 * 1024,
              "GEMV_TMA_C, GEMV_TMA_S: the ring (WARPS*S*2*C*16 bytes) exceeds sm_90's 227 KB of shared memory");

__device__ __forceinline__ unsigned smem_u32(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, unsigned phase) {
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n\t}" :: "r"(smem_u32(bar)), "r"(phase) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, unsigned long long *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_u32(dst)), "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

template <int M, int R, int U, typename Prologue, typename Pf, typename Gate = PdlGate>
__device__ __forceinline__ void pdl_dot(const uint4 *__restrict__ xs, const uint4 *__restrict__ w,
                                        const long rows[R], int kv, int v0, int v1, int lane,
                                        Prologue prologue, float acc[R][M], const Pf &, int ring_off,
                                        const Gate &gate = Gate{}) {
    constexpr int C = GEMV_TMA_C, S = GEMV_TMA_S;
    extern __shared__ __align__(128) unsigned char smem_dyn[];
    __shared__ unsigned long long bars[WARPS][S];
    const int warp = threadIdx.x >> 5;
    uint4 *ring = reinterpret_cast<uint4 *>(smem_dyn + ring_off) + warp * S * R * C;
    unsigned long long *bar = bars[warp];
    const int len = v1 - v0, stages = (len + C - 1) / C;
    const uint4 *src[R];
#pragma unroll
    for (int r = 0; r < R; ++r) src[r] = w + rows[r] * kv + v0;
    auto issue = [&](int st) {  // lane 0: stage st's copies into slot st % S
        if (st >= stages) return;
        const int slot = st % S;
        const unsigned bytes = static_cast<unsigned>(min(C, len - st * C)) * 16u;
        mbar_expect_tx(bar + slot, R * bytes);
#pragma unroll
        for (int r = 0; r < R; ++r) bulk_g2s(ring + (slot * R + r) * C, src[r] + st * C, bytes, bar + slot);
    };
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < S; ++s) mbar_init(bar + s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#pragma unroll
        for (int s = 0; s < S; ++s) issue(s);
    }
    __syncwarp();
    gate(prologue);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    for (int st = 0; st < stages; ++st) {
        const int slot = st % S;
        mbar_wait(bar + slot, (st / S) & 1);
        const int nvec = min(C, len - st * C);
        const uint4 *sl = ring + slot * R * C;
        const uint4 *xp = xs;
        asm volatile("" : "+l"(xp));  // x through generic loads, as stage_fma reads it (not .nc: a PDL
                                      // predecessor wrote it while this grid was already running)
#pragma unroll
        for (int u = 0; u < C / 32; ++u) {
            const int i = lane + 32 * u;
            if (i < nvec)
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const uint4 xv = xp[m * kv + v0 + st * C + i];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc8(acc[r][m], sl[r * C + i], xv);
                }
        }
        __syncwarp();
        if (lane == 0 && st + S < stages) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(st + S);
        }
    }
    tl_stamp(4);
    warp_totals<R, M>(acc);
}
#else
template <int M, int R, int U, typename Prologue, typename Pf, typename Gate = PdlGate>
__device__ __forceinline__ void pdl_dot(const uint4 *__restrict__ xs, const uint4 *__restrict__ w,
                                        const long rows[R], int kv, int v0, int v1, int lane,
                                        Prologue prologue, float acc[R][M], const Pf &pf, int,
                                        const Gate &gate = Gate{}) {
    const int v = v0 + lane, nl = lane_loads(v0, v1, lane), stages = (nl + U - 1) / U;
    uint4 a[R][U], b[R][U];
    stage_load<M, R, U>(a, w, rows, kv, v, 0, nl, pf);
    if (GEMV_PRE_STAGES == 2) stage_load<M, R, U>(b, w, rows, kv, v, 1, nl, pf);
    pf.template at<0>();
    gate(prologue);
    if (GEMV_PRE_STAGES == 1) stage_load<M, R, U>(b, w, rows, kv, v, 1, nl, pf);
    if (stages <= 2) pf.template at<1>();  // the last stage is already in flight
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    for (int s = 0; s < stages; s += 2) {
        stage_fma<M, R, U>(acc, a, xs, kv, v, s, nl, gate);
        stage_load<M, R, U>(a, w, rows, kv, v, s + 2, nl, pf);
        if (s + 2 == stages - 1) pf.template at<1>();
        if (s + 1 < stages) {
            stage_fma<M, R, U>(acc, b, xs, kv, v, s + 1, nl, gate);
            stage_load<M, R, U>(b, w, rows, kv, v, s + 3, nl, pf);
            if (s + 3 == stages - 1) pf.template at<1>();
        }
    }
    pf.template at<2>();
    tl_stamp(4);
    warp_totals<R, M>(acc);
}
#endif  // GEMV_TMA

// Rows of a warp: the block's 8 warps form 8/ksplit row groups of R rows; the ksplit
// warps of a group split k. Grid: grid.x = ceil_div(n, R · 8 / ksplit).
// Returns the warp's vector range [v0, v1) of k and fills rows (clamped to n-1;
// valid[r] says which results to keep).
template <int R>
__device__ __forceinline__ void warp_rows(long rows[R], bool valid[R], long first_row_of_block_unit,
                                          int n, int kv, int ksplit, int &v0, int &v1) {
    const int warp = threadIdx.x >> 5;
    const int group = warp / ksplit, part = warp % ksplit;
    const long row0 = (first_row_of_block_unit * (WARPS / ksplit) + group) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        valid[r] = row0 + r < n;
        rows[r] = valid[r] ? row0 + r : n - 1;
    }
    int per = (kv + ksplit - 1) / ksplit;
    per = (per + 31) & ~31;  // whole warp-wide loads
    v0 = min(kv, part * per);
    v1 = min(kv, v0 + per);
}

// Sums the ksplit partial results of each row group in shared memory; afterwards
// the group's part-0 warp holds the totals in acc (other warps' acc are stale).
template <int R, int M>
__device__ __forceinline__ void reduce_split(float acc[R][M], int ksplit) {
    if (ksplit == 1) return;
    __shared__ float partial[WARPS][R * M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < R * M; ++i) partial[warp][i] = acc[i / M][i % M];
    __syncthreads();
    if (warp % ksplit == 0)
#pragma unroll
        for (int i = 0; i < R * M; ++i) {
            float s = 0.f;
            for (int p = 0; p < ksplit; ++p) s += partial[warp + p][i];
            acc[i / M][i % M] = s;
        }
}

// Writes xn = rmsnorm(x[m]) · norm_w into shared memory (bf16, [M, k]), HF rounding. GENERIC_X: x read through
// generic loads, not the read-only path (the flag-dependency build's waiting entries: their producer grid may still
// be running when they read it). NB > 1 (M = 1 only): the batched prologue below for 2…NB vectors per thread, the
// loop otherwise; NB = 1 compiles the loop alone.
template <int M, bool GENERIC_X = false, int NB = 1>
__device__ __forceinline__ void norm_to_smem(const __nv_bfloat16 *__restrict__ x_arg,
                                             const __nv_bfloat16 *__restrict__ norm_w,
                                             __nv_bfloat16 *xs, int k, float eps) {
    const __nv_bfloat16 *x = x_arg;
    if constexpr (GENERIC_X) asm volatile("" : "+l"(x));
    __shared__ float partial[M][WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) ss[m] = 0.f;
    // The batched prologue (NB > 1, M = 1, 2…NB vectors per thread: k = 2,056…4,096 with NB = 2 and 256 threads):
    // the thread's x and norm_w vectors are loaded together right after the wait and held in registers through the
    // barrier, so that the prologue waits for one L2 round trip instead of one per loop trip and pass (the loop
    // below issues a trip's load only once the trip before has been summed, and reloads x and norm_w after the
    // barrier). The same sums in the same order (v ascending per thread), the same bits. H200, session 28 (NOTES.md
    // 70): 4B −0.045 ms/token. Compiled into the same entries as the loop it cost 0.6B (k = 1,024, one vector per
    // thread: the loop path) +0.017 ms/token (session 29, NOTES.md 71): the NB = 2 forms are entries of their own
    // (`_nb2`), which tools/gemv_plan.py `gemv_norm_batched` picks. An L1 prefetch of norm_w instead of the register
    // copy (prefetch.global.L1, SASS CCTL.E.PF1) cost +0.047 (4B) and +0.041 (0.6B).
    static_assert(NB == 1 || M == 1, "norm_to_smem: the batched prologue (NB > 1) is for M = 1");
    uint4 xb[NB], wb[NB];
    const bool batch = NB > 1 && M == 1 && kv > (int)blockDim.x && kv <= NB * (int)blockDim.x;
    if (batch) {
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            const int v = threadIdx.x + j * blockDim.x;
            if (v < kv) {
                xb[j] = reinterpret_cast<const uint4 *>(x)[v];
                wb[j] = reinterpret_cast<const uint4 *>(norm_w)[v];
            }
        }
#pragma unroll
        for (int j = 0; j < NB; ++j)
            if (threadIdx.x + j * blockDim.x < kv) sumsq8(ss[0], xb[j]);
    } else
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
#pragma unroll
        for (int m = 0; m < M; ++m) sumsq8(ss[m], reinterpret_cast<const uint4 *>(x + (long)m * k)[v]);
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
    if (batch) {
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            const int v = threadIdx.x + j * blockDim.x;
            if (v < kv) reinterpret_cast<uint4 *>(xs)[v] = rms_scale8(xb[j], wb[j], inv[0]);
        }
    } else
    for (int v = threadIdx.x; v < kv; v += blockDim.x) {
        const uint4 wv = reinterpret_cast<const uint4 *>(norm_w)[v];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4 xv = reinterpret_cast<const uint4 *>(x + (long)m * k)[v];
            reinterpret_cast<uint4 *>(xs + (long)m * k)[v] = rms_scale8(xv, wv, inv[m]);
        }
    }
    __syncthreads();
}

}  // namespace

#define R 2  // rows per warp (the SiLU variant: one gate row and its up row)

// The stores of a warp's R rows once their sums are final (acc holds the warp totals): lane r·M + m writes row r's
// output m, y[m, row] = bf16(acc) (plain), or residual[m, row] = bf16(residual + bf16(acc)) in place (RESIDUAL, HF's
// two roundings). Rows with valid[r] false (past n) write nothing. Both forms of gemv_rows use it.
template <int M, bool RESIDUAL, typename Gate>
__device__ __forceinline__ void store_rows(const float (&acc)[R][M], const long (&rows)[R], const bool (&valid)[R],
                                           __nv_bfloat16 *__restrict__ y, int n, int lane, const Gate &gate) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (lane == r * M + m && valid[r]) {
                const long i = (long)m * n + rows[r];
                if (RESIDUAL)
                    y[i] = tobf(bf(gate.residual(y + i)) + bf(tobf(acc[r][m])));
                else
                    y[i] = tobf(acc[r][m]);
            }
}

// The row-pass form (-DGEMV_PASSES=P, P = 2…8, a module of its own; tools/build_kernels.py builds P = 2: gemv_p2.cubin,
// entries kern_gemv_norm_m1_p2 and kern_gemv_norm_m1_nb2_p2, for the GEMV gemv_plan.gemv_passes picks: 4B's qkv, on the
// latter): the plain, residual and norm entries
// with the same params and bits, but each block owns P consecutive row units of 2·WARPS rows (ksplit must be 1),
// grid.x = ceil_div(n, 2·WARPS·P). A warp's weight stages run as one register pipeline over its P row pairs (two
// stages in flight across a pass boundary: the next pair's first loads go out during the current pair's last FMAs),
// and each pair's two outputs are stored as soon as its last stage is summed. What it is for: with P·2·WARPS rows per
// block the grid leaves SMs with room (registers, shared memory) for the next PDL launch's blocks while it streams,
// e.g. the decode attention's CTAs after the qkv GEMV (the default grid, 1.45 waves of two 30,720-register blocks per
// SM, holds every SM's registers until its tail: NOTES.md 54). The SiLU entries keep the default form.
#ifndef GEMV_PASSES
#define GEMV_PASSES 1
#endif
static_assert(GEMV_PASSES >= 1 && GEMV_PASSES <= 8, "GEMV_PASSES: 1 (the default form) to 8");
#if GEMV_PASSES > 1 && (defined(GEMV_TMA) || defined(GEMV_L2_PREFETCH) || defined(GEMV_FLAG_DEP))
#error "GEMV_PASSES: only with the register-pipeline form's default entries"
#endif

#if GEMV_PASSES > 1
template <int M, bool RESIDUAL, int U, typename Prologue, typename Gate>
__device__ __forceinline__ void gemv_rows_passes(const uint4 *__restrict__ xs, const __nv_bfloat16 *__restrict__ w_,
                                                 __nv_bfloat16 *__restrict__ y, int n, int k, int ksplit,
                                                 Prologue prologue, const Gate &gate) {
    constexpr int P = GEMV_PASSES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    if (ksplit != 1) __trap();  // one warp per row pair: the launch must pass ksplit 1
    const uint4 *w = reinterpret_cast<const uint4 *>(w_);
    const long base = ((long)blockIdx.x * P * WARPS + warp) * R;  // row pair p: base + p·WARPS·R
    const NoL2Prefetch pf{};
    // S: stages per pair, warp-uniform (lane 0 has the most loads), so that every lane passes every pair's end
    const int nl = lane_loads(0, kv, lane), S = (lane_loads(0, kv, 0) + U - 1) / U, T = P * S, S1 = S > 0 ? S : 1;
    auto ld = [&](uint4 (&buf)[R][U], int t) {  // stage t of the whole pipeline; t >= T: every load predicated off
        const int p = min(t / S1, P - 1);
        long rows[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const long row = base + (long)p * WARPS * R + r;
            rows[r] = row < n ? row : n - 1;
        }
        stage_load<M, R, U>(buf, w, rows, kv, lane, t - p * S1, nl, pf);
    };
    float acc[R][M];
    auto finish = [&](int p) {  // row pair p is summed: warp totals, stores, acc reset
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
        long rows[R];
        bool valid[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            rows[r] = base + (long)p * WARPS * R + r;
            valid[r] = rows[r] < n;
        }
        store_rows<M, RESIDUAL>(acc, rows, valid, y, n, lane, gate);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    };
    uint4 a[R][U], b[R][U];
    ld(a, 0);
    ld(b, 1);
    gate(prologue);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    for (int t = 0; t < T; t += 2) {
        {
            const int p = t / S1, s = t - p * S1;
            stage_fma<M, R, U>(acc, a, xs, kv, lane, s, nl, gate);
            ld(a, t + 2);
            if (s == S - 1) finish(p);
        }
        if (t + 1 < T) {
            const int p = (t + 1) / S1, s = t + 1 - p * S1;
            stage_fma<M, R, U>(acc, b, xs, kv, lane, s, nl, gate);
            ld(b, t + 3);
            if (s == S - 1) finish(p);
        }
    }
}
#endif

// ---- plain: y = x · Wᵀ ;  residual: residual += bf16(x · Wᵀ) ------------------
template <int M, bool RESIDUAL, int U, typename Prologue, typename Pf, typename Gate = PdlGate>
__device__ __forceinline__ void gemv_rows(const uint4 *__restrict__ xs, const __nv_bfloat16 *__restrict__ w,
                                          __nv_bfloat16 *__restrict__ y, int n, int k, int ksplit, Prologue prologue,
                                          const Pf &pf, int ring_off = 0, const Gate &gate = Gate{}) {
#if GEMV_PASSES > 1
    (void)pf;
    (void)ring_off;
    gemv_rows_passes<M, RESIDUAL, U>(xs, w, y, n, k, ksplit, prologue, gate);
#else
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    long rows[R];
    bool valid[R];
    int v0, v1;
    warp_rows<R>(rows, valid, blockIdx.x, n, kv, ksplit, v0, v1);
    float acc[R][M];
    tl_begin(w, n);
    pdl_dot<M, R, U>(xs, reinterpret_cast<const uint4 *>(w), rows, kv, v0, v1, lane, prologue, acc, pf, ring_off, gate);
    reduce_split<R, M>(acc, ksplit);
    tl_stamp(5);
    if (warp % ksplit != 0) return;
    store_rows<M, RESIDUAL>(acc, rows, valid, y, n, lane, gate);
#endif
}

// ---- norm + SiLU-and-mul: y = silu(rmsnorm(x)·Wgᵀ) * (rmsnorm(x)·Wuᵀ) ------------
// A warp owns one output column j: gate row j and up row n + j, loaded together.
// The plain store of an output element (the tagged build's gate_up stores a tagged word instead: TaggedOut).
struct PlainOut {
    static constexpr bool plain = true;
    __device__ __forceinline__ void operator()(__nv_bfloat16 *y, long i, __nv_bfloat16 v) const { y[i] = v; }
};

template <int M, int U, typename Prologue, typename Pf, typename Out = PlainOut>
__device__ __forceinline__ void gemv_silu_rows(const uint4 *__restrict__ xs, const __nv_bfloat16 *__restrict__ w,
                                               __nv_bfloat16 *__restrict__ y, int n, int k, int ksplit,
                                               Prologue prologue, const Pf &pf, int ring_off = 0,
                                               const Out &out = Out{}) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv = k >> 3;
    const int group = warp / ksplit, part = warp % ksplit;
    const long j = (long)blockIdx.x * (WARPS / ksplit) + group;
    const bool ok = j < n;
    const long jc = ok ? j : n - 1;
    long rows[R] = {jc, n + jc};
    int per = (kv + ksplit - 1) / ksplit;
    per = (per + 31) & ~31;
    const int v0 = min(kv, part * per), v1 = min(kv, v0 + per);
    float acc[R][M];
    tl_begin(w, n);
    pdl_dot<M, R, U>(xs, reinterpret_cast<const uint4 *>(w), rows, kv, v0, v1, lane, prologue, acc, pf, ring_off);
    reduce_split<R, M>(acc, ksplit);
    tl_stamp(5);
    if (part != 0 || !ok) return;
#pragma unroll
    for (int m = 0; m < M; ++m)
        if (lane == m) {
            const float g = bf(tobf(acc[0][m]));
            const float u = bf(tobf(acc[1][m]));
            if constexpr (Out::plain)  // the default entries' own store (their code, byte for byte)
                y[(long)m * n + j] = tobf(bf(tobf(silu(g))) * u);
            else
                out(y, (long)m * n + j, tobf(bf(tobf(silu(g))) * u));
        }
}

// The bulk-copy form's ring offset in dynamic shared memory: after the norm variants' M·k bf16 of x.
#define RING_OFF(M, k) (((M) * (k) * 2 + 127) & ~127)

#define INSTANTIATE(M, U, SUFFIX)                                                                  \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_m##M##SUFFIX(               \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                \
        __nv_bfloat16 *__restrict__ y, int n, int k, int ksplit) {                                \
        gemv_rows<M, false, U>(reinterpret_cast<const uint4 *>(x), w, y, n, k, ksplit, [] {},      \
                            NoL2Prefetch{});                                                      \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_residual_m##M##SUFFIX(      \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                \
        __nv_bfloat16 *__restrict__ residual, int n, int k, int ksplit) {                         \
        gemv_rows<M, true, U>(reinterpret_cast<const uint4 *>(x), w, residual, n, k, ksplit, [] {},  \
                           NoL2Prefetch{});                                                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_m##M##SUFFIX(          \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,           \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,        \
        float eps, int ksplit) {                                                                  \
        extern __shared__ __align__(16) unsigned char smem[];                                     \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                              \
        gemv_rows<M, false, U>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,            \
                            [&] { norm_to_smem<M>(x, norm_w, xs, k, eps); }, NoL2Prefetch{}, RING_OFF(M, k)); \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_silu_m##M##SUFFIX(     \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,           \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,        \
        float eps, int ksplit) {                                                                  \
        extern __shared__ __align__(16) unsigned char smem[];                                     \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                              \
        gemv_silu_rows<M, U>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,              \
                          [&] { norm_to_smem<M>(x, norm_w, xs, k, eps); }, NoL2Prefetch{}, RING_OFF(M, k)); \
    }

// kern_gemv_norm{,_silu}_m1{,_u5}_nb2: the M = 1 norm entries with the batched prologue (norm_to_smem's NB = 2):
// the same params, arithmetic and bits; for k/8 in (256, 512] (tools/gemv_plan.py gemv_norm_batched), correct for
// every k (other k take the loop).
#define INSTANTIATE_NORM_NB(U, SUFFIX)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_m1##SUFFIX##_nb2(                    \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                          \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit) { \
        extern __shared__ __align__(16) unsigned char smem[];                                                    \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                                             \
        gemv_rows<1, false, U>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,                          \
                               [&] { norm_to_smem<1, false, 2>(x, norm_w, xs, k, eps); }, NoL2Prefetch{},       \
                               RING_OFF(1, k));                                                                  \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_silu_m1##SUFFIX##_nb2(               \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                          \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit) { \
        extern __shared__ __align__(16) unsigned char smem[];                                                    \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                                             \
        gemv_silu_rows<1, U>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,                            \
                             [&] { norm_to_smem<1, false, 2>(x, norm_w, xs, k, eps); }, NoL2Prefetch{},         \
                             RING_OFF(1, k));                                                                    \
    }

#if defined(GEMV_NO_ENTRIES)
// included by another source (gemv_mlp.cu) for its helpers: no entries of its own
#elif defined(GEMV_FLAG_DEP)
// The flag-dependency forms (opt in: -DGEMV_FLAG_DEP, a module of its own, gemv_flag.cubin; an experiment, NOTES.md
// 49; tools/gpu/flag_variant.py rewrites a decode program onto them). A consumer GEMV launched with PDL waits for
// its producer's blocks to have signalled a counter instead of for the producer grid to complete
// (griddepcontrol.wait): H200 session 16 measured down's wait at 0.051 ms per 4B token with down still reading
// final inputs when it did not wait at all. Measured slower (4B, one runtime per process): down on a counter +0.079
// ms/token, down and qkv +0.120, gate_up's signals alone +0.062 (a release at the end of every block holds its slot
// longer; GEMV_FLAG_FENCE_ALL=1, a fence in every thread, +0.361); down on tagged words +0.091 (the tag checks in the
// stream loop; NOTES.md 51); not used. Same arithmetic and bits as the default
// entries of the same names; the
// PDL contract is kept by the data (a consumer reads only what every counted producer block stored before its
// signal), so kern-verify's E0088 (a `pdl` launch whose code never executes griddepcontrol.wait) is expected on the
// waiting entries. The counters (u32 words of a zeroed `carry` buffer) return to 0 after every use.
//   kern_gemv_norm_silu_m1{,_u5}_signal(x, norm_w, w, y, n, k, eps, ksplit, unsigned *sig)
//       kern_gemv_norm_silu_m1{,_u5}, then each block adds 1 to *sig after its stores
//   kern_gemv_residual_m1_flagwait(x, w, residual, n, k, ksplit, unsigned *wf, unsigned target)
//       kern_gemv_residual_m1 gated on wf[0] reaching target (the producer's grid size) instead of
//       griddepcontrol.wait; wf[1] is its pass counter (FlagGate)
//   kern_gemv_residual_m1_flagwait_signal(x, w, residual, n, k, ksplit, unsigned *wf, unsigned target, unsigned *sig)
//       the same, then each block adds 1 to *sig after its stores
//   kern_gemv_norm_m1_flagwait(x, norm_w, w, y, n, k, eps, ksplit, unsigned *wf, unsigned target)
//       kern_gemv_norm_m1 gated as above
//   kern_gemv_norm_silu_m1{,_u5}_tagged(x, norm_w, w, unsigned *y, n, k, eps, ksplit, unsigned tag)
//       kern_gemv_norm_silu_m1{,_u5} storing each output as the word bf16 | tag << 16 (TaggedOut)
//   kern_gemv_residual_m1_tagged(const unsigned *x, w, residual, n, k, ksplit, unsigned tag)
//       kern_gemv_residual_m1 on such words: no wait at all; each x word re-read through L2 until its tag is `tag`,
//       the residual read through L2 (TagGate; NOTES.md 51)
#define INSTANTIATE_SIGNAL(U, SUFFIX)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_silu_m1##SUFFIX##_signal(           \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                          \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit, \
        unsigned *sig) {                                                                                         \
        extern __shared__ __align__(16) unsigned char smem[];                                                    \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                                             \
        gemv_silu_rows<1, U>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,                            \
                             [&] { norm_to_smem<1>(x, norm_w, xs, k, eps); }, NoL2Prefetch{}, RING_OFF(1, k));   \
        signal_done(sig);                                                                                        \
    }
INSTANTIATE_SIGNAL(4, )
INSTANTIATE_SIGNAL(5, _u5)
extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_residual_m1_flagwait(
    const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ residual,
    int n, int k, int ksplit, unsigned *wf, unsigned target) {
    gemv_rows<1, true, 4>(reinterpret_cast<const uint4 *>(x), w, residual, n, k, ksplit, [] {}, NoL2Prefetch{}, 0,
                          FlagGate{wf, target});
}
extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_residual_m1_flagwait_signal(
    const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ residual,
    int n, int k, int ksplit, unsigned *wf, unsigned target, unsigned *sig) {
    gemv_rows<1, true, 4>(reinterpret_cast<const uint4 *>(x), w, residual, n, k, ksplit, [] {}, NoL2Prefetch{}, 0,
                          FlagGate{wf, target});
    signal_done(sig);
}
#define INSTANTIATE_TAGGED(U, SUFFIX)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_silu_m1##SUFFIX##_tagged(           \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,                          \
        const __nv_bfloat16 *__restrict__ w, unsigned *__restrict__ y, int n, int k, float eps, int ksplit,     \
        unsigned tag) {                                                                                          \
        extern __shared__ __align__(16) unsigned char smem[];                                                    \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                                             \
        gemv_silu_rows<1, U>(reinterpret_cast<const uint4 *>(xs), w, reinterpret_cast<__nv_bfloat16 *>(y), n, k, \
                             ksplit, [&] { norm_to_smem<1>(x, norm_w, xs, k, eps); }, NoL2Prefetch{},           \
                             RING_OFF(1, k), TaggedOut{tag});                                                    \
    }
INSTANTIATE_TAGGED(4, )
INSTANTIATE_TAGGED(5, _u5)
extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_residual_m1_tagged(
    const unsigned *__restrict__ x, const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ residual,
    int n, int k, int ksplit, unsigned tag) {
    gemv_rows<1, true, 4>(reinterpret_cast<const uint4 *>(x), w, residual, n, k, ksplit, [] {}, NoL2Prefetch{}, 0,
                          TagGate{tag});
}
extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_m1_flagwait(
    const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w, const __nv_bfloat16 *__restrict__ w,
    __nv_bfloat16 *__restrict__ y, int n, int k, float eps, int ksplit, unsigned *wf, unsigned target) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);
    gemv_rows<1, false, 4>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,
                           [&] { norm_to_smem<1, true>(x, norm_w, xs, k, eps); }, NoL2Prefetch{}, RING_OFF(1, k),
                           FlagGate{wf, target});
}
#elif !defined(GEMV_L2_PREFETCH)
INSTANTIATE(1, 4, )
INSTANTIATE(1, 5, _u5)
INSTANTIATE_NORM_NB(4, )
INSTANTIATE_NORM_NB(5, _u5)
INSTANTIATE(2, 2, )
INSTANTIATE(4, 2, )
INSTANTIATE(8, 2, )
#else
// The L2-prefetch forms (module gemv_pf.cubin, built with -DGEMV_L2_PREFETCH by
// build_kernels.py --l2-prefetch; that module holds only these): the default form's params,
// then the range to prefetch into L2 (the next GEMV's weight; pf_bytes = 0: none).
#define INSTANTIATE_PF(M)                                                                         \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_m##M##_pf(                 \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                \
        __nv_bfloat16 *__restrict__ y, int n, int k, int ksplit, const void *__restrict__ pf_ptr, \
        unsigned long long pf_bytes) {                                                            \
        gemv_rows<M, false, Unroll<M>::v>(reinterpret_cast<const uint4 *>(x), w, y, n, k, ksplit, [] {},        \
                            l2_prefetch(pf_ptr, pf_bytes));                                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_residual_m##M##_pf(        \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,                \
        __nv_bfloat16 *__restrict__ residual, int n, int k, int ksplit,                           \
        const void *__restrict__ pf_ptr, unsigned long long pf_bytes) {                           \
        gemv_rows<M, true, Unroll<M>::v>(reinterpret_cast<const uint4 *>(x), w, residual, n, k, ksplit, [] {},  \
                           l2_prefetch(pf_ptr, pf_bytes));                                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_m##M##_pf(            \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,           \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,        \
        float eps, int ksplit, const void *__restrict__ pf_ptr, unsigned long long pf_bytes) {    \
        extern __shared__ __align__(16) unsigned char smem[];                                     \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                              \
        gemv_rows<M, false, Unroll<M>::v>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit, \
                            [&] { norm_to_smem<M>(x, norm_w, xs, k, eps); },                      \
                            l2_prefetch(pf_ptr, pf_bytes));                                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) kern_gemv_norm_silu_m##M##_pf(       \
        const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ norm_w,           \
        const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ y, int n, int k,        \
        float eps, int ksplit, const void *__restrict__ pf_ptr, unsigned long long pf_bytes) {    \
        extern __shared__ __align__(16) unsigned char smem[];                                     \
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(smem);                              \
        gemv_silu_rows<M, Unroll<M>::v>(reinterpret_cast<const uint4 *>(xs), w, y, n, k, ksplit,   \
                          [&] { norm_to_smem<M>(x, norm_w, xs, k, eps); },                        \
                          l2_prefetch(pf_ptr, pf_bytes));                                         \
    }

INSTANTIATE_PF(1)
#endif
