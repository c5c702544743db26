"""`Runtime.read_output_async`'s ring of pinned slots and `write_input_from`'s checks, on the CPU.

The ring (kern_driver.reads) runs against a stub of the driver calls it makes: events that complete
when the test says so or fail, pinned buffers backed by numpy. The GPU tests (test_gpu.py) run the same
calls on a device.
"""

from __future__ import annotations

import numpy as np
import pytest

import kern_driver.reads as reads
from kern_driver import KernDriverError

OK, NOT_READY, ILLEGAL = 0, 600, 700


class StubDriver:
    """The event calls reads.py makes; every call is logged."""

    class CUresult:
        CUDA_ERROR_NOT_READY = NOT_READY

    class CUevent_flags:
        CU_EVENT_DISABLE_TIMING = 2

    def __init__(self):
        self.log: list[tuple] = []
        self.next_id = 0
        self.state: dict[int, int] = {}  # event -> OK / NOT_READY / ILLEGAL
        self.destroyed: set[int] = set()
        self.fail_next_record = False

    def _live(self, ev):
        assert ev not in self.destroyed, f"event {ev} used after cuEventDestroy"

    def cuEventCreate(self, flags):
        self.next_id += 1
        self.log.append(("create", self.next_id))
        return (OK, self.next_id)

    def cuEventRecord(self, ev, stream):
        self._live(ev)
        self.state[ev] = ILLEGAL if self.fail_next_record else OK
        self.fail_next_record = False
        self.log.append(("record", ev))
        return (OK,)

    def cuEventQuery(self, ev):
        self._live(ev)
        self.log.append(("query", ev))
        return (self.state[ev],)

    def cuEventSynchronize(self, ev):
        self._live(ev)
        self.log.append(("sync", ev))
        st = self.state[ev]
        return (OK,) if st == NOT_READY else (st,)  # a pending event completes when waited for

    def cuEventDestroy(self, ev):
        self.destroyed.add(ev)
        self.log.append(("destroy", ev))
        return (OK,)


class StubPinned:
    allocated: list["StubPinned"] = []

    def __init__(self, nbytes, what, mapped=False):
        self.nbytes = nbytes
        self.array = np.zeros(nbytes, np.uint8)
        self.ptr = id(self.array)
        self.device_ptr = self.ptr if mapped else 0
        StubPinned.allocated.append(self)

    def free(self):
        self.ptr = 0


def stub_check(result, what, where=None, hint=None):
    err, vals = result[0], result[1:]
    if err != OK:
        raise KernDriverError(f"{what} failed", cuda_error=f"CUresult {err}", where=where, hint=hint)
    return vals[0] if len(vals) == 1 else (vals or None)


@pytest.fixture
def drv(monkeypatch):
    d = StubDriver()
    StubPinned.allocated = []
    monkeypatch.setattr(reads, "drv", d)
    monkeypatch.setattr(reads, "PinnedBuffer", StubPinned)
    monkeypatch.setattr(reads, "check", stub_check)
    return d


def enqueue(r: reads.AsyncReads, value: int, name: str = "next_token"):
    """A read of an i64 [1] output whose device value is `value` at the read's point in the stream."""
    def copy(ptr):
        slot = next(p for p in StubPinned.allocated if p.ptr == ptr)
        slot.array[:8] = np.array([value], np.int64).view(np.uint8)
    return r.enqueue(name, 8, 8, (1,), np.dtype(np.int64), copy, stream=0)


