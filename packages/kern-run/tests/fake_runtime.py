"""A stand-in for `kern_driver.Runtime` that checks the Qwen3 caller contract.

It keeps the six input buffers at their manifest sizes (so a prefix write leaves
stale bytes behind, as on the GPU), records every call (`stage` applies its reads
before its feeds and writes, as the one launch does), and models the KV cache:
each run writes (token, position) at its slots, and attention reads slots
0..seq_lens-1, which must all hold this sequence's tokens. `decode` returns a
"next token" that depends on every token in the cache and on their order, so a
wrong chunking, position or slot changes the generated sequence.
"""

from __future__ import annotations

import numpy as np

from kern_run.generator import ManifestInfo

VOCAB = 1000
STAGE_OPS = 16  # operations per Runtime.stage launch: each feed and read one, each write one per 8 bytes


def reference_next(tokens: list[int]) -> int:
    """What `decode` returns after the cache holds `tokens` (positions 0..len-1)."""
    h = 17
    for p, t in enumerate(tokens):
        h = (h * 31 + t * (p + 7)) % 1_000_003
    return h % VOCAB


def reference_generate(prompt: list[int], steps: int) -> list[int]:
    seq = list(prompt)
    out = []
    for _ in range(steps):
        t = reference_next(seq)
        out.append(t)
        seq.append(t)
    return out


class ContractError(AssertionError):
    pass


class FakePending:
    """`kern_driver.PendingRead` of the fake: the value at enqueue time; `result()` is logged with the index
    of its read in `calls`."""

    def __init__(self, rt, value, index):
        self.rt, self.value, self.index = rt, value, index

    def result(self):
        self.rt.calls.append(("result", self.index))
        return self.value

    def done(self):
        return True


