"""The committed provider manifests (`examples/*.json`) verify without errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kern_verify import verify_path

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.json"))


@pytest.mark.skipif(not EXAMPLES, reason="no examples/*.json in this checkout")
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_verifies(path):
    errors = [d for d in verify_path(path) if d.is_error]
    assert errors == [], "\n".join(map(str, errors))
