// A decode-token megakernel probe (issue 9; NOTES.md 46; driven by tools/gpu/megakernel_probe.py): one persistent
// launch per token runs a whole op list — the embedding, per layer the qkv GEMV (RMS norm prologue), the o GEMV with
// the residual add (its input: the first 4,096 qkv outputs, standing in for the attention, as the no-attention
// what-if of NOTES.md 45), gate_up with the norm and SiLU-and-mul, down with the residual add; then the final norm,
// lm_head and the argmax — with the weight stream decoupled from the dependencies between ops.
//
// Why: in gemv.cu's five-launch layer every launch pays, after its PDL wait, dependent work (x, the norm, the FMAs
// that gate the next loads) while the bus waits (NOTES.md 26–27, 45). Here a producer warp per SM streams that SM's
// rows of every op, in op order, into a ring of shared-memory slots with the bulk-copy engine (cp.async.bulk, bytes
// counted on an mbarrier). Weights depend on nothing, so the stream runs on across op boundaries while the consumer
// warps wait for the previous op's output: the ring (NW·S slots, 160 KB) is what the boundary can hide.
//
// Work split: block b of G owns items [n·b/G, n·(b+1)/G) of every op (rows; SiLU pairs for gate_up, whose weight is
// stored pair-interleaved: gate row i, up row i, ...). It streams them as units: R whole rows per slot where a row
// fits one (k = 2,560: 2 rows of a 10 KB slot), else one row in P pieces (k = 9,728: 2). Unit g of a block (counted
// across ops) belongs to consumer warp g % NW, which has its own S slots and uses them in order, so each slot has one
// consumer and no mbarrier wait is ever a phase ahead. A warp sums each of its rows alone (lane-strided 16-byte
// pieces, fp32, a few chains, then a warp sum), so every value has one summation order: the same bits on every run.
// Build macros: NW (consumer warps, 8), S (slots per warp, 2), SLOT_BYTES (10,240; ≥ two rows of k = 2,560),
// INFLIGHT (copies issued but not landed, at most; default the whole ring: the more in flight, the longer every
// dependent read after an op boundary queues behind them), POLL_NS (32), PF_AHEAD (0: with N, each issued piece also
// prefetches into L2 the piece N further on, so a boundary that fills the ring still keeps the bus busy).
//
// Dependencies: after its chunks of op j, every consumer thread fences, the consumer warps meet at a named barrier
// and one thread adds 1 to counters[j]; op j + 1's consumers wait until counters[j] reaches G·epoch (epoch: the
// launch's 1-based token number; counters are never reset), then read their input (ld.global.cg: other SMs wrote
// it) into shared memory. All G blocks must be resident at once (one per SM: the host checks the occupancy).
//
// Numerics, as gemv.cu (HF bf16 Qwen3): xn = bf16(norm_w · bf16(x · rsqrt(mean(x²) + eps))); y = bf16(Σ xn·w);
// residual = bf16(residual + y); act = bf16(bf16(silu(g)) · u); the argmax over bf16 logits, ties to the smaller
// index. `mode` bit 0: consumers skip all math and waits (the stream alone); bit 1: no dependency waits; bit 2: no
// input loads (xs keeps what it holds: with bit 1, the consumers' math alone). `times` (or null): per block and op,
// %globaltimer (ns) when the block finished the op, before it signals. `trace` (or null): block 0's pieces (issued,
// ready to its consumer, released; the op of each) and per op when its dependency and its input were ready.
// `shares` (or null: equal shares): G + 1 ascending u32, block b owning [shares[b], shares[b + 1]) of shares[G] units
// of every op.
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef NW
#define NW 8                            // consumer warps; warp NW is the producer
#endif
#ifndef S
#define S 2                             // ring slots per consumer warp (its own FIFO)
#endif
#ifndef SLOT_BYTES
#define SLOT_BYTES 10240                // 2 rows of k = 2,560, 1 of 4,096, half of 9,728
#endif
#ifndef INFLIGHT
#define INFLIGHT (NW * S)               // copies the producer keeps issued but not landed (the whole ring: no limit)
#endif
#ifndef POLL_NS
#define POLL_NS 32                      // sleep between polls of a dependency counter (all blocks poll one word)
#endif
#ifndef PF_AHEAD
#define PF_AHEAD 0                      // the producer prefetches into L2 the piece this far past the one it issues
#endif
#define RES_MAX 128                     // residual rows a block may own per op (RESID: read with its input)
#define TMAXP 8192                      // pieces block 0 traces (`trace`: 4·TMAXP + 2·MAX_OPS u64)
#define MAX_OPS 1024                    // ops a list may hold (the trace's per-op slots)
#define THREADS ((NW + 1) * 32)
#define NSLOT (NW * S)
#define XS_BYTES 19456                  // the largest k (9,728) in bf16
#define SMEM_BYTES (NSLOT * SLOT_BYTES + XS_BYTES)
static_assert(NW >= 1 && NW <= 16, "NW: 1..16 consumer warps");
static_assert(S >= 1, "S: at least one slot per consumer warp");
static_assert(SLOT_BYTES % 16 == 0, "SLOT_BYTES: bulk copies move multiples of 16 bytes");
static_assert(SLOT_BYTES >= 2 * 2560 * 2, "SLOT_BYTES: a gate_up unit is a gate/up pair of k = 2,560 rows (10,240 bytes)");
static_assert(INFLIGHT >= 1 && INFLIGHT <= NSLOT, "INFLIGHT: 1..NW*S copies in flight");
static_assert(SMEM_BYTES <= 227 * 1024, "the ring and the input exceed sm_90's shared memory per block");

