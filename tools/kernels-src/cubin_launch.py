"""Minimal launcher for the built kernels (index.json + cubins) through cuda.bindings.

Used by the GPU tests (tests-integration/gpu/test_kernels_gpu.py) and the benchmark
(tools/bench_kernels.py); not part of kern.  Memory comes from torch (the caller's
tensors); launches go on torch's current stream so events and torch ops order with them.

    ks = KernelSet("build/kernels")                # reads index.json
    ks.launch("rms_norm_h2560", grid=(T, 1, 1), args=[x, w, out, 1e-6])

An index entry's ``carveout`` (percent; kern's launch field of the same name) becomes the function's
CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT when it is loaded, so that every launch of it here gets the
shared-memory configuration kern's launches get (the function attribute and kern-driver's per-launch attribute
of cuLaunchKernelEx set the same preference).

``args`` are the kernel's params *without* Triton's two hidden trailing u64 params
(appended as 0): a torch tensor or an int address for buffer/ptr params, Python
numbers for scalars (packed as the index's i32/i64/u32/u64/f32 type).
"""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path

from cuda.bindings import driver as cu

from catalog import shared_mem_of  # noqa: F401  (re-exported: the index's shared-memory rule)

_CT = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64,
       "f32": ctypes.c_float, "f64": ctypes.c_double, "i16": ctypes.c_int16, "u16": ctypes.c_uint16,
       "i8": ctypes.c_int8, "u8": ctypes.c_uint8}
_PTR = re.compile(r"^(in|out|inout) (buffer<\w+>|ptr)$")


