"""The entries of a PTX module, for the CPU tests that check where an instruction stands in a kernel (imported by
test_gemv_l2_prefetch_build.py, test_gemv_tma_build.py and the other experiment-build tests)."""

from __future__ import annotations


def ptx_entries(ptx: str) -> dict[str, list[str]]:
    """{entry name: its body's lines, stripped} of every `.entry` in `ptx` (nvcc's PTX text), in file order."""
    out = {}
    for part in ptx.split(".entry ")[1:]:
        name = part.split("(", 1)[0].strip()
        out[name] = [ln.strip() for ln in part.split("\n}\n", 1)[0].splitlines()]
    return out
