// Experiment (issue 9, NOTES.md 56; not built by build_kernels.py, not used by the generator; H200: correct and slower,
// +0.32…+0.92 ms per 4B token in the program, the 64 SMs streaming ~34 GB/s each): the decode layer's qkv
// GEMV and its rope-cluster attention as ONE launch, so that the dependency between them is a cluster barrier on
// chip instead of a grid boundary (griddepcontrol.wait on the whole qkv grid, then q's load through L2).
//
// A kv head's attention needs only its own kv group's rows of the qkv output: the G q heads (rows h*G*128 ..
// +G*128), its k head and its v head (rows NQ*128 + h*128 .., (NQ+NKV)*128 + h*128 ..): (G+2)*128 rows, 768 on
// Qwen3-4B. The cluster of 8 CTAs that attends for kv head h computes exactly those rows first: CTA s (its rank) the
// 16-row runs s of the group's q rows (G*16 rows), of its k rows and of its v rows, (G+2)*16 rows in all. Each CTA
// streams its rows' weights (k*2 bytes per row; 491 KB per CTA on 4B) through a ring of QA_SLOTS shared-memory slots
// of QA_SLOT_BYTES, one cp.async.bulk per slot (SR consecutive rows: the largest power of two <= 16 whose bytes fit
// a slot), mbarrier-counted, the first QA_SLOTS slots before the PDL wait (weights are written by no launch). After
// the wait: x (the residual) into shared memory and HF's RMS norm in place (gemv_common.cuh's sumsq8/rms_scale8),
// then the dot products (warp w takes rows w, w + DA_WARPS, .. of each slot; fp32, two accumulators per lane, a warp
// sum), the results rounded to bf16 and pushed (16-byte DSMEM stores) into every CTA's copy of the group's (G+2)*128
// q|k|v values; a cluster barrier (release/acquire); then decode_attention_rope_cluster's work reading q, k and v
// from that copy (load_q_rope / kv_row_rope with LoadShared): q/k RMS norm and rotary, the current token's k|v row
// into the cache at slot_mapping[b] and into its page's shared-memory copy, the pages, the cluster merge. Each
// warp's first DA_ROPE_PRE_PAGES pages also go out before the wait, as in the rope-cluster form.
//
// Tensor-core form (-DQA_MMA): a slot holds one 16-row run's KC columns instead (KC: the largest multiple of
// 16*DA_WARPS dividing k with 16 rows of 2*KC + 16 bytes in a slot: one bulk copy per row, rows padded so that
// ldmatrix is free of bank conflicts; e.g. 640 for k = 2,560 with QA_SLOT_BYTES 20,736); warp w takes KC/DA_WARPS of
// them as mma.sync m16n8k16 steps (A: the 16 rows by ldmatrix, B: xn in column 0, zeros elsewhere; fp32
// accumulators), and after the run's last chunk the warps' 16 partial sums are added in warp order. The CUDA-core
// form (default) issues ~26 instructions per 16 weight bytes, too many for one CTA of 4 warps per SM to keep up with
// the SM's share of the bus (NOTES.md 56); the tensor-core form ~3 per 512 bytes.
//
// Numerics: the GEMV sums in another order than gemv.cu's (so the q|k|v values may differ from the two-launch
// program's by a bf16 rounding step), everything after it is decode_attention_rope_cluster's arithmetic.
//
// ABI (extern "C"):
//   qkv_attention_rope_cluster(const bf16* x,        in buffer<bf16> [seqs, k]   the residual (input of the norm)
//                              const bf16* norm_w,   in buffer<bf16> [k]          input_layernorm weight
//                              const bf16* w,        in buffer<bf16> [(NQ+2NKV)*128, k]  qkv_proj weight
//                              positions, slot_mapping, q_norm_w, k_norm_w, cos_sin, kv, block_table, seq_lens, out:
//                                  decode_attention_rope_cluster's params (out: bf16 [seqs, NQ*128])
//                              int num_q_heads, int num_kv_heads, int k, int bt_stride, int page_bytes,
//                              float sm_scale, float eps)     eps: of the input norm and of q/k's norms
//   grid (NKV, 8, seqs), block (DA_THREADS, 1, 1) (128; 256 with -DDA_WARPS=8), dynamic shared memory
//   QA_XN_OFF + 2*k bytes (the rope-cluster form's DA_ROPE_SMEM, 128 bytes of mbarriers, the weight ring, the q|k|v
//   copy, x). Traps when k % 8 != 0, a row does not fit a slot (-DQA_MMA: no KC), num_q_heads is not G * num_kv_heads
//   with 1 <= G <= 8, grid.y != DA_CLUSTER (8) or the dynamic shared memory is short.
// Build: nvcc -cubin -arch=sm_90 -O3 -std=c++17 -DKERN_PDL [-DQA_SLOTS=S] [-DQA_SLOT_BYTES=B] [-DQA_MMA]
//   qkv_attention.cu (the module also holds decode_attention.cu's entries, unused).
#include "decode_attention.cu"

