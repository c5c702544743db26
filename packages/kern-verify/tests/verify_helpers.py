"""Test helpers: load a fixture as a dict, mutate it, verify its JSON text."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from kern_verify import Diagnostic, verify_text

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("launch", "gemm", "scratch", "carry")
_CACHE: dict[str, dict] = {}


def fixture(name: str) -> dict:
    """A deep copy of `fixtures/<name>.json` as plain JSON data."""
    if name not in _CACHE:
        _CACHE[name] = json.loads((FIXTURES / f"{name}.json").read_text())
    return copy.deepcopy(_CACHE[name])


def text_of(doc: dict) -> str:
    return json.dumps(doc, indent=1)


def check(doc: dict, **kw) -> list[Diagnostic]:
    """Verify `doc` as indented JSON text (so diagnostics get lines)."""
    return verify_text(text_of(doc), **kw)


def found(diags: list[Diagnostic]) -> list[tuple[str, str]]:
    """(code, location) of every diagnostic, sorted."""
    return sorted((d.code, d.location) for d in diags)
