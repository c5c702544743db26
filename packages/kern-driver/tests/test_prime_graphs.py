"""`Runtime(prime_graphs=True)`'s decision, without a GPU: which capture gets a throwaway graph, and in which order
the throwaway is made, synchronized and destroyed relative to the kept one (the order measured on the H200,
NOTES.md 37). The capture itself (`_instantiate`) and the stream are replaced by recorders."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest

from kern_driver import KernDriverError
from kern_driver.runtime import Runtime


class FakeGraph:
    def __init__(self, log: list, program: str, n: int):
        self.log, self.program, self.n = log, program, n
        self.key = (program, ())

    def destroy(self) -> None:
        self.log.append(("destroy", self.program, self.n))


def fake_runtime(prime: bool, fail_at: int | None = None, fail_sync: bool = False):
    """A Runtime shell whose _instantiate records (and raises at call `fail_at`) and whose stream sync records (and
    raises when `fail_sync`)."""
    rt = Runtime.__new__(Runtime)
    log: list = []
    rt.prime_graphs, rt.primed, rt.max_graphs, rt._closed = prime, None, 16, False
    rt._graphs = OrderedDict()
    made = {"n": 0}

    def instantiate(prog, env):
        made["n"] += 1
        if made["n"] == fail_at:
            raise KernDriverError(f"cuGraphInstantiate failed (capture {made['n']})")
        log.append(("instantiate", prog.name, made["n"]))
        return FakeGraph(log, prog.name, made["n"])

    def synchronize(where=None):
        log.append(("synchronize", where))
        if fail_sync:
            raise KernDriverError(f"cuStreamSynchronize failed in {where}")

    rt._instantiate = instantiate
    rt._dev = SimpleNamespace(synchronize=synchronize)
    return rt, log


def program(name: str, *pdl: bool, extern_pdl: bool = False) -> SimpleNamespace:
    steps = [SimpleNamespace(pdl=p, extern=None) for p in pdl]
    steps.append(SimpleNamespace(pdl=extern_pdl, extern=object()))  # a cuBLASLt step never counts
    pdl_steps = [i for i, s in enumerate(steps) if s.extern is None and s.pdl]  # as StagedProgram.pdl_steps
    return SimpleNamespace(name=name, steps=steps, staged=SimpleNamespace(pdl_steps=pdl_steps), required=set())


SYNC = ("synchronize", "uploading the prime_graphs throwaway of program `decode` with {'tokens': 1}")


def test_first_pdl_capture_is_preceded_by_a_destroyed_throwaway():
    rt, log = fake_runtime(True)
    g = rt._capture(program("decode", False, True), {"tokens": 1})
    assert log == [("instantiate", "decode", 1), SYNC, ("destroy", "decode", 1), ("instantiate", "decode", 2)]
    assert g.n == 2 and list(rt._graphs.values()) == [g] and rt.primed == "decode"
    # later captures (another program, or the same one again) get none
    log.clear()
    rt._capture(program("prefill", True), {"tokens": 512})
    assert log == [("instantiate", "prefill", 3)]


def test_programs_without_pdl_launches_are_never_primed():
    rt, log = fake_runtime(True)
    rt._capture(program("prefill", False, False, extern_pdl=True), {"tokens": 512})
    assert log == [("instantiate", "prefill", 1)] and rt.primed is None
    rt._capture(program("decode", True), {"tokens": 1})  # the first with pdl launches is
    assert log[1:] == [("instantiate", "decode", 2), SYNC, ("destroy", "decode", 2), ("instantiate", "decode", 3)]


def test_off_by_default_and_when_disabled():
    import inspect

    assert inspect.signature(Runtime.load).parameters["prime_graphs"].default is False
    rt, log = fake_runtime(False)
    rt._capture(program("decode", True), {"tokens": 1})
    assert log == [("instantiate", "decode", 1)] and rt.primed is None


def test_a_failed_throwaway_caches_nothing_and_the_next_capture_primes():
    rt, log = fake_runtime(True, fail_at=1)
    with pytest.raises(KernDriverError, match="capture 1"):
        rt._capture(program("decode", True), {"tokens": 1})
    assert not rt._graphs and rt.primed is None and log == []
    rt._capture(program("decode", True), {"tokens": 1})
    assert rt.primed == "decode" and [e[0] for e in log] == ["instantiate", "synchronize", "destroy", "instantiate"]


def test_a_failed_sync_still_destroys_the_throwaway_and_names_it():
    rt, log = fake_runtime(True, fail_sync=True)
    with pytest.raises(KernDriverError, match="prime_graphs throwaway of program `decode`"):
        rt._capture(program("decode", True), {"tokens": 1})
    assert log == [("instantiate", "decode", 1), SYNC, ("destroy", "decode", 1)]
    assert not rt._graphs and rt.primed is None


def test_a_failed_kept_capture_after_a_good_throwaway():
    rt, log = fake_runtime(True, fail_at=2)
    with pytest.raises(KernDriverError, match="capture 2"):
        rt._capture(program("decode", True), {"tokens": 1})
    assert not rt._graphs and rt.primed == "decode"  # a graph was instantiated before: what NOTES.md 37 measured
    assert log == [("instantiate", "decode", 1), SYNC, ("destroy", "decode", 1)]


def test_load_passes_the_option_to_init(monkeypatch):
    import kern_driver.runtime as R

    seen = {}
    monkeypatch.setattr(R, "prepare", lambda *a, **k: "prepared")
    monkeypatch.setattr(R.Runtime, "_init", lambda self, prep, *args: seen.update(prep=prep, args=args))
    Runtime.load("m.json", None, None, prime_graphs=True)
    assert seen["prep"] == "prepared" and seen["args"][-1] is True
    Runtime.load("m.json", None, None)
    assert seen["args"][-1] is False

