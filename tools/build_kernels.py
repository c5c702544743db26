#!/usr/bin/env python3
"""Build every Qwen3 provider kernel for sm_90 into a kernels directory + index.json.

    python tools/build_kernels.py --out DIR [--geometry 4b|0.6b|...|path/to/config.json ...] [-j N] [--no-pdl]
                                  [--fused-attention] [--l2-prefetch] [--cache DIR | --no-cache]

No GPU needed.  CUDA C sources are compiled with ``nvcc -cubin -arch=sm_90``;
Triton kernels (pinned triton==3.6.0) ahead of time with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``.  What to
build (instances, ABI, grid, docs) lives in ``kernels-src/catalog.py``; the
index format is described in ``kernels-src/README.md``.

Reproducible: the same sources and toolchain give byte-identical cubins and
index.json.  Triton's cache and home are private temp dirs, line info is off (so
no source paths land in the cubins), and the index carries no path or time.

Opt-in compile cache (``--cache DIR`` or ``KERN_BUILD_CACHE=DIR``; ``--no-cache``
wins over the variable): each nvcc module and Triton instance is stored under a
key of everything its compile reads, so a repeated compile is a file read with the
same bytes (see "Compile cache" below).
"""

from __future__ import annotations

import argparse
import functools
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
from typing import NamedTuple

SRC = Path(__file__).resolve().parent / "kernels-src"
sys.path.insert(0, str(SRC))

from catalog import CUDA_FLAGS, TRITON_HIDDEN, Kernel, instances  # noqa: E402
from geometries import load_geometry  # noqa: E402

TARGET = "sm_90"
DEFAULT_GEOMETRIES = ["0.6b", "4b"]
#: Common nvcc flags; each source adds its own from catalog.CUDA_FLAGS.
NVCC_FLAGS = ["-cubin", "-arch=sm_90", "-O3", "-std=c++17"]
#: triton.compile's target (GPUTarget("cuda", 90, 32)).
TRITON_TARGET = ("cuda", 90, 32)

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


#: The variables `_private_env` sets or clears: the same for every Triton compile (not in its cache key).
_PRIVATE_ENV = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DISABLE_LINE_INFO", "TRITON_INTERPRET",
                "TRITON_KERNEL_OVERRIDE")


def _private_env(tmp: str) -> None:
    """Keep Triton's cache/dumps out of $HOME and paths out of the binaries (sets `_PRIVATE_ENV`)."""
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
    """Compile one Triton instance; returns (cubin, entry symbol, dynamic shared bytes). With a
    compile cache (`cache_dir`), a hit returns the stored result and a miss stores it."""
    _private_env(tmp)
    if hit := _triton_cached(k):
        return hit
    cc = triton_compiled(k, tmp)
    md = cc.metadata
    if md.global_scratch_size or md.profile_scratch_size:
        raise AssertionError(f"{k.name}: needs Triton global/profile scratch; the ABI passes 0")
    if (cache := cache_dir()) is not None:
        cache_put(cache, triton_key(k), cc.asm["cubin"], {"entry": md.name, "shared": int(md.shared)})
    return cc.asm["cubin"], md.name, int(md.shared)


def triton_compiled(k: Kernel, tmp: str):
    """Triton's compiled kernel of one instance (`.asm["cubin"]`, `.asm["ptx"]`, `.metadata`)."""
    _private_env(tmp)
    import triton
    from triton.backends.compiler import GPUTarget

    fn, signature, constexprs, attrs = _triton_spec(k)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget(*TRITON_TARGET),
                          options={"num_warps": k.num_warps, "num_stages": k.num_stages})


def _triton_spec(k: Kernel):
    """What triton.compile is given for instance `k` (besides its options): (fn, signature,
    constexprs, attrs)."""
    import triton

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
    return fn, signature, constexprs, attrs


def cuda_ptx(k: Kernel) -> str:
    """The PTX of a CUDA C instance's module (same flags and defines as its cubin), for inspection."""
    with tempfile.TemporaryDirectory(prefix="kern-ptx-") as tmp:
        out = Path(tmp) / "m.ptx"
        cmd = [_nvcc(), *[f for f in NVCC_FLAGS if f != "-cubin"], "-ptx", *CUDA_FLAGS[k.source],
               *(f"-D{d}" for d in k.defines), "-o", str(out), k.source]
        subprocess.run(cmd, cwd=SRC, check=True)
        return out.read_text()


