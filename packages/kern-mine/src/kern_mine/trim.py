"""``kern-mine trim IN OUT [--max-bytes N]``: a compact copy of a capture, for fixtures.

Writes ``OUT/launches.jsonl.gz`` (gzip, the launches with the optional fields
mining never reads removed: ``func``, ``num_regs``, ``static_shared_mem``,
``result`` when 0 (a failed launch keeps its non-zero ``result``); ``extra_hex`` is kept: the pointers
of library GEMMs are in it), copies ``modules.jsonl`` and
``capture.json`` when present, and drops the module binaries. ``OUT`` is a new or empty directory, or
the output of an earlier trim (replaced); it may not be the input's directory nor hold an untrimmed
capture (its ``launches.jsonl`` would be read before the trimmed file, and its module files would no
longer match the copied ``modules.jsonl``). When the
result is larger than ``--max-bytes``, the windows without any regular pass
(compilation, autotuning) are dropped too; if it is still too large, nothing
is written and the exit status is 1. Launch ``seq`` and ``t_ns`` are kept, so
a trimmed capture mines like the original.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
from kern_capture.records import (ERROR_FILE, INFO_FILE, LAUNCHES_FILE, MODULES_FILE, CaptureError, CaptureFormatError,
                                  LaunchRecord)

from .args import positive_int
from .capture import GZ_SUFFIX, launches_path, load_capture

__all__ = ["trim", "trim_main", "DROPPED_FIELDS", "TrimOutputError"]

DROPPED_FIELDS = ("func", "num_regs", "static_shared_mem", "result")  # `result` only when 0 (success)
_enc = msgspec.json.Encoder()
#: What an untrimmed capture (or a failed one) holds that a trim's output never does.
_CAPTURE_ONLY = (LAUNCHES_FILE, ERROR_FILE, "module_*", "pid*")


class TrimOutputError(Exception):
    """OUT cannot receive the trimmed capture (a file, the input itself, another capture)."""


def _check_output(cap_dir: Path, dst: str | Path) -> Path:
    out = Path(dst)
    if out.exists() and not out.is_dir():
        raise TrimOutputError(f"{out}: exists and is not a directory; give a new or empty directory for OUT")
    if out.is_dir():
        if out.resolve() == cap_dir.resolve():
            raise TrimOutputError(f"{out}: OUT is the capture being trimmed; give another directory "
                                  f"(e.g. {out.resolve().parent / (out.resolve().name + '-trimmed')})")
        found = sorted({p.name for pat in _CAPTURE_ONLY for p in out.glob(pat)})
        if found:
            listed = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            raise TrimOutputError(f"{out}: holds an untrimmed capture ({listed}); trimming into it would mix "
                                  f"two captures (its {LAUNCHES_FILE} is read before {LAUNCHES_FILE}{GZ_SUFFIX}); "
                                  "give a new or empty directory, or remove that capture first")
    return out


def _encode(launches: list[LaunchRecord]) -> bytes:
    out = bytearray()
    for r in launches:
        d = msgspec.structs.asdict(r)
        for k in DROPPED_FIELDS:
            if k != "result" or not d.get(k):  # a failed launch keeps its CUresult
                d.pop(k, None)
        if d.get("extra_hex") is None:
            d.pop("extra_hex", None)
        d["params"] = None if r.params is None else [
            {"offset": p.offset, "size": p.size, "hex": p.hex,
             "alloc": None if p.alloc is None else {"base": p.alloc.base, "size": p.alloc.size}, "host": p.host}
            for p in r.params
        ]
        out += _enc.encode(d) + b"\n"
    return gzip.compress(bytes(out), compresslevel=9, mtime=0)


def trim(src: str | Path, dst: str | Path, max_bytes: int | None = None,
         warn: Callable[[str], None] | None = None) -> tuple[int, int, str]:
    """Trim ``src`` into ``dst``; returns (launches kept, bytes written, what was done).

    ``src`` is a capture directory or its launches file (``load_capture``); ``warn`` is called with
    each line of the file's warnings (a truncated last line dropped, failed launches, seq, pid, time:
    ``kern_capture.checks``)."""
    if isinstance(dst, str) and not dst.strip():
        raise FileNotFoundError(f"empty output directory argument {dst!r}")
    out = _check_output(launches_path(src).parent, dst)  # before the (long) read
    cap = load_capture(src)
    if warn is not None:
        for w in cap.checks.warnings("trimming"):
            warn(w)
    launches = cap.launches
    data = _encode(launches)
    done = "optional fields removed"
    if max_bytes is not None and len(data) > max_bytes:
        from .mine import mine_launches

        report = mine_launches(launches, str(src))
        keep = []
        for w in report.requests + report.other_windows:
            if any(p.regular for p in w.passes):
                keep.append(w.launches)
        launches = [r for a, b in sorted(keep) for r in launches[a:b]]
        data = _encode(launches)
        done += f"; {len(report.requests) + len(report.other_windows) - len(keep)} window(s) without a regular pass dropped"
        if len(data) > max_bytes:
            raise ValueError(f"trimmed capture is {len(data)} bytes, over --max-bytes {max_bytes}")
    out.mkdir(parents=True, exist_ok=True)
    (out / (LAUNCHES_FILE + GZ_SUFFIX)).write_bytes(data)
    for name in (MODULES_FILE, INFO_FILE):
        if (cap.dir / name).is_file():
            shutil.copyfile(cap.dir / name, out / name)
        else:  # an earlier trim's copy would describe another capture
            (out / name).unlink(missing_ok=True)
    return len(launches), len(data), done


def trim_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kern-mine trim", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", metavar="IN", help="capture directory (or its launches.jsonl[.gz])")
    ap.add_argument("dst", metavar="OUT", help="output directory: new, empty, or an earlier trim's output (replaced)")
    ap.add_argument("--max-bytes", type=positive_int("bytes"), default=None, metavar="N",
                    help="fail when the result is larger than N bytes (>= 1)")
    a = ap.parse_args(argv)
    try:
        n, size, done = trim(a.src, a.dst, a.max_bytes,
                             warn=lambda w: print(f"kern-mine trim: warning: {w}", file=sys.stderr))
    except (FileNotFoundError, CaptureError, TrimOutputError) as e:
        print(f"kern-mine trim: error: {e}", file=sys.stderr)
        return 2
    except CaptureFormatError as e:
        print(f"kern-mine trim: error: malformed capture: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"kern-mine trim: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # OUT not writable, a path component a file, ...
        print(f"kern-mine trim: error: {e.filename or a.dst}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"{a.dst}: {n} launches, {size} bytes ({done})")
    return 0
