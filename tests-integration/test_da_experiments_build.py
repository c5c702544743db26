"""CPU checks of decode_attention.cu's experiment builds (session 17, NOTES.md 52-53; tools/gpu/da_variants.py and
da_timeline.py time them, tests-integration/gpu/test_da_experiments_gpu.py checks their numerics): no GPU needed.

- the hooks leave the default modules unchanged: the PDL build's sha256 is the one examples/qwen3-4b.json pins;
- every experiment build (`KERN_PDL`, `DA_PAIR`, `DA_WARPS=8`, `DA_NO_MATH`, `DA_MERGE_BARRIER`) exports the default's
  four entries with the same parameter tables;
- the default cluster merge is st.async on an mbarrier (one cluster arrive), `DA_MERGE_BARRIER` the barrier merge;
- in the PTX of the default plain and PDL builds, the page copies of the attention entries are bulk copies counted on
  an mbarrier (fenced after its init, and a proxy fence before the refills), with no 16-byte cp.async left in them:
  the head-major KV layout, one bulk copy per page, is the only one (the experiment `DA_BULK` that made it is gone);
- da_variants' launch geometry for each build (threads, dynamic shared memory), its option parsing, and its refusal
  of `DA_BULK`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
read_cubin = pytest.importorskip("kern_verify.cubin").read_cubin
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import da_variants  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import nvcc_builds  # noqa: E402  (this folder's helpers)
from ptx_entries import ptx_entries  # noqa: E402

EXPERIMENTS = {"pdl": ("KERN_PDL",), "pair": ("DA_PAIR",), "w8": ("DA_WARPS=8", "DA_CLUSTER_SLOTS=2"),
               "no_math": ("DA_NO_MATH",), "merge_barrier": ("DA_MERGE_BARRIER", "KERN_PDL")}
ATTENTION = ("decode_attention_split", "decode_attention_cluster", "decode_attention_rope_cluster")
BULK_COPY = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The default plain and PDL cubins and PTX, and every experiment's cubin."""
    jobs = {"plain.cubin": ((), "plain.cubin"), "pdl.cubin": (("KERN_PDL",), "pdl.cubin"),
            "plain.ptx": ((), "plain.ptx"), "pdl.ptx": (("KERN_PDL",), "pdl.ptx"),
            "barrier.ptx": (("DA_MERGE_BARRIER",), "barrier.ptx"),
            **{f"{n}.cubin": (d, f"{n}.cubin") for n, d in EXPERIMENTS.items()}}
    return nvcc_builds(tmp_path_factory.mktemp("da_experiments"),
                       {k: ("decode_attention.cu", d, f) for k, (d, f) in jobs.items()})


def test_default_pdl_module_is_the_examples(builds):
    pinned = json.loads((ROOT / "examples" / "qwen3-4b.json").read_text())["modules"]["decode_attention_pdl"]["sha256"]
    assert hashlib.sha256(builds["pdl.cubin"].read_bytes()).hexdigest() == pinned


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_experiment_keeps_the_abi(builds, name):
    plain = read_cubin(builds["plain.cubin"].read_bytes()).entries
    exp = read_cubin(builds[f"{name}.cubin"].read_bytes()).entries
    assert set(exp) == set(plain)
    for e in plain:
        assert [(p.offset, p.size) for p in exp[e].params] == [(p.offset, p.size) for p in plain[e].params], e


@pytest.mark.parametrize("build", ["plain", "pdl"])
def test_pages_are_bulk_copies(builds, build):
    ptx = ptx_entries(builds[f"{build}.ptx"].read_text())
    for e in ATTENTION:
        text = "\n".join(ptx[e])
        assert BULK_COPY in text and "mbarrier.try_wait.parity" in text, e
        # the slots' mbarriers fenced after their init, and the refills fenced between the proxies
        assert "fence.mbarrier_init.release.cluster" in text and "fence.proxy.async.shared::cta" in text, e
        assert "cp.async.cg.shared.global" not in text, e


def test_cluster_merge_is_st_async(builds):
    """The default cluster merge pushes st.async stores counted on the owner's receive mbarrier and waits on it at CTA
    scope (no second cluster barrier; `.acquire.cluster` made ptxas add an L1 invalidation, NOTES.md 70); the entry
    initializes the mbarrier, fences its init, arrives relaxed and waits on the cluster barrier before anything else
    (CUTLASS's pattern), so every wait precedes the first push. DA_MERGE_BARRIER: the barrier merge, with no st.async."""
    plain = ptx_entries(builds["plain.ptx"].read_text())
    barrier = ptx_entries(builds["barrier.ptx"].read_text())
    for e in ("decode_attention_cluster", "decode_attention_rope_cluster"):
        lines = plain[e]
        text = "\n".join(lines)
        assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in text, e
        assert "mbarrier.try_wait.parity.shared::cta.b64" in text and ".acquire.cluster" not in text, e
        assert "fence.mbarrier_init.release.cluster" in text and "mbarrier.arrive.expect_tx" in text, e
        assert "barrier.cluster.arrive.relaxed" in text and "barrier.cluster.arrive.release" not in text, e
        assert text.count("barrier.cluster.arrive") == 1 and text.count("barrier.cluster.wait") == 1, e
        first = lambda key: next(i for i, ln in enumerate(lines) if key in ln)  # noqa: E731
        assert (first("fence.mbarrier_init") < first("barrier.cluster.arrive") < first("barrier.cluster.wait")
                < first("st.async")), e
        old = "\n".join(barrier[e])
        assert "st.async" not in old and old.count("barrier.cluster.arrive") == 2, e


def test_da_variants_geometry():
    sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
    import catalog

    default = next(k for k in catalog._decode_attention_cuda_kernels() if k.name == catalog.DECODE_ATTENTION_CLUSTER)
    # the slots' mbarriers (64 bytes per warp), the rings of 16 unpadded 512-byte rows per page, the partials
    assert da_variants.cluster_smem([]) == default.shared_mem == 256 + 4 * 4 * 16 * 512 + 8 * (16 + 128) * 4
    assert da_variants.cluster_smem(["DA_WARPS=8", "DA_CLUSTER_SLOTS=2"]) == 512 + 8 * 2 * 8192 + 4608
    assert da_variants.cluster_warps(["DA_WARPS=8"]) == 8 and da_variants.cluster_warps(["KERN_PDL=1"]) == 4
    for gone in (["DA_BULK"], ["DA_BULK=1"], ["DA_PAIR=1", "DA_BULK=0"]):
        with pytest.raises(ValueError, match="DA_BULK is gone: the head-major KV layout"):
            da_variants.cluster_smem(gone)
    with pytest.raises(ValueError, match="NAME=SPEC"):
        da_variants.parse_variant("=DA_PAIR=1")
    with pytest.raises(ValueError, match="'DA_WARPS=eight': DA_WARPS must be an integer"):
        da_variants.cluster_smem(["DA_WARPS=eight"])