namespace qa {
#include "gemv_common.cuh"
}

#ifndef QA_SLOTS
#define QA_SLOTS 4
#endif
#ifndef QA_SLOT_BYTES
#define QA_SLOT_BYTES 20480
#endif
static_assert(QA_SLOTS >= 2 && QA_SLOTS <= 16, "QA_SLOTS: 2 to 16 weight slots");
static_assert(QA_SLOT_BYTES % 16 == 0 && QA_SLOT_BYTES >= 1024, "QA_SLOT_BYTES: a multiple of 16, at least 1 KB");
#define QA_BARS_OFF DA_ROPE_SMEM  // the weight slots' mbarriers (128 bytes reserved)
#define QA_RING_OFF (DA_ROPE_SMEM + 128)
#define QA_QKV_OFF (QA_RING_OFF + QA_SLOTS * QA_SLOT_BYTES)
#define QA_QKV_BYTES ((DA_MAX_G + 2) * DA_D * 2)
#define QA_XN_OFF (QA_QKV_OFF + QA_QKV_BYTES)

// A plain (generic) load: the q|k|v copy is in this CTA's shared memory.
struct LoadShared {
    __device__ __forceinline__ uint4 operator()(const uint4* p) const { return *p; }
};

__device__ __forceinline__ void qa_mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n\t.reg .pred done;\n"
                 "QA_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra QA_WAIT_%=;\n\t}" ::"r"(bar), "r"(parity) : "memory");
}

// Slot t % QA_SLOTS <- `bytes` from src, counted on the slot's mbarrier (one thread).
__device__ __forceinline__ void qa_issue(uint32_t ring, uint32_t bars, int t, const void* src, uint32_t bytes) {
    const uint32_t bar = bars + uint32_t(t % QA_SLOTS) * 8;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     ring + uint32_t(t % QA_SLOTS) * QA_SLOT_BYTES),
                 "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(bar) : "memory");
}

