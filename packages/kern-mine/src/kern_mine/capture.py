"""Read a kern-capture directory into memory, plain or trimmed (gzip).

Records are ``kern_capture.records.LaunchRecord`` (the capture's contract).
``launches.jsonl`` is read if present, else ``launches.jsonl.gz`` (what
``kern-mine trim`` writes). A truncated last line (the target crashed while
writing it) is dropped; any other malformed line is an error.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kern_capture.records import LAUNCHES_FILE, CaptureFormatError, LaunchRecord

__all__ = ["CaptureData", "load_capture", "launches_path", "GZ_SUFFIX"]

GZ_SUFFIX = ".gz"
_decoder = msgspec.json.Decoder(LaunchRecord)


@dataclass(frozen=True)
class CaptureData:
    """The launches of one capture, in record order (index = line number, 0-based)."""

    dir: Path
    source: Path
    launches: list[LaunchRecord]


def launches_path(dir: str | os.PathLike[str]) -> Path:
    """``DIR/launches.jsonl``, else ``DIR/launches.jsonl.gz``; FileNotFoundError if neither."""
    d = Path(dir)
    for name in (LAUNCHES_FILE, LAUNCHES_FILE + GZ_SUFFIX):
        if (d / name).is_file():
            return d / name
    raise FileNotFoundError(f"{d}: no {LAUNCHES_FILE} or {LAUNCHES_FILE}{GZ_SUFFIX}; is this a kern-capture directory?")


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
