"""The opt-in compile cache of tools/build_kernels.py (`--cache DIR`, `KERN_BUILD_CACHE=DIR`, `--no-cache`): no GPU.

- a build into an empty cache gives the bytes of an uncached build (`built_kernels`, conftest.py) and fills one entry
  per module; a second build on that cache runs neither nvcc nor Triton and writes the same files, index.json
  included (both builds are of a subset of the catalog, every Triton instance and the cheap CUDA modules, in-process,
  to keep the file fast: gemv.cu alone takes most of a full build);
- the keys follow every input of a compile (defines, a byte of any kernels-src file, Triton options, nvcc's
  version, build_kernels.py itself) and nothing else (not the path of kernels-src);
- a damaged or half-written entry is a miss, and the compile repairs it; entries are written atomically;
- `--no-cache` wins over KERN_BUILD_CACHE, and the cache is off without either;
- the tests' own nvcc runs (nvcc_jobs.nvcc_builds) share the cache: a cold cache stores the bytes of an uncached
  compile, still started together, a warm one runs no nvcc, and a default module is build_kernels' entry; a source
  outside kernels-src and a failed compile are never stored.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import build_kernels as bk  # noqa: E402
from geometries import load_geometry  # noqa: E402  (kernels-src, on sys.path through build_kernels)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import nvcc_builds  # noqa: E402  (this folder's helpers)

GEOMETRIES = ["0.6b", "4b"]  # built_kernels' geometries (the examples')
SUBSET_CUDA = ("embedding.cu", "argmax.cu")  # CUDA modules of the subset: a module of several entries, a -D form
ALL_INSTANCES = bk.instances


def _subset(*a, **kw):
    """catalog.instances without the slow CUDA modules (gemv.cu's take ~20 s each)."""
    return [k for k in ALL_INSTANCES(*a, **kw) if k.lang == "triton" or k.source in SUBSET_CUDA]


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _need_toolchain() -> None:
    pytest.importorskip("triton")
    try:
        bk._nvcc()
    except SystemExit:
        pytest.skip("nvcc not found")


@pytest.fixture
def restore_env():
    """build() and compile_triton set Triton's private variables, main() KERN_BUILD_CACHE: undo it all."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Path, Path]:
    """The subset built with the cache into an empty cache dir (Triton in a pool of 2): (kernels dir, cache dir)."""
    _need_toolchain()
    d = tmp_path_factory.mktemp("cache_cold")
    saved = dict(os.environ)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bk, "instances", _subset)
            mp.setenv(bk.CACHE_ENV, str(d / "cache"))
            bk.build(d / "kernels", GEOMETRIES, jobs=2, quiet=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return d / "kernels", d / "cache"


def _keys() -> dict[str, str]:
    """module file -> cache key, for the subset's modules."""
    keys = {}
    for k in _subset([load_geometry(g) for g in GEOMETRIES], pdl=True):
        keys[k.module] = bk.cuda_key(k.source, k.defines) if k.lang == "cuda" else bk.triton_key(k)
    return keys


# ------------------------------------------------------------------ builds


def test_cold_cache_build_is_the_uncached_build(cold, built_kernels):
    out, cache = cold
    idx = json.loads((out / "index.json").read_text())
    ref = json.loads((built_kernels / "index.json").read_text())
    names = {k.name for k in _subset([load_geometry(g) for g in GEOMETRIES], pdl=True)}
    assert set(idx["kernels"]) == names
    for name, data in _files(out).items():
        if name != "index.json":
            assert data == (built_kernels / name).read_bytes(), f"{name} differs from the uncached build"
    # index.json: byte for byte the uncached build's, less the kernels the subset leaves out
    ref["kernels"] = {n: e for n, e in ref["kernels"].items() if n in names}
    assert (out / "index.json").read_text() == json.dumps(ref, indent=1, sort_keys=True) + "\n"
    # one entry (cubin + json) per module, its bytes those of the module; no temp file left
    keys = _keys()
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{key}.{ext}" for key in keys.values()
                                                             for ext in ("cubin", "json"))
    for mod, key in keys.items():
        assert (cache / f"{key}.cubin").read_bytes() == (out / mod).read_bytes(), mod


