// Decode attention (one query token per sequence) over the paged bf16 KV cache, flash-decoding
// style, for every Qwen3 dense geometry: head_dim D = 128, G = NQ/NKV q heads per kv head
// (1 <= G <= DA_MAX_G = 8), shapes are runtime params.  Four entries, one module:
//
//   decode_attention_split + decode_attention_merge   one op, two launches (split-KV partial
//       results into impl scratch, then a merge); the partial layout is paged_decode_attention's.
//   decode_attention_cluster                           one launch: a thread-block cluster of 8
//       CTAs per (kv head, sequence) splits the keys and merges through distributed shared memory
//       (no scratch, no counters, no state).
//   decode_attention_rope_cluster                      the cluster form with qk_norm_rope_kv's decode
//       work fused in (q/k RMS norm, neox rotary, the token's k/v into the cache; see the entry).
//
// KV layout (tools/README.md; kernels-src/attention.py), head-major: pages of 16 tokens interleaved by layer,
// [page][layer][NKV][16 tokens][k|v][D] bf16, each token's 512-byte k|v row XOR-swizzled in 16-byte chunks.
// `kv` = state + layer*65536 (bytes), `page_bytes` = the byte stride between pages (L*65536).  Token slot t of
// physical page p, kv head h: its 512-byte row at kv + p*page_bytes + h*16*512 + t*512, whose 16-byte chunk
// c ^ (t & 7) holds logical chunk c (k: chunks 0..15, elements 8c..8c+7; v: chunks 16..31), so that one kv
// head's page is 8 KB contiguous (one bulk copy) and the shared-memory reads are free of bank conflicts
// without padding (NOTES.md 52, 58).  Logical page j of
// sequence b is block_table[b*bt_stride + j]; keys 0..L-1 (L = seq_lens[b] >= 1, the current token
// included) are attended.  q: bf16, head i of sequence b at q + b*q_stride + i*D.
//
// ABI (extern "C"; params in the manifest's type grammar, see kernels-src/README.md):
//
//   decode_attention_split(const bf16* q,          in  buffer<bf16> (16-byte aligned; q_stride % 8 == 0)
//                          const char* kv,         in  ptr (16-byte aligned; page_bytes % 512 == 0)
//                          const int*  block_table, in  buffer<i32> [seqs, bt_stride]
//                          const int*  seq_lens,   in  buffer<i32> [seqs]
//                          float*      part_acc,   out buffer<f32> [seqs, NQ, S, D]   (impl scratch)
//                          float*      part_ml,    out buffer<f32> [seqs, NQ, S, 2]   (impl scratch)
//                          int num_q_heads, int num_kv_heads, int q_stride, int bt_stride,
//                          int page_bytes, float sm_scale)
//     grid (NKV, S, seqs), S = gridDim.y = the scratch's split stride (1..64), block (128,1,1),
//     dynamic shared memory DA_SPLIT_SMEM (64.25 KB: three CTAs per SM).
//   decode_attention_merge(const float* part_acc, const float* part_ml, const int* seq_lens,
//                          bf16* out,              out buffer<bf16> [seqs, NQ*D]
//                          int num_q_heads, int num_splits)      num_splits = S of the split launch
//     grid (NQ, seqs, 1), block (128,1,1), no dynamic shared memory.
//   decode_attention_cluster(q, kv, block_table, seq_lens, bf16* out, int num_q_heads,
//                          int num_kv_heads, int q_stride, int bt_stride, int page_bytes, float sm_scale)
//     grid (NKV, 8, seqs) (grid.y must be 8: the compiled cluster is (1, 8, 1)), block (128,1,1),
//     dynamic shared memory DA_CLUSTER_SMEM (132.75 KB).
//   decode_attention_rope_cluster: the cluster form's grid and block; dynamic shared memory DA_ROPE_SMEM (132.75
//     KB in the plain module, 68.75 KB in the PDL module: a ring of DA_ROPE_SLOTS = 2 pages per warp there).
//
// Work split.  With n = ceil(L/16) pages, the split launch uses ns = splits_for(L, S) =
// min(S, 64, max(1, ceil(n / 4))) of its S CTAs per kv head (a short context uses few splits: at
// least 4 pages, one per warp, per split); CTAs s >= ns exit at once and write nothing, and the
// merge (which computes the same ns from seq_lens) reads only splits s < ns.  Warp w of split s takes
// logical pages j = s*4 + w + k*4*min(S, 64), k = 0, 1, ...: round-robin over the warps of ns splits
// (when ns < S every warp has at most one page), an assignment that does not depend on L, so the
// block-table entries are loaded (lane-parallel, 32 at a time) together with seq_lens.  The cluster
// launch does the same with 8 splits (its 8 CTAs, rank = split).
//
// Per warp (4 per CTA, independent until the CTA's merge): each page's K and V of this kv head (16
// tokens x 512 bytes, contiguous) stream into a private ring of shared-memory slots, one bulk copy per page
// (cp.async.bulk by lane 0, completion counted in bytes on the slot's mbarrier; the rows of tokens past L are
// zero-filled by the warp, never used), SLOTS pages in flight.  The scores use tensor
// cores (mma.sync m16n8k16 bf16 -> f32, the G q heads as rows 0..G-1 of a 16-row tile whose rows 8..15
// stay zero, the page's 16 tokens as two 8-column tiles), then an fp32 online softmax in base 2 (scores
// scaled by sm_scale*log2(e); running max m and sum l per q head; the accumulators are rescaled only
// when a running max grows), then P (rounded to bf16, as in flash attention and attention.py) times V,
// also on tensor cores, into fp32 accumulators.  A slot holds the page's rows as the cache does (DA_ROW = 512
// bytes, swizzled), and tokens are read in a fixed permutation (tok_perm), so that both the K reads (128-bit,
// two tokens per quarter warp) and the V reads (ldmatrix.trans, eight tokens per matrix) are free of bank
// conflicts.
// The 4 warps' (m, l, acc) are merged through shared memory; then
//   split:   the CTA's partial goes to part_acc/part_ml (layout of paged_decode_attention: row
//            (b*NQ + i)*S + s; m in log2 units, l = sum of 2^(score*log2e - m), acc = sum p v);
//   merge:   out = bf16(sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s), M = max_s m_s;
//   cluster: CTA r merges elements [r*G*16, (r+1)*G*16) of the kv head's G*128 outputs: every CTA
//            pushes its (m, l) and its acc of those elements into CTA r's shared memory (st.async
//            stores into the cluster's shared memory, after the cluster barrier every CTA passes at
//            entry, so every CTA of the cluster has started and armed its receive mbarrier with
//            the bytes it will get), then each CTA waits on its own receive mbarrier (acquire at
//            CTA scope: the bytes land in its own shared memory) and merges the 8 partials it received.
// Arithmetic: fp32 throughout (accumulation, softmax, merges), IEEE division for the final
// normalisation, one rounding per stored bf16.  exp2 is ex2.approx.ftz.f32 (weights below 2^-126
// of the running max are 0).
//
// PDL form (-DKERN_PDL, module decode_attention_pdl.cubin): the split kernel loads the
// block table and seq_lens (inputs), then griddepcontrol.wait, then launch_dependents, then everything
// else (q and the KV state are earlier launches' outputs); the merge triggers first, then waits.
// decode_attention_cluster (DA_PREWAIT, default 1; in the plain module there is no wait and the pages go before q's
// load) also issues each warp's first
// DA_PRE_PAGES (2) pages of K|V before the wait, so that they stream while the launch before it finishes; after the
// wait it loads q (and the warp whose early pages hold the current token, position L-1, reads that token's 512-byte
// row again, to write it over the row of its shared-memory copy of the page before attending to it: Inject), then
// issues the other DA_CLUSTER_SLOTS - DA_PRE_PAGES pages of its ring (issued before the wait, they would delay q's
// load, which queues behind them). Correct when no launch that can still be running when this one starts writes any
// other row of those pages: in kern's decode program with `gen_qwen3.py --decode-attention cluster` the launch
// before it, qk_norm_rope_kv_pdl, writes only row L-1 and executes launch_dependents only after its own wait, so
// every launch before that one (earlier layers, earlier steps, prefill) has completed when this one starts. Same
// bits as the plain form (the copy is the same bytes; only when they are read changes). H200, Qwen3-4B geometry
// (sessions 8-9, NOTES.md 29-30): after its prologue in a PDL chain it adds 3.2 us per layer at 130 cached tokens
// (4.1 without the early pages), 4.4 at 1,024 (5.1), 7.75-7.77 at 4,096 (8.2; 8.15 with all four ring pages early);
// kern-run 4B 2.81-2.82 ms/token at 4,096 (2.86-2.95 without). decode_attention_rope_cluster (the generator's
// default since session 8) does the same with its early pages (DA_ROPE_PRE_PAGES of them: in the PDL module since
// session 18 its whole ring, NOTES.md 54; since session 19 that ring is 2 pages, DA_ROPE_SLOTS, NOTES.md 55): the
// current token's row is the one it computes
// (Inject), whatever the copy read. Its launch follows the qkv GEMV, which triggers early, so earlier layers'
// kernels may still run (they write other layers' rows, other bytes of the same pages); no launch of a decode step
// but this one writes this layer's rows, and every launch of earlier runs (earlier steps, prefill) has completed
// before the step began: its first launch, the embedding, is an ordinary launch (no PDL attribute), which starts
// only once everything before it on the stream has completed. kern-run 4B 2.57 ms/token at 128 cached tokens in
// session 8 (2.62 for the cluster form after qk_norm_rope_kv_pdl, 2.66-2.69 for rope-cluster without early pages);
// right after its qkv GEMV it adds 3.5 us to a layer at 512 tokens and 10.1-10.2 at 4,096 (session 9, bench_kernels).
#include <cstdint>
#include <type_traits>
#include <cooperative_groups.h>
#include <cuda_bf16.h>

