"""Record types of a kern-capture dump, and a streaming reader.

A capture directory, written by the injection library (``csrc/capture.c``)::

    DIR/
      modules.jsonl         one ModuleRecord per loaded module
      module_<id>.<kind>    the module's bytes, kind = cubin | fatbin | ptx
      launches.jsonl        one LaunchRecord per kernel launch, in call order
                            (``launches.jsonl.gz`` instead in a capture trimmed
                            by ``kern-mine trim``; read the same way)
      capture.json          written at start: pid, library version, CUDA version
      error.json            present only when the capture failed (e.g. CUPTI
                            was already held by a profiler)
      pid<N>/               the same layout, for each further process of the
                            captured command that initialised CUDA

The JSON lines are decoded with one ``msgspec.json.Decoder`` per record type
and one line at a time, so a capture of hundreds of thousands of launches is
read in constant memory (``iter_launches``).

The field names are a contract with ``kern-mine``; fields may be added (with
defaults), never renamed or removed.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

if TYPE_CHECKING:
    from kern_capture.checks import LaunchChecker

__all__ = [
    "AllocRange",
    "ParamRecord",
    "LaunchRecord",
    "ModuleRecord",
    "CaptureError",
    "CaptureFormatError",
    "Capture",
    "iter_launches",
    "iter_modules",
    "read_error",
    "LAUNCHES_FILE",
    "LAUNCHES_GZ_FILE",
    "MODULES_FILE",
    "launches_path",
    "ERROR_FILE",
    "INFO_FILE",
]

LAUNCHES_FILE = "launches.jsonl"
LAUNCHES_GZ_FILE = LAUNCHES_FILE + ".gz"  # what `kern-mine trim` writes
MODULES_FILE = "modules.jsonl"
ERROR_FILE = "error.json"
INFO_FILE = "capture.json"


#: Raw bytes as the capture writes them: hex digits (an even number of them: ``__post_init__``).
#: Checked at decode time, so a damaged ``hex``/``extra_hex`` is a ``CaptureFormatError`` naming
#: the file, line and field, not a ``ValueError`` from ``bytes.fromhex`` deep inside a reader.
HexBytes = Annotated[str, msgspec.Meta(pattern="^[0-9a-fA-F]*$")]


class AllocRange(msgspec.Struct, frozen=True):
    """A device allocation, as returned by ``cuMemGetAddressRange``."""

    base: int
    size: int

    @property
    def end(self) -> int:
        """One past the last byte of the allocation."""
        return self.base + self.size

    def __contains__(self, addr: object) -> bool:
        return isinstance(addr, int) and self.base <= addr < self.base + self.size


class ParamRecord(msgspec.Struct, frozen=True):
    """One kernel parameter as staged by the caller.

    ``offset``/``size`` come from ``cuFuncGetParamInfo``; ``hex`` is the raw
    little-endian bytes the caller passed. For an 8-byte value inside a device
    allocation, ``alloc`` is that allocation. ``host`` is true when the 8-byte
    value lies in the process's mapped host address space (a host pointer; the
    capture never dereferences it).
    """

    offset: int
    size: int
    hex: HexBytes
    alloc: AllocRange | None = None
    host: bool = False

    def __post_init__(self) -> None:
        # "" is what the library writes for a NULL kernelParams[i] (nothing to read)
        if self.hex and len(self.hex) != 2 * self.size:
            raise ValueError(f"hex has {len(self.hex)} hex digits, but a {self.size}-byte parameter has {2 * self.size} "
                             "(the record was edited or damaged)")

    @property
    def raw(self) -> bytes:
        """The parameter's bytes."""
        return bytes.fromhex(self.hex)

    @property
    def value_u64(self) -> int:
        """The bytes read as an unsigned little-endian integer (sizes 1..8)."""
        if not 1 <= self.size <= 8:
            raise ValueError(
                f"parameter at offset {self.offset} is {self.size} bytes; "
                "only 1..8-byte parameters have an integer value (use .raw)"
            )
        return int.from_bytes(bytes.fromhex(self.hex), "little", signed=False)

    def as_int(self, signed: bool = False) -> int:
        """The bytes read as a little-endian integer, two's complement if ``signed``."""
        if not 1 <= self.size <= 8:
            raise ValueError(
                f"parameter at offset {self.offset} is {self.size} bytes; "
                "only 1..8-byte parameters have an integer value (use .raw)"
            )
        return int.from_bytes(bytes.fromhex(self.hex), "little", signed=signed)

    def as_float(self) -> float:
        """The bytes read as an IEEE float (4 bytes: f32, 8 bytes: f64)."""
        import struct

        if self.size == 4:
            return struct.unpack("<f", bytes.fromhex(self.hex))[0]
        if self.size == 8:
            return struct.unpack("<d", bytes.fromhex(self.hex))[0]
        raise ValueError(f"parameter at offset {self.offset} is {self.size} bytes, not a float")

    @property
    def is_device_pointer(self) -> bool:
        """True when the value points into a device allocation."""
        return self.alloc is not None

    @property
    def alloc_offset(self) -> int | None:
        """Byte offset of the pointer inside its allocation, or None."""
        if self.alloc is None:
            return None
        return self.value_u64 - self.alloc.base