class CudaJob(NamedTuple):
    """One module of `start_cuda`: nvcc's run writing `out`, or (`proc` None) a compile-cache hit, `cached`."""
    proc: subprocess.Popen | None
    out: Path
    key: str | None = None  # compile-cache key to store the result under (None: no cache)
    cached: bytes | None = None


def _nvcc_args(source: str, defines: tuple[str, ...]) -> list[str]:
    """nvcc's arguments for one module, but the output (`-o FILE`): also the cache key's."""
    if source not in CUDA_FLAGS:
        raise AssertionError(f"{source}: no nvcc flags in catalog.CUDA_FLAGS")
    return [*NVCC_FLAGS, *CUDA_FLAGS[source], *(f"-D{d}" for d in defines), source]


def start_cuda(source: str, tmp: str, defines: tuple[str, ...] = (), module: str | None = None) -> CudaJob:
    """Start nvcc on one CUDA C source (it runs while Triton compiles); `finish_cuda` collects it.
    `defines`: -D macros of this module (e.g. KERN_PDL); `module`: its cubin file name. With a
    compile cache (`cache_dir`), a hit starts nothing."""
    out = Path(tmp) / (module or Path(source).stem + ".cubin")
    args = _nvcc_args(source, defines)
    key = None
    if (cache := cache_dir()) is not None:
        key = cuda_key(source, defines)
        if hit := cache_get(cache, key):
            return CudaJob(None, out, None, hit[0])
    # Compile from inside the source dir with a relative name: no absolute path can leak.
    cmd = [_nvcc(), *args[:-1], "-o", str(out), source]
    return CudaJob(subprocess.Popen(cmd, cwd=SRC), out, key)


def finish_cuda(job: CudaJob) -> bytes:
    """The cubin of a `start_cuda` job (stored in the compile cache when the job has a key)."""
    if job.proc is None:
        return job.cached
    if job.proc.wait() != 0:
        raise subprocess.CalledProcessError(job.proc.returncode, job.proc.args)
    data = job.out.read_bytes()
    if job.key is not None and (cache := cache_dir()) is not None:
        cache_put(cache, job.key, data)
    return data


def compile_cuda(source: str, tmp: str) -> bytes:
    return finish_cuda(start_cuda(source, tmp))


def _triton_job(args):
    k, tmp = args
    return k.name, compile_triton(k, tmp)


# ------------------------------------------------------------------ compile cache
#
# Opt-in (`--cache DIR` / KERN_BUILD_CACHE=DIR): one entry per compile, DIR/KEY.cubin + DIR/KEY.json
# ({"sha256": of the cubin, and for Triton "entry", "shared"}). The key is the sha256 of everything the
# compile reads, so a hit is the compile's output, byte for byte (the build is reproducible). The tests' own
# nvcc runs (tests-integration/nvcc_jobs.py) share it through `nvcc_key`; a PTX entry's KEY.cubin is PTX text.

CACHE_ENV = "KERN_BUILD_CACHE"


def cache_dir() -> Path | None:
    """The compile cache: $KERN_BUILD_CACHE (main sets or clears it for --cache / --no-cache, so that
    the Triton workers inherit it), None when unset or empty."""
    d = os.environ.get(CACHE_ENV)
    return Path(d) if d else None


@functools.cache
def _nvcc_version(nvcc: str) -> str:
    """`nvcc --version` (toolkit release and build: its compiler, ptxas and headers), once per process."""
    return subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout


