"""Build the injection library from source with the system C compiler; check what it exports
and what it writes, driven by scripted CUPTI events (no GPU needed)."""

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kern_capture import Capture
from kern_capture.build import BuildError, build_library, capture_env, find_toolchain


def test_builds_and_exports_initialize_injection(built_library):
    assert built_library.is_file()
    assert built_library.name == "libkern_capture.so"
    nm = shutil.which("nm")
    if nm:
        out = subprocess.run([nm, "-D", "--defined-only", str(built_library)], capture_output=True, text=True,
                             check=True).stdout
        exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
        assert exported == {"InitializeInjection"}  # -fvisibility=hidden: nothing else leaks
    lib = ctypes.CDLL(str(built_library))
    assert hasattr(lib, "InitializeInjection")
    assert not hasattr(lib, "kern_capture_selftest")


def test_build_is_cached_per_cuda_version_and_source(built_library):
    tc = find_toolchain()
    assert built_library.parent.parent.name == tc.cuda_version
    again = build_library(cache_dir=built_library.parent.parent.parent)
    assert again == built_library
    assert built_library.stat().st_mtime == again.stat().st_mtime


def test_missing_toolkit_is_a_clear_error(monkeypatch, tmp_path):
    import kern_capture.build as b

    monkeypatch.setattr(b, "_toolkit_roots", lambda: [("test", tmp_path)])
    with pytest.raises(BuildError) as exc:
        b.find_toolchain()
    msg = str(exc.value)
    assert "cuda.h, cupti.h, libcupti.so not found" in msg
    assert "CUDA_HOME" in msg and str(tmp_path / "include") in msg


def test_missing_compiler_is_a_clear_error(toolchain):
    with pytest.raises(BuildError, match="no C compiler"):
        find_toolchain(cc="/nonexistent/cc")


def test_capture_env(tmp_path):
    env = capture_env(Path("/x/lib.so"), tmp_path / "out", eager_modules=True, base={"PATH": "/bin"})
    assert env["CUDA_INJECTION64_PATH"] == "/x/lib.so"
    assert env["KERN_CAPTURE_OUT"] == str((tmp_path / "out").resolve())
    assert env["CUDA_MODULE_LOADING"] == "EAGER"
    assert "KERN_CAPTURE_BUFFERED" not in env
    assert "CUDA_MODULE_LOADING" not in capture_env(Path("/x"), tmp_path, base={})


def test_without_a_driver_it_writes_an_error_marker(built_library, tmp_path):
    # This machine may have no libcuda: InitializeInjection must then say so, not crash.
    out = tmp_path / "out"
    code = f"import ctypes; ctypes.CDLL({str(built_library)!r}).InitializeInjection()"
    env = dict(os.environ, KERN_CAPTURE_OUT=str(out))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((out / "capture.json").read_text())
    assert info["pid"] > 0 and info["version"] and info["cuda_version"] >= 12000
    if (out / "error.json").exists():  # no driver here
        err = json.loads((out / "error.json").read_text())
        assert err["error"] in ("no_driver", "driver_too_old", "cupti_subscribe")
        assert "kern-capture: ERROR" in proc.stderr


def test_second_process_gets_its_own_directory(built_library, tmp_path):
    out = tmp_path / "out"
    code = f"import ctypes; ctypes.CDLL({str(built_library)!r}).InitializeInjection()"
    env = dict(os.environ, KERN_CAPTURE_OUT=str(out), KERN_CAPTURE_QUIET="1")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    subdirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(subdirs) == 1 and subdirs[0].name.startswith("pid")
    assert (subdirs[0] / "capture.json").exists()


