"""`Runtime`: load a verified manifest onto a GPU and run its programs.

Load order (DESIGN §4), checks that need no GPU first so that they fail the
same way on any machine:

1. decode the manifest, `kern_verify.verify` it (refuse on any diagnostic);
2. plan the arena (`kern_verify.plan` + `plan.layout`), read every module and check its sha256
   (`modules.read_modules`), read the weights' safetensors headers and bind
   them by name, dtype and shape (`weights.bind`);
3. initialize the device (one clear error when there is no GPU), load every
   module (`cuModuleLoadData`), resolve each launch's entry and compare its
   declared params with `cuFuncGetParamInfo` (`resolve.resolve_entries`);
4. raise `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` where a launch's dynamic
   shared memory and its kernel's static shared memory add up to more than 48 KiB
   (`shared_opt_ins`);
5. allocate the arena (zeroed) and, when the manifest uses a GEMM built-in,
   the cuBLASLt workspace; copy the weights; allocate pinned staging for the
   `input` and `output` buffers;
6. flatten every program into steps and pack their parameters once
   (`staging.StagedProgram`); choose cuBLASLt algorithms for GEMMs whose shape
   does not depend on vars.

`run` then only re-packs var-dependent slots (when the values changed) and
enqueues `cuLaunchKernel`s and cuBLASLt matmuls on the runtime's own stream.
Launches with launch attributes go through `cuLaunchKernelEx` with a launch
configuration built at load, one attribute per feature: `"pdl": true`
(`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` = 1) may begin while the
previous kernel drains, and a captured graph keeps that as a programmatic edge;
`"carveout": P` (`CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT` = P) asks for
the shared-memory configuration of the SMs it runs on.
"""

from __future__ import annotations

import bisect
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kern_schema import DTYPES, Manifest, load as load_manifest

from . import cuda, stage_kernel
from .cublaslt import DEFAULT_WORKSPACE, CublasLt, GemmPlan
from .cuda import SUCCESS, PinnedBuffer, check, drv, raise_error
from .errors import KernDriverError, a_class
from .graphs import Graph
from .modules import ModuleImage, read_modules
from kern_verify import Plan

from .plan import Layout, Region, layout as make_layout, plain_int
from .reads import AsyncReads, PendingRead
from .resolve import EXTERNS, ResolvedEntry, Step, check_vars, resolve_entries, resolve_program, written_buffers
from .staging import StagedProgram, extern_values
from .weights import Binding, TensorRef, bind, read_headers, weight_paths

#: numpy dtype of each manifest dtype as seen by `write_input`/`read_buffer`
#: (bf16 and the fp8 types as raw bits: numpy has no such dtypes).
NUMPY_DTYPES: dict[str, Any] = {
    "bf16": np.uint16, "f16": np.float16, "f32": np.float32, "f64": np.float64,
    "i8": np.int8, "u8": np.uint8, "i16": np.int16, "u16": np.uint16,
    "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
    "fp8e4m3": np.uint8, "fp8e5m2": np.uint8,
}

#: Shared memory (static + dynamic) a block may use without opting in (CUDA C Programming Guide: 48 KB).
SHARED_DEFAULT_LIMIT = 48 * 1024


def shared_opt_ins(needs: dict[Any, tuple[int, str]], static: dict[Any, int], device_max: int
                   ) -> list[tuple[Any, int, str]]:
    """The functions whose `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` must be raised before they launch.

    needs: function key -> (the largest dynamic shared memory any launch gives it, in bytes; where that launch is,
    e.g. "ops.mlp.impl.launches[0] (entry `kern_mlp_m1`)"); static: function key -> its static shared memory in
    bytes (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`); device_max: the device's per-block opt-in maximum
    (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, 232,448 bytes on sm_90).

    The attribute's default is 48 KB minus the static size, and the static size plus the attribute may not exceed
    device_max (CUDA Driver API, cuFuncSetAttribute): so a launch needs the opt-in as soon as static + dynamic > 48 KB,
    not only when the dynamic part alone is (a kernel with 8 KB of static arrays and 46 KB dynamic fails its launch
    with CUDA_ERROR_INVALID_VALUE otherwise). Returns [(key, dynamic bytes to set, where)] in `needs` order.
    Raises KernDriverError naming the launch when static + dynamic exceeds device_max (no setting can run it).
    """
    out = []
    for key, (smem, where) in needs.items():
        st = static.get(key, 0)
        if st + smem > device_max:
            raise KernDriverError(
                f"{smem} bytes of dynamic shared memory plus the kernel's {st} bytes of static shared memory exceed "
                f"this device's {device_max} bytes per block", where=where,
                hint=f"give the launch at most {max(0, device_max - st)} bytes of `shared_mem`, or shrink the kernel's "
                     "static arrays (kern-verify E0094 checks sm_90's limit with --kernels)")
        if st + smem > SHARED_DEFAULT_LIMIT:
            out.append((key, smem, where))
    return out

LAUNCH_MODES = ("packed", "params")

# kinds of the prepared launch items (`Runtime._build_items`), compared by identity
_KERNEL, _EX, _EXTERN = "kernel", "ex", "extern"


@dataclass
class Prepared:
    """Everything `Runtime.load` checks before touching a GPU (see `prepare`)."""

    manifest: Manifest
    kernels_dir: str
    layout: Layout
    modules: dict[str, ModuleImage]
    tensors: dict[str, TensorRef]
    bindings: list[Binding]
    weight_files: list[str] = field(default_factory=list)
    warnings: list[Any] = field(default_factory=list)


