"""Fixtures of kern-driver's CPU tests: a `Runtime` with a layout and no GPU (test_reads.py, test_stage.py)."""

from __future__ import annotations

import pytest

from kern_driver import Runtime
from kern_driver.plan import Region


def _region(name, cls, dtype, shape, nbytes, offset=0):
    return Region(kind="buffer", name=name, cls=cls, offset=offset, nbytes=nbytes, dtype=dtype, shape=shape)


class _Layout:
    buffers = {
        "token_ids": _region("token_ids", "input", "i64", (2048,), 16384),
        "positions": _region("positions", "input", "i64", (2048,), 16384),
        "seq_lens": _region("seq_lens", "input", "i32", (1,), 4),
        "next_token": _region("next_token", "output", "i64", (1,), 8),
        "logits": _region("logits", "output", "bf16", (1, 151936), 303872),
        "w": _region("w", "weight", "bf16", (4, 4), 32),
        "h": _region("h", "workspace", "bf16", (2048, 8), 32768),
        "big": _region("big", "output", "i64", (4096,), 32768),
    }


class _Prepared:
    layout = _Layout()


@pytest.fixture
def rt():
    r = Runtime.__new__(Runtime)
    r._closed = False
    r.prepared = _Prepared()
    r._stage_in = {"token_ids": None, "positions": None, "seq_lens": None}
    return r


@pytest.fixture
def rt_runs(rt):
    """`rt` with two programs: `decode` writes next_token and logits, `prefill` writes neither."""
    from types import SimpleNamespace as NS

    from kern_driver.runtime import _Program

    rt.manifest = NS(buffers={"logits": NS(shape=["tokens", 151936]), "next_token": NS(shape=[1]),
                              "big": NS(shape=[4096])},
                     vars={"tokens": NS(max=2048)})
    rt._programs = {"prefill": _Program("prefill", None, {"tokens"}),
                    "decode": _Program("decode", None, {"tokens"}, writes={"next_token", "logits", "token_ids"})}
    rt._written, rt._last_env = {}, {}
    rt._read = lambda r, name, shape, dt, n: (shape, dt, n)  # the copy back needs a GPU
    return rt


