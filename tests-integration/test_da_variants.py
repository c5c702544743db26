"""tools/gpu/da_variants.py without a GPU: variant specs, the cluster form's shared memory, and --dry-run builds."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
sys.path.insert(0, str(ROOT / "tools" / "kernels-src"))
import da_variants  # noqa: E402
from catalog import DA_CLUSTER, DA_CLUSTER_SLOTS, DA_WARPS, da_cluster_smem  # noqa: E402

#: A ring slot: one page of one kv head, 16 unpadded 512-byte k|v rows (the head-major KV layout's, one bulk copy);
#: the slots' mbarriers before the rings: 64 bytes per warp.
PAGE, BARS = 16 * 512, DA_WARPS * 64


def test_parse_variant():
    assert da_variants.parse_variant("base") == ("base", [])
    assert da_variants.parse_variant("two=DA_PRE_PAGES=2") == ("two", ["DA_PRE_PAGES=2"])
    assert da_variants.parse_variant("p=NOPDL,GIT=HEAD") == ("p", ["NOPDL", "GIT=HEAD"])
    for bad in ("=DA_PRE_PAGES=2", "x=FOO"):
        with pytest.raises(ValueError, match="--variant"):
            da_variants.parse_variant(bad)


def test_cluster_smem_is_the_catalogs():
    recv = DA_CLUSTER * (2 * 8 + 8 * 128 // DA_CLUSTER) * 4
    assert da_variants.cluster_smem([]) == da_cluster_smem(DA_CLUSTER_SLOTS) == BARS + DA_WARPS * DA_CLUSTER_SLOTS * PAGE \
        + recv == 135936
    assert da_variants.cluster_smem(["DA_CLUSTER_SLOTS=6"]) == da_cluster_smem(6) == BARS + DA_WARPS * 6 * PAGE + recv
    # a 16-CTA cluster: each CTA receives 16 partials of (m, l) and of a sixteenth of the kv head's outputs
    assert da_variants.cluster_smem(["DA_CLUSTER=16"]) == BARS + DA_WARPS * DA_CLUSTER_SLOTS * PAGE + 16 * (16 + 64) * 4
    # 8 warps: their mbarriers and rings
    assert da_variants.cluster_smem(["DA_WARPS=8", "DA_CLUSTER_SLOTS=2"]) == 8 * 64 + 8 * 2 * PAGE + recv
    assert [da_variants.cluster_size(s) for s in ([], ["DA_CLUSTER=16"], ["DA_PRE_PAGES=1"])] == [DA_CLUSTER, 16, DA_CLUSTER]
    for bad in ("4", "32"):
        with pytest.raises(ValueError, match=f"DA_CLUSTER={bad}: 8 or 16 CTAs per cluster"):
            da_variants.cluster_size([f"DA_CLUSTER={bad}"])
    with pytest.raises(SystemExit):
        da_variants.main(["--dry-run", "--variant", "big=DA_CLUSTER=3"])


def test_da_bulk_is_refused(tmp_path, capsys):
    """DA_BULK made the head-major KV layout an experiment; that layout is the only one now: a spec naming it is
    refused (parsing, the geometry, the build, the command line) with the reason, not silently built."""
    for spec in ("DA_BULK", "DA_BULK=1"):
        with pytest.raises(ValueError, match=f"--variant 'b={spec}': '{spec}': DA_BULK is gone: the head-major KV "
                                             "layout .* is decode_attention.cu's only layout now"):
            da_variants.parse_variant(f"b={spec}")
        with pytest.raises(ValueError, match="DA_BULK is gone"):
            da_variants.cluster_smem(["DA_PAIR=1", spec])
        with pytest.raises(ValueError, match="DA_BULK is gone"):
            da_variants.build_variant("b", [spec], tmp_path)
    assert not list(tmp_path.iterdir())  # refused before any build
    with pytest.raises(SystemExit):
        da_variants.main(["--dry-run", "--variant", "base", "--variant", "b=DA_PAIR=1,DA_BULK=1"])
    assert "DA_BULK is gone" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_dry_run_builds_every_variant(capsys):
    assert da_variants.main(["--dry-run", "--variant", "base", "--variant", "one=DA_PRE_PAGES=1",
                             "--variant", "plain=NOPDL", "--variant", "c16=DA_CLUSTER=16"]) == 0
    out = capsys.readouterr().out
    assert all(f"built {n}:" in out for n in ("base", "one", "plain", "c16"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_cluster_too_small_for_the_merge_does_not_build(tmp_path):
    """decode_attention.cu refuses DA_CLUSTER < 8 (its merge gives each thread one output; a 2-CTA build had left
    half of them unwritten), with the reason in nvcc's message."""
    with pytest.raises(RuntimeError, match="DA_CLUSTER too small"):
        da_variants.build_variant("c4", ["DA_CLUSTER=4"], tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_failing_build_names_the_variant(tmp_path):
    with pytest.raises(RuntimeError, match="variant bad: nvcc failed"):
        da_variants.build_variant("bad", [f"SRC={tmp_path / 'missing.cu'}"], tmp_path)
