"""`kern-schema` command line: `kern-schema json-schema` prints the manifest JSON Schema;
`kern-schema` alone lists the commands (exit status 2, a usage error)."""

from __future__ import annotations

import argparse
import sys

import msgspec

from .manifest import Manifest


def json_schema() -> bytes:
    """JSON Schema (draft 2020-12, derived by msgspec) of the manifest format, indented."""
    schema = msgspec.json.schema(Manifest)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kern manifest, schema version 4"
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


COMMANDS = {"json-schema": "print the manifest format's JSON Schema (for editors and validators)"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kern-schema",
        description="The kern manifest format (schema version 4).",
        epilog="example: kern-schema json-schema > manifest.schema.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", title="commands",
                                help="one of: " + ", ".join(COMMANDS))
    for c, h in COMMANDS.items():
        sub.add_parser(c, help=h, description=h[0].upper() + h[1:] + ".")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status. With no command, like any usage error, it
    exits (SystemExit 2) after printing the usage and each command with a one-line
    description on stderr."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_usage(sys.stderr)
        print("\nThe kern manifest format (schema version 4). Commands:", file=sys.stderr)
        for c, h in COMMANDS.items():
            print(f"  {c:<12}  {h}", file=sys.stderr)
        parser.exit(2, "\nRun `kern-schema COMMAND --help` for a command's options.\n")
    if args.cmd == "json-schema":
        sys.stdout.buffer.write(json_schema())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
