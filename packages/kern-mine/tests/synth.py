"""A synthetic capture writer: a fake L-layer model whose every launch, grid,
scalar and pointer is known, so the tests can assert exact mining results.

Per pass of ``t`` tokens (``*`` = launched once per pass):

==========  ==========================  ===========================================
kernel      grid                        params
==========  ==========================  ===========================================
embed*      [t, 1, 1]                   ids(ws), table(weight), out(ws), i32 64·t
rope*       [ceil_div(t, 2), 1, 1]      out(ws), i32 t
bucket*     [ceil_div(t, 32), 1, 1]     out(ws)           (a degenerate reference)
per layer:
 rms_norm   [t, 1, 1]                   x(ws), w(weight: one allocation, 512 B/layer), y(ws), i32 64, f32 eps
 gemm_qkv   [ceil_div(t, 64), 3, 1]     params via extra (null)
 kv_write   [t, 2, 1]                   k(ws), kv(state, layer offset), i32 t, i64 position (unfit)
 attn       [ceil_div(t, 16), 4, 1]     q(ws), kv(state), out(ws), i32 position + t (unfit)
 gemm_o     [ceil_div(t, 64), 1, 1]     extra
 rms_norm   [t, 1, 1]                   post-attention norm (weights at +4096 in the same allocation)
 act        [mul(t, 3), 1, 1]           x(ws), y(ws), i32 384·t
 gemm_down  [ceil_div(t, 64), 1, 1]     extra
rms_norm*   [t, 1, 1]                   final norm (weight at +8192)
lm_head*    [1, 150, 1]                 extra
argmax*     [1, 1, 1]                   logits(ws), token(weight-like: the same buffer every pass)
==========  ==========================  ===========================================

Workspace pointers move between passes inside one arena allocation.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

W_BASE, W_SIZE = 0x7F00_0000_0000, 1 << 20
E_BASE, E_SIZE = 0x7F00_1000_0000, 1 << 22
KV_BASE, KV_SIZE = 0x7F00_2000_0000, 1 << 24
A_BASE, A_SIZE = 0x7F00_4000_0000, 1 << 26
TOK_BASE, TOK_SIZE = 0x7F00_5000_0000, 1 << 21

SYMBOLS = ["embed", "rope", "bucket", "rms_norm", "gemm_qkv", "kv_write", "attn", "gemm_o", "act",
           "gemm_down", "lm_head", "argmax"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Spec:
    """What to generate. ``prompts``: one request per prompt; ``new_tokens`` passes each
    (the prefill and ``new_tokens - 1`` decodes). ``warmup``: token counts of passes
    launched in one window before the requests. ``late_tail``/``early_head``: global
    pass numbers whose argmax lands after the host pause / whose embed lands before it
    (±1 launch jitter at a boundary)."""

    prompts: list[int]
    new_tokens: int = 4
    layers: int = 3
    warmup: list[int] = field(default_factory=list)
    late_tail: set[int] = field(default_factory=set)
    early_head: set[int] = field(default_factory=set)
    request_gap_ns: int = 60_000_000
    pass_gap_ns: int = 800_000
    seed: int = 0
    embed_blocks: int = 1  # embed's grid is [embed_blocks · t, 1, 1]
    autotune: int = 0  # a first window where `act` is benchmarked: this many bursts of 50 launches
    gemm_extra: bool = False  # the extra-buffer GEMMs record their packed arguments (extra_hex)


def _ptr(value: int, base: int, size: int) -> dict:
    return {"offset": 0, "size": 8, "hex": value.to_bytes(8, "little").hex(),
            "alloc": {"base": base, "size": size}, "host": False}


def _i32(v: int) -> dict:
    return {"offset": 0, "size": 4, "hex": (v & 0xFFFFFFFF).to_bytes(4, "little").hex(), "alloc": None, "host": False}


def _i64(v: int) -> dict:
    return {"offset": 0, "size": 8, "hex": (v & (2**64 - 1)).to_bytes(8, "little").hex(), "alloc": None, "host": False}


def _f32(v: float) -> dict:
    return {"offset": 0, "size": 4, "hex": struct.pack("<f", v).hex(), "alloc": None, "host": False}


def _layout(params: list[dict]) -> list[dict]:
    off = 0
    for p in params:
        off = (off + p["size"] - 1) // p["size"] * p["size"]
        p["offset"] = off
        off += p["size"]
    return params


def pass_launches(t: int, pass_no: int, position: int, layers: int,
                  embed_blocks: int = 1) -> list[tuple[str, list[int], list[dict] | None]]:
    """(symbol, grid, params) of one pass of ``t`` tokens at sequence position ``position``."""
    ws = lambda slot: _ptr(A_BASE + (pass_no % 11) * 0x10_0000 + slot * 0x1000, A_BASE, A_SIZE)  # noqa: E731
    out: list[tuple[str, list[int], list[dict] | None]] = [
        ("embed", [embed_blocks * t, 1, 1], [ws(0), _ptr(E_BASE, E_BASE, E_SIZE), ws(1), _i32(64 * t)]),
        ("rope", [cdiv(t, 2), 1, 1], [ws(2), _i32(t)]),
        ("bucket", [cdiv(t, 32), 1, 1], [ws(3)]),
    ]
    for l in range(layers):
        kv = _ptr(KV_BASE + l * 0x10000, KV_BASE, KV_SIZE)
        out += [
            ("rms_norm", [t, 1, 1], [ws(1), _ptr(W_BASE + l * 512, W_BASE, W_SIZE), ws(4), _i32(64), _f32(1e-6)]),
            ("gemm_qkv", [cdiv(t, 64), 3, 1], None),
            ("kv_write", [t, 2, 1], [ws(5), dict(kv), _i32(t), _i64(position)]),
            ("attn", [cdiv(t, 16), 4, 1], [ws(6), dict(kv), ws(7), _i32(position + t)]),
            ("gemm_o", [cdiv(t, 64), 1, 1], None),
            ("rms_norm", [t, 1, 1], [ws(7), _ptr(W_BASE + 4096 + l * 512, W_BASE, W_SIZE), ws(8), _i32(64), _f32(1e-6)]),
            ("act", [3 * t, 1, 1], [ws(8), ws(9), _i32(384 * t)]),
            ("gemm_down", [cdiv(t, 64), 1, 1], None),
        ]
    out += [
        ("rms_norm", [t, 1, 1], [ws(1), _ptr(W_BASE + 8192, W_BASE, W_SIZE), ws(10), _i32(64), _f32(1e-6)]),
        ("lm_head", [1, 150, 1], None),
        ("argmax", [1, 1, 1], [ws(11), _ptr(TOK_BASE, TOK_BASE, TOK_SIZE)]),
    ]
    return [(s, g, None if p is None else _layout(p)) for s, g, p in out]


GEMM_W = 0x1_0000  # GEMM weights: in the norm weights' allocation, from this offset, 0x2000 apart


def gemm_extra_hex(t: int, pass_no: int, gemm: int) -> str:
    """The packed arguments of a pass's ``gemm``-th extra-buffer GEMM: A (activation, moves), B (its
    weight), C (activation, moves), then M, N, K as i32 and 4 bytes of padding."""
    act = A_BASE + (pass_no % 11) * 0x10_0000
    words = [act + 0x2_0000 + gemm * 0x100, W_BASE + GEMM_W + gemm * 0x2000, act + 0x3_0000 + gemm * 0x100]
    raw = b"".join(w.to_bytes(8, "little") for w in words)
    raw += b"".join(v.to_bytes(4, "little") for v in (t, 1024, 1024, 0))
    return raw.hex()


@dataclass
class Truth:
    """What the generator did: per window, the token counts of its passes."""

    windows: list[list[int]]
    requests: list[int]  # window indices that are requests


def write_capture(dir: Path, spec: Spec) -> Truth:
    """Write ``dir/launches.jsonl`` for ``spec``; returns the ground truth."""
    rng = random.Random(spec.seed)
    dir.mkdir(parents=True, exist_ok=True)
    windows: list[list[tuple[int, int]]] = []  # (tokens, position)
    if spec.warmup:
        windows.append([(t, 0) for t in spec.warmup])
    for p in spec.prompts:
        passes = [(p, 0)] + [(1, p + i) for i in range(spec.new_tokens - 1)]
        windows.append(passes)
    lines = []
    t_ns = 1_000_000_000
    seq = 0
    for b in range(spec.autotune):  # autotuning: (L2 flush, act) × 25 per config, host sync between
        for k in range(50):
            sym = "l2_flush" if k % 2 == 0 else "act"
            params = _layout([_ptr(A_BASE + 0x100_0000, A_BASE, A_SIZE), _i32(1 << 20)]) if k % 2 == 0 else \
                _layout([_ptr(A_BASE, A_BASE, A_SIZE), _ptr(A_BASE + 0x1000, A_BASE, A_SIZE), _i32(384 * 64)])
            t_ns += rng.randint(3_000, 9_000)
            lines.append({"seq": seq, "t_ns": t_ns, "pid": 10, "tid": 10, "ctx": 1, "stream": 7,
                          "module_id": 100 if k % 2 == 0 else SYMBOLS.index("act") + 1, "symbol": sym,
                          "api": "cuLaunchKernelEx", "grid": [4096 if k % 2 == 0 else 192, 1, 1],
                          "block": [128, 1, 1], "shared_mem": 0, "attrs": None, "params": params,
                          "params_reason": None})
            seq += 1
        t_ns += 300_000
    if spec.autotune:
        t_ns += spec.request_gap_ns
    pass_no = 0
    for w, passes in enumerate(windows):
        if w:
            t_ns += spec.request_gap_ns
        for j, (tokens, pos) in enumerate(passes):
            launches = pass_launches(tokens, pass_no, pos, spec.layers, spec.embed_blocks)
            times = []
            for k in range(len(launches)):
                t_ns += rng.randint(3_000, 9_000)
                times.append(t_ns)
            if pass_no in spec.late_tail:  # argmax after the host pause
                times[-1] += spec.pass_gap_ns
                t_ns = times[-1]
            if pass_no in spec.early_head:  # embed before the host pause
                times = [times[0]] + [x + spec.pass_gap_ns for x in times[1:]]
                t_ns = times[-1]
            gi = 0
            for (sym, grid, params), tt in zip(launches, times):
                rec = {
                    "seq": seq, "t_ns": tt, "pid": 10, "tid": 10, "ctx": 1, "stream": 7,
                    "module_id": SYMBOLS.index(sym) + 1, "symbol": sym,
                    "api": "cuLaunchKernel" if params is None else "cuLaunchKernelEx",
                    "grid": grid, "block": [128, 1, 1], "shared_mem": 0, "attrs": None,
                    "params": params, "params_reason": "extra" if params is None else None,
                }
                if params is None and spec.gemm_extra:
                    rec["extra_hex"] = gemm_extra_hex(tokens, pass_no, gi)
                    gi += 1
                lines.append(rec)
                seq += 1
            if pass_no in spec.late_tail or pass_no + 1 in spec.early_head:
                t_ns += rng.randint(3_000, 9_000)  # the pause was moved inside a pass
            else:
                t_ns += spec.pass_gap_ns + rng.randint(0, 200_000)
            pass_no += 1
    with open(dir / "launches.jsonl", "w") as f:
        for rec in lines:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    first_req = (1 if spec.warmup else 0) + (1 if spec.autotune else 0)
    wins = [[t for t, _ in ps] for ps in windows]
    return Truth(([[]] if spec.autotune else []) + wins, list(range(first_req, first_req + len(spec.prompts))))


# ---------------------------------------------------------------------------------------------
# A torch.compile-like workload: two graphs, an eager prologue, cache resets, library GEMMs,
# host stalls inside passes, a deterministic allocator. Modelled on the real H200 capture
# (tools/gpu/capture_qwen3_compile.py).

SMALL_BASE, SMALL_SIZE = 0x7F10_0000_0000, 1 << 21  # small-block arena: norm weights AND decode activations
BIG_BASE, BIG_SIZE = 0x7F10_1000_0000, 1 << 26  # prefill activations
EMB_BASE, EMB_SIZE = 0x7F10_2000_0000, 1 << 24  # embedding table
KVC_BASE, KVC_SIZE = 0x7F10_3000_0000, 1 << 24  # static KV cache
DEC_ACT = 0x2_0000  # decode activations: the same offsets of the small arena every decode pass
WGT_BASE = 0x7F10_4000_0000  # GEMM weights of layers >= 1: memory no flat kernel touches (never annotated)
WGT0 = 0x80_0000  # layer 0's GEMM weights: at this offset of the embedding's (annotated) allocation


def gemm_weight(layer: int, k: int) -> int:
    """Address of layer ``layer``'s ``k``-th GEMM weight (0 qkv, 1 o, 2 down) in the compiled workload."""
    if layer == 0:
        return EMB_BASE + WGT0 + k * 0x1_0000
    return WGT_BASE + (3 * layer + k) * 0x10_0000