class LaunchRecord(msgspec.Struct, frozen=True):
    """One kernel launch.

    ``api`` is the driver entry point that carried it (``cuLaunchKernel``,
    ``cuLaunchKernel_ptsz``, ``cuLaunchKernelEx``, ``cuLaunchKernelEx_ptsz``,
    ``cuLaunchCooperativeKernel``, ``cuLaunchCooperativeKernel_ptsz``); runtime
    API launches arrive through these too and are recorded once. ``t_ns`` is
    CLOCK_MONOTONIC at the launch's API entry. ``module_id`` is the CUPTI
    module id (``module_<id>.<kind>``), None when it could not be resolved.
    ``params`` is None when the caller passed the arguments through the packed
    ``extra`` buffer (or the layout was unavailable); ``params_reason`` says
    why.

    Additive fields (absent in older captures): ``result`` (the launch's
    CUresult, 0 = success), ``num_regs`` (registers per thread),
    ``static_shared_mem`` (bytes), ``extra_hex`` (the packed ``extra`` buffer,
    when the caller used one and it is at most 4 KiB), ``func`` (the
    CUfunction handle).
    """

    seq: int
    t_ns: int
    pid: int
    tid: int
    ctx: int
    stream: int
    module_id: int | None
    symbol: str
    api: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    attrs: dict[str, Any] | None
    params: list[ParamRecord] | None
    params_reason: str | None = None
    result: int | None = None
    num_regs: int | None = None
    static_shared_mem: int | None = None
    extra_hex: HexBytes | None = None
    func: int | None = None

    def __post_init__(self) -> None:
        # CUDA takes grid, block and shared memory as unsigned: a negative value was never launched
        if min(self.grid) < 0 or min(self.block) < 0 or self.shared_mem < 0:
            what = ", ".join(f"{k} {list(v) if isinstance(v, tuple) else v}"
                             for k, v in (("grid", self.grid), ("block", self.block), ("shared_mem", self.shared_mem))
                             if (min(v) if isinstance(v, tuple) else v) < 0)
            raise ValueError(f"{what}: negative, impossible for a launch (CUDA takes them unsigned): "
                             "the record was edited or damaged")
        if self.extra_hex is not None and len(self.extra_hex) % 2:
            raise ValueError(f"extra_hex has an odd number of hex digits ({len(self.extra_hex)}): "
                             "the record was edited or damaged")

    @property
    def flat(self) -> bool:
        """True when every parameter was captured (kernelParams launch)."""
        return self.params is not None

    @property
    def param_bytes(self) -> int:
        """End of the last parameter (offset + size); 0 without params."""
        if not self.params:
            return 0
        last = self.params[-1]
        return last.offset + last.size

    def params_from_extra(self, layout: "list[tuple[int, int]]") -> list[ParamRecord]:
        """The parameters of an ``extra``-buffer launch, cut from ``extra_hex`` by a known layout.

        ``layout`` is ``[(offset, size), ...]`` in bytes, one per parameter in order (from the
        cubin's ELF parameter table, ``cuFuncGetParamInfo``, or a manifest's declared types).
        The records carry the raw bytes only: ``alloc``/``host`` are not known for them.

        Raises:
            ValueError: a layout entry has a negative offset or a size below 1; the launch has
                no ``extra_hex`` (a kernelParams launch, a buffer over 4 KiB, a capture older
                than ``extra_hex``, or one trimmed by ``kern-mine trim``); or a parameter ends
                past the buffer's end.
        """
        where = f"launch seq {self.seq} ({self.symbol})"
        for i, (off, size) in enumerate(layout):
            if off < 0:
                raise ValueError(f"{where}: layout parameter {i} has offset {off}; "
                                 "offsets are byte positions in the buffer, >= 0")
            if size < 1:
                raise ValueError(f"{where}: layout parameter {i} has size {size}; "
                                 "sizes are in bytes, >= 1")
        if self.extra_hex is None:
            if self.params is not None:
                why = "it is a kernelParams launch: its parameters are already split in .params"
            else:
                why = ("the likely causes: the buffer was over 4 KiB (not recorded), the capture was "
                       "written by a kern-capture older than extra_hex (capture again), or it was trimmed "
                       "by `kern-mine trim`, which drops extra_hex (read the untrimmed capture)")
                if self.params_reason:
                    why += f"; recorded reason: {self.params_reason}"
            raise ValueError(f"{where}: no packed extra buffer was recorded (extra_hex is absent); {why}")
        buf = bytes.fromhex(self.extra_hex)
        out = []
        for i, (off, size) in enumerate(layout):
            if off + size > len(buf):
                raise ValueError(f"{where}: parameter {i} at offset {off} "
                                 f"({size} B) ends past the {len(buf)}-byte extra buffer")
            out.append(ParamRecord(offset=off, size=size, hex=buf[off:off + size].hex()))
        return out

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


