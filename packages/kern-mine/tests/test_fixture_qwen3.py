"""Acceptance on the real capture (issue 8): torch.compile'd Qwen3-0.6B, 4 requests.

The fixture is produced on the GPU machine (see fixtures/qwen3-0.6b-compile/README.md);
until it is committed these tests skip.
"""

from pathlib import Path

import pytest

from kern_mine.mine import mine

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3-0.6b-compile"
PROMPTS = [1, 34, 85, 175]  # the true prompt lengths, in request order
NEW_TOKENS = 4

pytestmark = pytest.mark.skipif(
    not any((FIXTURE / n).is_file() for n in ("launches.jsonl", "launches.jsonl.gz")),
    reason="real fixture not captured yet: run tools/gpu/capture_qwen3_compile.py under kern-capture "
           "on the GPU machine (fixtures/qwen3-0.6b-compile/README.md)",
)


@pytest.fixture(scope="module")
def report():
    return mine(FIXTURE)


def test_four_requests(report):
    assert report.summary.requests == 4
    assert [len(w.passes) for w in report.requests] == [NEW_TOKENS] * 4


def test_prefill_token_counts_are_the_prompt_lengths(report):
    assert [w.passes[0].tokens for w in report.requests] == PROMPTS
    assert all(w.passes[0].kind == "prefill" for w in report.requests)


def test_decode_passes_have_one_token(report):
    decodes = [p for w in report.requests for p in w.passes[1:]]
    assert len(decodes) == 4 * (NEW_TOKENS - 1)
    assert all(p.kind == "decode" and p.tokens == 1 for p in decodes)


def test_flat_sites_get_fitted_grids(report):
    s = report.summary
    assert s.flat_sites > 0
    assert s.flat_sites_grid_fitted / s.flat_sites >= 0.90, (s.flat_sites_grid_fitted, s.flat_sites)


def _norm_sites(report):
    # Inductor names an RMS norm kernel after its ops: ..._mean_..._rsqrt_...
    return [s for s in report.sites if s.flat and "rsqrt" in s.symbol and s.pointer_params]


def test_norm_sites_tell_weights_from_workspace(report):
    norms = _norm_sites(report)
    assert len(norms) >= 2 * 28 + 1  # input + post-attention norm per layer, final norm
    by_site: dict[int, list] = {}
    for p in report.pointers:
        by_site.setdefault(p.site, []).append(p)
    weights = set()
    for s in norms:
        classes = [p.class_ for p in by_site[s.id]]
        assert "weight" in classes and "workspace" in classes, (s.symbol, s.occurrence, classes)
        weights |= {(p.alloc_base, p.alloc_offset) for p in by_site[s.id] if p.class_ == "weight"}
    assert len(weights) >= 2 * 28 + 1  # every norm has its own weight


def test_gemms_are_extra_param_launches(report):
    # cuBLAS GEMMs carry their params in the packed extra buffer: present, not flat
    assert any(not s.flat for s in report.sites)
    assert report.summary.pointers.get("weight", 0) > 0 and report.summary.pointers.get("workspace", 0) > 0
