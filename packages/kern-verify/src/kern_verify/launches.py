"""Rules on ops: each launch (DESIGN §3 group 5) and the impl against its interface
(group 6).

Launch: module known (E0030), well-formed (E0031), block (E0032), grid (E0033),
shared memory (E0034), shared-memory carveout (E0095), argument count (E0035) and each
argument against its launch param (E0036–E0040, E0053), extern name and signature (E0039).
Impl: no write through an `in` param (E0037), `out` params written (E0041) and not
read before (E0046), every interface param used (E0042), scratch fits (E0043), is
written before read (E0044) and used (E0045); over-wide directions warn (E0047); an impl has a launch (E0048).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kern_schema import DTYPES, Arg, Launch, Op, ParamType, Path, variables

from .args import check_scalar_arg
from .context import Context, arg_kind, parse_type, suggest
from .decls import check_tensor
from .diagnostic import Fold
from .externs import EXTERNS

MAX_SHARED = 232448
GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)
CARVEOUT_MAX = 100  # percent of the device's maximum shared memory per SM
_KERNEL_FIELDS = ("module", "entry", "params", "block", "grid")


@dataclass
class _Flow:
    """Interface and scratch accesses of an impl, in launch order."""

    used_params: set[int] = field(default_factory=set)
    read_params: set[int] = field(default_factory=set)
    written_params: set[int] = field(default_factory=set)
    used_scratch: set[str] = field(default_factory=set)
    written_scratch: set[str] = field(default_factory=set)
    # accesses of the current launch: (kind "param"/"scratch", key, reads, writes, path)
    pending: list[tuple[str, object, bool, bool, Path]] = field(default_factory=list)
    # E0046 candidates (param index, path, message, hint): reported only for params some launch writes
    out_reads: list[tuple[int, Path, str, str]] = field(default_factory=list)
    # a launch whose params are unknown (unknown extern, malformed types): its accesses are
    # unknown, so the "never written" / "read before written" conclusions are withheld
    incomplete: bool = False
    # a launch names an undeclared scratch (E0043): which scratch it meant is unknown, so no
    # scratch is reported as read before written
    unknown_scratch: bool = False


def check_ops(ctx: Context) -> None:
    """Run groups 5 and 6 on every op."""
    for name, op in ctx.m.ops.items():
        _op(ctx, name, op)


def _op(ctx: Context, oname: str, op: Op) -> None:
    base: Path = ("ops", oname)
    iface = ctx.iface[oname]
    impl = op.impl
    for sname, sc in impl.scratch.items():
        check_tensor(ctx, base + ("impl", "scratch", sname), f"op `{oname}` scratch `{sname}`", sc.dtype, sc.shape)
    if not impl.launches:
        ctx.r.add("E0048", base + ("impl", "launches"), f"op `{oname}` has no launches: a call of it would do nothing",
                  "give its impl the kernel launches (or the built-in) that compute it, or remove the op")
        return  # its params and scratch are unused as a consequence: E0042 / E0045 would only repeat it
    flow = _Flow()
    for li, launch in enumerate(impl.launches):
        _launch(ctx, oname, op, iface, li, launch, flow)
        # a kernel reads its inputs before (or while) it writes: reads first, then writes
        for kind, key, reads, _, path in flow.pending:
            if not reads:
                continue
            if kind == "scratch" and key not in flow.written_scratch and not flow.incomplete and not flow.unknown_scratch:
                ctx.r.add("E0044", path, f"op `{oname}` launch {li} reads scratch `{key}` before any launch wrote it",
                          "scratch starts uninitialised: write it in an earlier launch (check the launch order and the "
                          "directions of the launch params)")
                flow.written_scratch.add(key)  # reported once: later reads follow from the same mistake
            if kind == "param":
                ip = iface[key]  # type: ignore[index]
                if ip is not None and ip.direction == "out" and key not in flow.written_params and not flow.incomplete:
                    flow.out_reads.append((key, path,  # type: ignore[arg-type]
                                           f"op `{oname}` launch {li} reads interface param {key} (`{ip}`) before any launch wrote it",
                                           f"an `out` argument's content is undefined on entry: declare interface param {key} `inout {_rest(ip)}`"))
                flow.read_params.add(key)  # type: ignore[arg-type]
        for kind, key, _, writes, _ in flow.pending:
            if writes:
                (flow.written_scratch if kind == "scratch" else flow.written_params).add(key)  # type: ignore[arg-type]
        flow.pending.clear()
    for key, path, msg, hint in flow.out_reads:
        if key in flow.written_params:  # never written at all: E0041 says it better
            ctx.r.add("E0046", path, msg, hint)
    for i, ip in enumerate(iface):
        ppath = base + ("params", i)
        if i not in flow.used_params:
            ctx.r.add("E0042", ppath, f"op `{oname}`: interface param {i} (`{op.params[i]}`) is passed to no launch",
                      f"forward it with {{\"param\": {i}}} or remove it from the interface")
            continue
        if ip is None or not ip.is_pointer or flow.incomplete:
            continue
        if ip.direction == "out" and i not in flow.written_params:
            ctx.r.add("E0041", ppath, f"op `{oname}`: interface param {i} (`{ip}`) is written by no launch",
                      f"pass it to a kernel param declared `out` or `inout`, or declare it `in {_rest(ip)}`")
        elif ip.direction == "inout":
            if i not in flow.written_params:
                ctx.r.add("E0047", ppath, f"op `{oname}`: interface param {i} (`{ip}`) is never written by a launch",
                          f"declare it `in {_rest(ip)}`")
            elif i not in flow.read_params:
                ctx.r.add("E0047", ppath, f"op `{oname}`: interface param {i} (`{ip}`) is never read by a launch",
                          f"declare it `out {_rest(ip)}`")
    for sname in impl.scratch:
        if sname not in flow.used_scratch:
            ctx.r.add("E0045", base + ("impl", "scratch", sname), f"op `{oname}`: scratch `{sname}` is passed to no launch",
                      "remove it from impl.scratch")


def _rest(pt: ParamType) -> str:
    return f"buffer<{pt.dtype}>" if pt.kind == "buffer" else "ptr"


def _launch(ctx: Context, oname: str, op: Op, iface: list[ParamType | None], li: int, launch: Launch, flow: _Flow) -> None:
    r = ctx.r
    lpath: Path = ("ops", oname, "impl", "launches", li)
    params: list[ParamType | None] | None
    if launch.extern is not None:
        what = f"op `{oname}` launch {li} (extern `{launch.extern}`)"
        for f in _KERNEL_FIELDS + ("shared_mem", "carveout"):
            if getattr(launch, f) is not None:
                r.add("E0031", lpath + (f,), f"{what}: an extern launch takes no `{f}`",
                      "an extern launch has only `extern` and `args`")
        ext = EXTERNS.get(launch.extern)
        if ext is None:
            r.add("E0039", lpath + ("extern",), f"{what}: unknown extern `{launch.extern}`",
                  suggest(launch.extern, EXTERNS, "known: " + ", ".join(EXTERNS)))
            params = None
        else:
            params = [parse_type(t) for t in ext.params]
            if len(launch.args) != len(params):
                r.add("E0035", lpath + ("args",),
                      f"{what}: {len(launch.args)} args, the built-in takes {len(params)}",
                      f"signature: {ext.signature()}")
    else:
        what = f"op `{oname}` launch {li}" + (f" (`{launch.entry}`)" if launch.entry else "")
        missing = [f for f in _KERNEL_FIELDS if getattr(launch, f) is None]
        if missing:
            r.add("E0031", lpath, f"{what}: a kernel launch needs " + ", ".join(f"`{f}`" for f in missing),
                  "a kernel launch has module, entry, params, block, grid and args (or use `extern`)")
        if launch.module is not None:
            if launch.module in ctx.m.modules:
                ctx.used_modules.add(launch.module)
            else:
                r.add("E0030", lpath + ("module",), f"{what}: module `{launch.module}` is not declared",
                      suggest(launch.module, ctx.m.modules, "declare it in `modules`"))
        if launch.block is not None:
            _block(ctx, lpath + ("block",), launch.block, what)
        if launch.grid is not None:
            _grid(ctx, lpath + ("grid",), launch.grid, what)
        if launch.shared_mem is not None and not 0 <= launch.shared_mem <= MAX_SHARED:
            r.add("E0034", lpath + ("shared_mem",), f"{what}: shared_mem {launch.shared_mem} bytes is outside 0..{MAX_SHARED}",
                  "sm_90 allows at most 227 KiB (232448 bytes) of shared memory per block")
        if launch.carveout is not None and not 0 <= launch.carveout <= CARVEOUT_MAX:
            r.add("E0095", lpath + ("carveout",), f"{what}: carveout {launch.carveout} is outside 0..{CARVEOUT_MAX}",
                  "the carveout is a percent of the maximum shared memory per SM: 0 (the most L1) … 100 (the most "
                  "shared memory); omit it for the driver's choice")
        params = [parse_type(t) for t in launch.params] if launch.params is not None else None
        if params is not None and len(launch.args) != len(params):
            r.add("E0035", lpath + ("args",), f"{what}: {len(launch.args)} args for {len(params)} declared params",
                  "one arg per param, in order (Triton kernels: include the two hidden trailing pointers, "
                  'passed as {"i64": 0})')
    if params is None or None in params:
        flow.incomplete = True
    for ai, arg in enumerate(launch.args):
        pt = params[ai] if params is not None and ai < len(params) else None
        _launch_arg(ctx, oname, op, iface, arg, lpath + ("args", ai), pt, f"{what} arg {ai}", flow)


def _block(ctx: Context, path: Path, block: list[int], what: str) -> None:
    if len(block) != 3:
        ctx.r.add("E0032", path, f"{what}: block has {len(block)} dims", "a block is [x, y, z]")
        return
    for i, (b, hi) in enumerate(zip(block, BLOCK_MAX)):
        if not 1 <= b <= hi:
            ctx.r.add("E0032", path + (i,), f"{what}: block.{'xyz'[i]} = {b} is outside 1..{hi}",
                      "CUDA blocks: x, y ≤ 1024, z ≤ 64, x·y·z ≤ 1024")
    if all(1 <= b <= hi for b, hi in zip(block, BLOCK_MAX)) and block[0] * block[1] * block[2] > 1024:
        ctx.r.add("E0032", path, f"{what}: block {block} has {block[0] * block[1] * block[2]} threads, more than 1024",
                  "CUDA blocks have at most 1024 threads")


def _grid(ctx: Context, path: Path, grid: list, what: str) -> None:
    if len(grid) != 3:
        ctx.r.add("E0033", path, f"{what}: grid has {len(grid)} dims", "a grid is [x, y, z], three expressions")
    for i, e in enumerate(grid[:3]):
        b = ctx.expr_bounds(e, path + (i,), f"`{path[1]}` launch {path[4]} grid.{'xyz'[i]}")
        if b is None:
            continue
        lo, hi = b
        # grids driven by the same vars out of range share a cause (a var's min 0, its max too large): folded
        vs = tuple(sorted(set(variables(e))))
        site = f"`{path[1]}` launch {path[4]}"
        if lo < 1:
            ctx.r.add("E0033", path + (i,), f"{what}: grid.{'xyz'[i]} is {lo} at the var minima",
                      "a grid dimension must be at least 1 for every allowed var value (raise the var's min, or use ceil_div)",
                      fold=Fold(("min", vs), f"launches whose grid, computed from {_names(vs)}, is < 1 at the var minima", site) if vs else None)
        if hi > GRID_MAX[i]:
            ctx.r.add("E0033", path + (i,), f"{what}: grid.{'xyz'[i]} reaches {hi} at the var maxima, over the CUDA limit {GRID_MAX[i]}",
                      "lower the var maxima or launch more work per block",
                      fold=Fold(("max", i, vs), f"launches whose grid.{'xyz'[i]}, computed from {_names(vs)}, is over the CUDA limit at the var maxima",
                                site) if vs else None)


def _names(vs: tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in vs)


def _launch_arg(ctx: Context, oname: str, op: Op, iface: list[ParamType | None], arg: Arg, path: Path,
                pt: ParamType | None, what: str, flow: _Flow) -> None:
    r = ctx.r
    kind = arg_kind(arg)
    if kind == "param":
        i = arg.param
        assert i is not None
        if not 0 <= i < len(iface):
            r.add("E0038", path + ("param",), f"{what}: interface param {i} does not exist (op `{oname}` has {len(iface)})",
                  f"valid indices are 0..{len(iface) - 1}" if iface else "the op declares no params")
            return
        flow.used_params.add(i)
        ip = iface[i]
        if ip is None or pt is None:
            return
        if pt.kind == "scalar":
            if ip.kind != "scalar":
                r.add("E0036", path, f"{what}: interface param {i} is `{ip}` but the launch param is `{pt}`",
                      "a scalar launch param takes a scalar interface param, an expr or a literal")
            elif ip.scalar.is_float != pt.scalar.is_float or not pt.scalar.contains(ip.scalar.lo, ip.scalar.hi):  # type: ignore[union-attr]
                r.add("E0053", path, f"{what}: interface param {i} is `{ip}`, whose range does not fit the launch param `{pt}`",
                      f"declare interface param {i} as `{pt}` (or a narrower type)")
            return
        if ip.kind == "scalar":
            r.add("E0036", path, f"{what}: interface param {i} is the scalar `{ip}` but the launch param is `{pt}`",
                  "a pointer launch param takes a buffer/ptr interface param, scratch, or {\"i64\": 0}")
            return
        if pt.kind == "buffer":
            if ip.kind == "ptr":
                r.add("E0036", path, f"{what}: interface param {i} is `{ip}` (state memory) but the launch param is `{pt}`",
                      "a state ptr can only go to a `ptr` launch param")
                return
            if ip.dtype != pt.dtype:
                r.add("E0036", path, f"{what}: interface param {i} is `{ip}` but the launch param is `{pt}`: dtypes differ",
                      f"make both buffer<{pt.dtype}> or both buffer<{ip.dtype}>")
                return
        if pt.writes and ip.direction == "in":
            r.add("E0037", path, f"{what}: the kernel writes interface param {i}, declared `{ip}`",
                  f"declared `{ip}` but the kernel writes it: make the interface param `out` or `inout`")
            ctx.unsound_ops.add(oname)
        flow.pending.append(("param", i, pt.reads, pt.writes, path))
        return
    if kind == "scratch":
        name = arg.scratch
        sc = op.impl.scratch.get(name)  # type: ignore[arg-type]
        if sc is None:
            r.add("E0043", path + ("scratch",), f"{what}: scratch `{name}` is not declared in op `{oname}`",
                  suggest(name, op.impl.scratch, "declare it in impl.scratch"))  # type: ignore[arg-type]
            flow.unknown_scratch = True
            return
        flow.used_scratch.add(name)  # type: ignore[arg-type]
        off = arg.offset or 0
        esize = DTYPES.get(sc.dtype)
        if esize is not None:
            nb = ctx.nbytes_at_max(sc.dtype, sc.shape)
            opath = path + ("offset",)
            if off < 0 or off % esize:
                r.add("E0043", opath, f"{what}: offset {off} into scratch `{name}` ({sc.dtype}) is not a non-negative multiple of {esize}",
                      f"use a multiple of the element size ({esize} bytes)")
            elif nb is not None and off >= nb:
                r.add("E0043", opath, f"{what}: offset {off} is outside scratch `{name}` ({nb} bytes at the var maxima)",
                      "enlarge the scratch shape or lower the offset")
        if pt is None:
            return
        if pt.kind == "scalar":
            r.add("E0036", path, f"{what}: scratch passed to the scalar param `{pt}`", "scratch goes to a buffer or ptr param")
            return
        if pt.kind == "buffer" and sc.dtype != pt.dtype and sc.dtype in DTYPES:
            r.add("E0043", path, f"{what}: scratch `{name}` is {sc.dtype} but the launch param is `{pt}`",
                  f"declare the scratch dtype {pt.dtype}, or the param buffer<{sc.dtype}>")
            return
        flow.pending.append(("scratch", name, pt.reads, pt.writes, path))
        return
    if kind in ("buf", "state", "var"):
        hint = ('in a launch a var is written {"expr": "%s"}' % arg.var) if kind == "var" else \
            "launches get memory from the interface ({\"param\": i}) or from scratch; the call passes buffers and states"
        r.add("E0040", path, f"{what}: a `{kind}` argument is not allowed in a launch", hint)
        return
    if pt is None:
        if kind == "expr":
            ctx.expr_bounds(arg.expr, path + ("expr",), what)  # type: ignore[arg-type]
        return
    if pt.kind == "scalar":
        check_scalar_arg(ctx, arg, path, pt, what)
        return
    if kind == "expr":
        ctx.expr_bounds(arg.expr, path + ("expr",), what)  # type: ignore[arg-type]
    if pt.kind == "ptr" and kind in ("i64", "u64") and arg.literal == 0:
        return  # a null pointer, e.g. Triton's hidden global/profile scratch
    r.add("E0036", path, f"{what}: a `{kind}` argument passed to the pointer param `{pt}`",
          'a pointer param takes {"param": i} or {"scratch": name}; an unused ptr param takes {"i64": 0}')
