"""The Qwen3 caller contract: chunked prefill, then one `decode` per token, greedy on the GPU.

The manifest (tools/README.md, "The provider contract") declares two programs:

- ``prefill`` (var ``tokens`` = chunk length, at most the manifest's ``tokens`` max):
  writes the chunk's K/V into the paged ``kv`` state and nothing else;
- ``decode`` (``tokens`` = 1): writes the token's K/V, attends over the cache and
  leaves the greedy next token in the output ``next_token`` (i64 [1]).

Inputs, written before each run: ``token_ids``, ``positions``, ``slot_mapping``
(i64 [tokens]; slot = position), ``seq_lens`` (i32 [1], tokens in the cache after
this run), ``cu_seqlens_q`` (i32 [2] = [0, tokens]) and ``block_table`` (i32
[max_pages], the identity: one sequence owns every page, written once).

A generation of N new tokens from a prompt p[0..n-1]:

    prefill p[0 .. n-2] in chunks           (KV only, no logits)
    t = decode(p[n-1], position n-1)        -> first new token
    repeat N-1 times: t = decode(t, next position)

Only the 8-byte ``next_token`` comes back per step, and nothing waits for it before
the next step is enqueued. Between two decode runs there is one stream operation, a
``Runtime.stage`` launch (kern-driver >= 0.7): it reads step n's ``next_token`` into
pinned host memory, feeds it to ``token_ids`` on the device and writes step n + 1's
``positions``, ``slot_mapping`` and ``seq_lens`` as kernel parameters; the host then
collects step n's token while the GPU runs step n + 1. (Five separate copies did the
same before, ~18–20 µs per token between the graphs on the H200/H100; the one launch
+4.9 µs on the H200: tools/gpu/staging_probe.py; 4B 2.368 → 2.354 ms/token.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # kern_run does not import kern_driver (the caller passes the runtime)
    from kern_driver import PendingRead

__all__ = [
    "GenerationStats",
    "KernRunError",
    "ManifestInfo",
    "Qwen3Session",
    "StepToken",
    "check_request",
    "generate",
]

PAGE_TOKENS = 16  # tokens per KV page (tools/README.md: the provider's paged layout)

INPUTS = ("token_ids", "positions", "slot_mapping", "seq_lens", "cu_seqlens_q", "block_table")


class KernRunError(Exception):
    """A caller-side error with a one-line message meant for the user."""


@dataclass(frozen=True)
class ManifestInfo:
    """What the caller needs from a Qwen3 manifest (read from its JSON, nothing else)."""

    tokens_max: int  # largest chunk one `prefill` run takes (the `tokens` var max)
    max_pages: int  # length of `block_table`
    vocab_size: int | None = None  # rows of the embedding table, when declared
    rope_positions: int | None = None  # rows of `rope.cos_sin`, when declared
    model: str = ""

    @property
    def max_positions(self) -> int:
        """Positions the manifest can address: pages in the block table, rows of the rotary table."""
        n = self.max_pages * PAGE_TOKENS
        return min(n, self.rope_positions) if self.rope_positions else n

    @classmethod
    def from_json(cls, doc: dict, *, source: str = "manifest") -> ManifestInfo:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise KernRunError(f"{source}: not a Qwen3 caller manifest: {what}")

        need(isinstance(doc, dict), "top level is not an object")
        programs = doc.get("programs") or {}
        buffers = doc.get("buffers") or {}
        vars_ = doc.get("vars") or {}
        need("prefill" in programs and "decode" in programs, "needs programs `prefill` and `decode`")
        need("tokens" in vars_, "needs the var `tokens`")
        missing = [b for b in (*INPUTS, "next_token") if b not in buffers]
        need(not missing, "missing buffers " + ", ".join(f"`{b}`" for b in missing))
        need(buffers["next_token"].get("class") == "output", "`next_token` must be an output")
        bt_shape = buffers["block_table"].get("shape") or []
        need(len(bt_shape) == 1 and isinstance(bt_shape[0], int), "`block_table` must have a fixed shape [max_pages]")

        def rows(name: str) -> int | None:
            b = buffers.get(name)
            shape = (b or {}).get("shape") or []
            return shape[0] if shape and isinstance(shape[0], int) else None

        return cls(
            tokens_max=int(vars_["tokens"]["max"]),
            max_pages=int(bt_shape[0]),
            vocab_size=rows("model.embed_tokens.weight"),
            rope_positions=rows("rope.cos_sin"),
            model=str(doc.get("model", "")),
        )

    @classmethod
    def read(cls, path: str | Path) -> ManifestInfo:
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise KernRunError(f"manifest not found: {path}") from None
        except json.JSONDecodeError as e:
            raise KernRunError(f"manifest {path} is not JSON: {e.msg} at line {e.lineno} column {e.colno} "
                               "(is it the manifest file? `kern-verify` checks one)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise KernRunError(f"cannot read manifest {path}: {e}") from None
        return cls.from_json(doc, source=str(path))


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prefill_chunks: list[int] = field(default_factory=list)  # length of each prefill run
    prefill_s: float = 0.0  # prompt start to first new token on the host (the TTFT)
    decode_steps: int = 0  # decode runs after the first new token
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_ms_per_token(self) -> float:
        return 1e3 * self.decode_s / self.decode_steps if self.decode_steps else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else 0.0


def check_request(info: ManifestInfo, capacity: int, prompt_ids: Sequence[int], steps: int) -> None:
    """Refuse, with one line, what the manifest and the KV capacity cannot serve."""
    if len(prompt_ids) == 0:
        raise KernRunError("the prompt is empty: give at least one token")
    if steps < 1:
        raise KernRunError(f"--steps must be >= 1 (got {steps})")
    v = info.vocab_size
    if v is not None:
        bad = [t for t in prompt_ids if not 0 <= t < v]
        if bad:
            raise KernRunError(f"prompt token id {bad[0]} is out of range for this model's vocabulary (0..{v - 1})")
    capacity = min(capacity, info.max_positions)
    need = len(prompt_ids) + steps
    if need > capacity:
        raise KernRunError(
            f"prompt ({len(prompt_ids)} token{'s' * (len(prompt_ids) != 1)}) + steps ({steps}) = {need} tokens "
            f"exceeds the capacity of "
            f"{capacity} tokens (raise --capacity, at most {info.max_positions} for this manifest)"
        )


class StepToken:
    """The greedy token of one decode step (`Qwen3Session.enqueue_decode`), read back when first needed.

    The read is the next step's stage read (`Runtime.stage(reads=("next_token",))`) when that step is
    enqueued first; otherwise `result()` or `done()` enqueues `Runtime.read_output_async("next_token")`
    when called (nothing was enqueued since the step's run, so it reads that step's output). Either way it
    is a `kern_driver.PendingRead`: `result()` waits for it (for the GPU to finish the step) and returns
    an i64 array of shape [1], the same array on every call; `done()` is True when `result()` would not wait.

    Raises (result, done): KernDriverError from the read (a launch before it failed, the runtime closed).
    """

    __slots__ = ("_rt", "_read")

    def __init__(self, rt):
        self._rt = rt
        self._read: PendingRead | None = None

    @property
    def bound(self) -> bool:
        """True once a read of this step's `next_token` is enqueued."""
        return self._read is not None

    def bind(self, read: PendingRead | None = None) -> PendingRead:
        """Attach `read` (a stage's read of this step's `next_token`), or, with None, enqueue one now; a
        token already bound keeps its read."""
        if self._read is None:
            self._read = read if read is not None else self._rt.read_output_async("next_token")
        return self._read

    def result(self) -> np.ndarray:
        return self.bind().result()

    def done(self) -> bool:
        return self.bind().done()

    def __repr__(self) -> str:
        return f"<StepToken {self._read!r}>" if self._read is not None else "<StepToken unread>"


