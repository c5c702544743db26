"""Streaming detokenization with the shipped Qwen tokenizer: multi-byte characters split across tokens."""

from pathlib import Path

import pytest

from kern_run.generator import KernRunError
from kern_run.stream import REPLACEMENT, TextStream, load_tokenizer

TOKENIZER = Path(__file__).resolve().parents[3] / "examples" / "tokenizer" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


TEXTS = [
    "The capital of France is Paris.",
    "naïve café — 東京タワー 🎉🎉 👩‍👩‍👧 𝔘𝔙 done",
    "多字节字符：你好，世界！",
    "  leading spaces\n\ttabs and\nnewlines  ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_the_text(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    s = TextStream(tok)
    pieces = [s.push(i) for i in ids]
    pieces.append(s.flush())
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)


def test_a_character_split_across_tokens_is_held_back(tok):
    ids = tok.encode("𝔘", add_special_tokens=False).ids  # U+1D518, 4 UTF-8 bytes
    assert len(ids) > 1  # byte-level BPE: the character spans several tokens
    # decoding token by token would print replacement characters
    assert REPLACEMENT in tok.decode(ids[:1])
    s = TextStream(tok)
    assert [s.push(i) for i in ids] == [""] * (len(ids) - 1) + ["𝔘"]


def test_flush_prints_an_incomplete_tail(tok):
    ids = tok.encode("a𝔘", add_special_tokens=False).ids
    s = TextStream(tok)
    out = "".join(s.push(i) for i in ids[:-1])
    assert out == "a"
    assert s.flush() == REPLACEMENT  # the incomplete character, shown as U+FFFD
    assert s.flush() == ""


def test_special_tokens_are_shown(tok):
    eos = tok.token_to_id("<|endoftext|>")
    s = TextStream(tok)
    assert s.push(tok.encode("Hi", add_special_tokens=False).ids[0]) == "Hi"
    assert s.push(eos) == "<|endoftext|>"


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(KernRunError, match="tokenizer not found"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(KernRunError, match="cannot load tokenizer"):
        load_tokenizer(bad)
