#!/usr/bin/env python3
"""What a decode step's input staging costs between two graph launches, and what stream memory operations
would leave of it (issue 9; timing only).

    python3 tools/gpu/staging_probe.py --work DIR [--geometry 4b] [--context 128] [--steps 200] [--rounds 3]

DIR is tools/gpu/prepare.py's layout. One runtime, a `--context`-token random prompt prefilled, the decode graph
captured; then, per round, each mode below enqueues `--steps` decode steps (the same position every step: the
values are one step's, the stream's work is a step's) and the table gives µs per step (CUDA events around the
steps, median over `--rounds`), and each mode's difference to `replay`:

    replay    cuGraphLaunch back to back: no copies (what a step costs with nothing between graphs)
    copies    what kern-run's pipelined loop enqueued up to kern-run 0.2 (Qwen3Session.enqueue_decode): the token fed back
              (cuMemcpyDtoDAsync next_token → token_ids), the graph, next_token read back (DtoH into pinned
              memory, same stream), then positions, slot_mapping and seq_lens written for the next step
              (three cuMemcpyHtoDAsync from pinned staging, an event behind each)
    values    the same with the three position inputs written by cuStreamWriteValue64/32 (the values travel in
              the command stream: no copy engine, no staging)
    batch     `values` as one cuStreamBatchMemOp of three writes
    dtod      the token fed back and the graph only (the floor of any staging that keeps the device-side feed)
    side      `values` with the read-back on a second stream (an event after the graph; the main stream waits for
              the read's event before the next graph, since that graph rewrites next_token)
    sidedtod  `dtod` with the read-back on the second stream (the floor of the forms below)
    batch4    the token feed and the three position writes as one cuMemcpyBatchAsync (the positions from pinned
              memory, every source in stream order), the read-back on the second stream
    batch4c   the same with the positions' sources marked CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL (read when
              the call is made, from ordinary host memory)
    kernel    the token feed and the three position writes as one launch of a one-thread PTX kernel (values as
              kernel parameters), the read-back on the second stream
    kread     that kernel also stores the token it feeds into mapped pinned host memory (the previous step's
              token, read back by the launch itself): one launch between two graphs, no copy at all
    stage     kern-driver's `Runtime.stage` (what kread prototyped): writes, the feed and the read in one launch,
              as kern-run's loop now enqueues a step
    graphkread  kread's kernel as the first node of the decode graph (one graph of its own, captured here: the
              kernel, then the decode program), replayed back to back: what staging costs inside the graph rather
              than between graphs (session 27: +1.9 / −0.0 µs against `stage`'s +5.0 / +5.7 on the H200; built into
              kern-driver as a staging node set per step, `Runtime.run(..., stage=...)`, it moved kern-run's loop by
              ±0.000 ms/token and was reverted: NOTES.md 69, the code at 0603e52)

Prints the table; appends nothing. `--help` needs no GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

MODES = ("replay", "copies", "values", "batch", "dtod", "side", "sidedtod", "batch4", "batch4c", "kernel", "kread",
         "stage", "graphkread")

#: The stage kernel of mode `kernel`: *tok_dst = *tok_src; *pos = *slot = posval; *seq = seqval (one thread).
STAGE_PTX = r"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry kern_probe_stage(.param .u64 tok_dst, .param .u64 tok_src, .param .u64 pos, .param .u64 slot,
                                 .param .u64 seq, .param .u64 posval, .param .u32 seqval, .param .u64 host)
{
    .reg .pred %p1;
    .reg .b64 %rd<10>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [tok_dst];
    ld.param.u64 %rd2, [tok_src];
    ld.param.u64 %rd3, [pos];
    ld.param.u64 %rd4, [slot];
    ld.param.u64 %rd5, [seq];
    ld.param.u64 %rd6, [posval];
    ld.param.u32 %r1, [seqval];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    cvta.to.global.u64 %rd4, %rd4;
    cvta.to.global.u64 %rd5, %rd5;
    ld.global.u64 %rd7, [%rd2];
    st.global.u64 [%rd1], %rd7;
    st.global.u64 [%rd3], %rd6;
    st.global.u64 [%rd4], %rd6;
    st.global.u32 [%rd5], %r1;
    ld.param.u64 %rd8, [host];
    setp.eq.u64 %p1, %rd8, 0;
    @%p1 ret;
    st.global.u64 [%rd8], %rd7;
    ret;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    a = ap.parse_args()
    modes = a.modes.split(",")
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {', '.join(bad)} (known: {', '.join(MODES)})")
    if min(a.context, a.steps, a.rounds) < 1:
        ap.error("--context, --steps and --rounds: positive ints")

    import numpy as np

    from kern_driver.cuda import PinnedBuffer, check, drv
    from step_gap_probe import decoding_session

    rt, _ = decoding_session(a.work, a.geometry, a.context)  # next_token written by the step at context − 1
    pos = a.context - 1
    try:
        rt.synchronize()
        stream, arena = rt._stream, rt._arena
        off = {n: rt.layout.buffers[n].offset for n in ("positions", "slot_mapping", "seq_lens", "token_ids",
                                                      "next_token")}
        pos_arr, seq_arr = np.array([pos], np.int64), np.array([pos + 1], np.int32)
        side = check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
        ev_done, ev_read = (check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
                            for _ in range(2))
        host = PinnedBuffer(8, "staging_probe read-back")
        src = PinnedBuffer(16, "staging_probe position sources")
        src.array[:8] = pos_arr.view(np.uint8)
        src.array[8:12] = seq_arr.view(np.uint8)
        mod = check(drv.cuModuleLoadData(STAGE_PTX.encode() + b"\0"), "cuModuleLoadData (stage PTX)")
        fn = check(drv.cuModuleGetFunction(mod, b"kern_probe_stage"), "cuModuleGetFunction")
        vals = np.array([arena + off["token_ids"], arena + off["next_token"], arena + off["positions"],
                         arena + off["slot_mapping"], arena + off["seq_lens"], pos], np.uint64)
        seqv = np.array([pos + 1], np.uint32)
        # kread: the token also into mapped pinned memory (cuMemHostAlloc DEVICEMAP; its device address)
        mapped_ptr = int(check(drv.cuMemHostAlloc(8, drv.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc (mapped)"))
        mapped_dev = int(check(drv.cuMemHostGetDevicePointer(mapped_ptr, 0), "cuMemHostGetDevicePointer"))
        host_none, host_mapped = np.array([0], np.uint64), np.array([mapped_dev], np.uint64)
        kparams = np.array([vals.ctypes.data + 8 * i for i in range(6)] + [seqv.ctypes.data, host_none.ctypes.data],
                           np.uint64)
        kparams_r = kparams.copy()
        kparams_r[7] = host_mapped.ctypes.data

        def batch_attrs(order_hosts: str):
            attrs = []
            for order in ("CU_MEMCPY_SRC_ACCESS_ORDER_STREAM", order_hosts):
                at = drv.CUmemcpyAttributes()
                at.srcAccessOrder = getattr(drv.CUmemcpySrcAccessOrder, order)
                attrs.append(at)
            return attrs

        attrs4 = batch_attrs("CU_MEMCPY_SRC_ACCESS_ORDER_STREAM")
        attrs4c = batch_attrs("CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL")
        dptr = drv.CUdeviceptr
        dsts = [dptr(arena + off[n]) for n in ("token_ids", "positions", "slot_mapping", "seq_lens")]
        srcs4 = [dptr(v) for v in (arena + off["next_token"], src.ptr, src.ptr, src.ptr + 8)]
        srcs4c = [dptr(v) for v in (arena + off["next_token"], pos_arr.ctypes.data, pos_arr.ctypes.data,
                                    seq_arr.ctypes.data)]

        def write_values(batch: bool) -> None:
            if not batch:
                check(drv.cuStreamWriteValue64(stream, arena + off["positions"], pos, 0), "cuStreamWriteValue64")
                check(drv.cuStreamWriteValue64(stream, arena + off["slot_mapping"], pos, 0), "cuStreamWriteValue64")
                check(drv.cuStreamWriteValue32(stream, arena + off["seq_lens"], pos + 1, 0), "cuStreamWriteValue32")
                return
            ops = []
            for name, value, kind in (("positions", pos, "64"), ("slot_mapping", pos, "64"),
                                      ("seq_lens", pos + 1, "32")):
                o = drv.CUstreamBatchMemOpParams()
                o.writeValue.operation = getattr(drv.CUstreamBatchMemOpType, f"CU_STREAM_MEM_OP_WRITE_VALUE_{kind}")
                o.writeValue.address = arena + off[name]
                if kind == "64":
                    o.writeValue.value64 = value
                else:
                    o.writeValue.value = value
                o.writeValue.flags = 0
                ops.append(o)
            check(drv.cuStreamBatchMemOp(stream, len(ops), ops, 0), "cuStreamBatchMemOp")

        staged_graph = graph = None
        if "graphkread" in modes:  # kread's kernel, then the decode program, as one graph
            from kern_driver.resolve import check_vars

            prog = rt._program("decode")
            env = check_vars(rt.manifest, prog.required, {"tokens": 1}, "staging_probe graphkread")
            rt._prepare(prog, env)
            check(drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  "cuStreamBeginCapture")
            check(drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, kparams_r.ctypes.data, 0), "cuLaunchKernel")
            rt._enqueue(prog, capturing=True)
            graph = check(drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
            staged_graph = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
            check(drv.cuGraphUpload(staged_graph, stream), "cuGraphUpload")

        side_read = ("side", "sidedtod", "batch4", "batch4c", "kernel")
        held: list = []  # mode `stage`: its reads, resolved two steps behind (as kern-run's loop does)

        def step(mode: str) -> None:
            if mode == "graphkread":
                check(drv.cuGraphLaunch(staged_graph, stream), "cuGraphLaunch")
                return
            if mode in ("batch4", "batch4c"):
                srcs, at = (srcs4, attrs4) if mode == "batch4" else (srcs4c, attrs4c)
                check(drv.cuMemcpyBatchAsync(dsts, srcs, [8, 8, 8, 4], 4, at, [0, 1], 2, stream),
                      "cuMemcpyBatchAsync")
            elif mode == "stage":
                held.append(rt.stage(writes={"positions": pos_arr, "slot_mapping": pos_arr, "seq_lens": seq_arr},
                                     feeds={"token_ids": "next_token"}, reads=["next_token"])["next_token"])
                if len(held) > 2:
                    held.pop(0).result()
            elif mode in ("kernel", "kread"):
                kp = kparams if mode == "kernel" else kparams_r
                check(drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, kp.ctypes.data, 0), "cuLaunchKernel")
            elif mode != "replay":
                rt.write_input_from("token_ids", "next_token")
            if mode in side_read:
                check(drv.cuStreamWaitEvent(stream, ev_read, 0), "cuStreamWaitEvent")
            rt.run("decode", graph=True, tokens=1)
            if mode in ("replay", "dtod", "kread", "stage"):
                return
            if mode in side_read:
                check(drv.cuEventRecord(ev_done, stream), "cuEventRecord")
                check(drv.cuStreamWaitEvent(side, ev_done, 0), "cuStreamWaitEvent")
                check(drv.cuMemcpyDtoHAsync(host.ptr, arena + off["next_token"], 8, side), "cuMemcpyDtoHAsync")
                check(drv.cuEventRecord(ev_read, side), "cuEventRecord")
            else:
                check(drv.cuMemcpyDtoHAsync(host.ptr, arena + off["next_token"], 8, stream), "cuMemcpyDtoHAsync")
            if mode == "copies":
                rt.write_input("positions", pos_arr, prefix=True)
                rt.write_input("slot_mapping", pos_arr, prefix=True)
                rt.write_input("seq_lens", seq_arr)
            elif mode in ("values", "batch", "side"):
                write_values(mode == "batch")

        times: dict[str, list[float]] = {m: [] for m in modes}
        t0, t1 = (check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))
        ring = [check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
                for _ in range(2)]
        check(drv.cuEventRecord(ev_read, side), "cuEventRecord")
        for _ in range(a.rounds):
            for m in modes:
                for _ in range(3):
                    step(m)
                rt.synchronize()
                check(drv.cuEventRecord(t0, stream), "cuEventRecord")
                for i in range(a.steps):
                    # the host at most two steps ahead of the GPU, as kern-run's pipelined loop is
                    check(drv.cuEventSynchronize(ring[i % 2]), "cuEventSynchronize")
                    step(m)
                    check(drv.cuEventRecord(ring[i % 2], stream), "cuEventRecord")
                check(drv.cuEventRecord(t1, stream), "cuEventRecord")
                rt.synchronize()
                check(drv.cuStreamSynchronize(side), "cuStreamSynchronize")
                times[m].append(check(drv.cuEventElapsedTime(t0, t1), "cuEventElapsedTime") * 1000 / a.steps)
        base = statistics.median(times[modes[0]])
        print(f"{a.geometry} decode, {a.context}-token context, µs per step ({a.steps} steps, {a.rounds} rounds, "
              f"modes interleaved; the first mode is the baseline)")
        print("| mode | rounds | median | vs first |")
        print("|---|---|---:|---:|")
        for m in modes:
            med = statistics.median(times[m])
            print(f"| {m} | {', '.join(f'{t:.1f}' for t in times[m])} | {med:.1f} | {med - base:+.1f} |")
        if staged_graph is not None:
            check(drv.cuGraphExecDestroy(staged_graph), "cuGraphExecDestroy")
            check(drv.cuGraphDestroy(graph), "cuGraphDestroy")
        host.free()
        src.free()
        drv.cuMemFreeHost(mapped_ptr)
    finally:
        rt.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
