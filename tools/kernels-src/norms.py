"""Row-wise Triton kernels: RMS norm, residual add + RMS norm, SiLU-and-mul.

Triton 3.6.0, compiled ahead of time for sm_90 by ``tools/build_kernels.py``.
All tensors are row-major and contiguous; bf16 storage, fp32 arithmetic, one
rounding to bf16 at each store.  The ABI of every instance (parameter list,
grid, block) is in ``README.md`` next to this file and in the built ``index.json``.

Launch-bound at decode (tokens = 1): each kernel is one program per row (or per
row x column block) that moves its whole row with 16-byte vector loads; no loops.
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm(x, w, out, eps, H: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, :] = bf16(x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * w).

    x, out: bf16 [tokens, H]; w: bf16 [H]; eps: f32.  Grid (tokens, 1, 1).
    BLOCK = next power of two >= H (the row is held in registers).
    """
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    xv = tl.load(x + row * H + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(xv * xv, axis=0) / H + eps)
    wv = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * H + offs, (xv * r * wv).to(tl.bfloat16), mask=mask)


@triton.jit
def add_rms_norm(residual, x, w, out, eps, H: tl.constexpr, BLOCK: tl.constexpr):
    """residual += x (rounded to bf16, stored); out = bf16(rmsnorm(residual) * w).

    res (inout), x (in), out (out): bf16 [tokens, H]; w: bf16 [H]; eps: f32.
    The norm is taken of the *stored* (bf16-rounded) residual, as HF computes it.
    Grid (tokens, 1, 1).  out may not alias res or x.
    """
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    r_in = tl.load(residual + row * H + offs, mask=mask, other=0.0).to(tl.float32)
    xv = tl.load(x + row * H + offs, mask=mask, other=0.0).to(tl.float32)
    s = (r_in + xv).to(tl.bfloat16)
    tl.store(residual + row * H + offs, s, mask=mask)
    s = s.to(tl.float32)
    r = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
    wv = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * H + offs, (s * r * wv).to(tl.bfloat16), mask=mask)


@triton.jit
def silu_and_mul(gate_up, out, inter, BLOCK: tl.constexpr):
    """out[t, j] = bf16(silu(gate[t, j]) * up[t, j]), gate = gu[t, :I], up = gu[t, I:].

    gu: bf16 [tokens, 2*I]; out: bf16 [tokens, I]; inter = I (i32, multiple of 16).
    Grid (tokens, ceil_div(I, BLOCK), 1).
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(gate_up + row * (2 * inter) + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * (2 * inter) + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out + row * inter + cols, y.to(tl.bfloat16), mask=mask)