def test_reads_beyond_the_slots_resolve_the_oldest_and_lose_nothing(drv):
    r = reads.AsyncReads()
    p0 = enqueue(r, 100)
    assert len(StubPinned.allocated) == 1  # slots are allocated as reads need them
    pending = [p0] + [enqueue(r, 100 + i) for i in range(1, 7)]
    assert len(StubPinned.allocated) == reads.SLOTS
    # the 5th, 6th, 7th reads each waited for the oldest unresolved one first, and it kept its value
    assert [e for e in drv.log if e[0] == "sync"] == [("sync", 1), ("sync", 2), ("sync", 3)]
    assert [int(p.result()[0]) for p in pending] == [100 + i for i in range(7)]
    assert all(p.done() for p in pending)
    assert pending[0].result() is pending[0].result()
    syncs = sum(e[0] == "sync" for e in drv.log)
    q = enqueue(r, 7)  # every slot is free again: the read waits for nothing
    assert sum(e[0] == "sync" for e in drv.log) == syncs and len(StubPinned.allocated) == reads.SLOTS
    assert int(q.result()[0]) == 7


def test_done_asks_the_event_and_close_resolves_pending_reads(drv):
    r = reads.AsyncReads()
    p, q = enqueue(r, 5), enqueue(r, 6)
    drv.state[q._slot.event] = NOT_READY
    assert p.done() and not q.done()
    r.close()  # the stream is synchronized before: the copies have completed
    assert int(p.result()[0]) == 5 and int(q.result()[0]) == 6 and q.done()
    assert drv.destroyed == {1, 2} and all(s.ptr == 0 for s in StubPinned.allocated)


def test_a_failed_read_keeps_its_error_after_close(drv):
    r = reads.AsyncReads()
    drv.fail_next_record = True
    p = enqueue(r, 1)
    with pytest.raises(KernDriverError, match="cuEventSynchronize failed") as first:
        p.result()
    r.close()
    with pytest.raises(KernDriverError) as again:
        p.result()
    assert again.value is first.value  # the launch error, not "closed"
    with pytest.raises(KernDriverError) as via_done:
        p.done()  # and no query of the destroyed event (StubDriver asserts on that)
    assert via_done.value is first.value
    assert "failed" in repr(p)


def test_a_read_whose_copy_never_completed_says_the_runtime_was_closed(drv):
    r = reads.AsyncReads()
    p = enqueue(r, 1)
    p._slot.free()  # as if the runtime had been torn down without resolving it
    with pytest.raises(KernDriverError, match="the runtime was closed and the read's copy had not completed"):
        p.result()


def test_a_failing_event_creation_frees_its_pinned_buffer(drv, monkeypatch):
    monkeypatch.setattr(drv, "cuEventCreate", lambda flags: (ILLEGAL,))
    with pytest.raises(KernDriverError, match="cuEventCreate failed"):
        enqueue(reads.AsyncReads(), 1)
    assert [p.ptr for p in StubPinned.allocated] == [0]


# -- the checks of write_input_from / read_output_async, on a Runtime with a layout and no GPU (conftest.py) ---


@pytest.mark.parametrize(("name", "src", "needle", "hint"), [
    ("nope", "next_token", "unknown buffer `nope`", "inputs: token_ids, positions, seq_lens"),
    ("w", "next_token", "`w` is a `weight` buffer; only `input` buffers are written", "inputs: token_ids"),
    ("token_ids", "nope", "unknown buffer `nope`", "outputs and carries: next_token, logits, big"),
    ("token_ids", "positions", "`positions` is an `input` buffer; the source must be an `output` or a `carry`",
     "write inputs from the host with write_input"),
    ("token_ids", "h", "`h` is a `workspace` buffer", "outputs and carries"),
    ("seq_lens", "next_token", "dtypes differ (`next_token` is i64, `seq_lens` is i32)", "kern never casts"),
    ("token_ids", "big", "`big` [4096] does not fit `token_ids` [2048] as a prefix", None),
    ("token_ids", "logits", "dtypes differ", None),
])
def test_write_input_from_names_what_is_wrong(rt, name, src, needle, hint):
    with pytest.raises(KernDriverError) as e:
        rt.write_input_from(name, src)
    assert f"write_input_from(`{name}`, `{src}`)" in str(e.value) and needle in str(e.value)
    if hint:
        assert hint in (e.value.hint or "")


