"""Shared fixtures of the integration tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SESSION_CACHE: list[str] = []  # the compile cache this session made (removed at its end)


def pytest_configure(config: pytest.Config) -> None:
    """One compile cache for the whole session (tools/build_kernels.py's KERN_BUILD_CACHE, inherited by the
    builds the fixtures run as subprocesses): the fixtures build the same modules many times over (the default
    build, --no-pdl, --fused-attention, --l2-prefetch, -D variants), and a repeated compile is then a file read
    of the same bytes. A cache the caller set is used as it is. test_kernels_build's reproducibility test builds
    with --no-cache, so two real compiles are still compared."""
    import os
    import tempfile

    if not os.environ.get("KERN_BUILD_CACHE"):
        _SESSION_CACHE.append(tempfile.mkdtemp(prefix="kern-build-cache-"))
        os.environ["KERN_BUILD_CACHE"] = _SESSION_CACHE[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    import os
    import shutil

    for d in _SESSION_CACHE:
        shutil.rmtree(d, ignore_errors=True)
        if os.environ.get("KERN_BUILD_CACHE") == d:
            del os.environ["KERN_BUILD_CACHE"]
EXAMPLES = [ROOT / "examples" / "qwen3-0.6b.json", ROOT / "examples" / "qwen3-4b.json"]

#: Default modules no example uses: the Triton decode attention, which the CUDA C one replaced as the
#: examples' impl (2026-11-29; `gen_qwen3.py --decode-attention triton` still selects it, and the GPU tests
#: and benches compare against it); since the examples are --pdl manifests (2026-11-29), the base forms of
#: the decode-only kernels their PDL twins replaced (`gen_qwen3.py --no-pdl`), and the PDL forms they do not
#: launch (the embedding is decode's first launch), and the persistent GEMVs (`--gemv persistent`; the 0.6B example
#: used them until session 5, when gemv.cu overtook them). Pinned as the examples had them or as built and tested on
#: the H200 (tests-integration/gpu: the PDL twins bit-identical to their base forms).
UNUSED_BY_EXAMPLES = {
    "paged_decode_attention.cubin": "b7ccaee62356398ae78ed5fd75cb88ec62df0d509e70c331a6ff40c7e6515732",
    "paged_decode_reduce.cubin": "4aa5b00c5a5e8e8503ef217ba94f7fca85d256b795c91a189569d63b9db99003",
    "paged_decode_attention_pdl.cubin": "78ebfb7f5611197fc131f9254505eb4c218bbf88672be7d9260a9db98b938d8d",
    "paged_decode_reduce_pdl.cubin": "4a513798e18e2184b16acb05c5d481e06757824509c5950221fea0d7b6ed182d",
    "argmax.cubin": "d128f74af9ac7f8a433fb47a12c5478d51af13da487b07fae2ff4b445f60ee89",
    # session 28: the cluster barrier's wait at entry after a relaxed arrive, the receive wait at CTA scope
    "decode_attention.cubin": "bbabea8b641320f2c179a693af916df930345585e1ed76b361d5a3b9b98f71e5",
    "embedding_pdl.cubin": "382e706a4e75cbeea6768c01aabd7271c415274bd5e9aeb867e46f01bcfb7704",
    "gemv_persist.cubin": "399ff4e1f58a483e5639ce11f8a24faabfdd5bc9e0a35a5ef607a4c816501255",
    # the decode prologue's PDL form: since session 8 the examples' decode attention (rope-cluster) does its work
    "qk_norm_rope_kv_pdl.cubin": "24f874287b2608a5e1de912825aa5bba0ab5aaa902f607538108e5da2c7fe1a7",
    # session 32: every decode GEMV of the examples on gemv_tc.cu; gemv.cu's modules serve `--gemv gemv-fma` (validated
    # on the H200 as the examples of session 31, unchanged since)
    "gemv.cubin": "c7b152ab36394c8014321816a3d303779312b21d885f2b195ca30e3df753bd3e",
    "gemv_p2.cubin": "b93fa9c3c06dc8cfeaabf5277e418ca70f4f4bdf57c070188e38f64a36373f47",
}
# (lm_head_screen.cubin left this dict in session 24, when the screened lm_head became gen_qwen3.py's default: the
# examples pin it now. Their screened op's reduce is argmax_pdl.cubin's argmax_reduce, the dense argmax's module,
# so argmax.cubin stays unused and no module left the examples with the dense lm_head.)


@pytest.fixture(scope="session")
def pinned_modules() -> dict[str, str]:
    """module file -> sha256 of every default module: those the committed examples pin, and
    UNUSED_BY_EXAMPLES (which no example may use)."""
    pinned = dict(UNUSED_BY_EXAMPLES)
    for ex in EXAMPLES:
        for mod in json.loads(ex.read_text())["modules"].values():
            assert mod["source"] not in UNUSED_BY_EXAMPLES, mod["source"]
            pinned.setdefault(mod["source"], mod["sha256"])
    return pinned


@pytest.fixture(scope="session")
def built_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real kernels of the example geometries, built once per session by tools/build_kernels.py (nvcc +
    Triton AOT) for every module that needs them."""
    d = tmp_path_factory.mktemp("kernels")
    geometries = [a for ex in EXAMPLES for a in ("--geometry", ex.stem.removeprefix("qwen3-"))]
    subprocess.run([sys.executable, str(ROOT / "tools" / "build_kernels.py"), "--out", str(d), "-q", *geometries],
                   check=True)
    return d