extern "C" __global__ void __cluster_dims__(1, DA_CLUSTER, 1) __launch_bounds__(DA_THREADS)
qkv_attention_rope_cluster(const bf16* __restrict__ x, const bf16* __restrict__ norm_w, const bf16* __restrict__ w,
                           const int64_t* __restrict__ positions, const int64_t* __restrict__ slot_mapping,
                           const bf16* __restrict__ q_norm_w, const bf16* __restrict__ k_norm_w,
                           const float* __restrict__ cos_sin, char* kv, const int* __restrict__ block_table,
                           const int* __restrict__ seq_lens, bf16* __restrict__ out, int num_q_heads, int num_kv_heads,
                           int k, int bt_stride, int page_bytes, float sm_scale, float eps) {
    extern __shared__ __align__(128) float smem_all[];
    __shared__ __align__(16) bf16 qa_out[(DA_MAX_G + 2) * 16];  // this CTA's GEMV results, in local row order
    __shared__ float qa_red[DA_WARPS];
    float* smem = smem_all + DA_BAR_BYTES / 4;  // the page rings, then `recv` (decode_attention.cu's layout)
    char* base = reinterpret_cast<char*>(smem_all);
    const uint32_t base_a = uint32_t(__cvta_generic_to_shared(smem_all));
    cg::cluster_group cluster = cg::this_cluster();
    const int h = blockIdx.x, s = int(cluster.block_rank());
    const int64_t b = blockIdx.z;
    const int G = num_q_heads / num_kv_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tig = lane & 3;
    const int row_bytes = 2 * k, nv = k / 8;
#ifdef QA_MMA
    // a slot: 16 rows (one run) x KC columns, each row a bulk copy of 2*KC bytes at a padded stride of 2*KC + 16
    // (ldmatrix's 8 rows then hit distinct banks); KC: the largest multiple of 16*DA_WARPS dividing k that fits
    int KC = 0;
    for (int c = 16 * DA_WARPS; c <= k; c += 16 * DA_WARPS)
        if (k % c == 0 && 16 * (2 * c + 16) <= QA_SLOT_BYTES) KC = c;
    const int SR = 16, CPR = KC > 0 ? k / KC : 1, pitch = 2 * KC + 16;  // chunks per row
    const bool fits = KC > 0;
#else
    int SR = 16;  // rows per slot
    while (SR > 1 && SR * row_bytes > QA_SLOT_BYTES) SR >>= 1;
    const int CPR = 1;
    const bool fits = row_bytes <= QA_SLOT_BYTES;
#endif
    {
        uint32_t dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (k % 8 != 0 || !fits || G < 1 || G > DA_MAX_G || num_q_heads % num_kv_heads != 0 ||
            gridDim.y != DA_CLUSTER || dyn < uint32_t(QA_XN_OFF + row_bytes))
            __trap();
    }
    const int R = (G + 2) * 16, NS = R / SR * CPR;  // this CTA's rows and slots (SR divides 16: a slot is one run)
    // local row i -> its weight row: q run s of the group, then k run s, then v run s
    const auto wrow = [&](int i) -> int64_t {
        if (i < G * 16) return int64_t(h) * G * DA_D + s * G * 16 + i;
        if (i < G * 16 + 16) return int64_t(num_q_heads + h) * DA_D + s * 16 + (i - G * 16);
        return int64_t(num_q_heads + num_kv_heads + h) * DA_D + s * 16 + (i - G * 16 - 16);
    };
    const uint32_t bars = base_a + QA_BARS_OFF, ring = base_a + QA_RING_OFF;
    // slot t of this CTA's stream (one thread): rows t*SR.. (QA_MMA: the 16 rows of run t / CPR, columns
    // (t % CPR)*KC .. +KC, one copy per row)
    const auto issue = [&](int t) {
#ifdef QA_MMA
        const uint32_t bar = bars + uint32_t(t % QA_SLOTS) * 8, dst = ring + uint32_t(t % QA_SLOTS) * QA_SLOT_BYTES;
        const bf16* src = w + wrow((t / CPR) * 16) * k + (t % CPR) * KC;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(uint32_t(32 * KC))
                     : "memory");
        for (int r = 0; r < 16; ++r)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(dst + uint32_t(r * pitch)), "l"(__cvta_generic_to_global(src + int64_t(r) * k)),
                         "r"(uint32_t(2 * KC)), "r"(bar) : "memory");
#else
        qa_issue(ring, bars, t, w + wrow(t * SR) * k, uint32_t(SR * row_bytes));
#endif
    };
    if (tid == 0) {  // weights (no launch writes them): the ring's first slots before the PDL wait
#pragma unroll
        for (int i = 0; i < QA_SLOTS; ++i)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + uint32_t(i * 8)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int t = 0; t < min(QA_SLOTS, NS); ++t) issue(t);
    }
    cluster_entry(num_q_heads, num_kv_heads);
    const int gw = s * DA_WARPS + warp, step = DA_WARPS * DA_CLUSTER;
    // inputs and weights (no earlier launch writes them): before the PDL wait (as decode_attention_rope_cluster)
    const int bt_reg = load_bt(block_table + b * bt_stride, bt_stride, gw, step);
    const int L = __ldg(seq_lens + b);
    const float* cs = cos_sin + __ldg(positions + b) * DA_D;
    uint4 qw[4];
#pragma unroll
    for (int kp = 0; kp < 4; ++kp) qw[kp] = __ldg(reinterpret_cast<const uint4*>(q_norm_w + 32 * kp + 8 * tig));
    const int jn = (L - 1) / DA_PAGE;
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
    bf16* qkv_s = reinterpret_cast<bf16*>(base + QA_QKV_OFF);
    uint4* xn = reinterpret_cast<uint4*>(base + QA_XN_OFF);

