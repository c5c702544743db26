#!/usr/bin/env python3
"""How fast one decode graph replays depending on what else the process holds (H200, session 12, NOTES.md 35).

    python3 tools/gpu/graph_state_probe.py --work DIR [--geometry 4b] SCRIPT [SCRIPT ...]
    python3 tools/gpu/graph_state_probe.py --work DIR --preset spare --preset second-runtime --preset no-pdl

Each SCRIPT runs in its own process (a fresh CUDA context), as comma-separated ops on named runtimes (A, B, ...),
all of DIR/qwen3-<g>/manifest.json (tools/gpu/prepare.py's layout) unless loaded with `loadm`:

    load:X          Runtime.load + a Qwen3Session (nothing captured)
    loadm:X=PATH    the same with another manifest file of the model (e.g. a manifest_variants output)
    warm:X          the session's warmup (captures the decode graph) and one 256-step generation
    gen:X           one 256-step generation after a 128-token prompt (pipelined, as kern-run generates)
    cap:X           capture X's decode graph (replacing X's cached one), launch nothing
    spare:X         capture a second decode graph of X and keep it, never launched; X keeps replaying its first
    capp:X          capture X's prefill graph at 512 tokens, launch nothing
    run1:X          one replay of X's decode graph
    close:X         close X (its graphs are destroyed)
    t:X             time X: a generation first (positions back to a 128-token prompt), then three sets of 200
                    back-to-back replays of the decode graph alone (ms per replay: no host work between them,
                    no copies), then two pipelined generations (ms/token, kern-run's loop)

What it found (NOTES.md 35): the same decode graph of the same runtime replays in one of two states, ~2.5% apart
and stable for seconds — 4B 2.476–2.487 ms per replay with the runtime's graph the only one in the process (S), and
2.413–2.433 once another executable graph exists that was captured after it and not launched (F): a spare decode
graph, the prefill graph, or another runtime's decode graph. Launching that other graph once returns to S
(launching another runtime's graph 256 times in a generation returned to F); closing it returns to S. Without PDL
(every launch's `pdl` off) the program is 2.695 in S and 2.760 in F: the state costs the PDL program and helps the
other by the same ~0.06 ms. Instantiate flags (upload, device launch, node priority), another stream, an upload of
the same graph to another stream, pinned host allocations, and a small captured memset graph change nothing. The
mechanism is not known (the driver's or the GPU's handling of executable graphs); program_sweep's in-process
numbers are F numbers, bench_decode's and kern-run's are S numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

PRESETS = {
    "spare": "load:A,warm:A,t:A,spare:A,t:A",
    "prefill-graph": "load:A,warm:A,t:A,capp:A,t:A",
    "second-runtime": "load:A,warm:A,t:A,load:B,t:A,cap:B,t:A,run1:B,t:A,gen:B,t:A,close:B,t:A",
    "no-pdl": "loadm:A=@NOPDL,warm:A,t:A,spare:A,t:A",
}
VERBS = ("load", "loadm", "warm", "gen", "cap", "spare", "capp", "run1", "close", "t")
NO_PDL = "+".join(f"{op}.pdl=0" for op in ("qkv", "o", "gu", "down", "lm_head", "attn", "argmax"))
STEPS, CONTEXT = 256, 128


def check_script(script: str) -> list[tuple[str, str]]:
    """The (verb, argument) pairs of SCRIPT. Raises ValueError naming the op at fault: an unknown verb, a missing
    runtime name, `loadm` without =PATH, an op on a runtime not loaded (or already closed)."""
    ops, live = [], set()
    for i, op in enumerate(script.split(",")):
        verb, _, x = op.strip().partition(":")
        where = f"op {i + 1} `{op}` of `{script}`"
        if verb not in VERBS:
            raise ValueError(f"{where}: unknown verb `{verb}` (one of {', '.join(VERBS)})")
        name, eq, path = x.partition("=")
        if not name:
            raise ValueError(f"{where}: no runtime name (e.g. {verb}:A)")
        if verb == "loadm" and not (eq and path):
            raise ValueError(f"{where}: loadm takes NAME=PATH (a manifest file of the same model)")
        if verb in ("load", "loadm"):
            live.add(name)
        elif name not in live:
            raise ValueError(f"{where}: runtime `{name}` is not loaded (load:{name} first)")
        elif verb == "close":
            live.discard(name)
        ops.append((verb, x))
    return ops


def no_pdl_manifest(work: Path, geometry: str) -> dict:
    """The manifest with every decode launch's `pdl` flag off (NO_PDL), verified against the kernels dir.
    Raises SystemExit with kern-verify's errors when it does not verify."""
    from manifest_variants import apply, load_index, read_manifest, verify
    from prepare import paths

    p = paths(work, geometry)
    m = apply(read_manifest(p["manifest"]), NO_PDL, load_index(p["kernels"]))
    if errors := verify(m, p["kernels"]):
        raise SystemExit("graph_state_probe: the no-PDL variant does not verify:\n  " + "\n  ".join(errors))
    return m


