"""Reads of output buffers that do not synchronize the stream: `Runtime.read_output_async`.

`Runtime.read_output` copies an output back with `cuStreamSynchronize`, so the host cannot enqueue the
next run before the GPU has finished this one, and the GPU then idles while the host reads, decides and
launches again (H200, kern-run Qwen3-4B decode: 44–97 µs per token, 1.7–3.7% of the step; BENCHMARKS.md
"Session 10"). An asynchronous read enqueues the device-to-host copy into pinned memory, records an event
behind it, and returns a `PendingRead` whose `result()` waits on that event only (`cuEventSynchronize`):
the host can enqueue step n + 1 and then collect step n's output while the GPU runs n + 1.

Each output has a small ring of pinned slots (one per read that may be in flight, at most SLOTS, allocated
as reads need them); a read that finds every slot still owned by an unresolved `PendingRead` first
resolves the oldest of them (its value is kept in that object), so no result is ever lost, only waited
for earlier.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from .cuda import PinnedBuffer, check, drv
from .errors import KernDriverError

#: Pinned slots per output at most: reads of one output that can be in flight at once without waiting.
SLOTS = 4

_LAUNCH_HINT = ("an error here comes from a launch enqueued before the read; Runtime.load(..., debug=True) "
                "synchronizes after each launch to name it")


class PendingRead:
    """One enqueued copy of an output buffer to the host (`Runtime.read_output_async`).

    `result()` waits for the copy (and so for every launch enqueued before it) and returns a new numpy
    array of the buffer's dtype and shape at the read's time (bf16 as np.uint16 bits); calling it again
    returns the same array, or raises the same error. `done()` says whether it would return without
    waiting.
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, nbytes: int, slot: "_Slot"):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self._nbytes = nbytes
        self._slot: _Slot | None = slot
        self._value: np.ndarray | None = None
        self._error: KernDriverError | None = None

    def _usable_slot(self) -> "_Slot":
        if self._error is not None:
            raise self._error
        slot = self._slot
        if slot is None or slot.freed:
            self._error = KernDriverError(f"read of output `{self.name}`: the runtime was closed and the read's "
                                          "copy had not completed")
            raise self._error
        return slot

    def done(self) -> bool:
        """True when `result()` will not wait (`cuEventQuery`).

        Raises:
            KernDriverError: the copy or a launch before it failed (the error `result()` raises).
        """
        if self._value is not None:
            return True
        slot = self._usable_slot()
        r = drv.cuEventQuery(slot.event)
        err = r[0] if isinstance(r, tuple) else r
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        try:
            check(r, "cuEventQuery", f"read of output `{self.name}`", hint=_LAUNCH_HINT)
        except KernDriverError as e:
            self._error = e
            raise
        return True

    def result(self) -> np.ndarray:
        """The output's value: waits for the copy's event, then copies out of the pinned slot.

        Raises:
            KernDriverError: a launch before the read failed (reported by the event; raised again by every
                later call), or the runtime was closed while the read's copy had not completed (`close`
                resolves pending reads first, so only a failed copy ends that way).
        """
        if self._value is None:
            slot = self._usable_slot()
            try:
                check(drv.cuEventSynchronize(slot.event), "cuEventSynchronize", f"read of output `{self.name}`",
                      hint=_LAUNCH_HINT)
            except KernDriverError as e:
                self._error = e
                raise
            out = np.empty(self.shape, dtype=self.dtype)
            if self._nbytes:
                out.reshape(-1).view(np.uint8)[:] = slot.buffer.array[: self._nbytes]
            self._value = out
            slot.owner = None
            self._slot = None
        return self._value

    def __repr__(self) -> str:
        state = "done" if self._value is not None else "failed" if self._error is not None else "pending"
        return f"<PendingRead `{self.name}` {list(self.shape)} {self.dtype} {state}>"


class _Slot:
    """A pinned buffer (mapped: `Runtime.stage`'s kernel stores into it) and the event recorded behind the copy."""

    def __init__(self, nbytes: int, what: str):
        self.buffer = PinnedBuffer(nbytes, what, mapped=True)
        try:
            self.event = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate", what)
        except BaseException:
            self.buffer.free()
            raise
        self.owner: PendingRead | None = None
        self.freed = False

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.buffer.free()
            drv.cuEventDestroy(self.event)


class AsyncReads:
    """The rings of pinned slots of a runtime's outputs."""

    def __init__(self) -> None:
        self._rings: dict[str, deque[_Slot]] = {}

    def enqueue(self, name: str, nbytes_max: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype,
                copy: Callable[[int], None], stream: Any) -> PendingRead:
        """A PendingRead of `nbytes` of output `name` (allocation `nbytes_max`): `copy(host_ptr)` enqueues the
        device-to-host copy into the slot's pinned memory, then the slot's event is recorded on `stream`."""
        slot = self.take(name, nbytes_max)
        if nbytes:
            copy(slot.buffer.ptr)
        return self.commit(slot, name, nbytes, shape, dtype, stream)

    def take(self, name: str, nbytes_max: int) -> _Slot:
        """A free slot of output `name`'s ring (allocation `nbytes_max`), the most recently used from now on; with
        every slot pending, the oldest read is resolved first (its value stays in its PendingRead). The caller
        enqueues the copy into `slot.buffer` (host address `ptr`, device address `device_ptr`), then `commit`s."""
        ring = self._rings.setdefault(name, deque())
        slot = next((s for s in ring if s.owner is None), None)
        if slot is None and len(ring) < SLOTS:
            slot = _Slot(nbytes_max, f"asynchronous reads of output `{name}`")
            ring.append(slot)
        if slot is None:  # every slot in flight: resolve the oldest read (its value stays in its PendingRead)
            slot = ring[0]
            slot.owner.result()
        ring.remove(slot)
        ring.append(slot)  # most recently used last: ring[0] is the oldest
        return slot

    def commit(self, slot: _Slot, name: str, nbytes: int, shape: tuple[int, ...], dtype: np.dtype,
               stream: Any) -> PendingRead:
        """Record `slot`'s event on `stream` (behind the copy just enqueued into it) and return its PendingRead."""
        check(drv.cuEventRecord(slot.event, stream), "cuEventRecord", f"read of output `{name}`")
        slot.owner = PendingRead(name, shape, dtype, nbytes, slot)
        return slot.owner

    def close(self) -> None:
        """Resolve every pending read (its copy has completed once the stream is synchronized), then free."""
        for ring in self._rings.values():
            for s in ring:
                if s.owner is not None:
                    try:
                        s.owner.result()
                    except KernDriverError:
                        pass  # the read keeps its error; result() raises it
                s.free()
        self._rings.clear()


__all__ = ["AsyncReads", "PendingRead", "SLOTS"]