def test_warm_cache_build_compiles_nothing(cold, tmp_path, monkeypatch, restore_env):
    out, cache = cold
    before = _files(cache)
    monkeypatch.setattr(bk, "instances", _subset)
    monkeypatch.setenv(bk.CACHE_ENV, str(cache))
    bk._nvcc_version(bk._nvcc())  # `nvcc --version` (the key's), once per process: before Popen is refused

    def refuse(*a, **kw):
        raise AssertionError("compiled on a warm cache")

    monkeypatch.setattr(bk.subprocess, "Popen", refuse)
    monkeypatch.setattr(bk, "triton_compiled", refuse)
    monkeypatch.setattr(bk, "ProcessPoolExecutor", refuse)
    bk.build(tmp_path / "k", GEOMETRIES, quiet=True)
    assert _files(tmp_path / "k") == _files(out)
    assert _files(cache) == before  # hits write nothing


# ------------------------------------------------------------------ keys


@pytest.fixture(scope="module")
def tri():
    """Triton instances of the 4B geometry by NAME (with the PDL forms)."""
    _need_toolchain()
    return {k.name: k for k in bk.instances([load_geometry("4b")], pdl=True) if k.lang == "triton"}


def test_cuda_key(tmp_path, monkeypatch):
    _need_toolchain()
    key = bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",))
    assert key == bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) and len(key) == 64
    others = [bk.cuda_key("gemv.cu"), bk.cuda_key("gemv.cu", ("GEMV_PASSES=3",)),
              bk.cuda_key("gemv.cu", ("GEMV_PASSES=2", "KERN_PDL")), bk.cuda_key("argmax.cu", ("GEMV_PASSES=2",))]
    assert len({key, *others}) == 5
    # the key of nvcc_jobs.py's run of the same command line, and of its PTX run: another kind of entry
    assert bk.nvcc_key([*bk.NVCC_FLAGS, "-DGEMV_PASSES=2", "gemv.cu"]) == key
    ptx = [f for f in bk.NVCC_FLAGS if f != "-cubin"] + ["-ptx", "-DGEMV_PASSES=2", "gemv.cu"]
    assert bk.nvcc_key(ptx) not in {key, *others}
    # the path of kernels-src is no input; the bytes and names of its files are
    src = shutil.copytree(bk.SRC, tmp_path / "src")
    monkeypatch.setattr(bk, "SRC", src)
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) == key
    (src / "README.md").write_text("not read by nvcc")
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) == key
    header = src / "argmax_key.cuh"  # a header gemv.cu does not include: the key takes every one
    header.write_bytes(header.read_bytes() + b" ")
    changed = bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",))
    assert changed != key
    (src / "new.h").write_text("")
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) not in (key, changed)
    monkeypatch.undo()
    # nvcc's version, the flags nvcc reads from the environment, build_kernels.py itself
    monkeypatch.setattr(bk, "_nvcc_version", lambda nvcc: "nvcc: release 99.9")
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) != key
    monkeypatch.undo()
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-lineinfo")
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) != key
    monkeypatch.undo()
    me = tmp_path / "build_kernels.py"
    me.write_bytes(Path(bk.__file__).read_bytes() + b"\n")
    monkeypatch.setattr(bk, "__file__", str(me))
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) != key
    monkeypatch.undo()
    assert bk.cuda_key("gemv.cu", ("GEMV_PASSES=2",)) == key


