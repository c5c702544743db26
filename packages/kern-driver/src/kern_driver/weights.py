"""Weight binding: safetensors headers against the manifest's `weight` buffers.

Pure Python, no GPU. The safetensors format (https://github.com/huggingface/safetensors,
"Format" section): 8 bytes little-endian u64 `N`, then `N` bytes of UTF-8 JSON
`{name: {"dtype": D, "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}`,
then the data block; offsets are relative to the start of the data block
(`8 + N`). Reading only the header lets every binding check run before any
byte is copied to the GPU.

Binding rules (DESIGN §4): every `weight` buffer is bound to the tensor of the same
name; a weight with no tensor, a tensor with no weight buffer, a tensor in two
files, a dtype or a shape that differs from the declaration are errors, all
reported together, each naming the tensor.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from kern_schema import DTYPES, Manifest

from .errors import KernDriverError, a_class
from .plan import Layout, Region

#: safetensors dtype tags → manifest dtypes.
SAFETENSORS_DTYPES: dict[str, str] = {
    "BF16": "bf16", "F16": "f16", "F32": "f32", "F64": "f64",
    "I8": "i8", "U8": "u8", "I16": "i16", "U16": "u16",
    "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64",
    "F8_E4M3": "fp8e4m3", "F8_E5M2": "fp8e5m2",
}

_MAX_HEADER = 100 * 2**20


@dataclass(frozen=True, slots=True)
class TensorRef:
    """Where one tensor's bytes are.

    Attributes:
        name: tensor name.
        path: the safetensors file.
        dtype: the manifest dtype (`bf16`...) or, for a tag kern has no dtype for, the raw tag.
        shape: the tensor's shape.
        start: absolute byte offset of the data in the file.
        nbytes: data size in bytes.
    """

    name: str
    path: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Binding:
    """A weight buffer bound to a tensor: copy `tensor.nbytes` bytes from the file to the region."""

    buffer: str
    tensor: TensorRef
    region: Region


def read_header(path: str | os.PathLike[str]) -> dict[str, TensorRef]:
    """The tensors a safetensors file holds, from its header only.

    Raises:
        KernDriverError: the file cannot be read, or its header is malformed (too short,
            absurd length, not JSON, a tensor whose byte range is outside the file or
            does not match its dtype × shape).
    """
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise KernDriverError(f"weights file {path}: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise KernDriverError(
                    f"weights file {path}: header length {n} is impossible for a {size}-byte file",
                    hint="is this a safetensors file? (.bin/.pt checkpoints must be exported first)",
                )
            raw = f.read(n)
    except OSError as e:
        raise KernDriverError(f"cannot read weights file {path}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError) as e:
        raise KernDriverError(f"weights file {path}: malformed safetensors header ({e})") from None
    data0 = 8 + n
    out: dict[str, TensorRef] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        def ints(xs: object) -> tuple[int, ...]:  # JSON integers only: a 2.5 or "64" is a malformed header, not 2 or 64
            if not isinstance(xs, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs):
                raise ValueError
            return tuple(xs)

        try:
            tag = info["dtype"]
            shape = ints(info["shape"])
            begin, end = ints(info["data_offsets"])
            if not isinstance(tag, str):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise KernDriverError(f"weights file {path}: tensor `{name}` has a malformed header entry: {info!r}") from None
        dtype = SAFETENSORS_DTYPES.get(tag, tag)
        if not (0 <= begin <= end and data0 + end <= size):
            raise KernDriverError(
                f"weights file {path}: tensor `{name}` bytes [{begin}, {end}) lie outside the file ({size} bytes)",
                hint="the file is truncated or corrupt; export it again",
            )
        if dtype in DTYPES:
            want = DTYPES[dtype]
            for d in shape:
                want *= d
            if want != end - begin:
                raise KernDriverError(
                    f"weights file {path}: tensor `{name}` ({tag} {list(shape)}) should take {want} bytes, "
                    f"its data_offsets give {end - begin}"
                )
        out[name] = TensorRef(name, path, dtype, shape, data0 + begin, end - begin)
    return out


def read_headers(paths: list[str | os.PathLike[str]]) -> dict[str, TensorRef]:
    """`read_header` over several files (a sharded checkpoint).

    Raises:
        KernDriverError: as `read_header`, a file listed twice, or a tensor name present in two files.
    """
    out: dict[str, TensorRef] = {}
    seen: dict[str, str] = {}
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            raise KernDriverError(f"weights file {os.fspath(p)} is listed twice" + (
                f" (also as {seen[real]})" if seen[real] != os.fspath(p) else ""),
                hint="name each safetensors file once")
        seen[real] = os.fspath(p)
        for name, ref in read_header(p).items():
            if name in out:
                raise KernDriverError(
                    f"tensor `{name}` is in two weights files: {out[name].path} and {ref.path}",
                    hint="each weight must come from exactly one file",
                )
            out[name] = ref
    return out


def weight_paths(weights: str | os.PathLike[str] | list | tuple | None) -> list[str]:
    """Normalize the `weights` argument of `Runtime.load`: a file, a directory (every
    `*.safetensors` in it, sorted), a list (or any iterable) of files, or None (no weights).

    Raises:
        KernDriverError: a directory with no `*.safetensors` file; an argument (or a list item) that is
            not a path.
    """
    if weights is None:
        return []
    if not isinstance(weights, (str, bytes, os.PathLike)):
        try:
            items = list(weights)
        except TypeError:
            raise KernDriverError(f"weights: expected a path, a list of paths or None, not {type(weights).__name__}",
                                  hint="pass the safetensors file, a folder of them, or a list of files") from None
        bad = [w for w in items if not isinstance(w, (str, bytes, os.PathLike))]
        if bad:
            raise KernDriverError(f"weights: list item {bad[0]!r} ({type(bad[0]).__name__}) is not a path",
                                  hint="pass the safetensors files as paths")
        return [os.fsdecode(w) for w in items]
    p = Path(os.fsdecode(weights))
    if p.is_dir():
        files = sorted(str(f) for f in p.glob("*.safetensors"))
        if not files:
            raise KernDriverError(f"weights directory {p} holds no *.safetensors file")
        return files
    return [os.fspath(p)]


def bind(manifest: Manifest, plan: Layout, tensors: dict[str, TensorRef]) -> list[Binding]:
    """Bind every `weight` buffer of `manifest` to the tensor of the same name.

    Returns the bindings in plan order.

    Raises:
        KernDriverError: listing every problem: a weight buffer with no tensor ("missing"),
            a tensor no weight buffer declares ("extra"), a dtype or shape that differs.
    """
    problems: list[str] = []
    out: list[Binding] = []
    weights = {n: b for n, b in manifest.buffers.items() if b.class_ == "weight"}
    for name, b in weights.items():
        region = plan.buffers[name]
        t = tensors.get(name)
        if t is None:
            problems.append(f"missing: weight buffer `{name}` ({b.dtype} {list(region.shape)}) has no tensor in the weights")
            continue
        bad = []
        if t.dtype != b.dtype:
            bad.append(f"dtype {t.dtype}, the manifest declares {b.dtype}")
        if t.shape != region.shape:
            bad.append(f"shape {list(t.shape)}, the manifest declares {list(region.shape)}")
        if bad:
            problems.append(f"tensor `{name}` in {t.path}: " + "; ".join(bad))
            continue
        out.append(Binding(name, t, region))
    for name, t in tensors.items():
        if name not in weights:
            what = "is not a weight buffer" if name not in manifest.buffers else f"is {a_class(manifest.buffers[name].class_)} buffer, not a weight"
            problems.append(f"extra: tensor `{name}` in {t.path} {what} of the manifest")
    if problems:
        raise KernDriverError(
            f"{len(problems)} weight binding problem(s):\n    " + "\n    ".join(problems),
            where="weights",
            hint="weights bind by exact name, dtype and shape; export the checkpoint for this manifest "
            "(e.g. tools/export_weights.py) or fix the manifest's weight buffers",
        )
    out.sort(key=lambda bd: bd.region.offset)
    return out
