"""CPU checks of tools/gpu/qkv_attention_variant.py, the rewrite of a Qwen3 decode program onto the one-launch qkv
GEMV + decode attention of tools/kernels-src/qkv_attention.cu: no GPU needed.

- the rewrite of the 4B and 0.6B examples, on a stand-in file for the cubin: per layer, `norm_qkv` + `attn` become one
  `qkv_attn` call in their place (182 -> 146 and 142 -> 114 decode calls, prefill and the `qkv` buffer untouched)
  with the two calls' args in the kernel's order, and op `qkv_attention_decode`'s one launch has the attention's grid,
  scalars and `pdl`, the GEMV's k, and the attention's dynamic shared memory + 128 + slots·slot_bytes + 2560 + 2·k;
- what it cannot rewrite (calls out of order, an attention not reading its GEMV's output, other entries or modules,
  an eps or n that does not fit, too much shared memory, a ring no build has) is refused by name, on the command line
  too;
- verification: the result verifies against the built kernels with a stub of the kernel's ABI (an nvcc build of an
  empty entry with its parameters, cluster and PDL wait), and the command line verifies before it writes (a stand-in
  that is no cubin is refused); and against the real -DKERN_PDL build of tools/kernels-src/qkv_attention.cu.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {g: ROOT / "examples" / f"qwen3-{g}.json" for g in ("4b", "0.6b")}

sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import qkv_attention_variant as qa  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvcc_jobs import nvcc_builds  # noqa: E402  (this folder's helpers)

#: An empty entry with qkv_attention_rope_cluster's ABI (the op's 12 params, then num_q_heads, num_kv_heads, K,
#: bt_stride, page_bytes, sm_scale, eps), the attention's cluster of 8 CTAs along y, 128 threads, and a PDL wait.
STUB = r"""
extern "C" __global__ void __cluster_dims__(1, 8, 1) __launch_bounds__(128)
qkv_attention_rope_cluster(const unsigned short* residual, const unsigned short* norm_w, const unsigned short* w_qkv,
                           const long long* positions, const long long* slot_mapping, const unsigned short* q_norm_w,
                           const unsigned short* k_norm_w, const float* cos_sin, void* kv, const int* block_table,
                           const int* seq_lens, unsigned short* out, int num_q_heads, int num_kv_heads, int k,
                           int bt_stride, int page_bytes, float sm_scale, float eps) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0)
        out[0] = (unsigned short)(num_q_heads + num_kv_heads + k + bt_stride + page_bytes + (int)(sm_scale + eps));
}
"""


#: The examples' decode attention launch's dynamic shared memory (decode_attention_rope_cluster, PDL module: 256 bytes
#: of the slots' mbarriers, 4 warps' 2-page rings of 16 unpadded 512-byte rows (the head-major KV layout's page of one
#: kv head), 4,608 bytes of the cluster's partials), where the one launch's own shared memory starts.
ATTN = 256 + 4 * 2 * 16 * 512 + 4608  # 70,400


def _calls(m: dict) -> list[dict]:
    return m["programs"]["decode"]["calls"]


def _standin(tmp: Path) -> Path:
    """A kernels dir with a stand-in file for the cubin: the rewrite only pins it by its sha256."""
    k = tmp / "standin"
    k.mkdir()
    (k / "qkv_attention.cubin").write_bytes(b"not a cubin: the rewrite only hashes it")
    return k


@pytest.mark.parametrize("geometry", list(EXAMPLES))
def test_rewrite(tmp_path, geometry):
    kernels = _standin(tmp_path)
    m = json.loads(EXAMPLES[geometry].read_text())
    out = qa.rewrite(m, kernels)
    src, calls = _calls(m), _calls(out)
    layers = sum(c["op"] == "gemv_norm_qkv" for c in src)
    assert len(calls) == len(src) - layers and [c["op"] for c in calls].count("qkv_attention_decode") == layers
    assert len(calls) == {"4b": 146, "0.6b": 114}[geometry]
    # in place of the two calls, one call with (residual, input norm, qkv_proj) and the attention's args after qkv
    expect, i = [], 0
    while i < len(src):
        c = src[i]
        if c["op"] == "gemv_norm_qkv":
            d = src[i + 1]
            assert d["op"] == "attention_decode_rope" and d["args"][0] == c["args"][3] == {"buf": "qkv"}
            expect.append({"label": c["label"].replace(".norm_qkv", ".qkv_attn"), "op": "qkv_attention_decode",
                           "args": c["args"][:3] + d["args"][1:]})
            i += 2
        else:
            expect.append(c)
            i += 1
    assert calls == expect
    l7 = next(c for c in calls if c["label"] == "l7.qkv_attn")
    p = "model.layers.7."
    assert l7["args"] == [{"buf": "residual"}, {"buf": p + "input_layernorm.weight"},
                          {"buf": p + "self_attn.qkv_proj.weight"}, {"buf": "positions"}, {"buf": "slot_mapping"},
                          {"buf": p + "self_attn.q_norm.weight"}, {"buf": p + "self_attn.k_norm.weight"},
                          {"buf": "rope.cos_sin"}, {"state": "kv", "offset": 7 * 65536}, {"buf": "block_table"},
                          {"buf": "seq_lens"}, {"buf": "attn"}]

    op = out["ops"]["qkv_attention_decode"]
    params = ["in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<i64>", "in buffer<i64>",
              "in buffer<bf16>", "in buffer<bf16>", "in buffer<f32>", "inout ptr", "in buffer<i32>", "in buffer<i32>",
              "out buffer<bf16>"]
    assert op["params"] == params and len(op["impl"]["launches"]) == 1
    ln = op["impl"]["launches"][0]
    gemv = m["ops"]["gemv_norm_qkv"]["impl"]["launches"][0]
    attn = m["ops"]["attention_decode_rope"]["impl"]["launches"][0]
    k = gemv["args"][5]["i32"]
    assert k == m["buffers"]["residual"]["shape"][1]
    nq, nkv, _q_stride, bt_stride, page_bytes, sm_scale, eps = (next(iter(a.values())) for a in attn["args"][10:])
    assert ln == {"module": "qkv_attention", "entry": "qkv_attention_rope_cluster",
                  "params": [*params, "i32", "i32", "i32", "i32", "i32", "f32", "f32"],
                  "block": [128, 1, 1], "grid": attn["grid"], "shared_mem": ATTN + 128 + 4 * 20480 + 2560 + 2 * k,
                  "carveout": 0, "pdl": True,
                  "args": [{"param": i} for i in range(12)]
                  + [{"i32": nq}, {"i32": nkv}, {"i32": k}, {"i32": bt_stride}, {"i32": page_bytes},
                     {"f32": sm_scale}, {"f32": eps}]}
    assert ln["grid"] == [8, 8, 1] and attn["shared_mem"] == ATTN == 70400
    assert (nq, k) == {"4b": (32, 2560), "0.6b": (16, 1024)}[geometry]
    assert ln["shared_mem"] == {"4b": 160128, "0.6b": 157056}[geometry]

    # the replaced ops and the modules only they used are gone; everything else is the manifest's
    assert "gemv_norm_qkv" not in out["ops"] and "attention_decode_rope" not in out["ops"]
    assert "decode_attention_pdl" not in out["modules"]
    assert out["modules"]["qkv_attention"]["source"] == "qkv_attention.cubin"
    assert out["programs"]["prefill"] == m["programs"]["prefill"]
    assert out["buffers"] == m["buffers"] and "qkv" in out["buffers"]
    assert {n: o for n, o in out["ops"].items() if n != "qkv_attention_decode"} == \
           {n: o for n, o in m["ops"].items() if n not in ("gemv_norm_qkv", "attention_decode_rope")}
    used = {ln["module"] for o in out["ops"].values() for ln in o["impl"]["launches"] if "module" in ln}
    assert set(out["modules"]) == used
    assert {n: v for n, v in out["modules"].items() if n != "qkv_attention"} == \
           {n: v for n, v in m["modules"].items() if n in used}

    # the weight ring's size follows --slots / --slot-bytes
    other = qa.rewrite(m, kernels, slots=2, slot_bytes=32768)
    assert other["ops"]["qkv_attention_decode"]["impl"]["launches"][0]["shared_mem"] == \
           ATTN + 128 + 2 * 32768 + 2560 + 2 * k


def _launch_set(op: str, field: str, value):
    def f(m):
        m["ops"][op]["impl"]["launches"][0][field] = value
    return f


def _launch_del(op: str, field: str):
    def f(m):
        del m["ops"][op]["impl"]["launches"][0][field]
    return f


def _arg_set(op: str, i: int, value):
    def f(m):
        m["ops"][op]["impl"]["launches"][0]["args"][i] = value
    return f


def _swap(m):
    """l3's attention call before its norm_qkv call."""
    calls = _calls(m)
    i = next(i for i, c in enumerate(calls) if c["label"] == "l3.norm_qkv")
    calls[i], calls[i + 1] = calls[i + 1], calls[i]