namespace {
#include "../kernels-src/gemv_common.cuh"

enum Kind { EMBED = 0, NORM = 1, NORM_SILU = 2, RESID = 3, LM_ARGMAX = 4 };

struct Op {                              // 56 bytes, as megakernel_probe.py packs it
    const __nv_bfloat16 *w;              // [rows, k] (NORM_SILU: 2n pair-interleaved rows; EMBED: the table)
    const __nv_bfloat16 *x;              // input vector, k elements
    const __nv_bfloat16 *norm_w;         // NORM, NORM_SILU, LM_ARGMAX
    __nv_bfloat16 *y;                    // output, n elements (EMBED: hidden)
    const __nv_bfloat16 *res;            // RESID: residual in (y may alias it)
    int n, k, kind, unused;              // items, k, Kind
};

__device__ __forceinline__ unsigned smem_u32(const void *p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, unsigned parity) {
    unsigned ok;
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    return ok != 0;
}
// A probe must not hang its GPU: a wait that outlasts ~seconds traps (the host sees a launch failure).
#define SPIN_LIMIT (1u << 22)
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    for (unsigned i = 0; !mbar_try_wait(bar, parity); ++i)
        if (i == SPIN_LIMIT) __trap();
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(NW * 32) : "memory"); }
__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// A block's share of every op: items [n·s0/total, n·s1/total) (uniform: s0 = b, s1 = b + 1, total = G; or a
// prefix of per-block weights from the host, `shares`).
struct Share { unsigned long long s0, s1, total; };
__device__ __forceinline__ void item_range(const Op &op, const Share &sh, int &i0, int &i1) {
    i0 = (int)((unsigned long long)op.n * sh.s0 / sh.total);
    i1 = (int)((unsigned long long)op.n * sh.s1 / sh.total);
}
__device__ __forceinline__ int rows_of(const Op &op, int items) { return op.kind == NORM_SILU ? 2 * items : items; }
__device__ __forceinline__ bool streams(const Op &op) { return op.kind != EMBED; }

// The op's input into shared memory (bf16): x, or its RMS norm times norm_w (gemv_common.cuh's steps); all NW·32
// consumer threads, meeting at a named barrier.
__device__ void input_to_smem(const Op &op, uint4 *xs, float eps, float *red, __nv_bfloat16 *res_s, int r0, int nr) {
    const int t = threadIdx.x, kv = op.k >> 3;
    const uint4 *x = reinterpret_cast<const uint4 *>(op.x);
    if (op.kind == RESID) {  // x, and this block's residual rows (read here, not in each row's epilogue)
        for (int v = t; v < kv; v += NW * 32) xs[v] = __ldcg(x + v);
        for (int i = t; i < nr; i += NW * 32) res_s[i] = __ldcg(op.res + r0 + i);
        return;
    }
    float ss = 0.f;
    for (int v = t; v < kv; v += NW * 32) {
        const uint4 xv = __ldcg(x + v);
        xs[v] = xv;
        sumsq8(ss, xv);
    }
    ss = warp_sum(ss);
    if ((t & 31) == 0) red[t >> 5] = ss;
    consumers_sync();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NW; ++i) s += red[i];
    const float inv = rsqrtf(s / (float)op.k + eps);
    const uint4 *nw = reinterpret_cast<const uint4 *>(op.norm_w);
    for (int v = t; v < kv; v += NW * 32) xs[v] = rms_scale8(xs[v], nw[v], inv);
}