class ModuleRecord(msgspec.Struct, frozen=True):
    """One module seen at CUPTI's MODULE_LOADED callback.

    ``file`` is relative to the capture directory; ``kind`` is ``cubin``,
    ``fatbin`` or ``ptx`` (by magic), ``unknown`` otherwise.
    """

    module_id: int
    file: str
    kind: str
    size: int
    t_ns: int
    pid: int
    ctx: int | None = None


class CaptureError(RuntimeError):
    """The capture did not happen (the injection wrote ``error.json``)."""


class CaptureFormatError(ValueError):
    """A line of a capture file is not a valid record."""


_launch_decoder = msgspec.json.Decoder(LaunchRecord)
_module_decoder = msgspec.json.Decoder(ModuleRecord)


def _iter_lines(path: Path, decoder: msgspec.json.Decoder, strict: bool,
                checker: LaunchChecker | None = None) -> Iterator[Any]:
    # A crashed target may leave a truncated last line: it is dropped unless
    # strict. A malformed line elsewhere is always an error, and so is a last
    # line that is complete JSON but not a valid record (a cut-short line is
    # never complete JSON: its closing brace is missing). A missing file
    # yields nothing (callers that need it check first). ``*.gz`` is streamed
    # through gzip. ``checker`` sees every record with its line number, and the
    # dropped line.
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        f = opener(path, "rb")
    except FileNotFoundError:
        return
    with f:
        lineno = 0
        lines = iter(f)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                return
            except (EOFError, OSError, zlib.error) as exc:  # truncated or corrupt .gz
                if opener is open:
                    raise
                raise CaptureFormatError(
                    f"{path}: cannot decompress after line {lineno}: {exc}; the file is damaged, "
                    "write it again (kern-mine trim) or read the untrimmed capture"
                ) from exc
            lineno += 1
            if not line.strip():
                continue
            try:
                rec = decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # only the last line can lack its newline: a truncated write
                if line.endswith(b"\n") or strict or isinstance(exc, msgspec.ValidationError):
                    raise CaptureFormatError(f"{path}:{lineno}: {exc}") from exc
                if checker is not None:
                    checker.truncated(lineno)
                continue
            if checker is not None:
                checker.add(rec, lineno)
            yield rec


def launches_path(dir: str | os.PathLike[str]) -> Path:
    """``DIR/launches.jsonl``, else ``DIR/launches.jsonl.gz`` (a capture trimmed by ``kern-mine trim``).

    Raises:
        FileNotFoundError: DIR holds neither file (the message names both, and the
            capture's ``error.json`` when there is one).
    """
    d = Path(dir)
    for name in (LAUNCHES_FILE, LAUNCHES_GZ_FILE):
        if (d / name).is_file():
            return d / name
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: {'not a directory' if d.exists() else 'no such directory'} "
                                "(give the --out directory of `kern-capture run`)")
    err = read_error(d)
    why = (f"the capture failed ({ERROR_FILE}: {err.get('message', err)})" if err is not None else
           "is this a kern-capture directory (the --out of `kern-capture run`, or a pid<N>/ inside it)?")
    raise FileNotFoundError(f"{d}: neither {LAUNCHES_FILE} nor {LAUNCHES_GZ_FILE} is there; {why}")