def test_triton_key(tri, tmp_path, monkeypatch):
    k = tri["paged_decode_attention"]
    key = bk.triton_key(k)
    assert key == bk.triton_key(dataclasses.replace(k)) and len(key) == 64
    # the instance's NAME and doc are no input of the compile; its definition is
    assert bk.triton_key(dataclasses.replace(k, name="other", doc="other")) == key
    # the PDL default: an instance that does not ask for PDL compiles with PDL = False
    assert bk.triton_key(dataclasses.replace(k, constexprs={**k.constexprs, "PDL": False})) == key
    assert bk.triton_key(tri["paged_decode_attention_pdl"]) != key
    p0 = k.params[0]
    others = [dataclasses.replace(k, num_warps=8), dataclasses.replace(k, num_stages=3),
              dataclasses.replace(k, constexprs={**k.constexprs, "BLOCK_N": 32}),
              dataclasses.replace(k, params=(dataclasses.replace(p0, div16=False), *k.params[1:])),
              dataclasses.replace(k, params=(dataclasses.replace(p0, type="in buffer<f16>"), *k.params[1:]))]
    keys = {bk.triton_key(o) for o in others}
    assert len(keys) == len(others) and key not in keys
    # every *.py of kernels-src, byte for byte; not its CUDA sources
    src = shutil.copytree(bk.SRC, tmp_path / "src")
    monkeypatch.setattr(bk, "SRC", src)
    assert bk.triton_key(k) == key
    (src / "gemv.cu").write_text("")
    assert bk.triton_key(k) == key
    (src / "geometries.py").write_bytes((src / "geometries.py").read_bytes() + b"\n")
    assert bk.triton_key(k) != key
    monkeypatch.undo()
    # Triton's knobs in the environment, but those _private_env sets for every compile
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "0")
    assert bk.triton_key(k) == key
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert bk.triton_key(k) != key


# ------------------------------------------------------------------ damaged entries, atomic writes


