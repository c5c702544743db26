"""Thin checked wrappers over `cuda.bindings.driver` (the CUDA driver API).

Every call goes through `check`, which turns a non-success `CUresult` into a
`KernDriverError` carrying the error's name (`cuGetErrorName`) and description
(`cuGetErrorString`), the call that failed, and the manifest location the
caller passes. cuda.bindings returns `(CUresult, *values)` tuples; `check`
returns the values.

`init` is the single place that finds out whether a GPU is there: no driver
library, no device, or a device index out of range each give one clear
`KernDriverError` instead of a traceback from inside the bindings.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .errors import KernDriverError

try:  # cuda-bindings ≥ 12.x layout
    from cuda.bindings import driver as drv
except ImportError as _e:  # pragma: no cover - depends on the installation
    drv = None  # type: ignore[assignment]
    _IMPORT_ERROR: ImportError | None = _e
else:
    _IMPORT_ERROR = None

SUCCESS = drv.CUresult.CUDA_SUCCESS if drv is not None else 0


def _require() -> Any:
    if drv is None:
        raise KernDriverError(
            f"cuda-bindings is not importable ({_IMPORT_ERROR})",
            hint="pip install 'cuda-bindings>=13' (matching your driver's CUDA major version)",
        )
    return drv


def error_name(err: Any) -> str:
    """`CUDA_ERROR_...` name of a CUresult (falls back to the number)."""
    try:
        r, name = drv.cuGetErrorName(err)
        if r == SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # pragma: no cover - defensive: never mask the original error
        pass
    return f"CUresult {int(err)}"


def error_string(err: Any) -> str:
    """The driver's description of a CUresult."""
    try:
        r, s = drv.cuGetErrorString(err)
        if r == SUCCESS and s:
            return s.decode() if isinstance(s, bytes) else str(s)
    except Exception:  # pragma: no cover
        pass
    return "unknown error"


_HINTS = {
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the cubin was built for another GPU architecture; rebuild it for this device (e.g. nvcc -cubin -arch=sm_90)",
    "CUDA_ERROR_INVALID_IMAGE": "the file is not a valid cubin for this driver",
    "CUDA_ERROR_OUT_OF_MEMORY": "reduce capacity_tokens or the var maxima (see Runtime.describe() / kern-verify --plan for the sizes)",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel accessed memory outside its buffers; rerun with Runtime.load(..., debug=True) to find the launch, then compute-sanitizer",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers or too much shared memory for this block size; check the launch's block and shared_mem",
    "CUDA_ERROR_INVALID_VALUE": "an argument is out of range (grid, block, shared memory or parameter size)",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": "an operation that cannot be captured ran during graph capture",
}


def check(result: Any, what: str, where: str | None = None, hint: str | None = None) -> Any:
    """Unpack a cuda.bindings result tuple; raise `KernDriverError` on error.

    Returns None, the single value, or the tuple of values.

    Raises:
        KernDriverError: `what failed: <description> [CUDA_ERROR_...]`, at `where`.
    """
    if isinstance(result, tuple):
        err, vals = result[0], result[1:]
    else:
        err, vals = result, ()
    if err != SUCCESS:
        raise_error(err, what, where, hint)
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


def raise_error(err: Any, what: str, where: str | None = None, hint: str | None = None) -> None:
    name = error_name(err)
    raise KernDriverError(f"{what} failed: {error_string(err)}", cuda_error=name, where=where, hint=hint or _HINTS.get(name))


