"""`Runtime.stage` and its kernel (kern_driver.stage_kernel) on the CPU: the PTX against its source, the parameter
block's layout, and the operations a request becomes, on a Runtime with a layout and no GPU (conftest.py). The GPU
test (test_gpu.py) runs the kernel."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kern_driver import KernDriverError, stage_kernel
from kern_driver.stage_kernel import MAX_OPS, StageOp, immediates, pack

ARENA = 0x7F00_0000_0000

OP_DTYPE = np.dtype([("dst", "<u8"), ("src", "<u8"), ("nbytes", "<u4"), ("imm", "<u4")])


def unpack(block: np.ndarray) -> list[StageOp]:
    """The operations of a parameter block, read back as the kernel reads it (`StageOps`)."""
    assert block.dtype == np.uint8 and block.shape == (stage_kernel.PARAM_BYTES,)
    n = int(block[MAX_OPS * 24: MAX_OPS * 24 + 4].view("<u4")[0])
    rec = block[: MAX_OPS * 24].view(OP_DTYPE)
    assert not rec[n:].tobytes().strip(b"\0"), "bytes after the last operation must be zero"
    return [StageOp(int(r["dst"]), int(r["src"]), int(r["nbytes"]), bool(r["imm"])) for r in rec[:n]]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_ptx_is_nvccs_of_the_source(tmp_path):
    src = tmp_path / "stage.cu"
    src.write_text(stage_kernel.SOURCE)
    subprocess.run(["nvcc", "-arch=compute_90", "-ptx", "-o", str(tmp_path / "stage.ptx"), str(src)], check=True,
                   capture_output=True)
    assert (tmp_path / "stage.ptx").read_text() == stage_kernel.PTX
    assert f".entry {stage_kernel.ENTRY}(" in stage_kernel.PTX
    assert f".param .align 8 .b8 {stage_kernel.ENTRY}_param_0[{stage_kernel.PARAM_BYTES}]" in stage_kernel.PTX
    assert f".maxntid {stage_kernel.THREADS}, 1, 1" in stage_kernel.PTX


def test_pack_lays_out_stageops_as_the_kernel_reads_it():
    ops = [StageOp(ARENA + 16384, 2**64 - 1, 8, True), StageOp(ARENA, ARENA + 59904, 8), StageOp(1, 2, 3)]
    block = pack(ops)
    assert unpack(block) == ops
    assert block[384:388].view("<u4")[0] == 3 and not block[388:].any()
    assert unpack(pack([])) == []


def test_immediates_split_little_endian_by_8_bytes():
    data = np.array([0x0102030405060708, 7], np.int64).tobytes() + np.array([-1], np.int32).tobytes()
    ops = immediates(100, data)
    assert ops == [StageOp(100, 0x0102030405060708, 8, True), StageOp(108, 7, 8, True),
                   StageOp(116, 0xFFFFFFFF, 4, True)]
    assert immediates(5, b"") == []


@pytest.mark.parametrize(("ops", "needle"), [
    ([StageOp(0, 0, 1)] * (MAX_OPS + 1), "17 staging operations, at most 16"),
    ([StageOp(0, 0, 9, True)], "operation 0: an immediate of 9 bytes"),
    ([StageOp(0, 0, 8), StageOp(0, 0, 0, True)], "operation 1: an immediate of 0 bytes"),
    ([StageOp(-1, 0, 8)], "out of range"),
])
def test_pack_refuses_what_the_kernel_cannot_hold(ops, needle):
    with pytest.raises(ValueError, match=needle):
        pack(ops)


# -- Runtime.stage: the operations a request becomes ------------------------------------------------------------


class _Slot:
    def __init__(self, name):
        self.buffer = type("B", (), {"device_ptr": 0xD0000 + 0x100 * len(name), "ptr": 1})()


class _Reads:
    """`AsyncReads.take` / `commit` of the real ring, recorded."""

    def __init__(self):
        self.log = []

    def take(self, name, nbytes_max):
        self.log.append(("take", name, nbytes_max))
        return _Slot(name)

    def commit(self, slot, name, nbytes, shape, dtype, stream):
        self.log.append(("commit", name, nbytes, shape, np.dtype(dtype).name))
        return ("pending", name)


@pytest.fixture
def srt(rt_runs):
    rt = rt_runs
    rt._arena, rt._stream, rt.debug, rt._reads = ARENA, 0, False, _Reads()
    rt.launched = []
    rt._launch_stage = lambda ops: (rt.launched.append(list(ops)), rt._reads.log.append(("launch",)))
    return rt


def test_a_decode_step_is_one_launch(srt):
    rt = srt
    rt._ran(rt._programs["decode"], {"tokens": 1})
    out = rt.stage(writes={"positions": np.array([300], np.int64), "seq_lens": np.array([301], np.int32)},
                   feeds={"token_ids": "next_token"}, reads=["next_token"])
    assert out == {"next_token": ("pending", "next_token")}
    L = rt.prepared.layout.buffers
    assert rt.launched == [[
        StageOp(ARENA + L["positions"].offset, 300, 8, True),
        StageOp(ARENA + L["seq_lens"].offset, 301, 4, True),
        StageOp(ARENA + L["token_ids"].offset, ARENA + L["next_token"].offset, 8),
        StageOp(_Slot("next_token").buffer.device_ptr, ARENA + L["next_token"].offset, 8),
    ]]
    # the read's slot is taken before the launch and its event recorded after it
    assert rt._reads.log == [("take", "next_token", 8), ("launch",), ("commit", "next_token", 8, (1,), "int64")]


def test_a_read_has_the_shape_of_the_run_that_wrote_it(srt):
    rt = srt
    rt._ran(rt._programs["decode"], {"tokens": 3})
    rt.stage(reads=["logits"])
    assert rt.launched[0][0].nbytes == 3 * 151936 * 2
    assert rt._reads.log[-1] == ("commit", "logits", 3 * 151936 * 2, (3, 151936), "uint16")


def test_a_multi_row_prefix_write_is_split_into_immediates(srt):
    rt = srt
    rt.stage(writes={"positions": np.arange(5, 8, dtype=np.int64)})
    off = ARENA + rt.prepared.layout.buffers["positions"].offset
    assert rt.launched == [[StageOp(off + 8 * i, 5 + i, 8, True) for i in range(3)]]


@pytest.mark.parametrize(("kw", "needle"), [
    ({}, "stage(): nothing to stage"),
    ({"writes": {"token_ids": np.zeros(1, np.int64)}, "feeds": {"token_ids": "next_token"}},
     "input(s) `token_ids` both written and fed"),
    ({"reads": ["next_token", "next_token"]}, "name an output more than once"),
    ({"reads": "next_token"}, "a sequence of output names, not one string"),
    ({"writes": {"nope": np.zeros(1, np.int64)}}, "stage(writes=...): unknown buffer `nope`"),
    ({"writes": {"w": np.zeros(1, np.uint16)}}, "`w` is a `weight` buffer; only `input` buffers are written"),
    ({"writes": {"positions": np.zeros(1, np.int32)}}, "stage(writes=...)(`positions`): array dtype int32"),
    ({"writes": {"seq_lens": np.zeros(2, np.int32)}}, "array shape [2], the buffer is [1]"),
    ({"feeds": {"seq_lens": "next_token"}}, "stage(feeds={`seq_lens`: `next_token`}): dtypes differ"),
    ({"feeds": {"token_ids": "positions"}}, "the source must be an `output` or a `carry`"),
    ({"reads": ["token_ids"]}, "stage(reads=...): buffer `token_ids` is an `input` buffer, not an output"),
    ({"reads": ["next_token"]}, "stage(reads=...): output `next_token` has not been written"),
    ({"writes": {"positions": np.zeros(17, np.int64)}}, "17 operations (0 reads, 0 feeds, the writes 8 bytes each)"),
])
def test_stage_names_what_is_wrong(srt, kw, needle):
    with pytest.raises(KernDriverError) as e:
        srt.stage(**kw)
    assert needle in str(e.value)
    assert srt.launched == [] and not any(x[0] == "take" for x in srt._reads.log)


def test_too_many_operations_say_to_write_large_inputs_first(srt):
    with pytest.raises(KernDriverError) as e:
        srt.stage(writes={"positions": np.zeros(16, np.int64)}, feeds={"token_ids": "next_token"})
    assert "17 operations" in str(e.value) and "write larger inputs with write_input" in e.value.hint


def test_a_closed_runtime_refuses_stage(srt):
    srt._closed = True
    with pytest.raises(KernDriverError, match="this Runtime is closed"):
        srt.stage(feeds={"token_ids": "next_token"})
