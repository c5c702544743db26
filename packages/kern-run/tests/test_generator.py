"""The caller contract (chunked prefill, decode loop, graphs, capacity) against a fake Runtime."""

import random

import numpy as np
import pytest

from fake_runtime import VOCAB, ContractError, FakeRuntime, info, manifest_json, reference_generate, reference_next
from kern_run.generator import KernRunError, ManifestInfo, Qwen3Session, check_request, generate


def session(tokens_max=2048, capacity=4096, graph=True):
    i = info(tokens_max=tokens_max)
    rt = FakeRuntime(i, capacity)
    return rt, Qwen3Session(rt, i, capacity=capacity, graph=graph)


def prompt(n, seed=0):
    rng = random.Random(seed * 7919 + n)
    return [rng.randrange(VOCAB) for _ in range(n)]


def stages(rt):
    """Each `stage` call as (writes {name: list}, feeds, reads)."""
    return [({k: v.tolist() for k, v in c[1].items()}, c[2], c[3]) for c in rt.calls if c[0] == "stage"]


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
    # two prefill chunks, each token_ids write a prefix write of its chunk; the decode steps' inputs are staged
    assert [len(c[2]) for c in tok_writes] == [512, 196] and all(c[3] for c in tok_writes)
    assert tok_writes[0][2].tolist() == p[:512] and tok_writes[1][2].tolist() == p[512:708]
    pos = [c[2] for c in writes if c[1] == "positions"]
    assert [a.tolist() for a in pos] == [list(range(512)), list(range(512, 708))]
    slots = [c[2] for c in writes if c[1] == "slot_mapping"]
    assert len(slots) == 2 and all((a == b).all() for a, b in zip(slots, pos))
    seq = [c[2].tolist() for c in writes if c[1] == "seq_lens"]
    assert seq == [[512], [708]]
    # the first decode step writes its token from the host, the second feeds it on the device and reads the first's
    assert stages(rt) == [
        ({"positions": [708], "slot_mapping": [708], "seq_lens": [709], "token_ids": [p[708]]}, {}, ()),
        ({"positions": [709], "slot_mapping": [709], "seq_lens": [710]}, {"token_ids": "next_token"}, ("next_token",)),
    ]
    assert not any(c[0] == "feed" for c in rt.calls)
    cu = [c[2].tolist() for c in writes if c[1] == "cu_seqlens_q"]
    assert cu == [[0, 512], [0, 196], [0, 1]]  # [0, 1] written once for the whole decode loop
    bt = [c for c in writes if c[1] == "block_table"]
    assert len(bt) == 1 and bt[0][2].tolist() == list(range(256)) and not bt[0][3]


def test_between_decode_steps_one_stage_and_the_host_waits_for_nothing():
    rt, s = session()
    p = prompt(34)
    assert list(s.generate(p, 5, 512)) == reference_generate(p, 5)
    ops = rt.ops()
    first = ops.index(("run", "decode"))
    # exactly one stage + one run per step (the pipeline enqueues none beyond the steps asked for); the last token,
    # which no later stage reads, is read behind its step when collected
    assert ops[first - 1 :] == ["stage", ("run", "decode")] * 5 + ["read_async"]
    st = stages(rt)
    assert [r for _, _, r in st] == [()] + [("next_token",)] * 4  # stage i + 1 reads step i's token
    assert [f for _, f, _ in st] == [{}] + [{"token_ids": "next_token"}] * 4  # ... and feeds it to token_ids
    # each token is collected once, in order: token i from stage i + 1 (the last from its read_async), and only
    # after step i + 1 was enqueued
    reads = [i for i, c in enumerate(rt.calls) if c[0] == "stage" and c[3]] + \
            [i for i, c in enumerate(rt.calls) if c[0] == "read_async"]
    assert [c[1] for c in rt.calls if c[0] == "result"] == reads
    for r in reads[:-1]:
        assert rt.calls[r + 1][:2] == ("run", "decode") and rt.calls.index(("result", r)) > r + 1
    assert not any(c[0] in ("sync", "read", "feed") for c in rt.calls)  # no synchronisation, no separate copy


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
    # the step-by-step loop stages each step's token from the host, feeds nothing on the device, and reads each
    # token right behind its own step
    st = stages(rt)
    assert [w["token_ids"] for w, _, _ in st] == [[p[-1]], *([t] for t, _ in seen[:4])]
    assert all(f == {} and r == () for _, f, r in st) and not any(c[0] == "feed" for c in rt.calls)
    ops = rt.ops()
    assert ops[ops.index(("run", "decode")) - 1 :] == ["stage", ("run", "decode"), "read_async"] * 5


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


def started(n=34):
    """A session with a prompt of `n` tokens prefilled but its last, and the decode inputs set."""
    rt, s = session()
    p = prompt(n)
    s.prefill(p[:-1], 512)
    s.begin_decode()
    return rt, s, p


def test_each_token_is_read_from_its_own_step_whatever_the_order_of_collection():
    rt, s, p = started()
    want = reference_generate(p, 4)
    assert len(set(want)) == 4  # next_token changes at every step: a token read from another step would show
    handles = [s.enqueue_decode(33, p[-1])] + [s.enqueue_decode(q) for q in (34, 35, 36)]
    got = {k: int(handles[k].result()[0]) for k in (3, 1, 0, 2)}  # collected out of order, the last first
    assert [got[k] for k in range(4)] == want
    # steps 0..2 were read by the stages of steps 1..3 (before those runs rewrote next_token); step 3, which no
    # later stage read, by a read enqueued at its result() (nothing enqueued since its run)
    assert [r for _, _, r in stages(rt)] == [(), ("next_token",), ("next_token",), ("next_token",)]
    assert rt.ops()[-2:] == [("run", "decode"), "read_async"]
    assert [int(h.result()[0]) for h in handles] == want  # the same value on every call