@dataclass
class CompiledSpec:
    """``warmup``: token counts of single passes in one window, each after a cache reset;
    ``prompts``: one request each (a reset window, then prefill + ``new_tokens - 1`` decodes).
    A pass of 1 token runs the decode graph (``d_*`` kernels: constants, specialised), any other
    the prefill graph (``p_*``). Each pass: ``arange`` (eager, numel = tokens), a guard pause,
    the graph. The GEMMs are library kernels (params via extra) whose choice and count depend on
    the token count; below 64 tokens a flat ``splitk_reduce`` follows the first one. The kernel
    the library picks for a GEMM changes at 64 tokens (qkv, o) or 16 (down), so a kernel's n-th
    launch is not the same GEMM at every token count (at 3 tokens ``gemm_64x8``'s second launch
    is layer 0's down projection, at 17 layer 1's o projection). ``gemm_extra``: each GEMM
    records its packed arguments (activation in, weight, activation out, M, N, K, out again); the weights
    of layers >= 1 lie in memory no flat kernel touches (``WGT_BASE``, never annotated), layer
    0's in the embedding's allocation, lm_head's weight is the embedding (tied). The first
    pass at a new token count stalls before layer 1's GEMM (a library plan for the new shape);
    ``stall_layer``: every prefill pass also stalls before that layer's norm (a consistent
    sub-cycle that must not become a pass boundary)."""

    prompts: list[int]
    warmup: list[int] = field(default_factory=lambda: [64, 17, 3, 1, 2, 7])
    new_tokens: int = 4
    layers: int = 4
    stall_layer: int | None = 2
    seed: int = 1
    gemm_extra: bool = False


