"""tools/gpu/graph_state_probe.py without a GPU: its op scripts are checked before any process loads a runtime,
and the no-PDL variant it times is a verified manifest of the committed 4B example against the real kernel build."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import graph_state_probe as gsp  # noqa: E402


@pytest.mark.parametrize("name", sorted(gsp.PRESETS))
def test_every_preset_is_a_valid_script(name):
    ops = gsp.check_script(gsp.PRESETS[name].replace("@NOPDL", "/x.json"))
    assert ops[0][0].startswith("load") and any(v == "t" for v, _, _ in ops)


@pytest.mark.parametrize("script, needle", [
    ("load:A,jump:A", "op 2 `jump:A`"),
    ("load:A,t:B", "runtime `B` is not loaded"),
    ("load:A,close:A,t:A", "runtime `A` is not loaded"),
    ("loadm:A,t:A", "loadm takes NAME=PATH"),
    ("loadmp:A,t:A", "loadmp takes NAME=PATH"),
    ("loadp:A=/x.json,t:A", "only loadm and loadmp take =PATH"),
    ("load:,t:A", "no runtime name"),
    ("load:A=/x.json,t:A", "only loadm and loadmp take =PATH"),
    ("load:A,load:A,t:A", "runtime `A` is already loaded"),
    ("load:A,spare:A", "`A` has no decode graph"),
    ("load:A,warm:A,drop:A,spare:A", "`A` has no decode graph"),
])
def test_bad_scripts_name_the_op(script, needle):
    with pytest.raises(ValueError, match="op ") as e:
        gsp.check_script(script)
    assert needle in str(e.value)


def test_scripts_parse_into_verb_name_path():
    assert gsp.check_script("loadm:A=/m.json,warm:A,spare:A,close:A,load:A,t:A") == [
        ("loadm", "A", "/m.json"), ("warm", "A", ""), ("spare", "A", ""), ("close", "A", ""), ("load", "A", ""),
        ("t", "A", "")]


def test_main_refuses_a_bad_script_before_loading_anything(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gsp.main(["--work", str(tmp_path), "load:A,t:B"])
    assert "runtime `B` is not loaded" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gsp.main(["--work", str(tmp_path)])
    # a bad script with the no-PDL preset: refused before the variant is built or written
    with pytest.raises(SystemExit):
        gsp.main(["--work", str(tmp_path), "--preset", "no-pdl", "load:A,t:B"])
    assert not list(tmp_path.rglob("manifest-no-pdl.json"))
    # no manifest to build the variant from: one line naming it, no traceback
    assert gsp.main(["--work", str(tmp_path), "--preset", "no-pdl"]) == 1
    assert "graph_state_probe: error: the no-PDL variant:" in capsys.readouterr().err


@pytest.mark.parametrize("lm_head", ["screened", "dense"])
def test_no_pdl_variant_turns_every_decode_pdl_flag_off_and_verifies(built_kernels, dense_4b, tmp_path, lm_head):
    """The no-PDL variant of the 4B example (the screened lm_head) and of its `--lm-head dense` form: every decode-only
    op's first launch loses its flag; an op's later launches keep theirs (manifest_variants changes an op's first
    launch): the screened op's pick and reduce, the dense argmax's reduce, and no other op has any."""
    d = tmp_path / "qwen3-4b"
    d.mkdir()
    shutil.copy(ROOT / "examples" / "qwen3-4b.json" if lm_head == "screened" else dense_4b, d / "manifest.json")
    (tmp_path / "kernels").symlink_to(built_kernels)
    base = json.loads((d / "manifest.json").read_text())
    assert gsp.no_pdl_spec(base) == ("qkv.pdl=0+o.pdl=0+gu.pdl=0+down.pdl=0+lm_head.pdl=0+attn.pdl=0"
                                     + ("+argmax.pdl=0" if lm_head == "dense" else ""))
    m = gsp.no_pdl_manifest(tmp_path, "4b")
    pdl = lambda mm: [l.get("pdl", False) for op in mm["ops"].values() for l in op["impl"]["launches"]]  # noqa: E731
    assert any(pdl(base)) and sum(pdl(m)) < sum(pdl(base))
    decode_only = ({c["op"] for c in m["programs"]["decode"]["calls"]}
                   - {c["op"] for c in m["programs"]["prefill"]["calls"]})
    several = {name for name in decode_only if len(m["ops"][name]["impl"]["launches"]) > 1}
    assert several == {"norm_lm_head_argmax_screened" if lm_head == "screened" else "argmax"}
    for name in decode_only:
        first, *rest = m["ops"][name]["impl"]["launches"]
        assert not first.get("pdl"), name
        assert [l.get("pdl") for l in rest] == [True] * len(rest), name  # as in the manifest: PDL launches
        assert rest == base["ops"][name]["impl"]["launches"][1:], name


def test_run_script_on_a_fake_runtime(built_kernels, tmp_path, monkeypatch, capsys):
    """The ops themselves without a GPU: kern_driver.Runtime.load returns kern-run's contract-checking fake runtime
    (packages/kern-run/tests/fake_runtime.py) with a graph cache added; a failing op is named."""
    pytest.importorskip("kern_driver")
    sys.path.insert(0, str(ROOT / "packages" / "kern-run" / "tests"))
    from collections import OrderedDict

    from fake_runtime import FakeRuntime

    import kern_driver
    from kern_run.generator import ManifestInfo

    events = []

    class FakeGraph:
        def __init__(self, rt, program, tokens):
            self.program, self.key, self.rt = program, (program, tokens), rt
            self.n = len(rt.made)

        def destroy(self):
            events.append(("destroy", self.rt.name, self.program, self.n))

    class GraphRT(FakeRuntime):
        """FakeRuntime with kern_driver.Runtime's graph cache (`_graphs`, `graphs`, `capture`) and close."""

        def __init__(self, info, capacity, name, prime):
            super().__init__(info, capacity)
            self._graphs, self.made, self.name, self.prime = OrderedDict(), [], name, prime

        @property
        def graphs(self):
            return list(self._graphs.values())

        @graphs.setter
        def graphs(self, value):  # FakeRuntime.__init__ sets its own record (a set); unused here
            pass

        def capture(self, program, **vars):
            g = FakeGraph(self, program, vars["tokens"])
            self.made.append(g)
            old = self._graphs.pop(g.key, None)
            if old is not None:
                old.destroy()
            self._graphs[g.key] = g
            return g

        def run(self, program, *, graph=False, **vars):
            if graph and (program, vars["tokens"]) not in self._graphs:
                self.capture(program, **vars)
            super().run(program, graph=False, **vars)  # its contract checks (its graph record is a set)

        def close(self):
            for g in self._graphs.values():
                g.destroy()
            self._graphs.clear()
            events.append(("close", self.name))
            super().close()

    loads = []

    def fake_load(manifest, kernels, weights, *, capacity_tokens, prime_graphs=False):
        loads.append(prime_graphs)
        rt = GraphRT(ManifestInfo.read(manifest), capacity_tokens, f"rt{len(loads)}", prime_graphs)
        return rt

    monkeypatch.setattr(kern_driver.Runtime, "load", staticmethod(fake_load))
    monkeypatch.setattr(gsp, "STEPS", 8)
    work = tmp_path / "work"
    (work / "qwen3-4b").mkdir(parents=True)
    (work / "kernels").symlink_to(built_kernels)
    shutil.copy(ROOT / "examples" / "qwen3-4b.json", work / "qwen3-4b" / "manifest.json")

    gsp.run_script(work, "4b", "load:A,warm:A,spare:A,t:A,drop:A,loadp:B,warm:B,capp:B,run1:B,close:A,t:B")
    out = capsys.readouterr().out
    assert out.count("TIME A: replays") == 1 and out.count("TIME B: replays") == 1 and "ms/token" in out
    assert loads == [False, True]
    # the spare (A's second decode graph, never launched) is destroyed at A's close, after drop destroyed the first;
    # B's graphs are destroyed when run_script ends
    a_events = [e for e in events if e[1] == "rt1"]
    assert a_events == [("destroy", "rt1", "decode", 0), ("destroy", "rt1", "decode", 1), ("close", "rt1")]
    assert events[-3:] == [("destroy", "rt2", "decode", 0), ("destroy", "rt2", "prefill", 1), ("close", "rt2")]

    with pytest.raises(SystemExit, match=r"op 2 `run1:A` of `load:A,run1:A` failed: ContractError"):
        gsp.run_script(work, "4b", "load:A,run1:A")  # a decode step before any position was written