def _generated_examples(built_kernels: Path, tmp: Path, name: str, *flags: str) -> dict[str, Path]:
    """{geometry: tmp/qwen3-G-NAME.json} generated by `tools/gen_qwen3.py --preset G FLAGS` on `built_kernels`, for each
    of the examples' geometries."""
    out = {}
    for ex in EXAMPLES:
        g = ex.stem.removeprefix("qwen3-")
        out[g] = tmp / f"qwen3-{g}-{name}.json"
        subprocess.run([sys.executable, str(ROOT / "tools" / "gen_qwen3.py"), "--preset", g, *flags,
                        "--kernels", str(built_kernels), "--out", str(out[g])], check=True, stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="session")
def dense_examples(built_kernels: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The examples' manifests with the dense lm_head, by geometry ("4b", "0.6b"): `tools/gen_qwen3.py --preset G
    --lm-head dense` on `built_kernels`. Their decode ends with `gemv_norm_lm_head` (a GEMV into `logits`) + `argmax`
    (two launches) where the examples, generated with the default `--lm-head screened`, end with the one op
    `norm_lm_head_argmax_screened`. For the tools' behaviour on the dense ops (NOTES.md 54's lm_head what-if, dropping
    the argmax, the one-launch MLP rewrite's final norm, ...)."""
    out = _generated_examples(built_kernels, tmp_path_factory.mktemp("dense"), "dense", "--lm-head", "dense")
    for path in out.values():
        m = json.loads(path.read_text())
        assert {"gemv_norm_lm_head", "argmax"} <= set(m["ops"]) and "norm_lm_head_argmax_screened" not in m["ops"]
        assert len(m["ops"]["argmax"]["impl"]["launches"]) == 2 and "logits" in m["buffers"]
    return out


@pytest.fixture(scope="session")
def fma_examples(built_kernels: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The examples' manifests with gemv.cu for every decode GEMV, by geometry ("4b", "0.6b"): `tools/gen_qwen3.py
    --preset G --gemv gemv-fma` on `built_kernels` (the manifests before session 30). Their four decode GEMV ops launch
    gemv.cu's entries (module gemv, or gemv_p2 for 4B's qkv; o at ksplit 2) where the examples launch gemv_tc.cu's
    tensor-core entries (every decode GEMV since session 32); the other ops are the examples'. For the tools that
    rewrite gemv.cu launches (ksplit, entries, what-if modules)."""
    out = _generated_examples(built_kernels, tmp_path_factory.mktemp("fma"), "fma", "--gemv", "gemv-fma")
    gemvs = ("gemv_norm_qkv", "gemv_residual_o_proj", "gemv_norm_silu_gate_up", "gemv_residual_down_proj")
    for ex in EXAMPLES:
        m, e = json.loads(out[ex.stem.removeprefix("qwen3-")].read_text()), json.loads(ex.read_text())
        assert {m["ops"][op]["impl"]["launches"][0]["module"] for op in gemvs} <= {"gemv", "gemv_p2"}
        assert {e["ops"][op]["impl"]["launches"][0]["module"] for op in gemvs} == {"gemv_tc"}
        assert {op: o for op, o in m["ops"].items() if op not in gemvs} == {op: o for op, o in e["ops"].items()
                                                                           if op not in gemvs}
    return out


@pytest.fixture(scope="session")
def dense_fma_4b(built_kernels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 4B example with the dense lm_head and gemv.cu for every decode GEMV (`tools/gen_qwen3.py --preset 4b
    --lm-head dense --gemv gemv-fma`): the manifest where module `gemv` serves qkv's neighbours, gate_up and the
    lm_head GEMV, for the what-if tools' module and grid rewrites of gemv.cu launches."""
    out = _generated_examples(built_kernels, tmp_path_factory.mktemp("dense_fma"), "dense-fma", "--lm-head", "dense",
                              "--gemv", "gemv-fma")["4b"]
    m = json.loads(out.read_text())
    assert m["ops"]["gemv_norm_lm_head"]["impl"]["launches"][0]["module"] == "gemv"
    return out


@pytest.fixture(scope="session")
def fma_4b(fma_examples: dict[str, Path]) -> Path:
    """`fma_examples["4b"]`."""
    return fma_examples["4b"]


@pytest.fixture(scope="session")
def dense_4b(dense_examples: dict[str, Path]) -> Path:
    """`dense_examples["4b"]`."""
    return dense_examples["4b"]