def _fits_as_prefix(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether data of `shape` can be written at the start of a buffer of `full` shape: the same rank and
    trailing dims, at most as many rows (a 0-d shape must equal `full`)."""
    return len(shape) == len(full) and shape[1:] == full[1:] and (len(shape) == 0 or shape[0] <= full[0])


def _decode(manifest: Any) -> tuple[Manifest, str | None, str | None]:
    """(Manifest, source text or None, manifest directory or None)."""
    if isinstance(manifest, Manifest):
        return manifest, None, None
    if isinstance(manifest, str) and manifest.lstrip().startswith("{"):
        raise KernDriverError(
            "the manifest is a str that holds JSON text, not a path",
            hint="pass the JSON as bytes (text.encode()), or the manifest file's path, or a kern_schema.Manifest")
    if not isinstance(manifest, (str, bytes, bytearray, memoryview, os.PathLike)):
        raise KernDriverError(
            f"the manifest must be a path, JSON bytes or a kern_schema.Manifest, not {type(manifest).__name__}",
            hint="for a dict: json.dumps(d).encode(), or kern_schema.load(json.dumps(d).encode())")
    try:
        if isinstance(manifest, (bytes, bytearray, memoryview)):
            text = bytes(manifest).decode("utf-8")
            return load_manifest(bytes(manifest)), text, None
        path = os.fspath(manifest)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return load_manifest(text.encode("utf-8")), text, str(Path(path).parent)
    except OSError as e:
        raise KernDriverError(f"cannot read manifest {manifest}: {e.strerror or e}") from None
    except ValueError as e:  # ManifestDecodeError lists every problem
        raise KernDriverError(f"the manifest cannot be decoded: {e}") from None


def _verify(m: Manifest, text: str | None) -> list[Any]:
    try:
        from kern_verify import verify
    except ImportError:
        raise KernDriverError(
            "kern_verify.verify is not available in this environment",
            hint="install kern-verify ≥ 0.1 (a dependency of kern-driver), or pass verify=False to load "
            "an already verified manifest",
        ) from None
    diags = verify(m, text) if text is not None else verify(m)
    errors = [d for d in diags if getattr(d, "severity", "error") == "error"]
    if errors:
        diags = errors
        lines = [str(d) for d in diags]
        raise KernDriverError(
            f"the manifest does not verify: {len(diags)} diagnostic(s):\n    " + "\n    ".join(
                ln.replace("\n", "\n    ") for ln in lines),
            hint="run `kern-verify MANIFEST` for the full report with source lines and hints",
        )
    return [d for d in diags if d not in errors]


def prepare(
    manifest: Any,
    kernels_dir: str | os.PathLike[str] | None,
    weights: Any,
    *,
    capacity_tokens: int = 4096,
    verify: bool = True,
) -> Prepared:
    """Every load check that needs no GPU: decode, verify, plan, module hashes, weight binding.

    Useful on its own as a dry run (`kern_driver.prepare(...).layout.plan.render()`).

    Raises:
        KernDriverError: the first stage that fails, with every problem of that stage.
    """
    m, text, mdir = _decode(manifest)
    warnings = _verify(m, text) if verify else []
    if kernels_dir is None:
        if mdir is None:
            raise KernDriverError("kernels_dir is required when the manifest is not given as a path")
        kernels_dir = mdir
    p = make_layout(m, capacity_tokens)
    images = read_modules(m, kernels_dir)
    files = weight_paths(weights)
    tensors = read_headers(files)
    bindings = bind(m, p, tensors)
    return Prepared(m, os.fspath(kernels_dir), p, images, tensors, bindings, files, warnings)


class _CudaModuleTable:
    """`resolve.ModuleTable` over modules loaded with `cuModuleLoadData`."""

    def __init__(self, handles: dict[str, Any]):
        self.handles = handles
        self._funcs: dict[tuple[str, str], Any] = {}

    def modules(self):
        return self.handles.keys()

    def function(self, module: str, entry: str) -> Any | None:
        key = (module, entry)
        if key not in self._funcs:
            h = self.handles.get(module)
            self._funcs[key] = None if h is None else cuda.module_function(h, entry)
        return self._funcs[key]

    def param_layout(self, module: str, entry: str):
        from kern_verify.cubin import ParamSlot

        f = self.function(module, entry)
        return [ParamSlot(i, off, size) for i, (off, size) in enumerate(cuda.param_layout(f))]

    def cluster(self, module: str, entry: str) -> tuple[int, int, int] | None:
        """The compiled cluster (`CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH`; 0s without one)."""
        f = self.function(module, entry)
        a = drv.CUfunction_attribute
        dims = tuple(check(drv.cuFuncGetAttribute(x, f), f"cuFuncGetAttribute({x.name})", f"entry `{entry}`")
                     for x in (a.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, a.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
                               a.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH))
        return dims if all(dims) else None  # type: ignore[return-value]


@dataclass
class _Program:
    name: str
    staged: StagedProgram
    required: set[str]
    items: list[tuple] = field(default_factory=list)
    writes: set[str] = field(default_factory=set)  # buffers bound to an out/inout param of some call
    gemms: dict[int, tuple[GemmPlan, int, int, int, bool]] = field(default_factory=dict)

    @property
    def steps(self) -> list[Step]:
        return self.staged.steps


def _merge_vars(values: Mapping[str, int] | None, kw: dict[str, int], what: str) -> dict[str, int]:
    """`run`'s and `capture`'s var values: the positional mapping and the keyword arguments together. Raises
    KernDriverError for a mapping that is not one, or a var given both ways."""
    if values is None:
        return kw
    if not isinstance(values, Mapping):
        raise KernDriverError(f"{what}: the second argument must be a mapping of var values, got "
                              f"{type(values).__name__} {values!r}", hint="e.g. rt.run(\"decode\", {\"tokens\": 1})")
    both = sorted(set(values) & set(kw))
    if both:
        raise KernDriverError(f"{what}: var `{both[0]}` given both in the mapping and as a keyword argument")
    return {**values, **kw}


class Runtime:
    """A manifest loaded on one GPU. Create it with `Runtime.load`; use it as a context
    manager or call `close()`. Not thread-safe: one thread drives one runtime."""

    # ---------------------------------------------------------------- load

    @classmethod
    def load(
        cls,
        manifest: Any,
        kernels_dir: str | os.PathLike[str] | None,
        weights: Any,
        *,
        device: int = 0,
        capacity_tokens: int = 4096,
        verify: bool = True,
        debug: bool = False,
        launch_mode: str = "packed",
        workspace_bytes: int = DEFAULT_WORKSPACE,
        max_graphs: int = 16,
        prime_graphs: bool = False,
    ) -> "Runtime":
        """Load `manifest` with the cubins in `kernels_dir` and `weights` onto GPU `device`.

        Args:
            manifest: a path, JSON bytes, or a `kern_schema.Manifest`.
            kernels_dir: where module `source` paths are resolved (None: the manifest's directory).
            weights: a safetensors file, a list of them, a directory of them, or None.
            device: CUDA device index.
            capacity_tokens: tokens every `bytes_per_token` state must hold.
            verify: run `kern_verify.verify` first and refuse on any error diagnostic (warnings are kept).
            debug: synchronize after every launch so an asynchronous fault names its launch.
            launch_mode: "packed" (one parameter buffer per launch via `extra`) or
                "params" (a `kernelParams` pointer array); both are prepared at load.
            workspace_bytes: cuBLASLt workspace (allocated only if a GEMM built-in is used).
            max_graphs: size of the graph cache of `run(..., graph=True)` (at least 1; least recently used evicted).
            prime_graphs: before this runtime's first capture of a program with `pdl` launches, capture that
                program once more, instantiate and upload it, and destroy it, never launched (see `_capture`).
                Measured through this option (H200, one runtime per process, NOTES.md 38): Qwen3-4B decode
                2.434 instead of 2.477 ms/token at 128 cached tokens (-1.7%), unchanged at 4,096; Qwen3-0.6B
                +1.3% at both; the 4B program with every op's first launch off PDL (argmax's reduce kept it) +2%.
                So off by default: the `pdl` gate is a heuristic, the effect covers the process (graphs
                captured later, other runtimes' too), and its mechanism (the driver's or the GPU's) is not known.

        Raises:
            KernDriverError: any load check fails (see the module docstring); no GPU; an argument of the
                wrong type or range (device, launch_mode, workspace_bytes, max_graphs, capacity_tokens),
                before anything is read.
        """
        if launch_mode not in LAUNCH_MODES:
            raise KernDriverError(f"launch_mode {launch_mode!r}: expected one of {LAUNCH_MODES}")
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise KernDriverError(f"max_graphs {max_graphs!r}: the graph cache must hold at least 1 graph (a graph "
                                  "captured by run(..., graph=True) is cached before it is replayed)",
                                  hint="pass max_graphs=1 or more, or run(..., graph=False) to launch eagerly")
        device = plain_int(device)
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise KernDriverError(f"device {device!r}: expected a CUDA device index, an int ≥ 0",
                                  hint="e.g. device=0 (for torch.device('cuda:1') pass its .index, 1)")
        if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, int) or workspace_bytes < 0:
            raise KernDriverError(f"workspace_bytes {workspace_bytes!r}: expected a byte count, an int ≥ 0",
                                  hint=f"the default is {DEFAULT_WORKSPACE} (32 MiB)")
        prep = prepare(manifest, kernels_dir, weights, capacity_tokens=capacity_tokens, verify=verify)
        rt = cls.__new__(cls)
        rt._init(prep, device, debug, launch_mode, workspace_bytes, max_graphs, prime_graphs)
        return rt

    def _init(self, prep: Prepared, device: int, debug: bool, launch_mode: str, workspace_bytes: int, max_graphs: int,
              prime_graphs: bool = False) -> None:
        t0 = time.perf_counter()
        self._closed = True  # until fully initialized: close() frees what exists
        self.manifest = prep.manifest
        self.prepared = prep
        self.debug = debug
        self.launch_mode = launch_mode
        self.max_graphs = max_graphs
        self.prime_graphs = prime_graphs
        self.primed: str | None = None  # the program whose throwaway graph was made (prime_graphs)
        self._modules: dict[str, Any] = {}
        self._arena = 0
        self._ws = 0
        self._cublas: CublasLt | None = None
        self._stage_in: dict[str, tuple[PinnedBuffer, Any]] = {}
        self._stage_out: dict[str, PinnedBuffer] = {}
        self._reads = AsyncReads()
        self._stage_mod: Any = None  # kern-driver's staging kernel (Runtime.stage), loaded on first use
        self._stage_fn: Any = None
        self._graphs: OrderedDict[tuple, Graph] = OrderedDict()
        self._programs: dict[str, _Program] = {}
        self._last_env: dict[str, int] = {}
        self._written: dict[str, dict[str, int]] = {}  # buffer -> the vars of the last run that wrote it
        self._dev = cuda.Device(device)
        self._closed = False
        try:
            self._load(prep, workspace_bytes)
        except BaseException:
            self.close()
            raise
        self.load_seconds = time.perf_counter() - t0

    def _load(self, prep: Prepared, workspace_bytes: int) -> None:
        m = self.manifest
        dev = self._dev
        self._stream = dev.stream
        self._stream_int = int(dev.stream)
        for name, img in prep.modules.items():
            self._modules[name] = cuda.module_load(img.data, f"modules.{name} ({img.path})")
        self.entries: dict[tuple[str, int], ResolvedEntry] = resolve_entries(m, _CudaModuleTable(self._modules))

        # static + dynamic shared memory above the default 48 KB needs an opt-in per function
        need: dict[Any, tuple[int, str]] = {}
        for (op, i), e in self.entries.items():
            smem = m.ops[op].impl.launches[i].shared_mem or 0
            key = int(e.handle)
            if smem > need.get(key, (-1, ""))[0]:
                need[key] = (smem, f"ops.{op}.impl.launches[{i}] (entry `{e.entry}`)")
        handles = {int(e.handle): e.handle for e in self.entries.values()}
        static = {key: check(drv.cuFuncGetAttribute(drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                                    handles[key]), "cuFuncGetAttribute(SHARED_SIZE_BYTES)", where)
                  for key, (_, where) in need.items()}
        for key, smem, where in shared_opt_ins(need, static, dev.max_shared_optin):
            check(drv.cuFuncSetAttribute(handles[key], drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                  f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {smem})", where,
                  hint=f"this device allows at most {dev.max_shared_optin} bytes of shared memory per block "
                  f"(dynamic + the kernel's {static[key]} bytes of static shared memory)")

        # a cluster of more than 8 CTAs (compiled in: __cluster_dims__) is non-portable; sm_90 runs up to 16 once
        # the function opts in (CUDA programming guide, "Thread Block Clusters"; cuFuncSetAttribute)
        first_use: dict[int, tuple[tuple[str, int], ResolvedEntry]] = {}
        for key, e in self.entries.items():
            first_use.setdefault(int(e.handle), (key, e))
        for (op, i), e in first_use.values():
            if e.cluster is not None and e.cluster[0] * e.cluster[1] * e.cluster[2] > 8:
                check(drv.cuFuncSetAttribute(e.handle, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                      f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 1) for a cluster of {list(e.cluster)} CTAs",
                      f"ops.{op}.impl.launches[{i}] (module `{e.module}`, entry `{e.entry}`)",
                      hint="this device does not run clusters of more than 8 CTAs: rebuild the kernel with a smaller "
                      "__cluster_dims__")

        # arena, zeroed (stale bytes are deterministic), then the weights
        p = prep.layout
        self._arena = cuda.mem_alloc(p.total_bytes, f"the arena ({p.total_bytes} bytes)")
        check(drv.cuMemsetD8Async(self._arena, 0, p.total_bytes, self._stream), "cuMemsetD8Async(arena)")
        dev.synchronize("zeroing the arena")
        self._regions = sorted(
            ((self._arena + r.offset, self._arena + r.offset + r.nbytes, r) for r in p.regions()), key=lambda t: t[0]
        )
        self._region_starts = [t[0] for t in self._regions]
        self.weight_bytes = 0
        for b in prep.bindings:
            t = b.tensor
            if t.nbytes == 0:
                continue
            mm = np.memmap(t.path, dtype=np.uint8, mode="r", offset=t.start, shape=(t.nbytes,))
            check(drv.cuMemcpyHtoD(self._arena + b.region.offset, mm.ctypes.data, t.nbytes),
                  f"cuMemcpyHtoD(weight `{b.buffer}`, {t.nbytes} bytes)", where=f"buffers.{b.buffer}")
            del mm
            self.weight_bytes += t.nbytes

        # pinned staging for inputs (writes) and outputs (reads)
        for name, r in p.buffers.items():
            if r.cls == "input":
                ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                self._stage_in[name] = (PinnedBuffer(r.nbytes, f"input `{name}`"), ev)
                check(drv.cuEventRecord(ev, self._stream), "cuEventRecord")
            elif r.cls == "output":
                self._stage_out[name] = PinnedBuffer(r.nbytes, f"output `{name}`")

        if any(l.extern is not None for op in m.ops.values() for l in op.impl.launches):
            self._ws = cuda.mem_alloc(workspace_bytes, "the cuBLASLt workspace")
            self._cublas = CublasLt(self._ws, workspace_bytes)

        for name in m.programs:
            steps = resolve_program(m, name, p, self._arena, self.entries)
            staged = StagedProgram(steps)
            staged.make_configs(self._stream)  # CUlaunchConfig of each pdl / carveout launch, once
            prog = _Program(name, staged, set(staged.vars), writes=written_buffers(m, name))
            self._programs[name] = prog
            self._build_items(prog)
            if self._cublas is not None and not any(s.var_names for s in steps if s.extern):
                self._plan_gemms(prog, {})

    def _build_items(self, prog: _Program) -> None:
        # items[i][0] is the kind: _KERNEL (cuLaunchKernel), _EX (cuLaunchKernelEx with the
        # step's prebuilt CUlaunchConfig: pdl and/or carveout) or _EXTERN (cuBLASLt); the last
        # field is the step index
        items: list[tuple] = []
        st = prog.staged
        for i, s in enumerate(st.steps):
            if s.extern is not None:
                items.append((_EXTERN, i, s.extern.endswith("_acc")))
                continue
            kp, ex = (0, st.extra_addr(i)) if self.launch_mode == "packed" else (st.kparams_addr(i), 0)
            if s.ex:
                items.append((_EX, st.configs[i], s.entry.handle, kp, ex, i))  # type: ignore[union-attr]
                continue
            bx, by, bz = s.block
            items.append((_KERNEL, s.entry.handle, bx, by, bz, s.shared_mem, kp, ex, i))  # type: ignore[union-attr]
        prog.items = items

    def set_launch_mode(self, mode: str) -> None:
        """Switch between "packed" (`extra` parameter buffer) and "params" (`kernelParams`)
        for eager runs (both are staged at load; graphs already captured are unaffected)."""
        if mode not in LAUNCH_MODES:
            raise KernDriverError(f"launch_mode {mode!r}: expected one of {LAUNCH_MODES}")
        self.launch_mode = mode
        for prog in self._programs.values():
            self._build_items(prog)

    # ---------------------------------------------------------------- helpers

    def _alive(self) -> None:
        if self._closed:
            raise KernDriverError("this Runtime is closed", hint="load the manifest again with Runtime.load(...)")

    def _program(self, name: str) -> _Program:
        self._alive()
        prog = self._programs.get(name)
        if prog is None:
            raise KernDriverError(f"unknown program `{name}`", hint=f"programs: {', '.join(self._programs) or '(none)'}")
        return prog

    def _region_at(self, addr: int) -> tuple[int, int, Region] | None:
        i = bisect.bisect_right(self._region_starts, addr) - 1
        if i >= 0 and addr < self._regions[i][1]:
            return self._regions[i]
        return None

    def _check_extent(self, addr: int, nbytes: int, what: str, where: str) -> None:
        reg = self._region_at(addr)
        if reg is None:
            raise KernDriverError(f"{what} points outside every buffer", where=where)
        start, end, r = reg
        if addr + nbytes > end:
            raise KernDriverError(
                f"{what} needs {nbytes} bytes from {r.kind} `{r.name}` + {addr - start}, past its end ({r.nbytes} bytes)",
                where=where, hint="check the GEMM's m, n, k arguments against the buffer shapes",
            )

    def _plan_gemms(self, prog: _Program, env: dict[str, int]) -> None:
        assert self._cublas is not None
        for i, s in enumerate(prog.steps):
            if s.extern is None:
                continue
            a, w, c, m_, n_, k_ = extern_values(s, env)
            where = s.where() + f" with m={m_}, n={n_}, k={k_}"
            self._check_extent(a, m_ * k_ * 2, f"A [m={m_}, k={k_}] bf16", where)
            self._check_extent(w, n_ * k_ * 2, f"W [n={n_}, k={k_}] bf16", where)
            self._check_extent(c, m_ * n_ * 2, f"C [m={m_}, n={n_}] bf16", where)
            gp = self._cublas.plan(m_, n_, k_, a, w, c, where)  # type: ignore[arg-type]
            prog.gemms[i] = (gp, a, w, c, s.extern.endswith("_acc"))  # type: ignore[arg-type]

    def _prepare(self, prog: _Program, env: dict[str, int]) -> None:
        """Refresh var-dependent parameters, grids and GEMM plans (host only).

        When the GEMM planning fails (an operand past its buffer, no cuBLASLt algorithm), the program's
        plans and staged values are dropped, so that a retry with the same values fails the same way
        instead of launching the plans of an earlier run's shapes."""
        if prog.staged.refresh(env) or (self._cublas is not None and len(prog.gemms) != sum(1 for s in prog.steps if s.extern)):
            if self._cublas is not None:
                try:
                    self._plan_gemms(prog, env)
                except BaseException:
                    prog.gemms.clear()
                    prog.staged.env = None
                    raise

    def _enqueue(self, prog: _Program, capturing: bool = False) -> None:
        launch = drv.cuLaunchKernel
        launch_ex = drv.cuLaunchKernelEx
        stream = self._stream
        grids = prog.staged.grids
        sync = self.debug and not capturing
        for it in prog.items:
            kind = it[0]
            if kind is _KERNEL:
                g = grids[it[8]]
                r = launch(it[1], g[0], g[1], g[2], it[2], it[3], it[4], it[5], stream, it[6], it[7])
                if r[0] != SUCCESS:
                    self._launch_failed(prog, it[8], r[0])
                if sync:
                    self._debug_sync(prog, it[8])
            elif kind is _EX:
                r = launch_ex(it[1], it[2], it[3], it[4])
                if r[0] != SUCCESS:
                    self._launch_failed(prog, it[5], r[0])
                if sync:
                    self._debug_sync(prog, it[5])
            else:
                i = it[1]
                gp, a, w, c, acc = prog.gemms[i]
                self._cublas.matmul(gp, a, w, c, acc, self._stream_int, prog.steps[i].where())  # type: ignore[union-attr]
                if sync:
                    self._debug_sync(prog, i)

    def _launch_failed(self, prog: _Program, i: int, err: Any) -> None:
        s = prog.steps[i]
        g = prog.staged.grids[i]
        raise_error(err, f"cuLaunchKernelEx ({s.attributes_text()})" if s.ex else "cuLaunchKernel",
                    where=f"{s.where()}, grid {list(g)}, block {list(s.block)}, shared_mem {s.shared_mem}, "
                    f"{prog.staged.sizes[i]} parameter bytes ({self.launch_mode} mode)")

    def _debug_sync(self, prog: _Program, i: int) -> None:
        r = drv.cuStreamSynchronize(self._stream)
        if r[0] != SUCCESS:
            raise_error(r[0], "kernel execution (debug=True synchronizes after each launch)", where=prog.steps[i].where(),
                        hint="this launch faulted; run it under compute-sanitizer to see the access")

    # ---------------------------------------------------------------- public API

    @property
    def plan(self) -> Plan:
        """The memory plan (kern-verify's `Plan`: buffers, scratch, states, bytes by class;
        `render()` prints it as `kern-verify --plan` does)."""
        return self.prepared.layout.plan

    @property
    def layout(self) -> Layout:
        """The plan as arena regions (offsets of buffers, scratch and states)."""
        return self.prepared.layout

    @property
    def programs(self) -> list[str]:
        return list(self._programs)

    def program_vars(self, program: str) -> set[str]:
        """The vars `run(program, ...)` requires."""
        return set(self._program(program).required)

    def run(self, program: str, values: Mapping[str, int] | None = None, /, *, graph: bool = False,
            **vars: int) -> None:
        """Enqueue `program` on the runtime's stream (asynchronous; `read_output` synchronizes).

        Args:
            program: a program name.
            graph: replay a CUDA graph captured once per (program, values of the vars its
                launches use) instead of launching eagerly (the first call for new values
                captures; the cache keeps `max_graphs` graphs). Other declared vars may be
                given (they shape `read_output`) and make no new graph.
            vars: the values of the vars the program uses, each within its bounds.
            values: the same as a mapping, for a var whose name cannot be a keyword argument of `run` (a var
                named `graph`, or one that is not a Python identifier: `rt.run("decode", {"graph": 2})`); a var
                given both ways is refused.

        Raises:
            KernDriverError: unknown program, missing/unknown var, value out of bounds, a var given twice,
                `graph` not a bool when the manifest declares a var named `graph` (`graph=2` meant the var),
                a failed launch (naming program, call label, launch index).
        """
        if not isinstance(graph, bool) and "graph" in self.manifest.vars:
            raise KernDriverError(
                f"run({program!r}): graph={graph!r} is run's graph flag (True or False), not the manifest's var `graph`",
                hint=f"pass the var in the mapping: rt.run({program!r}, {{'graph': {graph!r}}}, ...)")
        prog = self._program(program)
        env = check_vars(self.manifest, prog.required, _merge_vars(values, vars, f"run({program!r})"),
                         f"run({program!r})")
        if graph:
            key = self._graph_key(prog, env)
            g = self._graphs.get(key)
            if g is None:
                g = self._capture(prog, env)
            else:
                self._graphs.move_to_end(key)
            self._replay(g, env)
            return
        self._prepare(prog, env)
        self._enqueue(prog)
        self._ran(prog, env)

    @staticmethod
    def _graph_key(prog: _Program, env: dict[str, int]) -> tuple[str, tuple[tuple[str, int], ...]]:
        """The graph cache's key: the program and the values of the vars its launches use. A var the program does not
        use (given for `read_output`'s shapes, say) changes nothing in its graph, so it makes no new one."""
        return prog.name, tuple(sorted((k, v) for k, v in env.items() if k in prog.required))

    def _ran(self, prog: _Program, env: dict[str, int]) -> None:
        """Record an enqueued run: its vars shape `read_buffer`, and each buffer it writes is readable
        by `read_output` with these vars."""
        self._last_env = dict(env)
        for b in prog.writes:
            self._written[b] = self._last_env

    def capture(self, program: str, values: Mapping[str, int] | None = None, /, **vars: int) -> Graph:
        """Capture `program` for these var values into a CUDA graph (also cached for
        `run(..., graph=True)`). Replaying it with other values is refused. `values`: as `run`'s.

        Raises:
            KernDriverError: as `run`, or a capture/instantiation failure.
        """
        prog = self._program(program)
        env = check_vars(self.manifest, prog.required, _merge_vars(values, vars, f"capture({program!r})"),
                         f"capture({program!r})")
        return self._capture(prog, env)

    def _capture(self, prog: _Program, env: dict[str, int]) -> Graph:
        """Capture `prog` with `env` into a cached graph. With `prime_graphs`, the runtime's first capture of a
        program with `pdl` launches is preceded by a throwaway: the same capture, instantiated and uploaded, then
        destroyed before the kept one is captured (the order measured in NOTES.md 37)."""
        if self.prime_graphs and self.primed is None and prog.staged.pdl_steps:
            throwaway = self._instantiate(prog, env)
            try:
                self._dev.synchronize(f"uploading the prime_graphs throwaway of program `{prog.name}` with {env}")
            finally:
                throwaway.destroy()
            self.primed = prog.name
        graph = self._instantiate(prog, env)
        key = self._graph_key(prog, env)
        old = self._graphs.pop(key, None)
        if old is not None:
            old.destroy()
        self._graphs[key] = graph
        while len(self._graphs) > self.max_graphs:
            _, ev = self._graphs.popitem(last=False)
            try:
                self.synchronize()
            finally:
                ev.destroy()
        return graph

    def _instantiate(self, prog: _Program, env: dict[str, int]) -> Graph:
        """Stream-capture `prog` with `env`, instantiate and upload the graph (not cached)."""
        where = f"capturing program `{prog.name}` with {env}"
        self._prepare(prog, env)
        check(drv.cuStreamBeginCapture(self._stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture", where)
        try:
            self._enqueue(prog, capturing=True)
        except BaseException:
            r = drv.cuStreamEndCapture(self._stream)
            if r[0] == SUCCESS and r[1] is not None and int(r[1]):
                drv.cuGraphDestroy(r[1])
            raise
        g = check(drv.cuStreamEndCapture(self._stream), "cuStreamEndCapture", where)
        try:
            ex = check(drv.cuGraphInstantiate(g, 0), "cuGraphInstantiate", where)
        except BaseException:
            drv.cuGraphDestroy(g)
            raise
        try:
            check(drv.cuGraphUpload(ex, self._stream), "cuGraphUpload", where)
        except BaseException:
            drv.cuGraphExecDestroy(ex)
            drv.cuGraphDestroy(g)
            raise
        return Graph(self, prog.name, env, g, ex, len(prog.items))

    def _replay(self, g: Graph, env: dict[str, int] | None = None) -> None:
        """Launch `g`; `env` (default: the captured values) is what the run records for `read_output`'s shapes."""
        self._alive()
        r = drv.cuGraphLaunch(g._exec, self._stream)
        if r[0] != SUCCESS:
            raise_error(r[0], "cuGraphLaunch", where=f"graph of program `{g.program}` {g.vars}")
        self._ran(self._programs[g.program], g.vars if env is None else env)
        if self.debug:
            check(drv.cuStreamSynchronize(self._stream), "graph execution", f"graph of program `{g.program}` {g.vars}",
                  hint="replay the program eagerly with debug=True to find the faulting launch")

    def write_input(self, name: str, array: Any, *, prefix: bool = False) -> None:
        """Copy `array` into input buffer `name` through its pinned staging (asynchronous,
        ordered before the next run on the runtime's stream).

        Args:
            array: a numpy array of the buffer's dtype (bf16: np.uint16 raw bits; fp8: np.uint8)
                and of its full shape at the var maxima, or, with `prefix=True`, of the same
                shape except fewer rows along the first axis (the rest of the buffer keeps its
                previous bytes, which launches bounded by the vars never read).

        Raises:
            KernDriverError: unknown buffer, not an `input`, wrong dtype or shape.
        """
        r, data = self._input_bytes(name, array, prefix, "write_input")
        n = len(data)
        if n == 0:
            return
        stage, ev = self._stage_in[name]
        check(drv.cuEventSynchronize(ev), "cuEventSynchronize (previous staging copy)", f"write_input(`{name}`)")
        stage.array[:n] = np.frombuffer(data, np.uint8)
        check(drv.cuMemcpyHtoDAsync(self._arena + r.offset, stage.ptr, n, self._stream),
              f"cuMemcpyHtoDAsync({n} bytes)", f"write_input(`{name}`)")
        check(drv.cuEventRecord(ev, self._stream), "cuEventRecord", f"write_input(`{name}`)")

    def _input_bytes(self, name: str, array: Any, prefix: bool, what: str) -> tuple[Region, bytes]:
        """Input buffer `name`'s region and `array`'s bytes (C order), after write_input's checks (raises
        KernDriverError naming `what`: unknown buffer, not an input, wrong dtype or shape)."""
        self._alive()
        r = self.layout.buffers.get(name)
        if r is None:
            raise KernDriverError(f"{what}: unknown buffer `{name}`",
                                  hint=f"inputs: {', '.join(self._stage_in) or '(none)'}")
        if r.cls != "input":
            raise KernDriverError(f"{what}: buffer `{name}` is {a_class(r.cls)} buffer; only `input` buffers are "
                                  "written", hint=f"inputs: {', '.join(self._stage_in) or '(none)'}")
        arr = np.asarray(array)
        want = np.dtype(NUMPY_DTYPES[r.dtype])
        if arr.dtype != want:
            raise KernDriverError(
                f"{what}(`{name}`): array dtype {arr.dtype}, the buffer is {r.dtype} (numpy {want})",
                hint="convert explicitly (bf16 as raw np.uint16 bits); kern never casts silently",
            )
        full = r.shape
        if not (_fits_as_prefix(arr.shape, full) if prefix else arr.shape == full):
            raise KernDriverError(
                f"{what}(`{name}`): array shape {list(arr.shape)}, the buffer is {list(full)} at the var maxima"
                + (" (a prefix write may have fewer rows, the other dims equal)" if prefix else ""),
                hint=None if prefix else "pass prefix=True to write the first rows only",
            )
        return r, np.ascontiguousarray(arr).tobytes()

    def write_input_from(self, name: str, src: str) -> None:
        """Copy device buffer `src` into input buffer `name` on the runtime's stream (device to device,
        asynchronous, ordered after every run enqueued before it): a run's output becomes the next run's
        input with no host round trip — greedy decode's `next_token` fed back as `token_ids`. A prefix
        write: `src`'s whole allocation (its shape at the var maxima) goes to the start of `name`, whose
        other bytes keep their values, as `write_input(..., prefix=True)` does.

        Raises:
            KernDriverError: unknown buffer; `name` not an `input`; `src` not an `output` or `carry` (inputs
                and weights come from the host; a workspace is not kept between runs); dtypes differ; `src`
                has more rows than `name` or other trailing dims.
        """
        d, r = self._feed_regions(name, src, f"write_input_from(`{name}`, `{src}`)")
        if r.nbytes:
            check(drv.cuMemcpyDtoDAsync(self._arena + d.offset, self._arena + r.offset, r.nbytes, self._stream),
                  f"cuMemcpyDtoDAsync({r.nbytes} bytes)", f"write_input_from(`{name}`, `{src}`)")

    def _feed_regions(self, name: str, src: str, where: str) -> tuple[Region, Region]:
        """The regions of input `name` and of its source `src` after write_input_from's checks (raises
        KernDriverError at `where`)."""
        self._alive()
        d, r = self.layout.buffers.get(name), self.layout.buffers.get(src)
        inputs = ", ".join(self._stage_in) or "(none)"
        sources = ", ".join(n for n, b in self.layout.buffers.items() if b.cls in ("output", "carry")) or "(none)"
        if d is None or d.cls != "input":
            what = (f"unknown buffer `{name}`" if d is None else
                    f"`{name}` is {a_class(d.cls)} buffer; only `input` buffers are written")
            raise KernDriverError(f"{where}: {what}", hint=f"inputs: {inputs}")
        if r is None or r.cls not in ("output", "carry"):
            what = (f"unknown buffer `{src}`" if r is None else
                    f"`{src}` is {a_class(r.cls)} buffer; the source must be an `output` or a `carry` (what a run leaves "
                    "behind)")
            raise KernDriverError(f"{where}: {what}",
                                  hint=f"outputs and carries: {sources}; write inputs from the host with write_input")
        if d.dtype != r.dtype:
            raise KernDriverError(f"{where}: dtypes differ (`{src}` is {r.dtype}, `{name}` is {d.dtype})",
                                  hint="kern never casts; the two buffers must have one dtype")
        if not _fits_as_prefix(r.shape, d.shape):
            raise KernDriverError(f"{where}: `{src}` {list(r.shape)} does not fit `{name}` {list(d.shape)} as a "
                                  "prefix (same trailing dims, at most as many rows, at the var maxima)")
        return d, r

    def read_output_async(self, name: str) -> PendingRead:
        """Enqueue a copy of output `name` to the host and return at once, without synchronizing.

        The returned `PendingRead`'s `result()` waits for that copy only (an event recorded behind it),
        so the host can enqueue the next run first and collect this one's output while the GPU runs it.
        The shape is the buffer's with the vars of the last run that wrote it, as `read_output`'s. Each output gets
        up to `reads.SLOTS` (4) pinned host buffers of its full size (at the var maxima), allocated as
        reads need them; with every slot pending, a read first resolves the oldest (its value is kept).
        `close()` resolves every pending read.

        Raises:
            KernDriverError: unknown buffer, or not an `output`; no run since load has written it; a failed
                launch before the oldest read when that read must be resolved to free its slot; a failed
                pinned allocation or event.
        """
        r, env = self._output(name, "read_output_async")
        shape, dt, n = self._host_view(r, name, env=env)

        def copy(host_ptr: int) -> None:
            check(drv.cuMemcpyDtoHAsync(host_ptr, self._arena + r.offset, n, self._stream),
                  f"cuMemcpyDtoHAsync({n} bytes)", f"read_output_async(`{name}`)")

        return self._reads.enqueue(name, r.nbytes, n, shape, dt, copy, self._stream)

    def stage(self, *, writes: Mapping[str, Any] | None = None, feeds: Mapping[str, str] | None = None,
              reads: Sequence[str] = ()) -> dict[str, PendingRead]:
        """Enqueue one launch of kern-driver's staging kernel (`stage_kernel`) that does, on the runtime's stream and
        in its order, what `read_output_async`, `write_input_from` and `write_input(..., prefix=True)` would do as
        separate stream operations: between two runs of a decode program one launch instead of five copies
        (+4.9 µs instead of +19.5 µs per 4B step on the H200; BENCHMARKS.md "Session 25").

        Args:
            writes: {input name: array}: a prefix write of each (the dtype the buffer's, the shape a prefix along
                the first axis, as `write_input(name, array, prefix=True)`); the bytes travel as kernel
                parameters, 8 bytes per operation.
            feeds: {input name: output or carry name}: the source's whole allocation to the start of the input,
                device to device (as `write_input_from`).
            reads: output names read back into pinned host memory (as `read_output_async`); their values are
                those the runs enqueued before left, stored by the kernel itself.

        Returns:
            {name: PendingRead} for `reads` (empty without reads).

        Raises:
            KernDriverError: nothing to stage; a name given twice (a write and a feed of one input, a read listed
                twice); any check of the three methods above; more than `stage_kernel.MAX_OPS` operations in all
                (each feed and read is one, each write one per 8 bytes: write larger inputs with `write_input`);
                the kernel's PTX failing to load (the driver's JIT), or the launch failing.
        """
        self._alive()
        if isinstance(reads, str):
            raise KernDriverError(f"stage(reads={reads!r}): a sequence of output names, not one string",
                                  hint=f"pass reads=[{reads!r}]")
        writes, feeds, reads = dict(writes or {}), dict(feeds or {}), list(reads)
        if not (writes or feeds or reads):
            raise KernDriverError("stage(): nothing to stage", hint="pass writes=, feeds= and/or reads=")
        if dup := sorted(set(writes) & set(feeds)):
            raise KernDriverError(f"stage(): input(s) {', '.join(f'`{n}`' for n in dup)} both written and fed",
                                  hint="give each input one source")
        if len(set(reads)) != len(reads):
            raise KernDriverError(f"stage(): reads {reads} name an output more than once",
                                  hint="list each output once: one read returns its value to every user")
        ops: list[stage_kernel.StageOp] = []
        for name, array in writes.items():
            r, data = self._input_bytes(name, array, True, "stage(writes=...)")
            ops += stage_kernel.immediates(self._arena + r.offset, data)
        for name, src in feeds.items():
            d, r = self._feed_regions(name, src, f"stage(feeds={{`{name}`: `{src}`}})")
            if r.nbytes:
                ops.append(stage_kernel.StageOp(self._arena + d.offset, self._arena + r.offset, r.nbytes))
        views = {name: self._output(name, "stage(reads=...)") for name in reads}
        if len(ops) + len(reads) > stage_kernel.MAX_OPS:
            raise KernDriverError(
                f"stage(): {len(ops) + len(reads)} operations ({len(reads)} reads, {len(feeds)} feeds, the writes "
                f"8 bytes each), at most {stage_kernel.MAX_OPS} per launch",
                hint="write larger inputs with write_input before staging the rest")
        taken = []
        for name, (r, env) in views.items():
            shape, dt, n = self._host_view(r, name, env=env)
            slot = self._reads.take(name, r.nbytes)
            taken.append((name, slot, shape, dt, n))
            if n:
                ops.append(stage_kernel.StageOp(slot.buffer.device_ptr, self._arena + r.offset, n))
        if ops:
            self._launch_stage(ops)
        return {name: self._reads.commit(slot, name, n, shape, dt, self._stream) for name, slot, shape, dt, n in taken}

    def _launch_stage(self, ops: list["stage_kernel.StageOp"]) -> None:
        """Launch the staging kernel with `ops` on the runtime's stream (its module loaded on first use)."""
        if self._stage_fn is None:
            self._stage_mod = check(drv.cuModuleLoadData(stage_kernel.PTX.encode() + b"\0"),
                                    "cuModuleLoadData (kern-driver's staging kernel, PTX)", "Runtime.stage",
                                    hint="the driver's JIT compiles it for this GPU: it needs a driver for CUDA 13")
            self._stage_fn = check(drv.cuModuleGetFunction(self._stage_mod, stage_kernel.ENTRY.encode()),
                                   f"cuModuleGetFunction({stage_kernel.ENTRY!r})", "Runtime.stage")
        block = stage_kernel.pack(ops)
        params = np.array([block.ctypes.data], dtype=np.uint64)
        check(drv.cuLaunchKernel(self._stage_fn, 1, 1, 1, stage_kernel.THREADS, 1, 1, 0, self._stream,
                                 params.ctypes.data, 0), "cuLaunchKernel (staging kernel)", "Runtime.stage")
        if self.debug:
            check(drv.cuStreamSynchronize(self._stream), "staging kernel", "Runtime.stage")

    def _output(self, name: str, what: str) -> tuple[Region, dict[str, int]]:
        """Output buffer `name`'s region and the vars of the last run that wrote it, or a refusal naming
        what is wrong (unknown, not an output, not written by any run since load)."""
        self._alive()
        r = self.layout.buffers.get(name)
        outs = [n for n, b in self.layout.buffers.items() if b.cls == "output"]
        if r is None or r.cls != "output":
            bad = f"unknown buffer `{name}`" if r is None else f"buffer `{name}` is {a_class(r.cls)} buffer, not an output"
            raise KernDriverError(f"{what}: {bad}", hint=f"outputs: {', '.join(outs) or '(none)'}; read_buffer reads any buffer")
        env = self._written.get(name)
        if env is None:
            writers = [p for p, prog in self._programs.items() if name in prog.writes]
            raise KernDriverError(
                f"{what}: output `{name}` has not been written: no run since load of a program that writes it "
                f"({', '.join(f'`{p}`' for p in writers) or 'none does'})",
                hint="run the program first (rt.run(...)); read_buffer reads a buffer whatever it holds")
        return r, env

    def _shape_now(self, r: Region, name: str, env: dict[str, int] | None = None) -> tuple[int, ...]:
        decl = self.manifest.buffers[name].shape
        env = self._last_env if env is None else env
        return tuple(env.get(d, self.manifest.vars[d].max) if isinstance(d, str) else int(d) for d in decl)

    def _host_view(self, r: Region, name: str, full: bool = False, env: dict[str, int] | None = None
                   ) -> tuple[tuple[int, ...], np.dtype, int]:
        """(shape, numpy dtype, bytes) of buffer `name` as a read copies it back: the vars of `env`, by default
        those of the last `run` (`full`: the allocation at the var maxima)."""
        shape = r.shape if full else self._shape_now(r, name, env)
        dt = np.dtype(NUMPY_DTYPES[r.dtype])
        return shape, dt, int(np.prod(shape, dtype=np.int64)) * dt.itemsize

    def read_buffer(self, name: str, *, full: bool = False) -> np.ndarray:
        """Synchronize and copy buffer `name` back (any class: for debugging and op-by-op
        comparison), whatever it holds (zeros before any run writes it). The shape is the declared one
        with each var at its value in the last `run` (the maximum when the last run did not set it, or
        with `full=True`).

        Returns a new numpy array (bf16 as np.uint16 bits, fp8 as np.uint8).

        Raises:
            KernDriverError: unknown buffer; a failed earlier launch (reported by the sync).
        """
        self._alive()
        r = self.layout.buffers.get(name)
        if r is None:
            raise KernDriverError(f"unknown buffer `{name}`", hint=f"buffers: {', '.join(self.layout.buffers)}")
        return self._read(r, name, *self._host_view(r, name, full))

    def _read(self, r: Region, name: str, shape: tuple[int, ...], dt: np.dtype, n: int) -> np.ndarray:
        out = np.empty(shape, dtype=dt)
        if n:
            stage = self._stage_out.get(name)
            dst = stage.ptr if stage is not None else out.ctypes.data
            check(drv.cuMemcpyDtoHAsync(dst, self._arena + r.offset, n, self._stream),
                  f"cuMemcpyDtoHAsync({n} bytes)", f"read_buffer(`{name}`)")
            self._dev.synchronize(f"reading buffer `{name}`")
            if stage is not None:
                out.reshape(-1).view(np.uint8)[:] = stage.array[:n]
        return out

    def read_output(self, name: str) -> np.ndarray:
        """Synchronize and copy output `name` back. The shape is the declared one with each var at its
        value in the last run that wrote the output (a later run of a program that does not write it
        changes nothing), e.g. `[tokens, vocab]` logits of the last decode.

        Returns a new numpy array (bf16 as np.uint16 bits, fp8 as np.uint8).

        Raises:
            KernDriverError: unknown buffer or not an `output`; no run since load has written it (its bytes
                would be the arena's zeros); a failed earlier launch (reported by the sync).
        """
        r, env = self._output(name, "read_output")
        return self._read(r, name, *self._host_view(r, name, env=env))

    def read_state(self, name: str) -> np.ndarray:
        """Synchronize and copy state `name` back as raw bytes (np.uint8)."""
        self._alive()
        r = self.layout.states.get(name)
        if r is None:
            raise KernDriverError(f"unknown state `{name}`", hint=f"states: {', '.join(self.layout.states) or '(none)'}")
        out = np.empty(r.nbytes, dtype=np.uint8)
        if r.nbytes:
            check(drv.cuMemcpyDtoHAsync(out.ctypes.data, self._arena + r.offset, r.nbytes, self._stream),
                  "cuMemcpyDtoHAsync", f"read_state(`{name}`)")
            self._dev.synchronize(f"reading state `{name}`")
        return out

    def synchronize(self) -> None:
        """Wait for everything enqueued on the runtime's stream.

        Raises:
            KernDriverError: an earlier asynchronous launch failed.
        """
        self._alive()
        self._dev.synchronize()

    def address(self, name: str) -> int:
        """Device address of buffer or state `name` (interop: e.g. wrap it in a torch tensor)."""
        self._alive()
        r = self.layout.buffers.get(name) or self.layout.states.get(name)
        if r is None:
            raise KernDriverError(f"unknown buffer or state `{name}`")
        return self._arena + r.offset

    @property
    def stream(self) -> int:
        """The runtime's CUDA stream handle, as an int (for interop)."""
        return self._stream_int

    @property
    def graphs(self) -> list[Graph]:
        """The graphs in the cache, oldest first."""
        return list(self._graphs.values())

    def describe(self) -> str:
        """Start-up summary: device, vars, states, buffer bytes by class, each op's launches
        and what each resolved to, weights bound, programs, graphs captured."""
        m = self.manifest
        p = self.layout
        prep = self.prepared
        mib = lambda n: f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} B"  # noqa: E731
        L = [f"kern runtime: model `{m.model}` on device {self._dev.index} ({self._dev.name}, sm_{self._dev.cc[0]}{self._dev.cc[1]})"
             + (", closed" if self._closed else "")]
        L.append("vars: " + (", ".join(f"{n} [{v.min}, {v.max}]" for n, v in m.vars.items()) or "(none)"))
        for n, s in m.states.items():
            unit = f"{s.bytes_per_token:,} B/token × {p.capacity_tokens} tokens" if s.bytes_per_token is not None \
                else f"{s.bytes_per_seq:,} B/seq × {m.vars['seqs'].max} seqs"
            L.append(f"state {n}: {unit} = {mib(p.states[n].nbytes)}")
        counts: dict[str, int] = {}
        for r in p.buffers.values():
            counts[r.cls] = counts.get(r.cls, 0) + 1
        L.append("memory (at the var maxima): " + ", ".join(
            f"{cls} {mib(b)}" + (f" ({counts[cls]} buffers)" if cls in counts else "") for cls, b in p.bytes_by_class().items())
            + f"; arena {mib(p.total_bytes)}" + (f"; cuBLASLt workspace {mib(self._cublas.workspace_bytes)}" if self._cublas else ""))
        L.append("modules:")
        for n, img in prep.modules.items():
            L.append(f"  {n}: {img.path} sha256 {img.sha256[:16]}… " + ("(pinned, verified)" if img.pinned else "(not pinned)"))
        L.append("ops:")
        for on, op in m.ops.items():
            L.append(f"  {on} ({len(op.impl.launches)} launch(es))")
            for i, l in enumerate(op.impl.launches):
                if l.extern is not None:
                    L.append(f"    [{i}] {l.extern}: cuBLASLt built-in")
                    continue
                e = self.entries[(on, i)]
                lay = " ".join(f"{s.offset}:{s.size}" for s in e.layout)
                L.append(f"    [{i}] {e.entry} in module `{e.module}` ({Path(prep.modules[e.module].path).name}); "
                         f"params {e.param_bytes} B [{lay}]; block {list(l.block or [1, 1, 1])}"
                         + (f"; shared {l.shared_mem} B" if l.shared_mem else "")
                         + (f"; carveout {l.carveout}% (preferred shared memory per SM)" if l.carveout is not None else "")
                         + ("; PDL (programmatic dependent launch)" if l.pdl else ""))
        L.append(f"weights: {len(prep.bindings)} tensors bound, {mib(self.weight_bytes)} from "
                 + (", ".join(Path(f).name for f in prep.weight_files) or "(no file)"))
        for pn, prog in self._programs.items():
            nk = sum(1 for s in prog.steps if s.extern is None)
            npdl = len(prog.staged.pdl_steps)
            ncarve = sum(1 for s in prog.steps if s.extern is None and s.carveout is not None)
            L.append(f"program {pn}: {len(m.programs[pn].calls)} calls, {len(prog.steps)} launches "
                     f"({nk} kernels" + (f", {npdl} of them with PDL" if npdl else "")
                     + (f", {ncarve} with a carveout" if ncarve else "")
                     + f", {len(prog.steps) - nk} cuBLASLt); vars: {', '.join(sorted(prog.required)) or '(none)'}")
        for w in prep.warnings:
            L.append(f"verifier warning: {w}")
        L.append(f"launch mode: {self.launch_mode}" + ("; debug: sync after each launch" if self.debug else ""))
        if self._graphs:
            for g in self._graphs.values():
                L.append(f"graph: {g.program} {g.vars}: {g.launches} launches → 1 cuGraphLaunch ({g.nodes} nodes"
                         + (f", {g.programmatic_edges} programmatic edges" if g.programmatic_edges else "") + ")")
        else:
            L.append("graphs: none captured yet")
        if self.prime_graphs:
            L.append("prime_graphs: " + (f"a throwaway of `{self.primed}` was captured and destroyed first"
                                          if self.primed else "no program with pdl launches captured yet"))
        return "\n".join(L)

    def close(self) -> None:
        """Free everything (graphs, cuBLASLt, staging, arena, modules, stream, context), after waiting for the
        stream and resolving every pending `read_output_async` (their values stay readable). Idempotent."""
        if getattr(self, "_dev", None) is None or getattr(self, "_freed", False):
            return  # a second close must not touch the destroyed stream or the released context
        try:
            drv.cuCtxSetCurrent(self._dev.ctx)
            drv.cuStreamSynchronize(self._dev.stream)
        except Exception:  # pragma: no cover
            pass
        for g in self._graphs.values():
            g.destroy()
        self._graphs.clear()
        if self._cublas is not None:
            self._cublas.close()
            self._cublas = None
        for stage, ev in self._stage_in.values():
            stage.free()
            drv.cuEventDestroy(ev)
        self._stage_in.clear()
        for stage in self._stage_out.values():
            stage.free()
        self._stage_out.clear()
        self._reads.close()
        for ptr in (self._arena, self._ws):
            if ptr:
                cuda.mem_free(ptr)
        self._arena = self._ws = 0
        for h in self._modules.values():
            drv.cuModuleUnload(h)
        self._modules.clear()
        if self._stage_mod is not None:
            drv.cuModuleUnload(self._stage_mod)
            self._stage_mod = self._stage_fn = None
        self._dev.release()
        self._closed = self._freed = True

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<kern Runtime model={self.manifest.model!r} programs={list(self._programs)}{' closed' if self._closed else ''}>"