class Qwen3Session:
    """One sequence on a loaded `kern_driver.Runtime` running a Qwen3 manifest.

    ``capacity`` is the token capacity the runtime was loaded with (its KV state
    holds that many tokens); ``graph`` replays `decode` (and full-length prefill
    chunks) as CUDA graphs; ``pipeline`` (default) lets `generate` enqueue each decode
    step before the caller has the previous token, so a caller that reads other GPU
    state per step (the logits buffer) must pass ``pipeline=False``.
    """

    def __init__(self, rt, info: ManifestInfo, *, capacity: int, graph: bool = True, pipeline: bool = True):
        self.rt = rt
        self.info = info
        self.graph = graph
        self.pipeline = pipeline
        self.capacity = min(capacity, info.max_positions)
        self.stats = GenerationStats()
        # The one sequence owns every page, in order: slot s lives in page s // 16.
        rt.write_input("block_table", np.arange(info.max_pages, dtype=np.int32))
        # Per-step host arrays, updated in place (no allocation in the decode loop).
        self._token = np.zeros(1, np.int64)
        self._pos = np.zeros(1, np.int64)
        self._seq_len = np.zeros(1, np.int32)
        self._cu_decode = np.array([0, 1], np.int32)
        self._fed: int | None = None  # position whose token the device's next_token holds (the last step's + 1)
        self._last: StepToken | None = None  # the last decode step's token, while nothing has read it yet

    # -- checks ------------------------------------------------------------

    def clamp_chunk(self, chunk: int) -> int:
        if chunk < 1:
            raise KernRunError(f"--chunk must be >= 1 (got {chunk})")
        return min(chunk, self.info.tokens_max)

    def check(self, prompt_ids: Sequence[int], steps: int) -> None:
        check_request(self.info, self.capacity, prompt_ids, steps)

    # -- the two programs --------------------------------------------------

    def prefill(self, ids: Sequence[int], chunk: int, start: int = 0) -> None:
        """Write the K/V of `ids` (positions start, start+1, ...) chunk by chunk; computes no logits.

        Full-length chunks replay one captured graph (tokens=chunk); the shorter
        remainder runs eagerly, since a graph is captured per var value.
        """
        chunk = self.clamp_chunk(chunk)
        rt = self.rt
        self._read_last()  # before a run that might rewrite next_token (a step abandoned unread: early stop)
        self._fed = None  # prefill rewrites the sequence: no decode step's next_token follows it
        for lo in range(0, len(ids), chunk):
            n = min(chunk, len(ids) - lo)
            positions = np.arange(start + lo, start + lo + n, dtype=np.int64)
            rt.write_input("token_ids", np.asarray(ids[lo : lo + n], dtype=np.int64), prefix=True)
            rt.write_input("positions", positions, prefix=True)
            rt.write_input("slot_mapping", positions, prefix=True)  # slot = position
            rt.write_input("seq_lens", np.array([start + lo + n], np.int32))
            rt.write_input("cu_seqlens_q", np.array([0, n], np.int32))
            rt.run("prefill", graph=self.graph and n == chunk, tokens=n)
            self.stats.prefill_chunks.append(n)

    def begin_decode(self) -> None:
        """Set the input that stays constant across decode steps (after any prefill)."""
        self.rt.write_input("cu_seqlens_q", self._cu_decode)

    def stage_position(self, position: int) -> None:
        """Write the position inputs of a decode step at `position` (slot = position) with `write_input`
        (three host-to-device copies), for a caller that runs the `decode` program itself
        (tools/gpu/step_gap_probe.py); `enqueue_decode` writes them in its own stage and does not need this."""
        self._pos[0] = position
        self._seq_len[0] = position + 1
        self.rt.write_input("positions", self._pos, prefix=True)
        self.rt.write_input("slot_mapping", self._pos, prefix=True)
        self.rt.write_input("seq_lens", self._seq_len)

    def enqueue_decode(self, position: int, token: int | None = None) -> StepToken:
        """Enqueue one decode step at `position` and return its greedy token as a `StepToken`
        (`.result()[0]` is the token, an int64) without waiting for the GPU.

        Two stream operations: one `Runtime.stage` launch, then the `decode` run. The stage writes
        `positions = slot_mapping = [position]` and `seq_lens = [position + 1]` as kernel parameters, and
        the step's token: `token` from the host, or, when None, the previous step's `next_token` copied on
        the device (that step must have been enqueued at `position - 1`). If the previous step's token has
        not been read yet, the same stage reads it back (its reads see `next_token` before this step's run
        rewrites it), so the pipelined loop collects step n's token while the GPU runs step n + 1, with one
        launch between the graphs instead of five copies (+4.9 vs +19.5 µs per 4B token on the H200:
        tools/gpu/staging_probe.py). A token that no later stage reads is read at its `result()`/`done()` or
        before the next prefill (`Runtime.read_output_async`: nothing has touched `next_token` since its
        run), so every token comes from its own step, provided the runtime's runs go through this session.
        Nothing here waits for the GPU (the stage carries its values by value); a caller that never collects
        tokens runs ahead at most as many steps as kern-driver has pinned read slots per output (4: a read
        that finds them all pending waits for the oldest).

        Raises:
            KernRunError: `token` is None but no decode step was enqueued at `position - 1` since the
                last prefill.
            KernDriverError: from `Runtime.stage` or `Runtime.run` (e.g. a failed launch before the oldest
                pending read that must be resolved to free its slot).
        """
        if token is None and self._fed != position:
            held = ("no decode step has been enqueued since the last prefill" if self._fed is None
                    else f"it holds the token for position {self._fed} (the last step enqueued was at {self._fed - 1})")
            raise KernRunError(f"decode at position {position} from the device's next_token: {held}; "
                               "pass the step's input token (token=...)")
        self._pos[0] = position
        self._seq_len[0] = position + 1
        writes = {"positions": self._pos, "slot_mapping": self._pos, "seq_lens": self._seq_len}
        feeds = {"token_ids": "next_token"} if token is None else None
        if token is not None:
            self._token[0] = token
            writes["token_ids"] = self._token
        last = self._last if self._last is not None and not self._last.bound else None
        reads = self.rt.stage(writes=writes, feeds=feeds, reads=("next_token",) if last else ())
        if last:
            last.bind(reads["next_token"])
        self.rt.run("decode", graph=self.graph, tokens=1)
        self._fed = position + 1
        self._last = StepToken(self.rt)
        return self._last

    def _read_last(self) -> None:
        """Read the last decode step's token now if nothing has (before a run that may rewrite `next_token`)."""
        if self._last is not None:
            self._last.bind()
            self._last = None

    def decode(self, token: int, position: int) -> int:
        """Feed `token` at `position`; return the greedy next token (8 bytes read back, waiting for it)."""
        return int(self.enqueue_decode(position, token).result()[0])

    # -- generation --------------------------------------------------------

    def warmup(self, prefill_chunk: int | None = None) -> dict[str, float]:
        """Capture the graphs a generation will replay, so that timings exclude capture.

        Runs `decode` once (and `prefill` once at `prefill_chunk` tokens) on
        token 0 at positions 0.. : the K/V slots it writes are rewritten by the
        real prompt before anything reads them. Returns seconds per capture.
        """
        done: dict[str, float] = {}
        if not self.graph:
            return done
        if prefill_chunk:
            n = self.clamp_chunk(prefill_chunk)
            t0 = time.perf_counter()
            self.prefill([0] * n, n)
            self.rt.synchronize()
            done[f"prefill (tokens={n})"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.begin_decode()
        self.decode(0, 0)
        done["decode (tokens=1)"] = time.perf_counter() - t0
        self.stats = GenerationStats()
        return done

    def generate(self, prompt_ids: Sequence[int], steps: int, chunk: int = 512) -> Iterator[int]:
        """Yield `steps` greedy tokens after `prompt_ids`; fills `self.stats` as it goes.

        The arguments are checked at the call (KernRunError), before anything runs. With `pipeline`
        (the session's default) step i + 1 is already enqueued when token i is yielded, so GPU state read
        between two yields (`rt.read_buffer("logits")`) is the next step's — pass `pipeline=False` to the
        session to read each token's own — and a caller that stops early (break, `close()`) leaves that one
        step run: it writes the KV slot of the next position, which any later prefill or decode there
        rewrites. `stats` count the tokens yielded.
        """
        prompt_ids = [int(t) for t in prompt_ids]
        self.check(prompt_ids, steps)
        chunk = self.clamp_chunk(chunk)
        return self._generate(prompt_ids, steps, chunk)

    def _generate(self, prompt_ids: list[int], steps: int, chunk: int) -> Iterator[int]:
        # Pipelined: step i + 1 is enqueued (one stage launch: step i's token read back, fed to token_ids on
        # the device, the position inputs written; then the run) before step i's token is collected, so the
        # GPU runs it while the host waits for the read, yields and the caller consumes. The last step's token
        # is read when collected (read_output_async). Without `pipeline`, each step is enqueued only after
        # the caller took the previous token, which the stage writes from the host, and each token is read
        # right behind its step (the loop before session 10; the GPU state, e.g. the logits buffer, is then
        # that token's step's).
        stats = self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        t0 = time.perf_counter()
        self.prefill(prompt_ids[:-1], chunk)
        self.begin_decode()
        pos = len(prompt_ids) - 1
        pending = self.enqueue_decode(pos, prompt_ids[-1])
        t1 = 0.0
        for i in range(steps):
            following = self.enqueue_decode(pos + 1 + i) if self.pipeline and i + 1 < steps else None
            token = int(pending.result()[0])
            if i == 0:
                t1 = time.perf_counter()
                stats.prefill_s = t1 - t0
            else:
                stats.decode_steps += 1
                stats.decode_s = time.perf_counter() - t1
            yield token
            pending = following if self.pipeline or i + 1 == steps else self.enqueue_decode(pos + 1 + i, token)


def generate(rt, prompt_ids: Sequence[int], steps: int, chunk: int = 512, *, info: ManifestInfo,
             capacity: int, graph: bool = True, pipeline: bool = True) -> Iterator[int]:
    """Functional form: ``list(generate(rt, ids, 64, info=ManifestInfo.read(m), capacity=4096))``."""
    return Qwen3Session(rt, info, capacity=capacity, graph=graph, pipeline=pipeline).generate(prompt_ids, steps, chunk)