class Device:
    """The device, its primary context and the runtime's own stream.

    The primary context is shared with other users of the device in the process
    (PyTorch, CuPy), so kern buffers and theirs can interoperate. The stream is
    created with `CU_STREAM_NON_BLOCKING`: never the legacy default stream, which
    cannot be captured into a graph and serializes with every other stream.
    """

    def __init__(self, index: int):
        d = _require()
        try:
            r = d.cuInit(0)
        except Exception as e:  # the driver library itself cannot be loaded
            raise KernDriverError(
                f"no NVIDIA driver: the CUDA driver library (libcuda.so) cannot be loaded ({type(e).__name__}: {e})",
                hint="kern-driver executes manifests on an NVIDIA GPU; on a machine without one use "
                "kern-verify (static checks, --plan) instead",
            ) from None
        if r[0] != SUCCESS:
            raise_error(r[0], "cuInit", hint="no usable CUDA device (is the driver loaded? is CUDA_VISIBLE_DEVICES empty?)")
        count = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if count == 0:
            raise KernDriverError("no CUDA device is visible", hint="check nvidia-smi and CUDA_VISIBLE_DEVICES")
        if not 0 <= index < count:
            raise KernDriverError(f"device {index} does not exist: {count} device(s) visible (0..{count - 1})")
        self.index = index
        self.dev = check(d.cuDeviceGet(index), "cuDeviceGet")
        self.ctx = check(d.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        check(d.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        name = check(d.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        self.name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
        A = d.CUdevice_attribute
        self.cc = (
            check(d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev), "cuDeviceGetAttribute"),
            check(d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev), "cuDeviceGetAttribute"),
        )
        self.max_shared_optin = check(
            d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.dev), "cuDeviceGetAttribute"
        )
        self.stream = check(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._released = False

    def make_current(self) -> None:
        """Make the device's primary context current on this thread."""
        check(drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def synchronize(self, where: str | None = None) -> None:
        check(drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize", where,
              hint="an error here comes from an earlier asynchronous launch or copy; Runtime.load(..., debug=True) "
              "synchronizes after each launch to name it")

    def release(self) -> None:
        """Destroy the stream and release the primary context (idempotent)."""
        if self._released:
            return
        self._released = True
        drv.cuStreamDestroy(self.stream)
        drv.cuDevicePrimaryCtxRelease(self.dev)


def mem_alloc(nbytes: int, what: str) -> int:
    """`cuMemAlloc` (≥ 256-byte aligned); returns the device address as an int."""
    ptr = check(drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes} bytes) for {what}")
    return int(ptr)


def mem_free(ptr: int) -> None:
    drv.cuMemFree(ptr)


class PinnedBuffer:
    """Page-locked host memory (`cuMemHostAlloc`) viewed as a numpy uint8 array.

    Pinned memory is what lets `cuMemcpyHtoDAsync` be truly asynchronous (from pageable
    memory the driver stages synchronously) and what a captured copy could safely read.
    `mapped`: allocated with CU_MEMHOSTALLOC_DEVICEMAP, so that kernels can store into it
    (`device_ptr`, from `cuMemHostGetDevicePointer`; 0 when not mapped).
    """

    def __init__(self, nbytes: int, what: str, mapped: bool = False):
        self.nbytes = nbytes
        flags = drv.CU_MEMHOSTALLOC_DEVICEMAP if mapped else 0
        self.ptr = int(check(drv.cuMemHostAlloc(max(nbytes, 1), flags), f"cuMemHostAlloc({nbytes} bytes) for {what}"))
        self.device_ptr = 0
        if mapped:
            try:
                self.device_ptr = int(check(drv.cuMemHostGetDevicePointer(self.ptr, 0), "cuMemHostGetDevicePointer",
                                            what))
            except BaseException:
                drv.cuMemFreeHost(self.ptr)
                raise
        self.array = np.frombuffer((ctypes.c_uint8 * max(nbytes, 1)).from_address(self.ptr), dtype=np.uint8)[:nbytes]

    def free(self) -> None:
        if self.ptr:
            self.array = np.zeros(0, dtype=np.uint8)
            drv.cuMemFreeHost(self.ptr)
            self.ptr = self.device_ptr = 0


def module_load(image: bytes, what: str) -> Any:
    """`cuModuleLoadData` of a cubin image."""
    return check(drv.cuModuleLoadData(image), "cuModuleLoadData", where=what)


def module_function(module: Any, entry: str) -> Any | None:
    """`cuModuleGetFunction`, None when the module has no such entry (CUDA_ERROR_NOT_FOUND)."""
    r = drv.cuModuleGetFunction(module, entry.encode())
    if r[0] == drv.CUresult.CUDA_ERROR_NOT_FOUND:
        return None
    return check(r, f"cuModuleGetFunction({entry!r})")


def param_layout(func: Any) -> list[tuple[int, int]]:
    """`(offset, size)` of each parameter of `func`, by `cuFuncGetParamInfo` on index
    0, 1, ... until it returns CUDA_ERROR_INVALID_VALUE (index past the last parameter;
    CUDA driver API reference, cuFuncGetParamInfo)."""
    out = []
    i = 0
    while True:
        r = drv.cuFuncGetParamInfo(func, i)
        if r[0] == drv.CUresult.CUDA_ERROR_INVALID_VALUE:
            return out
        off, size = check(r, f"cuFuncGetParamInfo(index {i})")
        out.append((int(off), int(size)))
        i += 1
