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
value is a multiple of 16 (for CUDA C kernels it is the same requirement, stated, not compiled
in).  Nothing else is specialized (in particular an integer
equal to 1 is *not*), so each instance's parameter list is fixed.  Triton kernels
get two hidden trailing ``u64`` params (global / profile scratch, always passed 0).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace

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
    # Dynamic shared memory that grows with a scalar param: bytes = shared_mem + Σ coeff × value
    # of that param at the launch (e.g. {"k": 2} for a bf16 row of k elements staged in smem).
    shared_mem_per: dict = field(default_factory=dict)
    # CUDA only: preprocessor macros (-D) of this instance's module, and the suffix that names
    # that module (`embedding` + `_pdl` -> embedding_pdl.cubin); all kernels of one source with
    # the same defines share a module. Triton: every instance is its own module, NAME.cubin.
    defines: tuple[str, ...] = ()
    module_suffix: str = ""
    # Programmatic dependent launch: the instance keeps the manifest's `"pdl": true` contract
    # (packages/kern-schema/README.md); written as `"pdl": true` in its index entry.
    pdl: bool = False
    # CUDA only: the launch's dynamic shared memory in bytes (Triton: what its compiler reports).
    shared_mem: int = 0
    # The launch's preferred shared-memory carveout (percent 0..100, the manifest launch field `carveout`), or None for
    # the driver's choice; written as `"carveout"` in its index entry, which gen_qwen3.py copies into the launch.
    carveout: int | None = None

    @property
    def block(self) -> list[int]:
        return [self.block_x if self.lang == "cuda" else 32 * self.num_warps, 1, 1]

    @property
    def module(self) -> str:
        """The cubin file of this instance in the kernels dir."""
        if self.lang == "cuda":
            return self.source.rsplit(".", 1)[0] + self.module_suffix + ".cubin"
        return self.name + ".cubin"

    def key(self):
        return (self.lang, self.source, self.entry, self.params, tuple(sorted(self.constexprs.items())),
                self.num_warps, self.num_stages, self.block_x, tuple(sorted(self.shared_mem_per.items())),
                self.defines, self.module_suffix, self.pdl, self.shared_mem, self.carveout)


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


D_HEAD = 128
DECODE_BLOCK_N = 64
DECODE_MAX_SPLITS = 64
PREFILL_BLOCK_M = 128
PREFILL_BLOCK_N = 64
KV = P("kv", "in ptr", True, "bf16")
ATTN_TAIL = (P("num_q_heads", "i32"), P("num_kv_heads", "i32"), P("q_stride", "i32", True),
             P("bt_stride", "i32"), P("page_bytes", "i32"), P("sm_scale", "f32"))


def _attention_kernels() -> list[Kernel]:
    return [
        Kernel(
            name="qk_norm_rope_kv", lang="triton", source="attention.py", entry="qk_norm_rope_kv",
            params=(P("qkv", BF16_INOUT, True), P("positions", "in buffer<i64>", True),
                    P("slot_mapping", "in buffer<i64>", True), P("q_norm_w", BF16_IN, True),
                    P("k_norm_w", BF16_IN, True), P("cos_sin", "in buffer<f32>", True),
                    P("kv", "inout ptr", True, "bf16"), P("num_q_heads", "i32"), P("num_kv_heads", "i32"),
                    P("eps", "f32"), P("page_bytes", "i32")),
            grid="(tokens, NKV, 1): one program per (token, kv head)",
            doc="Fused attention prologue. qkv: bf16 [tokens, (NQ+2*NKV)*128] (q|k|v heads); q heads are "
                "replaced IN PLACE by rope(rmsnorm(q)*q_norm_w); k := rope(rmsnorm(k)*k_norm_w) and v are "
                "written to the paged KV (head-major layout, tools/README.md; kv = state + layer*NKV*8192, "
                "65,536 for 8 kv heads; page_bytes = L*NKV*8192) at slot_mapping[t] (slot < 0: skipped); the k/v "
                "columns of qkv are not modified. positions, slot_mapping: i64 [tokens]; q_norm_w, k_norm_w: bf16 [128]; cos_sin: f32 "
                "[max_pos, 128] (cos then sin); eps = rms_norm_eps. Neox rotary over the full head_dim. NQ/NKV <= 16.",
            constexprs={"D": D_HEAD, "BLOCK_G": 16}, num_warps=4,
        ),
        Kernel(
            name="paged_decode_attention", lang="triton", source="attention.py", entry="paged_decode_attention",
            params=(P("q", BF16_IN, True), KV, P("block_table", "in buffer<i32>", True),
                    P("seq_lens", "in buffer<i32>", True), P("part_acc", "out buffer<f32>", True),
                    P("part_ml", "out buffer<f32>", True)) + ATTN_TAIL,
            grid="(NKV, S, seqs), S = number of KV splits (1..64; 32 recommended): >= 132 CTAs",
            doc="Decode attention stage 1 (one query token per sequence, GQA, split-KV). q: bf16, head j of "
                "sequence b at q + b*q_stride + j*128 (q_stride = (NQ+2*NKV)*128 when q is the qkv buffer); "
                "kv = state + layer*NKV*8192 (65,536 for 8 kv heads; the head-major layout of tools/README.md); "
                "block_table: i32 [seqs, bt_stride] page ids; seq_lens: i32 [seqs] "
                "(>= 1, keys 0..L-1 incl. the current token). Writes impl scratch part_acc: f32 "
                "[seqs, NQ, S, 128] and part_ml: f32 [seqs, NQ, S, 2] (running max in log2 units, sum). "
                "sm_scale = 1/sqrt(128).",
            constexprs={"D": D_HEAD, "BLOCK_H": 16, "BLOCK_N": DECODE_BLOCK_N}, num_warps=4, num_stages=2,
        ),
        Kernel(
            name="paged_decode_reduce", lang="triton", source="attention.py", entry="paged_decode_reduce",
            params=(P("part_acc", "in buffer<f32>", True), P("part_ml", "in buffer<f32>", True),
                    P("out", BF16_OUT, True), P("num_q_heads", "i32"), P("num_splits", "i32")),
            grid="(NQ, seqs, 1)",
            doc="Decode attention stage 2: merges the S splits of paged_decode_attention (num_splits = S, "
                "<= 64) into out: bf16 [seqs, NQ*128].",
            constexprs={"D": D_HEAD, "MAX_SPLITS": DECODE_MAX_SPLITS}, num_warps=4,
        ),
        Kernel(
            name="paged_prefill_attention", lang="triton", source="attention.py",
            entry="paged_prefill_attention",
            params=(P("q", BF16_IN, True), KV, P("block_table", "in buffer<i32>", True),
                    P("seq_lens", "in buffer<i32>", True), P("cu_seqlens_q", "in buffer<i32>", True),
                    P("out", BF16_OUT, True)) + ATTN_TAIL,
            grid=f"(ceil_div(tokens, {PREFILL_BLOCK_M}), NQ, seqs)",
            doc="Causal prefill attention of a chunk against the paged cache (which already holds the chunk's "
                "k/v: run after qk_norm_rope_kv). Sequence b's queries are q rows cu_seqlens_q[b].."
                "cu_seqlens_q[b+1]-1 (bf16, head j at row*q_stride + j*128); with L = seq_lens[b] and n "
                "queries, query i is at position L-n+i and sees keys 0..L-n+i. out: bf16 [tokens, NQ*128]. "
                "block_table: i32 [seqs, bt_stride]; sm_scale = 1/sqrt(128).",
            constexprs={"D": D_HEAD, "BLOCK_M": PREFILL_BLOCK_M, "BLOCK_N": PREFILL_BLOCK_N},
            num_warps=8, num_stages=3,
        ),
    ]


