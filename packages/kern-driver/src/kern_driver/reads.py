"""Reads of output buffers that do not synchronize the stream: `Runtime.read_output_async`.

`Runtime.read_output` copies an output back with `cuStreamSynchronize`, so the host cannot enqueue the
next run before the GPU has finished this one, and the GPU then idles while the host reads, decides and
launches again (H200, kern-run Qwen3-4B decode: 67–84 µs per token, 2.6% of the step; NOTES.md 31).
An asynchronous read enqueues the device-to-host copy into pinned memory, records an event behind it,
and returns a `PendingRead` whose `result()` waits on that event only (`cuEventSynchronize`): the host
can enqueue step n + 1 and then collect step n's output while the GPU runs n + 1.

Each output has a small ring of pinned slots (one per read that may be in flight); a read that finds
every slot still owned by an unresolved `PendingRead` first resolves the oldest of them (its value is
kept in that object), so no result is ever lost, only waited for earlier.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from .cuda import PinnedBuffer, check, drv
from .errors import KernDriverError

#: Pinned slots per output: reads of one output that can be in flight at once without waiting.
SLOTS = 4


class PendingRead:
    """One enqueued copy of an output buffer to the host (`Runtime.read_output_async`).

    `result()` waits for the copy (and so for every launch enqueued before it) and returns a new numpy
    array of the buffer's dtype and shape at the read's time (bf16 as np.uint16 bits); calling it again
    returns the same array. `done()` says whether it would return without waiting.
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, nbytes: int, slot: "_Slot"):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self._nbytes = nbytes
        self._slot: _Slot | None = slot
        self._value: np.ndarray | None = None

    def done(self) -> bool:
        """True when `result()` will not wait (`cuEventQuery`)."""
        if self._value is not None:
            return True
        r = drv.cuEventQuery(self._slot.event)
        err = r[0] if isinstance(r, tuple) else r
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check(r, "cuEventQuery", f"read of output `{self.name}`",
              hint="an error here comes from a launch enqueued before the read; Runtime.load(..., debug=True) "
                   "synchronizes after each launch to name it")
        return True

    def result(self) -> np.ndarray:
        """The output's value: waits for the copy's event, then copies out of the pinned slot.

        Raises:
            KernDriverError: a launch before the read failed (reported by the event), or the runtime was
                closed before the read was resolved (`Runtime.close` resolves pending reads first, so only
                a read whose copy itself failed can be in that state).
        """
        if self._value is None:
            slot = self._slot
            if slot is None or slot.buffer.ptr == 0:
                raise KernDriverError(f"read of output `{self.name}`: the runtime was closed before it completed",
                                      hint="collect pending reads (result()) before Runtime.close()")
            check(drv.cuEventSynchronize(slot.event), "cuEventSynchronize", f"read of output `{self.name}`",
                  hint="an error here comes from a launch enqueued before the read; Runtime.load(..., debug=True) "
                       "synchronizes after each launch to name it")
            out = np.empty(self.shape, dtype=self.dtype)
            if self._nbytes:
                out.reshape(-1).view(np.uint8)[:] = slot.buffer.array[: self._nbytes]
            self._value = out
            slot.owner = None
            self._slot = None
        return self._value

    def __repr__(self) -> str:
        state = "done" if self._value is not None else "pending"
        return f"<PendingRead `{self.name}` {list(self.shape)} {self.dtype} {state}>"


class _Slot:
    def __init__(self, nbytes: int, what: str):
        self.buffer = PinnedBuffer(nbytes, what)
        self.event = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate", what)
        self.owner: PendingRead | None = None

    def free(self) -> None:
        self.buffer.free()
        drv.cuEventDestroy(self.event)


class AsyncReads:
    """The rings of pinned slots of a runtime's outputs (allocated on first use)."""

    def __init__(self) -> None:
        self._rings: dict[str, deque[_Slot]] = {}

    def enqueue(self, name: str, nbytes_max: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype,
                copy: Callable[[int], None], stream: Any) -> PendingRead:
        """A PendingRead of `nbytes` of output `name` (allocation `nbytes_max`): `copy(host_ptr)` enqueues the
        device-to-host copy into the slot's pinned memory, then the slot's event is recorded on `stream`."""
        ring = self._rings.get(name)
        if ring is None:
            ring = self._rings[name] = deque(_Slot(nbytes_max, f"asynchronous reads of output `{name}`")
                                             for _ in range(SLOTS))
        slot = next((s for s in ring if s.owner is None), None)
        if slot is None:  # every slot in flight: resolve the oldest read (its value stays in its PendingRead)
            slot = ring[0]
            slot.owner.result()
        ring.remove(slot)
        ring.append(slot)  # most recently used last: ring[0] is the oldest
        if nbytes:
            copy(slot.buffer.ptr)
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
                        pass  # a failed read stays failed; its result() says the runtime is closed
                s.free()
        self._rings.clear()


__all__ = ["AsyncReads", "PendingRead", "SLOTS"]
