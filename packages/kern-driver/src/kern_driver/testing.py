"""Helpers for tests and benchmarks of kern manifests (no GPU needed to import).

- `to_bf16` / `from_bf16`: float32 ↔ bf16 raw bits (np.uint16), round to nearest even;
- `write_safetensors`: write a safetensors file from numpy arrays with explicit dtypes
  (bf16 given as uint16 bits), following the format in `kern_driver.weights`;
- `find_nvcc` / `build_cubin`: compile CUDA C to an sm_90 cubin;
- `VADD_CU`, `vadd_manifest`, `gemm_manifest`: the small manifests the tests use;
- `PDL_CU`, `pdl_manifest`: a producer kernel and a consumer launched with programmatic
  dependent launch (`"pdl": true`) and optionally a shared-memory carveout (`"carveout"`);
- `RESIDENT_CU`, `resident_manifest`: blocks that record their SM and residency interval,
  to observe how many run on one SM at once under a launch's `"carveout"`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from .weights import SAFETENSORS_DTYPES

_TAGS = {v: k for k, v in SAFETENSORS_DTYPES.items()}
_NP = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "u8": np.uint8,
       "i16": np.int16, "u16": np.uint16, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
       "fp8e4m3": np.uint8, "fp8e5m2": np.uint8}


def to_bf16(x: Any) -> np.ndarray:
    """float → bf16 bits (np.uint16), round to nearest even (NaN kept quiet)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[np.isnan(f)] = 0x7FC0
    return r


def from_bf16(bits: Any) -> np.ndarray:
    """bf16 bits (np.uint16) → float32 (exact)."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path: str | os.PathLike[str], tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Write `{name: (kern dtype, array)}` as a safetensors file (arrays are written as raw
    bytes: bf16 must be np.uint16 bits; the dtype tag comes from the kern dtype)."""
    header: dict[str, Any] = {}
    blobs = []
    off = 0
    for name, (dtype, arr) in tensors.items():
        a = np.ascontiguousarray(arr)
        if a.dtype != np.dtype(_NP[dtype]):
            raise ValueError(f"{name}: array dtype {a.dtype} for kern dtype {dtype} (expected {np.dtype(_NP[dtype])})")
        b = a.tobytes()
        header[name] = {"dtype": _TAGS[dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def find_nvcc() -> str | None:
    """nvcc on PATH, or in /usr/local/cuda/bin, or None."""
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.path.exists(p)), None)


def build_cubin(source: str, out: str | os.PathLike[str], arch: str = "sm_90") -> bytes:
    """Compile CUDA C `source` to a cubin at `out` with nvcc; returns its bytes.

    Raises:
        RuntimeError: nvcc not found, or compilation failed (with nvcc's output).
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (PATH, /usr/local/cuda/bin)")
    out = Path(out)
    src = out.with_suffix(".cu")
    src.write_text(source)
    r = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-o", str(out), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n{r.stdout}\n{r.stderr}")
    return out.read_bytes()


VADD_CU = r"""
extern "C" __global__ void vadd(const float* x, const float* y, float* out, int n, float alpha) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + alpha * y[i];
}
"""


#: `vadd16`: vadd by a compiled 16-CTA cluster (sm_90's non-portable maximum), over a grid-stride loop.
CLUSTER16_CU = r"""
#include <cooperative_groups.h>
// vadd over a grid-stride loop by a compile-time cluster of 16 CTAs (sm_90's non-portable maximum): every
// element gets NaN unless this CTA's cluster really has 16 CTAs
extern "C" __global__ void __cluster_dims__(16, 1, 1) vadd16(const float* x, const float* y, float* out, int n,
                                                              float alpha) {
    const bool ok = cooperative_groups::this_cluster().num_blocks() == 16;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = ok ? x[i] + alpha * y[i] : __int_as_float(0x7fc00000);
}
"""


#: `vadd_smem`: vadd through shared memory: 8 KB of static shared memory plus the launch's dynamic shared memory
#: (at least blockDim.x floats), both touched, so that static + dynamic may exceed 48 KB while each part stays below
#: it (the launch then needs MAX_DYNAMIC_SHARED_SIZE_BYTES raised).
SMEM_CU = r"""
extern "C" __global__ void vadd_smem(const float* x, const float* y, float* out, int n, float alpha) {
    __shared__ float st[2048];                      // 8 KB static
    extern __shared__ float dyn[];                  // the launch's shared_mem
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    st[threadIdx.x] = i < n ? x[i] : 0.f;
    dyn[threadIdx.x] = i < n ? y[i] : 0.f;
    __syncthreads();
    if (i < n) out[i] = st[threadIdx.x] + alpha * dyn[threadIdx.x];
}
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def module_entry(source: str, cubin_sha: str | None) -> dict[str, Any]:
    """A manifest `modules` entry: `{"source": source, "sha256": cubin_sha}`, without `sha256` when it is None
    (the tests of a missing pin)."""
    mod: dict[str, Any] = {"source": source}
    if cubin_sha is not None:
        mod["sha256"] = cubin_sha
    return mod


