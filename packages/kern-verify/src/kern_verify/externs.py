"""Built-in ops of the runtime (`{"extern": NAME, "args": [...]}` launches) and their
fixed signatures, which the verifier checks like a kernel's declared params."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Extern:
    """A built-in: `params` in the type grammar, `names` of each param, and what it computes."""

    name: str
    params: tuple[str, ...]
    names: tuple[str, ...]
    doc: str

    def signature(self) -> str:
        """`name(in buffer<bf16> a, ...)`."""
        return f"{self.name}(" + ", ".join(f"{t} {n}" for t, n in zip(self.params, self.names)) + ")"


_GEMM = ("in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32")
_NAMES = ("a", "w", "c", "m", "n", "k")

EXTERNS: dict[str, Extern] = {
    e.name: e
    for e in (
        Extern("cublaslt.gemm_bf16_tn", _GEMM, _NAMES,
               "C[m,n] = A[m,k] · W[n,k]ᵀ, row-major bf16, fp32 accumulation (cuBLASLt)"),
        Extern("cublaslt.gemm_bf16_tn_acc", _GEMM[:2] + ("inout buffer<bf16>",) + _GEMM[3:], _NAMES,
               "C[m,n] += A[m,k] · W[n,k]ᵀ, row-major bf16 (cuBLASLt, beta = 1)"),
    )
}