namespace cg = cooperative_groups;

// -DDA_NO_WAIT (a what-if build for timing only, like gemv.cu's -DGEMV_NO_WAIT; NOTES.md 61): the PDL forms skip
// griddepcontrol.wait and so read q, k and v before the qkv GEMV has written them; the trigger is unchanged.
#if defined(KERN_PDL) && !defined(DA_NO_WAIT)
#define DA_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define DA_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#elif defined(KERN_PDL)
#define DA_PDL_WAIT() \
    do {              \
    } while (0)
#define DA_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define DA_PDL_WAIT() \
    do {              \
    } while (0)
#define DA_PDL_TRIGGER() \
    do {                 \
    } while (0)
#endif

// Where the cluster kernels' PDL form executes launch_dependents (build option; the default cubins have 0):
//   0  right after griddepcontrol.wait: the next launch (the o-proj GEMV) starts its weight loads during the
//      attention (default)
//   1  after q (and the current token's row) are loaded, so that q's load does not queue behind them
//   2  after the CTA's pages (before the cluster merge)
//   3  never: the next launch starts as this one's CTAs exit
//   4  before griddepcontrol.wait (after the early pages are issued): the next launch may start while the launch
//      before this one still runs
// The next launch's griddepcontrol.wait still waits for this whole grid, and this grid for the one before it: any
// value is correct.
#ifndef DA_TRIGGER_AT
#define DA_TRIGGER_AT 0
#endif
static_assert(DA_TRIGGER_AT >= 0 && DA_TRIGGER_AT <= 4, "DA_TRIGGER_AT: 0, 1, 2, 3 or 4");
// -DDA_EARLY_TRIGGER_BELOW=T (with DA_TRIGGER_AT 0): the trigger after the wait only for a sequence of fewer than T
// cached tokens (L); longer ones execute none (as 3). Unset: always.
#ifdef DA_EARLY_TRIGGER_BELOW
static_assert(DA_TRIGGER_AT == 0, "DA_EARLY_TRIGGER_BELOW applies to the trigger after the wait (DA_TRIGGER_AT 0)");
#define DA_EARLY_TRIGGER_OK(L) ((L) < DA_EARLY_TRIGGER_BELOW)
#else
#define DA_EARLY_TRIGGER_OK(L) true
#endif
#define DA_TRIGGER_AT_POINT(N)                                                     \
    do {                                                                           \
        if constexpr (DA_TRIGGER_AT == (N)) {                                      \
            if ((N) != 0 || DA_EARLY_TRIGGER_OK(L)) DA_PDL_TRIGGER();              \
        }                                                                          \
    } while (0)

#define DA_D 128
#define DA_PAGE 16
#ifndef DA_WARPS  // warps per CTA (experiments: 8; the CTA's first 128 threads own the 128 output columns)
#define DA_WARPS 4
#endif
static_assert(DA_WARPS == 4 || DA_WARPS == 8, "DA_WARPS: 4 or 8");
#define DA_THREADS (DA_WARPS * 32)
#define DA_COLUMN_THREAD(d) (DA_THREADS == DA_D || (d) < DA_D)  // thread d owns output column d
#define DA_MAX_G 8
#define DA_MIN_PAGES_PER_SPLIT 4
#define DA_MAX_SPLITS 64
// The head-major KV layout (the header; NOTES.md 52, 58; the -DDA_BULK experiment until session 21): a page of one
// kv head is 8 KB contiguous, and one bulk copy brings it into its slot unpadded. Every other reader and writer of the
// cache (attention.py's kernels, tools/README.md's contract) uses the same layout.
#define DA_ROW 512  // a token's k|v, swizzled, in a slot (the global layout's bytes)
#define DA_BAR_BYTES (DA_WARPS * 8 * 8)  // one mbarrier per slot, up to 8 slots per warp, before the rings
// The cluster merge's pushes are st.async stores that count their bytes on the owner CTA's receive mbarrier (static
// shared memory, outside the dynamic layout; initialized and armed with the bytes to expect at entry, before the
// entry's cluster arrive, a release), and each CTA waits on its own mbarrier instead of a second cluster barrier
// (session 17, NOTES.md 53: the same bits, -0.2...-0.4 us per call). -DDA_MERGE_BARRIER builds the merge of sessions
// 3-16 for comparison: plain distributed-shared-memory stores, then a cluster barrier (release/acquire).
#ifndef DA_MERGE_BARRIER
__shared__ __align__(8) unsigned long long da_recv_bar;
#endif
#define DA_SLOT_BYTES (DA_PAGE * DA_ROW)  // one page of one kv head
#define DA_SPLIT_SLOTS 2
#ifndef DA_CLUSTER
#define DA_CLUSTER 8
#endif
#ifndef DA_CLUSTER_SLOTS
#define DA_CLUSTER_SLOTS 4
#endif
// The rope-cluster form's ring: DA_CLUSTER_SLOTS pages per warp, except in the PDL module (the decode program's form),
// where it is 2 (DA_ROPE_SMEM, 68.75 KB; 70.5 KB with the padded rows of sessions 19-20): with its launch's carveout 0
// the driver gives its SMs the 100 KB shared-memory configuration instead of the 164 KB that 4 slots need, and the
// GEMV blocks that run beside and after it there keep 156 KB of L1 instead of 92 (H200, session 19, NOTES.md 55: 4B
// decode -0.028 ms/token at 128 cached tokens, -0.016 at 4,096; without the carveout the driver picks 228 KB to fit
// three 70 KB CTAs per SM, +0.13).
#ifndef DA_ROPE_SLOTS
#ifdef KERN_PDL
#define DA_ROPE_SLOTS 2
#else
#define DA_ROPE_SLOTS DA_CLUSTER_SLOTS
#endif
#endif
static_assert(DA_ROPE_SLOTS >= 1 && DA_ROPE_SLOTS <= 8, "DA_ROPE_SLOTS: 1 to 8 pages per warp");
// Of a warp's first SLOTS pages, those issued before after_issue() (the PDL wait and q's load; plain: q's load), then
// the rest: DA_PRE_PAGES for the split and cluster forms (2), DA_ROPE_PRE_PAGES for the rope-cluster form (its PDL form:
// the whole ring since session 18, 4 pages then, DA_ROPE_SLOTS = 2 since 19; NOTES.md 54: it follows the qkv GEMV, whose
// row passes leave its CTAs room to be resident and stream them while it runs; the cluster form follows qk_norm_rope_kv,
// where 4 cost ~0.4 us per layer at 4,096 tokens: its q load queues behind them). -DDA_PRE_PAGES=N alone sets both.
#ifdef DA_PRE_PAGES
#ifndef DA_ROPE_PRE_PAGES
#define DA_ROPE_PRE_PAGES DA_PRE_PAGES
#endif
#else
#define DA_PRE_PAGES 2
#ifndef DA_ROPE_PRE_PAGES
#ifdef KERN_PDL
#define DA_ROPE_PRE_PAGES DA_ROPE_SLOTS
#else
#define DA_ROPE_PRE_PAGES 2
#endif
#endif
#endif
// The cluster forms' first pages before the PDL wait and q's load (see the header). Both modules since session 21: in
// the plain module (no wait) they go out before q's load, which was 1 us per call faster back to back at 4,096 tokens
// with bulk copies (NOTES.md 59); -DDA_PREWAIT=0 loads q first.
#ifndef DA_PREWAIT
#define DA_PREWAIT 1
#endif

// Dynamic shared memory: the warps' rings of page slots and (cluster) the partials the other CTAs of the
// cluster push (m, l of each q head from each CTA, and their acc of this CTA's slice of the outputs).
#define DA_RECV_FLOATS (DA_CLUSTER * (2 * DA_MAX_G + DA_MAX_G * DA_D / DA_CLUSTER))
// cluster_merge gives each thread of a CTA one of its slice's outputs (G * D / DA_CLUSTER of them, G <= DA_MAX_G)
static_assert(DA_MAX_G * DA_D / DA_CLUSTER <= DA_WARPS * 32,
              "DA_CLUSTER too small: a CTA's slice of the merge (DA_MAX_G * 128 / DA_CLUSTER outputs) must fit its "
              "threads, so DA_CLUSTER >= 8 with DA_MAX_G 8");
#define DA_SPLIT_SMEM (DA_BAR_BYTES + DA_WARPS * DA_SPLIT_SLOTS * DA_SLOT_BYTES)
#define DA_CLUSTER_SMEM (DA_BAR_BYTES + DA_WARPS * DA_CLUSTER_SLOTS * DA_SLOT_BYTES + DA_RECV_FLOATS * 4)
#define DA_ROPE_SMEM (DA_BAR_BYTES + DA_WARPS * DA_ROPE_SLOTS * DA_SLOT_BYTES + DA_RECV_FLOATS * 4)
static_assert(DA_CLUSTER_SLOTS <= 8 && DA_SPLIT_SLOTS <= 8, "at most 8 slots (mbarriers) per warp");
// The per-warp merge area (m[8], l[8], acc[8][128] floats per warp) overlays the ring once every warp
// is done with it.
#define DA_RED_FLOATS (2 * DA_MAX_G + DA_MAX_G * DA_D)