def _damage(cache: Path, key: str, how: str) -> None:
    cubin, meta = cache / f"{key}.cubin", cache / f"{key}.json"
    if how == "cubin truncated":
        cubin.write_bytes(cubin.read_bytes()[:100])
    elif how == "cubin byte flipped":
        data = bytearray(cubin.read_bytes())
        data[len(data) // 2] ^= 1
        cubin.write_bytes(bytes(data))
    elif how == "json not json":
        meta.write_text('{"sha256": ')
    elif how == "json without shared":  # its sha256 right
        m = json.loads(meta.read_text())
        del m["shared"]
        meta.write_text(json.dumps(m))
    else:  # "cubin missing", "json missing": a half-written entry
        (cubin if how == "cubin missing" else meta).unlink()


@pytest.mark.parametrize("how", ["cubin truncated", "cubin byte flipped", "json not json", "cubin missing",
                                 "json missing"])
def test_damaged_cuda_entry_is_a_miss_and_repaired(cold, built_kernels, tmp_path, monkeypatch, restore_env, how):
    _, cold_cache = cold
    cache = tmp_path / "cache"
    key = bk.cuda_key("embedding.cu")
    cache.mkdir()
    for ext in ("cubin", "json"):
        shutil.copy(cold_cache / f"{key}.{ext}", cache)
    assert bk.cache_get(cache, key)[0] == (built_kernels / "embedding.cubin").read_bytes()
    _damage(cache, key, how)
    assert bk.cache_get(cache, key) is None
    monkeypatch.setenv(bk.CACHE_ENV, str(cache))
    with tempfile.TemporaryDirectory() as t:
        job = bk.start_cuda("embedding.cu", t)
        assert job.proc is not None  # a miss: nvcc runs
        data = bk.finish_cuda(job)
    assert data == (built_kernels / "embedding.cubin").read_bytes()
    assert bk.cache_get(cache, key)[0] == data  # repaired
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.cubin", f"{key}.json"]


@pytest.mark.parametrize("how", ["json not json", "json without shared"])
def test_damaged_triton_entry_is_a_miss_and_repaired(cold, built_kernels, tri, tmp_path, monkeypatch, restore_env,
                                                     how):
    _, cold_cache = cold
    k = tri["rms_norm_h2560"]
    cache = tmp_path / "cache"
    key = bk.triton_key(k)
    cache.mkdir()
    for ext in ("cubin", "json"):
        shutil.copy(cold_cache / f"{key}.{ext}", cache)
    _damage(cache, key, how)
    monkeypatch.setenv(bk.CACHE_ENV, str(cache))
    assert bk._triton_cached(k) is None
    ref = json.loads((built_kernels / "index.json").read_text())["kernels"][k.name]
    want = ((built_kernels / k.module).read_bytes(), ref["entry"], ref["shared_mem"])
    with tempfile.TemporaryDirectory() as t:
        assert bk.compile_triton(k, t) == want
    assert bk._triton_cached(k) == want  # repaired


def test_put_is_atomic(tmp_path, monkeypatch):
    """Each file lands whole under its name or not at all; an entry whose json (written last) is missing is a
    miss; no temp file stays behind."""
    cache = tmp_path / "cache"
    real = os.replace

    def fail_json(src, dst):
        if str(dst).endswith(".json"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(bk.os, "replace", fail_json)
    with pytest.raises(OSError, match="disk full"):
        bk.cache_put(cache, "k", b"cubin bytes", {"entry": "e", "shared": 0})
    monkeypatch.undo()
    assert [p.name for p in cache.iterdir()] == ["k.cubin"]
    assert bk.cache_get(cache, "k") is None
    bk.cache_put(cache, "k", b"cubin bytes", {"entry": "e", "shared": 0})
    assert sorted(p.name for p in cache.iterdir()) == ["k.cubin", "k.json"]
    assert bk.cache_get(cache, "k") == (b"cubin bytes", {"entry": "e", "shared": 0,
                                                         "sha256": bk.hashlib.sha256(b"cubin bytes").hexdigest()})


# ------------------------------------------------------------------ the options


@pytest.mark.parametrize("argv, env, want", [
    ([], None, None),  # off by default
    ([], "env", "env"),
    (["--cache", "opt"], None, "opt"),
    (["--cache", "opt"], "env", "opt"),
    (["--no-cache"], "env", None),
])
def test_cache_options(tmp_path, monkeypatch, restore_env, argv, env, want):
    """What build() runs with: KERN_BUILD_CACHE, which main sets for --cache DIR and clears for --no-cache (the
    Triton workers inherit it)."""
    seen = []
    monkeypatch.setattr(bk, "build", lambda *a, **kw: seen.append(bk.cache_dir()) or {"kernels": {}})
    if env is None:
        monkeypatch.delenv(bk.CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(bk.CACHE_ENV, str(tmp_path / env))
    argv = [a if a != "opt" else str(tmp_path / "opt") for a in argv]
    assert bk.main(["--out", str(tmp_path / "k"), "-q", *argv]) == 0
    assert seen == [None if want is None else tmp_path / want if want == "env" else (tmp_path / want).resolve()]


def test_cache_option_errors(tmp_path, monkeypatch, capsys, restore_env):
    monkeypatch.setattr(sys, "argv", ["build_kernels.py"])
    monkeypatch.setattr(bk, "build", lambda *a, **kw: pytest.fail("build() reached with bad options"))
    (tmp_path / "f").write_text("")
    for argv, says in ([["--cache", str(tmp_path / "c"), "--no-cache"], "not allowed with argument"],
                       [["--cache", str(tmp_path / "f")], f"--cache {tmp_path / 'f'}: exists and is not a directory"]):
        with pytest.raises(SystemExit) as e:
            bk.main(["--out", str(tmp_path / "k"), *argv])
        assert e.value.code == 2
        assert says in capsys.readouterr().err.strip().splitlines()[-1]


# ------------------------------------------------------------------ the tests' own nvcc runs (nvcc_jobs.py)

#: cheap sources: two cubins of one source (a -D form), that form's PTX, another source's cubin
NVCC_JOBS = {"argmax": ("argmax.cu", (), "argmax.cubin"), "argmax_pdl": ("argmax.cu", ("KERN_PDL",), "argmax_pdl.cubin"),
             "argmax_pdl_ptx": ("argmax.cu", ("KERN_PDL",), "argmax_pdl.ptx"),
             "embedding": ("embedding.cu", (), "embedding.cubin")}


def _recorded_builds(monkeypatch, tmp: Path, jobs: dict) -> tuple[dict[str, bytes], list[str]]:
    """nvcc_builds(tmp, jobs) with its nvcc runs logged: ({job: bytes of its file}, ["start" or "wait", ...])."""
    log = []

    class Recorded(subprocess.Popen):
        def __init__(self, *a, **kw):
            log.append("start")
            super().__init__(*a, **kw)

        def communicate(self, *a, **kw):
            log.append("wait")
            return super().communicate(*a, **kw)

    tmp.mkdir()
    with monkeypatch.context() as m:
        m.setattr(subprocess, "Popen", Recorded)
        out = nvcc_builds(tmp, jobs)
    return {key: path.read_bytes() for key, path in out.items()}, log


def _refuse_nvcc(monkeypatch) -> None:
    """From here on, any process start fails the test (`nvcc --version`, the keys', is run first)."""
    bk._nvcc_version(bk._nvcc())

    def refuse(*a, **kw):
        raise AssertionError(f"ran {a[0] if a else kw.get('args')} on a warm cache")

    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_nvcc_builds_on_the_cache_are_the_uncached_bytes(tmp_path, monkeypatch):
    monkeypatch.delenv(bk.CACHE_ENV, raising=False)
    plain, log = _recorded_builds(monkeypatch, tmp_path / "plain", NVCC_JOBS)
    assert log == ["start"] * 4 + ["wait"] * 4  # every run started before the first is waited for
    cache = tmp_path / "cache"
    monkeypatch.setenv(bk.CACHE_ENV, str(cache))
    bk._nvcc_version(bk._nvcc())  # the keys' `nvcc --version` (once per process): not in the log
    cold, log = _recorded_builds(monkeypatch, tmp_path / "cold", NVCC_JOBS)
    assert cold == plain and log == ["start"] * 4 + ["wait"] * 4
    # one entry per job, its bytes the job's: the PTX under its own key, beside the cubin of the same defines
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 8 and all(n.endswith((".cubin", ".json")) for n in entries)
    stored = sorted(bk.cache_get(cache, n.removesuffix(".json"))[0] for n in entries if n.endswith(".json"))
    assert stored == sorted(plain.values())
    assert plain["argmax_pdl"].startswith(b"\x7fELF") and plain["argmax_pdl_ptx"].startswith(b"//")
    before = _files(cache)
    _refuse_nvcc(monkeypatch)
    (tmp_path / "warm").mkdir()
    warm = nvcc_builds(tmp_path / "warm", NVCC_JOBS)
    assert {key: path.read_bytes() for key, path in warm.items()} == plain
    assert _files(cache) == before  # hits write nothing


def test_nvcc_builds_share_build_kernels_entries(built_kernels, tmp_path, monkeypatch):
    """A default module's job (gemv.cu's, without -D: the same nvcc command line) is build_kernels' entry."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(bk.CACHE_ENV, str(cache))
    try:
        bk.cache_put(cache, bk.cuda_key("gemv.cu"), (built_kernels / "gemv.cubin").read_bytes())
    except SystemExit:
        pytest.skip("nvcc not found")
    _refuse_nvcc(monkeypatch)
    got = nvcc_builds(tmp_path, {"gemv": ("gemv.cu", (), "gemv.cubin")})["gemv"]
    assert got.read_bytes() == (built_kernels / "gemv.cubin").read_bytes()


def test_nvcc_builds_store_no_foreign_source_nor_failure(tmp_path, monkeypatch):
    """A source outside kernels-src (not in the key) compiles every time, and a failed compile fails with the job's
    key and nvcc's message: neither is stored."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(bk.CACHE_ENV, str(cache))
    (tmp_path / "stub.cu").write_text('extern "C" __global__ void stub(int *p) { *p = 1; }\n')
    jobs = {"stub": (str(tmp_path / "stub.cu"), (), "stub.cubin")}
    for i in range(2):
        assert _recorded_builds(monkeypatch, tmp_path / f"stub{i}", jobs)[1] == ["start", "wait"]
    with pytest.raises(AssertionError, match=r"^bad: (.|\n)*GEMV_PASSES: 1 \(the default form\) to 8"):
        nvcc_builds(tmp_path, {"bad": ("gemv.cu", ("GEMV_PASSES=0",), "bad.cubin")})
    assert not cache.exists() or not list(cache.iterdir())
