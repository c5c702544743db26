"""The kernel catalog: every kernel instance the build produces, with its ABI.

This file is the single source of truth for the ABI written into ``index.json``
(and restated for humans in ``README.md``).  ``tools/build_kernels.py`` does the
mechanics (compile, hash, index); ``instances(geometries)`` says *what* to build.

Instance naming: a kernel whose compiled code depends on the geometry carries the
geometry value in its NAME (``rms_norm_h2560``); every other kernel has one instance
shared by all Qwen3 dense geometries (runtime shape parameters).  Two geometries
that need the same instance share it (built once).

Param types are the manifest grammar (``in buffer<bf16>``, ``inout ptr``, ``i32`` ...).
``div16`` is the Triton specialization declared at build time, which the caller must
honour: for a pointer, the address is a multiple of 16 bytes; for an integer, the
value is a multiple of 16.  Nothing else is specialized (in particular an integer
equal to 1 is *not*), so each instance's parameter list is fixed.  Triton kernels
get two hidden trailing ``u64`` params (global / profile scratch, always passed 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from geometries import Geometry

TRITON_HIDDEN = (("global_scratch", "u64"), ("profile_scratch", "u64"))


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # manifest grammar
    div16: bool = False
    elem: str | None = None  # pointee type for `ptr` params (Triton needs one)


@dataclass(frozen=True)
class Kernel:
    name: str  # index NAME
    lang: str  # "triton" | "cuda"
    source: str  # file in tools/kernels-src
    entry: str  # Python function name (Triton) / extern "C" symbol (CUDA)
    params: tuple[Param, ...]
    grid: str
    doc: str
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4  # Triton; for CUDA: block.x // 32
    num_stages: int = 1
    block_x: int | None = None  # CUDA only (Triton: 32 * num_warps)

    @property
    def block(self) -> list[int]:
        return [self.block_x if self.lang == "cuda" else 32 * self.num_warps, 1, 1]

    def key(self):
        return (self.lang, self.source, self.entry, self.params, tuple(sorted(self.constexprs.items())),
                self.num_warps, self.num_stages, self.block_x)


def P(name, type_, div16=False, elem=None):
    return Param(name, type_, div16, elem)


BF16_IN = "in buffer<bf16>"
BF16_OUT = "out buffer<bf16>"
BF16_INOUT = "inout buffer<bf16>"


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _norm_kernels(H: int) -> list[Kernel]:
    block = _pow2(H)
    warps = 4 if block <= 2048 else 8
    cx = {"H": H, "BLOCK": block}
    return [
        Kernel(
            name=f"rms_norm_h{H}", lang="triton", source="norms.py", entry="rms_norm",
            params=(P("x", BF16_IN, True), P("w", BF16_IN, True), P("out", BF16_OUT, True), P("eps", "f32")),
            grid="(tokens, 1, 1): one program per row",
            doc=f"out[t,:] = bf16(x[t,:] * rsqrt(mean(x[t,:]^2) + eps) * w). x, out: bf16 [tokens, {H}] "
                f"contiguous; w: bf16 [{H}]; eps: f32 (rms_norm_eps). fp32 math, one rounding.",
            constexprs=cx, num_warps=warps,
        ),
        Kernel(
            name=f"add_rms_norm_h{H}", lang="triton", source="norms.py", entry="add_rms_norm",
            params=(P("residual", BF16_INOUT, True), P("x", BF16_IN, True), P("w", BF16_IN, True),
                    P("out", BF16_OUT, True), P("eps", "f32")),
            grid="(tokens, 1, 1): one program per row",
            doc=f"residual[t,:] = bf16(residual[t,:] + x[t,:]) (stored); out[t,:] = bf16(rmsnorm(residual[t,:]) * w). "
                f"residual, x, out: bf16 [tokens, {H}] contiguous, out aliases neither; w: bf16 [{H}]; eps: f32.",
            constexprs=cx, num_warps=warps,
        ),
    ]


def _shared_kernels() -> list[Kernel]:
    return [
        Kernel(
            name="embedding", lang="cuda", source="embedding.cu", entry="embedding", block_x=256,
            params=(P("ids", "in buffer<i64>"), P("table", BF16_IN), P("out", BF16_OUT),
                    P("hidden", "i32"), P("vocab", "i32")),
            grid="(tokens, 1, 1): one block per token",
            doc="out[t,:] = table[ids[t],:]. ids: i64 [tokens]; table: bf16 [vocab, hidden]; out: bf16 "
                "[tokens, hidden]; hidden: multiple of 8 (table, out 16-byte aligned); an id outside "
                "[0, vocab) gives a zero row.",
        ),
        Kernel(
            name="argmax_partial", lang="cuda", source="argmax.cu", entry="argmax_partial", block_x=256,
            params=(P("logits", BF16_IN), P("partial", "out buffer<u64>"), P("n", "i32"), P("parts", "i32")),
            grid="(parts, rows, 1); recommended parts = ceil_div(n, 2048) (75 for n = 151936)",
            doc="Stage 1 of row argmax over logits bf16 [rows, n] (16-byte aligned): block b of row r "
                "writes partial[r*parts + b] = max packed key (order-preserving bf16 bits << 32 | ~index) "
                "over its contiguous chunk. partial: impl scratch u64 [rows*parts]; parts == grid.x.",
        ),
        Kernel(
            name="argmax_reduce", lang="cuda", source="argmax.cu", entry="argmax_reduce", block_x=256,
            params=(P("partial", "in buffer<u64>"), P("out", "out buffer<i64>"), P("parts", "i32")),
            grid="(rows, 1, 1)",
            doc="Stage 2 of row argmax: out[r] = index of the max of row r (ties: smallest index; "
                "-0 == +0; NaN is the max). partial: u64 [rows*parts] from argmax_partial; parts as there.",
        ),
        Kernel(
            name="silu_and_mul", lang="triton", source="norms.py", entry="silu_and_mul",
            params=(P("gate_up", BF16_IN, True), P("out", BF16_OUT, True), P("inter", "i32", True)),
            grid="(tokens, ceil_div(I, 1024), 1)",
            doc="out[t,j] = bf16(silu(gate_up[t,j]) * gate_up[t,I+j]). gate_up: bf16 [tokens, 2*I]; "
                "out: bf16 [tokens, I]; inter = I (multiple of 16).",
            constexprs={"BLOCK": 1024}, num_warps=4,
        ),
    ]


def instances(geometries: list[Geometry]) -> list[Kernel]:
    """Distinct kernel instances needed by these geometries, sorted by NAME."""
    out: dict[str, Kernel] = {}
    for k in _shared_kernels() + [k for g in geometries for k in _norm_kernels(g.hidden_size)]:
        if k.name in out and out[k.name].key() != k.key():
            raise AssertionError(f"two different instances named {k.name}")
        out[k.name] = k
    return [out[n] for n in sorted(out)]
