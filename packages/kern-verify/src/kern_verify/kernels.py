"""Static cubin checks (`--kernels DIR`), no GPU: each module file exists (E0080), its
sha256 matches (E0081), it is a cubin (E0082); each launch's entry is in its module
(E0083), its declared params match the cubin's `.nv.info` table (E0084), and its block
respects the kernel's launch bounds / required block (E0085); a cubin for another SM
version warns (E0087); a `pdl` launch whose entry has no `griddepcontrol.wait` in its
code warns (E0088); a literal grid axis that is not a multiple of the kernel's compiled
thread-block cluster is an error (E0089), a cluster of more than 8 CTAs warns (E0092),
one of more than 16 is an error (E0093); dynamic plus the kernel's static shared memory over
sm_90's 227 KiB per block is an error (E0094).
`hf:` modules absent from DIR are skipped with a warning (E0086)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path as FsPath

from kern_schema import ExprError, ParamTypeError, Path, evaluate, to_text, variables

from .context import Context
from .cubin import Cubin, CubinError, layout_problems, params_from_manifest, read_cubin
from .launches import BLOCK_MAX, MAX_SHARED


#: The SM version the runtime targets (NVIDIA H200).
TARGET_ARCH = 90


def module_file(kernels_dir: str | os.PathLike[str], source: str) -> FsPath:
    """Where a module's file lives under the kernels directory: `source` itself, or for
    `hf:org/repo/path` the path inside the repo."""
    if source.startswith("hf:"):
        source = "/".join(source[3:].split("/")[2:])
    return FsPath(kernels_dir) / source


def check_kernels(ctx: Context, kernels_dir: str | os.PathLike[str]) -> dict[str, Cubin]:
    """Check every module file and every kernel launch against its cubin; returns the
    parsed cubins by module name."""
    cubins: dict[str, Cubin] = {}
    for name, mod in ctx.m.modules.items():
        if name in ctx.bad_sources:
            continue  # E0017: never open a path the manifest may not name
        c = _module(ctx, kernels_dir, name, mod.source, mod.sha256)
        if c is not None:
            cubins[name] = c
    for oname, op in ctx.m.ops.items():
        for li, launch in enumerate(op.impl.launches):
            if launch.extern is not None or launch.module not in cubins or launch.entry is None:
                continue
            lpath: Path = ("ops", oname, "impl", "launches", li)
            what = f"op `{oname}` launch {li} (`{launch.entry}`)"
            info = cubins[launch.module].entries.get(launch.entry)
            if info is None:
                others = sorted(m for m, c in cubins.items() if launch.entry in c.entries)
                entries = sorted(cubins[launch.module].entries)
                hint = (f"module(s) {', '.join(f'`{o}`' for o in others)} define it: set \"module\" accordingly" if others
                        else "the module's entries: " + (", ".join(entries[:8]) + (" ..." if len(entries) > 8 else "") if entries else "none"))
                ctx.r.add("E0083", lpath + ("entry",), f"{what}: module `{launch.module}` has no kernel entry `{launch.entry}`", hint)
                continue
            if launch.params is not None:
                try:
                    declared = params_from_manifest(launch.params)
                except ParamTypeError:
                    declared = None  # reported as E0020
                if declared is not None:
                    n_decl, n_act = len(declared), len(info.params)
                    triton = n_act == n_decl + 2 and all(s.size == 8 for s in info.params[-2:])
                    problems = layout_problems(declared, info.params)
                    if problems and problems[0][0] is None and len(problems) > 1:
                        # a param missing or extra: the positions after it differ as a consequence; one
                        # diagnostic, saying where the lists first part
                        first_idx, first = problems[1]
                        first = first.replace(f"param {first_idx}:", f"param {first_idx} (`{launch.params[first_idx]}`):", 1)
                        problems = [(None, f"{problems[0][1]}; they first differ at {first}")]
                    for idx, msg in problems:
                        if idx is None and triton:
                            msg += " (Triton kernels carry two hidden trailing 8-byte params, global and profile scratch: declare them `in ptr` and pass {\"i64\": 0})"
                        p = lpath + ("params",) if idx is None else lpath + ("params", idx)
                        if idx is not None:
                            msg = msg.replace(f"param {idx}:", f"param {idx} (`{launch.params[idx]}`):", 1)
                        ctx.r.add("E0084", p, f"{what}: {msg}",
                                  "declare the kernel's real parameter list: the cubin's table is "
                                  + ", ".join(f"{s.size}B@{s.offset}" for s in info.params))
            _block(ctx, lpath, launch.block, info, what)
            _cluster(ctx, lpath, launch.grid, info, what)
            _shared(ctx, lpath, launch.shared_mem, info, what)
            if launch.pdl and info.grid_dep_wait is False:
                ctx.r.add("E0088", lpath + ("pdl",),
                          f"{what}: `pdl` launch, but the entry's code has no griddepcontrol.wait (SASS ACQBULK)",
                          "the kernel would read its inputs while the previous kernel may still write them: execute "
                          "`asm volatile(\"griddepcontrol.wait;\" ::: \"memory\")` before the first dependent read, "
                          "or remove `pdl`")
    return cubins


def _module(ctx: Context, kernels_dir, name: str, source: str, sha: str | None) -> Cubin | None:
    path = ("modules", name)
    file = module_file(kernels_dir, source)
    try:
        data = file.read_bytes()
    except OSError as e:
        if source.startswith("hf:"):
            ctx.r.add("E0086", path + ("source",), f"module `{name}`: `{source}` is not under {kernels_dir} ({file}); not checked",
                      "download it there to check its hash and parameter tables offline")
        else:
            ctx.r.add("E0080", path + ("source",), f"module `{name}`: cannot read {file}: {e.strerror or e}",
                      f"build the cubin into {kernels_dir}, or fix `source`")
        return None
    actual = hashlib.sha256(data).hexdigest()
    if sha is not None and len(sha) == 64 and actual != sha.lower():
        ctx.r.add("E0081", path + ("sha256",), f"module `{name}`: {file} has sha256 {actual}, the manifest says {sha}",
                  "the cubin changed: regenerate the manifest, or restore the file it was generated from")
    try:
        cubin = read_cubin(data, str(file))
    except CubinError as e:
        ctx.r.add("E0082", path + ("source",), f"module `{name}`: {e}", "modules are sm_90 cubins (nvcc -cubin -arch=sm_90)")
        return None
    if cubin.arch is not None and cubin.arch != TARGET_ARCH:
        ctx.r.add("E0087", path + ("source",), f"module `{name}`: {file} is built for sm_{cubin.arch}, not sm_{TARGET_ARCH}",
                  f"rebuild it with -arch=sm_{TARGET_ARCH}")
    return cubin


def _block(ctx: Context, lpath: Path, block, info, what: str) -> None:
    if block is None or len(block) != 3 or not all(1 <= b <= hi for b, hi in zip(block, BLOCK_MAX)) \
            or block[0] * block[1] * block[2] > 1024:
        return  # outside CUDA's limits: E0032 says so, whatever the kernel allows
    threads = block[0] * block[1] * block[2]
    if info.required_block is not None and tuple(block) != tuple(info.required_block):
        ctx.r.add("E0085", lpath + ("block",), f"{what}: block {list(block)}, but the kernel requires {list(info.required_block)}",
                  f"set \"block\": {list(info.required_block)} (Triton: num_warps × 32 threads)")
    elif info.max_threads is not None:
        mx = info.max_threads[0] * info.max_threads[1] * info.max_threads[2]
        if threads > mx:
            ctx.r.add("E0085", lpath + ("block",), f"{what}: block {list(block)} has {threads} threads, the kernel's launch bounds allow {mx}",
                      f"use at most {mx} threads per block")


#: Shared memory sm_90 reserves per block for the system (CUDA C++ Programming Guide, compute capability 9.0: 1 KB;
#: cudaDevAttrReservedSharedMemoryPerBlock). nvcc's sm_90 cubins count it in `.nv.shared.<entry>` (an entry with 8 KB
#: of __shared__ arrays has a 9,216-byte section; ptxas -v and CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES say 8,192), while
#: the per-block maximum (232,448 bytes) excludes it.
RESERVED_SHARED = 1024


def _shared(ctx: Context, lpath: Path, shared_mem, info, what: str) -> None:
    """E0094: the launch's dynamic shared memory plus the kernel's own static shared memory (its `.nv.shared.<entry>`
    section less the reserved 1 KB it includes; never below 0, so a toolchain that leaves the reserved area out is
    checked up to 1 KB leniently) above sm_90's per-block maximum (a dynamic size above it alone is E0034)."""
    dyn = shared_mem or 0
    static = max(0, info.static_shared_bytes - RESERVED_SHARED)
    if static and 0 <= dyn <= MAX_SHARED < dyn + static:
        ctx.r.add("E0094", lpath + ("shared_mem",),
                  f"{what}: shared_mem {dyn} bytes plus the kernel's {static} bytes of static shared memory is "
                  f"{dyn + static} bytes, over sm_90's {MAX_SHARED} per block",
                  f"give the launch at most {MAX_SHARED - static} bytes of dynamic shared memory, or shrink the "
                  "kernel's static arrays")