def _norm_w(layer: int, which: int) -> dict:
    return _ptr(SMALL_BASE + (2 * layer + which) * 0x800, SMALL_BASE, SMALL_SIZE)


def _gemm_args(a: dict, w: int, c: dict, t: int) -> list[int]:
    """The words of a GEMM's packed arguments: in, weight, out (addresses), M, N, K as i32 (+ pad), then
    the out address again (a library's struct may hold a pointer twice, as cuBLAS's TMA descriptors do)."""
    out = int.from_bytes(bytes.fromhex(c["hex"]), "little")
    return [int.from_bytes(bytes.fromhex(a["hex"]), "little"), w, out, t | (1024 << 32), 1024, out]


def compiled_pass(t: int, call: int, layers: int) -> list[tuple[str, list[int], list[dict] | None, str, list[int] | None]]:
    """(symbol, grid, params, stall tag, packed GEMM words) of one compiled pass of ``t`` tokens; ``call``
    numbers the passes."""
    out: list[tuple[str, list[int], list[dict] | None, str, list[int] | None]] = []
    if t > 1:  # prefill graph: activations move with the token count and the call
        ws = lambda slot: _ptr(BIG_BASE + (call % 5) * 0x40_0000 + t * 0x1000 + slot * 0x8_0000, BIG_BASE, BIG_SIZE)  # noqa: E731
        g = "p"
    else:  # decode graph: the allocator hands out the same small blocks every decode pass
        ws = lambda slot: _ptr(SMALL_BASE + DEC_ACT + slot * 0x200, SMALL_BASE, SMALL_SIZE)  # noqa: E731
        g = "d"
    emb = _ptr(EMB_BASE, EMB_BASE, EMB_SIZE)
    out.append((f"{g}_embed_norm", [t if g == "p" else 1, 1, 1],
                [ws(0), emb, _norm_w(0, 0), ws(1), _i32(t), _i32(1024)], "", None))
    small, mid = t < 64, t < 16
    for l in range(layers):
        kv = _ptr(KVC_BASE + l * 0x10_0000, KVC_BASE, KVC_SIZE)
        if l:
            out.append((f"{g}_add_norm", [t if g == "p" else 4, 1, 1],
                        [ws(2), ws(1), _norm_w(l, 0), ws(3), _i32(t), _i32(1024)],
                        "stall" if g == "p" and l == 1 else "", None))
        x = ws(3) if l else ws(1)
        if small:
            out.append(("gemm_64x8_splitk", [4, 8, 1], None, "plan" if l == 1 else "",
                        _gemm_args(x, gemm_weight(l, 0), ws(4), t)))
            out.append(("splitk_reduce", [32, cdiv(t, 16), 1], _layout([ws(4), ws(5), _i32(t)]), "", None))
        else:
            out.append(("gemm_128x64", [cdiv(t, 128), 24, 1], None, "plan" if l == 1 else "",
                        _gemm_args(x, gemm_weight(l, 0), ws(5), t)))
        out.append((f"{g}_qk_norm_rope_cache", [cdiv(3 * t, 8) if g == "p" else 1, 1, 1],
                    [ws(5), _norm_w(l, 1), kv, ws(6), _i32(t)], "", None))
        out.append((f"{g}_attn_softmax", [16 * t if g == "p" else 16, 1, 1], [ws(6), dict(kv), ws(7), _i32(2048)], "", None))
        out.append(("gemm_64x8" if small else "gemm_128x64", [4, 8, 1] if small else [cdiv(t, 128), 8, 1], None, "",
                    _gemm_args(ws(7), gemm_weight(l, 1), ws(8), t)))
        out.append((f"{g}_mlp_act", [cdiv(3 * t, 4) if g == "p" else 1, 1, 1], [ws(8), ws(2), _i32(3072 * t)], "", None))
        out.append(("gemm_64x8" if mid else "gemm_128x64", [4, 8, 1] if mid else [cdiv(t, 128), 8, 1], None, "",
                    _gemm_args(ws(2), gemm_weight(l, 2), ws(1), t)))
    out.append((f"{g}_final_norm", [t if g == "p" else 1, 1, 1], [ws(2), _norm_w(layers, 0), ws(9), _i32(t)],
                "tail" if g == "p" else "", None))
    out.append(("lm_head", [1, 150, 1], None, "", _gemm_args(ws(9), EMB_BASE, ws(11), t)))
    out.append((f"{g}_argmax", [1, 1, 1], [ws(9), ws(10), _i32(t)], "", None))
    return [(s, gr, None if p is None else _layout(p), tag, x) for s, gr, p, tag, x in out]


