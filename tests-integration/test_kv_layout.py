"""The head-major KV layout in the compiled kernels (tools/README.md "KV layout"; NOTES.md 58-59), no GPU.

Every kernel that reads or writes the KV cache uses the one layout: kv head h's 16-token slice of a page is 8 KB
contiguous, each token's 512-byte k|v row XOR-swizzled in 16-byte chunks. What the layout is for, checked in the code
the build produces:
- decode_attention.cu (both modules): every entry but the merge brings a page into shared memory with one bulk copy
  (`cp.async.bulk` on an mbarrier, which the warp waits on), and no entry copies K|V rows with per-lane 16-byte
  `cp.async` any more; the slots are read as before, K with 128-bit loads and V with `ldmatrix.trans`, and the
  rope-cluster form stores the current token's swizzled row with one 16-byte store per lane;
- attention.py's readers (the Triton decode attention, its fused form, the prefill attention) load K and V with
  16-byte `cp.async` straight into the dot's operands: the swizzle, an XOR on the element index with contiguity hints,
  must not split the loads (a first form of the prefill kernel staged every tile through scalar shared-memory stores:
  NOTES.md 58), and the prefill kernel keeps its 98,560 bytes of shared memory (the token-major kernel's pipelining);
- the prologue (qk_norm_rope_kv) stores the swizzled row with the token-major kernel's stores, no more;
- the index's shared memory for the decode attention is what decode_attention.cu's DA_*_SMEM give in each module
  (unpadded rows and the slots' mbarriers); the KV kernels keep their ABI (the manifest's params did not change
  with the layout; test_kernels_build.py checks the params).
The Triton checks hold for the token-major kernels too (the same copies, stores and shared memory): they guard the
swizzle's address arithmetic against costing the loads and stores their width; the decode_attention.cu and shared
memory checks fail on the token-major tree.
The kernels' values are checked on the H200 (tests-integration/gpu: against float64 through gpu_helpers' head-major
addressing) and in the session-21 validation (the head-major build bit for bit against the token-major one).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx_entries import ptx_entries  # noqa: E402  (this folder's helper)

ROOT = Path(__file__).resolve().parents[1]


def _tools():
    """(catalog, build_kernels, the 4B geometry's instances by NAME with the PDL forms)."""
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_kernels
        import catalog
        from geometries import load_geometry
    finally:
        del sys.path[:2]
    ks = {k.name: k for k in catalog.instances([load_geometry("4b")], pdl=True, fused_attention=True)}
    return catalog, build_kernels, ks


def _ops(lines: list[str], prefix: str) -> list[str]:
    """The instructions of PTX body `lines` (stripped) whose opcode starts with `prefix`, a guard (`@%p1`) skipped."""
    ops = [ln.split()[1] if ln.startswith("@") and len(ln.split()) > 1 else ln.split()[0] for ln in lines if ln]
    return [op for op in ops if op.startswith(prefix)]


@pytest.mark.parametrize("name", ["decode_attention_cluster", "decode_attention_cluster_pdl"])
def test_decode_attention_pages_by_bulk_copy(name):
    """Both decode_attention.cu modules: in every entry but the merge, pages come by `cp.async.bulk` counted on an
    mbarrier (each copy with its `expect_tx`; the warp waits on the slot's mbarrier), no `cp.async.cg` (only the
    merge, which reads the split partials and no KV, has them), the slots are read with 128-bit `ld.shared` (K) and
    `ldmatrix.x4.trans` (V) and no narrower integer `ld.shared`; the rope-cluster entry stores the current token's
    512-byte row with one `st.global.v4` per lane (the lanes' chunks exchanged for the swizzle first)."""
    _, bk, ks = _tools()
    k = ks[name]
    entries = ptx_entries(bk.cuda_ptx(k))
    assert set(entries) == {"decode_attention_split", "decode_attention_merge", "decode_attention_cluster",
                            "decode_attention_rope_cluster"}
    for entry, lines in entries.items():
        bulk = _ops(lines, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes")
        cg = _ops(lines, "cp.async.cg")
        if entry == "decode_attention_merge":  # reads the split partials (cp.async of f32 rows), no KV
            assert not bulk and cg and not _ops(lines, "mbarrier"), entry
            continue
        # the token-major form's K|V copies were 16 per lane per page: none is left
        assert bulk and not cg, (entry, cg[:2])
        assert len(_ops(lines, "mbarrier.arrive.expect_tx.shared::cta")) >= len(bulk), entry
        assert _ops(lines, "mbarrier.try_wait.parity.shared::cta"), entry  # a slot's bytes have landed
        assert _ops(lines, "ld.shared.v4.u32") and _ops(lines, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"), entry
        narrow = [op for op in _ops(lines, "ld.shared.") if re.match(r"ld\.shared\.[bsu](8|16|32)$", op)]
        assert not narrow, (entry, narrow[:2])
        if entry == "decode_attention_rope_cluster":
            assert _ops(lines, "st.global.v4") == ["st.global.v4.u32"], entry


#: attention.py's KV readers: K and V tiles as 16-byte cp.async (per program: BLOCK_N rows x 256 bytes of k and of v,
#: spread over the threads).
KV_READERS = ("paged_decode_attention", "paged_decode_attention_pdl", "paged_decode_attention_fused",
              "paged_prefill_attention")


@pytest.mark.parametrize("name", KV_READERS)
def test_triton_kv_loads_stay_16_bytes(name, tmp_path):
    """K and V reach shared memory as 16-byte cp.async (`.cg`, L2 only) straight from global memory, whatever the
    swizzle's XOR costs in address arithmetic: at least 32 in each kernel's PTX (a 64-token tile of k, or of v, is
    16 KB: 8 copies per thread of the decode kernels' 128, 4 of the prefill kernel's 256; the software pipeline issues
    tiles at more than one place); the only other copies are the block-table entries (4-byte `.ca`, i32). A form that
    loads the tiles into registers instead (ld.global, then shared-memory stores) has none of these copies, one that
    splits a run of 8 elements has narrower ones."""
    _, bk, ks = _tools()
    ptx = bk.triton_compiled(ks[name], str(tmp_path)).asm["ptx"]
    copies = re.findall(r"cp\.async\.(c[ag])\.shared\.global(?:\.L2::\w+)? \[[^\]]+\], \[[^\]]+\], (\w+)", ptx)
    sizes = {kind: sorted({int(n, 0) for k, n in copies if k == kind}) for kind in ("cg", "ca")}
    assert sizes["cg"] == [16] and sizes["ca"] in ([], [4]), (name, sizes)
    assert len([1 for k, _ in copies if k == "cg"]) >= 32, name


def test_prefill_attention_keeps_its_pipelining(tmp_path):
    """paged_prefill_attention: 98,560 bytes of dynamic shared memory, the token-major kernel's three-stage
    pipeline (rewriting the swizzled offsets in other forms gave 49,152: session 20's read of the change)."""
    _, bk, ks = _tools()
    compiled = bk.triton_compiled(ks["paged_prefill_attention"], str(tmp_path))
    assert compiled.metadata.shared == 98560


@pytest.mark.parametrize("name", ["qk_norm_rope_kv", "qk_norm_rope_kv_pdl"])
def test_qk_norm_rope_kv_swizzle_adds_no_stores(name, tmp_path):
    """The prologue's global stores are the token-major kernel's: the q heads as two 16-byte vector stores per thread,
    and the kv head's row as four 2-byte stores (k's two rotary halves, v's two halves: 64 bf16 each over the first
    64 of the program's 128 threads, one element per thread, so no vector store), all four under the same guard.
    The swizzle is address arithmetic only: it adds no store and splits none. Which element lands where is checked
    on the GPU (gpu/test_kernels_gpu.py test_qk_norm_rope_kv: every slot's k and v at gpu_helpers.slot_offsets,
    nothing else of the poisoned cache written)."""
    _, bk, ks = _tools()
    ptx = bk.triton_compiled(ks[name], str(tmp_path)).asm["ptx"]
    stores = [ln.strip() for ln in ptx.splitlines() if re.match(r"(@%p\d+ )?st\.global", ln.strip())]
    ops = sorted(re.match(r"(?:@(%p\d+) )?(st\.global\.\S+)", st).group(2) for st in stores)
    assert ops == ["st.global.b16"] * 4 + ["st.global.v4.b32"] * 2, (name, ops)
    guards = {re.match(r"(?:@(%p\d+) )?", st).group(1) for st in stores if "st.global.b16" in st}
    assert len(guards) == 1, (name, guards)


def _da_smem(bk, defines: tuple[str, ...], tmp: Path) -> tuple[int, int, int]:
    """decode_attention.cu's (DA_SPLIT_SMEM, DA_CLUSTER_SMEM, DA_ROPE_SMEM) in bytes for a module built with
    `defines`: the macros expanded by nvcc's preprocessor (no compile), the integer expressions evaluated here."""
    try:
        nvcc = bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")
    probe = tmp / "da_smem.cu"
    probe.write_text('#include "decode_attention.cu"\nkern_da_smem DA_SPLIT_SMEM | DA_CLUSTER_SMEM | DA_ROPE_SMEM\n')
    cmd = [nvcc, "-E", "-arch=sm_90", "-std=c++17", f"-I{bk.SRC}", *(f"-D{d}" for d in defines), str(probe)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("kern_da_smem "))
    exprs = line.removeprefix("kern_da_smem ").split("|")
    assert all(re.fullmatch(r"[\d\s()+*/]+", e) for e in exprs), line  # integers only: C's / is Python's //
    return tuple(eval(e.replace("/", "//")) for e in exprs)  # noqa: S307 (checked above)


def test_decode_attention_shared_memory_is_the_bulk_forms(tmp_path):
    """The index's shared memory of the CUDA C decode attention: the slots' mbarriers (8 per warp), then the rings of
    unpadded 512-byte rows, then (cluster forms) the partials pushed to each CTA; and it is what decode_attention.cu's
    DA_*_SMEM give in each module (plain, and -DKERN_PDL with its 2-page rope-cluster ring)."""
    catalog, bk, ks = _tools()
    for sfx in ("", "_pdl"):
        split, cluster, rope = (ks[n + sfx] for n in ("decode_attention_split", "decode_attention_cluster",
                                                      "decode_attention_rope_cluster"))
        assert split.defines == cluster.defines == rope.defines, sfx
        assert _da_smem(bk, split.defines, tmp_path) == (split.shared_mem, cluster.shared_mem, rope.shared_mem), sfx
    bars, slot = 4 * 8 * 8, 16 * 512
    recv = 8 * (2 * 8 + 8 * 128 // 8) * 4
    assert (catalog.DA_BAR_BYTES, catalog.DA_SLOT_BYTES, catalog.DA_RECV_BYTES) == (bars, slot, recv)
    assert ks["decode_attention_split"].shared_mem == bars + 4 * 2 * slot == catalog.da_split_smem() == 65792
    assert ks["decode_attention_cluster"].shared_mem == bars + 4 * 4 * slot + recv == 135936
    assert ks["decode_attention_rope_cluster"].shared_mem == 135936
    assert ks["decode_attention_rope_cluster_pdl"].shared_mem == bars + 4 * 2 * slot + recv == 70400
    assert ks["decode_attention_merge"].shared_mem == 0