def iter_launches(dir: str | os.PathLike[str], strict: bool = False,
                  checker: LaunchChecker | None = None) -> Iterator[LaunchRecord]:
    """Stream the launches of a capture directory, in record order.

    Reads ``launches.jsonl``, else ``launches.jsonl.gz`` (a trimmed capture),
    streamed either way. A truncated last line (the target crashed mid-write) is
    skipped unless ``strict``. Any other malformed line raises
    ``CaptureFormatError``, and so does an impossible record (a negative grid,
    block or shared memory size). ``checker`` (``kern_capture.checks.LaunchChecker``,
    made for ``launches_path(dir)``) sees each record and the dropped line: what is
    suspicious (failed launches, seq, pid, time) is counted there.

    Raises:
        FileNotFoundError: at the call, when the directory holds neither file.
    """
    return _iter_lines(launches_path(dir), _launch_decoder, strict, checker)


def iter_modules(dir: str | os.PathLike[str], strict: bool = False) -> Iterator[ModuleRecord]:
    """Stream the module records of a capture directory (none when ``modules.jsonl`` is absent)."""
    return _iter_lines(Path(dir) / MODULES_FILE, _module_decoder, strict)


def read_error(dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The capture's error marker (``error.json``) as a dict, or None."""
    p = Path(dir) / ERROR_FILE
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        out = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return {"error": "unreadable", "message": data.decode("utf-8", "replace")}
    return out if isinstance(out, dict) else {"error": "unreadable", "message": str(out)}


class Capture:
    """A capture directory: modules indexed by id, launches streamed.

    >>> cap = Capture.open("dump/")           # doctest: +SKIP
    >>> for launch in cap.launches(): ...     # doctest: +SKIP
    >>> cap.module_bytes(launch.module_id)    # doctest: +SKIP
    """

    def __init__(self, dir: Path, modules: dict[int, ModuleRecord], info: dict[str, Any] | None,
                 error: dict[str, Any] | None) -> None:
        self.dir = dir
        self.modules = modules
        self.info = info
        self.error = error

    @classmethod
    def open(cls, dir: str | os.PathLike[str], allow_error: bool = False) -> Capture:
        """Open a capture directory.

        Raises ``FileNotFoundError`` when ``dir`` does not exist or holds no
        capture, and ``CaptureError`` when the injection recorded a failure
        (unless ``allow_error``).
        """
        d = Path(dir)
        if not d.is_dir():
            raise FileNotFoundError(f"{d}: {'not a directory' if d.exists() else 'no such directory'} "
                                    "(give the --out directory of `kern-capture run`)")
        error = read_error(d)
        if error is not None and not allow_error:
            raise CaptureError(f"{d}: capture failed: {error.get('message', error)}")
        if not any((d / n).exists() for n in (LAUNCHES_FILE, LAUNCHES_GZ_FILE, MODULES_FILE, INFO_FILE)) \
                and error is None:
            raise FileNotFoundError(
                f"{d}: no {LAUNCHES_FILE}, {LAUNCHES_GZ_FILE} or {MODULES_FILE}; is this a kern-capture "
                "directory (the --out of `kern-capture run`)?"
            )
        info = None
        if (d / INFO_FILE).exists():
            try:
                info = msgspec.json.decode((d / INFO_FILE).read_bytes())
            except msgspec.DecodeError:
                info = None
        modules = {m.module_id: m for m in iter_modules(d)}
        return cls(d, modules, info, error)

    def launches(self, strict: bool = False, checker: LaunchChecker | None = None) -> Iterator[LaunchRecord]:
        """Stream the launches (a fresh iterator each call); ``checker``: see ``iter_launches``.

        A failed capture (``error.json``) without a launch file has none; any
        other capture without ``launches.jsonl``/``launches.jsonl.gz`` raises
        ``FileNotFoundError``.
        """
        if self.error is not None and not any((self.dir / n).is_file()
                                              for n in (LAUNCHES_FILE, LAUNCHES_GZ_FILE)):
            return iter(())
        return iter_launches(self.dir, strict=strict, checker=checker)

    def __iter__(self) -> Iterator[LaunchRecord]:
        return self.launches()

    def module_path(self, module_id: int) -> Path:
        """Path of a module's dumped bytes."""
        try:
            return self.dir / self.modules[module_id].file
        except KeyError:
            raise KeyError(f"module {module_id} is not in {self.dir / MODULES_FILE}") from None

    def module_bytes(self, module_id: int) -> bytes:
        return self.module_path(module_id).read_bytes()

    def subcaptures(self) -> list[Capture]:
        """Captures of further processes of the same command (``pid<N>/``)."""
        out = []
        for p in sorted(self.dir.glob("pid*")):
            if p.is_dir() and p.name[3:].isdigit():
                out.append(Capture.open(p, allow_error=True))
        return out

    def __repr__(self) -> str:
        return f"Capture({str(self.dir)!r}, modules={len(self.modules)})"
