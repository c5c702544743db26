"""``kern-mine CAPTURE_DIR [--json]`` and ``kern-mine trim IN OUT``."""

from __future__ import annotations

import argparse
import sys

from kern_capture.records import CaptureError, CaptureFormatError

from .mine import MineOptions, mine
from .report import render_text, to_json

__all__ = ["main"]


def _mine_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="kern-mine",
        description="Mine a kern-capture directory: requests, passes, token reference, call sites, "
                    "grid/scalar expressions, pointer classes. No model knowledge is used.",
        epilog="Also: `kern-mine trim IN OUT [--max-bytes N]` writes a compact copy of a capture.",
    )
    ap.add_argument("capture", help="capture directory (launches.jsonl or launches.jsonl.gz)")
    ap.add_argument("--json", action="store_true", help="print the JSON document instead of the report")
    ap.add_argument("--gap-ms", type=float, default=None,
                    help="split requests at host gaps longer than this (default: auto, ≥ 5 ms)")
    ap.add_argument("--tokens-max", type=int, default=None,
                    help="claim fits on tokens in [1, N] (default: the largest token count observed)")
    a = ap.parse_args(argv)
    try:
        report = mine(a.capture, MineOptions(gap_ms=a.gap_ms, tokens_max=a.tokens_max))
    except (FileNotFoundError, CaptureError) as e:
        print(f"kern-mine: error: {e}", file=sys.stderr)
        return 2
    except CaptureFormatError as e:
        print(f"kern-mine: error: malformed capture: {e}", file=sys.stderr)
        return 1
    if a.json:
        sys.stdout.buffer.write(to_json(report) + b"\n")
    else:
        sys.stdout.write(render_text(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trim"]:
        from .trim import trim_main

        return trim_main(argv[1:])
    return _mine_main(argv)


if __name__ == "__main__":
    sys.exit(main())