#ifdef QA_MMA
    __shared__ float mma_red[2 * DA_WARPS * 16];  // per run: each warp's 16 partial sums (double-buffered by run)
    float mma_d[4] = {0.f, 0.f, 0.f, 0.f};
#endif
    // Every warp calls this once, after issuing its first pages (cta_attend's hook): all 128 threads run it.
    const auto after_issue = [&]() {
        DA_TRIGGER_AT_POINT(4);
        DA_PDL_WAIT();
        DA_TRIGGER_AT_POINT(0);
        // x -> shared memory, then HF's RMS norm in place: bf16(norm_w * bf16(x * rsqrt(mean(x^2) + eps)))
        const uint4* xg = reinterpret_cast<const uint4*>(x + b * k);
        float ss = 0.f;
        for (int i = tid; i < nv; i += DA_THREADS) {
            const uint4 v = __ldcg(xg + i);
            xn[i] = v;
            qa::sumsq8(ss, v);
        }
        ss = qa::warp_sum(ss);
        if (lane == 0) qa_red[warp] = ss;
        __syncthreads();
        float tot = 0.f;
#pragma unroll
        for (int i = 0; i < DA_WARPS; ++i) tot += qa_red[i];
        const float inv = rsqrtf(tot / float(k) + eps);
        for (int i = tid; i < nv; i += DA_THREADS)
            xn[i] = qa::rms_scale8(xn[i], __ldg(reinterpret_cast<const uint4*>(norm_w) + i), inv);
        __syncthreads();
        // the GEMV: slot t holds local rows t*SR .. t*SR + SR - 1
        for (int t = 0; t < NS; ++t) {
            qa_mbar_wait(bars + uint32_t(t % QA_SLOTS) * 8, uint32_t(t / QA_SLOTS) & 1u);
            const uint32_t sl = ring + uint32_t(t % QA_SLOTS) * QA_SLOT_BYTES;
#ifdef QA_MMA
            {
                // warp w: columns (t % CPR)*KC + w*KC/DA_WARPS .. of the run's 16 rows, KC/DA_WARPS/16 k-steps of
                // mma m16n8k16 (A: the rows, by ldmatrix; B: xn in column 0, the other columns zero)
                const int g = lane >> 2, c0 = (t % CPR) * KC + warp * (KC / DA_WARPS);
                const uint32_t a_lane = sl + uint32_t((lane & 15) * pitch + (lane >> 4) * 16 + warp * (KC / DA_WARPS) * 2);
                const uint32_t* xw = reinterpret_cast<const uint32_t*>(xn);
                for (int ks = 0; ks < KC / DA_WARPS / 16; ++ks) {
                    uint32_t a[4];
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(a_lane + uint32_t(ks * 32)));
                    const int kk = c0 + ks * 16 + 2 * tig;  // this lane's B rows 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1)
                    const uint32_t b0 = g == 0 ? xw[kk / 2] : 0u, b1 = g == 0 ? xw[kk / 2 + 4] : 0u;
                    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                        "{%0,%1,%2,%3};\n"
                        : "+f"(mma_d[0]), "+f"(mma_d[1]), "+f"(mma_d[2]), "+f"(mma_d[3])
                        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
                }
                if (t % CPR == CPR - 1) {  // the run's last chunk: the warps' partials (column 0: lanes tig 0)
                    float* red = mma_red + ((t / CPR) & 1) * (DA_WARPS * 16);
                    if (tig == 0) {
                        red[warp * 16 + g] = mma_d[0];
                        red[warp * 16 + g + 8] = mma_d[2];
                    }
                    mma_d[0] = mma_d[1] = mma_d[2] = mma_d[3] = 0.f;
                }
            }
            __syncthreads();  // every warp is done with the slot (and the run's partials are in)
            if (t % CPR == CPR - 1 && tid < 16) {
                const float* red = mma_red + ((t / CPR) & 1) * (DA_WARPS * 16);
                float y = 0.f;
#pragma unroll
                for (int ww = 0; ww < DA_WARPS; ++ww) y += red[ww * 16 + tid];
                qa_out[(t / CPR) * 16 + tid] = __float2bfloat16_rn(y);
            }
#else
            for (int r = warp; r < SR; r += DA_WARPS) {
                const uint32_t row = sl + uint32_t(r * row_bytes);
                float a0 = 0.f, a1 = 0.f;
                int i = lane;
                for (; i + 32 < nv; i += 64) {
                    qa::acc8(a0, lds128(row + 16 * i), xn[i]);
                    qa::acc8(a1, lds128(row + 16 * (i + 32)), xn[i + 32]);
                }
                if (i < nv) qa::acc8(a0, lds128(row + 16 * i), xn[i]);
                const float y = qa::warp_sum(a0 + a1);
                if (lane == 0) qa_out[t * SR + r] = __float2bfloat16_rn(y);
            }
            __syncthreads();  // every warp is done with the slot (and, after the last, qa_out is complete)
#endif
            if (tid == 0 && t + QA_SLOTS < NS) {
                // the warps' generic-proxy reads of the slot before the bulk copy's async-proxy writes
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(t + QA_SLOTS);
            }
        }
