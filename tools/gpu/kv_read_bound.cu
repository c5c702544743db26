// A lower bound for any decode attention over the head-major KV pool (tools/gpu/kv_read_bound.py; not a provider
// kernel: the script compiles it with nvcc at run time). `kv_read` reads exactly the bytes the decode attention reads
// from one layer's cache -- every cached token's k|v of every kv head, through the block table -- and does nothing
// with them: no scores, no softmax, no merge. Whatever it costs a decode layer, an attention reading the same pages
// costs at least that.
//
// Grid [NKV, S]: CTA (h, s) reads kv head h's 8 KB slices of pages [s·P/S, (s+1)·P/S) (P = ceil(seq_lens[0] / 16)),
// through a ring of KR_RING page slices in dynamic shared memory (KR_RING · 8 KB): every thread copies its 16-byte
// vectors of a page with cp.async (L2 only), one commit group per page, and waits only when KR_RING pages are in
// flight, so KR_RING · 8 KB stay in flight per CTA. Nothing reads the ring: the copies are the whole work. (Register
// loads would not do: ptxas interleaves the folds that keep them alive with the loads, which serializes a batch.) The
// CTA's block-table entries are read into shared memory first. `wait_first` 1: griddepcontrol.wait before the
// first copy (no page before the launch before it is done); 0: every copy before the wait (the most a PDL attention
// can overlap: its pages do not depend on the launch before it, only q and the current token's row do); 2: every
// page asked of L2 (cp.async.bulk.prefetch.L2, no shared memory) before the wait, the copies after it (what an
// attention that needs q before it can consume a page can overlap). Either way the CTA triggers its dependents at
// once (at entry; in mode 1 right after its wait). It writes its `out` word only when its share of pages exceeded
// KR_MAX_PAGES (pages left unread: the script refuses the run).
#include <stdint.h>

#ifndef KR_THREADS
#define KR_THREADS 256
#endif
#ifndef KR_RING
#define KR_RING 8
#endif
#define KR_SLICE 8192                        // one kv head's 16 tokens of k|v (bf16, D = 128)
#define KR_VECS (KR_SLICE / 16 / KR_THREADS)  // 16-byte vectors per thread per page
#define KR_MAX_PAGES 1024                    // block-table entries one CTA may hold (4 KB of shared memory)
static_assert(KR_SLICE % (16 * KR_THREADS) == 0, "a page slice must split evenly over the threads");

extern "C" __global__ void __launch_bounds__(KR_THREADS)
kv_read(const char* __restrict__ kv, const int* __restrict__ block_table, const int* __restrict__ seq_lens,
        unsigned* __restrict__ out, int page_bytes, int wait_first) {
    extern __shared__ __align__(16) unsigned char ring[];  // KR_RING slices, then the CTA's block-table entries
    int* pages = reinterpret_cast<int*>(ring + KR_RING * KR_SLICE);
    if (wait_first == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int P = (seq_lens[0] + 15) / 16;
    const int S = gridDim.y, s = blockIdx.y;
    const int p0 = (int)((long)P * s / S), total = (int)((long)P * (s + 1) / S) - p0, n = min(total, KR_MAX_PAGES);
    for (int i = threadIdx.x; i < n; i += KR_THREADS) pages[i] = block_table[p0 + i];
    __syncthreads();
    if (wait_first == 2) {  // every page asked of L2 (no shared memory), then the wait, then the copies
        for (int i = threadIdx.x; i < n; i += KR_THREADS)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(kv + (long)blockIdx.x * KR_SLICE +
                                                                               (long)pages[i] * page_bytes),
                         "r"(KR_SLICE) : "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    const char* head = kv + (long)blockIdx.x * KR_SLICE + threadIdx.x * 16;
    const unsigned dst0 = (unsigned)__cvta_generic_to_shared(ring) + threadIdx.x * 16;
    for (int i = 0; i < n; ++i) {
        if (i >= KR_RING) asm volatile("cp.async.wait_group %0;" ::"n"(KR_RING - 1) : "memory");
        const char* src = head + (long)pages[i] * page_bytes;
        const unsigned dst = dst0 + (i % KR_RING) * KR_SLICE;
#pragma unroll
        for (int j = 0; j < KR_VECS; ++j)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + j * 16 * KR_THREADS),
                         "l"(src + j * 16 * KR_THREADS) : "memory");
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (wait_first == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (total > KR_MAX_PAGES && threadIdx.x == 0) out[blockIdx.y * gridDim.x + blockIdx.x] = 1;  // pages left unread
}
