"""Parameter staging: a program's kernel parameters packed once, refreshed per var change.

Pure Python + numpy, no GPU. For each kernel launch of a program the
parameters are laid out at the offsets of the kernel's own parameter table
(from `cuFuncGetParamInfo`), little-endian, each scalar at its type's width
(`i8`/`u8` 1 byte ... `i64`/`u64`/`f64` 8 bytes; `f32` as IEEE 754 single),
pointers as 8-byte device addresses. All launches of a program share one
persistent numpy byte array (`params`), so the host addresses handed to
`cuLaunchKernel` stay valid for the runtime's lifetime.

Two ways to pass them are prepared (CUDA driver API, `cuLaunchKernel`):

- "packed": `extra = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE,
  &size, CU_LAUNCH_PARAM_END}` with `size` the exact end of the last parameter
  (no tail padding: the driver checks it against the kernel's parameter size);
- "params": `kernelParams`, an array of N pointers, the i-th pointing at parameter i
  inside the same packed buffer.

Only the slots whose value depends on vars (`{"var": ...}` and `{"expr": ...}`
arguments with a var) and the grids are recomputed by `refresh`, and only when
the var values differ from the previous refresh.

Launches with launch attributes — `"pdl": true` (programmatic dependent launch) or a
`"carveout"` (preferred shared-memory carveout) — go through `cuLaunchKernelEx`, whose
launch configuration (`CUlaunchConfig`: grid, block, shared memory, stream and one
`CUlaunchAttribute` per feature: `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`
= 1, `CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT` = the percent) is built once
per launch by `make_configs` and only has its grid rewritten by `refresh` when the
grid depends on vars. The parameters are the same packed buffer / pointer array
as for `cuLaunchKernel`.
"""

from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from kern_schema import ExprError, ScalarType, evaluate, to_text, variables

from .errors import KernDriverError
from .resolve import Const, Dyn, Ptr, Step

#: `cuLaunchKernel` `extra` keys (cuda.h: CU_LAUNCH_PARAM_END 0x00, _BUFFER_POINTER 0x01, _BUFFER_SIZE 0x02).
CU_LAUNCH_PARAM_END = 0
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2

#: CUDA grid limits (CUDA C Programming Guide, compute capability table: x ≤ 2^31-1, y, z ≤ 65535).
GRID_MAX = (2**31 - 1, 65535, 65535)

_INT_FMT = {1: ("<b", "<B"), 2: ("<h", "<H"), 4: ("<i", "<I"), 8: ("<q", "<Q")}
_PARAM_ALIGN = 16


def scalar_struct(t: ScalarType) -> struct.Struct:
    """The `struct` format of a scalar type: little-endian, at its width."""
    if t.is_float:
        return struct.Struct("<f" if t.size == 4 else "<d")
    return struct.Struct(_INT_FMT[t.size][t.lo == 0])


def pack_scalar(buf: Any, offset: int, t: ScalarType, value: int | float, where: str) -> None:
    """Write `value` as type `t` at `buf[offset:]` (little-endian).

    Integers must be integral and within the type's range; a finite float must be within the
    type's range (`f32` is rounded to the nearest IEEE single); inf and NaN pass as they are.

    Raises:
        KernDriverError: the value does not fit the type (the message names both).
    """
    if t.is_float:
        if isinstance(value, bool):
            raise KernDriverError(f"a boolean for a `{t.name}` parameter", where=where)
        try:
            if not isinstance(value, numbers.Real):
                raise TypeError
            v = float(value)
        except (OverflowError, TypeError):
            raise KernDriverError(f"value {value!r:.60} does not fit `{t.name}`", where=where) from None
        if math.isfinite(v) and not t.lo <= v <= t.hi:
            raise KernDriverError(f"value {value!r} overflows `{t.name}`", where=where)
        scalar_struct(t).pack_into(buf, offset, v)
        return
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise KernDriverError(f"value {value!r} for an integer `{t.name}` parameter", where=where)
    if not t.lo <= value <= t.hi:
        raise KernDriverError(
            f"value {value} does not fit `{t.name}` [{t.lo}, {t.hi}]", where=where,
            hint="the verifier checks this at the var bounds; a value here means the bounds were bypassed",
        )
    scalar_struct(t).pack_into(buf, offset, value)


@dataclass(slots=True)
class DynSlot:
    """A var-dependent parameter: `step` index, absolute byte `offset` in the program's
    params array, its `scalar` type, the `expr` to evaluate, and `where` for errors."""

    step: int
    offset: int
    scalar: ScalarType
    expr: Any
    where: str


