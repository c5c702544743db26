// Device helpers shared by the decode GEMV sources (gemv.cu, gemv_persist.cu, gemv_mlp.cu, tools/gpu/megakernel_probe.cu):
// bf16 <-> fp32, the 8-element dot step, the RMS norm's 8-element steps, the warp sum, SiLU and the
// programmatic-dependent-launch controls.
// Included inside each source's anonymous namespace (internal linkage per module), after
// <cuda_bf16.h>.
#pragma once

__device__ __forceinline__ float bf(const __nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __nv_bfloat16 tobf(const float v) { return __float2bfloat16_rn(v); }

// s += Σ_i w[i]·x[i] over the 8 bf16 of each 16-byte vector, in fp32, in element order.
__device__ __forceinline__ void acc8(float &s, const uint4 w, const uint4 x) {
    const __nv_bfloat162 *wp = reinterpret_cast<const __nv_bfloat162 *>(&w);
    const __nv_bfloat162 *xp = reinterpret_cast<const __nv_bfloat162 *>(&x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 wf = __bfloat1622float2(wp[i]);
        const float2 xf = __bfloat1622float2(xp[i]);
        s = fmaf(wf.x, xf.x, s);
        s = fmaf(wf.y, xf.y, s);
    }
}

// ss += Σ x[i]² over the 8 bf16 of a 16-byte vector, in fp32, in element order (an RMS norm's sum of squares).
__device__ __forceinline__ void sumsq8(float &ss, const uint4 x) {
    const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(p[i]);
        ss = fmaf(f.x, f.x, ss);
        ss = fmaf(f.y, f.y, ss);
    }
}

// The 8 bf16 of x normalized: bf16(w · bf16(x · inv)) elementwise, HF Qwen3RMSNorm's roundings (inv = rsqrt(mean(x²)
// + eps), w the norm weight).
__device__ __forceinline__ uint4 rms_scale8(const uint4 x, const uint4 w, const float inv) {
    const __nv_bfloat16 *xp = reinterpret_cast<const __nv_bfloat16 *>(&x);
    const __nv_bfloat16 *wp = reinterpret_cast<const __nv_bfloat16 *>(&w);
    uint4 out;
    __nv_bfloat16 *op = reinterpret_cast<__nv_bfloat16 *>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) op[i] = tobf(bf(wp[i]) * bf(tobf(bf(xp[i]) * inv)));
    return out;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// Waits for the previous grid of a programmatic dependent launch (no-op otherwise). -DGEMV_NO_WAIT compiles the wait
// out: a what-if build for timing only (the kernel reads its inputs before they are written; NOTES.md 47).
__device__ __forceinline__ void griddep_wait() {
#if __CUDA_ARCH__ >= 900 && !defined(GEMV_NO_WAIT)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next programmatic dependent launch be scheduled (no-op without one).
__device__ __forceinline__ void griddep_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
