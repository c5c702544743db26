"""Parser tests on the hand-written fixture capture (tests/fixtures/capture_torch)."""

import gzip
import shutil

import msgspec
import pytest

from kern_capture import (
    AllocRange,
    Capture,
    CaptureError,
    CaptureFormatError,
    LaunchRecord,
    ParamRecord,
    iter_launches,
    iter_modules,
)


@pytest.fixture
def cap(fixtures):
    return Capture.open(fixtures / "capture_torch")


def test_modules_indexed_by_id(cap):
    assert sorted(cap.modules) == [1, 3, 7]
    assert cap.modules[1].kind == "fatbin"
    assert cap.modules[3].kind == "cubin"
    for m in cap.modules.values():
        assert cap.module_path(m.module_id).stat().st_size == m.size
    assert cap.module_bytes(3)[:4] == b"\x7fELF"
    assert cap.module_bytes(1)[:4] == bytes.fromhex("50ed55ba")
    with pytest.raises(KeyError, match="module 99"):
        cap.module_path(99)


def test_launches_stream_in_order(cap):
    launches = list(cap.launches())
    assert [l.seq for l in launches] == list(range(9))
    assert all(isinstance(l, LaunchRecord) for l in launches)
    ts = [l.t_ns for l in launches]
    assert ts == sorted(ts)
    assert launches[1].symbol == "_Z6VecAddPfS_S_"
    assert launches[1].grid == (1, 1, 1) and launches[1].block == (4, 1, 1)
    assert launches[1].threads == 4 and launches[2].blocks == 4
    # the reader is lazy and restartable
    assert next(iter(cap)).seq == 0
    assert sum(1 for _ in iter_launches(cap.dir)) == 9
    assert [m.module_id for m in iter_modules(cap.dir)] == [1, 3, 7]


def test_param_values_and_allocations(cap):
    vec_add = list(cap.launches())[2]
    a, b, c, n = vec_add.params
    assert (a.offset, a.size) == (0, 8) and (n.offset, n.size) == (24, 4)
    assert a.alloc == AllocRange(139637976023040, 2097152)
    assert a.is_device_pointer and a.alloc_offset == 0
    assert c.alloc_offset == 8192 and c.value_u64 in c.alloc
    assert n.alloc is None and not n.host
    assert n.value_u64 == 1024 and n.as_int(signed=True) == 1024
    assert vec_add.param_bytes == 28
    fill = list(cap.launches())[0]
    assert fill.params[1].as_float() == 1.0


def test_signed_scalars(cap):
    last = list(cap.launches())[8]
    neg = last.params[3]
    assert neg.value_u64 == 0xFFFFFFFF
    assert neg.as_int(signed=True) == -1
    assert neg.as_int() == 0xFFFFFFFF


def test_struct_param_has_no_integer_value(cap):
    split_k = list(cap.launches())[4]
    struct = split_k.params[0]
    assert struct.size == 48 and struct.raw == bytes(48)
    with pytest.raises(ValueError, match="48 bytes"):
        struct.value_u64


def test_host_pointers_flagged_not_dereferenced(cap):
    split_k = list(cap.launches())[4]
    hosts = [p for p in split_k.params if p.host]
    assert [p.offset for p in hosts] == [72, 80]
    assert all(p.alloc is None for p in hosts)


def test_extra_buffer_launch(cap):
    gemm = list(cap.launches())[3]
    assert gemm.params is None and not gemm.flat
    assert "extra buffer" in gemm.params_reason
    assert gemm.module_id is None
    assert len(bytes.fromhex(gemm.extra_hex)) == 32
    assert gemm.param_bytes == 0


def test_launch_attrs(cap):
    launches = list(cap.launches())
    assert launches[3].attrs["cluster_dim"] == [2, 1, 1]
    assert launches[3].attrs["cooperative"] is False
    assert launches[5].api == "cuLaunchKernelEx"
    assert launches[7].attrs == {"cooperative": True}
    assert launches[0].attrs is None


def test_triton_instances_keep_module_id(cap):
    triton = [l for l in cap.launches() if l.symbol == "add_kernel"]
    assert [l.module_id for l in triton] == [7, 7]
    assert [l.grid for l in triton] == [(4, 1, 1), (1, 1, 1)]
    assert all(l.flat and len(l.params) == 6 and l.param_bytes == 48 for l in triton)


def test_records_round_trip(cap):
    for launch in cap.launches():
        again = msgspec.json.decode(msgspec.json.encode(launch), type=LaunchRecord)
        assert again == launch


def test_older_records_without_additive_fields():
    line = (b'{"seq":0,"t_ns":1,"pid":1,"tid":1,"ctx":1,"stream":0,"module_id":21,"symbol":"k",'
            b'"api":"cuLaunchKernel","grid":[1,1,1],"block":[4,1,1],"shared_mem":0,"attrs":null,'
            b'"params":[{"offset":0,"size":8,"hex":"0000a0b1c2ff7f00","alloc":null,"host":false}]}')
    rec = msgspec.json.decode(line, type=LaunchRecord)
    assert rec.params_reason is None and rec.result is None and rec.num_regs is None
    assert rec.params[0] == ParamRecord(0, 8, "0000a0b1c2ff7f00")


