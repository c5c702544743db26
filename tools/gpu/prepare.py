#!/usr/bin/env python3
"""Prepare everything a GPU end-to-end run needs, in one work directory (idempotent).

    python3 tools/gpu/prepare.py --work DIR [--geometry 0.6b --geometry 4b] [--seed 0]

Layout written (each step skipped when its result exists):

    DIR/kernels/                     tools/build_kernels.py (cubins + index.json)
    DIR/qwen3-<g>/hf/                tools/make_random_checkpoint.py (seeded random HF checkpoint;
                                     remade, with its export, when its kern_random_init.json records
                                     another init scheme or seed than the script's current one)
    DIR/qwen3-<g>/weights.safetensors   tools/export_weights.py --no-screened-head (the model's weights)
    DIR/qwen3-<g>/lm_head_screen.safetensors   tools/export_weights.py --only-screened-head: the screened lm_head's
                                     int8 copy and row table, loaded beside weights.safetensors for a manifest
                                     that declares them (`weights_for`; gen_qwen3 --lm-head screened, the default):
                                     so one work dir serves manifests of either lm_head (kern binds weights strictly)
    DIR/qwen3-<g>/manifest.json      tools/gen_qwen3.py on DIR/kernels (compared with examples/qwen3-<g>.json;
                                     regenerated every time, with the extra generator flags in
                                     the env var KERN_GEN_FLAGS, e.g. "--no-pdl" or "--gemv gemv")
    DIR/qwen3-<g>/manifest-dense.json   the same with `--lm-head dense` (decode computes the `logits` buffer: what
                                     the e2e test's logit checks and bench_decode's logit-gap statistic read)

The test tests-integration/gpu/test_e2e_qwen3.py and tools/bench_decode.py read
this layout (KERN_E2E_DIR=DIR). Each step's output goes to DIR/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
GEOMETRIES = ("0.6b", "4b")

sys.path.insert(0, str(TOOLS))
from export_weights import SCREEN_Q8, SCREEN_ROWS_FORMAT  # noqa: E402  (numpy only)
from make_random_checkpoint import INIT_VERSION  # noqa: E402  (no torch at import)


def paths(work: Path, geometry: str) -> dict[str, Path]:
    d = Path(work) / f"qwen3-{geometry}"
    return {"dir": d, "hf": d / "hf", "weights": d / "weights.safetensors", "manifest": d / "manifest.json",
            "manifest_dense": d / "manifest-dense.json", "kernels": Path(work) / "kernels",
            "screen": d / "lm_head_screen.safetensors"}


def weights_for(manifest, p: dict[str, Path]) -> list[Path]:
    """The weights files a manifest of this work dir loads: weights.safetensors, plus lm_head_screen.safetensors when
    it declares the screened lm_head's weights. `manifest`: a path, JSON bytes/str, a dict or a kern_schema
    Manifest; `p`: `paths(...)`."""
    if isinstance(manifest, bytes):
        manifest = manifest.decode()
    if isinstance(manifest, str):
        manifest = json.loads(manifest) if manifest.lstrip().startswith("{") else Path(manifest)
    if isinstance(manifest, Path):
        manifest = json.loads(manifest.read_text())
    buffers = manifest["buffers"] if isinstance(manifest, dict) else manifest.buffers
    return [p["weights"]] + ([p["screen"]] if SCREEN_Q8 in buffers else [])


def checkpoint_is_current(hf: Path, geometry: str, seed: int) -> bool:
    """The checkpoint exists and was drawn by the current init scheme with this seed (full depth)."""
    try:
        rec = json.loads((hf / "kern_random_init.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (rec.get("init_version") == INIT_VERSION and rec.get("seed") == seed and rec.get("geometry") == geometry
            and rec.get("layers") is None and (hf / "config.json").is_file())


def step(name: str, argv: list[str], log_dir: Path) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    t0 = time.perf_counter()
    print(f"[prepare] {name}: {' '.join(map(str, argv))}", flush=True)
    with open(log, "w") as f:
        r = subprocess.run([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    tail = log.read_text().strip().splitlines()[-3:]
    print(f"[prepare] {name}: {'ok' if r.returncode == 0 else f'FAILED (exit {r.returncode})'} in "
          f"{time.perf_counter() - t0:.1f} s" + "".join(f"\n    {line}" for line in tail), flush=True)
    if r.returncode:
        raise SystemExit(f"prepare: {name} failed, see {log}")


def prepare(work: Path, geometries=GEOMETRIES, seed: int = 0, rebuild_kernels: bool = False) -> None:
    work = Path(work)
    logs = work / "logs"
    py = sys.executable
    kernels = work / "kernels"
    if rebuild_kernels or not (kernels / "index.json").is_file():
        step("build_kernels", [py, TOOLS / "build_kernels.py", "--out", kernels, "-q"], logs)
    for g in geometries:
        p = paths(work, g)
        if not checkpoint_is_current(p["hf"], g, seed):
            if p["hf"].exists():
                print(f"[prepare] {p['hf']}: not drawn by init scheme {INIT_VERSION} with seed {seed}: remaking it",
                      flush=True)
                shutil.rmtree(p["hf"])
            p["weights"].unlink(missing_ok=True)  # exported from the old checkpoint
            p["screen"].unlink(missing_ok=True)
            step(f"checkpoint-{g}", [py, TOOLS / "make_random_checkpoint.py", "--geometry", g, "--seed", seed,
                                     "--out", p["hf"]], logs)
        if not p["weights"].is_file() or _screened(p["weights"]):  # (an older work dir's export held the screen)
            step(f"export-{g}", [py, TOOLS / "export_weights.py", p["hf"], "--out", p["weights"], "--quiet",
                                 "--no-screened-head"], logs)
        if not p["screen"].is_file() or _screen_format(p["screen"]) != SCREEN_ROWS_FORMAT:  # (an older table)
            step(f"export-screen-{g}", [py, TOOLS / "export_weights.py", p["hf"], "--out", p["screen"], "--quiet",
                                        "--only-screened-head"], logs)
        gen_flags = os.environ.get("KERN_GEN_FLAGS", "").split()  # e.g. "--no-pdl" or "--fused-attention"
        step(f"manifest-{g}", [py, TOOLS / "gen_qwen3.py", "--preset", g, "--kernels", kernels,
                               "--out", p["manifest"], *gen_flags], logs)
        step(f"manifest-dense-{g}", [py, TOOLS / "gen_qwen3.py", "--preset", g, "--kernels", kernels,
                                     "--out", p["manifest_dense"], *gen_flags, "--lm-head", "dense"], logs)
        example = ROOT / "examples" / f"qwen3-{g}.json"
        if example.is_file():
            same = example.read_bytes() == p["manifest"].read_bytes()
            print(f"[prepare] {p['manifest']} {'==' if same else 'DIFFERS from'} {example.relative_to(ROOT)}"
                  + ("" if same else " (kernels built here hash differently, or the example is stale)"), flush=True)


def _metadata(path: Path) -> dict:
    """The `__metadata__` of a safetensors file's header (an 8-byte length, then the JSON header)."""
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def _screen_format(path: Path) -> str | None:
    """The row-table format of a screen file (export_weights' `screened_head_rows` metadata)."""
    return _metadata(path).get("screened_head_rows")


def _screened(weights: Path) -> bool:
    """Whether a weights file holds the screened head's tensors (its metadata says so)."""
    return _metadata(weights).get("screened_head") == "true"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--geometry", action="append", choices=GEOMETRIES, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rebuild-kernels", action="store_true")
    a = ap.parse_args(argv)
    prepare(a.work, a.geometry or GEOMETRIES, a.seed, a.rebuild_kernels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
