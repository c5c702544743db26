"""Qwen3 end to end on the GPU: kern-run's greedy tokens equal transformers' on the same checkpoint.

For the 0.6B and 4B geometries (seeded random weights, tools/make_random_checkpoint.py)
and prompts of 1, 34, 85 and 709 random token ids (709 forces two prefill chunks at
chunk 512), kern's 64 greedy tokens must equal
``Qwen3ForCausalLM.generate(do_sample=False, max_new_tokens=64)`` (bf16, same GPU).

Tolerances, and why. Both sides compute in bf16 with f32 accumulation, but round at
different points (kern fuses the residual add into the RMS norm, splits decode
attention over the keys, runs prefill in chunks and the last prompt token as a decode
step; HF runs the prompt as one batch), so neither is "the" answer: the reference is
the same checkpoint evaluated in float32. HF-bf16's own distance from it, e_hf = max
over the vocabulary of |hf_bf16 - fp32| at the first step, is the bf16 noise level
of this model and prompt. kern's first-step logits must satisfy
max |kern - fp32| <= 3 * e_hf (the same kind of noise, rounded elsewhere; a real bug, a
misplaced weight or rotary position, moves logits by their own size, far above it).

A greedy divergence counts only if it is not a bf16 near-tie: at the first step where
the tokens differ, HF's logit gap between its token and kern's, taken from HF's own
logits at that step (the context is still shared), must exceed the noise bound
2 * max(e_hf, e_kern) (two logits, each off by at most that much). A near-tie divergence
passes but is reported (printed, and appended to $KERN_E2E_OUT/e2e_report.jsonl).

Graph and eager runs are the same kernels in the same order: their tokens must be
identical. Chunk 512, 64 and 1 change the prefill GEMM shapes (so the KV bytes may
differ in the last bit): identical tokens are required, except at a step where HF's
gap is inside the noise bound, which is reported.

Paths: KERN_E2E_DIR (the layout of tools/gpu/prepare.py, built there if missing; a
temporary directory otherwise).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
GEOMETRIES = ("0.6b", "4b")
PROMPT_LENGTHS = (1, 34, 85, 709)
STEPS = 64
CAPACITY = 1024
LOGIT_FACTOR = 3.0  # kern's first-step distance from fp32 <= 3 x HF-bf16's

torch = pytest.importorskip("torch", reason="needs torch (GPU machine)")
transformers = pytest.importorskip("transformers", reason="needs transformers (GPU machine)")
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)
try:
    from kern_driver import Runtime
except ImportError as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"kern_driver not importable: {e}", allow_module_level=True)

sys.path.insert(0, str(ROOT / "tools" / "gpu"))
sys.path.insert(0, str(ROOT / "tools"))
from prepare import paths, prepare  # noqa: E402

from kern_run.generator import ManifestInfo, Qwen3Session  # noqa: E402


def random_prompt(n: int, seed: int = 0) -> list[int]:
    """Seeded random regular-token ids (a random model gives every prompt its own path)."""
    return np.random.default_rng(1000 * seed + n).integers(0, 151643, size=n).tolist()


def bf16_to_f32(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def report(record: dict) -> None:
    print("\n[e2e] " + json.dumps(record))
    if out := os.environ.get("KERN_E2E_OUT"):
        with open(Path(out) / "e2e_report.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    d = Path(os.environ["KERN_E2E_DIR"]) if os.environ.get("KERN_E2E_DIR") else tmp_path_factory.mktemp("e2e")
    prepare(d, GEOMETRIES)
    return d


class Model:
    """One geometry: the kern runtime + HF bf16 model, and HF references computed once per prompt."""

    def __init__(self, work: Path, geometry: str):
        p = paths(work, geometry)
        self.geometry = geometry
        self.info = ManifestInfo.read(p["manifest"])
        self.rt = Runtime.load(p["manifest"], p["kernels"], p["weights"], capacity_tokens=CAPACITY)
        self.graph = Qwen3Session(self.rt, self.info, capacity=CAPACITY, graph=True)
        self.eager = Qwen3Session(self.rt, self.info, capacity=CAPACITY, graph=False)
        self.hf_dir = p["hf"]
        self.hf = transformers.Qwen3ForCausalLM.from_pretrained(p["hf"], dtype=torch.bfloat16).cuda().eval()
        self.hf.generation_config.eos_token_id = None  # always 64 tokens
        self.hf.generation_config.pad_token_id = 0
        self._ref: dict[int, dict] = {}
        self._first: dict[int, dict] = {}
        self.fp32: dict[int, np.ndarray] = {}

    def kern(self, prompt, *, graph=True, chunk=512):
        """kern's greedy tokens, and the first step's logits (f32 [V])."""
        s = self.graph if graph else self.eager
        it = s.generate(prompt, STEPS, chunk)
        first = next(it)
        logits = bf16_to_f32(self.rt.read_buffer("logits")).reshape(-1)
        return [first, *it], logits

    @torch.no_grad()
    def ref(self, prompt) -> dict:
        """HF greedy tokens, HF's logits at every step (f32 of bf16), fp32 first-step logits."""
        key = len(prompt)
        if key not in self._ref:
            ids = torch.tensor([prompt], device="cuda")
            out = self.hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=STEPS,
                                   output_logits=True, return_dict_in_generate=True,
                                   cache_implementation="static", disable_compile=True)
            tokens = out.sequences[0, len(prompt):].tolist()
            assert len(tokens) == STEPS
            logits = torch.stack([x[0].float() for x in out.logits]).cpu().numpy()  # [STEPS, V]
            self._ref[key] = {"tokens": tokens, "logits": logits}
        return self._ref[key]

    def first(self, n: int) -> dict:
        """kern graph run at chunk 512 on prompt n, its first-step logits against HF bf16 and fp32."""
        if n not in self._first:
            prompt = random_prompt(n)
            tokens, logits = self.kern(prompt)
            V = self.hf.config.vocab_size
            kern0, hf0, fp0 = logits[:V], self.ref(prompt)["logits"][0][:V], self.fp32[n][:V]
            e_hf = float(np.abs(hf0 - fp0).max())
            e_kern = float(np.abs(kern0 - fp0).max())
            self._first[n] = {
                "tokens": tokens, "logits": kern0,
                "max_abs_kern_vs_hf": float(np.abs(kern0 - hf0).max()),
                "max_abs_hf_bf16_vs_fp32": e_hf, "max_abs_kern_vs_fp32": e_kern,
                "logit_std": float(fp0.std()), "noise_bound": 2 * max(e_hf, e_kern),
            }
        return self._first[n]

    @torch.no_grad()
    def fp32_first_logits(self, prompts) -> dict[int, np.ndarray]:
        """The checkpoint evaluated in float32 on each prompt (logits of its last token)."""
        m = transformers.Qwen3ForCausalLM.from_pretrained(self.hf_dir, dtype=torch.float32).cuda().eval()
        try:
            return {len(p): m(torch.tensor([p], device="cuda")).logits[0, -1].float().cpu().numpy() for p in prompts}
        finally:
            del m
            torch.cuda.empty_cache()

    def close(self):
        self.rt.close()
        del self.hf
        torch.cuda.empty_cache()


