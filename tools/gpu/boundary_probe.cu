// What a kernel boundary costs in a weight-streaming chain (tools/gpu/boundary_probe.py; not a provider kernel:
// the script compiles it with nvcc at run time). Each "GEMV" of one decode token is modelled by streaming its
// weight bytes with gemv.cu's access pattern and pipeline — a warp-load is 512 contiguous bytes (16 per lane), 8
// loads per stage, two stages (8 KB per warp) in flight, the first two issued before griddepcontrol.wait — and the
// GEMV's other work is added piece by piece (MODE bits of stream_mode<MODE>):
//   1  prologue after the wait: the block reads x (kx 16-byte vectors, L2-resident), reduces a sum over the block
//      and keeps x in shared memory (gemv.cu's norm_to_smem shape: two block barriers)
//   2  FMAs: each loaded vector (8 bf16) times an x vector from shared memory into an fp32 accumulator (acc8)
//   4  residual epilogue: warp sum, then lane 0 adds into an element of `resid` (read, add, write)
//   8  store epilogue: warp sum, then lane 0 writes an element of `resid`
//  16  the dot products on the tensor cores instead of FMAs: two mma.m16n8k16 (bf16 -> fp32) per 16-byte load, the
//      load's four registers as the B fragments, x (from shared memory, once per stage) as the A fragment, four
//      independent accumulator tiles (the instruction and latency cost only: the fragments' layout is not a GEMV's)
// Without 4 or 8 nothing is stored (a never-true test keeps the loads). stream_phases streams several segments in
// one persistent launch with a software grid barrier (one counter per barrier) between them, the next segment's
// first two stages issued before each barrier.
#include <cuda_bf16.h>
#include <stdint.h>

#define LPS 8  // warp-loads (512 B) per stage

__device__ __forceinline__ uint4 ldw(const uint4* p, bool pred) {
    uint4 r = make_uint4(0, 0, 0, 0);
    asm volatile(
        "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t@q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n\t}"
        : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
        : "l"(p), "r"((int)pred));
    return r;
}
__device__ __forceinline__ float fold(float a, const uint4 v) {  // uses every loaded word, cheaply
    return a + __uint_as_float(v.x & 0x3fffffffu) + __uint_as_float(v.y & 0x3fffffffu) +
           __uint_as_float(v.z & 0x3fffffffu) + __uint_as_float(v.w & 0x3fffffffu);
}
__device__ __forceinline__ void mma16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void acc8(float& s, const uint4 w, const uint4 x) {
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
    }
}

// A warp's lines of 512 B: first + 8*j for j < count (the block's 8 warps interleaved), line i at base + 32*i.
struct Stream {
    const uint4* base;
    long first, count;
};
__device__ __forceinline__ Stream warp_stream(const uint4* w, long l0, long l1) {
    Stream s;
    s.base = w;
    s.first = l0 + (threadIdx.x >> 5);
    s.count = s.first < l1 ? (l1 - s.first + 7) / 8 : 0;
    return s;
}
__device__ __forceinline__ void stage(uint4 (&buf)[LPS], const Stream& s, int st, int lane) {
#pragma unroll
    for (int u = 0; u < LPS; ++u) {
        const long j = (long)st * LPS + u;
        buf[u] = ldw(s.base + (s.first + 8 * j) * 32 + lane, j < s.count);
    }
}

// Consumes a warp's stream with stages 0 and 1 already issued into a and b: `use(buf, stage)` on each stage as it
// lands, then that buffer refilled two stages ahead (gemv.cu's pdl_dot loop).
template <typename Use>
__device__ __forceinline__ void drain(const Stream& s, uint4 (&a)[LPS], uint4 (&b)[LPS], int lane, Use use) {
    const int stages = (int)((s.count + LPS - 1) / LPS);
    for (int st = 0; st < stages; st += 2) {
        use(a, st);
        stage(a, s, st + 2, lane);
        if (st + 1 < stages) {
            use(b, st + 1);
            stage(b, s, st + 3, lane);
        }
    }
}

