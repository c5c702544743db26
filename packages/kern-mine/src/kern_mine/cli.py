"""``kern-mine CAPTURE_DIR [--json]`` and ``kern-mine trim IN OUT``."""

from __future__ import annotations

import argparse
import math
import sys

from kern_capture.records import CaptureError, CaptureFormatError

from . import __version__
from .args import positive_int
from .capture import load_capture
from .mine import MineOptions, mine_launches
from .reference import TokensMaxError
from .report import FAILED_CONSEQUENCE, MineReport, render_text, to_json

__all__ = ["main"]


def _gap_ms(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be > 0 ms (omit it for auto), got {text}")
    return v


def _largest_tokens(report: MineReport) -> int | None:
    return max((p.tokens for w in report.requests + report.other_windows for p in w.passes if p.tokens is not None),
               default=None)


def _mine_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="kern-mine",
        description="Mine a kern-capture directory: requests, passes, token reference, call sites, "
                    "grid/scalar expressions, pointer classes. No model knowledge is used.",
        epilog="Also: `kern-mine trim IN OUT [--max-bytes N]` writes a compact copy of a capture.",
    )
    ap.add_argument("capture", help="capture directory: the --out of `kern-capture run` (or a pid<N>/ in it), "
                                    "holding launches.jsonl or launches.jsonl.gz; or the path of either file")
    ap.add_argument("--json", action="store_true", help="print the JSON document instead of the report")
    ap.add_argument("--gap-ms", type=_gap_ms, default=None, metavar="MS",
                    help="split requests at host gaps longer than MS milliseconds (> 0; default: auto, "
                         "1000 × the median gap between launches, at least 5 ms)")
    ap.add_argument("--tokens-max", type=positive_int("a token count"), default=None, metavar="N",
                    help="claim the fitted expressions on token counts [1, N] (default: the largest token count "
                         "observed). N below that count is an error; above it, fields constant over the capture "
                         "may stay underdetermined: capture a pass at N tokens to pin them")
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    a = ap.parse_args(argv)
    try:
        cap = load_capture(a.capture)
        for warn in cap.checks.warnings("mining", FAILED_CONSEQUENCE):
            print(f"kern-mine: warning: {warn}", file=sys.stderr)
        report = mine_launches(cap.launches, a.capture, MineOptions(gap_ms=a.gap_ms, tokens_max=a.tokens_max),
                               truncated_last_line=cap.truncated_line is not None, checks=cap.checks)
    except (FileNotFoundError, CaptureError, TokensMaxError) as e:
        print(f"kern-mine: error: {e}", file=sys.stderr)
        return 2
    except CaptureFormatError as e:
        print(f"kern-mine: error: malformed capture: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # unreadable (permissions, I/O)
        print(f"kern-mine: error: {e.filename or a.capture}: {e.strerror or e}", file=sys.stderr)
        return 2
    largest = _largest_tokens(report)
    if a.tokens_max is not None and largest is not None and a.tokens_max > largest:
        print(f"kern-mine: warning: --tokens-max {a.tokens_max} is above the largest token count in the capture "
              f"({largest}): nothing pins a field constant up to {largest} beyond it (such fields may come out "
              f"underdetermined); capture a pass at {a.tokens_max} tokens", file=sys.stderr)
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