def _between(m):
    """l3's o_proj call between its norm_qkv and attention calls."""
    calls = _calls(m)
    i = next(i for i, c in enumerate(calls) if c["label"] == "l3.norm_qkv")
    calls.insert(i + 1, calls.pop(i + 2))


def _last(m):
    """The program ends with a norm_qkv call."""
    calls = _calls(m)
    calls.append(copy.deepcopy(next(c for c in calls if c["label"] == "l3.norm_qkv")) | {"label": "l99.norm_qkv"})


def _other_qkv(m):
    """l3's attention reads another buffer than its norm_qkv writes."""
    next(c for c in _calls(m) if c["label"] == "l3.attn")["args"][0] = {"buf": "attn"}


GQ, AD = "gemv_norm_qkv", "attention_decode_rope"
REFUSALS = {
    "order": (_swap, r"call `l3\.attn`: an attention call not right after its norm_qkv call"),
    "between": (_between, r"call `l3\.norm_qkv`: not followed by its attention call"),
    "last": (_last, r"call `l99\.norm_qkv`: not followed by its attention call"),
    "qkv-arg": (_other_qkv, r"call `l3\.attn`: reads qkv from \{'buf': 'attn'\}, not from `l3\.norm_qkv`'s output"),
    "gemv-entry": (_launch_set(GQ, "entry", "kern_gemv_norm_acc_m1"),
                   r"op `gemv_norm_qkv` launches `kern_gemv_norm_acc_m1`; this rewrite knows kern_gemv_norm_m1, "
                   r"kern_gemv_norm_m1_u5"),
    "gemv-module": (lambda m: (_launch_set(GQ, "entry", "kern_gemv_norm_m1")(m),  # a gemv.cu entry (the example's
                               _launch_set(GQ, "module", "gemv_persist")(m)),  # tc one maps onto module gemv)
                    r"op `gemv_norm_qkv` launches from module `gemv_persist`; this rewrite knows gemv\.cu's gemv, "
                    r"gemv_p2"),
    "attn-entry": (_launch_set(AD, "entry", "decode_attention_cluster"),
                   r"op `attention_decode_rope` launches `decode_attention_cluster`; this rewrite knows "
                   r"decode_attention_rope_cluster"),
    "attn-args": (_arg_set(AD, 16, {"i32": 1}), r"op `attention_decode_rope`: launch args after its 10 params"),
    "gemv-args": (_arg_set(GQ, 5, {"f32": 1.0}), r"op `gemv_norm_qkv`: launch args after its 4 params"),
    "eps": (_arg_set(GQ, 6, {"f32": 1e-5}),
            r"op `gemv_norm_qkv`'s eps 1e-05 is not op `attention_decode_rope`'s 1e-06: qkv_attention_rope_cluster "
            r"uses one eps"),
    "n": (_arg_set(GQ, 4, {"i32": 4096}), r"op `gemv_norm_qkv`: n=4096 is not \(num_q_heads 32 \+ 2·num_kv_heads 8\)"),
    "no-shared-mem": (_launch_del(AD, "shared_mem"),
                      r"op `attention_decode_rope` launches with no \(literal\) shared_mem"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_rewrite_refuses_by_name(tmp_path, case):
    kernels = _standin(tmp_path)
    mutate, needle = REFUSALS[case]
    m = json.loads(EXAMPLES["4b"].read_text())
    mutate(m)
    with pytest.raises(qa.VariantError, match=needle):
        qa.rewrite(m, kernels)


def test_rewrite_refuses_shared_memory_and_what_is_missing(tmp_path):
    m = json.loads(EXAMPLES["4b"].read_text())
    with pytest.raises(qa.VariantError, match="qkv_attention.cubin: not found; build it from "
                                              "tools/kernels-src/qkv_attention.cu with -DKERN_PDL"):
        qa.rewrite(m, tmp_path)
    kernels = _standin(tmp_path)
    # 70400 + 128 + 8·20480 + 2560 + 2·2560 = 242048 > 227 KB; 7 slots fit (221568)
    with pytest.raises(qa.VariantError, match=r"op `qkv_attention_decode`: 242048 bytes of dynamic shared memory "
                                              r"\(70400 of the attention \+ 128 \+ 8·20480 .* over sm_90's 232448"):
        qa.rewrite(m, kernels, slots=8)
    assert qa.rewrite(m, kernels, slots=7)["ops"]["qkv_attention_decode"]["impl"]["launches"][0]["shared_mem"] == 221568
    for slots, slot_bytes in [(0, 20480), (1, 20480), (17, 1024), (4, 20487), (4, 1008)]:
        with pytest.raises(qa.VariantError, match=f"--slots {slots}, --slot-bytes {slot_bytes}: the build's "
                                                  "-DQA_SLOTS is 2 to 16 and its -DQA_SLOT_BYTES a multiple of 16"):
            qa.rewrite(m, kernels, slots=slots, slot_bytes=slot_bytes)
    assert qa.rewrite(m, kernels, slots=2, slot_bytes=1024)["ops"]["qkv_attention_decode"]["impl"]["launches"][0][
        "shared_mem"] == ATTN + 128 + 2 * 1024 + 2560 + 2 * 2560
    with pytest.raises(qa.VariantError, match="no op `gemv_norm_qkv`"):
        qa.rewrite(qa.rewrite(m, kernels), kernels)
    with pytest.raises(qa.VariantError, match="not a path"):
        qa.rewrite(m, kernels, str(kernels / "qkv_attention.cubin"))


@pytest.fixture(scope="module")
def stub_kernels(built_kernels, tmp_path_factory):
    """The built kernels plus qkv_attention.cubin: an nvcc build of STUB."""
    tmp = tmp_path_factory.mktemp("qkv_attention_stub")
    (tmp / "stub.cu").write_text(STUB)
    cubin = nvcc_builds(tmp, {"stub": (str(tmp / "stub.cu"), (), "stub.cubin")})["stub"]
    k = tmp / "kernels"
    shutil.copytree(built_kernels, k)
    shutil.copy(cubin, k / "qkv_attention.cubin")
    return k


def _errors(m: dict, kernels: Path) -> list[str]:
    from kern_verify.verify import verify_text

    return [str(d) for d in verify_text(json.dumps(m), kernels_dir=kernels) if d.severity == "error"]


@pytest.mark.parametrize("geometry", list(EXAMPLES))
def test_rewrite_verifies_on_a_stub_of_the_abi(stub_kernels, geometry):
    m = json.loads(EXAMPLES[geometry].read_text())
    assert not _errors(m, stub_kernels)
    assert not _errors(qa.rewrite(m, stub_kernels), stub_kernels)


def test_command_line(stub_kernels, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert qa.main([str(EXAMPLES["0.6b"]), "--kernels", str(stub_kernels), "--out", str(out)]) == 0
    assert "the one-launch qkv + attention of qkv_attention.cubin (4 slots of 20480 bytes)" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["ops"]["qkv_attention_decode"]["impl"]["launches"][0]["shared_mem"] == 157056
    assert qa.main([str(EXAMPLES["0.6b"]), "--kernels", str(stub_kernels), "--out", str(out), "--slots", "2",
                    "--slot-bytes", "16384"]) == 0
    assert json.loads(out.read_text())["ops"]["qkv_attention_decode"]["impl"]["launches"][0]["shared_mem"] == \
           ATTN + 128 + 2 * 16384 + 2560 + 2 * 1024
    capsys.readouterr()
    standin = _standin(tmp_path)
    for f in stub_kernels.iterdir():
        if f.name != "qkv_attention.cubin":
            shutil.copy(f, standin / f.name)
    for argv, needle in [
        ([str(tmp_path / "none.json"), "--kernels", str(stub_kernels)], "cannot read the manifest"),
        ([str(EXAMPLES["4b"]), "--kernels", str(stub_kernels), "--slots", "8"], "over sm_90's 232448"),
        ([str(out), "--kernels", str(stub_kernels)], "no op `gemv_norm_qkv`"),
        ([str(EXAMPLES["4b"]), "--kernels", str(standin)], "the result does not verify"),  # verified before written
    ]:
        target = tmp_path / "refused.json"
        assert qa.main([*argv, "--out", str(target)]) == 1
        assert needle in capsys.readouterr().err
        assert not target.exists()
    with pytest.raises(SystemExit):  # argparse's exit 2
        qa.main([str(EXAMPLES["4b"]), "--kernels", str(stub_kernels), "--out", str(tmp_path / "no" / "m.json")])
    assert "no folder" in capsys.readouterr().err


@pytest.mark.parametrize("geometry", list(EXAMPLES))
def test_rewrite_verifies_on_the_real_build(built_kernels, tmp_path, geometry):
    cubin = nvcc_builds(tmp_path, {"pdl": ("qkv_attention.cu", ("KERN_PDL",), "qkv_attention.cubin")})["pdl"]
    k = tmp_path / "kernels"
    shutil.copytree(built_kernels, k)
    shutil.copy(cubin, k / "qkv_attention.cubin")
    out = qa.rewrite(json.loads(EXAMPLES[geometry].read_text()), k)
    assert not _errors(out, k)
