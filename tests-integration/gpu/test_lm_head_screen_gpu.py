"""GPU tests of the screened lm_head (tools/kernels-src/lm_head_screen.cu) against the dense path it replaces.

Run on the H200:  uv run pytest -m gpu tests-integration/gpu/test_lm_head_screen_gpu.py
Kernels: built into a temp dir by this test, or taken from $KERN_KERNELS_DIR. The int8 head and its row table come
from tools/export_weights.py's `screen_head_rows` (what the weights file carries).

The claim under test: kern_lmhead_screen_m1 + kern_lmhead_pick_m1 + argmax_reduce give the token of
kern_gemv_norm_m1 + argmax_partial + argmax_reduce (the dense decode program's last two ops) bit for bit — on fresh
random heads with log-normal row scales (as tools/make_random_checkpoint.py draws them), on heads of plain N(0, σ²)
rows (flat logits, more candidates), and on inputs built to break it: a planted tie (the best row copied to a lower
index), every row equal (every row a candidate), x = 0, a NaN in x, a weight row holding inf and one holding NaN.
Besides the token, every bound is checked against the dense logits: each row's key (the order of bf16(upper
bound)) is at least the order of its dense bf16 logit, and each screen block's bpart (the max order of bf16(lower
bound)) at most the max order of its rows' dense logits. Outputs are poisoned before each run.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("_seed")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import torch, BF, DEV, kernels_dir  # noqa: E402
from cubin_launch import KernelSet  # noqa: E402
from export_weights import screen_head_rows  # noqa: E402

EPS = 1e-6
SENTINEL = 12352.0  # the poison of xn: exactly representable in bf16, never a normalized value here
ARGMAX_BLOCK = 2048
#: (n, k): the Qwen3 vocabulary at the 4B and 0.6B hidden sizes, a k with two int8 stages (5120: 10 loads per lane
#: and row), and small odd shapes (n not a multiple of a block's 32 rows, k of a few int8 vectors).
SHAPES = [(151936, 2560), (151936, 1024), (4000, 5120), (1001, 1040), (77, 48)]
#: The stage-1 entries: the default, `_r8` (8 rows per warp), and their `_pP` forms (P row groups per block, grid
#: ceil_div(nb1, P): the same keys and, per group, the same bpart as their one-group entry).
SCREENS = ("kern_lmhead_screen_m1", "kern_lmhead_screen_m1_r8", "kern_lmhead_screen_m1_p18",
           "kern_lmhead_screen_m1_r8_p9")


@pytest.fixture(scope="session")
def kdir(tmp_path_factory) -> Path:
    return kernels_dir(tmp_path_factory, "kernels", ["0.6b"],
                       needed=[*SCREENS, "kern_lmhead_pick_m1",
                               "kern_gemv_norm_m1", "argmax_partial",
                               "argmax_reduce"])


def launch(ks: KernelSet, name: str, grid: int, args: list) -> None:
    """One plain launch (no PDL attribute: griddepcontrol.wait is then a no-op) of index kernel `name`."""
    ks.launch(name, (grid,), args)


def order(b16: torch.Tensor) -> torch.Tensor:
    """argmax_key.cuh's argmax_order of bf16 bit patterns (int64): sign-magnitude to unsigned, -0 == +0, NaN max."""
    b = b16.to(torch.int64) & 0xFFFF
    b = torch.where(b == 0x8000, torch.zeros_like(b), b)
    o = torch.where((b & 0x8000) != 0, (~b) & 0xFFFF, b | 0x8000)
    return torch.where((b & 0x7FFF) > 0x7F80, torch.full_like(b, 0xFFFF), o)