class StagedProgram:
    """Every kernel launch of one program with its parameters packed.

    Attributes:
        steps: the program's steps (kernel launches and built-ins, in order).
        params: the packed parameter bytes of all kernel launches (uint8, persistent).
        offsets: per step, the start of its parameters in `params` (-1 for built-ins).
        sizes: per step, the exact parameter size in bytes (`size_t` array, addressed
            by the packed mode's `extra`).
        kparams: per step, the kernelParams pointer array (uint64, persistent).
        extra: per step, the 5-word `extra` array of the packed mode (uint64, persistent).
        dyn: the var-dependent slots; `dyn_grid`: steps whose grid depends on vars.
        vars: every var the program depends on.
    """

    def __init__(self, steps: list[Step]):
        self.steps = steps
        n = len(steps)
        self.offsets = [-1] * n
        total = 0
        for i, s in enumerate(steps):
            if s.extern is None:
                self.offsets[i] = total
                total += -(-max(s.entry.param_bytes, 1) // _PARAM_ALIGN) * _PARAM_ALIGN  # type: ignore[union-attr]
        self.params = np.zeros(max(total, _PARAM_ALIGN), dtype=np.uint8)
        self.sizes = np.zeros(max(n, 1), dtype=np.uint64)
        self.extra = np.zeros((max(n, 1), 5), dtype=np.uint64)
        nparams = sum(len(s.types) for s in steps if s.extern is None)
        self.kparams = np.zeros(max(nparams, 1), dtype=np.uint64)
        self._kp_start = [0] * n
        self.dyn: list[DynSlot] = []
        self.dyn_grid: list[int] = []
        self.vars: set[str] = set()
        self.grids: list[tuple[int, int, int]] = [(1, 1, 1)] * n
        pbase = self.params.ctypes.data
        sbase = self.sizes.ctypes.data
        kp = 0
        for i, s in enumerate(steps):
            self.vars |= s.var_names
            if s.extern is not None:
                continue
            entry = s.entry
            assert entry is not None
            off = self.offsets[i]
            self._kp_start[i] = kp
            for a, (arg, t, slot) in enumerate(zip(s.args, s.types, entry.layout)):
                where = f"{s.where()}, param {a} (`{t}` at offset {slot.offset})"
                self.kparams[kp] = pbase + off + slot.offset
                kp += 1
                if isinstance(arg, Ptr):
                    struct.pack_into("<Q", self.params, off + slot.offset, arg.addr)
                elif isinstance(arg, Const):
                    pack_scalar(self.params, off + slot.offset, t.scalar, arg.value, where)  # type: ignore[arg-type]
                else:
                    self.dyn.append(DynSlot(i, off + slot.offset, t.scalar, arg.expr, where))  # type: ignore[arg-type]
            self.sizes[i] = entry.param_bytes
            self.extra[i] = (
                CU_LAUNCH_PARAM_BUFFER_POINTER, pbase + off,
                CU_LAUNCH_PARAM_BUFFER_SIZE, sbase + 8 * i,
                CU_LAUNCH_PARAM_END,
            )
            if any(True for g in s.grid for _ in variables(g)):
                self.dyn_grid.append(i)
            else:
                self.grids[i] = self._grid(s, {})
        self.env: dict[str, int] | None = None
        #: step index -> CUlaunchConfig of each `cuLaunchKernelEx` launch (`ex_steps`, filled by `make_configs`).
        self.configs: dict[int, Any] = {}

    @property
    def pdl_steps(self) -> list[int]:
        """Indices of the kernel launches with programmatic dependent launch."""
        return [i for i, s in enumerate(self.steps) if s.extern is None and s.pdl]

    @property
    def ex_steps(self) -> list[int]:
        """Indices of the kernel launches that go through `cuLaunchKernelEx`: those with
        programmatic dependent launch or a shared-memory carveout (`Step.ex`)."""
        return [i for i, s in enumerate(self.steps) if s.ex]

    def make_configs(self, stream: Any) -> dict[int, Any]:
        """Build the `CUlaunchConfig` of every `cuLaunchKernelEx` launch (`ex_steps`) for
        `stream` (once, at load; `refresh` keeps var-dependent grids current). Needs
        cuda.bindings, not a GPU.

        Raises:
            KernDriverError: as `launch_config`."""
        self.configs = {i: launch_config(self.steps[i], self.grids[i], stream) for i in self.ex_steps}
        return self.configs

    def param_bytes(self, i: int) -> bytes:
        """The packed parameters of step `i` (exact size)."""
        off = self.offsets[i]
        return bytes(self.params[off : off + int(self.sizes[i])])

    def kparams_addr(self, i: int) -> int:
        """Host address of step `i`'s kernelParams array (0 for a kernel without parameters)."""
        if not self.steps[i].types:
            return 0
        return self.kparams.ctypes.data + 8 * self._kp_start[i]

    def extra_addr(self, i: int) -> int:
        """Host address of step `i`'s `extra` array (0 for a kernel without parameters)."""
        if not self.steps[i].types:
            return 0
        return self.extra.ctypes.data + 40 * i

    @staticmethod
    def _grid(s: Step, env: dict[str, int]) -> tuple[int, int, int]:
        try:
            g = tuple(evaluate(e, env) for e in s.grid)
        except ExprError as err:
            raise KernDriverError(f"grid: {err}", where=s.where()) from None
        def axis_text(axis: int, v: int) -> str:  # "grid x = 12 (ceil_div(n, 4) with {'n': 48})", "grid y = 3"
            e = s.grid[axis]
            if isinstance(e, int):
                return f"grid {'xyz'[axis]} = {v}"
            return f"grid {'xyz'[axis]} = {v} ({to_text(e)}" + (f" with {env})" if env else ")")

        for axis, (v, hi) in enumerate(zip(g, GRID_MAX)):
            if not 1 <= v <= hi:
                raise KernDriverError(
                    f"{axis_text(axis, v)} is outside [1, {hi}]",
                    where=s.where(),
                    hint="a zero grid would launch nothing and CUDA refuses it; check the var values and the grid expression",
                )
        cluster = s.entry.cluster if s.entry is not None else None
        if cluster is not None:
            for axis, (v, c) in enumerate(zip(g, cluster)):
                if v % c:
                    fixed = next(variables(s.grid[axis]), None) is None
                    raise KernDriverError(
                        f"{axis_text(axis, v)} is not a multiple of the kernel's thread-block cluster {list(cluster)} "
                        f"(compiled with __cluster_dims__)",
                        where=s.where(),
                        hint=(f"CUDA refuses such a launch; make it a multiple of {c} (kern-verify reports this as E0089)"
                              if fixed else
                              f"CUDA refuses such a launch; make the grid expression a multiple of {c} for every var "
                              f"value (e.g. `mul` by {c} of a ceil_div), or build the kernel without a cluster"),
                    )
        return g  # type: ignore[return-value]

    def refresh(self, env: dict[str, int]) -> bool:
        """Re-evaluate the var-dependent slots and grids for `env` (var name → value).

        Returns False (and does nothing) when `env` equals the previous successful refresh's
        values for every var the program uses.

        Raises:
            KernDriverError: a value does not fit its parameter type, or a grid is out of range.
                The slots already re-packed are then left half-updated, so the next refresh
                re-packs everything whatever its values (none is skipped as "unchanged").
        """
        key = {k: env[k] for k in self.vars if k in env}
        if key == self.env:
            return False
        self.env = None  # until every slot and grid is consistent with `key`
        for d in self.dyn:
            try:
                v = evaluate(d.expr, env)
            except ExprError as err:
                raise KernDriverError(f"expression {to_text(d.expr)}: {err}", where=d.where) from None
            pack_scalar(self.params, d.offset, d.scalar, v, d.where)
        for i in self.dyn_grid:
            g = self.grids[i] = self._grid(self.steps[i], env)
            cfg = self.configs.get(i)
            if cfg is not None:
                cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
        self.env = key
        return True


#: The range of a launch's `carveout` (percent of the device's maximum shared memory per SM).
CARVEOUT_MAX = 100


def launch_config(step: Step, grid: tuple[int, int, int], stream: Any) -> Any:
    """The `CUlaunchConfig` of a `cuLaunchKernelEx` launch of `step` on `stream`: its grid,
    block, dynamic shared memory and stream, and one `CUlaunchAttribute` per feature, in
    this order:

    - `step.pdl`: `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` with
      `programmaticStreamSerializationAllowed = 1`: the launch may begin before the
      previous work on the stream completes; the kernel orders its dependent reads with
      `griddepcontrol.wait`. Under stream capture the dependency becomes a programmatic
      edge of the graph (CUDA ≥ 12.3).
    - `step.carveout` (not None): `CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT` with
      `sharedMemCarveout` = the percent (0..100) of the device's maximum shared memory per
      SM; a hint the CUDA driver rounds to a supported configuration, raised where a block
      needs more.

    A step with neither gets a config without attributes (`make_configs` builds none for it).
    The bindings copy the attribute array on assignment, so the config owns it.

    Raises:
        KernDriverError: cuda-bindings is not importable, or the carveout is outside 0..100
            (kern-verify refuses it first, E0095).
    """
    if step.carveout is not None and not 0 <= step.carveout <= CARVEOUT_MAX:
        raise KernDriverError(f"carveout {step.carveout} is outside 0..{CARVEOUT_MAX}", where=step.where(),
                              hint="percent of the maximum shared memory per SM: 0 (the most L1) … 100 (the most shared "
                                   "memory); omit it for the driver's choice (kern-verify E0095)")
    try:
        from cuda.bindings import driver as drv
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise KernDriverError(f"cuda-bindings is not importable ({e})", where=step.where()) from None
    attrs = []
    if step.pdl:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if step.carveout is not None:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        attr.value.sharedMemCarveout = step.carveout
        attrs.append(attr)
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = step.block
    cfg.sharedMemBytes = step.shared_mem
    cfg.hStream = stream
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    return cfg


def extern_values(step: Step, env: dict[str, int]) -> list[int | float]:
    """The arguments of a built-in step: addresses for pointers, evaluated scalars.

    Raises:
        KernDriverError: an expression cannot be evaluated.
    """
    out: list[int | float] = []
    for a in step.args:
        if isinstance(a, Ptr):
            out.append(a.addr)
        elif isinstance(a, Const):
            out.append(a.value)
        else:
            try:
                out.append(evaluate(a.expr, env))
            except ExprError as err:
                raise KernDriverError(f"expression {to_text(a.expr)}: {err}", where=step.where()) from None
    return out