#: The CUDA C decode attention (decode_attention.cu): warps per CTA, the ring of page slots per warp
#: (one slot = one page of one kv head: 16 token rows of k|v, 512 bytes each, unpadded and swizzled as in the
#: head-major cache: one bulk copy per page), the mbarriers before the rings (one per slot, up to 8 slots per
#: warp), the cluster size, and the partials a cluster CTA receives (per source CTA: m and l of 8 q heads, and
#: 128 acc).
DA_WARPS = 4
DA_ROW = 512
DA_SLOT_BYTES = 16 * DA_ROW
DA_BAR_BYTES = DA_WARPS * 8 * 8
DA_SPLIT_SLOTS = 2
DA_CLUSTER = 8
DA_CLUSTER_SLOTS = 4
#: The rope-cluster form's ring in the PDL module (decode_attention.cu DA_ROPE_SLOTS; the plain module's is
#: DA_CLUSTER_SLOTS), launched with carveout 0 (DA_ROPE_CARVEOUT): the driver then gives its SMs the 100 KB
#: shared-memory configuration (164 KB for 4 slots; 228 KB for 2 slots without the carveout, to fit three CTAs per
#: SM), which leaves the GEMV blocks beside and after it 156 KB of L1 (H200, session 19, NOTES.md 55).
DA_ROPE_SLOTS = 2
DA_ROPE_CARVEOUT = 0
#: Of a cluster-form warp's first DA_CLUSTER_SLOTS pages, those its PDL form issues before griddepcontrol.wait
#: (decode_attention.cu DA_PRE_PAGES), and the same for the rope-cluster form (DA_ROPE_PRE_PAGES: its whole ring
#: since session 18, where the qkv GEMV before it leaves its CTAs room, NOTES.md 54; 4 pages then, DA_ROPE_SLOTS = 2
#: since session 19). The plain module issues 2 before q's load in both (since session 21; before, q's load first).
DA_PRE_PAGES = 2
DA_ROPE_PRE_PAGES = DA_ROPE_SLOTS
DA_RECV_BYTES = DA_CLUSTER * (2 * 8 + 8 * 128 // DA_CLUSTER) * 4


def da_cluster_smem(slots: int, warps: int = DA_WARPS, cluster: int = DA_CLUSTER) -> int:
    """Dynamic shared memory (bytes) of the cluster and rope-cluster forms with a ring of `slots` pages per warp
    (decode_attention.cu DA_CLUSTER_SMEM / DA_ROPE_SMEM): the slots' mbarriers (64 bytes per warp: one per slot, up to
    8 slots), the warps' rings, then the cluster's partials pushed to each CTA (per source CTA: m and l of 8 q heads,
    and its 8·128/`cluster` acc). `warps` and `cluster` are the -DDA_WARPS / -DDA_CLUSTER of experiment builds
    (tools/gpu/da_variants.py, qkv_attention_bench.py); the defaults give the catalog's instances."""
    return warps * 8 * 8 + warps * slots * DA_SLOT_BYTES + cluster * (2 * 8 + 8 * 128 // cluster) * 4


def da_split_smem() -> int:
    """Dynamic shared memory (bytes) of decode_attention_split (decode_attention.cu DA_SPLIT_SMEM): the slots'
    mbarriers, then the warps' rings of DA_SPLIT_SLOTS pages."""
    return DA_BAR_BYTES + DA_WARPS * DA_SPLIT_SLOTS * DA_SLOT_BYTES

#: Decode attention as the split + merge pair / the one-launch cluster form (gen_qwen3.py --decode-attention).
DECODE_ATTENTION_CUDA = ("decode_attention_split", "decode_attention_merge")
DECODE_ATTENTION_CLUSTER = "decode_attention_cluster"
#: The cluster form with qk_norm_rope_kv's decode work fused in (gen_qwen3.py --decode-attention rope-cluster).
DECODE_ATTENTION_ROPE_CLUSTER = "decode_attention_rope_cluster"
DA_DOC_COMMON = ("q: bf16, head j of sequence b at q + b*q_stride + j*128 (q_stride = (NQ+2*NKV)*128 when q is the qkv "
                 "buffer; a multiple of 16); kv = state + layer*NKV*8192 (the head-major layout of tools/README.md; "
                 "16-byte aligned; page_bytes = L*NKV*8192, a multiple of 512); block_table: i32 [seqs, bt_stride] "
                 "page ids; seq_lens: i32 [seqs] (>= 1, keys 0..L-1 incl. the current token). G = NQ/NKV q heads "
                 "per kv head, 1 <= G <= 8 (MAX_G). sm_scale = 1/sqrt(128). "
                 "fp32 accumulation and softmax (base 2), P rounded to bf16 for the PV product (tensor cores), one "
                 "rounding of the output.")


def _decode_attention_cuda_kernels() -> list[Kernel]:
    """Decode attention in CUDA C (decode_attention.cu, one module): the split + merge pair (one op, two
    launches, paged_decode_attention's scratch layout), the one-launch cluster form, and the cluster form
    with qk_norm_rope_kv's decode work fused in."""
    head = (P("q", BF16_IN, True), KV, P("block_table", "in buffer<i32>", True), P("seq_lens", "in buffer<i32>", True))
    cx = {"D": D_HEAD, "MAX_G": 8, "WARPS": DA_WARPS, "PAGE": 16, "MIN_PAGES_PER_SPLIT": DA_WARPS,
          "MAX_SPLITS": DECODE_MAX_SPLITS}
    split_doc = ("S = grid.y CTAs per kv head, of which the first ns = min(S, 64, max(1, ceil(ceil(L/16)/4))) work "
                 "(at least 4 pages, one per warp, per split; the others exit at once and write nothing); warp w of "
                 "split s takes logical pages s*4+w + k*4*min(S, 64) (round-robin over the warps of the ns splits).")
    return [
        Kernel(
            name="decode_attention_split", lang="cuda", source="decode_attention.cu", entry="decode_attention_split",
            block_x=32 * DA_WARPS, shared_mem=da_split_smem(),
            params=head + (P("part_acc", "out buffer<f32>", True), P("part_ml", "out buffer<f32>", True)) + ATTN_TAIL,
            grid="(NKV, S, seqs), S = the split stride of the scratch (1..64; 32 recommended)",
            doc="Decode attention, split-KV stage (CUDA C, flash decoding: one CTA per (kv head, split) for the whole "
                "GQA group, K and V read once, a ring of pages by bulk copy, mma.sync). " + split_doc + " Writes, for "
                "the ns splits only, paged_decode_attention's scratch layout: part_acc f32 [seqs, NQ, S, 128] "
                "(sum p v), part_ml f32 [seqs, NQ, S, 2] (running max in log2 units, sum p). " + DA_DOC_COMMON,
            constexprs={**cx, "SLOTS": DA_SPLIT_SLOTS},
        ),
        Kernel(
            name="decode_attention_merge", lang="cuda", source="decode_attention.cu", entry="decode_attention_merge",
            block_x=32 * DA_WARPS,
            params=(P("part_acc", "in buffer<f32>", True), P("part_ml", "in buffer<f32>", True),
                    P("seq_lens", "in buffer<i32>", True), P("out", BF16_OUT, True), P("num_q_heads", "i32"),
                    P("num_splits", "i32")),
            grid="(NQ, seqs, 1)",
            doc="Decode attention, merge stage of decode_attention_split (num_splits = its S): reads the ns splits "
                "it wrote (ns from seq_lens, as there) and writes out: bf16 [seqs, NQ*128], out = bf16(sum_s "
                "2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s), M = max_s m_s (IEEE division).",
            constexprs={"D": D_HEAD, "MAX_SPLITS": DECODE_MAX_SPLITS, "MIN_PAGES_PER_SPLIT": DA_WARPS},
        ),
        Kernel(
            name=DECODE_ATTENTION_CLUSTER, lang="cuda", source="decode_attention.cu", entry="decode_attention_cluster",
            block_x=32 * DA_WARPS, shared_mem=da_cluster_smem(DA_CLUSTER_SLOTS),
            params=head + (P("out", BF16_OUT, True),) + ATTN_TAIL,
            grid=f"(NKV, {DA_CLUSTER}, seqs): grid.y must be {DA_CLUSTER}, the compiled cluster is (1, {DA_CLUSTER}, 1)",
            doc=f"Decode attention in ONE launch (CUDA C): a thread-block cluster of {DA_CLUSTER} CTAs per (kv head, "
                f"sequence), CTA r taking logical pages r*4+w + k*{4 * DA_CLUSTER} for its warps w (as "
                f"decode_attention_split with {DA_CLUSTER} splits); each CTA pushes its partial through distributed "
                "shared memory to the CTAs that merge it (CTA r: outputs [r*G*16, (r+1)*G*16) of the kv head's G*128), "
                "as st.async stores counted on the owner's receive mbarrier (128 bytes of static shared memory), then "
                "each waits for its own bytes and merges its slice into out: bf16 [seqs, NQ*128]. No scratch, no "
                "state. " + DA_DOC_COMMON,
            constexprs={**cx, "SLOTS": DA_CLUSTER_SLOTS, "CLUSTER": DA_CLUSTER},
        ),
        Kernel(
            name=DECODE_ATTENTION_ROPE_CLUSTER, lang="cuda", source="decode_attention.cu",
            entry="decode_attention_rope_cluster",
            block_x=32 * DA_WARPS, shared_mem=da_cluster_smem(DA_CLUSTER_SLOTS),
            params=(P("qkv", BF16_IN, True), P("positions", "in buffer<i64>", True),
                    P("slot_mapping", "in buffer<i64>", True), P("q_norm_w", BF16_IN, True),
                    P("k_norm_w", BF16_IN, True), P("cos_sin", "in buffer<f32>", True),
                    P("kv", "inout ptr", True, "bf16"), P("block_table", "in buffer<i32>", True),
                    P("seq_lens", "in buffer<i32>", True), P("out", BF16_OUT, True)) + ATTN_TAIL + (P("eps", "f32"),),
            grid=f"(NKV, {DA_CLUSTER}, seqs): grid.y must be {DA_CLUSTER}, the compiled cluster is (1, {DA_CLUSTER}, 1)",
            doc=f"{DECODE_ATTENTION_CLUSTER} with qk_norm_rope_kv's decode work fused in (one launch per layer instead "
                "of two): qkv: bf16 [seqs, (NQ+2*NKV)*128] (q_stride = its row; read only: q is rotated in "
                "registers, not in place); each CTA computes its group's q = rope(rmsnorm(q)*q_norm_w); the warp "
                "whose pages hold the current token (position L-1) computes k = rope(rmsnorm(k)*k_norm_w) and v, "
                "stores them into the KV cache at slot_mapping[b] (slot < 0: not stored) and into its shared-memory "
                "copy of that page (so the launch never reads its own global store). positions, slot_mapping: i64 "
                "[seqs] (slot_mapping[b] must be position L-1's slot in block_table, positions[b] its rotary "
                "position); q_norm_w, k_norm_w: bf16 [128]; cos_sin: f32 [max_pos, 128] (cos then sin); eps = "
                "rms_norm_eps; fp32 norm and rotary, one rounding to bf16 (qk_norm_rope_kv's math, not its bits: "
                "~1 bf16 ulp apart). " + DA_DOC_COMMON,
            constexprs={**cx, "SLOTS": DA_CLUSTER_SLOTS, "CLUSTER": DA_CLUSTER},
        ),
    ]


#: nvcc flags per CUDA source, after the common `-cubin -arch=sm_90 -O3 -std=c++17`.  The GEMV
#: kernels round where HF rounds and were checked against float64 without fast math
#: (IEEE division, no flush-to-zero): keep it that way.
CUDA_FLAGS: dict[str, tuple[str, ...]] = {
    "decode_attention.cu": (),
    "embedding.cu": ("--use_fast_math",),
    "argmax.cu": ("--use_fast_math",),
    "gemv.cu": (),
    "gemv_tc.cu": (),
    "gemv_persist.cu": (),
    "lm_head_screen.cu": (),
}

#: The decode GEMV block: 8 warps (gemv.cu `WARPS`), 256 threads.
GEMV_WARPS = 8
#: Values of M (rows of x) with a GEMV entry (gemv.cu `INSTANTIATE`).
GEMV_MS = (1, 2, 4, 8)
#: ksplit values the GEMV kernels accept: the warps of a block split k in groups of ksplit.
GEMV_KSPLITS = (1, 2, 4, 8)


#: 16-byte weight loads per row per pipeline stage (gemv.cu's U) of the entries with no suffix: 4 for
#: M = 1, else 2; M = 1 also has `_u5` entries with 5 (tools/gemv_plan.py `gemv_entry_unroll` picks one; its
#: GEMV_UNROLL_SUFFIX is the inverse of GEMV_M1_UNROLLS).
GEMV_UNROLL = {1: 4, 2: 2, 4: 2, 8: 2}
#: Suffixed M = 1 entries: suffix -> loads per row per stage.
GEMV_M1_UNROLLS = {"_u5": 5}
#: The M = 1 norm entries' batched-prologue forms (gemv.cu INSTANTIATE_NORM_NB, norm_to_smem's NB): entry suffix, and
#: the most x vectors per thread it batches (their constexpr NORM_NB; the plain entries have no NORM_NB: the loop).
GEMV_NORM_NB_SUFFIX, GEMV_NORM_NB = "_nb2", 2


def _gemv_kernels() -> list[Kernel]:
    """The decode GEMV family of gemv.cu: 4 variants × M in 1, 2, 4, 8, and the four M = 1
    variants again with 5 loads per row per stage (`_u5`), one module.

    Each warp group (ksplit warps of the block, splitting k) produces COLS_PER_WARP
    output columns of y for all M rows, so grid.x = ceil_div(n, COLS_PER_WARP·8/ksplit).
    The constexpr UNROLL is the entry's loads per row per stage; its first two stages are issued
    before griddepcontrol.wait.
    """
    out = [k for M in GEMV_MS for k in _gemv_family(M, "", GEMV_UNROLL[M])]
    out += [k for sfx, u in GEMV_M1_UNROLLS.items() for k in _gemv_family(1, sfx, u)]
    out += _gemv_norm_nb_kernels(out)
    return out + _gemv_passes_kernels(out)


def _gemv_norm_nb_kernels(base: list[Kernel]) -> list[Kernel]:
    """The batched-prologue forms `NAME_nb2` of the M = 1 norm entries (kern_gemv_norm{,_silu}_m1{,_u5}): the same
    params, grid, shared memory, arithmetic and bits; for k/8 in (256, 2·256] (two x vectors per thread:
    tools/gemv_plan.py `gemv_norm_batched`) the prologue loads each thread's x and norm_w vectors together after the
    wait and holds them in registers through the block barrier; other k take the plain entries' loop. Entries of
    their own because compiled into the plain entries the batched path slowed the loop's k (NOTES.md 71)."""
    names = [f"kern_gemv{v}_m1{sfx}" for v in ("_norm", "_norm_silu") for sfx in ("", *GEMV_M1_UNROLLS)]
    by_name = {k.name: k for k in base}
    return [replace(k, name=k.name + GEMV_NORM_NB_SUFFIX, entry=k.entry + GEMV_NORM_NB_SUFFIX,
                    constexprs={**k.constexprs, "NORM_NB": GEMV_NORM_NB},
                    doc=k.doc + f" Batched norm prologue (gemv.cu norm_to_smem NB = {GEMV_NORM_NB}): for k/8 in "
                        f"(256, {GEMV_NORM_NB * 256}] each thread's x and norm_w vectors are loaded together after the "
                        "wait and kept in registers through the block barrier (one L2 round trip, not one per loop "
                        "trip and pass); other k as the plain entry.")
            for k in (by_name[n] for n in names)]


#: Row passes per block of the row-pass module (gemv.cu -DGEMV_PASSES; tools/gemv_plan.py `gemv_passes`).
GEMV_PASSES = 2


def _gemv_passes_kernels(base: list[Kernel]) -> list[Kernel]:
    """The row-pass forms of the norm GEMV for the launch before the decode attention (`kern_gemv_norm_m1_p2`, and
    `kern_gemv_norm_m1_nb2_p2` of its batched-prologue form):
    gemv.cu compiled with -DGEMV_PASSES=2 into its own module (gemv_p2.cubin; the default gemv.cubin is unchanged),
    the entry `kern_gemv_norm_m1` with the same params and bits, each block owning PASSES consecutive 16-row units
    (ksplit 1): grid.x = ceil_div(n, 16·PASSES). NOTES.md 54."""
    return [replace(k, name=k.name + f"_p{GEMV_PASSES}", defines=(f"GEMV_PASSES={GEMV_PASSES}",),
                    module_suffix=f"_p{GEMV_PASSES}", constexprs={**k.constexprs, "PASSES": GEMV_PASSES},
                    grid=f"(ceil_div(n, 16 * {GEMV_PASSES}), 1, 1): 8 warps × 2 rows per block, {GEMV_PASSES} times "
                         "over; ksplit must be 1",
                    doc=k.doc + f" Row-pass form (module gemv_p{GEMV_PASSES}.cubin, gemv.cu -DGEMV_PASSES="
                        f"{GEMV_PASSES}): the same params, arithmetic and bits; each block computes {GEMV_PASSES} "
                        "consecutive units of 16 rows in one register pipeline, so the grid leaves SMs room for "
                        "the next PDL launch's blocks (the decode attention after the qkv GEMV).")
            for k in base if k.name in ("kern_gemv_norm_m1", "kern_gemv_norm_m1" + GEMV_NORM_NB_SUFFIX)]


def _gemv_family(M: int, sfx: str, unroll: int) -> list[Kernel]:
    """gemv.cu's four variants for one M and U (entry suffix `sfx`: "" or "_u5")."""
    x, w = P("x", BF16_IN, True), P("w", BF16_IN, True)
    nw = P("norm_w", BF16_IN, True)
    n, k, eps, ksplit = P("n", "i32"), P("k", "i32"), P("eps", "f32"), P("ksplit", "i32")
    common = ("k: multiple of 8; every pointer 16-byte aligned; ksplit in 1, 2, 4, 8 (the block's 8 warps "
              f"split k in groups of ksplit). bf16 storage, fp32 accumulation. {unroll} 16-byte weight loads per row "
              f"per lane per pipeline stage, the first two stages issued before griddepcontrol.wait.")
    rows_grid = "(ceil_div(n, 16 / ksplit), 1, 1): 8 warps × 2 rows per block, ksplit warps per row pair"

    def kern(variant: str, params: tuple, grid: str, doc: str, cols: int, smem: bool) -> Kernel:
        name = f"kern_gemv{variant}_m{M}{sfx}"
        return Kernel(name=name, lang="cuda", source="gemv.cu", entry=name, block_x=256, params=params, grid=grid,
                      doc=doc + common, constexprs={"M": M, "WARPS": GEMV_WARPS, "COLS_PER_WARP": cols, "UNROLL": unroll},
                      shared_mem_per={"k": 2 * M} if smem else {})

    norm_smem = f"Dynamic shared memory {M}*k*2 bytes (shared_mem_per). "
    return [
        kern("", (x, w, P("y", BF16_OUT, True), n, k, ksplit), rows_grid,
             f"y[m,j] = bf16(sum_k x[m,k] w[j,k]) for m < {M}, j < n. x: bf16 [{M}, k]; w: bf16 [n, k]; "
             f"y: bf16 [{M}, n]. ", 2, False),
        kern("_norm", (x, nw, w, P("y", BF16_OUT, True), n, k, eps, ksplit), rows_grid,
             f"RMS norm prologue + GEMV: xn[m,:] = bf16(norm_w * bf16(x[m,:] * rsqrt(mean(x[m,:]^2) + eps))) "
             f"(HF Qwen3RMSNorm rounding), y[m,j] = bf16(sum_k xn[m,k] w[j,k]). x: bf16 [{M}, k]; norm_w: "
             f"bf16 [k]; w: bf16 [n, k]; y: bf16 [{M}, n]. " + norm_smem, 2, True),
        kern("_norm_silu", (x, nw, w, P("y", BF16_OUT, True), n, k, eps, ksplit),
             "(ceil_div(n, 8 / ksplit), 1, 1): one output column (its gate and up row) per warp group",
             f"RMS norm prologue (as kern_gemv_norm) + gate/up GEMV + SiLU-and-mul: g = bf16(xn·w[j]), "
             f"u = bf16(xn·w[n+j]), y[m,j] = bf16(bf16(silu(g)) * u). x: bf16 [{M}, k]; norm_w: bf16 [k]; "
             f"w: bf16 [2n, k] (gate rows, then up rows); y: bf16 [{M}, n]. " + norm_smem, 1, True),
        kern("_residual", (x, w, P("residual", BF16_INOUT, True), n, k, ksplit), rows_grid,
             f"GEMV + residual add, in place: residual[m,j] = bf16(residual[m,j] + bf16(sum_k x[m,k] w[j,k])) "
             f"for m < {M}, j < n (nothing else is touched). x: bf16 [{M}, k]; w: bf16 [n, k]; residual: "
             f"bf16 [{M}, n]. ", 2, False),
    ]


#: gemv_tc.cu's elements of k per step of a warp, for each M (k must be a multiple; the index constexpr TC_STEP): M = 1
#: on the runs layout, 128 (four 32-element chunks of two rows per mma; tools/gemv_plan.py GEMV_TC_STEP, what the
#: generator launches), M > 1 on the tile layout, 32.
GEMV_TC_STEPS = {1: 128, 2: 32, 4: 32, 8: 32}
#: gemv_tc.cu's mma steps per pipeline stage for each M (INSTANTIATE_TC): M ≤ 4 share one mma per loaded row (B's 8
#: columns carry x for up to 4 inputs), so they keep M = 1's U = 4 at the same 16 accumulators; M = 8 takes two mma
#: per row (32 accumulators) and U = 2 to stay within 128 registers. The M = 1 `_u5` entries: GEMV_M1_UNROLLS.
GEMV_TC_UNROLL = {1: 4, 2: 4, 4: 4, 8: 2}


def _gemv_tc_kernels() -> list[Kernel]:
    """The decode GEMVs on the tensor cores (gemv_tc.cu, one module, gemv_tc.cubin): gemv.cu's four variants for
    M in 1, 2, 4, 8 with the same params, interfaces and roundings (M = 1 also `_u5`), entries `kern_gemvtc*`
    (tools/gemv_plan.py `gemv_tc_entry`). Each block owns one tile of 16 rows (norm_silu: 8 output columns, their gate
    and up rows) and its 8 warps split k; the dot products are mma.sync.m16n8k16 (bf16, fp32 accumulate), one mma
    per loaded row for up to 4 inputs (two for M = 8), deterministic but not gemv.cu's bits. M = 1 reads each row in
    256-byte runs (two rows per warp, four chunks of k in B's columns), M > 1 in 64-byte runs (8 rows per warp, B's
    columns carrying the inputs). ksplit must be 1 (the grid is gemv.cu's at ksplit 1) and k a multiple of
    GEMV_TC_STEPS[M]; a launch that breaks either traps. tools/gemv_plan.py `gemv_tensor_core` says which ops the
    generator puts on them (NOTES.md 72, 74)."""
    out = []
    forms = [(1, "", GEMV_TC_UNROLL[1]), *((1, sfx, u) for sfx, u in GEMV_M1_UNROLLS.items()),
             *((M, "", GEMV_TC_UNROLL[M]) for M in GEMV_MS if M > 1)]
    for M, sfx, u in forms:
        for k in _gemv_family(M, sfx, u):
            name = "kern_gemvtc" + k.name[len("kern_gemv"):]
            cols = k.constexprs["COLS_PER_WARP"]
            grid = (f"(ceil_div(n, {2 * GEMV_WARPS}), 1, 1): one tile of {2 * GEMV_WARPS} rows per block, its 8 warps "
                    "splitting k; ksplit must be 1" if cols == 2 else
                    f"(ceil_div(n, {GEMV_WARPS}), 1, 1): {GEMV_WARPS} output columns (their gate and up rows: one tile "
                    "of 16 rows) per block, its 8 warps splitting k; ksplit must be 1")
            step = GEMV_TC_STEPS[M]
            doc = k.doc.replace("k: multiple of 8", f"k: multiple of {step}").replace(
                "ksplit in 1, 2, 4, 8 (the block's 8 warps split k in groups of ksplit)", "ksplit must be 1 (the "
                "block's 8 warps always split k; other values trap)").replace(
                f"{u} 16-byte weight loads per row per lane per pipeline stage",
                f"{u} steps ({step} elements of k of two rows, two 16-byte loads) per lane per pipeline stage")
            doc += (" Tensor-core form (gemv_tc.cu): the dot products by mma.sync.m16n8k16 (bf16 in, fp32 accumulate), "
                    "each 16-byte weight load an mma's A operand" + (
                        "; the runs layout: a warp reads two rows in 256-byte runs, its k in two halves per block, B's "
                        "columns carrying four chunks of k" if M == 1 else
                        f", B's columns carrying the {M} inputs' x" + (" (two mma per load)" if M > 4 else "")) +
                    "; deterministic, not gemv.cu's bits.")
            nb = {"NORM_NB": GEMV_NORM_NB} if "_norm" in name and M == 1 else {}  # norm_to_smem<1, false, 2>:
            # batched for k/8 in (256, 512], the loop otherwise (as gemv.cu's `_nb2` entries); M > 1: the loop
            out.append(replace(k, name=name, entry=name, source="gemv_tc.cu", grid=grid, doc=doc,
                               constexprs={**k.constexprs, "TC_STEP": step, **nb}))
    return out


#: The persistent decode GEMVs (gemv_persist.cu): one 256-thread block per SM, each of its 8 warps streams
#: its own output columns through its own FIFO of bulk-copy slots; launch plans from tools/gemv_plan.py.
GEMVP_DOC = (" Persistent form (gemv_persist.cu): grid (G, 1, 1), G = min(SMs, n) (one block per SM; block b "
             "computes outputs [n·b/G, n·(b+1)/G)); piece_chunks = chunks of 256 elements per shared-memory slot; "
             "dynamic shared memory 2·k bytes (x or its norm) + the slots: slots = min(64, (bytes − 2k) / "
             "(piece_chunks·512)) ≥ 8, in 8 per-warp FIFOs (tools/gemv_plan.py `plan_gemvp` gives piece_chunks, G "
             "and the bytes; a launch that breaks the rules traps). k: multiple of 256; every pointer 16-byte "
             "aligned. bf16 storage, fp32 accumulation (two chunk chains per warp, then a warp sum), the same "
             "bits for any grid or timing. Programmatic dependent launch: launch_dependents at entry, the first "
             "weight copies before griddepcontrol.wait, nothing of an earlier launch read before it (no-op "
             "without the launch attribute).")


def _gemvp_kernels() -> list[Kernel]:
    """The persistent decode GEMVs of gemv_persist.cu (m = 1), one module: the same four ops, arithmetic
    and roundings as gemv.cu's kern_gemv*_m1, with `piece_chunks` in place of `ksplit`."""
    x, w = P("x", BF16_IN, True), P("w", BF16_IN, True)
    nw, y = P("norm_w", BF16_IN, True), P("y", BF16_OUT, True)
    n, k, eps, pc = P("n", "i32"), P("k", "i32"), P("eps", "f32"), P("piece_chunks", "i32")
    consts = {"M": 1, "WARPS": GEMV_WARPS, "PERSISTENT": 1, "CHUNK": 256, "MAX_SLOTS": 64}
    grid = "(min(SMs, n), 1, 1): one block per SM (tools/gemv_plan.py)"
    specs = [
        ("kern_gemvp_m1", (x, w, y, n, k, pc), "y[j] = bf16(sum_k x[k] w[j,k]), j < n. x: bf16 [1, k]; w: bf16 [n, k]; "
         "y: bf16 [1, n]."),
        ("kern_gemvp_norm_m1", (x, nw, w, y, n, k, eps, pc), "RMS norm prologue (kern_gemv_norm_m1's rounding) + "
         "GEMV: y[j] = bf16(sum_k xn[k] w[j,k]). x: bf16 [1, k]; norm_w: bf16 [k]; w: bf16 [n, k]; y: bf16 [1, n]."),
        ("kern_gemvp_norm_silu_m1", (x, nw, w, y, n, k, eps, pc), "RMS norm prologue + gate/up GEMV + "
         "SiLU-and-mul (kern_gemv_norm_silu_m1's rounding): y[j] = bf16(bf16(silu(bf16(xn·w[j]))) * bf16(xn·w[n+j])). "
         "x: bf16 [1, k]; norm_w: bf16 [k]; w: bf16 [2n, k] (gate rows, then up rows); y: bf16 [1, n]."),
        ("kern_gemvp_residual_m1", (x, w, P("residual", BF16_INOUT, True), n, k, pc), "GEMV + residual add, in "
         "place: residual[j] = bf16(residual[j] + bf16(sum_k x[k] w[j,k])), j < n. x: bf16 [1, k]; w: bf16 [n, k]; "
         "residual: bf16 [1, n]."),
    ]
    return [Kernel(name=name, lang="cuda", source="gemv_persist.cu", entry=name, block_x=256, params=params, grid=grid,
                   doc=doc + GEMVP_DOC, constexprs=dict(consts), shared_mem_per={"k": 2})
            for name, params, doc in specs]


#: The screened lm_head for greedy decode (lm_head_screen.cu): rows per screen block (8 warps × LM_SCREEN_ROWS_PER_WARP),
#: rows per pick block, int8 16-byte loads per row per stage (the first stage before griddepcontrol.wait).
LM_SCREEN_ROWS_PER_WARP = 4
LM_SCREEN_BLOCK_ROWS = GEMV_WARPS * LM_SCREEN_ROWS_PER_WARP
LM_PICK_ROWS = 1024
LM_SCREEN_LOADS = 5
#: The `_r8` screen entry (short rows, k ≤ 1,024): rows per warp and int8 loads per row per stage.
LM_SCREEN_R8 = (8, 2)
#: Row groups per block of the `_pP` screen entries (lm_head_screen.cu SCREEN_ENTRY; NOTES.md 68): of the default
#: entry, and of the `_r8` entry; each makes the Qwen3 vocabulary's screen one wave of 2·132 blocks on the H200.
LM_SCREEN_PASSES = (18,)
LM_SCREEN_R8_PASSES = (9,)


def _lm_head_screen_kernels() -> list[Kernel]:
    """The screened lm_head of greedy decode (lm_head_screen.cu, one module; its header has the proof): stage 1
    bounds every row's logit from an int8 copy of the head (tools/export_weights.py `lm_head.screen.q8`, `.rows`),
    stage 2 computes the candidates' logits exactly as kern_gemv_norm_m1 does and their argmax; argmax_reduce
    finishes. Like gemv.cu's entries they have one form, PDL-ready (no `_pdl` twin, no index `pdl` flag): their loads
    before griddepcontrol.wait are weights only, and without the launch attribute the wait is a no-op."""
    x, nw = P("x", BF16_IN, True), P("norm_w", BF16_IN, True)
    n, k = P("n", "i32"), P("k", "i32")
    xn = P("xn", BF16_OUT, True)
    keys, bpart = P("keys", "out buffer<u16>", True), P("bpart", "out buffer<u32>", True)
    const = {"WARPS": GEMV_WARPS, "ROWS_PER_WARP": LM_SCREEN_ROWS_PER_WARP, "PICK_ROWS": LM_PICK_ROWS,
             "LOADS_PER_STAGE": LM_SCREEN_LOADS, "PASSES": 1}
    pdl = (" Programmatic dependent launch: launch_dependents and griddepcontrol.wait at entry (stage 1 first "
           "issues its int8 weight loads), nothing of an earlier launch read before the wait.")
    screen = Kernel(name="kern_lmhead_screen_m1", lang="cuda", source="lm_head_screen.cu", entry="kern_lmhead_screen_m1",
               block_x=256, constexprs=const, shared_mem_per={"k": 4},
               params=(x, nw, P("q8", "in buffer<i8>", True), P("rows", "in buffer<f32>", True), xn, keys, bpart, n, k,
                       P("eps", "f32")),
               grid=f"(ceil_div(n, {LM_SCREEN_BLOCK_ROWS}), 1, 1): 8 warps × {LM_SCREEN_ROWS_PER_WARP} rows",
               doc="Screened lm_head, stage 1: xn = bf16(norm_w * bf16(x * rsqrt(mean(x^2) + eps))) (gemv.cu's "
                   "norm prologue, the same bits), block 0 writes it to xn: bf16 [k]; xn quantized to int8 per "
                   "16-element vector; for each row r of the int8 head q8: i8 [n, k] with rows: f32 [n, 4] = (scale s, "
                   "error norm e, ||w||, s·||q||), an interval around s·(x̃·q8[r]) (int8 dot products) that holds the "
                   "dense fp32 logit; keys[r] (u16 [n]) = the argmax order of bf16(upper bound) (0xFFFF: always a "
                   "candidate), bpart[g] (u32 [ceil_div(n, rows per group)]) = row group g's max order of bf16(lower "
                   "bound); one group per block. k: a multiple of 16; dynamic shared memory 4*k bytes." + pdl)
    r8_rows, r8_loads = LM_SCREEN_R8
    r8 = replace(screen, name="kern_lmhead_screen_m1_r8", entry="kern_lmhead_screen_m1_r8",
                 constexprs={**const, "ROWS_PER_WARP": r8_rows, "LOADS_PER_STAGE": r8_loads},
                 grid=f"(ceil_div(n, {GEMV_WARPS * r8_rows}), 1, 1): 8 warps × {r8_rows} rows",
                 doc=screen.doc + f" The `_r8` entry: {r8_rows} rows per warp, {r8_loads} int8 loads per row per stage "
                     f"(k ≤ {16 * 32 * r8_loads} in one stage): half the blocks of the default entry, so half the "
                     "per-block prologues (the norm, x's quantization), which dominate short rows.")
    passes = [replace(base, name=f"{base.name}_p{p}", entry=f"{base.entry}_p{p}",
                      constexprs={**base.constexprs, "PASSES": p},
                      grid=f"(ceil_div(ceil_div(n, {GEMV_WARPS * base.constexprs['ROWS_PER_WARP']}), {p}), 1, 1): "
                           f"{p} groups of 8 warps × {base.constexprs['ROWS_PER_WARP']} rows per block",
                      doc=base.doc.replace("one group per block", f"{p} groups per block")
                          + f" The `_p{p}` entry: {p} consecutive row groups per block (the norm and x's "
                          "quantization once per block, each group's first loads issued as the group before it has "
                          "consumed its own); keys and bpart (one entry per group) as the one-group entry writes them.")
              for base, ps in ((screen, LM_SCREEN_PASSES), (r8, LM_SCREEN_R8_PASSES)) for p in ps]
    return [screen, r8, *passes,
        Kernel(name="kern_lmhead_pick_m1", lang="cuda", source="lm_head_screen.cu", entry="kern_lmhead_pick_m1",
               block_x=256, constexprs=const, shared_mem_per={"k": 2},
               params=(P("xn", BF16_IN, True), P("w", BF16_IN, True), P("keys", "in buffer<u16>", True),
                       P("bpart", "in buffer<u32>", True), P("nb1", "i32"), P("partial", "out buffer<u64>", True), n,
                       k),
               grid=f"(ceil_div(n, {LM_PICK_ROWS}), 1, 1)",
               doc="Screened lm_head, stage 2: B = max(bpart[0..nb1)); every row r of the block's "
                   f"{LM_PICK_ROWS} with keys[r] >= B is a candidate, its logit bf16(xn · w[r]) computed as "
                   "kern_gemv_norm_m1 does (w: bf16 [n, k], the dense head; the same bits); partial[b] (u64 "
                   "[grid.x]) = argmax.cu's packed key of the block's best candidate (0: none). Then argmax_reduce "
                   "over partial with parts = grid.x gives the token of the dense GEMV + argmax. k: a multiple of "
                   "8; dynamic shared memory 2*k bytes." + pdl),
    ]


#: Values of M with an L2-prefetch form (gemv.cu `INSTANTIATE_PF`; decode uses M = 1).
GEMV_PF_MS = (1,)
#: The two params the L2-prefetch forms add after their twin's.
GEMV_PF_PARAMS = (P("pf_ptr", "in buffer<bf16>", True), P("pf_bytes", "u64"))
GEMV_PF_DOC = (" L2-prefetch form (build_kernels.py --l2-prefetch, module gemv_pf.cubin): {base}'s params, then "
               "pf_ptr (16-byte aligned; typically the next GEMV's weight) and pf_bytes (u64; 0 = no prefetch); "
               "computes exactly what {base} computes (bit for bit) and, as its blocks finish their weight loads, "
               "prefetches [pf_ptr, pf_ptr + pf_bytes rounded down to 16) into L2 (cp.async.bulk.prefetch.L2: a "
               "hint, no completion), each block its contiguous 1/grid.x share; its own weight loads carry an "
               "L2::evict_first policy. Same grid, block, shared memory and PDL behaviour as {base}.")


def _gemv_pf_kernels() -> list[Kernel]:
    """Opt-in (`build_kernels.py --l2-prefetch`): the L2-prefetch forms `NAME_pf` of the decode GEMVs
    for M in GEMV_PF_MS, from gemv.cu compiled with -DGEMV_L2_PREFETCH into their own module
    (`gemv_pf.cubin`, which holds only these entries). Each is its twin plus the two trailing
    params GEMV_PF_PARAMS; grid, block, shared memory and constexprs are the twin's."""
    base = {k.name: k for k in _gemv_kernels()}
    out = []
    for M in GEMV_PF_MS:
        for variant in ("", "_norm", "_norm_silu", "_residual"):
            k = base[f"kern_gemv{variant}_m{M}"]
            out.append(replace(k, name=k.name + "_pf", entry=k.entry + "_pf", params=k.params + GEMV_PF_PARAMS,
                               defines=("GEMV_L2_PREFETCH",), module_suffix="_pf",
                               doc=k.doc + GEMV_PF_DOC.format(base=f"`{k.name}`")))
    return out


#: The kernels of the decode program between the GEMVs that have a PDL form (`NAME_pdl`).
PDL_KERNELS = ("embedding", "qk_norm_rope_kv", "paged_decode_attention", "paged_decode_reduce",
               "argmax_partial", "argmax_reduce") + DECODE_ATTENTION_CUDA + (DECODE_ATTENTION_CLUSTER,
                                                                           DECODE_ATTENTION_ROPE_CLUSTER)
PDL_DOC = (" PDL form (programmatic dependent launch, manifest `\"pdl\": true`): every block loads only "
           "inputs and weights, then executes griddepcontrol.wait before reading any earlier launch's output "
           "and before any store (also in blocks with no work), and griddepcontrol.launch_dependents; launched "
           "without the attribute it computes exactly what {base} computes.")

#: What a PDL form reads before its wait beyond inputs and weights (decode_attention.cu's header says why it is safe).
PDL_EXTRA_DOC = {
    DECODE_ATTENTION_CLUSTER: (
        f" Exception: it also issues each warp's first {DA_PRE_PAGES} pages of K|V (the KV state) before the wait, "
        "and after the wait reads the current token's row (position L-1) again and uses that: correct when no "
        "launch that can still be running when it starts writes any other row of those pages — as in kern's decode "
        "program with --decode-attention cluster, where the launch before it is qk_norm_rope_kv_pdl (writes only row "
        "L-1 and triggers only after its own wait, so every earlier launch has completed)."),
    DECODE_ATTENTION_ROPE_CLUSTER: (
        f" Exception: it also issues each warp's first {DA_ROPE_PRE_PAGES} pages of K|V (the KV state) before the wait; "
        "the current token's row (position L-1) in them may be stale, and the kernel attends to the row it computes "
        "itself (written over that row of the page's shared-memory copy): correct when no launch that can still be "
        "running when it starts writes any other row of those pages — as in kern's decode program, where during a "
        "decode step only this kernel writes the cache, each layer's launch its own layer's row L-1, and every "
        "launch of earlier runs has completed (the step's first launch, the embedding, is an ordinary launch)."),
}


def _pdl_kernels() -> list[Kernel]:
    """Built by default (`build_kernels.py`; `--no-pdl` leaves them out): the PDL forms of the decode-path kernels.

    Triton: the same function with the constexpr `PDL` = True (the default instances compile
    it with False, which prunes every PDL branch: byte-identical to the kernel without it).
    CUDA C: the same source compiled with `-DKERN_PDL` into its own module (`*_pdl.cubin`).
    Same params, grid, block and shared memory as the default instance, except the rope-cluster form's ring (and
    so its shared memory) and its carveout (DA_ROPE_SLOTS, DA_ROPE_CARVEOUT).
    """
    base = {k.name: k for k in _shared_kernels() + _attention_kernels() + _decode_attention_cuda_kernels()}
    out = []
    for name in PDL_KERNELS:
        k = base[name]
        extra = dict(defines=("KERN_PDL",), module_suffix="_pdl") if k.lang == "cuda" else \
            dict(constexprs={**k.constexprs, "PDL": True})
        doc = k.doc + PDL_DOC.format(base=f"`{name}`") + PDL_EXTRA_DOC.get(name, "")
        if name == DECODE_ATTENTION_ROPE_CLUSTER:  # its own ring and carveout in the PDL module (DA_ROPE_SLOTS)
            extra.update(shared_mem=da_cluster_smem(DA_ROPE_SLOTS),
                         constexprs={**k.constexprs, "SLOTS": DA_ROPE_SLOTS}, carveout=DA_ROPE_CARVEOUT)
            doc += (f" In this module its ring is {DA_ROPE_SLOTS} pages per warp (dynamic shared memory "
                    f"{da_cluster_smem(DA_ROPE_SLOTS)} bytes), launched with carveout "
                    f"{DA_ROPE_CARVEOUT}: the smallest shared-memory configuration that fits one CTA per SM, so that "
                    "the GEMV blocks beside and after it keep their L1.")
        out.append(replace(k, name=name + "_pdl", pdl=True, doc=doc, **extra))
    return out


#: The opt-in fused decode attention (`build_kernels.py --fused-attention`): its index NAME.
FUSED_ATTENTION = "paged_decode_attention_fused"


def _fused_attention_kernels(pdl: bool) -> list[Kernel]:
    """Opt-in (`build_kernels.py --fused-attention`): decode attention in one launch, split-KV stage 1
    + the last program of each (sequence, kv head) merging the splits (attention.py
    `paged_decode_attention_fused`); with `pdl` also its PDL form `NAME_pdl`. Stage 1's params,
    constexprs, warps and stages are `paged_decode_attention`'s, the merge's `paged_decode_reduce`'s."""
    base = {k.name: k for k in _attention_kernels()}
    s1, red = base["paged_decode_attention"], base["paged_decode_reduce"]
    k = Kernel(
        name=FUSED_ATTENTION, lang="triton", source="attention.py", entry="paged_decode_attention_fused",
        params=s1.params[:6] + (P("counters", "inout ptr", False, "i32"), P("out", BF16_OUT, True)) + ATTN_TAIL,
        grid="(NKV, S, seqs), S = number of KV splits (1..64), as paged_decode_attention",
        doc="Decode attention in one launch: paged_decode_attention (same params and scratch part_acc, part_ml; "
            "here `out` params whose contents the launch itself writes before it reads them back), then each "
            "program increments counters[b*NKV + h] (i32, acq_rel, gpu scope); the program that sees S-1 merges "
            "the S splits of its G = NQ/NKV q heads as paged_decode_reduce does (bitwise the same output) into "
            "out: bf16 [seqs, NQ*128], and resets its counter to 0. counters: a persistent state (inout ptr), "
            "zero before the first launch, seqs*NKV i32 per layer, each layer its own (a per-layer offset); "
            "a launch that dies mid-way leaves it nonzero (reload the runtime). sm_scale = 1/sqrt(128).",
        constexprs={**s1.constexprs, "MAX_SPLITS": red.constexprs["MAX_SPLITS"]},
        num_warps=s1.num_warps, num_stages=s1.num_stages,
    )
    assert red.num_warps == s1.num_warps  # the merge's tiles get paged_decode_reduce's layouts
    out = [k]
    if pdl:
        out.append(replace(k, name=FUSED_ATTENTION + "_pdl", pdl=True, constexprs={**k.constexprs, "PDL": True},
                           doc=k.doc + PDL_DOC.format(base=f"`{FUSED_ATTENTION}`")))
    return out


def instances(geometries: list[Geometry], *, pdl: bool = False, fused_attention: bool = False,
              l2_prefetch: bool = False) -> list[Kernel]:
    """Distinct kernel instances needed by these geometries, sorted by NAME.

    `pdl`: add the PDL instances (`_pdl_kernels`; build_kernels.py adds them unless --no-pdl); `fused_attention`:
    add the opt-in fused decode attention (`_fused_attention_kernels`, with its PDL form when `pdl`); `l2_prefetch`:
    add the opt-in L2-prefetch GEMV forms (`_gemv_pf_kernels`); the other instances are unchanged. Every kernel that
    reads or writes the KV cache uses its one layout, head-major (tools/README.md "KV layout")."""
    out: dict[str, Kernel] = {}
    shared = _shared_kernels() + _attention_kernels() + _decode_attention_cuda_kernels() + _gemv_kernels() \
        + _gemv_tc_kernels() + _gemvp_kernels() + _lm_head_screen_kernels() + (_pdl_kernels() if pdl else []) \
        + (_fused_attention_kernels(pdl) if fused_attention else []) + (_gemv_pf_kernels() if l2_prefetch else [])
    for k in shared + [k for g in geometries for k in _norm_kernels(g.hidden_size)]:
        if k.name in out and out[k.name].key() != k.key():
            raise AssertionError(f"two different instances named {k.name}")
        out[k.name] = k
    return [out[n] for n in sorted(out)]


def shared_mem_of(k: dict, args) -> int:
    """Dynamic shared memory (bytes) of one launch of index entry `k` with `args` (its params in order; Triton's
    two hidden ones may be there or not): the index's `shared_mem` plus, for each param that `shared_mem_per`
    names (index format 1), its coefficient × the value passed (gemv.cu's x in shared memory: 2 bytes per element
    of `k`). Raises ValueError when such a param's value is not an integer (a Python or numpy int)."""
    smem = int(k["shared_mem"])
    for p, coeff in k.get("shared_mem_per", {}).items():
        v = args[k["param_names"].index(p)]
        try:
            if isinstance(v, bool):
                raise TypeError
            n = operator.index(v)
        except TypeError:
            raise ValueError(f"{k['entry']}: param `{p}` sizes the dynamic shared memory ({coeff} bytes each), so "
                             f"it must be an integer, not {v!r}") from None
        smem += coeff * n
    return smem
