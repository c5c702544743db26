"""`Runtime(prime_graphs=True)`'s decision, without a GPU: which capture gets a throwaway graph, and in which order
the throwaway is made, synchronized and destroyed relative to the kept one (the order measured on the H200,
NOTES.md 37). The capture itself (`_instantiate`) is replaced by a recorder."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

from kern_driver.runtime import Runtime


class FakeGraph:
    def __init__(self, log: list, program: str, n: int):
        self.log, self.program, self.n = log, program, n
        self.key = (program, ())

    def destroy(self) -> None:
        self.log.append(("destroy", self.program, self.n))


def fake_runtime(prime: bool):
    rt = Runtime.__new__(Runtime)
    log: list = []
    rt.prime_graphs, rt.primed, rt.max_graphs = prime, None, 16
    rt._graphs = OrderedDict()
    made = {"n": 0}

    def instantiate(prog, env):
        made["n"] += 1
        log.append(("instantiate", prog.name, made["n"]))
        return FakeGraph(log, prog.name, made["n"])

    rt._instantiate = instantiate
    rt.synchronize = lambda: log.append(("synchronize",))
    return rt, log


def program(name: str, *pdl: bool, extern_pdl: bool = False) -> SimpleNamespace:
    steps = [SimpleNamespace(pdl=p, extern=None) for p in pdl]
    steps.append(SimpleNamespace(pdl=extern_pdl, extern=object()))  # a cuBLASLt step never counts
    return SimpleNamespace(name=name, steps=steps)


def test_first_pdl_capture_is_preceded_by_a_destroyed_throwaway():
    rt, log = fake_runtime(True)
    g = rt._capture(program("decode", False, True), {"tokens": 1})
    assert log == [("instantiate", "decode", 1), ("synchronize",), ("destroy", "decode", 1),
                   ("instantiate", "decode", 2)]
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
    assert log[1:] == [("instantiate", "decode", 2), ("synchronize",), ("destroy", "decode", 2),
                       ("instantiate", "decode", 3)]


def test_off_by_default_and_when_disabled():
    import inspect

    assert inspect.signature(Runtime.load).parameters["prime_graphs"].default is False
    rt, log = fake_runtime(False)
    rt._capture(program("decode", True), {"tokens": 1})
    assert log == [("instantiate", "decode", 1)] and rt.primed is None