static_assert(DA_WARPS * DA_RED_FLOATS * 4 <= DA_WARPS * DA_SPLIT_SLOTS * DA_SLOT_BYTES, "merge area fits the ring");
static_assert(DA_WARPS * DA_RED_FLOATS * 4 <= DA_WARPS * DA_ROPE_SLOTS * DA_SLOT_BYTES,
              "merge area fits the rope-cluster form's ring");

typedef __nv_bfloat16 bf16;

#ifdef DA_TIMELINE
// Diagnostic build (-DDA_TIMELINE; tools/gpu/da_timeline.py): %globaltimer (ns) stamped by lane 0 of each warp of
// the cluster forms (kv heads < 8, sequence 0) at 8 points — entry, seq_lens and block table loaded, the first
// pages' copies issued, first page in shared memory (q is loaded by then too), page loop done, CTA merge done,
// the cluster's partials in (DA_MERGE_BARRIER: cluster barrier passed), exit — at
// da_timeline[((h * 8 + rank) * DA_WARPS + warp) * 8 + point]. `dep`: a register the stamp must wait for.
extern "C" {
__device__ unsigned long long da_timeline[8 * 8 * DA_WARPS * 8];  // unmangled: cuModuleGetGlobal
}
#define DA_STAMP(point, dep)                                                                                   \
    do {                                                                                                       \
        if ((threadIdx.x & 31) == 0 && gridDim.y == 8 && blockIdx.x < 8 && blockIdx.z == 0) {                 \
            unsigned long long t_;                                                                             \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_) : "r"(int(dep)));                             \
            da_timeline[((blockIdx.x * 8 + blockIdx.y) * DA_WARPS + (threadIdx.x >> 5)) * 8 + (point)] = t_;   \
        }                                                                                                      \
    } while (0)
#else
#define DA_STAMP(point, dep) \
    do {                     \
    } while (0)
#endif

__device__ __forceinline__ int splits_for(int L, int S) {
    const int n = (L + DA_PAGE - 1) / DA_PAGE;
    const int want = (n + DA_MIN_PAGES_PER_SPLIT - 1) / DA_MIN_PAGES_PER_SPLIT;
    return max(1, min(min(S, DA_MAX_SPLITS), want));
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// A partial result's weight in a merge: 2^(m - mm) for its running max m (log2 domain) against the merged max mm; 0
// for a part that saw no key (m = -inf).
__device__ __forceinline__ float merge_weight(float m, float mm) { return m == -INFINITY ? 0.f : ex2(m - mm); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// mbarrier and bulk copy (PTX ISA 8.0, sm_90), as gemv.cu's TMA form
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n\t}" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_page(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(bar) : "memory");
}

// d += A(16x16) x B(16x8), A's rows 8..15 zero (a1 = a3 = 0): a0 = row g cols 2t..2t+1, a2 = row g cols
// 2t+8..2t+9; b0 = rows 2t..2t+1, b1 = rows 2t+8..2t+9 of col g; d0, d1 = row g cols 2t, 2t+1, d2, d3 =
// row g+8 (zero in, zero out: the accumulators of rows 8..15 stay zero, so no register is rezeroed).
__device__ __forceinline__ void mma16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Tokens of a page are read in the order pi(g) = (g>>1) | (g&1)<<2 within each half (0 4 1 5 2 6 3 7): the
// quarter warp reading k for tokens pi(2q), pi(2q+1) = q, q+4 then hits the two 64-byte halves of the banks,
// and, with the rows' chunk swizzle (warp_attend), ldmatrix's eight rows (tokens 0..7 in any order) hit distinct
// banks.
__device__ __forceinline__ int tok_perm(int g) { return (g >> 1) | ((g & 1) << 2); }

struct Geo {
    const char* kvh;      // kv + h*16*512: this kv head's row of token slot 0 of page 0
    const int* bt;        // this sequence's block-table row
    int64_t page_bytes;
    int L;                // keys
    int npages;
    float scale;          // sm_scale * log2(e)
};

// One warp's share: logical pages j = first + k*step (k < count); bt_reg: lane i holds the block-table
// entry of page first + i*step (where i < count).  Its ring: SLOTS page slots at `ring`.  Leaves (m, l, acc) of the q heads rows g = lane/4 (0..7; rows >= G are
// padding) for columns d = 8*nt + 2*(lane%4) + {0,1} (acc[nt][0..1]; acc[nt][2..3] are rows 8..15: zero).
// The current token's k|v row (decode_attention_rope_cluster): lane i's 16 bytes of the 512-byte row
// (k bytes 16i.., then v), written over row `row` of page k = `page` of the warp's list once that page is in
// shared memory (the copy from the cache may predate this launch's write of the row). page < 0: none.
struct Inject {
    int page;
    int row;
    uint4 val;
};

// Page k of a warp's list -> slot k % SLOTS of its ring: one bulk copy of the page's valid rows (512 bytes each) by
// lane 0, counted on the slot's mbarrier; the rows of tokens past L are zero-filled by the warp (never read).
// bt_reg: lane i holds the block-table entry of page k0 + i of the list, k0 = 32*floor(k/32) (refilled at k = 32,
// 64, ...; calls come in increasing k).
template <int SLOTS>
__device__ __forceinline__ void issue_page(const Geo& geo, int first, int step, int count, int& bt_reg, uint32_t ring,
                                           uint32_t bars, int k) {
    const int lane = threadIdx.x & 31;
    if (k < count) {  // warp-uniform
        if ((k & 31) == 0 && k > 0) {
            const int kk = k + lane;
            bt_reg = kk < count ? __ldg(geo.bt + first + kk * step) : 0;
        }
        const int phys = __shfl_sync(0xffffffffu, bt_reg, k & 31);
        const int valid = min(DA_PAGE, geo.L - (first + k * step) * DA_PAGE);
        // one bulk copy of the page's valid rows (8 KB for a full page); the rows past L are zeroed by the warp
        // (their v is multiplied by p = 0: stale bytes could be NaN)
        const uint32_t dst = ring + uint32_t(k % SLOTS) * DA_SLOT_BYTES;
        if (valid < DA_PAGE) {
            for (int t = valid; t < DA_PAGE; ++t)
                asm volatile("st.shared.v4.u32 [%0], {%1,%1,%1,%1};\n" ::"r"(dst + uint32_t(t * DA_ROW + lane * 16)),
                             "r"(0u) : "memory");
            __syncwarp();
        }
        if (lane == 0) {
            // a refill: the warp's generic-proxy reads of the slot (ordered before this by the caller's __syncwarp)
            // before the bulk copy's async-proxy writes to it (as gemv.cu's TMA form before each refill)
            if (k >= SLOTS) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bulk_page(dst, geo.kvh + int64_t(phys) * geo.page_bytes, uint32_t(valid * DA_ROW),
                      bars + uint32_t(k % SLOTS) * 8);
        }
    }
}

// The warp issues its first min(PRE, SLOTS) pages (PRE: DA_PRE_PAGES; rope-cluster form: DA_ROPE_PRE_PAGES), calls
// after_issue() (the PDL form's wait and q load), issues the rest of its first SLOTS pages, then runs the page loop.
// The split and cluster forms issue two pages before the hook, not all four: the q load after the wait queues behind
// every copy issued before it (H200, session 9, NOTES.md 30: at 4,096 tokens the cluster form after its prologue
// 7.75 us per layer with two, 8.15 with four; session 18: 7.55 / 7.96). The rope-cluster form's PDL build issues all
// four: after the row-pass qkv GEMV its CTAs can be resident while the GEMV streams (NOTES.md 54).
struct NoHook {
    __device__ __forceinline__ void operator()() const {}
};

