"""Build the injection library from source with the system C compiler; check what it exports
and what it writes, driven by scripted CUPTI events (no GPU needed)."""

import ctypes
import json
import os
import shutil
import stat
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
    assert stat.S_IMODE(built_library.stat().st_mode) == 0o755  # a shared cache is readable by all
    lib = ctypes.CDLL(str(built_library))
    assert hasattr(lib, "InitializeInjection")
    assert not hasattr(lib, "kern_capture_selftest")


def test_build_is_cached_per_cuda_version_and_source(built_library):
    tc = find_toolchain()
    assert built_library.parent.parent.name == tc.cuda_version
    again = build_library(cache_dir=built_library.parent.parent.parent)
    assert again == built_library
    assert built_library.stat().st_mtime == again.stat().st_mtime


def test_missing_toolkit_is_a_clear_error(clean_env, monkeypatch, tmp_path):
    import kern_capture.build as b

    monkeypatch.setattr(b, "_toolkit_roots", lambda: [("test", tmp_path)])
    with pytest.raises(BuildError) as exc:
        b.find_toolchain()
    msg = str(exc.value)
    assert "cuda.h, cupti.h, libcupti.so not found" in msg
    assert "CUDA_HOME" in msg and str(tmp_path / "include") in msg


def test_missing_compiler_is_a_clear_error(toolchain):
    with pytest.raises(BuildError, match=r"the C compiler '/nonexistent/cc' given by --cc was not found"):
        find_toolchain(cc="/nonexistent/cc")


# --- toolkit overrides, compiler choice, cache checks: on a fake toolkit (no CUDA needed) ---

TOOLKIT_VARS = ("KERN_CAPTURE_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")

FAKE_CC = """#!/bin/sh
# writes a few bytes to the file after -o (or nothing with KERN_FAKE_CC_EMPTY=1), exits 0
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; shift; fi
  shift
done
if [ -n "$out" ] && [ -z "$KERN_FAKE_CC_EMPTY" ]; then printf 'not really a library' > "$out"; fi
exit 0
"""