def _sources(*patterns: str) -> list[tuple[str, str]]:
    """(name, sha256) of every file of SRC matching `patterns`, by name: every file a compile can read
    there (an #include, a Python import), whether or not it does."""
    files = sorted({p for pat in patterns for p in SRC.glob(pat) if p.is_file()})
    return [(p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]


def _key(kind: str, what) -> str:
    """sha256 of `what` (JSON) with this file's own bytes: a change to how we compile is a new key."""
    payload = {"kind": kind, "build_kernels.py": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
               "what": what}
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def cuda_key(source: str, defines: tuple[str, ...] = ()) -> str:
    """Cache key of an nvcc module: `nvcc_key` of its command line but the output (NVCC_FLAGS,
    catalog.CUDA_FLAGS[source], the -D defines, the source)."""
    return nvcc_key(_nvcc_args(source, tuple(defines)))


def nvcc_key(args: list[str]) -> str:
    """Cache key of an nvcc run in kernels-src on one of its sources, `args` its command line but nvcc and the
    output (`-o FILE`): the args, nvcc's `--version`, the NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS nvcc reads, and
    every *.cu, *.cuh, *.h of kernels-src (its includes; CUDA's own headers come with the version). A PTX run
    (`-ptx` in args) is keyed as another kind than a cubin's, so that its entry is never taken for a cubin."""
    return _key("ptx" if "-ptx" in args else "cuda",
                {"args": list(args), "nvcc": _nvcc_version(_nvcc()),
                 "env": [os.environ.get(v) for v in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")],
                 "sources": _sources("*.cu", "*.cuh", "*.h")})


def triton_key(k: Kernel) -> str:
    """Cache key of a Triton instance: triton's version and all that triton.compile is given (source file
    and entry, the signature from the params' types, the div16 attrs, the constexprs with the PDL
    default, num_warps, num_stages, target), the environment's other TRITON_* knobs (those but
    `_PRIVATE_ENV`), and every *.py of kernels-src (the kernels and what they import)."""
    import triton

    _, signature, constexprs, attrs = _triton_spec(k)
    knobs = sorted((v, x) for v, x in os.environ.items() if v.startswith("TRITON_") and v not in _PRIVATE_ENV)
    return _key("triton", {"triton": triton.__version__, "knobs": knobs, "source": k.source, "entry": k.entry,
                           "signature": list(signature.items()), "constexprs": list(constexprs.items()),
                           "attrs": sorted([list(i), a] for i, a in attrs.items()),
                           "options": [k.num_warps, k.num_stages], "target": TRITON_TARGET,
                           "sources": _sources("*.py")})


def cache_get(cache: Path, key: str) -> tuple[bytes, dict] | None:
    """(cubin, metadata) of entry `key`, or None: a missing, partial or damaged entry is a miss."""
    try:
        meta = json.loads((cache / f"{key}.json").read_text())
        data = (cache / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
        return None
    return data, meta


def cache_put(cache: Path, key: str, data: bytes, meta: dict | None = None) -> None:
    """Store entry `key`: each file written to a temp file in `cache`, then renamed over its name
    (atomic), the cubin first, so that a reader, another build included, never sees a partial file."""
    cache.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**(meta or {}), "sha256": hashlib.sha256(data).hexdigest()}, sort_keys=True)
    for name, payload in ((f"{key}.cubin", data), (f"{key}.json", text.encode())):
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, cache / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _triton_cached(k: Kernel) -> tuple[bytes, str, int] | None:
    """compile_triton's result for `k` from the compile cache, or None (no cache, or a miss)."""
    if (cache := cache_dir()) is None or not (hit := cache_get(cache, triton_key(k))):
        return None
    data, meta = hit
    if not (isinstance(meta.get("entry"), str) and type(meta.get("shared")) is int):
        return None
    return data, meta["entry"], meta["shared"]


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
        hits = {k.name: hit for k in tri if (hit := _triton_cached(k))}  # from the compile cache
        todo = [k for k in tri if k.name not in hits]
        results = list(hits.items())
        jobs = jobs or min(len(todo), os.cpu_count() or 1) or 1
        try:
            if jobs > 1 and len(todo) > 1:
                import multiprocessing as mp

                with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
                    results += ex.map(_triton_job, [(k, tmp) for k in todo])
            else:
                results += [_triton_job((k, tmp)) for k in todo]
        finally:
            for job in nvcc.values():  # never leave nvcc writing into a deleted temp dir
                if job.proc is not None:
                    job.proc.wait()
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
    cache = ap.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=Path, metavar="DIR",
                       help=f"compile cache: reuse (and store) each module's cubin under a key of all that its "
                            f"compile reads, the same bytes as a compile (default: ${CACHE_ENV}, else none)")
    cache.add_argument("--no-cache", action="store_true", help=f"compile everything, even with ${CACHE_ENV} set")
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
    if a.cache is not None and a.cache.exists() and not a.cache.is_dir():
        ap.error(f"--cache {a.cache}: exists and is not a directory")
    if a.no_cache:  # through the environment, which the Triton workers inherit
        os.environ.pop(CACHE_ENV, None)
    elif a.cache is not None:
        os.environ[CACHE_ENV] = str(a.cache.resolve())
    idx = build(a.out, a.geometry or DEFAULT_GEOMETRIES, a.jobs, a.quiet, pdl=a.pdl,
                fused_attention=a.fused_attention, l2_prefetch=a.l2_prefetch)
    modules = len({k["module"] for k in idx["kernels"].values()})
    print(f"wrote {len(idx['kernels'])} kernels ({modules} cubins) to {a.out}/index.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