template <int SLOTS, bool INJECT = false, int PRE = DA_PRE_PAGES, class AfterIssue = NoHook>
__device__ __forceinline__ void warp_attend(const Geo& geo, int first, int step, int count, int bt_reg,
                                            const uint32_t (&qa)[4][4], uint32_t ring, uint32_t bars, float& m, float& l,
                                            float (&acc)[16][4], const Inject& inj = Inject{-1, 0, {}},
                                            const AfterIssue& after_issue = AfterIssue{}) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    m = -INFINITY;
    l = 0.f;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    // this lane's reads inside a slot: k of token 8*jt + pi(g), 16-byte chunk 4*kp + tig (+ jt*8 rows,
    // + kp*64 bytes); v rows for ldmatrix: lane r of matrix mi gives token (mi&1)*8 + pi(r), chunk 2*n2 + mi/2
    const int mi = lane >> 3;
    // swizzled rows: logical chunk c of token t at chunk c ^ (t & 7). K: token 8*jt + sp (sp = pi(g)), chunk 4*kp +
    // tig -> 4*(kp ^ (sp >> 2)) + (tig ^ (sp & 3)): kp even at k_e + 64*kp, odd at k_o + 64*kp. V: token (mi&1)*8 + sv
    // (sv = pi(lane&7)), chunk 16 + 2*n2 + (mi>>1) -> 16 + 2*(n2 ^ (sv >> 1)) + ((mi>>1) ^ (sv & 1)): n2 at
    // v_r[n2 & 3] + 32*(n2 & 4).
    const int sp = tok_perm(g), sv = tok_perm(lane & 7);
    const uint32_t k_row = uint32_t(sp * DA_ROW + (tig ^ (sp & 3)) * 16), kx = uint32_t((sp >> 2) * 64);
    const uint32_t k_e = k_row + kx, k_o = k_row - kx;
    const uint32_t v_row = uint32_t((((mi & 1) << 3) + sv) * DA_ROW + 256 + (((mi >> 1) ^ (sv & 1)) * 16));
    uint32_t v_r[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) v_r[r] = v_row + uint32_t((r ^ (sv >> 1)) * 32);
    // lane 0 initializes every slot's mbarrier itself: fence.mbarrier_init covers only the mbarrier.init operations
    // of the thread that executes it (as gemv.cu's TMA form)
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) mbar_init(bars + uint32_t(i * 8), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();

#pragma unroll
    for (int k = 0; k < (PRE < SLOTS ? PRE : SLOTS); ++k)
        issue_page<SLOTS>(geo, first, step, count, bt_reg, ring, bars, k);
    DA_STAMP(2, 0);
    after_issue();
#pragma unroll
    for (int k = PRE; k < SLOTS; ++k) issue_page<SLOTS>(geo, first, step, count, bt_reg, ring, bars, k);

#ifdef DA_PAIR
#ifdef DA_NO_MATH
#error "DA_NO_MATH applies to the default page loop, not to DA_PAIR's"
#endif
    // -DDA_PAIR (experiment, NOTES.md 52): N = 2 pages per step (a last odd page alone): their scores' eight
    // independent MMA chains interleave, one max reduction and at most one rescale for both, then both P*V. The
    // probabilities use the running max after both pages (not after each), so the bits differ from the default.
    // The default loop below keeps its own copy of this code: routed through page_step with N = 1, the same
    // operations compile to other instructions, and the default cubins are pinned (examples/*.json).
    const auto page_step = [&](int k, auto n) {
        constexpr int N = decltype(n)::value;
#pragma unroll
        for (int i = 0; i < N; ++i) mbar_wait(bars + uint32_t((k + i) % SLOTS) * 8, uint32_t((k + i) / SLOTS) & 1u);
        if (k == 0) DA_STAMP(3, k);
        uint32_t base[N];
        int valid[N];
#pragma unroll
        for (int i = 0; i < N; ++i) {
            base[i] = ring + uint32_t((k + i) % SLOTS) * DA_SLOT_BYTES;
            valid[i] = min(DA_PAGE, geo.L - (first + (k + i) * step) * DA_PAGE);
            if (INJECT && k + i == inj.page) {  // warp-uniform
                asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(base[i] + uint32_t(inj.row * DA_ROW + lane * 16)),
                             "r"(inj.val.x), "r"(inj.val.y), "r"(inj.val.z), "r"(inj.val.w) : "memory");
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                __syncwarp();
            }
        }
        float s[N][2][2];
#pragma unroll
        for (int i = 0; i < N; ++i) {
#pragma unroll
            for (int jt = 0; jt < 2; ++jt) {
                float e[4] = {0.f, 0.f, 0.f, 0.f}, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int kp = 0; kp < 4; ++kp) {
                    const uint4 k4 = lds128(base[i] + ((kp & 1) ? k_o : k_e) + jt * 8 * DA_ROW + kp * 64);
                    mma16(e, qa[kp][0], qa[kp][1], k4.x, k4.y);
                    mma16(o, qa[kp][2], qa[kp][3], k4.z, k4.w);
                }
                const int c = 8 * jt + tig;
                s[i][jt][0] = c < valid[i] ? (e[0] + o[0]) * geo.scale : -INFINITY;
                s[i][jt][1] = c + 4 < valid[i] ? (e[1] + o[1]) * geo.scale : -INFINITY;
            }
        }
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < N; ++i) mx = fmaxf(mx, fmaxf(fmaxf(s[i][0][0], s[i][0][1]), fmaxf(s[i][1][0], s[i][1][1])));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);
        if (__any_sync(0xffffffffu, m_new > m)) {
            const float alpha = m_new > m ? ex2(m - m_new) : 1.f;
            l *= alpha;
#pragma unroll
            for (int nt = 0; nt < 16; ++nt) {
                acc[nt][0] *= alpha;
                acc[nt][1] *= alpha;
            }
            m = m_new;
        }
        uint32_t pa0[N], pa2[N];
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const float p00 = ex2(s[i][0][0] - m), p01 = ex2(s[i][0][1] - m);
            const float p10 = ex2(s[i][1][0] - m), p11 = ex2(s[i][1][1] - m);
            l += (p00 + p01) + (p10 + p11);
            pa0[i] = pack_bf16(p00, p01);
            pa2[i] = pack_bf16(p10, p11);
        }
#pragma unroll
        for (int i = 0; i < N; ++i) {
#pragma unroll
            for (int n2 = 0; n2 < 8; ++n2) {
                uint32_t b[4];
                ldsm_x4_trans(b, base[i] + v_r[n2 & 3] + (n2 & 4) * 32);
                mma16(acc[2 * n2], pa0[i], pa2[i], b[0], b[1]);
                mma16(acc[2 * n2 + 1], pa0[i], pa2[i], b[2], b[3]);
            }
        }
        __syncwarp();  // every lane is done with the slots before they are refilled
#pragma unroll
        for (int i = 0; i < N; ++i) issue_page<SLOTS>(geo, first, step, count, bt_reg, ring, bars, k + i + SLOTS);
    };
    static_assert(SLOTS >= 2, "DA_PAIR needs two slots per warp");
    int k = 0;
    for (; k + 1 < count; k += 2) page_step(k, std::integral_constant<int, 2>{});
    if (k < count) page_step(k, std::integral_constant<int, 1>{});
    cp_async_wait<0>();  // a no-op (pages come by bulk copy), kept: the cubin is the one measured (NOTES.md 59)
#else
    for (int k = 0; k < count; ++k) {
        mbar_wait(bars + uint32_t(k % SLOTS) * 8, uint32_t(k / SLOTS) & 1u);  // page k's bytes have landed
        if (k == 0) DA_STAMP(3, k);
        const uint32_t base = ring + uint32_t(k % SLOTS) * DA_SLOT_BYTES;
        const int valid = min(DA_PAGE, geo.L - (first + k * step) * DA_PAGE);
        if (INJECT && k == inj.page) {  // warp-uniform
            asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(base + uint32_t(inj.row * DA_ROW + lane * 16)),
                         "r"(inj.val.x), "r"(inj.val.y), "r"(inj.val.z), "r"(inj.val.w) : "memory");
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before a later bulk copy into the slot
            __syncwarp();
        }

#ifdef DA_NO_MATH
        // diagnostic build (wrong outputs): the page stream and the merges without the page's math
        __syncwarp();
        issue_page<SLOTS>(geo, first, step, count, bt_reg, ring, bars, k + SLOTS);
        continue;
#endif
        // scores S[g][n] of n-tile jt, n = 2*tig + {0,1}: tokens 8*jt + pi(n) = 8*jt + tig + {0, 4}
        float s[2][2];
#pragma unroll
        for (int jt = 0; jt < 2; ++jt) {
            float e[4] = {0.f, 0.f, 0.f, 0.f}, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int kp = 0; kp < 4; ++kp) {
                const uint4 k4 = lds128(base + ((kp & 1) ? k_o : k_e) + jt * 8 * DA_ROW + kp * 64);
                mma16(e, qa[kp][0], qa[kp][1], k4.x, k4.y);
                mma16(o, qa[kp][2], qa[kp][3], k4.z, k4.w);
            }
            const int c = 8 * jt + tig;
            s[jt][0] = c < valid ? (e[0] + o[0]) * geo.scale : -INFINITY;
            s[jt][1] = c + 4 < valid ? (e[1] + o[1]) * geo.scale : -INFINITY;
        }
        float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);  // finite: every page has a key
        // rescale only when some row's running max grew (a row whose max did not grow has alpha = 1 exactly)
        if (__any_sync(0xffffffffu, m_new > m)) {
            const float alpha = m_new > m ? ex2(m - m_new) : 1.f;
            l *= alpha;
#pragma unroll
            for (int nt = 0; nt < 16; ++nt) {
                acc[nt][0] *= alpha;
                acc[nt][1] *= alpha;
            }
            m = m_new;
        }
        const float p00 = ex2(s[0][0] - m), p01 = ex2(s[0][1] - m);
        const float p10 = ex2(s[1][0] - m), p11 = ex2(s[1][1] - m);
        l += (p00 + p01) + (p10 + p11);  // this lane's columns; the quad is summed at the end
        const uint32_t pa0 = pack_bf16(p00, p01), pa2 = pack_bf16(p10, p11);
#pragma unroll
        for (int n2 = 0; n2 < 8; ++n2) {
            uint32_t b[4];
            ldsm_x4_trans(b, base + v_r[n2 & 3] + (n2 & 4) * 32);
            mma16(acc[2 * n2], pa0, pa2, b[0], b[1]);
            mma16(acc[2 * n2 + 1], pa0, pa2, b[2], b[3]);
        }
        __syncwarp();  // every lane is done with the slot before it is refilled
        issue_page<SLOTS>(geo, first, step, count, bt_reg, ring, bars, k + SLOTS);
    }
    cp_async_wait<0>();  // a no-op (pages come by bulk copy), kept: the cubin is the one measured (NOTES.md 59)