#ifdef QA_MMA
        __syncthreads();  // the last run's sums are in qa_out
#endif
        // every CTA of the cluster has started (the entry's arrive): push this CTA's (G+2) runs of 16 values into
        // every CTA's q|k|v copy, 16 bytes per store (q: elements s*G*16.., k: G*128 + s*16.., v: (G+1)*128 + s*16..)
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        const int per = 2 * G + 4;
        for (int i = tid; i < per * DA_CLUSTER; i += DA_THREADS) {  // 160 stores for G = 8
            const int rank = i / per, j = i % per;
            const int e = j < 2 * G ? s * G * 16 + 8 * j
                                    : (j < 2 * G + 2 ? G * DA_D + s * 16 + 8 * (j - 2 * G)
                                                     : (G + 1) * DA_D + s * 16 + 8 * (j - 2 * G - 2));
            const uint4 v = reinterpret_cast<const uint4*>(qa_out)[j];
            uint32_t ra;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                         : "=r"(ra) : "r"(uint32_t(__cvta_generic_to_shared(qkv_s + e))), "r"(rank));
            asm volatile("st.shared::cluster.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(ra), "r"(v.x), "r"(v.y), "r"(v.z),
                         "r"(v.w) : "memory");
        }
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");  // the one cluster_merge waits for
        // decode_attention_rope_cluster's after-wait work, reading the group's q|k|v from the copy
        load_q_rope<LoadShared>(qkv_s, 0, 0, 0, G, qw, cs, eps, qa);
        if (mine) {
            inj = Inject{(jn - gw) / step, (L - 1) % DA_PAGE,
                         kv_row_rope<LoadShared>(qkv_s, 0, 0, G, 1, 0, kw, c, sn, eps)};
            // the head-major layout, as decode_attention_rope_cluster: lane i stores physical chunk i of the
            // swizzled row, logical chunk i ^ (row & 7)
            const int sw = lane ^ ((L - 1) % DA_PAGE & 7);
            inj.val = make_uint4(__shfl_sync(0xffffffffu, inj.val.x, sw), __shfl_sync(0xffffffffu, inj.val.y, sw),
                                 __shfl_sync(0xffffffffu, inj.val.z, sw), __shfl_sync(0xffffffffu, inj.val.w, sw));
            if (slot >= 0)
                *reinterpret_cast<uint4*>(kv + (slot / DA_PAGE) * int64_t(page_bytes) + h * (DA_PAGE * 512) +
                                          (slot % DA_PAGE) * 512 + lane * 16) = inj.val;
        }
        DA_TRIGGER_AT_POINT(1);
    };
    float M[DA_MAX_G], Ls[DA_MAX_G], A[DA_MAX_G];
    cta_attend<DA_ROPE_SLOTS, true, DA_ROPE_PRE_PAGES>(geo, gw, step, bt_reg, G, qa, smem, M, Ls, A, inj, after_issue);
    DA_TRIGGER_AT_POINT(2);
    cluster_merge<DA_ROPE_SLOTS>(cluster, smem, s, G, M, Ls, A, out + (b * num_q_heads + h * G) * DA_D);
}