#: The largest thread-block cluster sm_90 schedules (16 CTAs, with the non-portable opt-in; 8 without).
MAX_CLUSTER = 16


def _cluster(ctx: Context, lpath: Path, grid, info, what: str) -> None:
    if info.cluster is None:
        return
    size = info.cluster[0] * info.cluster[1] * info.cluster[2]
    if size > MAX_CLUSTER:
        ctx.r.add("E0093", lpath + ("entry",),
                  f"{what}: the kernel is compiled for a cluster of {list(info.cluster)} = {size} CTAs; sm_90 runs at "
                  f"most {MAX_CLUSTER}", "rebuild it with a smaller __cluster_dims__ (at most 8 to stay portable)")
    elif size > 8:
        ctx.r.add("E0092", lpath + ("entry",),
                  f"{what}: the kernel is compiled for a cluster of {list(info.cluster)} = {size} CTAs (more than "
                  "the portable 8)", "it runs on sm_90 only if the GPU can co-schedule that many CTAs in one GPC; "
                  "the runtime opts the function in at load")
    if grid is None or len(grid) != 3:
        return
    for axis, (g, c) in enumerate(zip(grid, info.cluster)):
        if c <= 1 or next(variables(g), None) is not None:
            continue  # an axis computed from vars: the runtime checks it before each launch
        try:
            v = evaluate(g, {})
        except ExprError:
            continue  # reported by the grid rules
        if v >= 1 and v % c:
            shown = "" if isinstance(g, int) else f" ({to_text(g)})"
            ctx.r.add("E0089", lpath + ("grid", axis),
                      f"{what}: grid {'xyz'[axis]} = {v}{shown} is not a multiple of the kernel's cluster "
                      f"{list(info.cluster)} (compiled with __cluster_dims__); CUDA refuses the launch",
                      f"make grid {'xyz'[axis]} a multiple of {c}, e.g. {-(-v // c) * c}")