#endif
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
}

// The CTA's share: warp w takes logical pages gw + k*step (gw: its global warp index), merged over the 4
// warps.  On return thread d (0..127) holds, for each q head g < G of the group, M[g] (log2 units; -inf when the CTA had no key), Lsum[g] and
// A[g] for column d.  Every thread of the CTA must call it (it has block barriers).
template <int SLOTS, bool INJECT = false, int PRE = DA_PRE_PAGES, class AfterIssue = NoHook>
__device__ __forceinline__ void cta_attend(const Geo& geo, int gw, int step, int bt_reg, int G,
                                           const uint32_t (&qa)[4][4], float* smem, float (&M)[DA_MAX_G],
                                           float (&Ls)[DA_MAX_G], float (&A)[DA_MAX_G],
                                           const Inject& inj = Inject{-1, 0, {}},
                                           const AfterIssue& after_issue = AfterIssue{}) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int count = geo.npages > gw ? (geo.npages - gw - 1) / step + 1 : 0;
    // smem: the warps' mbarriers (DA_BAR_BYTES), then the rings (the merge area overlays them)
    const uint32_t ring = uint32_t(__cvta_generic_to_shared(smem)) + uint32_t(warp * SLOTS * DA_SLOT_BYTES);
    const uint32_t bars = uint32_t(__cvta_generic_to_shared(smem)) - DA_BAR_BYTES + uint32_t(warp * 8 * 8);
    float m, l, acc[16][4];
    warp_attend<SLOTS, INJECT, PRE>(geo, gw, step, count, bt_reg, qa, ring, bars, m, l, acc, inj, after_issue);
    DA_STAMP(4, __float_as_int(l));

    __syncthreads();  // every warp is done with the ring: the merge area overlays it
    float* red = smem + warp * DA_RED_FLOATS;
    const int g = lane >> 2, tig = lane & 3;
    if (tig == 0) {
        red[g] = m;
        red[DA_MAX_G + g] = l;
    }
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
        *reinterpret_cast<float2*>(red + 2 * DA_MAX_G + g * DA_D + 8 * nt + 2 * tig) = make_float2(acc[nt][0], acc[nt][1]);
    __syncthreads();
    const int d = threadIdx.x;
#pragma unroll
    for (int gg = 0; gg < DA_MAX_G; ++gg) {
        if (gg >= G) break;
        float mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < DA_WARPS; ++w) mm = fmaxf(mm, smem[w * DA_RED_FLOATS + gg]);
        float ls = 0.f, a = 0.f;
        if (mm != -INFINITY) {
#pragma unroll
            for (int w = 0; w < DA_WARPS; ++w) {
                const float* rw = smem + w * DA_RED_FLOATS;
                const float mw = rw[gg];
                const float wt = merge_weight(mw, mm);
                ls += wt * rw[DA_MAX_G + gg];
                a += wt * rw[2 * DA_MAX_G + gg * DA_D + d];
            }
        }
        M[gg] = mm;
        Ls[gg] = ls;
        A[gg] = a;
    }
    DA_STAMP(5, __float_as_int(A[0]));
}

// q fragments of the group's heads (rows g = lane/4 < G; zero rows above): for k-step pair kp, the 16
// bytes q[g][32kp + 8t .. +7] (t = lane%4) are the A operand's (a0, a2) of k-step 2kp and of 2kp+1, the
// same permutation of head_dim as the K reads (the dot product does not depend on the order).
__device__ __forceinline__ void load_q(const bf16* q, int64_t b, int q_stride, int h, int G, uint32_t (&qa)[4][4]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const uint4* qp = reinterpret_cast<const uint4*>(q + b * q_stride + int64_t(h * G + g) * DA_D + 8 * tig);
#pragma unroll
    for (int kp = 0; kp < 4; ++kp) {
        const uint4 v = g < G ? __ldcg(qp + 4 * kp) : make_uint4(0, 0, 0, 0);
        qa[kp][0] = v.x;
        qa[kp][1] = v.y;
        qa[kp][2] = v.z;
        qa[kp][3] = v.w;
    }
}

// Lane i: the block-table entry of logical page gw + i*step, read only inside the row (bt_stride entries);
// entries past the sequence's pages may be junk and are never used.
__device__ __forceinline__ int load_bt(const int* bt_row, int bt_stride, int gw, int step) {
    const int j = gw + (threadIdx.x & 31) * step;
    return j < bt_stride ? __ldg(bt_row + j) : 0;
}

// Where kv head h's rows lie does not depend on the head count (the head-major layout): a page's 16 rows of h at
// kv + page*page_bytes + h*16*512, each DA_ROW (512) bytes.
__device__ __forceinline__ Geo make_geo(const char* kv, const int* block_table, int64_t b, int bt_stride, int h,
                                        int page_bytes, int L, float sm_scale) {
    Geo geo;
    geo.kvh = kv + h * (DA_PAGE * 512);
    geo.bt = block_table + b * bt_stride;
    geo.page_bytes = page_bytes;
    geo.L = L;
    geo.npages = (L + DA_PAGE - 1) / DA_PAGE;
    geo.scale = sm_scale * 1.4426950408889634f;
    return geo;
}

extern "C" __global__ void __launch_bounds__(DA_THREADS)
decode_attention_split(const bf16* __restrict__ q, const char* __restrict__ kv, const int* __restrict__ block_table,
                       const int* __restrict__ seq_lens, float* __restrict__ part_acc, float* __restrict__ part_ml,
                       int num_q_heads, int num_kv_heads, int q_stride, int bt_stride, int page_bytes, float sm_scale) {
    extern __shared__ __align__(128) float smem_all[];
    float* smem = smem_all + DA_BAR_BYTES / 4;  // the rings, after the mbarriers
    const int h = blockIdx.x, s = blockIdx.y, S = gridDim.y;
    const int64_t b = blockIdx.z;
    const int G = num_q_heads / num_kv_heads;
    // Page k of warp w of split s is logical page gw + k*step (gw = s*4 + w, step = 4*min(S, 64)), the
    // assignment of ns = splits_for(L, S) splits (when ns < S every warp has at most one page, gw): it
    // does not depend on L, so the block-table loads go out with the seq_lens load.
    const int gw = s * DA_WARPS + (threadIdx.x >> 5), step = DA_WARPS * min(S, DA_MAX_SPLITS);
    const int bt_reg = load_bt(block_table + b * bt_stride, bt_stride, gw, step);
    const int L = __ldg(seq_lens + b);
    DA_PDL_WAIT();
    DA_PDL_TRIGGER();
    uint32_t qa[4][4];
    load_q(q, b, q_stride, h, G, qa);
    const int ns = splits_for(L, S);
    if (s >= ns) return;
    const Geo geo = make_geo(kv, block_table, b, bt_stride, h, page_bytes, L, sm_scale);
    float M[DA_MAX_G], Ls[DA_MAX_G], A[DA_MAX_G];
    cta_attend<DA_SPLIT_SLOTS>(geo, gw, step, bt_reg, G, qa, smem, M, Ls, A);
    const int d = threadIdx.x;
#pragma unroll
    for (int gg = 0; gg < DA_MAX_G; ++gg) {
        if (gg >= G) break;
        const int64_t row = (b * num_q_heads + h * G + gg) * S + s;
        if (DA_COLUMN_THREAD(d)) part_acc[row * DA_D + d] = A[gg];
        if (d == 0) *reinterpret_cast<float2*>(part_ml + row * 2) = make_float2(M[gg], Ls[gg]);
    }
}

extern "C" __global__ void __launch_bounds__(DA_D)
decode_attention_merge(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                       const int* __restrict__ seq_lens, bf16* __restrict__ out, int num_q_heads, int num_splits) {
    // The ns partial rows (512 bytes each, cp.async) and their (m, l) (L2 loads) are all requested before
    // the first wait: one round trip to L2 after seq_lens, whatever ns is.
    __shared__ __align__(16) float acc_s[DA_MAX_SPLITS * DA_D];
    __shared__ float2 ml_s[DA_MAX_SPLITS];
    DA_PDL_TRIGGER();
    DA_PDL_WAIT();
    const int j = blockIdx.x;
    const int64_t b = blockIdx.y;
    const int d = threadIdx.x, lane = threadIdx.x & 31;
    const int ns = splits_for(__ldg(seq_lens + b), num_splits);
    const int64_t base = (b * num_q_heads + j) * num_splits;
    const char* src = reinterpret_cast<const char*>(part_acc + base * DA_D);
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(acc_s));
    for (int c = d; c < ns * (DA_D / 4); c += DA_D) cp_async16(dst + c * 16, src + c * 16, 16u);
    if (d < ns) ml_s[d] = __ldcg(reinterpret_cast<const float2*>(part_ml) + base + d);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    const float2 ml0 = lane < ns ? ml_s[lane] : make_float2(-INFINITY, 0.f);
    const float2 ml1 = lane + 32 < ns ? ml_s[lane + 32] : make_float2(-INFINITY, 0.f);
    float mm = fmaxf(ml0.x, ml1.x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    const float w0 = merge_weight(ml0.x, mm);
    const float w1 = merge_weight(ml1.x, mm);
    float ls = w0 * ml0.y + w1 * ml1.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, o);
    float acc = 0.f;
    for (int s = 0; s < ns; ++s) acc += __shfl_sync(0xffffffffu, s < 32 ? w0 : w1, s & 31) * acc_s[s * DA_D + d];
    out[(b * num_q_heads + j) * DA_D + d] = __float2bfloat16_rn(acc / ls);
}

