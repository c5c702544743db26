"""Reading and hash-checking module files. Pure Python, no GPU.

A module's `source` is a path relative to the kernels directory (no absolute
path, no `..`: DESIGN §2). `hf:org/repo/path` sources are not fetched by the
runtime (it never touches the network): download the file into the kernels
directory and name it by its relative path. When `sha256` is given the file's
SHA-256 must equal it, or the load is refused (the integrity check of
pluggable kernel artifacts).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kern_schema import Manifest

from .errors import KernDriverError


@dataclass(frozen=True, slots=True)
class ModuleImage:
    """A module file read from disk: `name`, `path`, the bytes and their sha256 (hex);
    `pinned` tells whether the manifest pinned the hash."""

    name: str
    path: str
    data: bytes
    sha256: str
    pinned: bool


def read_modules(manifest: Manifest, kernels_dir: str | os.PathLike[str]) -> dict[str, ModuleImage]:
    """Read every module of `manifest` from `kernels_dir` and check its sha256.

    Raises:
        KernDriverError: listing every module that is missing, unreadable, named by a
            forbidden path, fetched from `hf:`, or whose sha256 differs from the pin.
    """
    root = Path(kernels_dir)
    if manifest.modules and not root.is_dir():
        raise KernDriverError(
            f"kernels directory {root} " + ("is not a directory" if root.exists() else "does not exist"),
            hint="pass the folder the manifest's module paths are relative to (e.g. tools/build_kernels.py --out DIR)")
    out: dict[str, ModuleImage] = {}
    problems: list[str] = []
    for name, mod in manifest.modules.items():
        src = mod.source
        where = f"modules.{name}"
        if src.startswith("hf:"):
            problems.append(
                f"{where}: `{src}`: kern-driver does not download modules; fetch the file into the kernels "
                "directory and give its relative path as `source` (keep the sha256)"
            )
            continue
        pp = PurePosixPath(src)
        if pp.is_absolute() or ".." in pp.parts or os.path.isabs(src):
            problems.append(f"{where}: `{src}`: module paths are relative to the kernels directory, without `..`")
            continue
        path = root / pp
        try:
            data = path.read_bytes()
        except OSError as e:
            problems.append(f"{where}: cannot read {path}: {e.strerror or e}")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if mod.sha256 is not None and digest != mod.sha256.lower():
            problems.append(
                f"{where}: sha256 mismatch for {path}: the file's is {digest}, the manifest pins {mod.sha256} "
                "(the file was modified or replaced since the manifest was written)"
            )
            continue
        out[name] = ModuleImage(name, str(path), data, digest, mod.sha256 is not None)
    if problems:
        raise KernDriverError(
            f"{len(problems)} module problem(s) in {root}:\n    " + "\n    ".join(problems),
            hint="rebuild the kernels (tools/build_kernels.py) or regenerate the manifest so the pins match; "
            "never load a cubin whose hash differs",
        )
    return out