@pytest.fixture(scope="module")
def selftest_capture(selftest_library, fixtures, tmp_path_factory):
    out = tmp_path_factory.mktemp("selftest") / "cap"
    a = (fixtures / "capture_torch" / "module_3.cubin").read_bytes()  # vec_add, _Z6VecAddPfS_S_
    b = (fixtures / "capture_torch" / "module_7.cubin").read_bytes()  # Triton add_kernel
    code = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({str(selftest_library)!r})\n"
        f"a = open({str(fixtures / 'capture_torch' / 'module_3.cubin')!r}, 'rb').read()\n"
        f"b = open({str(fixtures / 'capture_torch' / 'module_7.cubin')!r}, 'rb').read()\n"
        f"n = lib.kern_capture_selftest({str(out).encode()!r}, a, len(a), b, len(b))\n"
        "sys.exit(0 if n == 6 else 1)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    return Capture.open(out), a, b


def test_selftest_modules_dumped_by_magic(selftest_capture):
    cap, a, b = selftest_capture
    assert sorted(cap.modules) == [5, 6, 7]
    assert {m.kind for m in cap.modules.values()} == {"cubin"}
    assert cap.module_bytes(5) == a and cap.module_bytes(6) == b and cap.module_bytes(7) == a


def test_selftest_module_ids_resolved(selftest_capture):
    cap, _, _ = selftest_capture
    launches = list(cap.launches())
    assert [l.seq for l in launches] == list(range(6))
    # 5: bound at cuModuleLoadData; 6: the only module with add_kernel;
    # 7: the second vec_add instance, its own handle -> the unbound module
    assert [l.module_id for l in launches] == [5, 6, 5, 7, None, 5]


def test_selftest_flat_launch(selftest_capture):
    cap, _, _ = selftest_capture
    first = next(iter(cap.launches()))
    assert first.api == "cuLaunchKernel" and first.symbol == "vec_add"
    assert first.grid == (4, 1, 1) and first.block == (256, 1, 1) and first.stream == 0x77
    dev0, dev1, host, n = first.params
    assert dev0.alloc.base == 0x7E0000000000 and dev0.alloc_offset == 16
    assert dev1.alloc_offset == 4096 and not dev1.host
    assert host.alloc is None and host.host  # a host address, flagged, not dereferenced
    assert n.as_int(signed=True) == 1024 and not n.host
    assert first.result == 0 and first.num_regs == 32 and first.static_shared_mem == 0


def test_selftest_launch_ex_attrs_and_hidden_params(selftest_capture):
    cap, _, _ = selftest_capture
    ex = list(cap.launches())[1]
    assert ex.api == "cuLaunchKernelEx" and ex.symbol == "add_kernel"
    assert ex.grid == (8, 2, 1) and ex.shared_mem == 1024
    assert ex.attrs == {"cluster_dim": [2, 1, 1], "cooperative": False, "num_attrs": 2, "priority": 3}
    assert [p.size for p in ex.params] == [8, 8, 8, 4, 8, 8] and ex.param_bytes == 48
    assert ex.params[3].as_int(signed=True) == -7
    assert ex.params[4].value_u64 == 0 and ex.params[4].alloc is None and not ex.params[4].host


def test_selftest_extra_buffer(selftest_capture):
    cap, _, _ = selftest_capture
    packed = list(cap.launches())[2]
    assert packed.api == "cuLaunchKernel_ptsz"
    assert packed.params is None and "extra buffer" in packed.params_reason
    raw = bytes.fromhex(packed.extra_hex)
    assert len(raw) == 28 and int.from_bytes(raw[24:28], "little") == 1024


def test_selftest_cooperative(selftest_capture):
    cap, _, _ = selftest_capture
    coop = list(cap.launches())[3]
    assert coop.api == "cuLaunchCooperativeKernel_ptsz" and coop.stream == 2
    assert coop.attrs["cooperative"] is True


def test_selftest_unknown_function(selftest_capture):
    cap, _, _ = selftest_capture
    odd = list(cap.launches())[4]
    assert odd.symbol == 'odd"name\\x'  # JSON-escaped by the C writer, decoded back
    assert odd.params is None and "cuFuncGetParamInfo failed" in odd.params_reason
    assert odd.result == 400 and odd.num_regs is None