// The cluster's merge, after cta_attend in every CTA: this CTA (rank s) pushes its partial to the CTAs that
// merge it (CTA r merges elements [r*G*16, (r+1)*G*16) of the kv head's G*128 outputs): (m, l) of every q
// head to every CTA, each acc element to its owner, into their `recv` areas (outside the ring: a CTA still
// streaming pages is not disturbed).  Distributed shared memory is written only after every CTA of the
// cluster has started (the cluster barrier each kernel passes at entry, after arming its receive mbarrier
// da_recv_bar with the 8 * (2G + 16G) * 4 bytes it will receive).  The pushes are st.async stores, each
// counting its 4 bytes on the owner's mbarrier; each CTA then waits for its own bytes (the mbarrier's phase 0,
// acquire at CTA scope; no CTA leaves before every push to it has landed) and writes its slice of out_h
// (the G*128 outputs of this kv head).  -DDA_MERGE_BARRIER: plain stores, then a cluster barrier.
// cluster_merge's output: element e = gg * D + dd of the kv head's G heads from the cluster's merged (max, sum, acc);
// the default stores acc / sum as bf16 (the two-halves build, DA_HALVES, hands the triple to the pair merge).
struct StoreOut {
    bf16* out_h;
    __device__ __forceinline__ void operator()(int e, float, float ls, float acc) const {
        out_h[e] = __float2bfloat16_rn(acc / ls);
    }
};
template <int SLOTS, class Emit = StoreOut>  // the form's ring: `recv` follows it
__device__ __forceinline__ void cluster_merge(cg::cluster_group& cluster, float* smem, int s, int G,
                                              const float (&M)[DA_MAX_G], const float (&Ls)[DA_MAX_G],
                                              const float (&A)[DA_MAX_G], bf16* out_h, const Emit& emit = Emit{}) {
    float* recv = smem + DA_WARPS * SLOTS * DA_SLOT_BYTES / 4;
    const int d = threadIdx.x;
    const int per = G * (DA_D / DA_CLUSTER);
#ifndef DA_MERGE_BARRIER
    {  // (the cluster barrier's wait, before any push, is cluster_entry's)
        // st.async to rank r's `recv` (the same offset in every CTA), counted on rank r's receive mbarrier
        const uint32_t recv_a = uint32_t(__cvta_generic_to_shared(recv));
        const uint32_t bar_a = uint32_t(__cvta_generic_to_shared(&da_recv_bar));
        const auto push = [&](int rank, int idx, float v) {
            uint32_t ra, rb;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(recv_a + uint32_t(idx * 4)), "r"(rank));
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(bar_a), "r"(rank));
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(ra),
                         "r"(__float_as_uint(v)), "r"(rb) : "memory");
        };
        if (d < DA_CLUSTER) {
#pragma unroll
            for (int gg = 0; gg < DA_MAX_G; ++gg) {
                if (gg >= G) break;
                push(d, s * 2 * DA_MAX_G + gg, M[gg]);
                push(d, s * 2 * DA_MAX_G + DA_MAX_G + gg, Ls[gg]);
            }
        }
#pragma unroll
        for (int gg = 0; gg < DA_MAX_G; ++gg) {
            if (gg >= G) break;
#if DA_WARPS != 4
            if (!DA_COLUMN_THREAD(d)) break;
#endif
            const int e = gg * DA_D + d;
            push(e / per, DA_CLUSTER * 2 * DA_MAX_G + s * (DA_MAX_G * DA_D / DA_CLUSTER) + e % per, A[gg]);
        }
        // every push to this CTA has landed (its bytes were armed at entry). Acquire at CTA scope, as CUTLASS waits
        // on its transaction barriers: the bytes land in this CTA's own shared memory, and `.acquire.cluster` made
        // ptxas follow the wait with CCTL.IVALL (an L1 invalidation; NOTES.md 70)
        asm volatile("{\n\t.reg .pred done;\n"
                     "RECV_%=:\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n\t"
                     "@!done bra RECV_%=;\n\t}" ::"r"(bar_a) : "memory");
    }
#else
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    if (d < DA_CLUSTER) {
        float* dst = cluster.map_shared_rank(recv, d) + s * 2 * DA_MAX_G;
#pragma unroll
        for (int gg = 0; gg < DA_MAX_G; ++gg) {
            if (gg >= G) break;
            dst[gg] = M[gg];
            dst[DA_MAX_G + gg] = Ls[gg];
        }
    }
#pragma unroll
    for (int gg = 0; gg < DA_MAX_G; ++gg) {
        if (gg >= G) break;
#if DA_WARPS != 4
        if (!DA_COLUMN_THREAD(d)) break;
#endif
        const int e = gg * DA_D + d;
        float* dst = cluster.map_shared_rank(recv, e / per);
        dst[DA_CLUSTER * 2 * DA_MAX_G + s * (DA_MAX_G * DA_D / DA_CLUSTER) + e % per] = A[gg];
    }
    // release/acquire at cluster scope: every push is visible to its owner; after this no CTA touches
    // another's shared memory, so each may leave when done
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
    DA_STAMP(6, 0);
    if (d < per) {
        const int e = s * per + d;
        const int gg = e / DA_D, dd = e % DA_D;
        float mr[DA_CLUSTER], lr[DA_CLUSTER], ar[DA_CLUSTER];
#pragma unroll
        for (int r = 0; r < DA_CLUSTER; ++r) {
            mr[r] = recv[r * 2 * DA_MAX_G + gg];
            lr[r] = recv[r * 2 * DA_MAX_G + DA_MAX_G + gg];
            ar[r] = recv[DA_CLUSTER * 2 * DA_MAX_G + r * (DA_MAX_G * DA_D / DA_CLUSTER) + d];
        }
        float mm = mr[0];
#pragma unroll
        for (int r = 1; r < DA_CLUSTER; ++r) mm = fmaxf(mm, mr[r]);
        float ls = 0.f, acc = 0.f;
#pragma unroll
        for (int r = 0; r < DA_CLUSTER; ++r) {
            const float w = merge_weight(mr[r], mm);
            ls += w * lr[r];
            acc += w * ar[r];
        }
        if constexpr (std::is_same_v<Emit, StoreOut>)
            out_h[gg * DA_D + dd] = __float2bfloat16_rn(acc / ls);  // the default's store, as it always was
        else
            emit(gg * DA_D + dd, mm, ls, acc);
    }
    DA_STAMP(7, 0);
}

// The cluster kernels' first step, by every thread: this CTA has started (the cluster barrier that precedes the
// pushes of cluster_merge); by default thread 0 first initializes the receive mbarrier, fences the init
// (fence.mbarrier_init.release.cluster) and arms it with the bytes the cluster's pushes will bring, 8 CTAs x
// (2G + 16G) floats, then every thread arrives (relaxed) and waits, so that every CTA's mbarrier is armed before any
// push reaches it (DA_MERGE_BARRIER: the arrive only; its wait is the merge's).
__device__ __forceinline__ void cluster_entry(int num_q_heads, int num_kv_heads) {
#ifndef DA_MERGE_BARRIER
    if (threadIdx.x == 0) {  // the receive mbarrier, armed with the bytes the cluster's pushes will bring
        const uint32_t bar = uint32_t(__cvta_generic_to_shared(&da_recv_bar));
        const int G_ = num_q_heads / num_kv_heads;
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                     "r"(uint32_t(DA_CLUSTER * (2 * G_ + G_ * (DA_D / DA_CLUSTER)) * 4)) : "memory");
    }
    // CUTLASS's pattern: fence.mbarrier_init (above), a relaxed arrive (a release arrive compiled to MEMBAR.ALL.GPU),
    // and the wait right here (a cluster's CTAs are co-scheduled, so it returns at once), so that the L1 invalidation
    // ptxas puts after any barrier.cluster.wait (CCTL.IVALL) is at entry, not on the merge's path (NOTES.md 70)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#else
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");  // this CTA has started (see the push)
#endif
}

