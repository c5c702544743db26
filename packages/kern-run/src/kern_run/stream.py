"""Streaming detokenization that is correct across multi-byte UTF-8 and BPE boundaries.

A byte-level BPE token can end in the middle of a UTF-8 character (one emoji or
CJK character often spans two or three tokens), so decoding tokens one by one
prints replacement characters. Instead, decode the growing id list and print
only the new suffix, holding it back while it ends in an incomplete character
(U+FFFD). To keep each step O(1), the decoded window starts a few tokens back
(at the last point where text was emitted) instead of at the first token.
"""

from __future__ import annotations

__all__ = ["TextStream", "load_tokenizer"]

REPLACEMENT = "\ufffd"


class TextStream:
    """``push(id) -> new text`` (possibly ""), ``flush() -> the rest`` at the end."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # window start: text before it has been emitted
        self._read = 0  # ids[_prefix:_read] decode to text already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        done = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        if len(text) > len(done) and not text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(done) :]
        return ""

    def flush(self) -> str:
        """Whatever is held back (an incomplete character prints as U+FFFD)."""
        done = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(done) :]


def load_tokenizer(path):
    """A `tokenizers.Tokenizer` from a tokenizer.json, or KernRunError with one line."""
    from pathlib import Path

    from .generator import KernRunError

    path = Path(path)
    if not path.is_file():
        raise KernRunError(f"tokenizer not found: {path}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise KernRunError("the `tokenizers` package is not installed (pip install tokenizers)") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise KernRunError(f"cannot load tokenizer {path}: {str(e).splitlines()[0]}") from None