def vadd_manifest(cubin_sha: str | None, *, n_max: int = 4096, alpha: float = 2.0, n_type: str = "i32",
                  calls: int = 1, source: str = "vadd.cubin") -> dict[str, Any]:
    """`out[i] = x[i] + alpha · w[i]` for i < n: input x f32[n], weight w f32[n_max],
    output out f32[n]; program `main` makes `calls` identical calls (labels add0, add1...)."""
    mod = module_entry(source, cubin_sha)
    return {
        "schema_version": 4,
        "model": "vadd-test",
        "vars": {"n": {"min": 1, "max": n_max}},
        "states": {},
        "buffers": {
            "x": {"dtype": "f32", "shape": ["n"], "class": "input"},
            "w": {"dtype": "f32", "shape": [n_max], "class": "weight"},
            "out": {"dtype": "f32", "shape": ["n"], "class": "output"},
        },
        "modules": {"vec": mod},
        "ops": {
            "add": {
                "params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"],
                "impl": {"launches": [{
                    "module": "vec", "entry": "vadd",
                    "params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", n_type, "f32"],
                    "block": [256, 1, 1], "grid": [{"ceil_div": ["n", 256]}, 1, 1],
                    "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"f32": alpha}],
                }]},
            },
        },
        "programs": {"main": {"calls": [
            {"label": f"add{i}", "op": "add", "args": [{"buf": "x"}, {"buf": "w"}, {"buf": "out"}, {"var": "n"}]}
            for i in range(calls)
        ]}},
    }


PDL_CU = r"""
// produce: y = 2x + 1, after spinning `spin` clock cycles; with trigger_early it lets the
// next (pdl) launch start right away, so the consumer's blocks run during the spin.
extern "C" __global__ void produce(const float* __restrict__ x, float* __restrict__ y, int n,
                                   int trigger_early, long long spin) {
    if (trigger_early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");  // a no-op unless launched with pdl
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.f * x[i] + 1.f;
}

// consume: z = y + w. w (a weight: no launch writes it) is read before the wait, y (the
// producer's output) after it; with wait = 0 the kernel breaks its pdl promise (tests only).
extern "C" __global__ void consume(const float* __restrict__ w, const float* __restrict__ y, float* __restrict__ z,
                                   int n, int wait) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float wi = i < n ? w[i] : 0.f;
    if (wait) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (i < n) z[i] = y[i] + wi;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
"""


def pdl_manifest(cubin_sha: str | None, *, n_max: int = 4096, pdl: bool = True, wait: bool = True,
                 trigger_early: bool = True, spin: int = 0, source: str = "pdl.cubin",
                 carveout: int | None = None) -> dict[str, Any]:
    """Program `main`: `produce` (y = 2x + 1, workspace) then `consume` (z = y + w, output),
    the consumer's launch with `"pdl": pdl` and, when given, `"carveout": carveout` (percent).
    x input f32[n], w weight f32[n_max]."""
    mod = module_entry(source, cubin_sha)
    grid = [{"ceil_div": ["n", 256]}, 1, 1]
    consume: dict[str, Any] = {
        "module": "pdl", "entry": "consume",
        "params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32", "i32"],
        "block": [256, 1, 1], "grid": grid,
        "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"i32": int(wait)}],
    }
    if pdl:
        consume["pdl"] = True
    if carveout is not None:
        consume["carveout"] = carveout
    return {
        "schema_version": 4,
        "model": "pdl-test",
        "vars": {"n": {"min": 1, "max": n_max}},
        "states": {},
        "buffers": {
            "x": {"dtype": "f32", "shape": ["n"], "class": "input"},
            "w": {"dtype": "f32", "shape": [n_max], "class": "weight"},
            "y": {"dtype": "f32", "shape": ["n"], "class": "workspace"},
            "z": {"dtype": "f32", "shape": ["n"], "class": "output"},
        },
        "modules": {"pdl": mod},
        "ops": {
            "produce": {
                "params": ["in buffer<f32>", "out buffer<f32>", "i32"],
                "impl": {"launches": [{
                    "module": "pdl", "entry": "produce",
                    "params": ["in buffer<f32>", "out buffer<f32>", "i32", "i32", "i64"],
                    "block": [256, 1, 1], "grid": grid,
                    "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"i32": int(trigger_early)}, {"i64": spin}],
                }]},
            },
            "consume": {
                "params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"],
                "impl": {"launches": [consume]},
            },
        },
        "programs": {"main": {"calls": [
            {"label": "produce", "op": "produce", "args": [{"buf": "x"}, {"buf": "y"}, {"var": "n"}]},
            {"label": "consume", "op": "consume", "args": [{"buf": "w"}, {"buf": "y"}, {"buf": "z"}, {"var": "n"}]},
        ]}},
    }