@pytest.mark.parametrize(("name", "needle"), [
    ("nope", "read_output_async: unknown buffer `nope`"),
    ("token_ids", "read_output_async: buffer `token_ids` is an `input` buffer, not an output"),
    ("h", "is a `workspace` buffer, not an output"),
])
def test_read_output_async_names_what_is_wrong(rt, name, needle):
    with pytest.raises(KernDriverError, match="outputs: next_token, logits, big") as e:
        rt.read_output_async(name)
    assert needle in str(e.value)


def test_a_closed_runtime_refuses_both(rt):
    rt._closed = True
    for call in (lambda: rt.write_input_from("token_ids", "next_token"), lambda: rt.read_output_async("next_token")):
        with pytest.raises(KernDriverError, match="this Runtime is closed"):
            call()


# -- read_output before any run, and the vars it shapes its result with -----------------------------------


def test_read_output_before_any_run_that_writes_it_is_refused(rt_runs):
    """It returned the arena's zeros (a token id 0) as if a run had produced them."""
    rt = rt_runs
    for read in (rt.read_output, rt.read_output_async):
        with pytest.raises(KernDriverError, match="output `next_token` has not been written: no run since load of a "
                                                  r"program that writes it \(`decode`\)") as e:
            read("next_token")
        assert "rt.run" in e.value.hint
    rt._ran(rt._programs["prefill"], {"tokens": 512})  # runs, but does not write it
    with pytest.raises(KernDriverError, match="has not been written"):
        rt.read_output("next_token")
    with pytest.raises(KernDriverError, match=r"\(none does\)"):
        rt.read_output("big")
    rt._ran(rt._programs["decode"], {"tokens": 1})
    assert rt.read_output("next_token")[0] == (1,)


def test_read_output_has_the_shape_of_the_run_that_wrote_it(rt_runs):
    """decode (tokens=1) wrote logits, then prefill (tokens=512) ran: read_output gave 512 rows, 511 of them
    never written by any run. read_buffer keeps the last run's vars, as documented."""
    rt = rt_runs
    rt._ran(rt._programs["decode"], {"tokens": 1})
    rt._ran(rt._programs["prefill"], {"tokens": 512})
    assert rt.read_output("logits") == ((1, 151936), np.dtype(np.uint16), 2 * 151936)
    assert rt.read_buffer("logits")[0] == (512, 151936)


def test_a_var_the_program_does_not_use_makes_no_new_graph(rt_runs, monkeypatch):
    """run(graph=True) keyed its graph cache on every var given, so a var only `read_output` needs (here `tokens`,
    which decode's launches do not use) captured one graph per value; now the key is the vars the launches use, and
    the run still records the given values for read_output's shapes."""
    from collections import OrderedDict

    import kern_driver.runtime as runtime_mod
    from kern_driver.graphs import Graph
    from kern_driver.runtime import _Program

    rt = rt_runs
    rt._programs["decode"] = _Program("decode", None, {"pos"}, writes={"logits"})
    rt.manifest.vars.update(pos=type(rt.manifest.vars["tokens"])(max=4096))
    rt.manifest.vars["tokens"].min = rt.manifest.vars["pos"].min = 0
    rt._graphs, rt.max_graphs, rt.prime_graphs, rt.debug, rt._stream = OrderedDict(), 4, False, False, None
    captured = []

    def instantiate(prog, env):
        captured.append(dict(env))
        g = object.__new__(Graph)
        g.program, g.vars, g._exec = prog.name, dict(env), object()
        return g

    rt._instantiate = instantiate
    monkeypatch.setattr(runtime_mod.drv, "cuGraphLaunch", lambda ex, stream: (runtime_mod.SUCCESS,), raising=False)
    rt.run("decode", graph=True, pos=7, tokens=1)
    rt.run("decode", graph=True, pos=7, tokens=3)  # same launches: the same graph
    assert captured == [{"pos": 7, "tokens": 1}] and len(rt._graphs) == 1
    assert rt.read_output("logits")[0] == (3, 151936)  # shaped by this run's tokens, not the captured one
    rt.run("decode", graph=True, pos=8, tokens=3)  # a var the launches use: a new graph
    assert captured[-1] == {"pos": 8, "tokens": 3} and len(rt._graphs) == 2


