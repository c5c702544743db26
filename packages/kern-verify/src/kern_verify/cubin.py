"""Static reader of CUDA cubins (sm_90 ELF), no GPU needed.

A cubin is an ELF file (`e_machine == EM_CUDA`). Each kernel entry is an
`STT_FUNC` symbol whose `st_other` carries the CUDA entry flag (`0x10`), with
its code in `.text.<name>` and its attributes in `.nv.info.<name>`. The
attribute section is a sequence of records::

    u8 format, u8 attribute, then by format:
      EIFMT_NVAL (0x01): 2 bytes padding           (4 bytes in all)
      EIFMT_BVAL (0x02): u8 value, 1 byte padding  (4 bytes in all)
      EIFMT_HVAL (0x03): u16 value                 (4 bytes in all)
      EIFMT_SVAL (0x04): u16 size, then `size` bytes

The parameter table is the set of `EIATTR_KPARAM_INFO` (0x17) records, each
12 bytes: u32 index (0), u16 ordinal (the parameter's position), u16 offset
(bytes from the start of the parameter buffer), u32 flags whose bits 18..31
hold the size in bytes. `EIATTR_CBANK_PARAM_SIZE` (0x19, HVAL) is the total
parameter buffer size, `EIATTR_MAX_THREADS` (0x05) the `__launch_bounds__`
maximum block [x, y, z], `EIATTR_REQNTID` (0x10) a required block size and
`EIATTR_CTA_PER_CLUSTER` (0x3d, SVAL, u32 [x, y, z]) the thread-block cluster a kernel is compiled
for (`__cluster_dims__`; nvcc adds the flag `EIATTR_EXPLICIT_CLUSTER`, 0x3e). This encoding was checked against nvcc 13.0 and Triton 3.6 cubins built for
sm_90 (see tests/test_cubin.py, which builds kernels with i32, i64, f32, u8,
i16, pointer and struct parameters and compares the table with the C ABI).

`params_from_manifest` lays out a manifest's declared parameter types the way
the CUDA C ABI does (each parameter at the next multiple of its size;
pointers are 8 bytes) and `compare_layout` reports every difference between a
declared layout and a cubin's.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from kern_schema import parse_param_type

__all__ = [
    "CubinError",
    "Cubin",
    "KernelInfo",
    "ParamSlot",
    "read_cubin",
    "params_from_manifest",
    "compare_layout",
    "layout_problems",
]

EM_CUDA = 190
STO_CUDA_ENTRY = 0x10

EIFMT_NVAL = 0x01
EIFMT_BVAL = 0x02
EIFMT_HVAL = 0x03
EIFMT_SVAL = 0x04

EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0A
EIATTR_REQNTID = 0x10
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_REGCOUNT = 0x2F
EIATTR_CTA_PER_CLUSTER = 0x3D

#: sm_90 SASS: every instruction is 16 bytes, its opcode in bits 0..11 of the first
#: little-endian 64-bit word (bits 12..15 hold the guard predicate). `griddepcontrol.wait`
#: assembles to `ACQBULK` (0x82e), `griddepcontrol.launch_dependents` to `PREEXIT` (0x82d);
#: checked with nvcc 13.0 / cuobjdump (tests/test_cubin.py builds both forms).
SASS_OPCODE_MASK = 0xFFF
SASS_ACQBULK = 0x82E

_KPARAM = struct.Struct("<IHHI")


class CubinError(ValueError):
    """A file is not a readable cubin (not ELF, not EM_CUDA, truncated or corrupt
    attribute records). The message names the file (when known) and says why."""


@dataclass(frozen=True, slots=True)
class ParamSlot:
    """One kernel parameter in the parameter buffer.

    Attributes:
        index: position of the parameter (0-based).
        offset: byte offset from the start of the parameter buffer.
        size: size in bytes (8 for pointers, 4 for `int`/`float`, the struct's size...).
    """

    index: int
    offset: int
    size: int

    def __str__(self) -> str:
        return f"#{self.index} @{self.offset} ({self.size} B)"


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """What a cubin says about one kernel entry.

    Attributes:
        name: the entry symbol as in the ELF (mangled names as they are).
        params: the parameter table, ordered by index.
        param_bytes: total parameter buffer size in bytes (`EIATTR_CBANK_PARAM_SIZE`,
            or the end of the last parameter when the attribute is absent).
        max_threads: `__launch_bounds__` maximum block [x, y, z], or None.
        required_block: `__reqntid__`/`.reqntid` block [x, y, z], or None.
        static_shared_bytes: size of the `.nv.shared.<name>` section (0 when absent; nvcc's sm_90 cubins count the
            1 KB the GPU reserves per block in it: kernels.RESERVED_SHARED).
        registers: registers per thread from `EIATTR_REGCOUNT`, or None.
        grid_dep_wait: whether the entry's own code (`.text.<name>`) contains
            `griddepcontrol.wait` (SASS `ACQBULK`); None when the section is absent.
        cluster: the thread-block cluster [x, y, z] (CTAs) the kernel is compiled for
            (`__cluster_dims__`, `EIATTR_CTA_PER_CLUSTER`), or None: a launch's grid must be a
            multiple of it on every axis.
    """

    name: str
    params: list[ParamSlot]
    param_bytes: int
    max_threads: tuple[int, int, int] | None = None
    required_block: tuple[int, int, int] | None = None
    static_shared_bytes: int = 0
    registers: int | None = None
    grid_dep_wait: bool | None = None
    cluster: tuple[int, int, int] | None = None


@dataclass(slots=True)
class Cubin:
    """A parsed cubin: `entries` maps each kernel entry symbol to its `KernelInfo`;
    `arch` is the SM version from the ELF flags (e.g. 90), or None when unknown."""

    entries: dict[str, KernelInfo] = field(default_factory=dict)
    arch: int | None = None


def _records(data: bytes, where: str) -> list[tuple[int, int, bytes]]:
    """Split an `.nv.info*` section into (format, attribute, value) records."""
    out: list[tuple[int, int, bytes]] = []
    i = 0
    n = len(data)
    while i < n:
        if i + 4 > n:
            raise CubinError(f"{where}: truncated attribute record at byte {i}")
        fmt, attr = data[i], data[i + 1]
        if fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, i + 2)
            if i + 4 + size > n:
                raise CubinError(f"{where}: attribute 0x{attr:02x} at byte {i} runs past the section end")
            out.append((fmt, attr, data[i + 4 : i + 4 + size]))
            i += 4 + size
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            out.append((fmt, attr, data[i + 2 : i + 4]))
            i += 4
        else:
            raise CubinError(f"{where}: unknown attribute format 0x{fmt:02x} at byte {i}")
    return out


def _triple(value: bytes) -> tuple[int, int, int] | None:
    if len(value) < 12:
        return None
    x, y, z = struct.unpack_from("<III", value)
    return (x, y, z)


def read_cubin(data: bytes, name: str = "<bytes>") -> Cubin:
    """Parse a cubin's kernel entries and their parameter tables.

    Args:
        data: the whole cubin file.
        name: how to name the file in errors (a path).

    Raises:
        CubinError: not an ELF file, not a CUDA ELF (`EM_CUDA`), or corrupt sections.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CubinError(f"{name}: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if data[:4] != b"\x7fELF":
        if data[:4] == b"P\xedU\xba" or data[:4] == b"\x50\xed\x55\xba":
            raise CubinError(f"{name}: a fatbinary, not a cubin: extract the sm_90 cubin (nvcc -cubin -arch=sm_90)")
        raise CubinError(f"{name}: not an ELF file (bad magic {data[:4]!r}): expected an sm_90 cubin")
    try:
        return _read(data, name)
    except CubinError:
        raise
    except (ELFError, struct.error, ValueError, IndexError, KeyError, UnicodeDecodeError, AssertionError) as e:
        raise CubinError(f"{name}: corrupt ELF: {e}") from None


def _read(data: bytes, name: str) -> Cubin:
    elf = ELFFile(io.BytesIO(data))
    if elf.header["e_machine"] not in ("EM_CUDA", EM_CUDA):
        raise CubinError(f"{name}: ELF machine is {elf.header['e_machine']}, not EM_CUDA: not a cubin")
    flags = elf.header["e_flags"]
    # e_flags: ELF ABI version 8 (nvcc 13) puts the SM version in bits 8..15 (0x5a = 90);
    # ABI version 7 (older ptxas, e.g. Triton's bundled one) in bits 0..7.
    if elf.header["e_ident"]["EI_ABIVERSION"] >= 8:
        arch = (flags >> 8) & 0xFF or None
    else:
        arch = flags & 0xFF or None

    symtab = elf.get_section_by_name(".symtab")
    if symtab is None:
        raise CubinError(f"{name}: no .symtab section: not a cubin, or a stripped one")
    entsize = symtab["sh_entsize"] or 24
    raw = symtab.data()
    entry_syms: dict[int, str] = {}
    for i in range(len(raw) // entsize):
        st_info = raw[i * entsize + 4]
        st_other = raw[i * entsize + 5]
        if st_info & 0xF == 2 and st_other & STO_CUDA_ENTRY:  # STT_FUNC, CUDA entry
            entry_syms[i] = symtab.get_symbol(i).name

    regcount: dict[int, int] = {}
    glob = elf.get_section_by_name(".nv.info")
    if glob is not None:
        for fmt, attr, val in _records(glob.data(), f"{name}: .nv.info"):
            if attr == EIATTR_REGCOUNT and fmt == EIFMT_SVAL and len(val) >= 8:
                sym, regs = struct.unpack_from("<II", val)
                regcount[sym] = regs

    cubin = Cubin(arch=arch)
    for symidx, sym in entry_syms.items():
        cubin.entries[sym] = _kernel(elf, sym, regcount.get(symidx), name)
    return cubin


def _kernel(elf: ELFFile, sym: str, registers: int | None, name: str) -> KernelInfo:
    info = elf.get_section_by_name(f".nv.info.{sym}")
    slots: dict[int, ParamSlot] = {}
    param_bytes: int | None = None
    max_threads = required = cluster = None
    if info is not None:
        where = f"{name}: .nv.info.{sym}"
        for fmt, attr, val in _records(info.data(), where):
            if attr == EIATTR_KPARAM_INFO and fmt == EIFMT_SVAL:
                if len(val) < _KPARAM.size:
                    raise CubinError(f"{where}: KPARAM_INFO record of {len(val)} bytes, expected 12")
                _, ordinal, offset, pflags = _KPARAM.unpack_from(val)
                slots[ordinal] = ParamSlot(ordinal, offset, (pflags >> 18) & 0x3FFF)
            elif attr == EIATTR_CBANK_PARAM_SIZE and fmt == EIFMT_HVAL:
                (param_bytes,) = struct.unpack_from("<H", val)
            elif attr == EIATTR_MAX_THREADS and fmt == EIFMT_SVAL:
                max_threads = _triple(val)
            elif attr == EIATTR_REQNTID and fmt == EIFMT_SVAL:
                required = _triple(val)
            elif attr == EIATTR_CTA_PER_CLUSTER and fmt == EIFMT_SVAL:
                cluster = _triple(val)
    params = [slots[k] for k in sorted(slots)]
    if param_bytes is None:
        param_bytes = max((p.offset + p.size for p in params), default=0)
    shared = elf.get_section_by_name(f".nv.shared.{sym}")
    text = elf.get_section_by_name(f".text.{sym}")
    waits = None if text is None else _has_opcode(text.data(), SASS_ACQBULK)
    return KernelInfo(
        name=sym,
        params=params,
        param_bytes=param_bytes,
        max_threads=max_threads,
        required_block=required,
        static_shared_bytes=int(shared["sh_size"]) if shared is not None else 0,
        registers=registers,
        grid_dep_wait=waits,
        cluster=cluster if cluster and all(cluster) else None,
    )


def _has_opcode(code: bytes, opcode: int) -> bool:
    """Whether any 16-byte sm_90 instruction of `code` has this 12-bit opcode."""
    n = len(code) // 16 * 16
    return any((lo & SASS_OPCODE_MASK) == opcode for lo, _ in struct.iter_unpack("<QQ", code[:n]))


def params_from_manifest(types: list[str]) -> list[ParamSlot]:
    """Lay out declared parameter types as the CUDA C ABI does.

    Each parameter is placed at the next multiple of its size (scalars: their size;
    `buffer`/`ptr`: 8 bytes).

    Raises:
        ParamTypeError: a type string is malformed (the message says which).
    """
    out: list[ParamSlot] = []
    off = 0
    for i, t in enumerate(types):
        size = parse_param_type(t).size
        off = -(-off // size) * size
        out.append(ParamSlot(i, off, size))
        off += size
    return out


def layout_problems(declared: list[ParamSlot], actual: list[ParamSlot]) -> list[tuple[int | None, str]]:
    """Like `compare_layout`, each problem paired with the param index it concerns
    (None for the count). Offsets that differ only because an earlier param's size
    differs are not reported again."""
    problems: list[tuple[int | None, str]] = []
    if len(declared) != len(actual):
        problems.append((None, f"declares {len(declared)} params, the kernel has {len(actual)}"))
    shifted = False  # after a size mismatch, later offsets differ as a consequence: not reported
    for d, a in zip(declared, actual):
        if d.size != a.size:
            shifted = True
            problems.append((d.index, f"param {d.index}: declared {d.size} bytes, the kernel's is {a.size} bytes (offset {a.offset})"))
        elif d.offset != a.offset and not shifted:
            problems.append((d.index, f"param {d.index}: declared at offset {d.offset}, the kernel's is at offset {a.offset}"))
    return problems


def compare_layout(declared: list[ParamSlot], actual: list[ParamSlot]) -> list[str]:
    """Every difference between a declared parameter layout and a cubin's.

    Returns one sentence per problem (count mismatch, then each position whose
    size differs, or whose offset differs while every earlier size agreed); an
    empty list means the layouts agree.
    """
    return [m for _, m in layout_problems(declared, actual)]