// How op `op` streams: units of R whole rows (one slot each, P = 1) when a row fits a slot, else one row in P
// pieces of at most SLOT_BYTES (one slot each). NORM_SILU units hold whole gate/up pairs (R even).
struct Geo { int R, P, pv; };  // rows per unit, pieces per unit, 16-byte vectors per piece (P > 1)
__device__ __forceinline__ Geo geo(const Op &op) {
    const int row = op.k * 2;
    if (row <= SLOT_BYTES) {
        int r = min(4, SLOT_BYTES / row);
        if (op.kind == NORM_SILU) r &= ~1;
        return {r, 1, 0};
    }
    const int kv = op.k >> 3, p = (row + SLOT_BYTES - 1) / SLOT_BYTES;
    return {1, p, (kv + p - 1) / p};
}

// a[q][u] += Σ w_q·x over `nvec` 16-byte vectors of ROWS rows (row q at q·row_vecs vectors from w), lane-strided,
// 4 / ROWS chains per row, so a warp keeps about 4 FMA chains going; the rows share each x load.
template <int ROWS, int UN>
__device__ __forceinline__ void piece_dot(const uint4 *w, const uint4 *x, int nvec, int row_vecs, int lane,
                                          float (&a)[4][4]) {
    for (int v = lane; v < nvec; v += 32 * UN) {
#pragma unroll
        for (int u = 0; u < UN; ++u) {
            const int vv = v + 32 * u;
            if (UN == 1 || vv < nvec) {
                const uint4 xv = x[vv];
#pragma unroll
                for (int q = 0; q < ROWS; ++q) acc8(a[q][u], w[q * row_vecs + vv], xv);
            }
        }
    }
}

