"""`kern-schema` command line: `kern-schema json-schema` prints the manifest JSON Schema."""

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kern-schema", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("json-schema", help="print the JSON Schema of the manifest format")
    args = parser.parse_args(argv)
    if args.cmd == "json-schema":
        sys.stdout.buffer.write(json_schema())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