class FakeRuntime:
    def __init__(self, info: ManifestInfo, capacity: int):
        self.info = info
        self.capacity = capacity
        n = info.tokens_max
        self.bufs = {
            "token_ids": np.full(n, -1, np.int64),
            "positions": np.full(n, -1, np.int64),
            "slot_mapping": np.full(n, -1, np.int64),
            "seq_lens": np.full(1, -1, np.int32),
            "cu_seqlens_q": np.full(2, -1, np.int32),
            "block_table": np.full(info.max_pages, -1, np.int32),
        }
        self.next_token = np.zeros(1, np.int64)
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (token, position)
        self.calls: list[tuple] = []
        self.graphs: set[tuple] = set()  # (program, tokens) captured
        self.closed = False
        self.decoded = False  # a decode run has written next_token

    # -- the driver API --------------------------------------------------

    def _checked(self, name, array, prefix):
        """`array` as written to input `name`, or the contract violation (unknown input, dtype, shape)."""
        buf = self.bufs.get(name)
        if buf is None:
            raise ContractError(f"write to unknown input {name}")
        a = np.asarray(array)
        if a.dtype != buf.dtype or a.ndim != 1:
            raise ContractError(f"{name}: wrote {a.dtype}{list(a.shape)}, buffer is {buf.dtype}{list(buf.shape)}")
        if prefix and a.shape[0] > buf.shape[0] or not prefix and a.shape != buf.shape:
            raise ContractError(f"{name}: wrote {a.shape[0]} elements (prefix={prefix}) into {buf.shape[0]}")
        return a.copy()

    def _check_read(self, name):
        if name != "next_token":
            raise ContractError(f"read of unknown output {name}")
        if not self.decoded:
            raise ContractError("read of next_token before any decode run wrote it")

    def write_input(self, name, array, *, prefix=False):
        a = self._checked(name, array, prefix)
        self.bufs[name][: a.shape[0]] = a
        self.calls.append(("write", name, a, prefix))

    def run(self, program, *, graph=False, **vars):
        if set(vars) != {"tokens"}:
            raise ContractError(f"vars {sorted(vars)} != ['tokens']")
        n = vars["tokens"]
        if not 1 <= n <= self.info.tokens_max:
            raise ContractError(f"tokens={n} outside 1..{self.info.tokens_max}")
        if program == "decode" and n != 1:
            raise ContractError("decode runs with tokens=1")
        if program not in ("prefill", "decode"):
            raise ContractError(f"unknown program {program}")
        b = self.bufs
        seq_len = int(b["seq_lens"][0])
        pos = b["positions"][:n]
        if not (b["block_table"] == np.arange(self.info.max_pages)).all():
            raise ContractError("block_table is not the identity")
        if list(b["cu_seqlens_q"]) != [0, n]:
            raise ContractError(f"cu_seqlens_q {list(b['cu_seqlens_q'])} != [0, {n}]")
        if not (pos == np.arange(seq_len - n, seq_len)).all():
            raise ContractError(f"positions {pos.tolist()[:4]}... do not end at seq_lens-1 = {seq_len - 1}")
        if not (b["slot_mapping"][:n] == pos).all():
            raise ContractError("slot_mapping != positions")
        if seq_len > self.capacity:
            raise ContractError(f"seq_lens {seq_len} > capacity {self.capacity}")
        for t, p in zip(b["token_ids"][:n].tolist(), pos.tolist()):
            self.kv[p] = (t, p)
        missing = [s for s in range(seq_len) if s not in self.kv]
        if missing:
            raise ContractError(f"attention reads unwritten KV slots {missing[:4]}")
        if program == "decode":
            self.next_token[0] = reference_next([self.kv[s][0] for s in range(seq_len)])
            self.decoded = True
        if graph:
            self.graphs.add((program, n))
        self.calls.append(("run", program, graph, n))

    def read_output(self, name):
        self._check_read(name)
        self.calls.append(("read", name))
        return self.next_token.copy()

    def write_input_from(self, name, src):
        if (name, src) != ("token_ids", "next_token"):
            raise ContractError(f"write_input_from({name!r}, {src!r}): the caller feeds next_token to token_ids only")
        self.bufs["token_ids"][:1] = self.next_token
        self.calls.append(("feed", name, src))

    def read_output_async(self, name):
        self._check_read(name)
        self.calls.append(("read_async", name))
        return FakePending(self, self.next_token.copy(), len(self.calls) - 1)

    def stage(self, *, writes=None, feeds=None, reads=()):
        """`Runtime.stage`: one launch that reads (the values before anything of this launch lands), then feeds,
        then writes (prefix writes of at most STAGE_OPS * 8 bytes in all). Logged as ("stage", {name: array},
        {name: src}, (reads...)); each read's FakePending logs its result() with the stage's index."""
        writes, feeds, reads = dict(writes or {}), dict(feeds or {}), tuple(reads)
        if not (writes or feeds or reads):
            raise ContractError("stage(): nothing to stage")
        if set(writes) & set(feeds) or len(set(reads)) != len(reads):
            raise ContractError(f"stage(): a name given twice (writes {sorted(writes)}, feeds {sorted(feeds)}, "
                                f"reads {list(reads)})")
        for name, src in feeds.items():
            if (name, src) != ("token_ids", "next_token"):
                raise ContractError(f"stage(feeds={{{name!r}: {src!r}}}): "
                                    "the caller feeds next_token to token_ids only")
        for name in reads:
            self._check_read(name)
        arrays = {name: self._checked(name, a, True) for name, a in writes.items()}
        ops = len(feeds) + len(reads) + sum(-(-a.nbytes // 8) for a in arrays.values())
        if ops > STAGE_OPS:
            raise ContractError(f"stage(): {ops} operations, at most {STAGE_OPS}: write larger inputs with write_input")
        values = {name: self.next_token.copy() for name in reads}  # reads first: before the feeds and writes
        for name in feeds:
            self.bufs[name][:1] = self.next_token
        for name, a in arrays.items():
            self.bufs[name][: a.shape[0]] = a
        self.calls.append(("stage", arrays, feeds, reads))
        return {name: FakePending(self, v, len(self.calls) - 1) for name, v in values.items()}

    def synchronize(self):
        self.calls.append(("sync",))

    def describe(self):
        return "fake runtime: 2 programs"

    def close(self):
        self.closed = True

    # -- helpers for tests -------------------------------------------------

    def runs(self):
        return [c[1:] for c in self.calls if c[0] == "run"]

    def ops(self):
        """The stream operations enqueued, by kind: 'write', 'feed', 'read_async', 'stage', ('run', program)."""
        return [c[:2] if c[0] == "run" else c[0] for c in self.calls if c[0] not in ("result", "sync")]


def info(tokens_max=2048, max_pages=256, vocab=VOCAB) -> ManifestInfo:
    return ManifestInfo(tokens_max=tokens_max, max_pages=max_pages, vocab_size=vocab, rope_positions=40960)


def manifest_json(tokens_max=2048, max_pages=256, vocab=VOCAB) -> dict:
    """The part of a Qwen3 manifest the caller reads."""
    inputs = {
        "token_ids": ("i64", ["tokens"]), "positions": ("i64", ["tokens"]), "slot_mapping": ("i64", ["tokens"]),
        "seq_lens": ("i32", [1]), "cu_seqlens_q": ("i32", [2]), "block_table": ("i32", [max_pages]),
    }
    buffers = {k: {"dtype": d, "shape": s, "class": "input"} for k, (d, s) in inputs.items()}
    buffers["next_token"] = {"dtype": "i64", "shape": [1], "class": "output"}
    buffers["model.embed_tokens.weight"] = {"dtype": "bf16", "shape": [vocab, 64], "class": "weight"}
    buffers["rope.cos_sin"] = {"dtype": "f32", "shape": [40960, 128], "class": "weight"}
    return {
        "schema_version": 4, "model": "fake-qwen3",
        "vars": {"tokens": {"min": 1, "max": tokens_max}},
        "states": {}, "buffers": buffers, "modules": {}, "ops": {},
        "programs": {"prefill": {"calls": []}, "decode": {"calls": []}},
    }