// The pieces of one block in the producer's order (ops, units, pieces), one at a time: the L2 prefetch's lookahead.
struct Cursor {
    const Op *ops;
    int num_ops;
    Share sh;
    int j = 0, r = 0, p = 0, r0 = 0, nr = 0;
    bool loaded = false;
    Geo q{1, 1, 0};
    __device__ bool next(const __nv_bfloat16 *&src, unsigned &bytes) {
        for (;;) {
            if (j >= num_ops) return false;
            const Op &op = ops[j];
            if (!loaded) {
                if (!streams(op)) { ++j; continue; }
                int i0, i1;
                item_range(op, sh, i0, i1);
                r0 = rows_of(op, i0);
                nr = rows_of(op, i1) - r0;
                q = geo(op);
                r = p = 0;
                loaded = true;
            }
            if (r >= nr) { ++j; loaded = false; continue; }
            const int kv = op.k >> 3, rows = min(q.R, nr - r);
            const int v0 = q.P == 1 ? 0 : p * q.pv, nv = q.P == 1 ? rows * kv : min(q.pv, kv - v0);
            src = op.w + (size_t)(r0 + r) * op.k + (size_t)v0 * 8;
            bytes = (unsigned)nv * 16;
            if (++p >= q.P) { p = 0; r += q.R; }
            return true;
        }
    }
};
__device__ __forceinline__ void prefetch_l2(const void *src, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(src)), "r"(bytes) : "memory");
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1)
kern_megakernel_probe(const Op *__restrict__ ops, int num_ops, unsigned *counters, float eps, long long *token,
                      unsigned epoch, float *arg_val, int *arg_idx, int mode, unsigned long long *times,
                      unsigned long long *trace, const unsigned *shares) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *ring = smem;
    uint4 *xs = reinterpret_cast<uint4 *>(smem + NSLOT * SLOT_BYTES);
    __shared__ __align__(8) uint64_t full[NSLOT], empty[NSLOT];
    __shared__ float red[NW];
    __shared__ __nv_bfloat16 res_s[RES_MAX];
    __shared__ float best_v[NW];
    __shared__ int best_i[NW];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x, G = gridDim.x;
    const Share sh = shares ? Share{shares[b], shares[b + 1], shares[G]} : Share{(unsigned long long)b,
                                                                                   (unsigned long long)b + 1,
                                                                                   (unsigned long long)G};
    if (threadIdx.x == 0) {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < SMEM_BYTES || num_ops > MAX_OPS) __trap();  // launched for another build, or too many ops
        for (int s = 0; s < NSLOT; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // Units are numbered across ops (g); unit g belongs to consumer warp g % NW, whose f-th piece goes to its slot
    // w·S + f % S: every slot has one consumer, which uses its slots in order (its waits are never a phase ahead).
    if (warp == NW) {  // the producer: every piece of every op, in order
        if (lane != 0) return;
        unsigned f[NW];
        for (int w = 0; w < NW; ++w) f[w] = 0;
        unsigned g = 0, issued = 0;
        Cursor ahead{ops, num_ops, sh};
        const __nv_bfloat16 *pf_src;
        unsigned pf_bytes;
        bool pf_more = PF_AHEAD > 0;
        for (int i = 0; i < PF_AHEAD && pf_more; ++i) pf_more = ahead.next(pf_src, pf_bytes);  // skip PF_AHEAD pieces
#if INFLIGHT < NSLOT  // (the whole ring in flight needs no window: the slots' own waits bound it)
        unsigned hist[INFLIGHT], fills[NSLOT];  // the last INFLIGHT copies (fill number · NSLOT + slot); fills per slot
        for (int i = 0; i < NSLOT; ++i) fills[i] = 0;
#endif
        for (int j = 0; j < num_ops; ++j) {
            const Op op = ops[j];
            if (!streams(op)) continue;
            int i0, i1;
            item_range(op, sh, i0, i1);
            const Geo q = geo(op);
            const int r0 = rows_of(op, i0), nr = rows_of(op, i1) - r0, kv = op.k >> 3;
            for (int r = 0; r < nr; r += q.R, ++g) {
                const int w = g % NW, rows = min(q.R, nr - r);
                for (int p = 0; p < q.P; ++p, ++issued) {
                    const unsigned fw = f[w]++;
                    const int slot = w * S + fw % S;
                    const int v0 = q.P == 1 ? 0 : p * q.pv, nv = q.P == 1 ? rows * kv : min(q.pv, kv - v0);
#if INFLIGHT < NSLOT
                    if (issued >= INFLIGHT) {  // the copy INFLIGHT back must have landed: wait for it, unless its
                        const unsigned h = hist[issued % INFLIGHT];  // slot was refilled since (then it was consumed)
                        const unsigned hs = h % NSLOT, hn = h / NSLOT;
                        if (fills[hs] == hn + 1) mbar_wait(&full[hs], hn & 1);
                    }
                    hist[issued % INFLIGHT] = (fw / S) * NSLOT + slot;  // the slot's fill number and the slot
                    fills[slot] = fw / S + 1;
#endif
                    if (fw >= S) mbar_wait(&empty[slot], (fw / S - 1) & 1);
                    mbar_expect_tx(&full[slot], (unsigned)nv * 16);
                    bulk_copy(ring + slot * SLOT_BYTES, op.w + (size_t)(r0 + r) * op.k + (size_t)v0 * 8, nv * 16,
                              &full[slot]);
                    if (pf_more && (pf_more = ahead.next(pf_src, pf_bytes))) prefetch_l2(pf_src, pf_bytes);
                    if (trace && b == 0 && issued < TMAXP) {
                        trace[issued] = globaltimer();
                        trace[3 * TMAXP + issued] = j;
                    }
                }
            }
        }
        return;
    }

    // the consumers
    unsigned g = 0, f = 0, pc = 0;  // units and pieces of this block so far (the producer's numbering); pieces of
                                    // this warp so far
    for (int j = 0; j < num_ops; ++j) {
        const Op op = ops[j];
        int i0, i1;
        item_range(op, sh, i0, i1);
        const int r0 = rows_of(op, i0), nr = streams(op) ? rows_of(op, i1) - r0 : 0;  // EMBED streams nothing
        if (!(mode & 1)) {
            if (j > 0 && !(mode & 2)) {
                if (threadIdx.x == 0)
                    for (unsigned i = 0; ld_acquire(counters + j - 1) < (unsigned)G * epoch; ++i) {
                        __nanosleep(POLL_NS);
                        if (i == SPIN_LIMIT) __trap();
                    }
                consumers_sync();
            }
            if (trace && b == 0 && threadIdx.x == 0) trace[4 * TMAXP + j] = globaltimer();
            if (mode & 4) {
            } else if (op.kind == EMBED) {
                const long long tok = __ldcg(token);
                for (int i = i0 + threadIdx.x; i < i1; i += NW * 32) op.y[i] = op.w[tok * op.k + i];
            } else {
                if (op.kind == RESID && nr > RES_MAX) __trap();
                input_to_smem(op, xs, eps, red, res_s, r0, nr);
                consumers_sync();
            }
            if (trace && b == 0 && threadIdx.x == 0) trace[4 * TMAXP + MAX_OPS + j] = globaltimer();
        }
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        const Geo q = geo(op);
        const int kv = op.k >> 3;
        for (int r = 0; r < nr; r += q.R, ++g, pc += q.P) {
            if (g % NW != (unsigned)warp) continue;
            const int rows = min(q.R, nr - r);
            float a[4][4] = {};
            for (int p = 0; p < q.P; ++p, ++f) {
                const int slot = warp * S + f % S;
                const unsigned pi = pc + p;  // the producer's number of this piece
                mbar_wait(&full[slot], (f / S) & 1);
                if (trace && b == 0 && lane == 0 && pi < TMAXP) trace[TMAXP + pi] = globaltimer();
                if (!(mode & 1)) {
                    const uint4 *w = reinterpret_cast<const uint4 *>(ring + slot * SLOT_BYTES);
                    if (q.P > 1) {
                        const int v0 = p * q.pv;
                        piece_dot<1, 4>(w, xs + v0, min(q.pv, kv - v0), 0, lane, a);
                    } else if (rows == 4) {
                        piece_dot<4, 1>(w, xs, kv, kv, lane, a);
                    } else if (rows == 3) {
                        piece_dot<3, 1>(w, xs, kv, kv, lane, a);
                    } else if (rows == 2) {
                        piece_dot<2, 2>(w, xs, kv, kv, lane, a);
                    } else {
                        piece_dot<1, 4>(w, xs, kv, kv, lane, a);
                    }
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[slot]);
                if (trace && b == 0 && lane == 0 && pi < TMAXP) trace[2 * TMAXP + pi] = globaltimer();
            }
            if (mode & 1) continue;
            float s[4];
#pragma unroll
            for (int qq = 0; qq < 4; ++qq) s[qq] = warp_sum(a[qq][0] + a[qq][1] + a[qq][2] + a[qq][3]);
            if (lane == 0) {
                const int row = r0 + r;  // first weight row of the unit
                if (op.kind == NORM) {
                    for (int qq = 0; qq < rows; ++qq) op.y[row + qq] = tobf(s[qq]);
                } else if (op.kind == RESID) {
                    for (int qq = 0; qq < rows; ++qq)
                        op.y[row + qq] = tobf(bf(res_s[r + qq]) + bf(tobf(s[qq])));
                } else if (op.kind == NORM_SILU) {
                    for (int qq = 0; qq + 1 < rows; qq += 2) {
                        const float gg = bf(tobf(s[qq])), u = bf(tobf(s[qq + 1]));
                        op.y[(row + qq) >> 1] = tobf(bf(tobf(silu(gg))) * u);
                    }
                } else {  // LM_ARGMAX: rows ascend within a warp, so `>` keeps the smaller index on ties
                    for (int qq = 0; qq < rows; ++qq) {
                        const float l = bf(tobf(s[qq]));
                        if (l > bv) { bv = l; bi = row + qq; }
                    }
                }
            }
        }
        if (mode & 1) continue;
        if (op.kind == LM_ARGMAX) {
            if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
            consumers_sync();
            if (threadIdx.x == 0) {
                for (int w = 1; w < NW; ++w)
                    if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) { bv = best_v[w]; bi = best_i[w]; }
                arg_val[b] = bv;
                arg_idx[b] = bi;
                __threadfence();
                if (times) times[(size_t)b * num_ops + j] = globaltimer();
                const unsigned done = atomicAdd(counters + j, 1u);
                if (done == (unsigned)G * epoch - 1) {  // the last block: the argmax over all blocks
                    __threadfence();
                    for (int g = 0; g < G; ++g) {
                        const float v = __ldcg(arg_val + g);
                        const int i = __ldcg(arg_idx + g);
                        if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
                    }
                    *token = bi;
                }
            }
        } else {  // the block's outputs of op j, released by thread 0 after the barrier (as a grid sync does)
            consumers_sync();
            if (threadIdx.x == 0) {
                if (times) times[(size_t)b * num_ops + j] = globaltimer();
                __threadfence();
                atomicAdd(counters + j, 1u);
            }
        }
    }
}
