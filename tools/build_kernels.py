#!/usr/bin/env python3
"""Build every Qwen3 provider kernel for sm_90 into a kernels directory + index.json.

    python tools/build_kernels.py --out DIR [--geometry 4b|0.6b|...|path/to/config.json ...] [-j N] [--no-pdl]
                                  [--fused-attention] [--l2-prefetch]

No GPU needed.  CUDA C sources are compiled with ``nvcc -cubin -arch=sm_90``;
Triton kernels (pinned triton==3.6.0) ahead of time with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``.  What to
build (instances, ABI, grid, docs) lives in ``kernels-src/catalog.py``; the
index format is described in ``kernels-src/README.md``.

Reproducible: the same sources and toolchain give byte-identical cubins and
index.json.  Triton's cache and home are private temp dirs, line info is off (so
no source paths land in the cubins), and the index carries no path or time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SRC = Path(__file__).resolve().parent / "kernels-src"
sys.path.insert(0, str(SRC))

from catalog import CUDA_FLAGS, TRITON_HIDDEN, Kernel, instances  # noqa: E402
from geometries import load_geometry  # noqa: E402

TARGET = "sm_90"
DEFAULT_GEOMETRIES = ["0.6b", "4b"]
#: Common nvcc flags; each source adds its own from catalog.CUDA_FLAGS.
NVCC_FLAGS = ["-cubin", "-arch=sm_90", "-O3", "-std=c++17"]

_TRITON_TYPES = {"bf16": "*bf16", "f16": "*fp16", "f32": "*fp32", "i32": "*i32", "i64": "*i64",
                 "u64": "*u64", "u8": "*u8"}
_SCALAR_TRITON = {"i32": "i32", "i64": "i64", "f32": "fp32", "u32": "u32", "u64": "u64"}
_BUF = re.compile(r"^(in|out|inout) buffer<(\w+)>$")
_PTR = re.compile(r"^(in|out|inout) ptr$")


def _triton_type(p) -> str:
    if m := _BUF.match(p.type):
        return _TRITON_TYPES[m.group(2)]
    if _PTR.match(p.type):
        return _TRITON_TYPES[p.elem or "u8"]
    return _SCALAR_TRITON[p.type]


def _nvcc() -> str:
    for c in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and Path(c).exists():
            return c
    raise SystemExit("nvcc not found (set NVCC=...)")


def _private_env(tmp: str) -> None:
    """Keep Triton's cache/dumps out of $HOME and paths out of the binaries."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton-cache")
    os.environ["TRITON_HOME"] = tmp
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.pop("TRITON_KERNEL_OVERRIDE", None)


def _load_fn(source: str, entry: str):
    import importlib.util

    modname = "kern_kernels_src_" + Path(source).stem
    mod = sys.modules.get(modname)
    if mod is None:
        spec = importlib.util.spec_from_file_location(modname, SRC / source)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
    return getattr(mod, entry)


def compile_triton(k: Kernel, tmp: str) -> tuple[bytes, str, int]:
    """Compile one Triton instance; returns (cubin, entry symbol, dynamic shared bytes)."""
    cc = triton_compiled(k, tmp)
    md = cc.metadata
    if md.global_scratch_size or md.profile_scratch_size:
        raise AssertionError(f"{k.name}: needs Triton global/profile scratch; the ABI passes 0")
    return cc.asm["cubin"], md.name, int(md.shared)