def _fake_toolkit(root: Path, missing: tuple[str, ...] = ()) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "lib64").mkdir()
    if "cuda.h" not in missing:
        (root / "include" / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    if "cupti.h" not in missing:
        (root / "include" / "cupti.h").write_text("\n")
    if "libcupti" not in missing:
        (root / "lib64" / "libcupti.so").write_bytes(b"\x7fELF")
    return root


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No toolkit variable or CC from the caller's environment; a fake cc on hand."""
    for v in (*TOOLKIT_VARS, "CC", "KERN_FAKE_CC_EMPTY"):
        monkeypatch.delenv(v, raising=False)
    cc = tmp_path / "fakecc"
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    return cc


@pytest.mark.parametrize("var", TOOLKIT_VARS)
@pytest.mark.parametrize("missing", ["cuda.h", "cupti.h", "libcupti"])
def test_toolkit_override_lacking_a_file_is_an_error_not_a_fallback(clean_env, monkeypatch, tmp_path, var,
                                                                   missing):
    import kern_capture.build as b

    bad = _fake_toolkit(tmp_path / "bad", missing=(missing,))
    good = _fake_toolkit(tmp_path / "good")
    # a complete toolkit elsewhere must not be mixed in
    monkeypatch.setattr(b, "_toolkit_roots", lambda: [("test", good)])
    monkeypatch.setenv(var, str(bad))
    with pytest.raises(BuildError) as exc:
        b.find_toolchain(cc=str(clean_env))
    msg = str(exc.value)
    name = "libcupti.so" if missing == "libcupti" else missing
    assert f"${var}={bad} lacks {name}" in msg
    assert "Point it at a complete toolkit" in msg and "unset it" in msg
    assert str(good) not in msg


def test_toolkit_override_that_does_not_exist(clean_env, monkeypatch, tmp_path):
    import kern_capture.build as b

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nope"))
    with pytest.raises(BuildError, match=r"\$CUDA_HOME=.*nope does not exist"):
        b.find_toolchain(cc=str(clean_env))


def test_toolkit_override_wins_over_lower_variables(clean_env, monkeypatch, tmp_path):
    import kern_capture.build as b

    bad = _fake_toolkit(tmp_path / "bad", missing=("cupti.h",))
    good = _fake_toolkit(tmp_path / "good")
    monkeypatch.setenv("KERN_CAPTURE_CUDA_HOME", str(bad))
    monkeypatch.setenv("CUDA_HOME", str(good))
    with pytest.raises(BuildError, match=r"(?s)\$KERN_CAPTURE_CUDA_HOME=.* lacks cupti.h.*unset it to use \$CUDA_HOME"):
        b.find_toolchain(cc=str(clean_env))
    monkeypatch.delenv("KERN_CAPTURE_CUDA_HOME")
    tc = b.find_toolchain(cc=str(clean_env))
    assert tc.include_dirs == [good / "include"] and tc.cupti_lib == good / "lib64" / "libcupti.so"
    assert tc.cuda_version == "12.8"


def test_compiler_not_found_names_its_source(clean_env, monkeypatch, tmp_path, capsys):
    from kern_capture.cli import main

    monkeypatch.setenv("KERN_CAPTURE_CUDA_HOME", str(_fake_toolkit(tmp_path / "tk")))
    with pytest.raises(BuildError, match=r"(?s)the C compiler 'no-such-cc' given by --cc was not found.*drop --cc"):
        find_toolchain(cc="no-such-cc")
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(BuildError, match=r"the C compiler 'no-such-cc' given by \$CC was not found.*unset it"):
        find_toolchain()
    monkeypatch.setenv("CC", "ccache gcc")
    with pytest.raises(BuildError, match="one executable, without arguments"):
        find_toolchain()
    monkeypatch.delenv("CC")
    assert main(["build", "--cc", "no-such-cc"]) == 2
    err = capsys.readouterr().err
    assert "'no-such-cc' given by --cc was not found" in err and "no C compiler found" not in err


def test_no_compiler_at_all(clean_env, monkeypatch, tmp_path):
    import kern_capture.build as b

    monkeypatch.setenv("KERN_CAPTURE_CUDA_HOME", str(_fake_toolkit(tmp_path / "tk")))
    monkeypatch.setattr(b.shutil, "which", lambda name: None)
    with pytest.raises(BuildError, match="no C compiler found.*install gcc or clang, or name one with --cc or CC"):
        b.find_toolchain()


def test_compiler_without_output_leaves_nothing_in_the_cache(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("KERN_CAPTURE_CUDA_HOME", str(_fake_toolkit(tmp_path / "tk")))
    monkeypatch.setenv("KERN_FAKE_CC_EMPTY", "1")
    cache = tmp_path / "cache"
    with pytest.raises(BuildError, match=r"the C compiler '.*fakecc' exited 0 but wrote no output"):
        build_library(cc=str(clean_env), cache_dir=cache)
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_cached_library_is_0755_and_an_empty_one_is_rebuilt(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("KERN_CAPTURE_CUDA_HOME", str(_fake_toolkit(tmp_path / "tk")))
    cache = tmp_path / "cache"
    old = os.umask(0o077)
    try:
        lib = build_library(cc=str(clean_env), cache_dir=cache)
    finally:
        os.umask(old)
    assert lib.read_bytes() == b"not really a library"
    assert stat.S_IMODE(lib.stat().st_mode) == 0o755
    lib.write_bytes(b"")  # e.g. left by an older kern-capture
    assert build_library(cc=str(clean_env), cache_dir=cache) == lib
    assert lib.stat().st_size > 0


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
        "sys.exit(0 if n == 7 else 1)\n"
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
    assert [l.seq for l in launches] == list(range(7))
    # 5: bound at cuModuleLoadData; 6: the only module with add_kernel;
    # 7: the second vec_add instance, its own handle -> the unbound module
    assert [l.module_id for l in launches] == [5, 6, 5, 7, None, 5, 5]


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
    # the reason points at the recorded buffer and the way to cut it
    assert "raw bytes in extra_hex" in packed.params_reason
    assert "LaunchRecord.params_from_extra(layout)" in packed.params_reason
    assert "not possible" not in packed.params_reason
    raw = bytes.fromhex(packed.extra_hex)
    assert len(raw) == 28 and int.from_bytes(raw[24:28], "little") == 1024
    n = packed.params_from_extra([(0, 8), (8, 8), (16, 8), (24, 4)])[3]
    assert n.as_int() == 1024


def test_selftest_extra_buffer_over_the_limit(selftest_capture):
    cap, _, _ = selftest_capture
    big = list(cap.launches())[6]
    assert big.params is None and big.extra_hex is None
    assert "its 4104 bytes are not recorded (extra_hex keeps 1..4096)" in big.params_reason
    with pytest.raises(ValueError, match="buffer was over 4 KiB"):
        big.params_from_extra([(0, 8)])


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
