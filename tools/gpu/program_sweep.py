#!/usr/bin/env python3
"""Time variants of the Qwen3 decode program side by side: kern-run's decode ms/token of the manifest and of each
`tools/manifest_variants.py` variant of it, in alternating rounds, one runtime per process.

    python3 tools/gpu/program_sweep.py --work DIR --geometry 4b --variant gu.entry=kern_gemv_norm_silu_m1 --variant attn.pdl=0 \\
        [--kernels-variant NAME=KDIR] [--manifest-variant NAME=PATH] [--env-variant NAME=VAR=VALUE] [--in-process] [--context 128] [--steps 256] [--rounds 3] [--append BENCHMARKS.md] [--dry-run]

DIR is tools/gpu/prepare.py's layout (DIR/kernels, DIR/qwen3-<g>/{manifest.json, weights.safetensors}). Each round
starts one process per manifest (this script with a hidden `--child`), which loads it (`kern_driver.Runtime`),
captures its graphs, runs one untimed and one timed generation of `--steps` tokens after the same `--context`-token
random prompt (kern-run's pipelined loop, `Qwen3Session.generate`) and exits: one runtime per process, as kern-run's
users run it, ~10 s per manifest and round for 4B (the weights loaded each time).

`--kernels-variant NAME=KDIR` times the manifest itself against another kernels dir (a kernel author's A/B in the
real program: KDIR holds the same module files, some built otherwise, e.g. from a modified source with the same
ABI): every module whose cubin in KDIR differs from DIR/kernels gets KDIR's sha256 in the manifest (they are
listed), and the result is verified against KDIR before it is loaded from there.

`--manifest-variant NAME=PATH` adds a manifest file of the same model (same weights; e.g. one a script rewrote in
ways manifest_variants cannot), verified against DIR/kernels.

`--env-variant NAME=VAR=VALUE[,VAR=VALUE]` times the manifest itself in processes with those environment variables
set (a CUDA driver setting such as CUDA_MODULE_LOADING=EAGER), alternating with the others like any variant.

`--in-process` is the quick screen: every manifest gets its own runtime in this process (all loaded at once: about
the weights' size each, 8 GB for 4B, so a dozen 4B variants fit an H200), warmed up, then each round runs one
generation on every runtime in turn (~0.7 s per 4B manifest and round). Its numbers are not one-runtime numbers: on
the H200 a decode graph replays ~2.5% faster while the process holds other runtimes' graphs (the 4B default
2.418–2.432 ms/token there, 2.468–2.482 one runtime per process and from tools/bench_decode.py), and PDL-related
differences read several times larger there (the attention's trigger after q: +0.053–0.057 in process, +0.008 one
runtime per process; NOTES.md 35–36, tools/gpu/graph_state_probe.py). Dropping the other runtimes' graphs before
each generation does not restore the one-runtime state (session 12). Screen with it; decide without it.

Prints per manifest the ms/token of every round, their median, the difference from the manifest's median, and
whether its tokens equal the manifest's (a variant that changes a summation order, e.g. a ksplit, may differ
after a bf16 near-tie: reported, not an error). `--dry-run` builds and verifies the variants only (no GPU).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from bench_decode import random_prompt  # noqa: E402  (the prompt tools/bench_decode.py times)
from benchinfo import commit, kv_capacity  # noqa: E402
from manifest_variants import VariantError, apply, load_index, read_manifest, verify  # noqa: E402
from prepare import paths, weights_for  # noqa: E402  (tools/gpu/prepare.py's layout; bench_decode puts tools/gpu on the path)


def build(work: Path, geometry: str, variants: list[str]) -> tuple[dict, dict[str, dict]]:
    """The base manifest (dict) and each variant's, verified against DIR/kernels. Raises VariantError."""
    p = paths(work, geometry)
    path = p["manifest"]
    if not path.is_file():
        raise VariantError(f"{path}: no manifest (run tools/gpu/prepare.py --work {work} --geometry {geometry})")
    base = read_manifest(path)
    if errors := verify(base, p["kernels"]):
        raise VariantError(f"{path} itself does not verify against {p['kernels']}:\n  " + "\n  ".join(errors))
    index = load_index(p["kernels"])
    out = {}
    for v in variants:
        m = apply(base, v, index)
        if errors := verify(m, p["kernels"]):
            raise VariantError(f"variant `{v}` does not verify:\n  " + "\n  ".join(errors))
        out[v] = m
    return base, out


