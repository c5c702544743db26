"""Read a kern-capture directory into memory, plain or trimmed (gzip).

Records are ``kern_capture.records.LaunchRecord`` (the capture's contract).
``launches.jsonl`` is read if present, else ``launches.jsonl.gz`` (what
``kern-mine trim`` writes); a path to either file is accepted too (its
directory is the capture). A truncated last line (the target crashed while
writing it) is dropped and reported (``CaptureData.truncated_line``); any
other malformed line, an impossible record (negative grid, block or shared
memory: ``LaunchRecord``), and a gzip file that is cut short or damaged, is a
``CaptureFormatError``. What is suspicious (failed launches, seq not
increasing, a second pid, time going back within a thread) is counted in
``CaptureData.checks`` (``kern_capture.checks``, shared with ``kern-capture
summary``). A directory holding ``error.json`` (kern-capture
writes it when the capture could not start, e.g. another CUPTI subscriber)
raises ``CaptureError`` with its content; a launches file without a launch,
``NoLaunchesError``.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from kern_capture.checks import CaptureChecks, LaunchChecker
from kern_capture.records import ERROR_FILE, LAUNCHES_FILE, CaptureError, CaptureFormatError, LaunchRecord, read_error

__all__ = ["CaptureData", "CaptureError", "NoLaunchesError", "load_capture", "launches_path", "capture_error_text",
           "GZ_SUFFIX", "FIX_MISSING"]

GZ_SUFFIX = ".gz"
GZ_MAGIC = b"\x1f\x8b"
FIX_MISSING = "pass the --out directory of `kern-capture run` (or a pid<N>/ inside it)"
_decoder = msgspec.json.Decoder(LaunchRecord)
_LAUNCH_NAMES = (LAUNCHES_FILE, LAUNCHES_FILE + GZ_SUFFIX)


class NoLaunchesError(CaptureError):
    """The launches file holds no launch record (nothing to mine)."""


@dataclass(frozen=True)
class CaptureData:
    """The launches of one capture, in record order (index = line number, 0-based).

    ``truncated_line``: the 1-based number of the last line when it was cut short
    (no newline, not a record: the target crashed or was still writing) and dropped;
    None when the file ended cleanly. ``checks``: what reading the file noticed
    (``kern_capture.checks``)."""

    dir: Path
    source: Path
    launches: list[LaunchRecord]
    truncated_line: int | None = None
    checks: CaptureChecks = field(default_factory=CaptureChecks)

    def truncation_warning(self) -> str | None:
        """One line saying which line was dropped (None when none was)."""
        if self.truncated_line is None:
            return None
        return CaptureChecks(str(self.source), len(self.launches), self.truncated_line).truncation_warning("mining")


def capture_error_text(err: dict) -> str:
    """One line from an ``error.json``: its message, then the error kind, code and pid."""
    msg = str(err.get("message") or "").strip() or "(no message)"
    meta = ", ".join(f"{k} {err[k]}" for k in ("error", "code", "pid") if err.get(k) is not None)
    return msg + (f" [{meta}]" if meta else "")


def launches_path(dir: str | os.PathLike[str]) -> Path:
    """``DIR/launches.jsonl``, else ``DIR/launches.jsonl.gz``; or DIR itself when it is such a file.

    Raises:
        CaptureError: DIR holds ``error.json`` (the capture failed), with its content.
        FileNotFoundError: DIR is empty (``""``), does not exist, is another file, or holds
            neither file (the message says what to pass instead).
    """
    if isinstance(dir, str) and not dir.strip():
        raise FileNotFoundError(f"empty capture directory argument {dir!r}; {FIX_MISSING}")
    d = Path(dir)
    if d.is_file():
        if d.name in _LAUNCH_NAMES:
            return d
        raise FileNotFoundError(f"{d}: a file, not a capture directory; pass its directory ({d.parent}) "
                                f"or a {LAUNCHES_FILE}[{GZ_SUFFIX}] file")
    if not d.is_dir():
        what = "not a directory" if d.exists() else "no such directory"
        raise FileNotFoundError(f"{d}: {what}; {FIX_MISSING}")
    err = read_error(d)
    if err is not None:
        raise CaptureError(f"{d}: the capture failed ({ERROR_FILE}): {capture_error_text(err)}")
    for name in _LAUNCH_NAMES:
        if (d / name).is_file():
            return d / name
    subs = sorted(p.name for p in d.glob("pid*") if any((p / n).is_file() for n in _LAUNCH_NAMES))
    none = f"{d}: no {LAUNCHES_FILE} or {LAUNCHES_FILE}{GZ_SUFFIX}"
    if subs:
        listed = ", ".join(subs[:4]) + (", ..." if len(subs) > 4 else "")
        raise FileNotFoundError(f"{none} (it holds per-process captures: {listed}; mine one of them, "
                                f"e.g. {d / subs[0]})")
    raise FileNotFoundError(f"{none}; is this a kern-capture directory? {FIX_MISSING}")


def _read_gzip(path: Path) -> bytes:
    """The decompressed content; a cut short or damaged file is a one-line ``CaptureFormatError``."""
    fix = "copy it again (or trim the original capture again)"
    with open(path, "rb") as raw:
        head = raw.read(2)
        if not head:
            return b""  # an empty file: no launch (NoLaunchesError)
        if head != GZ_MAGIC:
            why = (f"plain JSON lines, not gzip: rename it to {LAUNCHES_FILE}" if head[:1] == b"{" else
                   f"not gzip data (damaged?); {fix}")
            raise CaptureFormatError(f"{path}: {why}")
        raw.seek(0)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                return f.read()
        except EOFError:
            raise CaptureFormatError(f"{path}: truncated gzip stream (file cut short?); {fix}") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise CaptureFormatError(f"{path}: corrupt gzip data ({exc}); {fix}") from None


def load_capture(dir: str | os.PathLike[str]) -> CaptureData:
    """Read every launch of a capture directory (or of a ``launches.jsonl[.gz]`` file).

    Raises:
        FileNotFoundError, CaptureError: see ``launches_path``.
        CaptureFormatError: a malformed line (not the last), or a damaged gzip file.
        NoLaunchesError: the file holds no complete launch record.
    """
    path = launches_path(dir)
    data = _read_gzip(path) if path.name.endswith(GZ_SUFFIX) else path.read_bytes()
    lines = data.split(b"\n")
    out: list[LaunchRecord] = []
    last = len(lines) - 1
    truncated = None
    checker = LaunchChecker(path)
    for lineno, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = _decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # no newline after it and not complete JSON (a valid JSON line that is no valid record,
            # e.g. a negative grid, is an error wherever it is): a truncated write
            if lineno == last and not isinstance(exc, msgspec.ValidationError):
                truncated = lineno + 1
                checker.truncated(truncated)
                break
            hint = (f" (gzip data: rename it to {LAUNCHES_FILE}{GZ_SUFFIX})"
                    if lineno == 0 and data[:2] == GZ_MAGIC else "")
            raise CaptureFormatError(f"{path}:{lineno + 1}: {exc}{hint}") from exc
        out.append(rec)
        checker.add(rec, lineno + 1)
    cap = CaptureData(path.parent, path, out, truncated, checker.result())
    if not out:
        why = (f"its only line, line {truncated}, is cut short (the target crashed or was still writing?)"
               if truncated else "the file is empty (the target launched no kernel, or it was cut short)")
        raise NoLaunchesError(f"{path}: no launch to mine: {why}")
    return cap