def head_tables(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q8 int8 [n, k], rows f32 [n, 4]) of bf16 head `w` as tools/export_weights.py writes them."""
    words = w.view(torch.int16).cpu().numpy().view(np.uint16)
    q, sc = screen_head_rows(words)
    return torch.from_numpy(np.ascontiguousarray(q)).to(DEV), torch.from_numpy(np.ascontiguousarray(sc)).to(DEV)


def dense(ks: KernelSet, x, nw, w) -> tuple[int, torch.Tensor]:
    """The dense program's token and its bf16 logits: kern_gemv_norm_m1 (ksplit 1), argmax_partial, argmax_reduce."""
    n, k = w.shape
    logits = torch.full((n,), float("nan"), dtype=BF, device=DEV)
    launch(ks, "kern_gemv_norm_m1", math.ceil(n / 16), [x, nw, w, logits, n, k, EPS, 1])
    parts = math.ceil(n / ARGMAX_BLOCK)
    partial = torch.full((parts,), -1, dtype=torch.int64, device=DEV)
    out = torch.full((1,), -7, dtype=torch.int64, device=DEV)
    launch(ks, "argmax_partial", parts, [logits, partial, n, parts])
    launch(ks, "argmax_reduce", 1, [partial, out, parts])
    torch.cuda.synchronize()
    return int(out.item()), logits


