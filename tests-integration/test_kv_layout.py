"""The head-major KV layout in the compiled kernels (tools/README.md "KV layout"; NOTES.md 58-59), no GPU.

Every kernel that reads or writes the KV cache uses the one layout: kv head h's 16-token slice of a page is 8 KB
contiguous, each token's 512-byte k|v row XOR-swizzled in 16-byte chunks. What the layout is for, checked in the code
the build produces:
- decode_attention.cu (both modules): every entry but the merge brings a page into shared memory with one bulk copy
  (`cp.async.bulk` on an mbarrier), and no entry copies K|V rows with per-lane 16-byte `cp.async` any more;
- attention.py's readers (the Triton decode attention, its fused form, the prefill attention) load K and V with
  16-byte `cp.async` straight into the dot's operands: the swizzle, an XOR on the element index with contiguity hints,
  must not split the loads (a first form of the prefill kernel staged every tile through scalar shared-memory stores:
  NOTES.md 58), and the prefill kernel keeps its 98,560 bytes of shared memory (the token-major kernel's pipelining);
- the index's shared memory for the decode attention is what decode_attention.cu's DA_*_SMEM give (unpadded rows and
  the slots' mbarriers), and the KV kernels keep their ABI (the manifest's params did not change with the layout).
The kernels' values are checked on the H200 (tests-integration/gpu: against float64 through gpu_helpers' head-major
addressing) and in the session-21 validation (the head-major build bit for bit against the token-major one).
"""

import re
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


@pytest.mark.parametrize("name", ["decode_attention_cluster", "decode_attention_cluster_pdl"])
def test_decode_attention_pages_by_bulk_copy(name):
    """Both decode_attention.cu modules: one `cp.async.bulk` per page in every entry but the merge, and no
    `cp.async.cg` there (only the merge, which reads the split partials and no KV, has them)."""
    _, bk, ks = _tools()
    k = ks[name]
    entries = ptx_entries(bk.cuda_ptx(k))
    assert set(entries) == {"decode_attention_split", "decode_attention_merge", "decode_attention_cluster",
                            "decode_attention_rope_cluster"}
    for entry, lines in entries.items():
        bulk = [ln for ln in lines if ln.startswith("cp.async.bulk.shared")]
        cg = [ln for ln in lines if ln.startswith("cp.async.cg")]
        if entry == "decode_attention_merge":  # reads the split partials (cp.async of f32 rows), no KV
            assert not bulk and cg, entry
        else:  # the token-major form's K|V copies were 16 per lane per page: none is left
            assert bulk and not cg, (entry, cg[:2])


#: attention.py's KV readers: K and V tiles as 16-byte cp.async (per program: BLOCK_N rows x 256 bytes of k and of v,
#: spread over the threads).
KV_READERS = ("paged_decode_attention", "paged_decode_attention_pdl", "paged_decode_attention_fused",
              "paged_prefill_attention")


@pytest.mark.parametrize("name", KV_READERS)
def test_triton_kv_loads_stay_16_bytes(name, tmp_path):
    """K and V reach shared memory as 16-byte cp.async (`.cg`, L2 only) straight from global memory, at least 16 per
    tile each, whatever the swizzle's XOR costs in address arithmetic; the only other copies are the block-table
    entries (4-byte `.ca`, i32). A form that loads the tiles into registers instead (ld.global, then shared-memory
    stores) has none of these copies."""
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


def test_qk_norm_rope_kv_stores_rows_in_16_byte_chunks(tmp_path):
    """The prologue's KV store: each 16-byte chunk goes to its swizzled place as one vector store (or narrower stores
    that still cover it whole); it writes every k|v element of the row once: 2 x 128 bf16 per kv head."""
    _, bk, ks = _tools()
    ptx = bk.triton_compiled(ks["qk_norm_rope_kv"], str(tmp_path)).asm["ptx"]
    stores = [ln.strip() for ln in ptx.splitlines() if re.match(r"\s*(@%p\d+ )?st\.global", ln.strip())]
    assert stores, "no global store"
    assert not [s for s in stores if re.search(r"st\.global\.(b8|u8)\b", s)], stores[:3]


def test_decode_attention_shared_memory_is_the_bulk_forms():
    """The index's shared memory of the CUDA C decode attention: the slots' mbarriers (8 per warp), then the rings of
    unpadded 512-byte rows, then (cluster forms) the partials pushed to each CTA (decode_attention.cu DA_*_SMEM)."""
    catalog, _, ks = _tools()
    bars, slot = 4 * 8 * 8, 16 * 512
    recv = 8 * (2 * 8 + 8 * 128 // 8) * 4
    assert (catalog.DA_BAR_BYTES, catalog.DA_SLOT_BYTES, catalog.DA_RECV_BYTES) == (bars, slot, recv)
    assert ks["decode_attention_split"].shared_mem == bars + 4 * 2 * slot == catalog.da_split_smem() == 65792
    assert ks["decode_attention_cluster"].shared_mem == bars + 4 * 4 * slot + recv == 135936
    assert ks["decode_attention_rope_cluster"].shared_mem == 135936
    assert ks["decode_attention_rope_cluster_pdl"].shared_mem == bars + 4 * 2 * slot + recv == 70400
    assert ks["decode_attention_merge"].shared_mem == 0
