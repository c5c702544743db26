// Test kernels for kern_verify.cubin: one parameter of every kind the ABI cares about.
#include <cstdint>

struct S { int a; double b; char c; };  // 24 bytes, 8-aligned

extern "C" __global__ void k_mix(int a, long long b, float c, const float* p, unsigned char u, float* out) {
  out[threadIdx.x] = a + b + c + p[0] + u;
}

extern "C" __global__ void __launch_bounds__(256) k_struct(S s, unsigned char u8, short h, double* out) {
  __shared__ float sm[128];
  sm[threadIdx.x % 128] = s.a;
  __syncthreads();
  out[0] = s.b + s.c + u8 + h + sm[threadIdx.x % 128];
}

extern "C" __global__ void k_noparams() {}

// A C++ (mangled) entry: _Z4cppkiPf
__global__ void cppk(int n, float* x) { x[n] = 1.f; }

// k_mix for programmatic dependent launch: waits for the previous grid (SASS ACQBULK)
// before its first read and lets the next one launch (PREEXIT) after its last write.
extern "C" __global__ void k_mix_pdl(int a, long long b, float c, const float* p, unsigned char u, float* out) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  out[threadIdx.x] = a + b + c + p[0] + u;
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// k_mix compiled for thread-block clusters (EIATTR_CTA_PER_CLUSTER): 2 CTAs along x, 16 (non-portable), 2 along y,
// and 32 (more than sm_90 runs: nvcc accepts it); sm_90 and later only (the sm_80 build of this file has none)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define K_MIX_CLUSTER(NAME, X, Y, Z)                                                                              \
  extern "C" __global__ void __cluster_dims__(X, Y, Z) NAME(int a, long long b, float c, const float* p,           \
                                                           unsigned char u, float* out) {                         \
    out[threadIdx.x] = a + b + c + p[0] + u;                                                                      \
  }
K_MIX_CLUSTER(k_mix_cluster2, 2, 1, 1)
K_MIX_CLUSTER(k_mix_cluster16, 16, 1, 1)
K_MIX_CLUSTER(k_mix_cluster_y2, 1, 2, 1)
K_MIX_CLUSTER(k_mix_cluster32, 32, 1, 1)
#endif

// k_mix with 8 KB of static shared memory (`.nv.shared.k_mix_smem8k`), for the static + dynamic limit (E0094)
extern "C" __global__ void k_mix_smem8k(int a, long long b, float c, const float* p, unsigned char u, float* out) {
  __shared__ float st[2048];
  st[threadIdx.x] = a + b + c + p[0] + u;
  __syncthreads();
  out[threadIdx.x] = st[(threadIdx.x + 1) % blockDim.x];
}