@pytest.fixture(scope="module", params=GEOMETRIES)
def model(request, work):
    m = Model(work, request.param)
    m.fp32 = m.fp32_first_logits([random_prompt(n) for n in PROMPT_LENGTHS])
    yield m
    m.close()


def first_difference(a, b) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def check_divergence(m: Model, what: str, n: int, got: list[int], ref_tokens: list[int], ref_logits, bound: float,
                     *, ref_name="hf") -> None:
    """Fail on a divergence from `ref_tokens` unless HF's gap at that step is a bf16 near-tie."""
    i = first_difference(got, ref_tokens)
    if i is None:
        return
    hf_tokens = m.ref(random_prompt(n))["tokens"]
    shared = first_difference(ref_tokens, hf_tokens)
    if ref_logits is None or (shared is not None and shared < i):
        pytest.fail(f"{m.geometry} prompt {n} {what}: tokens differ from {ref_name} at step {i} "
                    f"({got[i]} vs {ref_tokens[i]}) and no HF logits on that context to judge a near-tie")
    row = ref_logits[i]
    gap = float(row[ref_tokens[i]] - row[got[i]])
    top2 = np.sort(row)[-2:]
    rec = {"geometry": m.geometry, "prompt": n, "run": what, "step": i, "ref": ref_name,
           "ref_token": ref_tokens[i], "kern_token": got[i], "gap": gap, "top2_gap": float(top2[1] - top2[0]),
           "noise_bound": bound, "near_tie": gap <= bound}
    report(rec)
    assert gap <= bound, (f"{m.geometry} prompt {n} {what}: real divergence at step {i}: {ref_name} token "
                          f"{ref_tokens[i]} vs kern {got[i]}, HF logit gap {gap:.4f} > bf16 noise bound {bound:.4f}")


@pytest.mark.parametrize("n", PROMPT_LENGTHS)
def test_greedy_matches_hf(model, n):
    f = model.first(n)
    report({"geometry": model.geometry, "prompt": n, "first_step": {k: f[k] for k in (
        "max_abs_kern_vs_hf", "max_abs_hf_bf16_vs_fp32", "max_abs_kern_vs_fp32", "logit_std", "noise_bound")}})
    assert np.isfinite(f["logits"]).all()
    assert f["max_abs_kern_vs_fp32"] <= LOGIT_FACTOR * f["max_abs_hf_bf16_vs_fp32"], (
        f"{model.geometry} prompt {n}: first-step logits max |kern - fp32| = {f['max_abs_kern_vs_fp32']:.4f} > "
        f"{LOGIT_FACTOR} x HF-bf16's {f['max_abs_hf_bf16_vs_fp32']:.4f} "
        f"(max |kern - hf| = {f['max_abs_kern_vs_hf']:.4f})")
    assert f["tokens"][0] == int(np.argmax(f["logits"]))  # the GPU argmax agrees with the logits it left
    ref = model.ref(random_prompt(n))
    check_divergence(model, "graph chunk 512", n, f["tokens"], ref["tokens"], ref["logits"], f["noise_bound"])


@pytest.mark.parametrize("n", [34, 709])
def test_graph_and_eager_are_identical(model, n):
    graph = model.first(n)["tokens"]
    eager, _ = model.kern(random_prompt(n), graph=False)
    assert graph == eager, f"{model.geometry} prompt {n}: graph and eager differ at step {first_difference(graph, eager)}"


@pytest.mark.parametrize("n", [85, 709])
@pytest.mark.parametrize("chunk", [64, 1])
def test_chunk_sizes_give_the_same_tokens(model, n, chunk):
    f = model.first(n)
    other, _ = model.kern(random_prompt(n), chunk=chunk)
    if other != f["tokens"]:
        ref = model.ref(random_prompt(n))
        check_divergence(model, f"chunk {chunk} vs 512", n, other, f["tokens"], ref["logits"], f["noise_bound"],
                         ref_name="kern chunk 512")
