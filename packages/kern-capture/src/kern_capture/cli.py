"""``kern-capture``: build the injection library, capture a command, summarise a capture.

    kern-capture build [--force] [--cc CC]
    kern-capture run --out DIR [--eager-modules] [--buffered] [--force] -- CMD ARGS...
    kern-capture summary DIR [--json] [--max-grids N]

Exit codes of ``run``: the command's own exit code when it failed; 3 when the
capture failed (CUPTI already held by a profiler, nothing captured, ...) even
though the command succeeded; 2 for usage errors and build failures.
Exit codes of ``summary``: 0; 3 when ``DIR/error.json`` or a ``DIR/pid<N>/error.json``
says a capture failed; 2 when DIR is not a capture or a line is malformed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kern_capture import __version__
from kern_capture.build import BuildError, build_library, capture_env
from kern_capture.records import (
    ERROR_FILE,
    INFO_FILE,
    LAUNCHES_FILE,
    LAUNCHES_GZ_FILE,
    MODULES_FILE,
    Capture,
    CaptureFormatError,
    read_error,
)
from kern_capture.summary import format_summary, summarize

EXIT_USAGE = 2
EXIT_CAPTURE_FAILED = 3


def _err(msg: str) -> None:
    print(f"kern-capture: error: {msg}", file=sys.stderr)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a count >= 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is below 1; give a count >= 1")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kern-capture",
        description="Dump every loaded cubin and every kernel launch (with its parameter bytes) "
        "of an unmodified CUDA program, through a CUPTI injection library.",
    )
    p.add_argument("--version", action="version", version=f"kern-capture {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    b = sub.add_parser("build", help="build (or find in the cache) the injection library and print its path")
    b.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    b.add_argument("--cc", help="C compiler (default: $CC, cc, gcc, clang)")
    b.add_argument("-v", "--verbose", action="store_true", help="print the compiler command")

    r = sub.add_parser(
        "run",
        help="run a command with the injection library and write its capture to --out",
        usage="kern-capture run --out DIR [--eager-modules] [--buffered] [--force] -- CMD [ARGS...]",
    )
    r.add_argument("--out", required=True, metavar="DIR", help="capture directory (created)")
    r.add_argument("--eager-modules", action="store_true",
                   help="set CUDA_MODULE_LOADING=EAGER: every module of every library is loaded (and dumped) "
                   "at start, not only those that launch")
    r.add_argument("--buffered", action="store_true",
                   help="buffer launch records (faster; the last ~100 ms are lost if the command is killed)")
    r.add_argument("--force", action="store_true", help="replace an existing capture in DIR")
    r.add_argument("--cc", help="C compiler for the build (default: $CC, cc, gcc, clang)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")

    s = sub.add_parser("summary", help="per-kernel launch counts, grids and ABI flatness of a capture")
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--max-grids", type=_positive_int, default=6, metavar="N",
                   help="distinct grids shown per kernel (>= 1, default 6)")
    return p


def _is_capture_file(p: Path) -> bool:
    n = p.name
    if p.is_dir():
        return n.startswith("pid") and n[3:].isdigit()
    return n in (LAUNCHES_FILE, LAUNCHES_GZ_FILE, MODULES_FILE, ERROR_FILE, INFO_FILE) or n.startswith("module_")


def _prepare_out(out: Path, force: bool) -> str | None:
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a directory"
    if out.is_dir():
        entries = list(out.iterdir())
        if entries:
            if not force:
                return f"--out {out}: directory is not empty (use --force to replace a previous capture)"
            foreign = [e.name for e in entries if not _is_capture_file(e)]
            if foreign:
                return (f"--out {out}: holds files that are not a capture ({', '.join(sorted(foreign)[:5])}); "
                        "refusing to delete them")
            for e in entries:
                if e.is_dir():
                    shutil.rmtree(e)
                else:
                    e.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return None


def _capture_errors(out: Path) -> list[str]:
    errs = []
    for d in [out, *sorted(p for p in out.glob("pid*") if p.is_dir())]:
        e = read_error(d)
        if e is not None:
            errs.append(f"{d}: {e.get('message', e)}")
    return errs


def _cuda_driver_loadable() -> bool:
    """Whether libcuda (the NVIDIA driver's CUDA library) can be loaded on this machine."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def cmd_build(args: argparse.Namespace) -> int:
    try:
        path = build_library(force=args.force, cc=args.cc, verbose=args.verbose)
    except BuildError as exc:
        _err(str(exc))
        return EXIT_USAGE
    print(path)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _err("no command given; usage: kern-capture run --out DIR -- CMD [ARGS...]")
        return EXIT_USAGE
    out = Path(args.out)
    problem = _prepare_out(out, args.force)
    if problem:
        _err(problem)
        return EXIT_USAGE
    try:
        lib = build_library(cc=args.cc)
    except BuildError as exc:
        _err(str(exc))
        return EXIT_USAGE
    env = capture_env(lib, out, eager_modules=args.eager_modules, buffered=args.buffered)
    try:
        proc = subprocess.run(command, env=env)
    except FileNotFoundError:
        _err(f"command not found: {command[0]}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    errors = _capture_errors(out)
    for e in errors:
        _err(f"capture failed: {e}")
    captured = (out / INFO_FILE).exists()
    if not captured:
        hint = "" if _cuda_driver_loadable() else " (is there a CUDA driver on this machine? libcuda cannot be loaded)"
        _err(f"nothing captured: {command[0]} never initialised CUDA (no cuInit), "
             f"or the driver ignored CUDA_INJECTION64_PATH{hint}")
        errors.append("nothing captured")
    if proc.returncode != 0:
        tail = f"; the capture in {out} holds what ran before that" if captured else ""
        print(f"kern-capture: the command exited with {proc.returncode}{tail}", file=sys.stderr)
        return proc.returncode if proc.returncode > 0 else 128 - proc.returncode
    return EXIT_CAPTURE_FAILED if errors else 0


def cmd_summary(args: argparse.Namespace) -> int:
    try:
        cap = Capture.open(args.dir, allow_error=True)
        s = summarize(cap)
    except FileNotFoundError as exc:
        _err(str(exc))
        return EXIT_USAGE
    except CaptureFormatError as exc:
        _err(f"malformed capture: {exc}")
        return EXIT_USAGE
    rc = EXIT_CAPTURE_FAILED if s.failed else 0
    for w in s.warnings():
        print(f"kern-capture: warning: {w}", file=sys.stderr)
    text = json.dumps(s.to_json(), indent=1) if args.json else format_summary(s, max_grids=args.max_grids)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly; point stdout at /dev/null so the
        # interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return {"build": cmd_build, "run": cmd_run, "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