def test_a_token_collected_before_the_next_step_is_read_behind_its_own_run():
    rt, s, p = started()
    want = reference_generate(p, 4)
    h0 = s.enqueue_decode(33, p[-1])
    assert int(h0.result()[0]) == want[0]  # read now, right behind step 0's run
    h1 = s.enqueue_decode(34)  # so step 1's stage reads nothing
    assert h1.done()  # done() enqueues the read too (a caller polling it gets the token)
    h2 = s.enqueue_decode(35)
    h3 = s.enqueue_decode(36)
    assert [int(h.result()[0]) for h in (h3, h2, h1)] == want[:0:-1]
    assert rt.ops()[rt.ops().index(("run", "decode")) - 1 :] == [
        "stage", ("run", "decode"), "read_async", "stage", ("run", "decode"), "read_async",
        "stage", ("run", "decode"), "stage", ("run", "decode"), "read_async"]
    assert [r for _, _, r in stages(rt)] == [(), (), (), ("next_token",)]  # only step 2 was left for a stage
    assert repr(h3).startswith("<StepToken <fake_runtime.FakePending")


def test_an_unread_step_is_read_before_a_prefill_and_keeps_its_token():
    rt, s, p = started()
    h = s.enqueue_decode(33, 5)
    s.prefill([1, 2], 512, start=34)  # the same sequence goes on at 34, 35 from the host
    assert rt.ops()[-7:] == ["read_async", *["write"] * 5, ("run", "prefill")]  # read before the prefill runs
    s.begin_decode()
    h2 = s.enqueue_decode(36, 7)  # rewrites next_token: h must not read it
    seq = p[:-1] + [5]
    assert int(h2.result()[0]) == reference_next(seq + [1, 2, 7])
    assert int(h.result()[0]) == reference_next(seq) != reference_next(seq + [1, 2, 7])


def test_decode_after_generate_continues_the_sequence():
    rt, s = session()
    p = prompt(34)
    out = list(s.generate(p, 5, 512))
    n = len(rt.calls)
    assert s.decode(out[-1], 34 + 4) == reference_generate(p, 6)[5]
    # the host's token staged at the next position, the token read behind that step: generate left nothing unread
    assert [c[0] if c[0] != "run" else c[:2] for c in rt.calls[n:]] == ["stage", ("run", "decode"), "read_async",
                                                                        "result"]
    assert stages(rt)[-1] == ({"positions": [38], "slot_mapping": [38], "seq_lens": [39], "token_ids": [out[-1]]},
                              {}, ())


def test_decode_after_an_early_stop_reads_the_abandoned_step_in_its_stage():
    rt, s = session()
    p = prompt(34)
    it = s.generate(p, 6, 512)
    got = [next(it), next(it)]
    it.close()  # step 2 (position 35) was enqueued and nothing read its token
    assert s.decode(got[1], 35) == reference_generate(p, 3)[2]  # rewrites what that step wrote, the same way
    assert stages(rt)[-1][2] == ("next_token",)  # that step's token read before this one's run rewrote it
    assert s.enqueue_decode(36) is not None  # the device's token follows the decode at 35


def test_fake_stage_checks_the_contract():
    rt, s = session()
    i64 = lambda *v: np.array(v, np.int64)
    bad = [
        ({}, "nothing to stage"),
        ({"writes": {"nope": i64(1)}}, "unknown input nope"),
        ({"writes": {"seq_lens": i64(1)}}, "seq_lens: wrote int64"),
        ({"writes": {"cu_seqlens_q": np.zeros(3, np.int32)}}, "wrote 3 elements"),
        ({"writes": {"positions": np.arange(20, dtype=np.int64)}}, "20 operations, at most 16"),
        ({"feeds": {"positions": "next_token"}}, "feeds next_token to token_ids only"),
        ({"writes": {"token_ids": i64(1)}, "feeds": {"token_ids": "next_token"}}, "a name given twice"),
        ({"reads": ("next_token",)}, "before any decode run"),
    ]
    for kw, msg in bad:
        with pytest.raises(ContractError, match=msg):
            rt.stage(**kw)
    s.begin_decode()
    s.decode(3, 0)
    for kw, msg in [({"reads": ("logits",)}, "unknown output logits"),
                    ({"reads": ("next_token", "next_token")}, "a name given twice")]:
        with pytest.raises(ContractError, match=msg):
            rt.stage(**kw)
    value = rt.next_token.copy()
    reads = rt.stage(feeds={"token_ids": "next_token"}, writes={"positions": i64(1)}, reads=("next_token",))
    assert (reads["next_token"].result() == value).all() and rt.bufs["token_ids"][0] == value[0]


def test_decode_positions_and_seq_lens_follow_the_sequence():
    rt, s = session()
    p = prompt(34)
    out = list(s.generate(p, 4, 512))
    # the fake's run checks the buffers at each run; the recorded stages tell the same story
    st = stages(rt)
    assert [(w["positions"], w["slot_mapping"], w["seq_lens"]) for w, _, _ in st] == [
        ([q], [q], [q + 1]) for q in (33, 34, 35, 36)]
    assert [w.get("token_ids") for w, _, _ in st] == [[p[-1]], None, None, None]  # then fed on the device
    assert sum(f == {"token_ids": "next_token"} for _, f, _ in st) == 3 and out == reference_generate(p, 4)


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