def test_vars_named_like_runs_keywords_go_in_a_mapping(rt_runs):
    """A manifest var named `graph` or `program` could not be passed (`run(prog, graph=2)` set the graph flag and
    the var was then missing); `run` and `capture` take the values as a positional mapping too, and refuse a var
    given both ways or a second argument that is not a mapping."""
    from types import SimpleNamespace as NS

    from kern_driver.runtime import _Program

    rt = rt_runs
    rt.manifest.vars.update(graph=NS(min=0, max=8), program=NS(min=0, max=8))
    rt.manifest.vars["tokens"].min = 1
    rt._programs["odd"] = _Program("odd", None, {"graph", "program", "tokens"})
    seen = []
    rt._prepare = lambda prog, env: seen.append(env)
    rt._enqueue = lambda prog: None
    rt.run("odd", {"graph": 2, "program": 3}, tokens=4)
    assert seen == [{"graph": 2, "program": 3, "tokens": 4}]
    with pytest.raises(KernDriverError, match=r"missing var\(s\) graph, program"):
        rt.run("odd", tokens=4)  # no way to pass them by keyword: the message names them
    with pytest.raises(KernDriverError, match="run\\('odd'\\): var `tokens` given both in the mapping and as a keyword"):
        rt.run("odd", {"graph": 2, "program": 3, "tokens": 4}, tokens=4)
    with pytest.raises(KernDriverError, match="the second argument must be a mapping of var values, got int 2"):
        rt.run("odd", 2)
    with pytest.raises(KernDriverError, match="capture\\('odd'\\): var `graph` given both"):
        rt.capture("odd", {"graph": 1}, graph=1)


def test_a_missing_var_that_cannot_be_a_keyword_is_hinted_as_a_mapping(rt_runs):
    """`run(prog, graph=2)` with a var named `graph` set the graph flag, and the missing-var hint then said
    `rt.run(prog, graph=...)` again; now graph=2 is refused as the flag, and the hint shows the mapping form for a
    name that cannot be a keyword argument (and the keyword form otherwise)."""
    from types import SimpleNamespace as NS

    from kern_driver.runtime import _Program

    rt = rt_runs
    rt.manifest.vars.update({"graph": NS(min=0, max=8), "kv-len": NS(min=0, max=8)})
    rt.manifest.vars["tokens"].min = 1
    rt._programs["odd"] = _Program("odd", None, {"graph", "tokens"})
    rt._programs["dash"] = _Program("dash", None, {"kv-len"})
    rt._prepare = lambda prog, env: None
    rt._enqueue = lambda prog: None
    with pytest.raises(KernDriverError, match=r"graph=2 is run's graph flag \(True or False\), not the manifest's var"
                       ) as e:
        rt.run("odd", graph=2, tokens=1)
    assert "rt.run('odd', {'graph': 2}" in e.value.hint
    with pytest.raises(KernDriverError, match=r"missing var\(s\) graph") as e:
        rt.run("odd", graph=True, tokens=1)
    assert e.value.hint.endswith("rt.run(prog, {'graph': ...})")
    with pytest.raises(KernDriverError, match=r"missing var\(s\) kv-len") as e:
        rt.run("dash")
    assert e.value.hint.endswith("rt.run(prog, {'kv-len': ...})")
    with pytest.raises(KernDriverError, match=r"missing var\(s\) tokens") as e:
        rt.run("odd", {"graph": 1})
    assert e.value.hint.endswith("rt.run(prog, tokens=...)")
    rt.run("odd", {"graph": 2}, tokens=1)  # the mapping form runs