def check(res):
    """Unwrap a cuda.bindings result tuple, raising on any error."""
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, msg = cu.cuGetErrorString(err)
        raise RuntimeError(f"CUDA driver error {err}: {msg.decode() if msg else '?'}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def index_carveout(k: dict, where: str) -> int | None:
    """Index entry `k`'s `carveout` (percent 0..100), or None where it has none. Raises ValueError, starting with
    `where`, when it is not an int in 0..100 (gen_qwen3.py refuses such an index too)."""
    c = k.get("carveout")
    if c is not None and (type(c) is not int or not 0 <= c <= 100):
        raise ValueError(f"{where}: carveout {c!r} is not an int percent 0..100 (the preferred shared-memory carveout; "
                         "absent: the driver's choice); rebuild the kernels dir with tools/build_kernels.py")
    return c


class KernelSet:
    def __init__(self, kernels_dir):
        self.dir = Path(kernels_dir)
        self.index = json.loads((self.dir / "index.json").read_text())
        self.kernels = self.index["kernels"]
        self._modules: dict[str, object] = {}
        self._funcs: dict[str, object] = {}
        self._smem_limit: dict[str, int] = {}  # MAX_DYNAMIC_SHARED_SIZE_BYTES per kernel (default_dynamic_smem unset)
        self._images: list[bytes] = []
        check(cu.cuInit(0))
        ctx = check(cu.cuCtxGetCurrent())
        if ctx is None or int(ctx) == 0:  # nobody made a context current: use device 0's primary one
            dev = check(cu.cuDeviceGet(0))
            check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(dev))))

    def function(self, name: str):
        if name not in self._funcs:
            k = self.kernels[name]
            mod = self._modules.get(k["module"])
            if mod is None:
                image = (self.dir / k["module"]).read_bytes()
                self._images.append(image)
                mod = check(cu.cuModuleLoadData(image))
                self._modules[k["module"]] = mod
            self._funcs[name] = check(cu.cuModuleGetFunction(mod, k["entry"].encode()))
            self._smem_limit[name] = default_dynamic_smem(self._funcs[name])
            self._allow_smem(name, k["shared_mem"])
            carveout = index_carveout(k, f"{self.dir / 'index.json'}: kernel `{name}`")
            if carveout is not None:  # as the manifest launches it (its launch field `carveout`)
                check(cu.cuFuncSetAttribute(
                    self._funcs[name], cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    carveout))
        return self._funcs[name]

    def _allow_smem(self, name: str, smem: int) -> None:
        """Raise kernel `name`'s dynamic shared memory limit to `smem` bytes where it is above what the function may
        take without the opt-in (`default_dynamic_smem`)."""
        if smem > self._smem_limit[name]:
            check(cu.cuFuncSetAttribute(self._funcs[name],
                                        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
            self._smem_limit[name] = smem

    def launch(self, name: str, grid, args, stream: int | None = None, pdl: bool = False):
        """Enqueue kernel `name` with `grid` (1-3 ints) and `args` (see the module docstring) on `stream`
        (default: torch's current stream), with the dynamic shared memory `shared_mem_of` computes. pdl=True:
        through cuLaunchKernelEx with the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1
        (programmatic dependent launch, sm_90: the kernel may begin before the previous kernel on the stream
        completes; a graph captures the edge)."""
        k = self.kernels[name]
        f = self.function(name)
        types = k["params"]
        n_hidden = 2 if k["param_names"][-2:] == ["global_scratch", "profile_scratch"] else 0
        args = list(args) + [0] * n_hidden
        if len(args) != len(types):
            raise TypeError(f"{name}: {len(args)} args for {len(types)} params {k['param_names']}")
        smem = shared_mem_of(k, args)
        self._allow_smem(name, smem)
        holders = []
        for a, t in zip(args, types):
            if _PTR.match(t):
                holders.append(ctypes.c_uint64(a if isinstance(a, int) else a.data_ptr()))
            else:
                holders.append(_CT[t](a))
        ptrs = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        if stream is None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        grid = (tuple(grid) + (1, 1))[:3]
        launch_function(f, grid, k["block"], smem, cu.CUstream(stream), ctypes.addressof(ptrs), pdl)


def pdl_config(grid, block, smem: int, stream) -> "cu.CUlaunchConfig":
    """The CUlaunchConfig of a programmatic dependent launch (CUDA driver API, sm_90): grid and block are
    3-tuples, smem the dynamic shared memory in bytes, stream a CUstream; one attribute,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1 (the kernel may begin before the previous kernel
    on the stream completes; stream capture keeps it as a programmatic edge of the graph)."""
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = smem
    cfg.hStream = stream
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


#: Shared memory per block (static + dynamic, bytes) a function may use without opting in (CUDA programming guide,
#: "Shared Memory" of compute capability 7.x+: above 48 KB a kernel needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
DEFAULT_SMEM = 48 * 1024


def default_dynamic_smem(f) -> int:
    """Bytes of dynamic shared memory CUfunction `f` may launch with before it needs the opt-in attribute: 48 KB less
    its static shared memory (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)."""
    return DEFAULT_SMEM - check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f))


def allow_dynamic_smem(f, smem: int) -> None:
    """Let CUfunction `f` launch with `smem` bytes of dynamic shared memory: where that is above what it may take now
    (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: 48 KB less its static shared memory until raised), raise that
    attribute to `smem` (cuFuncSetAttribute); never lowers it, so a graph captured with a larger launch stays valid.
    Raises RuntimeError (the driver's CUDA_ERROR_INVALID_VALUE) past the device's opt-in limit (227 KB per block on
    sm_90, static included)."""
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if smem > check(cu.cuFuncGetAttribute(attr, f)):
        check(cu.cuFuncSetAttribute(f, attr, smem))


def launch_function(f, grid, block, smem: int, stream, kernel_params, pdl: bool = False) -> None:
    """Launch CUfunction `f` (grid, block: 3-tuples; smem: bytes; stream: a CUstream; kernel_params: what
    cuLaunchKernel takes, an address of the argument pointers or cuda.bindings' (values, types) tuple) with
    cuLaunchKernel, or with pdl=True through cuLaunchKernelEx and `pdl_config`. Raises RuntimeError on a
    driver error."""
    if not pdl:
        check(cu.cuLaunchKernel(f, *grid, *block, smem, stream, kernel_params, 0))
        return
    check(cu.cuLaunchKernelEx(pdl_config(grid, block, smem, stream), f, kernel_params, 0))
