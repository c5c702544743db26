#!/usr/bin/env python3
"""Does the PDL boundary wait on the next kernel's weight loads, or on an SM's shared-memory configuration? Memory
synchronization domains and shared-memory carveouts, probed (issue 9).

    python3 tools/gpu/sync_domain_probe.py --work DIR [--geometry 4b] [--mode default --mode alt2 ...]
        [--rounds 3] [--context 128] [--steps 256]

NOTES.md 26 found that the gap between a GEMV's last block and its successor's griddepcontrol.wait return grows with
the weight loads the successor issued before its wait (0.65–0.8 µs when those loads were only L2 prefetches, up to
2.4 µs with two register stages). One reading: a grid's completion flush (the implicit fence that makes its writes
visible to the dependent grid) waits on every memory operation in flight in its memory synchronization domain
(CUDA programming guide 4.14, "Memory Synchronization Domains": a flush casts "a conservatively wide net for in-flight
memory operations"), the dependent grid's many MB of pre-wait loads included. Hopper has several domains; kernels in
different domains do not wait on each other's operations at a fence. This probe puts the decode program's kernels in
alternating domains and times kern-run's decode loop, one runtime per process, as tools/gpu/program_sweep.py does.

Modes (each the same manifest; only the captured graphs' kernel nodes change, through
cuGraphKernelNodeSetAttribute(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP) between capture and instantiation):
    default   nothing set (every kernel in domain 0)
    same1     every kernel node in domain 1 (control: another ID, no boundary between domains)
    alt2      kernel node i (capture order) in domain i % 2
    cycle4    kernel node i in domain i % N (N = CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, at most 4)
    coP       every function of the runtime with CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = P (percent of
              the 228 KB maximum; a hint the driver rounds to a supported configuration). An SM runs blocks of one
              shared-memory configuration at a time, so a PDL successor whose driver-chosen configuration differs
              from its predecessor's (the decode attention's 137 KB CTAs, before session 19, after a GEMV's 5 KB
              blocks) may have to wait for whole SMs to drain; one configuration for every kernel would let them
              co-reside (NOTES.md 19–20: 100 on the GEMV chain alone cost it its L1). A launch whose manifest gives
              it a `carveout` (since session 19 the default's decode attention, 0) keeps it: CUDA's launch attribute
              takes precedence over the function attribute. The child's stats name those ops (`carveout_kept_ops`).
    coP@OP[,OP]  the same for the functions the named decode ops launch only (e.g. co72@gemv_norm_qkv); ops that share a
              function share its carveout (give one its own module copy with tools/manifest_whatif.py --op-module and
              time that manifest with --manifest). An op whose launch has its own `carveout` is refused (this mode
              could not change it): time a manifest with `tools/manifest_variants.py --variant OP.carveout=P` instead.
    A+B       several (e.g. alt2+co72, co40@gemv_norm_qkv+co10@gemv_residual_o_proj)

Prints per mode the ms/token of every round, the median, the difference from `default`'s median and whether the
tokens equal default's. A probe, not a kern feature: the runtime is patched in this process only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

DOMAIN_MODES = ("default", "same1", "alt2", "cycle4")


def parse_mode(mode: str) -> tuple[str, dict[str | None, int]]:
    """(domain mode, {op name or None for every function: carveout percent}) of a mode string; raises ValueError
    naming a bad part."""
    dom, co = "default", {}
    for part in mode.split("+"):
        pct, _, ops = part.partition("@")
        if part in DOMAIN_MODES:
            dom = part
        elif (pct.startswith("co") and pct[2:].isdigit() and 0 <= int(pct[2:]) <= 100
              and ("@" not in part or all(ops.split(",")))):
            for op in ops.split(",") if ops else [None]:
                co[op] = int(pct[2:])
        else:
            raise ValueError(f"mode {mode!r}: {part!r} is neither a domain mode ({', '.join(DOMAIN_MODES)}) nor "
                             "coP[@OP,...] with P in 0..100")
    return dom, co


def domain_of(mode: str, i: int, count: int) -> int | None:
    """The domain ID of kernel node `i` (capture order) under domain mode `mode`; None: leave the node as captured."""
    if mode == "default":
        return None
    if mode == "same1":
        return 1
    if mode == "alt2":
        return i % 2
    if mode == "cycle4":
        return i % min(count, 4)
    raise ValueError(f"unknown domain mode {mode!r} (one of {', '.join(DOMAIN_MODES)})")


def function_carveouts(manifest, entries: dict, carveout: dict[str | None, int]) -> tuple[list[tuple], list[str]]:
    """The functions a coP mode gives a preferred carveout, as [(handle, percent, op)] (one per function), and the
    ops whose launches keep the manifest's own `carveout` (CUDA: the launch attribute takes precedence over the
    function attribute, so the mode cannot change them). `manifest`: the kern_schema Manifest; `entries`:
    kern_driver's {(op, launch index): resolved entry} (`.handle`, `.entry`); `carveout`: parse_mode's.

    Raises:
        ValueError: an op of `carveout` the manifest lacks; an op named whose launch carries its own carveout; two
            ops that share a function given different percents.
    """
    ops = {op for op, _ in entries}
    named = {op for op in carveout if op is not None}
    if unknown := sorted(named - ops):
        raise ValueError(f"no op {unknown} in the manifest (ops: {sorted(ops)})")
    by_handle: dict[int, tuple] = {}
    kept: list[str] = []
    for (op, li), e in entries.items():
        pct = carveout.get(op, carveout.get(None))
        if pct is None:
            continue
        own = manifest.ops[op].impl.launches[li].carveout
        if own is not None:
            if op in named:
                raise ValueError(
                    f"co{pct}@{op}: op {op}'s launch {li} carries its own carveout {own} (the manifest's `carveout`), "
                    "which takes precedence over the function attribute this mode sets; time a manifest with the "
                    f"launch's carveout changed instead: tools/manifest_variants.py MANIFEST --kernels KDIR --variant "
                    f"{op}.carveout={pct} --out V.json, then --manifest V.json")
            kept.append(op)
            continue
        key = int(e.handle)
        if key in by_handle and by_handle[key][1] != pct:
            raise ValueError(f"op {op} shares entry `{e.entry}` with op {by_handle[key][2]}, which was given carveout "
                             f"{by_handle[key][1]}, not {pct} (give one its own module copy: tools/manifest_whatif.py "
                             "--op-module)")
        by_handle[key] = (e.handle, pct, op)
    return list(by_handle.values()), sorted(set(kept))


def patch_runtime(mode: str) -> dict:
    """Make kern_driver.runtime's cuGraphInstantiate first set each kernel node's domain map per `mode`, and its
    Runtime set every function's preferred carveout after loading. Returns the counters it fills (graphs, kernel
    nodes, domains used, functions given a carveout)."""
    import kern_driver.runtime as kr
    from cuda.bindings import driver as drv

    mode, carveout = parse_mode(mode)

    def ok(r, what):
        err = r[0] if isinstance(r, tuple) else r
        if err != drv.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"sync_domain_probe: {what} failed: {err}")
        return r[1] if isinstance(r, tuple) and len(r) == 2 else r

    stats = {"graphs": 0, "kernel_nodes": 0, "domains": set(), "domain_count": None, "carveout_functions": 0,
             "carveout_kept_ops": []}

    if carveout:
        load = kr.Runtime._load

        def _load(self, *args, **kw):
            load(self, *args, **kw)
            try:
                funcs, stats["carveout_kept_ops"] = function_carveouts(self.manifest, self.entries, carveout)
            except ValueError as e:
                raise SystemExit(f"sync_domain_probe: {e}") from None
            for h, pct, op in funcs:
                ok(drv.cuFuncSetAttribute(
                    h, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, pct),
                    f"cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT = {pct}) for op {op}")
                stats["carveout_functions"] += 1

        kr.Runtime._load = _load

    class Proxy:
        def __getattr__(self, name):
            return getattr(drv, name)

        @staticmethod
        def cuGraphInstantiate(g, flags):
            if stats["domain_count"] is None:
                d = ok(drv.cuCtxGetDevice(), "cuCtxGetDevice")
                stats["domain_count"] = ok(drv.cuDeviceGetAttribute(
                    drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, d), "cuDeviceGetAttribute")
            r = drv.cuGraphGetNodes(g, 0)
            ok(r[0], "cuGraphGetNodes (count)")
            n = r[2]
            r = drv.cuGraphGetNodes(g, n)
            ok(r[0], "cuGraphGetNodes")
            nodes = r[1][: r[2]]
            k = 0
            for node in nodes:
                t = ok(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType")
                if t != drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                    continue
                dom = domain_of(mode, k, stats["domain_count"])
                k += 1
                if dom is None:
                    continue
                v = drv.CUkernelNodeAttrValue()
                v.memSyncDomainMap.default_ = dom
                v.memSyncDomainMap.remote = dom
                ok(drv.cuGraphKernelNodeSetAttribute(
                    node, drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, v),
                    "cuGraphKernelNodeSetAttribute(MEM_SYNC_DOMAIN_MAP)")
                stats["domains"].add(dom)
            stats["graphs"] += 1
            stats["kernel_nodes"] += k
            return drv.cuGraphInstantiate(g, flags)

    kr.drv = Proxy()
    return stats


def child(a) -> None:
    from program_sweep import time_one
    from prepare import paths

    stats = patch_runtime(a.child)
    p = paths(a.work, a.geometry)
    got = time_one(a.work, a.geometry, a.manifest or p["manifest"], p["kernels"], a.context, a.steps)
    got["stats"] = {**stats, "domains": sorted(stats["domains"])}
    print(json.dumps(got))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--geometry", default="4b")
    ap.add_argument("--mode", action="append", help="modes to time (default: the domain modes; `default` always)")
    ap.add_argument("--manifest", type=Path, help="another manifest of the model (default: the work dir's), verified "
                    "against the work dir's kernels when loaded")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return 0
    modes = ["default"] + [m for m in (a.mode or DOMAIN_MODES) if m != "default"]
    for m in modes:
        try:
            parse_mode(m)
        except ValueError as e:
            ap.error(str(e))
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, list[int]] = {}
    for r in range(a.rounds):
        for m in modes:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--work", str(a.work), "--geometry", a.geometry,
                   "--context", str(a.context), "--steps", str(a.steps), "--child", m]
            if a.manifest:
                cmd += ["--manifest", str(a.manifest)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            last = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
            if done.returncode or not last:
                tail = "\n    ".join((done.stderr or done.stdout).strip().splitlines()[-10:])
                print(f"mode {m} round {r + 1} failed (exit {done.returncode}):\n    {tail}", flush=True)
                continue
            got = json.loads(last[0])
            times[m].append(got["ms"])
            tokens.setdefault(m, got["tokens"])
            if r == 0:
                print(f"  {m}: {got['stats']}", flush=True)
        print(f"round {r + 1}: " + ", ".join(f"{m} {t[-1]:.4f}" for m, t in times.items() if t), flush=True)
    base = statistics.median(times["default"]) if times["default"] else None
    print(f"\n{a.geometry}, {a.context}-token prompt, {a.steps} steps, one runtime per process, {a.rounds} rounds")
    print("| mode | ms/token (rounds) | median | vs default | tokens |")
    print("|---|---|---:|---:|---|")
    for m, t in times.items():
        if not t:
            print(f"| {m} | failed | | | |")
            continue
        med = statistics.median(t)
        same = "identical" if tokens.get(m) == tokens.get("default") else "DIFFER"
        print(f"| {m} | {', '.join(f'{x:.4f}' for x in t)} | {med:.4f} | {med - base:+.4f} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