template <int MODE>
__device__ __forceinline__ void stream_mode(const uint4* w, long lines, int lpb, const uint4* x, int kx,
                                            __nv_bfloat16* resid, float* sink) {
    extern __shared__ __align__(16) uint4 xs[];
    __shared__ float part[8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long l0 = (long)blockIdx.x * lpb;
    const Stream s = warp_stream(w, l0, l0 + lpb < lines ? l0 + lpb : lines);
    uint4 a[LPS], b[LPS];
    stage(a, s, 0, lane);
    stage(b, s, 1, lane);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (MODE & 1) {
        float ss = 0.f;
        for (int v = threadIdx.x; v < kx; v += blockDim.x) {
            const uint4 xv = x[v];
            ss += __uint_as_float(xv.x & 0x3fffffffu);
            xs[v] = xv;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) t += part[i];
        if (threadIdx.x == 0 && t == 1.2345f) sink[0] = t;
        __syncthreads();
    }
    float acc = 0.f;
    float ct[4][4] = {};
    int xi = lane;  // the x vector a load meets: lane + 32*load, modulo kx
    auto use = [&](const uint4 (&buf)[LPS], int st) {
        if constexpr ((MODE & 16) != 0) {
            const uint4 xa = xs[xi];
            xi += 32;
            xi = xi >= kx ? xi - kx : xi;
#pragma unroll
            for (int u = 0; u < LPS; ++u) {
                mma16(ct[u & 3], xa.x, xa.y, buf[u].x, buf[u].y);
                mma16(ct[u & 3], xa.z, xa.w, buf[u].z, buf[u].w);
            }
        } else {
#pragma unroll
            for (int u = 0; u < LPS; ++u) {
                if (MODE & 2) {
                    if ((long)st * LPS + u < s.count) acc8(acc, buf[u], xs[xi]);
                    xi += 32;
                    xi = xi >= kx ? xi - kx : xi;
                } else {
                    acc = fold(acc, buf[u]);
                }
            }
        }
    };
    drain(s, a, b, lane, use);
    if (MODE & 16)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc += ct[i][0] + ct[i][1] + ct[i][2] + ct[i][3];
    if (MODE & 12) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) {
            const long i = (long)blockIdx.x * 8 + warp;
            const float add = acc * 1e-30f;
            resid[i] = __float2bfloat16_rn((MODE & 4) ? __bfloat162float(resid[i]) + add : add);
        }
    } else if (acc == 1.2345f) {
        sink[blockIdx.x] = acc;
    }
}
#define MODE_ENTRY(M)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        stream_mode##M(const uint4* w, long lines, int lpb, const uint4* x, int kx, __nv_bfloat16* resid, float* sink) { \
        stream_mode<M>(w, lines, lpb, x, kx, resid, sink);                                                     \
    }
MODE_ENTRY(0)
MODE_ENTRY(1)
MODE_ENTRY(2)
MODE_ENTRY(4)
MODE_ENTRY(8)
MODE_ENTRY(6)
MODE_ENTRY(11)
MODE_ENTRY(16)
MODE_ENTRY(20)
MODE_ENTRY(25)

// Every block arrives on ctr (zeroed before the launch) and waits for gridDim.x arrivals.
__device__ __forceinline__ void grid_barrier(unsigned* ctr) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        } while (v < gridDim.x);
    }
    __syncthreads();
}

// Segments p < phases of w (lines [seg[p], seg[p+1])) in one launch, each split evenly over the blocks (all of
// which must be resident: grid ≤ 2 per SM), a grid barrier between segments.
extern "C" __global__ void __launch_bounds__(256) stream_phases(const uint4* w, const long* seg, int phases,
                                                                unsigned* ctr, float* sink) {
    const int lane = threadIdx.x & 31;
    auto range = [&](int p) {
        const long n = seg[p + 1] - seg[p], per = (n + gridDim.x - 1) / gridDim.x;
        const long a = per * blockIdx.x < n ? per * blockIdx.x : n, b = per * (blockIdx.x + 1) < n ? per * (blockIdx.x + 1) : n;
        return warp_stream(w, seg[p] + a, seg[p] + b);
    };
    Stream s = range(0);
    uint4 a[LPS], b[LPS];
    stage(a, s, 0, lane);
    stage(b, s, 1, lane);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    float acc = 0.f;
    for (int p = 0; p < phases; ++p) {
        drain(s, a, b, lane, [&](const uint4 (&buf)[LPS], int) {
#pragma unroll
            for (int u = 0; u < LPS; ++u) acc = fold(acc, buf[u]);
        });
        if (p + 1 < phases) {
            s = range(p + 1);
            stage(a, s, 0, lane);
            stage(b, s, 1, lane);
            grid_barrier(ctr + p);
        }
    }
    if (acc == 1.2345f) sink[blockIdx.x] = acc;
}

extern "C" __global__ void zero_counters(unsigned* ctr, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) ctr[i] = 0;
}
