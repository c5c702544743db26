// Token embedding gather: out[t, :] = table[ids[t], :]   (bf16 rows, copied as raw 16-byte words)
//
// ABI (extern "C", no name mangling; see README.md):
//   embedding(const int64_t* ids,      in  buffer<i64>  [tokens]
//             const uint4*   table,    in  buffer<bf16> [vocab, hidden], 16-byte aligned
//             uint4*         out,      out buffer<bf16> [tokens, hidden], 16-byte aligned
//             int            hidden,   i32, multiple of 8 (one uint4 = 8 bf16)
//             int            vocab)    i32; an id outside [0, vocab) yields a row of zeros
//   grid (tokens, 1, 1), block (EMB_THREADS, 1, 1), no dynamic shared memory.
//
// A pure copy: each block moves one row (2*hidden bytes) with 16-byte loads, all
// loads of a thread issued before its stores (hidden <= 4 * 8 * EMB_THREADS = 8192
// needs one round; larger rows loop).
//
// PDL form (compiled with -DKERN_PDL into its own module, index NAME `embedding_pdl`; the
// default build has none of it): the id (an input the caller wrote before the run) and the
// first round of table rows (weights) are read, then every block executes
// `griddepcontrol.wait` before its first store (the previous launch may still read `out`),
// also on the zero-row path and when there is nothing to copy, then
// `griddepcontrol.launch_dependents`. That is the manifest's `"pdl": true` contract.
#include <cstdint>

#define EMB_THREADS 256
#define EMB_UNROLL 4

#ifdef KERN_PDL
#define KERN_PDL_WAIT_AND_TRIGGER()                          \
    do {                                                     \
        asm volatile("griddepcontrol.wait;" ::: "memory");   \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#endif

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embedding(const int64_t* __restrict__ ids, const uint4* __restrict__ table, uint4* __restrict__ out,
          int hidden, int vocab) {
    const int64_t t = blockIdx.x;
    const int64_t id = ids[t];
    const int nvec = hidden >> 3;
    uint4* dst = out + t * nvec;
    if (id < 0 || id >= vocab) {
#ifdef KERN_PDL
        KERN_PDL_WAIT_AND_TRIGGER();
#endif
        for (int i = threadIdx.x; i < nvec; i += EMB_THREADS) dst[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    const uint4* src = table + id * nvec;
    for (int base = 0; base < nvec; base += EMB_THREADS * EMB_UNROLL) {
        uint4 v[EMB_UNROLL];
#pragma unroll
        for (int u = 0; u < EMB_UNROLL; ++u) {
            const int i = base + u * EMB_THREADS + threadIdx.x;
            if (i < nvec) v[u] = __ldg(src + i);
        }
#ifdef KERN_PDL
        if (base == 0) KERN_PDL_WAIT_AND_TRIGGER();
#endif
#pragma unroll
        for (int u = 0; u < EMB_UNROLL; ++u) {
            const int i = base + u * EMB_THREADS + threadIdx.x;
            if (i < nvec) dst[i] = v[u];
        }
    }
#ifdef KERN_PDL
    if (nvec <= 0) KERN_PDL_WAIT_AND_TRIGGER();  // no round ran: still wait (contract rule 3)
#endif
}