@dataclass
class CompiledTruth:
    windows: list[list[int]]  # token counts of each window's passes ([] for a reset window)
    requests: list[int]  # window indices that are requests
    start_of_pass: list[int]  # launch index of every pass's arange


def write_compiled_capture(dir: Path, spec: CompiledSpec) -> CompiledTruth:
    """Write ``dir/launches.jsonl`` for ``spec``; returns the ground truth."""
    rng = random.Random(spec.seed)
    dir.mkdir(parents=True, exist_ok=True)
    lines: list[dict] = []
    t_ns = 5_000_000_000
    seen_t: set[int] = set()
    starts: list[int] = []
    windows: list[list[int]] = []
    requests: list[int] = []
    call = 0

    def emit(sym: str, grid: list[int], params: list[dict] | None, packed: list[int] | None = None) -> None:
        lines.append({"seq": len(lines), "t_ns": t_ns, "pid": 7, "tid": 7, "ctx": 1, "stream": 0,
                      "module_id": 1 + sum(map(ord, sym)) % 997, "symbol": sym,
                      "api": "cuLaunchKernel" if params is None else "cuLaunchKernelEx",
                      "grid": grid, "block": [128, 1, 1], "shared_mem": 0, "attrs": None,
                      "params": params, "params_reason": "extra" if params is None else None})
        if packed is not None and spec.gemm_extra:
            lines[-1]["extra_hex"] = b"".join(w.to_bytes(8, "little") for w in packed).hex()

    def step(us_lo: int, us_hi: int) -> None:
        nonlocal t_ns
        t_ns += rng.randint(us_lo, us_hi) * 1000

    def reset() -> None:  # cache.reset(): one fill per layer, a single pointer each (a write)
        for l in range(spec.layers):
            step(8, 14)
            emit("fill_zero", [2048, 1, 1], _layout([_ptr(KVC_BASE + l * 0x10_0000, KVC_BASE, KVC_SIZE), _i32(0)]))

    def one_pass(t: int) -> None:
        nonlocal call
        step(300, 500)  # the host sync before the pass
        starts.append(len(lines))
        emit("arange", [cdiv(t, 64), 1, 1], _layout([_i32(t), _ptr(SMALL_BASE + 0x1_0000, SMALL_BASE, SMALL_SIZE)]))
        step(1000, 2000)  # graph guards
        first = t not in seen_t
        seen_t.add(t)
        for sym, grid, params, tag, packed in compiled_pass(t, call, spec.layers):
            if tag == "plan" and first:
                step(2000, 3000)
            elif tag == "stall" and spec.stall_layer is not None:
                step(2000, 2500)
            elif tag == "tail":
                step(600, 900)
            else:
                step(15, 40)
            emit(sym, grid, params, packed)
        call += 1

    windows.append(list(spec.warmup))
    for t in spec.warmup:
        step(300, 500)
        reset()
        one_pass(t)
    for p in spec.prompts:
        t_ns += 200_000_000
        windows.append([])
        reset()
        t_ns += 200_000_000
        requests.append(len(windows))
        windows.append([p] + [1] * (spec.new_tokens - 1))
        for t in windows[-1]:
            one_pass(t)
    with open(dir / "launches.jsonl", "w") as f:
        for rec in lines:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return CompiledTruth(windows, requests, starts)
