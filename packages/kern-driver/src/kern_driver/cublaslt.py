"""The GEMM built-ins on cuBLASLt (`nvmath.bindings.cublasLt`).

`cublaslt.gemm_bf16_tn(a, w, c, m, n, k)`: row-major `C[m,n] = A[m,k] · W[n,k]ᵀ`,
bf16 inputs and output, fp32 accumulation and scale; `cublaslt.gemm_bf16_tn_acc`
is the same with `C += ...` (β = 1).

cuBLASLt is column-major. A row-major `[r, c]` matrix is the column-major
`[c, r]` matrix with leading dimension `c`, so the row-major product is the
column-major `Cᵀ[n,m] = W'ᵀ · A'` with `W'` = W as column-major `[k, n]`
(ld k) transposed (`TRANSA = T`), `A'` = A as column-major `[k, m]` (ld k,
`TRANSB = N`) and `C'` column-major `[n, m]` (ld n). In cuBLASLt's naming the
"A" matrix is our W and "B" is our A.

The algorithm is chosen by `cublasLtMatmulAlgoGetHeuristic` once per
(m, n, k, pointer alignments) and cached; the workspace is allocated once at
load, so a matmul only enqueues kernels and can be captured into a CUDA graph
(cuBLASLt documentation: "cublasLtMatmul ... graph capture" requires no
allocation during the call, which a user-provided workspace guarantees).
Constants: `CUBLAS_COMPUTE_32F` = 68, `CUDA_R_32F` = 0, `CUDA_R_16BF` = 14,
`CUBLAS_OP_N/T` = 0/1 (cublas_api.h, library_types.h; the same values as
nvmath's `ComputeType`, `CudaDataType`, `cublas.Operation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import KernDriverError

CUBLAS_COMPUTE_32F = 68
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1

#: Default workspace size, bytes (cuBLAS recommends ≥ 32 MiB on Hopper).
DEFAULT_WORKSPACE = 32 * 2**20


def _lib() -> Any:
    try:
        from nvmath.bindings import cublasLt
    except Exception as e:  # ImportError, or a missing dependency of nvmath
        raise KernDriverError(
            f"the manifest uses a cuBLASLt built-in but nvmath-python cannot be imported ({type(e).__name__}: {e})",
            hint="pip install 'nvmath-python>=1.0' (its cuBLASLt binding loads libcublasLt.so.13)",
        ) from None
    return cublasLt


def alignment(addr: int, cap: int = 256) -> int:
    """Largest power of two ≤ `cap` dividing `addr` (the alignment cuBLASLt's heuristic
    must assume for a pointer: its MIN_ALIGNMENT preferences default to 256 bytes)."""
    a = 1
    while a < cap and addr % (a * 2) == 0:
        a *= 2
    return a


@dataclass
class GemmPlan:
    """One GEMM shape: layouts, the chosen algorithm, its workspace need."""

    m: int
    n: int
    k: int
    adesc: int
    bdesc: int
    cdesc: int
    heuristic: Any
    algo_ptr: int
    workspace_bytes: int
    waves: float


class CublasLt:
    """A cuBLASLt handle, the bf16 TN matmul descriptor, a workspace and a plan cache.

    Args:
        workspace: device address of a preallocated workspace; `workspace_bytes` its size.
    """

    def __init__(self, workspace: int, workspace_bytes: int = DEFAULT_WORKSPACE):
        self.L = L = _lib()
        self.workspace = workspace
        self.workspace_bytes = workspace_bytes
        self.handle = self._call(L.create, "cublasLtCreate")
        self.version = self._call(L.get_version, "cublasLtGetVersion")
        self.desc = self._call(L.matmul_desc_create, "cublasLtMatmulDescCreate", CUBLAS_COMPUTE_32F, CUDA_R_32F)
        self._set_desc(L.MatmulDescAttribute.TRANSA, CUBLAS_OP_T)
        self._set_desc(L.MatmulDescAttribute.TRANSB, CUBLAS_OP_N)
        self.alpha = np.ones(1, dtype=np.float32)
        self.beta0 = np.zeros(1, dtype=np.float32)
        self.beta1 = np.ones(1, dtype=np.float32)
        self._count = np.zeros(1, dtype=np.int32)
        self.plans: dict[tuple[int, ...], GemmPlan] = {}
        self._prefs: dict[tuple[int, int, int], int] = {}

    def _call(self, fn: Any, what: str, *args: Any, where: str | None = None) -> Any:
        try:
            return fn(*args)
        except KernDriverError:
            raise
        except Exception as e:
            status = getattr(e, "status", None)
            name = None
            if status is not None:
                try:
                    name = self.L.get_status_name(status)
                except Exception:  # pragma: no cover
                    name = f"cublasStatus {status}"
            raise KernDriverError(f"{what} failed: {e}", cuda_error=name or type(e).__name__, where=where) from None

    def _set_desc(self, attr: Any, value: int) -> None:
        buf = np.array([value], dtype=self.L.get_matmul_desc_attribute_dtype(attr))
        self._call(self.L.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute",
                   self.desc, attr, buf.ctypes.data, buf.nbytes)

    def _pref(self, al_a: int, al_w: int, al_c: int) -> int:
        key = (al_a, al_w, al_c)
        p = self._prefs.get(key)
        if p is not None:
            return p
        L = self.L
        p = self._call(L.matmul_preference_create, "cublasLtMatmulPreferenceCreate")
        A = L.MatmulPreferenceAttribute
        for attr, v in (
            (A.MAX_WORKSPACE_BYTES, self.workspace_bytes),
            (A.MIN_ALIGNMENT_A_BYTES, al_w),  # cuBLASLt's A is our W
            (A.MIN_ALIGNMENT_B_BYTES, al_a),
            (A.MIN_ALIGNMENT_C_BYTES, al_c),
            (A.MIN_ALIGNMENT_D_BYTES, al_c),
        ):
            buf = np.array([v], dtype=L.get_matmul_preference_attribute_dtype(attr))
            self._call(L.matmul_preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute",
                       p, attr, buf.ctypes.data, buf.nbytes)
        self._prefs[key] = p
        return p

    def plan(self, m: int, n: int, k: int, a: int, w: int, c: int, where: str) -> GemmPlan:
        """The cached plan of a GEMM shape for these pointers' alignments, created (layouts +
        heuristic) on first use. Host-only: call it before a graph capture begins.

        Raises:
            KernDriverError: m, n or k < 1, or no cuBLASLt algorithm supports the shape.
        """
        if m < 1 or n < 1 or k < 1:
            raise KernDriverError(f"GEMM shape m={m}, n={n}, k={k}: every dimension must be ≥ 1", where=where)
        al = (alignment(a), alignment(w), alignment(c))
        key = (m, n, k) + al
        p = self.plans.get(key)
        if p is not None:
            return p
        L = self.L
        mk = L.matrix_layout_create
        adesc = self._call(mk, "cublasLtMatrixLayoutCreate", CUDA_R_16BF, k, n, k, where=where)  # W' [k, n] ld k
        bdesc = self._call(mk, "cublasLtMatrixLayoutCreate", CUDA_R_16BF, k, m, k, where=where)  # A' [k, m] ld k
        cdesc = self._call(mk, "cublasLtMatrixLayoutCreate", CUDA_R_16BF, n, m, n, where=where)  # C' [n, m] ld n
        res = L.MatmulHeuristicResult(1)
        self._count[0] = 0
        self._call(L.matmul_algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic",
                   self.handle, self.desc, adesc, bdesc, cdesc, cdesc, self._pref(*al), 1,
                   res.ptr, self._count.ctypes.data, where=where)
        if self._count[0] < 1 or int(res.state) != 0:
            raise KernDriverError(
                f"cuBLASLt has no algorithm for bf16 TN GEMM m={m}, n={n}, k={k} "
                f"(pointer alignments a={al[0]}, w={al[1]}, c={al[2]} bytes, workspace {self.workspace_bytes} bytes)",
                cuda_error="CUBLAS_STATUS_NOT_SUPPORTED", where=where,
                hint="odd pointer offsets restrict the algorithms; align buffer offsets to 16 bytes",
            )
        p = GemmPlan(m, n, k, adesc, bdesc, cdesc, res, int(res.ptr), int(res.workspace_size), float(res.waves_count))
        self.plans[key] = p
        return p

    def matmul(self, p: GemmPlan, a: int, w: int, c: int, acc: bool, stream: int, where: str) -> None:
        """Enqueue `C (+)= A · Wᵀ` on `stream` (capturable: no allocation, no sync).

        Raises:
            KernDriverError: cublasLtMatmul returned an error.
        """
        self._call(self.L.matmul, "cublasLtMatmul",
                   self.handle, self.desc, self.alpha.ctypes.data, w, p.adesc, a, p.bdesc,
                   (self.beta1 if acc else self.beta0).ctypes.data, c, p.cdesc, c, p.cdesc,
                   p.algo_ptr, self.workspace, self.workspace_bytes, stream, where=where)

    def close(self) -> None:
        """Destroy layouts, preferences, the descriptor and the handle (idempotent)."""
        if self.handle is None:
            return
        L = self.L
        for p in self.plans.values():
            for d in (p.adesc, p.bdesc, p.cdesc):
                L.matrix_layout_destroy(d)
        for pref in self._prefs.values():
            L.matmul_preference_destroy(pref)
        self.plans.clear()
        self._prefs.clear()
        L.matmul_desc_destroy(self.desc)
        L.destroy(self.handle)
        self.handle = None
