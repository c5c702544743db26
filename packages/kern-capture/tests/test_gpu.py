"""GPU tests (marked ``gpu``; skip cleanly without a GPU, torch or triton).

Run on the GPU machine with:
    PYTHONPATH=<packages/*/src> python3 -m pytest -m gpu packages/kern-capture -s
(-s shows the measured slowdown line).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kern_capture import Capture
from kern_capture.build import capture_env

pytestmark = pytest.mark.gpu

PROGRAM = Path(__file__).parent / "gpu_programs" / "torch_program.py"
TRITON_KERNELS = {"add_scale_kernel", "marker_kernel"}


def _gpu_reason() -> str | None:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return "cuda-bindings is not installed"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {err}"
        err, n = cu.cuDeviceGetCount()
        if err != cu.CUresult.CUDA_SUCCESS or n == 0:
            return "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any driver problem means no GPU here
        return f"no usable CUDA driver: {exc}"
    return None


_REASON = _gpu_reason()
needs_gpu = pytest.mark.skipif(_REASON is not None, reason=f"needs an NVIDIA GPU: {_REASON}")


def _needs_torch_triton() -> None:
    for mod in ("torch", "triton"):
        try:
            __import__(mod)
        except ImportError:
            pytest.skip(f"{mod} is not installed")


def _run_program(mode: str, env: dict[str, str], *extra: str) -> tuple[dict, float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(PROGRAM), mode, *extra], env=env, capture_output=True, text=True,
                          timeout=540)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, f"{mode} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    last = [l for l in proc.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(last), wall, proc


# --------------------------------------------------------------------------
# driver helpers (cuda.bindings, in the test process: no injection here)

class Driver:
    def __init__(self) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        self._check(cu.cuInit(0))
        dev = self._check(cu.cuDeviceGet(0))
        self.ctx = self._check(cu.cuDevicePrimaryCtxRetain(dev))
        self._check(cu.cuCtxSetCurrent(self.ctx))
        self.modules: dict[str, object] = {}

    def _check(self, ret):
        err, *rest = ret if isinstance(ret, tuple) else (ret,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver error {err}")
        return rest[0] if len(rest) == 1 else tuple(rest)

    def load(self, path: Path):
        key = str(path)
        if key not in self.modules:
            self.modules[key] = self._check(self.cu.cuModuleLoadData(path.read_bytes()))
        return self.modules[key]

    def function(self, path: Path, symbol: str):
        return self._check(self.cu.cuModuleGetFunction(self.load(path), symbol.encode()))

    def param_table(self, fn) -> list[tuple[int, int]]:
        out = []
        while True:
            err, off, size = self.cu.cuFuncGetParamInfo(fn, len(out))
            if err == self.cu.CUresult.CUDA_ERROR_INVALID_VALUE:
                return out
            if err != self.cu.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuFuncGetParamInfo: {err}")
            out.append((int(off), int(size)))


@pytest.fixture(scope="module")
def driver():
    if _REASON:
        pytest.skip(_REASON)
    return Driver()


# --------------------------------------------------------------------------
# the PyTorch program: captured, profiled, timed

@pytest.fixture(scope="module")
def torch_runs(built_library, tmp_path_factory):
    if _REASON:
        pytest.skip(_REASON)
    _needs_torch_triton()
    tmp = tmp_path_factory.mktemp("torch")
    out = tmp / "cap"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KERN_CAPTURE", "CUDA_INJECTION64"))}
    plain, wall_plain, _ = _run_program("time", base)
    captured, wall_cap, proc = _run_program("capture", capture_env(built_library, out, base=base))
    assert "kern-capture" in proc.stderr  # the banner: the injection was loaded
    buffered, wall_buf, _ = _run_program("capture", capture_env(built_library, tmp / "cap_buf", buffered=True,
                                                                base=base))
    trace = tmp / "trace.json"
    _run_program("profile", base, str(trace))
    cap = Capture.open(out)
    n_launches = sum(1 for _ in cap.launches())
    print(
        f"\nkern-capture slowdown on {PROGRAM.name}: one pass (~{_pass_launches(cap)} launches) "
        f"{plain['pass_ms']:.3f} ms plain, {captured['pass_ms']:.3f} ms captured "
        f"({captured['pass_ms'] / plain['pass_ms']:.2f}x), {buffered['pass_ms']:.3f} ms captured --buffered "
        f"({buffered['pass_ms'] / plain['pass_ms']:.2f}x); whole process {wall_plain:.1f} s plain, "
        f"{wall_cap:.1f} s captured, {wall_buf:.1f} s buffered; {n_launches} launches, {len(cap.modules)} modules"
    )
    assert captured["checksum"] == pytest.approx(plain["checksum"], rel=1e-6)  # capture does not change results
    return cap, json.loads(trace.read_text())


def _pass_launches(cap: Capture) -> int:
    w = _capture_window(cap)
    return len(w) - 2


def _capture_window(cap: Capture):
    launches = list(cap.launches())
    starts = [i for i, l in enumerate(launches) if l.symbol == "marker_kernel" and l.grid == (7, 1, 1)]
    ends = [i for i, l in enumerate(launches) if l.symbol == "marker_kernel" and l.grid == (11, 1, 1)]
    assert len(starts) == 1 and len(ends) == 1, "marker launches not found exactly once in the capture"
    return launches[starts[0]: ends[0] + 1]


def _trace_window(trace: dict):
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    def is_marker(e, g):
        return "marker_kernel" in e["name"] and list(e["args"]["grid"]) == [g, 1, 1]
    starts = [i for i, e in enumerate(kernels) if is_marker(e, 7)]
    ends = [i for i, e in enumerate(kernels) if is_marker(e, 11)]
    assert len(starts) == 1 and len(ends) == 1, "marker kernels not found exactly once in the profiler trace"
    return kernels[starts[0]: ends[0] + 1]


def _demangle(names: list[str]) -> list[str]:
    tool = shutil.which("c++filt")
    if not tool:
        return names
    out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True, check=True).stdout
    return out.splitlines()[: len(names)]


def _base_name(name: str) -> str:
    return re.split(r"[<(]", name.replace("void ", "", 1), maxsplit=1)[0].strip()


@needs_gpu
def test_launches_match_torch_profiler(torch_runs):
    cap, trace = torch_runs
    window = _capture_window(cap)
    prof = _trace_window(trace)
    ours = _demangle([l.symbol for l in window])
    theirs = [e["name"] for e in prof]
    print("\ncaptured window:\n  " + "\n  ".join(f"{l.symbol[:90]} {l.grid} {l.api}" for l in window))
    assert len(ours) == len(theirs), f"capture has {len(ours)} kernels, profiler {len(theirs)}:\n{ours}\n{theirs}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a.replace(" ", "") != b.replace(" ", ""):
            # demanglers may format template arguments differently: same function at least
            assert _base_name(a) == _base_name(b), f"kernel {i}: captured {a!r}, profiler {b!r}"
    assert [l.grid for l in window] == [tuple(e["args"]["grid"]) for e in prof]
    assert [l.block for l in window] == [tuple(e["args"]["block"]) for e in prof]
    assert all(l.result == 0 for l in window)


@needs_gpu
def test_every_launch_in_window_has_a_module(torch_runs):
    cap, _ = torch_runs
    window = _capture_window(cap)
    missing = [l.symbol for l in window if l.module_id is None]
    assert not missing, f"launches without module id: {missing}"
    all_launches = list(cap.launches())
    unresolved = sum(1 for l in all_launches if l.module_id is None)
    print(f"\n{unresolved} of {len(all_launches)} launches without module id in the whole capture")


@needs_gpu
def test_triton_launches_have_all_params(torch_runs, driver):
    cap, _ = torch_runs
    triton = [l for l in cap.launches() if l.symbol in TRITON_KERNELS]
    assert {l.symbol for l in triton} == TRITON_KERNELS
    for l in triton:
        assert l.params is not None, f"{l.symbol} seq {l.seq}: {l.params_reason}"
        table = driver.param_table(driver.function(cap.module_path(l.module_id), l.symbol))
        assert [(p.offset, p.size) for p in l.params] == table
        assert l.param_bytes == table[-1][0] + table[-1][1]
        assert all(len(p.raw) == p.size for p in l.params)
    add = [l for l in triton if l.symbol == "add_scale_kernel"]
    for l in add:
        x, y, out = l.params[:3]
        assert x.alloc and y.alloc and out.alloc and not x.host
        assert any(p.size == 4 and p.as_int() == 512 * 512 for p in l.params)
        assert any(p.size == 4 and p.as_float() == 0.5 for p in l.params)
        assert l.grid == (256, 1, 1)
        # x, y, out, n, alpha + Triton 3.6's two hidden trailing 8-byte scratch pointers
        assert [p.size for p in l.params[-2:]] == [8, 8]


@needs_gpu
def test_dumped_modules_load_and_contain_launched_symbols(torch_runs, driver):
    cap, _ = torch_runs
    pairs = {(l.module_id, l.symbol) for l in cap.launches() if l.module_id is not None}
    assert pairs
    for module_id, symbol in sorted(pairs):
        driver.function(cap.module_path(module_id), symbol)  # raises if absent
    kinds = {m.kind for m in cap.modules.values()}
    assert kinds <= {"cubin", "fatbin", "ptx"}, kinds


@needs_gpu
def test_cli_run_eager_modules(built_library, tmp_path, monkeypatch):
    _needs_torch_triton()
    from kern_capture.cli import main

    monkeypatch.setenv("KERN_CAPTURE_CACHE", str(built_library.parent.parent.parent))
    out = tmp_path / "eager"
    rc = main(["run", "--out", str(out), "--eager-modules", "--", sys.executable, str(PROGRAM), "capture"])
    assert rc == 0
    cap = Capture.open(out)
    assert cap.info["eager_modules"] is True
    assert len(cap.modules) > 100, f"EAGER loading dumped only {len(cap.modules)} modules"
    window = _capture_window(cap)
    assert all(l.module_id is not None for l in window)


@needs_gpu
def test_second_cupti_subscriber_is_reported(built_library, toolchain, tmp_path, monkeypatch):
    """A CUPTI subscriber that exists before cuInit: one of the two must fail, and if it is
    ours, `kern-capture run` fails with the reason instead of capturing nothing."""
    from kern_capture.cli import main

    script = tmp_path / "hold_cupti.py"
    script.write_text(
        "import ctypes, sys\n"
        f"cupti = ctypes.CDLL({str(toolchain.cupti_lib)!r})\n"
        "CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)\n"
        "cb = CB(lambda *a: None)\n"
        "sub = ctypes.c_void_p()\n"
        "r = cupti.cuptiSubscribe(ctypes.byref(sub), cb, None)\n"
        "from cuda.bindings import driver\n"
        "driver.cuInit(0)\n"
        "print('THEIRS', r)\n"
    )
    monkeypatch.setenv("KERN_CAPTURE_CACHE", str(built_library.parent.parent.parent))
    out = tmp_path / "cap"
    rc = main(["run", "--out", str(out), "--", sys.executable, str(script)])
    ours_failed = (out / "error.json").exists()
    if ours_failed:
        err = json.loads((out / "error.json").read_text())
        assert err["error"] == "multiple_subscribers" and "CUPTI already has a subscriber" in err["message"]
        assert rc == 3
    else:
        assert rc == 0  # the other subscriber lost; ours captured


# --------------------------------------------------------------------------
# kern-run: an independent witness that the runtime launches what the manifest says

def _eval(e, env):
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        return env.get(e)
    if isinstance(e, dict) and "ceil_div" in e:
        a, b = e["ceil_div"]
        v = _eval(a, env)
        return None if v is None else -(-v // b)
    if isinstance(e, dict) and "mul" in e:
        a, b = e["mul"]
        v = _eval(a, env)
        return None if v is None else v * b
    return None


@needs_gpu
def test_kern_run_decode_matches_manifest(built_library, tmp_path):
    manifest_p, kernels, weights = (os.environ.get(k) for k in ("KERN_MANIFEST", "KERN_KERNELS", "KERN_WEIGHTS"))
    if not (manifest_p and kernels and weights):
        pytest.skip("set KERN_MANIFEST, KERN_KERNELS and KERN_WEIGHTS to capture a kern-run decode step")
    for p in (manifest_p, kernels, weights):
        if not Path(p).exists():
            pytest.skip(f"{p} does not exist")
    try:
        import kern_run.cli  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"kern-run is not importable: {exc}")
    manifest = json.loads(Path(manifest_p).read_text())
    cmd = os.environ.get("KERN_RUN_CMD")
    argv = shlex.split(cmd) if cmd else [
        sys.executable, "-m", "kern_run.cli", "--manifest", manifest_p, "--kernels", kernels, "--weights", weights,
        "--prompt-ids", "785,6722,315", "--steps", "2", "--eager", "-q",
    ]
    out = tmp_path / "cap"
    proc = subprocess.run(argv, env=capture_env(built_library, out), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cap = Capture.open(out)

    # expected decode launches (externs are cuBLASLt: not kern modules, left out)
    sha_by_module = {}
    for name, m in manifest["modules"].items():
        sha = m.get("sha256") or hashlib.sha256((Path(kernels) / m["source"]).read_bytes()).hexdigest()
        sha_by_module[name] = sha
    expected = []
    for call in manifest["programs"]["decode"]["calls"]:
        for launch in manifest["ops"][call["op"]]["impl"]["launches"]:
            if "extern" not in launch:
                expected.append((call["label"], launch))
    kern_shas = set(sha_by_module.values())
    module_sha = {mid: hashlib.sha256(cap.module_bytes(mid)).hexdigest() for mid in cap.modules}
    ours = [l for l in cap.launches() if l.module_id is not None and module_sha.get(l.module_id) in kern_shas]
    assert len(ours) >= len(expected), f"captured {len(ours)} kern-module launches, decode has {len(expected)}"
    last = ours[-len(expected):]  # the last decode step
    env = {"tokens": 1}
    for (label, want), got in zip(expected, last):
        where = f"{label} ({want['entry']}) vs captured seq {got.seq}"
        assert got.symbol == want["entry"], where
        assert module_sha[got.module_id] == sha_by_module[want["module"]], where
        assert list(got.block) == want["block"], where
        grid = [_eval(g, env) for g in want["grid"]]
        assert all(g is None or g == c for g, c in zip(grid, got.grid)), f"{where}: grid {grid} vs {got.grid}"
        params = got.params
        if params is None:  # kern-driver's eager launches pass a packed `extra` buffer: cut it by the
            # layout the dumped cubin's own ELF parameter table gives (independent of the manifest)
            from kern_verify.cubin import read_cubin

            info = read_cubin(cap.module_bytes(got.module_id)).entries[got.symbol]
            params = got.params_from_extra([(s.offset, s.size) for s in info.params])
        assert len(params) == len(want["params"]), where
        for i, arg in enumerate(want["args"]):
            p = params[i]
            for ty in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"):
                if ty in arg:
                    assert p.as_int(signed=ty.startswith("i")) == arg[ty], f"{where}: arg {i}"
            if "f32" in arg:
                assert p.as_float() == pytest.approx(arg["f32"], rel=1e-6), f"{where}: arg {i}"
            if "expr" in arg and _eval(arg["expr"], env) is not None:
                assert p.as_int(signed=True) == _eval(arg["expr"], env), f"{where}: arg {i}"
