"""Build the CUPTI injection library on the user's machine, and run commands under it.

The library (``csrc/capture.c``) is compiled with the system C compiler
(``$CC`` or ``cc``/``gcc``) against the CUDA toolkit's ``cuda.h`` and CUPTI
headers and linked against ``libcupti``; it does not link ``libcuda`` (it looks
the driver entry points up in the process it is injected into), so it builds
on machines without a GPU driver.

Toolkit: the first of ``$KERN_CAPTURE_CUDA_HOME``, ``$CUDA_HOME``,
``$CUDA_PATH`` that is set is used alone; it must hold ``cuda.h``, ``cupti.h``
and ``libcupti.so*`` (under ``include``/``lib64``/``lib``, ``targets/*/`` or
``extras/CUPTI/``), else ``BuildError`` names the variable, its value and what
is missing (no fall-back that would mix two toolkits). With none set, the
first match wins over the toolkit of ``nvcc`` on ``PATH``, ``/usr/local/cuda``,
then the ``nvidia-cuda-cupti``/``nvidia-cuda-runtime`` (or CUDA 13
``nvidia/cu13``) wheels of the running Python.

The result is cached as
``$KERN_CAPTURE_CACHE`` (default ``~/.cache/kern-capture``)
``/<cuda version>/<hash>/libkern_capture.so``, the hash covering the source,
the compiler, flags and the toolkit paths, so an edited source or another
toolkit builds afresh.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kern_capture import __version__

__all__ = ["BuildError", "Toolchain", "find_toolchain", "build_library", "source_path", "capture_env"]

LIB_NAME = "libkern_capture.so"
CFLAGS = ["-shared", "-fPIC", "-O2", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra",
          "-Wno-unused-parameter"]


class BuildError(RuntimeError):
    """The injection library could not be built; the message says what is missing."""


@dataclass
class Toolchain:
    cc: str
    include_dirs: list[Path]
    cupti_lib: Path             # the libcupti shared object to link
    cuda_version: str           # "13.0", from CUDA_VERSION in cuda.h
    searched: list[str] = field(default_factory=list)


def source_path() -> Path:
    """Path of the C source shipped in the package."""
    return Path(str(resources.files("kern_capture") / "csrc" / "capture.c"))


TOOLKIT_VARS = ("KERN_CAPTURE_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")


def _toolkit_override() -> tuple[str, str] | None:
    """The first toolkit variable that is set, as (name, value), or None."""
    for var in TOOLKIT_VARS:
        v = os.environ.get(var)
        if v:
            return var, v
    return None


def _toolkit_roots() -> list[tuple[str, Path]]:
    roots: list[tuple[str, Path]] = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(("nvcc on PATH", Path(nvcc).resolve().parent.parent))
    roots.append(("/usr/local/cuda", Path("/usr/local/cuda")))
    # pip wheels: nvidia/cuda_cupti, nvidia/cuda_runtime (CUDA 12), nvidia/cu13 (CUDA 13)
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            for sub in ("cu13", "cuda_cupti", "cuda_runtime", "cuda_nvcc"):
                if (base / sub).is_dir():
                    roots.append((f"wheel {base / sub}", base / sub))
    return roots


def _include_candidates(root: Path) -> list[Path]:
    out = [root / "include", root / "extras" / "CUPTI" / "include"]
    tdir = root / "targets"
    if tdir.is_dir():
        out += sorted(p / "include" for p in tdir.iterdir())
    return out


def _lib_candidates(root: Path) -> list[Path]:
    out = [root / "extras" / "CUPTI" / "lib64", root / "lib64", root / "lib"]
    tdir = root / "targets"
    if tdir.is_dir():
        out += sorted(p / "lib" for p in tdir.iterdir())
    return out


def _find_libcupti(d: Path) -> Path | None:
    if not d.is_dir():
        return None
    if (d / "libcupti.so").exists():
        return d / "libcupti.so"
    versioned = sorted(d.glob("libcupti.so.*"), key=lambda p: (len(p.name), p.name))
    return versioned[0] if versioned else None


def _cuda_version(cuda_h: Path) -> str:
    m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", cuda_h.read_text(errors="replace"), re.M)
    if not m:
        return "unknown"
    v = int(m.group(1))
    return f"{v // 1000}.{(v % 1000) // 10}"


def find_toolchain(cc: str | None = None) -> Toolchain:
    """Locate a C compiler, ``cuda.h``, ``cupti.h`` and ``libcupti``.

    Raises ``BuildError`` naming every place searched when something is missing.
    """
    searched: list[str] = []
    cuda_h: Path | None = None
    cupti_h: Path | None = None
    lib: Path | None = None
    override = _toolkit_override()
    if override is not None:
        var, value = override
        roots = [(f"${var}", Path(value))]
    else:
        roots = _toolkit_roots()
    for label, root in roots:
        for inc in _include_candidates(root):
            searched.append(f"{inc} ({label})")
            if cuda_h is None and (inc / "cuda.h").is_file():
                cuda_h = inc / "cuda.h"
            if cupti_h is None and (inc / "cupti.h").is_file():
                cupti_h = inc / "cupti.h"
        for d in _lib_candidates(root):
            if lib is None:
                lib = _find_libcupti(d)
        if cuda_h and cupti_h and lib:
            break
    missing = [n for n, v in (("cuda.h", cuda_h), ("cupti.h", cupti_h), ("libcupti.so", lib)) if v is None]
    if missing and override is not None:
        var, value = override
        others = [v for v in TOOLKIT_VARS if v != var and os.environ.get(v)]
        state = "does not exist" if not Path(value).exists() else f"lacks {', '.join(missing)}"
        raise BuildError(
            f"cannot build the kern-capture injection library: ${var}={value} {state}.\n"
            f"${var} selects the CUDA toolkit, and the build takes cuda.h, cupti.h and libcupti from it alone "
            "(never from a second toolkit). Point it at a complete toolkit (one with extras/CUPTI, or the "
            "nvidia/cu13 wheel directory)"
            + (f", or unset it to use {', '.join('$' + v for v in others)} instead" if others else
               ", or unset it to search nvcc on PATH, /usr/local/cuda and the nvidia-* wheels")
            + ".\nSearched:\n  " + "\n  ".join(dict.fromkeys(searched))
        )
    if missing:
        raise BuildError(
            f"cannot build the kern-capture injection library: {', '.join(missing)} not found.\n"
            "Install the CUDA toolkit (with CUPTI) or the nvidia-cuda-cupti and nvidia-cuda-runtime "
            "wheels, or point KERN_CAPTURE_CUDA_HOME / CUDA_HOME at the toolkit.\nSearched:\n  "
            + "\n  ".join(dict.fromkeys(searched))
        )
    assert cuda_h and cupti_h and lib
    compiler = _find_compiler(cc)
    incs = list(dict.fromkeys([cuda_h.parent, cupti_h.parent]))
    return Toolchain(cc=compiler, include_dirs=incs, cupti_lib=lib, cuda_version=_cuda_version(cuda_h),
                     searched=searched)


def _find_compiler(cc: str | None) -> str:
    """The C compiler: ``cc`` (from --cc), else ``$CC``, else cc, gcc, clang on PATH."""
    given, source = (cc, "--cc") if cc else (os.environ.get("CC"), "$CC")
    if given:
        if shutil.which(given):
            return given
        hint = (" (it must name one executable, without arguments)" if len(given.split()) > 1 else
                " (neither an executable file nor a name on PATH)")
        fix = "pass --cc with an installed compiler (gcc, clang) or drop --cc" if source == "--cc" else \
              "set CC to an installed compiler (gcc, clang) or unset it"
        raise BuildError(f"cannot build the kern-capture injection library: the C compiler {given!r} given by "
                         f"{source} was not found{hint}; {fix}")
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    raise BuildError("cannot build the kern-capture injection library: no C compiler found (looked for cc, gcc "
                     "and clang on PATH); install gcc or clang, or name one with --cc or CC")


def _cache_root() -> Path:
    v = os.environ.get("KERN_CAPTURE_CACHE")
    if v:
        return Path(v)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kern-capture"


def _command(tc: Toolchain, src: Path, out: Path) -> list[str]:
    cmd = [tc.cc, *CFLAGS, f'-DKERN_CAPTURE_VERSION="{__version__}"']
    cmd += [f"-I{d}" for d in tc.include_dirs]
    cmd += [str(src), "-o", str(out)]
    libdir = tc.cupti_lib.parent
    if tc.cupti_lib.name == "libcupti.so":
        cmd += [f"-L{libdir}", "-lcupti"]
    else:
        cmd += [f"-L{libdir}", f"-l:{tc.cupti_lib.name}"]
    cmd += [f"-Wl,-rpath,{libdir}", "-ldl", "-lpthread"]
    return cmd


def build_library(force: bool = False, cc: str | None = None, cache_dir: str | os.PathLike[str] | None = None,
                  verbose: bool = False) -> Path:
    """Build (or reuse) the injection library and return its path.

    The build is atomic (compiled to a temporary file, checked to be non-empty,
    made mode 0755, then renamed), so concurrent callers are safe and a shared
    cache is readable by every user.
    """
    tc = find_toolchain(cc)
    src = source_path()
    source = src.read_bytes()
    cmd_template = _command(tc, Path("SRC"), Path("OUT"))
    try:
        cc_version = subprocess.run([tc.cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        cc_version = ""
    h = hashlib.sha256()
    for part in (source, "\0".join(cmd_template).encode(), cc_version.encode(), __version__.encode()):
        h.update(part)
        h.update(b"\0")
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    out_dir = root / tc.cuda_version / h.hexdigest()[:16]
    out = out_dir / LIB_NAME
    if out.is_file() and out.stat().st_size > 0 and not force:
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = _command(tc, src, Path(tmp))
    if verbose:
        print("kern-capture: " + " ".join(cmd), file=sys.stderr)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        os.unlink(tmp)
        raise BuildError(f"cannot run the C compiler {tc.cc!r}: {exc}") from exc
    if proc.returncode != 0:
        os.unlink(tmp)
        raise BuildError(
            f"compiling the kern-capture injection library failed (exit {proc.returncode}):\n"
            f"  {' '.join(cmd)}\n{proc.stderr.strip()}"
        )
    size = os.stat(tmp).st_size if os.path.exists(tmp) else 0
    if size == 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise BuildError(
            f"the C compiler {tc.cc!r} exited 0 but wrote no output to {tmp} (nothing was cached):\n"
            f"  {' '.join(cmd)}\n"
            "is it a working C compiler? Name one with --cc or CC (gcc or clang)"
        )
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return out


def capture_env(lib: Path, out: str | os.PathLike[str], eager_modules: bool = False, buffered: bool = False,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a CUDA process load the injection library."""
    env = dict(os.environ if base is None else base)
    env["CUDA_INJECTION64_PATH"] = str(lib)
    env["KERN_CAPTURE_OUT"] = str(Path(out).resolve())
    if eager_modules:
        env["CUDA_MODULE_LOADING"] = "EAGER"
    if buffered:
        env["KERN_CAPTURE_BUFFERED"] = "1"
    else:
        env.pop("KERN_CAPTURE_BUFFERED", None)
    return env