def triton_compiled(k: Kernel, tmp: str):
    """Triton's compiled kernel of one instance (`.asm["cubin"]`, `.asm["ptx"]`, `.metadata`)."""
    _private_env(tmp)
    import triton
    from triton.backends.compiler import GPUTarget

    assert triton.__version__ == "3.6.0", f"triton {triton.__version__}: the kernels are pinned to 3.6.0"
    fn = _load_fn(k.source, k.entry)
    names = list(fn.arg_names)
    constexprs = dict(k.constexprs)
    if "PDL" in names and "PDL" not in constexprs:
        # A kernel with a PDL form (kernels-src/attention.py): an instance that does not ask for
        # it compiles with PDL = False, whose code is that of the kernel without the parameter.
        constexprs["PDL"] = False
    declared = [p.name for p in k.params] + list(constexprs)
    if sorted(names) != sorted(declared) or names[: len(k.params)] != [p.name for p in k.params]:
        raise AssertionError(f"{k.name}: catalog params {declared} != kernel args {names}")
    signature = {p.name: _triton_type(p) for p in k.params}
    signature.update({c: "constexpr" for c in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(k.params) if p.div16}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": k.num_warps, "num_stages": k.num_stages})


def cuda_ptx(k: Kernel) -> str:
    """The PTX of a CUDA C instance's module (same flags and defines as its cubin), for inspection."""
    with tempfile.TemporaryDirectory(prefix="kern-ptx-") as tmp:
        out = Path(tmp) / "m.ptx"
        cmd = [_nvcc(), *[f for f in NVCC_FLAGS if f != "-cubin"], "-ptx", *CUDA_FLAGS[k.source],
               *(f"-D{d}" for d in k.defines), "-o", str(out), k.source]
        subprocess.run(cmd, cwd=SRC, check=True)
        return out.read_text()


def start_cuda(source: str, tmp: str, defines: tuple[str, ...] = (), module: str | None = None
               ) -> tuple[subprocess.Popen, Path]:
    """Start nvcc on one CUDA C source (it runs while Triton compiles); `finish_cuda` collects it.
    `defines`: -D macros of this module (e.g. KERN_PDL); `module`: its cubin file name."""
    out = Path(tmp) / (module or Path(source).stem + ".cubin")
    if source not in CUDA_FLAGS:
        raise AssertionError(f"{source}: no nvcc flags in catalog.CUDA_FLAGS")
    # Compile from inside the source dir with a relative name: no absolute path can leak.
    cmd = [_nvcc(), *NVCC_FLAGS, *CUDA_FLAGS[source], *(f"-D{d}" for d in defines), "-o", str(out), source]
    return subprocess.Popen(cmd, cwd=SRC), out


def finish_cuda(job: tuple[subprocess.Popen, Path]) -> bytes:
    proc, out = job
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return out.read_bytes()


def compile_cuda(source: str, tmp: str) -> bytes:
    return finish_cuda(start_cuda(source, tmp))


def _triton_job(args):
    k, tmp = args
    return k.name, compile_triton(k, tmp)


def build(out_dir: Path, geometry_specs: list[str], jobs: int | None = None, quiet: bool = False,
          *, pdl: bool = True, fused_attention: bool = False, l2_prefetch: bool = False) -> dict:
    """Build the instances of `geometry_specs` into `out_dir`. `pdl` (default True, as the CLI's
    --pdl; False = --no-pdl): also the PDL instances (`NAME_pdl`, catalog `_pdl_kernels`); `fused_attention`: also the opt-in one-launch
    decode attention (`paged_decode_attention_fused`, and `_pdl` with `pdl`); `l2_prefetch`: also the
    opt-in L2-prefetch GEMV forms (`kern_gemv*_m1_pf`, module `gemv_pf.cubin`, catalog
    `_gemv_pf_kernels`); every other entry and cubin is the same."""
    geoms = [load_geometry(s) for s in geometry_specs]
    kernels = instances(geoms, pdl=pdl, fused_attention=fused_attention, l2_prefetch=l2_prefetch)
    out_dir.mkdir(parents=True, exist_ok=True)
    index: dict = {"format": 1, "target": TARGET, "kernels": {}}
    with tempfile.TemporaryDirectory(prefix="kern-build-") as tmp:
        _private_env(tmp)
        modules: dict[str, bytes] = {}
        built: dict[str, tuple[str, str, int]] = {}  # NAME -> (module file, entry, shared)
        cuda_modules: dict[str, tuple[str, tuple[str, ...]]] = {}  # module file -> (source, defines)
        for k in kernels:
            if k.lang == "cuda":
                if cuda_modules.setdefault(k.module, (k.source, k.defines)) != (k.source, k.defines):
                    raise AssertionError(f"{k.name}: module {k.module} built from two different (source, defines)")
                built[k.name] = (k.module, k.entry, k.shared_mem)
        nvcc = {mod: start_cuda(src, tmp, defines, mod) for mod, (src, defines) in sorted(cuda_modules.items())}
        tri = [k for k in kernels if k.lang == "triton"]
        jobs = jobs or min(len(tri), os.cpu_count() or 1) or 1
        try:
            if jobs > 1:
                import multiprocessing as mp

                with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
                    results = list(ex.map(_triton_job, [(k, tmp) for k in tri]))
            else:
                results = [_triton_job((k, tmp)) for k in tri]
        finally:
            for proc, _ in nvcc.values():  # never leave nvcc writing into a deleted temp dir
                proc.wait()
        for mod, job in nvcc.items():
            modules[mod] = finish_cuda(job)
        by_name = {k.name: k for k in tri}
        for name, (cubin, entry, shared) in results:
            mod = by_name[name].module  # NAME.cubin
            modules[mod] = cubin
            built[name] = (mod, entry, shared)
        for mod, data in modules.items():
            (out_dir / mod).write_bytes(data)
        for k in kernels:
            mod, entry, shared = built[k.name]
            params = [p.type for p in k.params]
            names = [p.name for p in k.params]
            if k.lang == "triton":
                params += [t for _, t in TRITON_HIDDEN]
                names += [n for n, _ in TRITON_HIDDEN]
            index["kernels"][k.name] = {
                "module": mod,
                "sha256": hashlib.sha256(modules[mod]).hexdigest(),
                "entry": entry,
                "params": params,
                "param_names": names,
                "aligned16": [p.name for p in k.params if p.div16],
                "block": k.block,
                "shared_mem": shared,
                "shared_mem_per": dict(k.shared_mem_per),
                "grid": k.grid,
                "constexprs": dict(k.constexprs),
                "doc": k.doc,
            }
            if k.pdl:  # only on the PDL instances: the base entries are unchanged
                index["kernels"][k.name]["pdl"] = True
            if k.carveout is not None:  # the launch's preferred shared-memory carveout (percent): only where set
                index["kernels"][k.name]["carveout"] = k.carveout
            if not quiet:
                print(f"  {k.name:32s} {mod:36s} block {k.block[0]:4d} smem {shared:6d}"
                      + (f" carveout {k.carveout}" if k.carveout is not None else ""), file=sys.stderr)
    text = json.dumps(index, indent=1, sort_keys=True) + "\n"
    (out_dir / "index.json").write_text(text)
    return index


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:  # 0 silently meant the default, -1 one job
        raise argparse.ArgumentTypeError(f"must be >= 1 (omit it for one per CPU), got {n}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="kernels directory to write")
    ap.add_argument("--geometry", action="append", default=None,
                    help="preset (0.6b 1.7b 4b 8b 14b 32b) or HF config.json; repeatable (default: 0.6b, 4b)")
    ap.add_argument("-j", "--jobs", type=_jobs, default=None, help="parallel Triton compiles (>= 1; default: CPUs)")
    ap.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                    help="also build the PDL forms of the decode-path kernels (NAME_pdl, which gen_qwen3.py's "
                         "default --pdl manifests launch; default: on; --no-pdl builds only the base set)")
    ap.add_argument("--fused-attention", action="store_true",
                    help="also build the one-launch decode attention (paged_decode_attention_fused[_pdl]; "
                         "for gen_qwen3.py --fused-attention)")
    ap.add_argument("--l2-prefetch", action="store_true",
                    help="also build the L2-prefetch forms of the m1 decode GEMVs (kern_gemv*_m1_pf in gemv_pf.cubin: "
                         "two extra params pf_ptr, pf_bytes; for tools/bench_pdl.py --l2-prefetch)")
    ap.add_argument("-q", "--quiet", action="store_true")
    # removed in session 21 (NOTES.md 59): refused by name, so that a command from older notes says why
    ap.add_argument("--kv-layout", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.kv_layout is not None:
        ap.error(f"--kv-layout {a.kv_layout}: removed; every kernel is built for the one KV layout, head-major "
                 "(tools/README.md, \"KV layout\"): drop the option")
    for spec in a.geometry or DEFAULT_GEOMETRIES:  # before anything is compiled or written
        try:
            load_geometry(spec)
        except ValueError as e:
            ap.error(f"--geometry: {e}")
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"--out {a.out}: exists and is not a directory")
    if blocker := next((p for p in a.out.parents if p.exists() and not p.is_dir()), None):
        ap.error(f"--out {a.out}: {blocker} is a file, not a directory")
    idx = build(a.out, a.geometry or DEFAULT_GEOMETRIES, a.jobs, a.quiet, pdl=a.pdl,
                fused_attention=a.fused_attention, l2_prefetch=a.l2_prefetch)
    modules = len({k["module"] for k in idx["kernels"].values()})
    print(f"wrote {len(idx['kernels'])} kernels ({modules} cubins) to {a.out}/index.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