RESIDENT_CU = r"""
// resident: thread 0 of each block records [SM id, start ns, end ns] (%globaltimer) around a spin of
// `spin` clock cycles, in out[3 * block + 0..2]; the block holds the launch's dynamic shared memory
// meanwhile, so the number of blocks resident on one SM at once shows the SM's shared-memory
// configuration (what a launch's carveout chooses).
extern "C" __global__ void resident(long long* __restrict__ out, long long spin) {
    extern __shared__ volatile int dyn[];
    if (threadIdx.x != 0) return;
    unsigned smid;
    unsigned long long t0, t1;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    dyn[0] = (int)smid;
    const long long c0 = clock64();
    while (clock64() - c0 < spin) {
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    out[3 * blockIdx.x] = dyn[0];
    out[3 * blockIdx.x + 1] = (long long)t0;
    out[3 * blockIdx.x + 2] = (long long)t1;
}
"""


def resident_manifest(cubin_sha: str | None, *, shared_mem: int = 40960, carveout: int | None = None,
                      spin: int = 50_000, blocks_max: int = 4096, source: str = "resident.cubin") -> dict[str, Any]:
    """Program `main`: one launch of `resident` with var `blocks` blocks of 32 threads and `shared_mem`
    bytes of dynamic shared memory each, with `"carveout": carveout` when given; output `out` i64[blocks, 3]
    (per block: SM id, start and end in ns). See `peak_residency`."""
    mod = module_entry(source, cubin_sha)
    launch: dict[str, Any] = {
        "module": "resident", "entry": "resident", "params": ["out buffer<i64>", "i64"],
        "block": [32, 1, 1], "grid": ["blocks", 1, 1], "shared_mem": shared_mem,
        "args": [{"param": 0}, {"i64": spin}],
    }
    if carveout is not None:
        launch["carveout"] = carveout
    return {
        "schema_version": 4,
        "model": "resident-test",
        "vars": {"blocks": {"min": 1, "max": blocks_max}},
        "states": {},
        "buffers": {"out": {"dtype": "i64", "shape": ["blocks", 3], "class": "output"}},
        "modules": {"resident": mod},
        "ops": {"resident": {"params": ["out buffer<i64>"], "impl": {"launches": [launch]}}},
        "programs": {"main": {"calls": [{"label": "resident", "op": "resident", "args": [{"buf": "out"}]}]}},
    }


def peak_residency(out: Any) -> int:
    """The most blocks resident on one SM at once, from `resident`'s [blocks, 3] output (SM id, start, end)."""
    peak = 0
    rows = np.asarray(out).reshape(-1, 3)
    for sm in np.unique(rows[:, 0]):
        ev = sorted([(int(t), 1) for t in rows[rows[:, 0] == sm, 1]] + [(int(t), -1) for t in rows[rows[:, 0] == sm, 2]],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
        now = 0
        for _, d in ev:
            now += d
            peak = max(peak, now)
    return peak


def gemm_manifest(n: int, k: int, *, m_max: int = 64) -> dict[str, Any]:
    """GEMM built-ins: program `mm`: `c = a · w1ᵀ`; program `mm_acc`: `c = a · w1ᵀ; c += a · w2ᵀ`.
    a input bf16[m, k], w1/w2 weight bf16[n, k], c output bf16[m, n]; var m in [1, m_max]."""
    params = ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"]

    def call(label: str, op: str, w: str) -> dict[str, Any]:
        return {"label": label, "op": op, "args": [{"buf": "a"}, {"buf": w}, {"buf": "c"}, {"var": "m"},
                                                    {"i32": n}, {"i32": k}]}

    def op(extern: str, ps: list[str]) -> dict[str, Any]:
        return {"params": ps, "impl": {"launches": [{"extern": extern, "args": [{"param": i} for i in range(6)]}]}}

    return {
        "schema_version": 4,
        "model": f"gemm-test-n{n}-k{k}",
        "vars": {"m": {"min": 1, "max": m_max}},
        "states": {},
        "buffers": {
            "a": {"dtype": "bf16", "shape": ["m", k], "class": "input"},
            "w1": {"dtype": "bf16", "shape": [n, k], "class": "weight"},
            "w2": {"dtype": "bf16", "shape": [n, k], "class": "weight"},
            "c": {"dtype": "bf16", "shape": ["m", n], "class": "output"},
        },
        "modules": {},
        "ops": {
            "gemm": op("cublaslt.gemm_bf16_tn", params),
            "gemm_acc": op("cublaslt.gemm_bf16_tn_acc", params[:2] + ["inout buffer<bf16>"] + params[3:]),
        },
        "programs": {
            "mm": {"calls": [call("proj", "gemm", "w1")]},
            "mm_acc": {"calls": [call("proj", "gemm", "w1"), call("proj_acc", "gemm_acc", "w2")]},
        },
    }
