#!/usr/bin/env python3
"""Rewrite a Qwen3 decode program to the one-launch MLP of tools/kernels-src/gemv_mlp.cu (experiment).

    python3 tools/gpu/mlp_variant.py MANIFEST --kernels KDIR --out OUT.json

KDIR must hold gemv_mlp.cubin (nvcc -cubin -arch=sm_90 -O3 -std=c++17 gemv_mlp.cu) beside the manifest's modules.
Per decode layer, `norm_gate_up_silu` + `down_proj_add` become one `mlp` call (kern_mlp_m1, clusters of 8), whose
down output lands in the fixed-point accumulator buffer `mlp_acc` (i64 [hidden]); the next layer's `norm_qkv`
(kern_gemv_norm_acc_m1) and the final `norm_lm_head` (kern_gemv_norm_acc_m1_u5) normalize residual + that output,
and the next `o_proj_add` (kern_gemv_residual_acc_m1) adds both to the residual and clears the accumulator; the
step's embedding (kern_embedding_acc) clears it for layer 0. Launch configurations (grids, ksplits) are the
manifest's own. The result is verified with kern-verify against KDIR before it is written.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path

ACC = "mlp_acc"
MODULE = "gemv_mlp"


def _launch(m: dict, op: str) -> dict:
    return m["ops"][op]["impl"]["launches"][0]


def rewrite(m: dict, kernels: Path, cubin_name: str = f"{MODULE}.cubin", down_prewait: bool = False) -> dict:
    """The decode program of manifest `m` with the one-launch MLP from KDIR/cubin_name (built from gemv_mlp.cu;
    down_prewait: built with -DMLP_DOWN_PREWAIT=1, which needs k·16 more bytes of dynamic shared memory); raises
    ValueError naming what does not fit."""
    out = copy.deepcopy(m)
    cubin = kernels / cubin_name
    if not cubin.is_file():
        raise ValueError(f"{cubin}: not found; build it from tools/kernels-src/gemv_mlp.cu")
    out["modules"][MODULE] = {"source": cubin.name, "sha256": hashlib.sha256(cubin.read_bytes()).hexdigest()}
    hidden = m["buffers"]["residual"]["shape"][1]
    out["buffers"][ACC] = {"dtype": "i64", "shape": [hidden], "class": "workspace"}
    acc_in, acc_io = "in buffer<i64>", "inout buffer<i64>"

    qkv = _launch(m, "gemv_norm_qkv")
    lm = _launch(m, "gemv_norm_lm_head")
    o = _launch(m, "gemv_residual_o_proj")
    gu = _launch(m, "gemv_norm_silu_gate_up")
    emb = _launch(m, "embedding")
    for name, ln, want in (("qkv", qkv, ("kern_gemv_norm_m1", "kern_gemv_norm_m1_u5")),
                           ("lm_head", lm, ("kern_gemv_norm_m1", "kern_gemv_norm_m1_u5")),
                           ("o_proj", o, ("kern_gemv_residual_m1",)),
                           ("gate_up", gu, ("kern_gemv_norm_silu_m1", "kern_gemv_norm_silu_m1_u5"))):
        if ln.get("entry") not in want:
            raise ValueError(f"{name} launches {ln.get('entry')}; this rewrite knows {', '.join(want)} only")

    def norm_acc(src: dict, entry: str) -> dict:
        ln = copy.deepcopy(src)
        ln.update(module=MODULE, entry=entry)
        ln["params"] = [ln["params"][0], acc_in, *ln["params"][1:]]
        ln["args"] = [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, *ln["args"][4:]]
        return {"params": ["in buffer<bf16>", acc_in, "in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>"],
                "impl": {"launches": [ln]}}

    acc_entry = {"kern_gemv_norm_m1": "kern_gemv_norm_acc_m1", "kern_gemv_norm_m1_u5": "kern_gemv_norm_acc_m1_u5"}
    out["ops"]["gemv_norm_acc_qkv"] = norm_acc(qkv, acc_entry[qkv["entry"]])
    out["ops"]["gemv_norm_acc_lm_head"] = norm_acc(lm, acc_entry[lm["entry"]])
    ol = copy.deepcopy(o)
    ol.update(module=MODULE, entry="kern_gemv_residual_acc_m1")
    ol["params"] = [*ol["params"][:3], acc_io, *ol["params"][3:]]
    ol["args"] = [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, *ol["args"][3:]]
    out["ops"]["gemv_residual_acc_o_proj"] = {
        "params": ["in buffer<bf16>", "in buffer<bf16>", "inout buffer<bf16>", acc_io], "impl": {"launches": [ol]}}
    n, k, eps = gu["args"][4]["i32"], gu["args"][5]["i32"], gu["args"][6]["f32"]
    if n % 64 or k % 256 or k > 8192:
        raise ValueError(f"gate_up n={n}, k={k}: kern_mlp_m1 needs n % 64 == 0, k % 256 == 0, k <= 8192")
    out["ops"]["mlp_fused"] = {
        "params": ["in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", acc_io],
        "impl": {"launches": [{
            "module": MODULE, "entry": "kern_mlp_m1",
            "params": ["in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", acc_io,
                       "i32", "i32", "f32"],
            "block": [256, 1, 1], "grid": [n // 8, 1, 1], "shared_mem": (18 if down_prewait else 2) * k, "pdl": True,
            "args": [{"param": i} for i in range(5)] + [{"i32": n}, {"i32": k}, {"f32": eps}]}]}}
    el = copy.deepcopy(emb)
    el.update(module=MODULE, entry="kern_embedding_acc")
    el["params"] = [*el["params"][:3], "out buffer<i64>", *el["params"][3:]]
    el["args"] = [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, *el["args"][3:]]
    out["ops"]["embedding_acc"] = {"params": [*m["ops"]["embedding"]["params"], "out buffer<i64>"],
                                   "impl": {"launches": [el]}}

    acc = {"buf": ACC}
    calls, src = [], m["programs"]["decode"]["calls"]
    i = 0
    while i < len(src):
        c = src[i]
        op = c["op"]
        if op == "embedding":
            calls.append({**c, "op": "embedding_acc", "args": [*c["args"], acc]})
        elif op == "gemv_norm_qkv":
            calls.append({**c, "op": "gemv_norm_acc_qkv", "args": [c["args"][0], acc, *c["args"][1:]]})
        elif op == "gemv_norm_lm_head":
            calls.append({**c, "op": "gemv_norm_acc_lm_head", "args": [c["args"][0], acc, *c["args"][1:]]})
        elif op == "gemv_residual_o_proj":
            calls.append({**c, "op": "gemv_residual_acc_o_proj", "args": [*c["args"], acc]})
        elif op == "gemv_norm_silu_gate_up":
            d = src[i + 1] if i + 1 < len(src) else None
            if d is None or d["op"] != "gemv_residual_down_proj":
                raise ValueError(f"call {c['label']}: not followed by a down_proj call")
            x, nw, wgu = c["args"][:3]
            calls.append({"label": c["label"].rsplit(".", 1)[0] + ".mlp", "op": "mlp_fused",
                          "args": [x, nw, wgu, d["args"][1], acc]})
            i += 1
        else:
            calls.append(c)
        i += 1
    out["programs"]["decode"] = {**m["programs"]["decode"], "calls": calls}
    used = {c["op"] for p in out["programs"].values() for c in p["calls"]}
    for op in [op for op in out["ops"] if op not in used]:
        del out["ops"][op]
    mods = {ln.get("module") for o in out["ops"].values() for ln in o["impl"]["launches"]}
    for mod in [mod for mod in out["modules"] if mod not in mods]:
        del out["modules"][mod]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", type=Path)
    ap.add_argument("--kernels", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cubin", default=f"{MODULE}.cubin", help="the gemv_mlp.cu build in KDIR (default: %(default)s)")
    ap.add_argument("--down-prewait", action="store_true", help="the cubin was built with -DMLP_DOWN_PREWAIT=1")
    a = ap.parse_args(argv)
    from kern_verify.verify import verify_text

    out = rewrite(json.loads(a.manifest.read_text()), a.kernels, a.cubin, a.down_prewait)
    text = json.dumps(out, indent=1)
    diags = verify_text(text, kernels_dir=a.kernels)
    for d in diags:
        print(d, file=sys.stderr)
    if any(d.severity == "error" for d in diags):
        return 1
    a.out.write_text(text)
    print(f"wrote {a.out}: decode {len(out['programs']['decode']['calls'])} calls "
          f"(was {len(json.loads(a.manifest.read_text())['programs']['decode']['calls'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
