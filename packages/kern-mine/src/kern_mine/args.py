"""argparse value types shared by kern-mine's commands."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_int(unit: str) -> Callable[[str], int]:
    """An argparse `type` for an integer ≥ 1 counted in `unit` (named in its error, e.g. "bytes", "a token count").

    The returned function raises argparse.ArgumentTypeError for text that is not an integer or is below 1.
    """

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"must be >= 1 ({unit}), got {n}")
        return n

    return parse
