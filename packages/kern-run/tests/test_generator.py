"""The caller contract (chunked prefill, decode loop, graphs, capacity) against a fake Runtime."""

import random

import numpy as np
import pytest

from fake_runtime import VOCAB, ContractError, FakeRuntime, info, manifest_json, reference_generate
from kern_run.generator import KernRunError, ManifestInfo, Qwen3Session, check_request, generate


def session(tokens_max=2048, capacity=4096, graph=True):
    i = info(tokens_max=tokens_max)
    rt = FakeRuntime(i, capacity)
    return rt, Qwen3Session(rt, i, capacity=capacity, graph=graph)


def prompt(n, seed=0):
    rng = random.Random(seed * 7919 + n)
    return [rng.randrange(VOCAB) for _ in range(n)]


def expected_chunks(n_prompt, chunk):
    rest = n_prompt - 1
    return [chunk] * (rest // chunk) + ([rest % chunk] if rest % chunk else [])


@pytest.mark.parametrize("n", [1, 34, 85, 709])
@pytest.mark.parametrize("chunk", [512, 64, 1])
def test_chunking_and_tokens(n, chunk):
    rt, s = session()
    p = prompt(n)
    out = list(s.generate(p, 8, chunk))
    assert out == reference_generate(p, 8)  # every token of the cache, in order, at its slot
    runs = rt.runs()
    prefill = [r for r in runs if r[0] == "prefill"]
    assert [r[2] for r in prefill] == expected_chunks(n, chunk)
    # prefill graphs only for full-length chunks; the remainder runs eagerly
    assert [r[1] for r in prefill] == [r[2] == chunk for r in prefill]
    decode = [r for r in runs if r[0] == "decode"]
    assert decode == [("decode", True, 1)] * 8
    assert runs[: len(prefill)] == prefill  # all prefill before the first decode
    assert s.stats.prefill_chunks == expected_chunks(n, chunk)
    assert s.stats.prompt_tokens == n and s.stats.decode_steps == 7


def test_709_tokens_at_512_is_two_chunks_with_prefix_writes():
    rt, s = session()
    p = prompt(709)
    list(s.generate(p, 2, 512))
    writes = [c for c in rt.calls if c[0] == "write"]
    tok_writes = [c for c in writes if c[1] == "token_ids"]
    # two prefill chunks + the first decode (the second takes its token from the device); every token_ids
    # write is a prefix write of its chunk
    assert [len(c[2]) for c in tok_writes] == [512, 196, 1]
    assert [c for c in rt.calls if c[0] == "feed"] == [("feed", "token_ids", "next_token")]
    assert all(c[3] for c in tok_writes)
    assert tok_writes[0][2].tolist() == p[:512] and tok_writes[1][2].tolist() == p[512:708]
    assert tok_writes[2][2].tolist() == [p[708]]
    pos = [c[2] for c in writes if c[1] == "positions"]
    assert pos[1].tolist() == list(range(512, 708)) and pos[2].tolist() == [708] and pos[3].tolist() == [709]
    slots = [c[2] for c in writes if c[1] == "slot_mapping"]
    assert all((a == b).all() for a, b in zip(slots, pos))
    seq = [c[2].tolist() for c in writes if c[1] == "seq_lens"]
    assert seq == [[512], [708], [709], [710], [711]]  # the last is staged for a step never run
    cu = [c[2].tolist() for c in writes if c[1] == "cu_seqlens_q"]
    assert cu == [[0, 512], [0, 196], [0, 1]]  # [0, 1] written once for the whole decode loop
    bt = [c for c in writes if c[1] == "block_table"]
    assert len(bt) == 1 and bt[0][2].tolist() == list(range(256)) and not bt[0][3]


def test_between_decode_steps_the_host_waits_for_nothing():
    rt, s = session()
    list(s.generate(prompt(34), 5, 512))
    runs = [i for i, c in enumerate(rt.calls) if c[:2] == ("run", "decode")]
    assert len(runs) == 5  # exactly the steps asked for: the pipeline enqueues none beyond
    for k, (a, b) in enumerate(zip(runs, runs[1:])):
        step = [c[0] if c[0] == "result" else c[:2] for c in rt.calls[a : b + 1]]
        # the 8-byte read and the next position's inputs are queued right behind the run; from the second step
        # on, the token of the step before is collected (result) while this one runs; the next step's token is
        # fed on the device
        assert step == [("run", "decode"), ("read_async", "next_token"), ("write", "positions"),
                        ("write", "slot_mapping"), ("write", "seq_lens"), *(["result"] if k else []),
                        ("feed", "token_ids"), ("run", "decode")]
    results = [c[1] for c in rt.calls if c[0] == "result"]
    reads = [i for i, c in enumerate(rt.calls) if c[0] == "read_async"]
    assert results == reads  # every step's token collected once, in order
    for r in reads[:-1]:  # ... and only after the next step was enqueued
        nxt = min(i for i in runs if i > r)
        assert rt.calls.index(("result", r)) > nxt
    assert not any(c[0] in ("sync", "read") for c in rt.calls)  # no synchronisation at all
    assert [c[:2] for c in rt.calls if c[:2] == ("write", "token_ids")] == [("write", "token_ids")] * 2  # chunk, 1st


@pytest.mark.parametrize("graph", [True, False])
def test_unpipelined_steps_wait_for_the_caller(graph):
    i = info()
    rt = FakeRuntime(i, 4096)
    s = Qwen3Session(rt, i, capacity=4096, graph=graph, pipeline=False)
    p = prompt(34)
    seen = []
    for t in s.generate(p, 5, 512):
        seen.append((t, sum(c[:2] == ("run", "decode") for c in rt.calls)))
    assert [t for t, _ in seen] == reference_generate(p, 5)
    assert [n for _, n in seen] == [1, 2, 3, 4, 5]  # when the caller has token i, only step i has run
    # the step-by-step loop writes each step's token from the host, and nothing is fed on the device
    assert not any(c[0] == "feed" for c in rt.calls)
    toks = [c[2].tolist() for c in rt.calls if c[:2] == ("write", "token_ids") and len(c[2]) == 1]
    assert toks == [[p[-1]], *([t] for t, _ in seen[:4])]


def test_a_caller_stopping_early_leaves_one_step_run_and_the_session_usable():
    rt, s = session()
    p = prompt(34)
    it = s.generate(p, 6, 512)
    got = [next(it), next(it)]
    it.close()
    assert got == reference_generate(p, 2)
    assert sum(c[:2] == ("run", "decode") for c in rt.calls) == 3  # the step after the last token taken
    assert s.stats.decode_steps == 1
    q = prompt(85)
    assert list(s.generate(q, 4, 512)) == reference_generate(q, 4)  # prefill rewrites what that step wrote


def test_one_step_enqueues_one_decode():
    rt, s = session()
    p = prompt(34)
    assert list(s.generate(p, 1, 512)) == reference_generate(p, 1)
    assert sum(c[:2] == ("run", "decode") for c in rt.calls) == 1 and s.stats.decode_steps == 0


def test_feeding_the_device_token_needs_the_previous_step():
    rt, s = session()
    s.prefill(prompt(34)[:-1], 512)
    s.begin_decode()
    with pytest.raises(KernRunError, match=r"decode at position 33 from the device's next_token: no decode step has "
                       r"been enqueued since the last prefill; pass the step's input token \(token=...\)"):
        s.enqueue_decode(33)
    s.enqueue_decode(33, 5)
    with pytest.raises(KernRunError, match=r"it holds the token for position 34 \(the last step enqueued was at 33\)"):
        s.enqueue_decode(35)
    assert int(s.enqueue_decode(34).result()[0]) == reference_generate(prompt(34)[:-1] + [5], 2)[1]
    s.prefill([1, 2], 512, start=35)  # another sequence position: the device token no longer follows
    with pytest.raises(KernRunError, match="no decode step has been enqueued since the last prefill"):
        s.enqueue_decode(37)


def test_decode_positions_and_seq_lens_follow_the_sequence():
    rt, s = session()
    p = prompt(34)
    out = list(s.generate(p, 4, 512))
    # the fake's run checks the buffers at each run; the recorded writes tell the same story
    pos = [c[2][0] for c in rt.calls if c[:2] == ("write", "positions") and len(c[2]) == 1]
    assert pos[:4] == [33, 34, 35, 36]
    seq = [c[2][0] for c in rt.calls if c[:2] == ("write", "seq_lens")]
    assert seq[1:5] == [34, 35, 36, 37]  # after the prefill chunk's 33
    toks = [c[2][0] for c in rt.calls if c[:2] == ("write", "token_ids") and len(c[2]) == 1]
    assert toks == [p[-1]]  # the later steps' tokens are fed on the device
    assert sum(c[0] == "feed" for c in rt.calls) == 3 and out == reference_generate(p, 4)


@pytest.mark.parametrize("n", [1, 85, 709])
def test_eager_runs_no_graphs_and_gives_the_same_tokens(n):
    p = prompt(n)
    rt_g, s_g = session(graph=True)
    rt_e, s_e = session(graph=False)
    assert list(s_g.generate(p, 6, 64)) == list(s_e.generate(p, 6, 64))
    assert not rt_e.graphs and not any(r[1] for r in rt_e.runs())
    assert ("decode", 1) in rt_g.graphs
    assert (("prefill", 64) in rt_g.graphs) == (n > 64)


def test_chunk_is_clamped_to_the_manifest_tokens_max():
    rt, s = session(tokens_max=256)
    p = prompt(709)
    assert list(s.generate(p, 3, 512)) == reference_generate(p, 3)
    assert [r[2] for r in rt.runs() if r[0] == "prefill"] == [256, 256, 196]
    assert s.clamp_chunk(512) == 256 and s.clamp_chunk(100) == 100
    with pytest.raises(KernRunError, match="--chunk must be >= 1"):
        s.clamp_chunk(0)


def test_capacity_is_checked_before_anything_runs():
    rt, s = session(capacity=100)
    with pytest.raises(KernRunError, match=r"prompt \(90 tokens\) \+ steps \(11\) = 101 tokens exceeds the capacity of 100"):
        s.generate(prompt(90), 11, 64)
    assert rt.runs() == []
    assert list(s.generate(prompt(90), 10, 64)) == reference_generate(prompt(90), 10)  # exactly full is fine


def test_capacity_is_limited_by_the_manifest_pages():
    i = ManifestInfo(tokens_max=2048, max_pages=4, vocab_size=VOCAB)  # 64 positions
    rt = FakeRuntime(i, 64)
    s = Qwen3Session(rt, i, capacity=4096)
    assert s.capacity == 64
    with pytest.raises(KernRunError, match="at most 64 for this manifest"):
        s.generate(prompt(60), 5)


@pytest.mark.parametrize("ids,steps,msg", [
    ([], 4, "prompt is empty"),
    ([1, 2], 0, "--steps must be >= 1"),
    ([1, VOCAB], 4, f"prompt token id {VOCAB} is out of range"),
    ([-1], 4, "prompt token id -1 is out of range"),
])
def test_bad_arguments(ids, steps, msg):
    rt, s = session()
    with pytest.raises(KernRunError, match=msg):
        s.generate(ids, steps)
    assert rt.runs() == []


def test_warmup_captures_graphs_and_leaves_no_trace_in_the_output():
    rt, s = session()
    p = prompt(709, seed=3)
    captured = s.warmup(64)
    assert set(captured) == {"prefill (tokens=64)", "decode (tokens=1)"}
    assert rt.graphs == {("prefill", 64), ("decode", 1)}
    assert list(s.generate(p, 10, 64)) == reference_generate(p, 10)  # warm-up KV slots were rewritten


def test_warmup_in_eager_mode_runs_nothing():
    rt, s = session(graph=False)
    assert s.warmup(64) == {}
    assert rt.runs() == []


def test_a_session_generates_twice():
    rt, s = session()
    a, b = prompt(85, 1), prompt(34, 2)
    assert list(s.generate(a, 5, 64)) == reference_generate(a, 5)
    assert list(s.generate(b, 5, 64)) == reference_generate(b, 5)


def test_functional_generate():
    i = info()
    rt = FakeRuntime(i, 4096)
    p = prompt(85)
    assert list(generate(rt, p, 4, 64, info=i, capacity=4096)) == reference_generate(p, 4)


def test_fake_runtime_catches_a_broken_caller():
    """The fake is strict: a caller that forgets the prefix flag or skips a chunk fails."""
    i = info()
    rt = FakeRuntime(i, 4096)
    with pytest.raises(ContractError):
        rt.write_input("token_ids", np.zeros(3, np.int64))  # not a prefix write
    rt.write_input("block_table", np.arange(256, dtype=np.int32))
    rt.write_input("token_ids", np.zeros(1, np.int64), prefix=True)
    rt.write_input("positions", np.array([5]), prefix=True)
    rt.write_input("slot_mapping", np.array([5]), prefix=True)
    rt.write_input("seq_lens", np.array([6], np.int32))
    rt.write_input("cu_seqlens_q", np.array([0, 1], np.int32))
    with pytest.raises(ContractError, match="unwritten KV slots"):
        rt.run("decode", graph=True, tokens=1)


def test_manifest_info_from_json():
    m = manifest_json(tokens_max=1024, max_pages=300)
    i = ManifestInfo.from_json(m)
    assert (i.tokens_max, i.max_pages, i.vocab_size, i.rope_positions, i.model) == (1024, 300, VOCAB, 40960, "fake-qwen3")
    assert i.max_positions == 4800
    del m["programs"]["prefill"]
    with pytest.raises(KernRunError, match="needs programs `prefill` and `decode`"):
        ManifestInfo.from_json(m, source="x.json")


def test_manifest_info_read_errors(tmp_path):
    with pytest.raises(KernRunError, match="manifest not found"):
        ManifestInfo.read(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(KernRunError, match=r"manifest .*bad.json is not JSON: Expecting property name enclosed in "
                                           r"double quotes at line 1 column 3 \(is it the manifest file\?"):
        ManifestInfo.read(bad)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{")
    with pytest.raises(KernRunError, match="cannot read manifest .*bin.json"):
        ManifestInfo.read(binary)
    with pytest.raises(KernRunError, match="cannot read manifest"):
        ManifestInfo.read(tmp_path)  # a directory


def test_capacity_error_says_token_once():
    """One prompt token is `1 token`, not `1 tokens`."""
    info = ManifestInfo(tokens_max=64, max_pages=8, vocab_size=100, rope_positions=128, model="x")
    with pytest.raises(KernRunError, match=r"prompt \(1 token\) \+ steps \(200\) = 201 tokens exceeds"):
        check_request(info, 128, [1], 200)