def run_script(work: Path, geometry: str, script: str) -> None:
    """Execute one op script in this process; prints one line per op and per timing."""
    from bench_decode import random_prompt
    from benchinfo import kv_capacity
    from prepare import paths

    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    p = paths(work, geometry)
    cap, prompt = kv_capacity(CONTEXT, STEPS), random_prompt(CONTEXT)
    rts, sessions, kept = {}, {}, []
    t0 = time.time()

    def say(s: str) -> None:
        print(f"[{time.time() - t0:7.2f}] {s}", flush=True)

    def gen(x: str) -> float:
        list(sessions[x].generate(prompt, STEPS, 512))
        return sessions[x].stats.decode_ms_per_token

    def replays(x: str, n: int = 200) -> float:
        rt = rts[x]
        rt.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            rt.run("decode", graph=True, tokens=1)
        rt.synchronize()
        return (time.perf_counter() - t) / n * 1e3

    def load(x: str, manifest: Path) -> None:
        rts[x] = Runtime.load(manifest, p["kernels"], p["weights"], capacity_tokens=cap)
        sessions[x] = Qwen3Session(rts[x], ManifestInfo.read(manifest), capacity=cap, graph=True)

    try:
        for verb, x in check_script(script):
            op = f"{verb}:{x}"
            if verb == "load":
                load(x, p["manifest"])
            elif verb == "loadm":
                x, _, path = x.partition("=")
                load(x, Path(path))
            elif verb == "warm":
                sessions[x].warmup()
                gen(x)
            elif verb == "gen":
                gen(x)
            elif verb == "cap":
                rts[x].capture("decode", tokens=1)
            elif verb == "spare":
                # Runtime keeps one graph per (program, vars): take the cached one out, capture another, put the
                # first back (it is what run() replays) and keep the second alive, never launched
                rt = rts[x]
                key, first = next((k, g) for k, g in rt._graphs.items() if g.program == "decode")
                del rt._graphs[key]
                rt.capture("decode", tokens=1)
                kept.append(rt._graphs[key])
                rt._graphs[key] = first
            elif verb == "capp":
                rts[x].capture("prefill", tokens=512)
            elif verb == "run1":
                rts[x].run("decode", graph=True, tokens=1)
                rts[x].synchronize()
            elif verb == "close":
                sessions.pop(x)
                rts.pop(x).close()
                continue
            elif verb == "t":
                gen(x)
                r = [replays(x) for _ in range(3)]
                g = [gen(x) for _ in range(2)]
                say(f"TIME {x}: replays " + " ".join(f"{v:.4f}" for v in r) + " ms each | generate "
                    + " ".join(f"{v:.4f}" for v in g) + " ms/token")
                continue
            say(op)
    finally:
        for g in kept:
            g.destroy()
        for rt in rts.values():
            rt.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--work", required=True, type=Path, help="tools/gpu/prepare.py's --work dir")
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--preset", action="append", default=[], choices=sorted(PRESETS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("script", nargs="*")
    a = ap.parse_args(argv)
    if a.child:
        run_script(a.work, a.geometry, a.script[0])
        return 0
    scripts = [*a.script, *(PRESETS[n] for n in a.preset)]
    if not scripts:
        ap.error("give a SCRIPT or a --preset")
    if any("@NOPDL" in s for s in scripts):
        from prepare import paths

        nopdl = paths(a.work, a.geometry)["dir"] / "manifest-no-pdl.json"
        nopdl.write_text(json.dumps(no_pdl_manifest(a.work, a.geometry)))
        scripts = [s.replace("@NOPDL", str(nopdl)) for s in scripts]
    for s in scripts:
        try:
            check_script(s)
        except ValueError as e:
            ap.error(str(e))
    status = 0
    for s in scripts:
        print(f"== {s}", flush=True)
        done = subprocess.run([sys.executable, __file__, "--work", str(a.work), "--geometry", a.geometry, "--child", s])
        status = status or done.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
