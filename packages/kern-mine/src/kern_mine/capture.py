"""Read a kern-capture directory into memory, plain or trimmed (gzip).

Records are ``kern_capture.records.LaunchRecord`` (the capture's contract).
``launches.jsonl`` is read if present, else ``launches.jsonl.gz`` (what
``kern-mine trim`` writes). A truncated last line (the target crashed while
writing it) is dropped; any other malformed line is an error. A directory
holding ``error.json`` (kern-capture writes it when the capture could not
start, e.g. another CUPTI subscriber) raises ``CaptureError`` with its content.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kern_capture.records import ERROR_FILE, LAUNCHES_FILE, CaptureError, CaptureFormatError, LaunchRecord, read_error

__all__ = ["CaptureData", "CaptureError", "load_capture", "launches_path", "capture_error_text", "GZ_SUFFIX"]

GZ_SUFFIX = ".gz"
_decoder = msgspec.json.Decoder(LaunchRecord)


@dataclass(frozen=True)
class CaptureData:
    """The launches of one capture, in record order (index = line number, 0-based)."""

    dir: Path
    source: Path
    launches: list[LaunchRecord]


def capture_error_text(err: dict) -> str:
    """One line from an ``error.json``: its message, then the error kind, code and pid."""
    msg = str(err.get("message") or "").strip() or "(no message)"
    meta = ", ".join(f"{k} {err[k]}" for k in ("error", "code", "pid") if err.get(k) is not None)
    return msg + (f" [{meta}]" if meta else "")


def launches_path(dir: str | os.PathLike[str]) -> Path:
    """``DIR/launches.jsonl``, else ``DIR/launches.jsonl.gz``.

    Raises:
        CaptureError: DIR holds ``error.json`` (the capture failed), with its content.
        FileNotFoundError: DIR does not exist, or holds neither file.
    """
    d = Path(dir)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: {'not a directory' if d.exists() else 'no such directory'}")
    err = read_error(d)
    if err is not None:
        raise CaptureError(f"{d}: the capture failed ({ERROR_FILE}): {capture_error_text(err)}")
    for name in (LAUNCHES_FILE, LAUNCHES_FILE + GZ_SUFFIX):
        if (d / name).is_file():
            return d / name
    subs = sorted(p.name for p in d.glob("pid*") if (p / LAUNCHES_FILE).is_file())
    more = f" (it holds per-process captures: {', '.join(subs[:4])}{', ...' if len(subs) > 4 else ''}; mine one of them)" if subs else ""
    raise FileNotFoundError(f"{d}: no {LAUNCHES_FILE} or {LAUNCHES_FILE}{GZ_SUFFIX}; is this a kern-capture directory?{more}")


def load_capture(dir: str | os.PathLike[str]) -> CaptureData:
    """Read every launch of a capture directory."""
    path = launches_path(dir)
    opener = gzip.open if path.name.endswith(GZ_SUFFIX) else open
    with opener(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    out: list[LaunchRecord] = []
    last = len(lines) - 1
    for lineno, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(_decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if lineno == last:  # no newline after it: a truncated write
                break
            raise CaptureFormatError(f"{path}:{lineno + 1}: {exc}") from exc
    return CaptureData(Path(dir), path, out)