def test_truncated_last_line_is_dropped(fixtures, tmp_path):
    d = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", d)
    data = (d / "launches.jsonl").read_bytes()
    (d / "launches.jsonl").write_bytes(data + data.splitlines(keepends=True)[0][:57])
    assert sum(1 for _ in iter_launches(d)) == 9
    with pytest.raises(CaptureFormatError, match="launches.jsonl:10"):
        list(iter_launches(d, strict=True))


def test_malformed_line_in_the_middle_is_an_error(fixtures, tmp_path):
    d = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", d)
    lines = (d / "launches.jsonl").read_bytes().splitlines(keepends=True)
    lines[3] = b'{"seq": "three"}\n'
    (d / "launches.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl:4"):
        list(iter_launches(d))


@pytest.mark.parametrize("field, damage, says", [
    ("hex", lambda h: "zz" + h[2:], r"matching regex .* at `\$\.params\[0\]\.hex`"),
    ("hex", lambda h: h[:-2], r"14 hex digits, but a 8-byte parameter has 16 .* at `\$\.params\[0\]`"),
    ("extra_hex", lambda h: h[:-1], r"extra_hex has an odd number of hex digits"),
])
def test_damaged_hex_is_a_format_error_naming_the_line(fixtures, tmp_path, field, damage, says):
    """A damaged ``hex`` / ``extra_hex`` is caught when the line is read (file, line, field), not as a
    ``ValueError`` from ``bytes.fromhex`` in whatever reads the value later (kern-mine's pointers), nor
    read silently as another value (a hex string of the wrong length)."""
    d = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", d)
    lines = (d / "launches.jsonl").read_bytes().splitlines(keepends=True)
    recs = [msgspec.json.decode(line) for line in lines]
    i = next(k for k, r in enumerate(recs)
             if (r.get("extra_hex") if field == "extra_hex" else r["params"] and r["params"][0]["size"] == 8))
    r = recs[i]
    if field == "hex":
        r["params"][0]["hex"] = damage(r["params"][0]["hex"])
    else:
        r["extra_hex"] = damage(r["extra_hex"])
    lines[i] = msgspec.json.encode(r) + b"\n"
    (d / "launches.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(CaptureFormatError, match=rf"launches.jsonl:{i + 1}: .*{says}"):
        list(iter_launches(d))


def test_error_capture_raises_unless_allowed(fixtures):
    with pytest.raises(CaptureError, match="already has a subscriber"):
        Capture.open(fixtures / "capture_error")
    cap = Capture.open(fixtures / "capture_error", allow_error=True)
    assert cap.error["error"] == "multiple_subscribers"
    assert list(cap.launches()) == []


def test_not_a_capture(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing: no such directory"):
        Capture.open(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="file: not a directory"):
        Capture.open(tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="kern-capture directory"):
        Capture.open(tmp_path)


def _gzip_launches(src, dst):
    """A copy of ``src`` with launches.jsonl replaced by launches.jsonl.gz (what kern-mine trim writes)."""
    shutil.copytree(src, dst)
    data = (dst / "launches.jsonl").read_bytes()
    (dst / "launches.jsonl").unlink()
    (dst / "launches.jsonl.gz").write_bytes(gzip.compress(data))
    return data


def test_gzipped_launches_are_read(fixtures, tmp_path):
    d = tmp_path / "trimmed"
    _gzip_launches(fixtures / "capture_torch", d)
    plain = list(iter_launches(fixtures / "capture_torch"))
    assert list(iter_launches(d)) == plain
    cap = Capture.open(d)
    assert list(cap.launches()) == plain and sorted(cap.modules) == [1, 3, 7]
    # the plain file wins when both are there
    (d / "launches.jsonl").write_bytes(b"")
    assert list(iter_launches(d)) == []


def test_gzipped_launches_without_module_files(fixtures, tmp_path):
    # kern-mine trim keeps launches.jsonl.gz (+ modules.jsonl, capture.json when present) only
    d = tmp_path / "trimmed"
    d.mkdir()
    (d / "launches.jsonl.gz").write_bytes(gzip.compress((fixtures / "capture_torch" / "launches.jsonl").read_bytes()))
    cap = Capture.open(d)
    assert cap.modules == {} and sum(1 for _ in cap.launches()) == 9


def test_gzipped_truncated_last_line_and_damaged_file(fixtures, tmp_path):
    d = tmp_path / "trimmed"
    data = _gzip_launches(fixtures / "capture_torch", d)
    (d / "launches.jsonl.gz").write_bytes(gzip.compress(data + data[:57]))
    assert sum(1 for _ in iter_launches(d)) == 9
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl.gz:10"):
        list(iter_launches(d, strict=True))
    (d / "launches.jsonl.gz").write_bytes(gzip.compress(data)[:-20])  # cut short
    with pytest.raises(CaptureFormatError, match=r"launches.jsonl.gz: cannot decompress.*damaged"):
        list(iter_launches(d))


def test_trimmed_by_kern_mine_reads_like_the_original(fixtures, tmp_path):
    trim = pytest.importorskip("kern_mine.trim")
    n, _, _ = trim.trim(fixtures / "capture_torch", tmp_path / "t")
    assert (tmp_path / "t" / "launches.jsonl.gz").is_file() and not (tmp_path / "t" / "launches.jsonl").exists()
    got = list(Capture.open(tmp_path / "t").launches())
    assert n == len(got) == 9
    assert [(l.seq, l.symbol, l.grid) for l in got] == [(l.seq, l.symbol, l.grid)
                                                        for l in iter_launches(fixtures / "capture_torch")]


def test_no_launch_file_is_an_error_naming_both(fixtures, tmp_path):
    d = tmp_path / "cap"
    d.mkdir()
    shutil.copy(fixtures / "capture_torch" / "modules.jsonl", d)
    with pytest.raises(FileNotFoundError) as exc:
        iter_launches(d)  # raised at the call, not at the first next()
    msg = str(exc.value)
    assert str(d) in msg and "launches.jsonl nor launches.jsonl.gz" in msg and "--out" in msg
    with pytest.raises(FileNotFoundError, match="neither launches.jsonl nor launches.jsonl.gz"):
        Capture.open(d).launches()
    with pytest.raises(FileNotFoundError, match="missing: no such directory"):
        iter_launches(tmp_path / "missing")
    # a failed capture: Capture.launches() has none; iter_launches says why the file is missing
    assert list(Capture.open(fixtures / "capture_error", allow_error=True).launches()) == []
    with pytest.raises(FileNotFoundError, match=r"the capture failed \(error.json: CUPTI already has"):
        iter_launches(fixtures / "capture_error")


def test_subcaptures(fixtures, tmp_path):
    d = tmp_path / "cap"
    shutil.copytree(fixtures / "capture_torch", d)
    shutil.copytree(fixtures / "capture_torch", d / "pid777")
    subs = Capture.open(d).subcaptures()
    assert [s.dir.name for s in subs] == ["pid777"]
    assert sum(1 for _ in subs[0].launches()) == 9


def test_streaming_many_launches(fixtures, tmp_path):
    # 200k launches decode in a few seconds and constant memory
    d = tmp_path / "big"
    d.mkdir()
    line = (fixtures / "capture_torch" / "launches.jsonl").read_bytes().splitlines(keepends=True)[5]
    with open(d / "launches.jsonl", "wb") as f:
        for _ in range(200):
            f.write(line * 1000)
    n = 0
    total = 0
    for launch in iter_launches(d):
        n += 1
        total += launch.params[3].value_u64
    assert n == 200_000 and total == 4096 * 200_000


def test_params_from_extra_cuts_the_packed_buffer(cap):
    gemm = list(cap.launches())[3]
    raw = bytes.fromhex(gemm.extra_hex)
    params = gemm.params_from_extra([(0, 8), (8, 8), (16, 4), (24, 8)])
    assert [(p.offset, p.size) for p in params] == [(0, 8), (8, 8), (16, 4), (24, 8)]
    assert params[2].raw == raw[16:20] and params[3].as_int() == int.from_bytes(raw[24:32], "little")
    assert all(p.alloc is None and not p.host for p in params)
    with pytest.raises(ValueError, match=r"parameter 1 at offset 28 \(8 B\) ends past the 32-byte extra buffer"):
        gemm.params_from_extra([(0, 8), (28, 8)])
    flat = list(cap.launches())[0]
    with pytest.raises(ValueError, match=r"no packed extra buffer.*kernelParams launch.*already split in .params"):
        flat.params_from_extra([(0, 8)])


def test_params_from_extra_without_extra_hex_names_the_causes(cap):
    gemm = msgspec.structs.replace(list(cap.launches())[3], extra_hex=None)  # as kern-mine trim leaves it
    with pytest.raises(ValueError) as exc:
        gemm.params_from_extra([(0, 8)])
    msg = str(exc.value)
    assert msg.startswith("launch seq 3 (nvjet_sm90_tst_128x64_64x6_1x2_h_bz_coopB_TNT): no packed extra buffer")
    for cause in ("over 4 KiB", "older than extra_hex", "trimmed by `kern-mine trim`, which drops extra_hex",
                  "read the untrimmed capture", "recorded reason: parameters passed through the packed extra"):
        assert cause in msg, cause


def test_params_from_extra_rejects_a_bad_layout(cap):
    gemm = list(cap.launches())[3]
    with pytest.raises(ValueError, match=r"launch seq 3 .*: layout parameter 1 has offset -8; .*>= 0"):
        gemm.params_from_extra([(0, 8), (-8, 8)])
    with pytest.raises(ValueError, match=r"layout parameter 2 has size 0; sizes are in bytes, >= 1"):
        gemm.params_from_extra([(0, 8), (8, 8), (16, 0)])
    with pytest.raises(ValueError, match=r"layout parameter 0 has size -4"):
        gemm.params_from_extra([(0, -4)])