def against_kernels(m: dict, base_dir: Path, name: str, kdir: Path) -> tuple[dict, list[str]]:
    """Manifest `m` (verified against `base_dir`) with the sha256 of each module whose cubin in `kdir` differs from
    `base_dir`'s replaced by `kdir`'s, verified against `kdir`; and the names of those modules. `name`: the variant's
    name, for messages.

    Raises:
        VariantError: `kdir` does not exist or is not a folder, lacks a module's cubin, or the result does not
            verify there.
    """
    from kern_verify.kernels import module_file  # where a module's file lives (hf: sources too)

    what = f"kernels variant `{name}` ({kdir})"
    if not kdir.exists():
        raise VariantError(f"{what}: does not exist")
    if not kdir.is_dir():
        raise VariantError(f"{what}: not a folder")
    out = json.loads(json.dumps(m))
    changed = []
    for mname, mod in out["modules"].items():
        f = module_file(kdir, mod["source"])
        if not f.is_file():
            raise VariantError(f"{what}: no {f.relative_to(kdir)} (module `{mname}`); copy the whole kernels dir and "
                               "replace the cubins you built")
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        # the manifest's pin is base_dir's file (it verified there); hash that file only where there is no pin
        pinned = mod.get("sha256") or hashlib.sha256(module_file(base_dir, mod["source"]).read_bytes()).hexdigest()
        if digest != pinned.lower():
            mod["sha256"] = digest
            changed.append(mname)
    if errors := verify(out, kdir):
        raise VariantError(f"the manifest does not verify against {what}:\n  " + "\n  ".join(errors))
    return out, changed


def manifest_variant(base: dict, kernels: Path, name: str, path: Path) -> dict:
    """Another manifest file of the same model (its `model` equals the base's), verified against `kernels` from its
    own text (so diagnostics give its lines). Raises VariantError."""
    from kern_verify.verify import verify_text

    m = read_manifest(path)
    if m.get("model") != base.get("model"):
        raise VariantError(f"manifest variant `{name}` ({path}) is of model `{m.get('model')}`, the manifest of "
                           f"`{base.get('model')}`: a sweep times manifests over the same weights")
    errors = [str(d) for d in verify_text(path.read_text(), kernels_dir=kernels) if d.severity == "error"]
    if errors:
        raise VariantError(f"manifest variant `{name}` ({path}) does not verify against {kernels}:\n  "
                           + "\n  ".join(errors))
    return m


