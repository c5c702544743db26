#!/usr/bin/env python3
"""How fast one decode graph replays depending on the other executable graphs of the process (H200, session 12).

    python3 tools/gpu/graph_state_probe.py --work DIR [--geometry 4b] SCRIPT [SCRIPT ...]
    python3 tools/gpu/graph_state_probe.py --work DIR --preset alone --preset prime-graphs --preset throwaway

Each SCRIPT runs in its own process (a fresh CUDA context), as comma-separated ops on named runtimes (A, B, ...),
all of DIR/qwen3-<g>/manifest.json (tools/gpu/prepare.py's layout) unless loaded with `loadm`:

    load:X          Runtime.load + a Qwen3Session (nothing captured)
    loadp:X         the same with Runtime.load(..., prime_graphs=True) (kern-driver's form of `throwaway`)
    loadmp:X=PATH   loadm with prime_graphs=True
    loadm:X=PATH    the same with another manifest file of the model (e.g. a manifest_variants output); PATH
                    `@NOPDL` is the manifest with every decode op's first launch off PDL (no_pdl_spec: all but
                    the screened lm_head's pick and reduce, or a dense manifest's argmax's reduce), written to
                    DIR/qwen3-<g>/manifest-no-pdl.json
    warm:X          the session's warmup (captures the decode graph) and one 256-step generation
    gen:X           one 256-step generation after a 128-token prompt (pipelined, as kern-run generates)
    cap:X           capture X's decode graph (instantiated and uploaded; replaces X's cached one), launch nothing
    capp:X          capture X's prefill graph at 512 tokens, launch nothing
    spare:X         capture a second decode graph of X and keep it, never launched; X keeps replaying its first
    drop:X          destroy X's cached graphs (not its spares); the next run captures again
    run1:X          one replay of X's decode graph
    close:X         close X (its graphs and spares are destroyed)
    t:X             time X: a generation first (positions back to a 128-token prompt), then three sets of 200
                    back-to-back replays of the decode graph alone (ms per replay: no host work, no copies
                    between them), then two pipelined generations (ms/token, kern-run's loop)

What it found (NOTES.md 35–37, BENCHMARKS.md "Session 12"): the same decode graph of the same runtime replays at one
of two speeds, ~2.5% apart and each stable for seconds. S: 4B 2.475–2.496 ms per replay, in a process whose only
executable graph is the one replayed (bench_decode; kern-run with prompts shorter than a chunk). F: 2.414–2.432,
(a) once the process had instantiated another large executable graph before this one was captured — even one never
launched and destroyed since (`throwaway`), or another runtime's (closing it later keeps F) —, or (b) while the
process holds a graph captured after this one and not launched since (`spare`, `prefill-graph`, another runtime's;
launching it once returns to S, a whole generation on it returned to F; destroying it returns to S). Case (a) held
through 10 launches of a prefill graph captured afterwards. The decode program with PDL off (`no-pdl`) is 2.695 in S
and 2.740–2.760 in F: F gives the PDL program ~0.05 ms per token and costs the other about as much. Not changing the
state: cuGraphInstantiate flags (device launch, node priority; upload is refused), re-capturing or re-uploading the graph, an
upload of it to a second stream (and launching it there), a small captured memset graph on another stream (kept,
or destroyed before the capture), pinned host allocations, device allocations of 2 MB to 8 GB. The mechanism (the
driver's or the GPU's handling of executable graphs) is not known. program_sweep's `--in-process` numbers are F
numbers.
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
    "throwaway": "load:A,cap:A,drop:A,warm:A,t:A",
    "alone": "load:A,warm:A,t:A",
    "prime-graphs": "loadp:A,warm:A,t:A",  # against `alone`: one process each
    "no-pdl-alone": "loadm:A=@NOPDL,warm:A,t:A",
    "no-pdl-prime": "loadmp:A=@NOPDL,warm:A,t:A",  # against `no-pdl-alone`: what priming costs a mostly-non-PDL program
    "second-runtime": "load:A,warm:A,t:A,load:B,t:A,cap:B,t:A,run1:B,t:A,gen:B,t:A,close:B,t:A",
    "no-pdl": "loadm:A=@NOPDL,warm:A,t:A,spare:A,t:A",
}
VERBS = ("load", "loadp", "loadm", "loadmp", "warm", "gen", "cap", "capp", "spare", "drop", "run1", "close", "t")
#: verbs after which X has a decode graph (what `spare` copies)
CAPTURES_DECODE = ("warm", "gen", "cap", "run1", "t")
LOADS, WITH_PATH = ("load", "loadp", "loadm", "loadmp"), ("loadm", "loadmp")
#: The decode ops (manifest_variants' short names) whose first launch the no-PDL variant takes off PDL; `argmax` is a
#: dense manifest's (`gen_qwen3.py --lm-head dense`), `lm_head` the screened op or the dense GEMV (no_pdl_spec).
NO_PDL_OPS = ("qkv", "o", "gu", "down", "lm_head", "attn", "argmax")
STEPS, CONTEXT = 256, 128


def check_script(script: str) -> list[tuple[str, str, str]]:
    """The (verb, runtime name, path) triples of SCRIPT (path only for `loadm`/`loadmp`). Raises ValueError naming the
    op at fault: an unknown verb, a missing runtime name, `=PATH` on another verb (or `loadm` without it), a
    name loaded twice while alive, an op on a runtime not loaded (or closed), `spare` before X has a decode graph."""
    ops, live, decode = [], set(), set()
    for i, op in enumerate(script.split(",")):
        verb, _, x = op.strip().partition(":")
        where = f"op {i + 1} `{op}` of `{script}`"
        if verb not in VERBS:
            raise ValueError(f"{where}: unknown verb `{verb}` (one of {', '.join(VERBS)})")
        name, eq, path = x.partition("=")
        if not name:
            raise ValueError(f"{where}: no runtime name (e.g. {verb}:A)")
        if verb in WITH_PATH and not (eq and path):
            raise ValueError(f"{where}: {verb} takes NAME=PATH (a manifest file of the same model, or @NOPDL)")
        if verb not in WITH_PATH and eq:
            raise ValueError(f"{where}: only loadm and loadmp take =PATH; write {verb}:{name}")
        if verb in LOADS:
            if name in live:
                raise ValueError(f"{where}: runtime `{name}` is already loaded "
                                 f"(close:{name} first, or use another name)")
            live.add(name)
        elif name not in live:
            raise ValueError(f"{where}: runtime `{name}` is not loaded (load:{name} first)")
        elif verb == "close":
            live.discard(name)
            decode.discard(name)
        elif verb == "spare" and name not in decode:
            raise ValueError(f"{where}: `{name}` has no decode graph to keep replaying "
                             f"(warm:{name} or cap:{name} first)")
        elif verb == "drop":
            decode.discard(name)
        elif verb in CAPTURES_DECODE:
            decode.add(name)
        ops.append((verb, name, path))
    return ops


def no_pdl_spec(m: dict) -> str:
    """The manifest_variants variant that takes the first launch of each of NO_PDL_OPS that manifest `m` has off PDL:
    in the default manifests (screened lm_head) every decode op's but `argmax`, which they do not have (their screened
    op's pick and reduce keep PDL, as a dense manifest's argmax's reduce does: a variant changes an op's first
    launch)."""
    from manifest_variants import SHORT

    return "+".join(f"{s}.pdl=0" for s in NO_PDL_OPS if any(op in m["ops"] for op in SHORT[s]))


def no_pdl_manifest(work: Path, geometry: str) -> dict:
    """The manifest with the first launch of every decode op off PDL (no_pdl_spec), the manifest and the variant
    verified against the kernels dir (program_sweep's `build`). Raises manifest_variants.VariantError when the
    manifest cannot be read or changed, or either does not verify."""
    from manifest_variants import read_manifest
    from prepare import paths
    from program_sweep import build

    path = paths(work, geometry)["manifest"]
    if not path.is_file():
        build(work, geometry, [])  # raises, naming the missing manifest and how to make it
    spec = no_pdl_spec(read_manifest(path))
    return build(work, geometry, [spec])[1][spec]


def run_script(work: Path, geometry: str, script: str) -> None:
    """Execute one op script in this process; prints one line per op and per timing. Raises SystemExit naming the
    op that failed and why."""
    from bench_decode import random_prompt
    from benchinfo import kv_capacity
    from prepare import paths, weights_for

    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    p = paths(work, geometry)
    cap, prompt = kv_capacity(CONTEXT, STEPS), random_prompt(CONTEXT)
    rts, sessions, spares = {}, {}, {}
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

    def load(x: str, manifest: Path, prime: bool = False) -> None:
        rts[x] = Runtime.load(manifest, p["kernels"], weights_for(manifest, p), capacity_tokens=cap, prime_graphs=prime)
        sessions[x] = Qwen3Session(rts[x], ManifestInfo.read(manifest), capacity=cap, graph=True)
        spares[x] = []

    def do(verb: str, x: str, path: str) -> None:
        if verb in LOADS:
            load(x, Path(path) if verb in WITH_PATH else p["manifest"], prime=verb in ("loadp", "loadmp"))
        elif verb == "warm":
            sessions[x].warmup()
            gen(x)
        elif verb == "gen":
            gen(x)
        elif verb == "cap":
            rts[x].capture("decode", tokens=1)
        elif verb == "capp":
            rts[x].capture("prefill", tokens=512)
        elif verb == "spare":
            # Runtime keeps one graph per (program, vars): take the cached one out, capture another, put the
            # first back (it is what run() replays) and keep the second alive, never launched
            rt = rts[x]
            key, first = next((k, g) for k, g in rt._graphs.items() if g.program == "decode")
            del rt._graphs[key]
            rt.capture("decode", tokens=1)
            spares[x].append(rt._graphs[key])
            rt._graphs[key] = first
        elif verb == "drop":
            rts[x].synchronize()
            for g in rts[x].graphs:
                g.destroy()
            rts[x]._graphs.clear()
        elif verb == "run1":
            rts[x].run("decode", graph=True, tokens=1)
            rts[x].synchronize()
        elif verb == "close":
            rts[x].synchronize()
            for g in spares.pop(x):
                g.destroy()
            sessions.pop(x)
            rts.pop(x).close()
        elif verb == "t":
            gen(x)
            r = [replays(x) for _ in range(3)]
            g = [gen(x) for _ in range(2)]
            say(f"TIME {x}: replays " + " ".join(f"{v:.4f}" for v in r) + " ms each | generate "
                + " ".join(f"{v:.4f}" for v in g) + " ms/token")
            return
        say(f"{verb}:{x}")

    try:
        for i, (verb, x, path) in enumerate(check_script(script)):
            try:
                do(verb, x, path)
            except Exception as e:
                raise SystemExit(f"graph_state_probe: op {i + 1} `{verb}:{x}` of `{script}` failed: "
                                 f"{type(e).__name__}: {e}") from e
    finally:
        for x, rt in rts.items():
            for g in spares.get(x, []):
                g.destroy()
            rt.close()


def main(argv: list[str] | None = None) -> int:
    intro, _, rest = __doc__.partition("\n\n")
    ap = argparse.ArgumentParser(description=intro, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, type=Path, help="tools/gpu/prepare.py's --work dir")
    ap.add_argument("--geometry", default="4b", help="the qwen3-<geometry> folder of --work")
    ap.add_argument("--preset", action="append", default=[], choices=sorted(PRESETS),
                    help="a script of session 12's findings (repeatable): "
                    + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("script", nargs="*", help="comma-separated ops, one process each (see the op list below)")
    a = ap.parse_args(argv)
    if a.child:
        run_script(a.work, a.geometry, a.script[0])
        return 0
    scripts = [*a.script, *(PRESETS[n] for n in a.preset)]
    if not scripts:
        ap.error("give a SCRIPT or a --preset")
    for s in scripts:
        try:
            check_script(s.replace("@NOPDL", "no-pdl.json"))
        except ValueError as e:
            ap.error(str(e))
    if any("@NOPDL" in s for s in scripts):
        from manifest_variants import VariantError
        from prepare import paths

        try:
            m = no_pdl_manifest(a.work, a.geometry)
        except VariantError as e:
            print(f"graph_state_probe: error: the no-PDL variant: {e}", file=sys.stderr)
            return 1
        nopdl = paths(a.work, a.geometry)["dir"] / "manifest-no-pdl.json"
        nopdl.write_text(json.dumps(m))
        print(f"wrote {nopdl} (every decode op's first launch off PDL)", flush=True)
        scripts = [s.replace("@NOPDL", str(nopdl)) for s in scripts]
    failed = []
    for s in scripts:
        print(f"== {s}", flush=True)
        done = subprocess.run([sys.executable, __file__, "--work", str(a.work), "--geometry", a.geometry, "--child", s])
        if done.returncode:
            failed.append(s)
    if failed:
        print("graph_state_probe: failed (exit status above): " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
