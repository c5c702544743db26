"""`kern-verify MANIFEST [--kernels DIR] [--format human|json] [--explain CODE] [--plan [--capacity N]]`.

Exit status: 0 clean (warnings allowed), 1 manifest errors, 2 the file cannot be read
or is not JSON at all (or a usage error).
"""

from __future__ import annotations

import argparse
import os
import sys

from kern_schema import decode

from .codes import CODES, explain
from .plan import PlanError, plan
from .render import as_json, human, summary
from .verify import verify_text

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kern-verify", description="Verify a kern manifest (schema version 4).")
    p.add_argument("manifest", nargs="?", help="the manifest JSON file")
    p.add_argument("--kernels", metavar="DIR", help="also check module files (sha256) and cubin parameter tables")
    p.add_argument("--format", choices=("human", "json"), default="human")
    p.add_argument("--explain", metavar="CODE", help="describe a diagnostic code (`list` lists them all)")
    p.add_argument("--plan", action="store_true", help="print the memory plan (when the manifest verifies)")
    p.add_argument("--capacity", type=int, default=None, metavar="N",
                   help="state capacity in tokens for --plan (default: the max of var `tokens`, else 1000)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status. Output cut short by the reader (`| head`)
    ends quietly, without a BrokenPipeError traceback."""
    out: list[str] = []
    status = _main(argv, out)
    _write("".join(out))
    return status


def _write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader is gone: send what is left (and the flush at exit) to /dev/null
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
            pass


def _usage_error(message: str) -> int:
    _parser().print_usage(sys.stderr)
    print(f"kern-verify: error: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


def _main(argv: list[str] | None, out: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.explain:
        if args.explain.lower() == "list":
            out.extend(f"{c.code}  {c.severity:<7}  {c.title}\n" for c in CODES.values())
            return EXIT_OK
        try:
            out.append(explain(args.explain))
        except KeyError as e:
            print(f"kern-verify: error: {e.args[0]}", file=sys.stderr)
            return EXIT_UNREADABLE
        return EXIT_OK
    if not args.manifest:
        return _usage_error("a MANIFEST file is required (or --explain CODE)")
    if args.capacity is not None:
        if not args.plan:
            return _usage_error("--capacity sets the state capacity of --plan: add --plan, or drop --capacity")
        if args.capacity < 1:
            return _usage_error(f"--capacity must be at least 1 token, got {args.capacity}")
    if args.kernels is not None and not os.path.isdir(args.kernels):
        what = "is not a directory" if os.path.exists(args.kernels) else "does not exist"
        print(f"kern-verify: error: kernels directory {args.kernels} {what}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        with open(args.manifest, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"kern-verify: error: cannot read {args.manifest}: {e.strerror or e}", file=sys.stderr)
        return EXIT_UNREADABLE
    diags = verify_text(data, kernels_dir=args.kernels)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    manifest = None
    if not any(d.is_error for d in diags):
        manifest = decode(text)  # type: ignore[arg-type]
    n_ops = len(manifest.ops) if manifest else None
    n_calls = sum(len(p.calls) for p in manifest.programs.values()) if manifest else None
    line = summary(diags, n_ops, n_calls)
    p = None
    if manifest is not None and args.plan:
        cap = args.capacity
        if cap is None:
            tokens = manifest.vars.get("tokens")
            cap = tokens.max if tokens else 1000
        try:
            p = plan(manifest, cap)
        except PlanError as e:
            print(f"kern-verify: error: {e}", file=sys.stderr)
            return EXIT_ERRORS
    if args.format == "json":
        out.append(as_json(diags, line, p, manifest=args.manifest) + "\n")
    else:
        if diags:
            out.append(human(diags, text, args.manifest) + "\n")
        out.append(line + "\n")
        if p is not None:
            out.append("\n" + p.render() + "\n")
    if any(d.code == "E0001" for d in diags):
        return EXIT_UNREADABLE
    return EXIT_ERRORS if any(d.is_error for d in diags) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