extern "C" __global__ void __cluster_dims__(1, DA_CLUSTER, 1) __launch_bounds__(DA_THREADS)
decode_attention_cluster(const bf16* __restrict__ q, const char* __restrict__ kv, const int* __restrict__ block_table,
                         const int* __restrict__ seq_lens, bf16* __restrict__ out, int num_q_heads, int num_kv_heads,
                         int q_stride, int bt_stride, int page_bytes, float sm_scale) {
    extern __shared__ __align__(128) float smem_all[];
    float* smem = smem_all + DA_BAR_BYTES / 4;  // the rings, after the mbarriers
    cg::cluster_group cluster = cg::this_cluster();
    cluster_entry(num_q_heads, num_kv_heads);
    DA_STAMP(0, 0);
    const int h = blockIdx.x, s = int(cluster.block_rank());
    const int64_t b = blockIdx.z;
    const int G = num_q_heads / num_kv_heads;
    const int gw = s * DA_WARPS + (threadIdx.x >> 5), step = DA_WARPS * DA_CLUSTER;
    const int bt_reg = load_bt(block_table + b * bt_stride, bt_stride, gw, step);
    const int L = __ldg(seq_lens + b);
    DA_STAMP(1, L + bt_reg);
    const Geo geo = make_geo(kv, block_table, b, bt_stride, h, page_bytes, L, sm_scale);
    uint32_t qa[4][4];
    float M[DA_MAX_G], Ls[DA_MAX_G], A[DA_MAX_G];
#if DA_PREWAIT
    // Each warp issues its first DA_PRE_PAGES pages before the PDL wait (see the header: every row of the cache
    // but the current token's was final before this launch started), then waits and loads q. If the current
    // token's page (logical jn, index kn in its warp's list) went out before the wait, its warp reads that token's
    // row again after the wait and the page loop puts it over the row of the page's shared-memory copy (Inject).
    const int jn = geo.npages - 1, kn = (jn - gw) / step;
    const bool refresh = jn % step == gw && kn < min(DA_PRE_PAGES, DA_CLUSTER_SLOTS);  // warp-uniform
    Inject inj{-1, 0, {}};
    const auto after_issue = [&]() {
        DA_TRIGGER_AT_POINT(4);
        DA_PDL_WAIT();
        DA_TRIGGER_AT_POINT(0);
        load_q(q, b, q_stride, h, G, qa);
        if (refresh) {
            const int lane = threadIdx.x & 31, row = (L - 1) % DA_PAGE;
            const int phys = __shfl_sync(0xffffffffu, bt_reg, kn);
            inj = Inject{kn, row, __ldcg(reinterpret_cast<const uint4*>(geo.kvh + int64_t(phys) * geo.page_bytes +
                                                                        row * DA_ROW + lane * 16))};
        }
        DA_TRIGGER_AT_POINT(1);
    };
    cta_attend<DA_CLUSTER_SLOTS, true>(geo, gw, step, bt_reg, G, qa, smem, M, Ls, A, inj, after_issue);
#else
    DA_TRIGGER_AT_POINT(4);
    DA_PDL_WAIT();
    DA_TRIGGER_AT_POINT(0);
    load_q(q, b, q_stride, h, G, qa);
    DA_TRIGGER_AT_POINT(1);
    cta_attend<DA_CLUSTER_SLOTS>(geo, gw, step, bt_reg, G, qa, smem, M, Ls, A);
#endif
    DA_TRIGGER_AT_POINT(2);
    cluster_merge<DA_CLUSTER_SLOTS>(cluster, smem, s, G, M, Ls, A, out + (b * num_q_heads + h * G) * DA_D);
}

// ---- decode_attention_rope_cluster: qk_norm_rope_kv's decode work fused into the cluster attention ----
// fp32 x[0..7] of 8 bf16.
__device__ __forceinline__ void unpack8(const uint4 v, float (&x)[8]) {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(p[i]);
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
    return make_uint4(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]), pack_bf16(x[6], x[7]));
}

__device__ __forceinline__ void load8f(const float* p, float (&x)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

// load_q's fragments of the group's heads, after q := rope(rmsnorm(q) * q_norm_w) as qk_norm_rope_kv computes
// it (fp32: r = rsqrt(mean(q^2) + eps), a = q*r*w, neox rotary over the full head: out[e] = a[e]*cos - a[e+64]*sin,
// out[e+64] = a[e+64]*cos + a[e]*sin for e < 64; one rounding to bf16). Lane (g, t) holds elements 32kp + 8t + j
// (kp = 0..3, j = 0..7) of head g, so each rotary pair (kp, kp+2) is in one lane and a head's sum of squares is a
// quad's. qw[kp]: q_norm_w's 8 elements at 32kp + 8t; cs: this position's cos row (sin at cs + 64).
// Load: how the q|k|v row is read (16 bytes at a time): LoadCg, through L2 (an earlier launch wrote it; the default),
// or, in qkv_attention.cu's fused form, from the shared-memory copy of the kv group's GEMV outputs.
struct LoadCg {
    __device__ __forceinline__ uint4 operator()(const uint4* p) const { return __ldcg(p); }
};
template <class Load = LoadCg>
__device__ __forceinline__ void load_q_rope(const bf16* q, int64_t b, int q_stride, int h, int G, const uint4 (&qw)[4],
                                            const float* cs, float eps, uint32_t (&qa)[4][4]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const uint4* qp = reinterpret_cast<const uint4*>(q + b * q_stride + int64_t(h * G + g) * DA_D + 8 * tig);
    float x[4][8];
    float ss = 0.f;
#pragma unroll
    for (int kp = 0; kp < 4; ++kp) {
        unpack8(g < G ? Load{}(qp + 4 * kp) : make_uint4(0, 0, 0, 0), x[kp]);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += x[kp][j] * x[kp][j];
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    const float r = rsqrtf(ss / DA_D + eps);
#pragma unroll
    for (int kp = 0; kp < 4; ++kp) {
        float w[8];
        unpack8(qw[kp], w);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[kp][j] = x[kp][j] * r * w[j];
    }
#pragma unroll
    for (int kp = 0; kp < 2; ++kp) {
        float c[8], sn[8], lo[8], hi[8];
        load8f(cs + 32 * kp + 8 * tig, c);
        load8f(cs + DA_D / 2 + 32 * kp + 8 * tig, sn);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            lo[j] = x[kp][j] * c[j] - x[kp + 2][j] * sn[j];
            hi[j] = x[kp + 2][j] * c[j] + x[kp][j] * sn[j];
        }
        const uint4 vl = pack8(lo), vh = pack8(hi);
        qa[kp][0] = vl.x, qa[kp][1] = vl.y, qa[kp][2] = vl.z, qa[kp][3] = vl.w;
        qa[kp + 2][0] = vh.x, qa[kp + 2][1] = vh.y, qa[kp + 2][2] = vh.z, qa[kp + 2][3] = vh.w;
    }
}

// Lane i's 16 bytes of the current token's raw (GEMV output) k|v row of kv head h, as kv_row_rope reads them.
template <class Load = LoadCg>
__device__ __forceinline__ uint4 kv_row_raw(const bf16* qkv, int64_t b, int q_stride, int num_q_heads,
                                            int num_kv_heads, int h) {
    const int lane = threadIdx.x & 31, half = lane >> 4;
    return Load{}(reinterpret_cast<const uint4*>(
        qkv + b * q_stride + int64_t(num_q_heads + half * num_kv_heads + h) * DA_D + 8 * (lane & 15)));
}

// kv_row_rope on a row already loaded by kv_row_raw.
__device__ __forceinline__ uint4 kv_row_rope_of(const uint4 raw, const uint4 kw, const float (&c)[8],
                                                const float (&sn)[8], float eps) {
    const int lane = threadIdx.x & 31, half = lane >> 4;
    float x[8], w[8];
    unpack8(raw, x);
    unpack8(kw, w);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += x[j] * x[j];
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);  // within each half
    const float r = rsqrtf(ss / DA_D + eps);
    const bool first = (lane & 8) == 0;  // k elements < 64: out = a*cos - a'*sin; else a*cos + a'*sin
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float a = x[j] * r * w[j];
        const float p = __shfl_xor_sync(0xffffffffu, a, 8);
        o[j] = first ? a * c[j] - p * sn[j] : a * c[j] + p * sn[j];
    }
    return half ? raw : pack8(o);
}

// The current token's k|v row of kv head h as qk_norm_rope_kv writes it: lane i < 16 returns k elements 8i..8i+7
// after k := rope(rmsnorm(k) * k_norm_w) (as load_q_rope), lane i >= 16 v elements 8(i-16).. unchanged; i.e.
// lane i's 16 bytes of the 512-byte row. kw: k_norm_w's 8 elements at 8(i%16); c, sn: cos and sin of rotary
// index 8(i%8) + j. Every lane of the warp must call it (shuffles).
template <class Load = LoadCg>
__device__ __forceinline__ uint4 kv_row_rope(const bf16* qkv, int64_t b, int q_stride, int num_q_heads,
                                             int num_kv_heads, int h, const uint4 kw, const float (&c)[8],
                                             const float (&sn)[8], float eps) {
    return kv_row_rope_of(kv_row_raw<Load>(qkv, b, q_stride, num_q_heads, num_kv_heads, h), kw, c, sn, eps);
}