def screened(ks: KernelSet, x, nw, q8, rows, w, screen: str) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The screened op's token with stage-1 entry `screen`, and its scratch: keys (int64 of the u16), bpart (int64 of
    the u32), xn."""
    n, k = w.shape
    e = ks.kernels[screen]["constexprs"]
    nb1 = math.ceil(n / (e["WARPS"] * e["ROWS_PER_WARP"]))
    parts = math.ceil(n / e["PICK_ROWS"])
    xn = torch.full((k,), SENTINEL, dtype=BF, device=DEV)
    keys = torch.full((n,), 0x5A5A, dtype=torch.int16, device=DEV)
    bpart = torch.full((nb1,), 0x5A5A5A5A, dtype=torch.int32, device=DEV)
    partial = torch.full((parts,), -1, dtype=torch.int64, device=DEV)
    out = torch.full((1,), -7, dtype=torch.int64, device=DEV)
    launch(ks, screen, math.ceil(nb1 / e.get("PASSES", 1)), [x, nw, q8, rows, xn, keys, bpart, n, k, EPS])
    launch(ks, "kern_lmhead_pick_m1", parts, [xn, w, keys, bpart, nb1, partial, n, k])
    launch(ks, "argmax_reduce", 1, [partial, out, parts])
    torch.cuda.synchronize()
    return int(out.item()), keys.to(torch.int64) & 0xFFFF, bpart.to(torch.int64) & 0xFFFFFFFF, xn


def head(n: int, k: int, *, row_scale: bool = True) -> torch.Tensor:
    """A bf16 head [n, k]: rows N(0, (4/√k)²), times a log-normal row scale (make_random_checkpoint's) when
    `row_scale`."""
    w = torch.randn(n, k, device=DEV) * (4.0 / math.sqrt(k))
    if row_scale:
        w *= torch.exp(0.5 * torch.randn(n, 1, device=DEV) - 0.25)
    return w.to(BF)


def check_case(ks: KernelSet, x, nw, w, what: str) -> tuple[int, int]:
    """Both paths on the same inputs, with each stage-1 entry: the same token, every bound valid. Returns (token,
    candidates of the default entry)."""
    q8, rows = head_tables(w)
    tok_d, logits = dense(ks, x, nw, w)
    dord = order(logits.view(torch.int16))
    n = w.shape[0]
    counts, first = [], {}
    for screen in SCREENS:
        tok_s, keys, bpart, xn = screened(ks, x, nw, q8, rows, w, screen)
        # every entry computes each row's bounds in the same arithmetic: the same keys; the same bpart per group of
        # the same rows per warp (the `_pP` forms against their one-group entry)
        rpw = ks.kernels[screen]["constexprs"]["ROWS_PER_WARP"]
        k0, b0 = first.setdefault(rpw, (keys, bpart))
        assert torch.equal(keys, k0) and torch.equal(bpart, b0), \
            f"{what}, {screen}: keys or bpart differ from the first entry with {rpw} rows per warp"
        assert tok_s == tok_d, f"{what}, {screen}: screened token {tok_s} != dense token {tok_d}"
        assert not bool((xn == SENTINEL).all()), f"{what}, {screen}: xn not written (still the poison {SENTINEL})"
        assert bool((keys >= dord).all()), (
            f"{what}, {screen}: a row's upper-bound key is below its dense logit's order at rows "
            f"{torch.nonzero(keys < dord).flatten()[:8].tolist()}")
        per = ks.kernels[screen]["constexprs"]
        rpb = per["WARPS"] * per["ROWS_PER_WARP"]
        pad = torch.zeros(bpart.numel() * rpb, dtype=torch.int64, device=DEV)
        pad[:n] = dord
        assert bool((bpart <= pad.view(-1, rpb).max(1).values).all()), \
            f"{what}, {screen}: a block's lower bound exceeds its rows"
        counts.append(int((keys >= int(bpart.max().item())).sum().item()))
    assert len(set(counts)) == 1, f"{what}: the entries' candidates differ: {counts} (the same arithmetic per row)"
    return tok_d, counts[0]


@pytest.mark.parametrize(("n", "k"), SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_random_heads_same_token(ks, n: int, k: int) -> None:
    """Fresh heads and inputs, both head kinds: the dense token every time, and a screen that screens (log-normal
    rows: few candidates). Two draws for the vocabulary-sized heads (their int8 tables take the export's numpy
    seconds each), six for the others."""
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    counts = []
    for draw in range(2 if n > 100_000 else 6):
        row_scale = draw % 2 == 0
        w = head(n, k, row_scale=row_scale)
        x = (torch.randn(k, device=DEV) * (0.5 + draw)).to(BF)
        _, c = check_case(ks, x, nw, w, f"draw {draw} ({'log-normal rows' if row_scale else 'flat'})")
        counts.append(c)
    print(f"{n}x{k}: candidates per draw {counts}")
    if n > 100_000 and k >= 1024:
        assert max(counts[0::2]) < n // 100, f"the screen passes {counts[0::2]} of {n} rows (log-normal heads)"


def test_adversarial_inputs(ks) -> None:
    """Ties, all-equal rows, x = 0, NaN in x, inf and NaN in the weights: the dense token every time."""
    n, k = 20000, 1024
    nw = (1 + 0.1 * torch.randn(k, device=DEV)).to(BF)
    x = torch.randn(k, device=DEV).to(BF)
    w = head(n, k)
    tok, _ = dense(ks, x, nw, w)
    w_tie = w.clone()
    w_tie[tok // 3] = w[tok]  # the best row again, at a lower index: ties go to the smallest index
    got, _ = check_case(ks, x, nw, w_tie, "planted tie")
    assert got == tok // 3
    same = w[:1].expand(n, k).contiguous()
    got, c = check_case(ks, x, nw, same, "every row equal")
    assert (got, c) == (0, n)
    got, c = check_case(ks, torch.zeros(k, device=DEV, dtype=BF), nw, w, "x = 0")
    assert got == 0
    x_nan = x.clone()
    x_nan[5] = float("nan")
    check_case(ks, x_nan, nw, w, "NaN in x")
    w_inf = w.clone()
    w_inf[7, 3] = float("inf")
    w_inf[n - 2, 1] = float("nan")
    check_case(ks, x, nw, w_inf, "inf and NaN in weight rows")
    w_big = w.clone()
    w_big[123] = (w[tok].float() * 4).to(BF)  # four times the best row: one logit far above the rest
    got, c = check_case(ks, x, nw, w_big, "one dominant row")
    assert got == 123 and c < 50
    # the edges of fp32's range: xn near underflow (norm weights 2⁻⁶⁹: squares of its small elements vanish), a
    # row whose small weights carry its logit; and xn·w near overflow (norm weights 2⁶⁰, rows of 2⁶⁰)
    tiny_nw = torch.full((k,), 2.0**-69, device=DEV).to(BF)
    x_t = torch.full((k,), 2.0**-8, device=DEV)
    x_t[::16] = 1.0
    w_t = head(64, k)
    w_t[1] = torch.where(torch.arange(k, device=DEV) % 16 == 0, 0.0, 1.0).to(BF)
    w_t[0] = torch.where(torch.arange(k, device=DEV) % 16 == 0, 2.0**-5, 0.0).to(BF)
    check_case(ks, x_t.to(BF), tiny_nw, w_t, "xn near underflow")
    huge_nw = torch.full((k,), 2.0**60, device=DEV).to(BF)
    check_case(ks, x, huge_nw, (head(64, k).float() * 2.0**60).to(BF), "xn·w near overflow")