def first_difference(a: list[int], b: list[int]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return "identical" if i is None and len(a) == len(b) else f"differ from step {i}"


def time_one(work: Path, geometry: str, manifest: Path, kernels: Path, context: int, steps: int) -> dict:
    """One runtime in this process: load `manifest` against `kernels` with the work dir's weights, capture the graphs,
    run one untimed and one timed generation of `steps` tokens after the `context`-token prompt; returns
    {"ms": ms/token, "tokens": [...]} (the timed run's)."""
    from kern_driver import Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    p = paths(work, geometry)
    capacity = kv_capacity(context, steps)
    prompt = random_prompt(context)
    rt = Runtime.load(manifest, kernels, weights_for(manifest, p), capacity_tokens=capacity)
    try:
        s = Qwen3Session(rt, ManifestInfo.read(manifest), capacity=capacity, graph=True)
        s.warmup()
        list(s.generate(prompt, steps, 512))
        tokens = list(s.generate(prompt, steps, 512))
        return {"ms": s.stats.decode_ms_per_token, "tokens": tokens}
    finally:
        rt.close()


def run_processes(a, manifests: dict[str, dict], kernels: dict[str, Path],
                  envs: dict[str, dict[str, str]] | None = None) -> tuple[dict, dict]:
    """The default mode: per round, one process per manifest (this script with `--child`), `envs[name]` added to the
    environment of the processes of `name`. Returns (times, tokens) by name. Raises SystemExit naming the manifest
    whose process failed, with the end of its output."""
    times: dict[str, list[float]] = {n: [] for n in manifests}
    tokens: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="program-sweep-") as tmp:
        files = {}
        for i, (name, m) in enumerate(manifests.items()):
            files[name] = Path(tmp) / f"manifest-{i}.json"
            files[name].write_text(json.dumps(m))
        for r in range(a.rounds):
            for name in manifests:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--work", str(a.work), "--geometry", a.geometry,
                       "--context", str(a.context), "--steps", str(a.steps), "--child", str(files[name]),
                       str(kernels[name])]
                env = {**os.environ, **(envs or {}).get(name, {})}
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                last = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
                if done.returncode or not last:
                    tail = "\n    ".join((done.stderr or done.stdout).strip().splitlines()[-8:])
                    raise SystemExit(f"program_sweep: error: the process timing {name} (round {r + 1}) exited "
                                     f"{done.returncode}:\n    {tail}")
                got = json.loads(last[0])
                times[name].append(got["ms"])
                if name in tokens and got["tokens"] != tokens[name]:
                    print(f"  WARNING: {name}: round {r + 1}'s tokens differ from round 1's", flush=True)
                tokens.setdefault(name, got["tokens"])
            print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()), flush=True)
    return times, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--work", required=True, type=Path, help="tools/gpu/prepare.py's --work dir")
    ap.add_argument("--geometry", default="4b", help="the qwen3-<geometry> folder of --work (0.6b, 4b, ...)")
    ap.add_argument("--variant", action="append", default=[], help="a manifest_variants spec; repeat")
    ap.add_argument("--kernels-variant", action="append", default=[], metavar="NAME=KDIR",
                    help="the manifest against another kernels dir (its differing cubins re-hashed); repeat")
    ap.add_argument("--manifest-variant", action="append", default=[], metavar="NAME=PATH",
                    help="another manifest file of the same model, timed beside it; repeat")
    ap.add_argument("--env-variant", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                    help="the manifest itself in a process with these environment variables set (e.g. "
                    "eager=CUDA_MODULE_LOADING=EAGER); repeat; not with --in-process")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens (cached tokens at the first step)")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--append", type=Path, help="append the table (markdown) to this file")
    ap.add_argument("--dry-run", action="store_true", help="build and verify the variants only")
    ap.add_argument("--in-process", action="store_true",
                    help="all runtimes in this process: a quick screen whose numbers are not one-runtime "
                    "numbers (the other runtimes' graphs speed a PDL program up ~2.5%% and inflate "
                    "differences; NOTES.md 35-36)")
    ap.add_argument("--child", nargs=2, metavar=("MANIFEST", "KDIR"), help=argparse.SUPPRESS)  # default mode's worker
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(time_one(a.work, a.geometry, Path(a.child[0]), Path(a.child[1]), a.context, a.steps)))
        return 0
    if len(set(a.variant)) != len(a.variant):
        ap.error("a --variant is given twice")
    named: dict[str, dict[str, Path]] = {"kernels_variant": {}, "manifest_variant": {}}
    for opt, example in (("kernels_variant", "empty-attn=/tmp/kernels-whatif"), ("manifest_variant", "pf=/tmp/pf.json")):
        for item in getattr(a, opt):
            name, eq, path = item.partition("=")
            flag = "--" + opt.replace("_", "-")
            if not (eq and name and path):
                ap.error(f"{flag} {item}: NAME={'KDIR' if opt == 'kernels_variant' else 'PATH'} (e.g. {example})")
            if name == "(manifest)":
                ap.error(f"{flag} {item}: `(manifest)` names the manifest itself; choose another name")
            for other in named:
                if name in named[other]:
                    ap.error(f"{flag} {item}: the name `{name}` is already given by --{other.replace('_', '-')}")
            named[opt][name] = Path(path)
    envs: dict[str, dict[str, str]] = {}
    for item in a.env_variant:
        name, eq, spec = item.partition("=")
        pairs = [kv.partition("=") for kv in spec.split(",")] if spec else []
        if not (eq and name and pairs and all(k and e for k, e, _ in pairs)):
            ap.error(f"--env-variant {item}: NAME=VAR=VALUE[,VAR=VALUE] (e.g. eager=CUDA_MODULE_LOADING=EAGER)")
        if name == "(manifest)" or name in envs or any(name in v for v in named.values()):
            ap.error(f"--env-variant {item}: the name `{name}` is taken; choose another")
        envs[name] = {k: v for k, _, v in pairs}
    if envs and a.in_process:
        ap.error("--env-variant needs one process per manifest: not with --in-process")
    for opt in ("context", "steps", "rounds"):
        if getattr(a, opt) < 1:
            ap.error(f"--{opt} must be at least 1")
    if a.dry_run and a.append:
        print("program_sweep: note: --append is ignored with --dry-run (nothing is timed)", file=sys.stderr)
    p = paths(a.work, a.geometry)
    try:
        base, variants = build(a.work, a.geometry, a.variant)
        kernels = {name: p["kernels"] for name in ["(manifest)", *variants]}
        for name, path in named["manifest_variant"].items():
            variants[name], kernels[name] = manifest_variant(base, p["kernels"], name, path), p["kernels"]
        for name, kdir in named["kernels_variant"].items():
            variants[name], changed = against_kernels(base, p["kernels"], name, kdir)
            kernels[name] = kdir
            print(f"kernels variant {name}: {kdir}, " + (f"modules differing: {', '.join(changed)}" if changed
                                                         else "no module differs (a control run)"))
        for name, env in envs.items():
            variants[name], kernels[name] = base, p["kernels"]
            print(f"env variant {name}: the manifest with " + ", ".join(f"{k}={v}" for k, v in env.items()))
            for k in env:
                if k in os.environ:
                    print(f"  note: {k}={os.environ[k]} is set in this environment: every other process runs with "
                          "it", file=sys.stderr)
    except VariantError as e:
        print(f"program_sweep: error: {e}", file=sys.stderr)
        return 1
    if a.dry_run:
        print(f"manifest: verified; {len(variants)} variant(s)")
        for v in variants:
            print(f"variant {v}: verified")
        return 0

    manifests = {"(manifest)": base, **variants}
    if not a.in_process:
        times, tokens = run_processes(a, manifests, kernels, envs)
        return report(a, times, tokens)

    from kern_driver import KernDriverError, Runtime
    from kern_run.generator import ManifestInfo, Qwen3Session

    capacity = kv_capacity(a.context, a.steps)
    prompt = random_prompt(a.context)
    sessions, runtimes, tokens = {}, [], {}
    try:
        for name, m in manifests.items():
            try:
                rt = Runtime.load(json.dumps(m).encode(), kernels[name], weights_for(m, p), capacity_tokens=capacity)
            except KernDriverError as e:
                oom = "OUT_OF_MEMORY" in (e.cuda_error or "")
                raise SystemExit(f"program_sweep: error: loading {name} (runtime {len(runtimes) + 1} of "
                                 f"{len(manifests)}): {e}" + ("\n  hint: each runtime holds its own weights; pass "
                                                              "fewer --variant per call" if oom else "")) from None
            runtimes.append(rt)
            s = Qwen3Session(rt, ManifestInfo.from_json(m), capacity=capacity, graph=True)
            s.warmup()
            tokens[name] = list(s.generate(prompt, a.steps, 512))  # warm: caches, the last graphs; tokens to compare
            sessions[name] = s
            print(f"loaded {name}", flush=True)
        times: dict[str, list[float]] = {n: [] for n in manifests}
        for r in range(a.rounds):
            for name, s in sessions.items():
                got = list(s.generate(prompt, a.steps, 512))
                if got != tokens[name]:
                    print(f"  WARNING: {name}: round {r + 1}'s tokens differ from its warm run's", flush=True)
                times[name].append(s.stats.decode_ms_per_token)
            print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()), flush=True)
    finally:
        for rt in runtimes:
            rt.close()

    return report(a, times, tokens)


def report(a, times: dict[str, list[float]], tokens: dict[str, list[int]]) -> int:
    """Print (and with --append append) the table of every manifest's rounds, median and difference."""
    med0 = statistics.median(times["(manifest)"])
    where = "one process per manifest and round" if not a.in_process else "all in one process (--in-process)"
    head = (f"kern-run {a.geometry} decode, ms/token: {a.steps} steps after a {a.context}-token prompt, "
            f"{a.rounds} alternating rounds, {where} (tools/gpu/program_sweep.py); {datetime.date.today()}, "
            f"commit {commit()}")
    rows = ["| manifest | " + " | ".join(f"round {i + 1}" for i in range(a.rounds)) + " | median | vs manifest | tokens |",
            "|---|" + "---|" * a.rounds + "---|---|---|"]
    for name, t in times.items():
        med = statistics.median(t)
        rows.append(f"| {name} | " + " | ".join(f"{x:.3f}" for x in t) + f" | {med:.3f} | {med - med0:+.3f} | "
                    + ("—" if name == "(manifest)" else first_difference(tokens[name], tokens["(manifest)"])) + " |")
    table = "\n".join([head, "", *rows])
    print(table)
    if a.append:
        with open(a.append, "a") as f:
            f.write(f"\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
