"""The kernel index against its cubins, for the build tests (test_kernels_build.py, test_gemv_l2_prefetch_build.py):
what build_kernels.py writes into index.json must be what each cubin's own ELF says."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: Bytes of a scalar param type of the manifest's grammar; pointers (`in|out|inout buffer<T>|ptr`) take 8.
SIZES = {"i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8, "i16": 2, "u16": 2, "i8": 1, "u8": 1}
PTR = re.compile(r"^(in|out|inout) (buffer<\w+>|ptr)$")


def param_size(t: str) -> int:
    """Bytes of one kernel param of type `t` (the manifest's type grammar)."""
    return 8 if PTR.match(t) else SIZES[t]


def check_index_against_cubins(d: Path, idx: dict) -> None:
    """Every index entry of kernels dir `d`: its module's sha256 is the index's, the module is an sm_90 cubin with
    the entry, whose ELF param table has the index's params at their natural offsets (each aligned to its size),
    and whose required block (where set) is the index's block, or whose max threads (where set) bound it. Raises
    AssertionError naming the kernel."""
    from kern_verify.cubin import read_cubin

    for name, k in idx["kernels"].items():
        data = (d / k["module"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == k["sha256"], name
        cub = read_cubin(data, k["module"])
        assert cub.arch == 90, (name, cub.arch)
        assert k["entry"] in cub.entries, (name, k["entry"], list(cub.entries))
        info = cub.entries[k["entry"]]
        slots = sorted(info.params, key=lambda s: s.index)
        assert len(slots) == len(k["params"]), (name, slots, k["params"])
        off = 0
        for slot, t in zip(slots, k["params"]):
            size = param_size(t)
            off = (off + size - 1) // size * size
            assert (slot.offset, slot.size) == (off, size), (name, slot, t)
            off += size
        block = tuple(k["block"])
        if info.required_block is not None:
            assert info.required_block == block, (name, info.required_block, block)
        if info.max_threads is not None:
            assert block[0] * block[1] * block[2] <= info.max_threads[0] * info.max_threads[1] * info.max_threads[2], \
                name