// decode_attention_cluster with qk_norm_rope_kv's decode work fused in (one launch per layer instead of two):
// qkv: bf16 [seqs, (NQ+2*NKV)*128] (q_stride = its row), read only; each CTA rotates its group's q heads in
// registers (load_q_rope); the warp whose page list holds the current token (position L-1, logical page
// (L-1)/16) computes its k|v row (kv_row_rope), stores it into the KV cache at slot_mapping[b] (slot < 0: not
// stored) and writes the same row into its shared-memory copy of that page before attending to it, so no read
// of this launch depends on its own global store. slot_mapping[b] must be the cache slot of position L-1
// (block_table[b][(L-1)/16]*16 + (L-1)%16), and positions[b] its rotary position, as the runtime writes them.
// -DDA_HALVES=2 (an experiment, NOTES.md 63; not built by tools/build_kernels.py): decode_attention_rope_cluster on
// two clusters of DA_CLUSTER CTAs per (kv head, sequence), grid [NKV, 2 * DA_CLUSTER, seqs], its pages interleaved
// over the two clusters' warps, so that each SM streams half the bytes. When the sequence has no more pages than one
// cluster has warps (L <= 16 * DA_WARPS * DA_CLUSTER), the second cluster exits at once and the first writes the
// output as the default does. Otherwise each CTA hands its slice's merged (max, sum, acc) triples to global scratch,
// `part` (f32 [seqs, NKV, 2, G * D, 3]), and counts itself in `pair_count` (u32 [seqs, NKV, DA_CLUSTER], zero at
// load; each pair's later CTA resets its word): the later CTA of the pair (the same rank in the other cluster) merges
// both halves, half 0 first whichever came last (so the bits do not depend on the order), and writes the slice.
#ifndef DA_HALVES
#define DA_HALVES 1
#endif
static_assert(DA_HALVES == 1 || DA_HALVES == 2, "DA_HALVES: 1 (the default) or 2");
#if DA_HALVES == 2
#define DA_HALF_PARAMS , float* __restrict__ part, unsigned* __restrict__ pair_count
struct HalfEmit {
    float* part_h;  // this (sequence, kv head)'s [2, G * D, 3]
    int half, GD;
    float* mine;  // this thread's triple, kept for the pair merge
    __device__ __forceinline__ void operator()(int e, float mm, float ls, float acc) const {
        float* p = part_h + (int64_t(half) * GD + e) * 3;
        p[0] = mine[0] = mm;
        p[1] = mine[1] = ls;
        p[2] = mine[2] = acc;
    }
};
#else
#define DA_HALF_PARAMS
#endif

extern "C" __global__ void __cluster_dims__(1, DA_CLUSTER, 1) __launch_bounds__(DA_THREADS)
decode_attention_rope_cluster(const bf16* __restrict__ qkv, const int64_t* __restrict__ positions,
                              const int64_t* __restrict__ slot_mapping, const bf16* __restrict__ q_norm_w,
                              const bf16* __restrict__ k_norm_w, const float* __restrict__ cos_sin, char* kv,
                              const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                              bf16* __restrict__ out, int num_q_heads, int num_kv_heads, int q_stride, int bt_stride,
                              int page_bytes, float sm_scale, float eps DA_HALF_PARAMS) {
    extern __shared__ __align__(128) float smem_all[];
    float* smem = smem_all + DA_BAR_BYTES / 4;  // the rings, after the mbarriers
    cg::cluster_group cluster = cg::this_cluster();
#if DA_HALVES == 2
    const int half = int(blockIdx.y) / DA_CLUSTER;
    const bool one_half = (__ldg(seq_lens + blockIdx.z) + DA_PAGE - 1) / DA_PAGE <= DA_WARPS * DA_CLUSTER;
    if (half == 1 && one_half) return;  // the whole cluster, before its first cluster barrier
#else
    constexpr int half = 0;
#endif
    cluster_entry(num_q_heads, num_kv_heads);
    const int h = blockIdx.x, s = int(cluster.block_rank());
    const int64_t b = blockIdx.z;
    const int G = num_q_heads / num_kv_heads;
    const int lane = threadIdx.x & 31, tig = lane & 3;
    const int gw = (half * DA_CLUSTER + s) * DA_WARPS + (threadIdx.x >> 5), step = DA_WARPS * DA_CLUSTER * DA_HALVES;
    // inputs and weights (no earlier launch writes them): before the PDL wait
    const int bt_reg = load_bt(block_table + b * bt_stride, bt_stride, gw, step);
    const int L = __ldg(seq_lens + b);
    const float* cs = cos_sin + __ldg(positions + b) * DA_D;
    uint4 qw[4];
#pragma unroll
    for (int kp = 0; kp < 4; ++kp) qw[kp] = __ldg(reinterpret_cast<const uint4*>(q_norm_w + 32 * kp + 8 * tig));
    const int jn = (L - 1) / DA_PAGE;  // the current token's logical page; its warp injects the row
    const bool mine = jn % step == gw;  // warp-uniform
    int64_t slot = -1;
    uint4 kw = make_uint4(0, 0, 0, 0);
    float c[8], sn[8];
    if (mine) {
        slot = __ldg(slot_mapping + b);
        kw = __ldg(reinterpret_cast<const uint4*>(k_norm_w + 8 * (lane & 15)));
        load8f(cs + 8 * (lane & 7), c);
        load8f(cs + DA_D / 2 + 8 * (lane & 7), sn);
    }
    const Geo geo = make_geo(kv, block_table, b, bt_stride, h, page_bytes, L, sm_scale);
    uint32_t qa[4][4];
    Inject inj{-1, 0, {}};
    // After the PDL wait: q, and the current token's row (its page's shared-memory copy gets the computed row,
    // so the copy may predate the store). DA_PREWAIT: each warp's first DA_ROPE_PRE_PAGES pages go out before the
    // wait (every other row of the cache was final before this launch started: see the header).
    const auto after_wait = [&]() {
        // the current token's raw k|v row requested beside q, not after q's norm and rotary (one L2 round trip after
        // the wait instead of two in a row; H200 session 28, NOTES.md 70)
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (mine) raw = kv_row_raw(qkv, b, q_stride, num_q_heads, num_kv_heads, h);
        load_q_rope(qkv, b, q_stride, h, G, qw, cs, eps, qa);
        if (mine) {
            inj = Inject{(jn - gw) / step, (L - 1) % DA_PAGE, kv_row_rope_of(raw, kw, c, sn, eps)};
            // lane i stores physical chunk i of the swizzled row: logical chunk i ^ (row & 7)
            const int sw = lane ^ ((L - 1) % DA_PAGE & 7);
            inj.val = make_uint4(__shfl_sync(0xffffffffu, inj.val.x, sw), __shfl_sync(0xffffffffu, inj.val.y, sw),
                                 __shfl_sync(0xffffffffu, inj.val.z, sw), __shfl_sync(0xffffffffu, inj.val.w, sw));
            if (slot >= 0)
                *reinterpret_cast<uint4*>(kv + (slot / DA_PAGE) * int64_t(page_bytes) + h * (DA_PAGE * 512) +
                                          (slot % DA_PAGE) * 512 + lane * 16) = inj.val;
        }
    };
    float M[DA_MAX_G], Ls[DA_MAX_G], A[DA_MAX_G];
#if DA_PREWAIT
    const auto after_issue = [&]() {
        DA_TRIGGER_AT_POINT(4);
        DA_PDL_WAIT();
        DA_TRIGGER_AT_POINT(0);
        after_wait();
        DA_TRIGGER_AT_POINT(1);
    };
    cta_attend<DA_ROPE_SLOTS, true, DA_ROPE_PRE_PAGES>(geo, gw, step, bt_reg, G, qa, smem, M, Ls, A, inj, after_issue);
#else
    DA_TRIGGER_AT_POINT(4);
    DA_PDL_WAIT();
    DA_TRIGGER_AT_POINT(0);
    after_wait();
    DA_TRIGGER_AT_POINT(1);
    cta_attend<DA_ROPE_SLOTS, true, DA_ROPE_PRE_PAGES>(geo, gw, step, bt_reg, G, qa, smem, M, Ls, A, inj);
#endif
    DA_TRIGGER_AT_POINT(2);
    bf16* out_h = out + (b * num_q_heads + h * G) * DA_D;
#if DA_HALVES == 2
    if (!one_half) {
        const int GD = G * DA_D;
        float* part_h = part + (b * num_kv_heads + h) * int64_t(2 * GD * 3);
        float mine[3] = {0.f, 0.f, 0.f};
        cluster_merge<DA_ROPE_SLOTS>(cluster, smem, s, G, M, Ls, A, out_h, HalfEmit{part_h, half, GD, mine});
        __shared__ int da_later;
        __syncthreads();  // every triple of the slice stored
        if (threadIdx.x == 0) {
            __threadfence();
            unsigned* c = pair_count + (b * num_kv_heads + h) * DA_CLUSTER + s;
            const unsigned was = atomicAdd(c, 1u);
            da_later = was == 1u;
            if (was == 1u) {
                *c = 0u;  // the pair is done: the next launch's pair starts from zero
                __threadfence();
            }
        }
        __syncthreads();
        const int per = G * (DA_D / DA_CLUSTER), e = s * per + int(threadIdx.x);  // cluster_merge's element
        if (da_later && int(threadIdx.x) < per) {
            const float* o = part_h + (int64_t(1 - half) * GD + e) * 3;
            const float om = __ldcg(o), ol = __ldcg(o + 1), oa = __ldcg(o + 2);
            const float m0 = half == 0 ? mine[0] : om, l0 = half == 0 ? mine[1] : ol, a0 = half == 0 ? mine[2] : oa;
            const float m1 = half == 0 ? om : mine[0], l1 = half == 0 ? ol : mine[1], a1 = half == 0 ? oa : mine[2];
            const float mm = fmaxf(m0, m1);
            const float w0 = merge_weight(m0, mm), w1 = merge_weight(m1, mm);
            out_h[e] = __float2bfloat16_rn((w0 * a0 + w1 * a1) / (w0 * l0 + w1 * l1));
        }
        return;
    }
#endif
    cluster_merge<DA_ROPE_SLOTS>(cluster, smem, s, G, M, Ls, A, out_h);
}
