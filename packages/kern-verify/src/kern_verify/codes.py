"""The registry of diagnostic codes: code → severity, title, description, example.

Codes are stable: a code, once published, keeps its meaning (new rules get new
codes). `kern-verify --explain CODE` prints the description and the example.
Numbering follows DESIGN §3: E00xx decoding, E001x declarations (groups 1–4),
E002x type strings and expressions (and E0022, the buffer class: E001x was
full), E003x launches (group 5), E004x impl against interface (group 6), E005x
calls (group 7), E006x program dataflow (group 8), E007x unused declarations
(group 9), E008x cubin checks (`--kernels`), E009x launch attributes
(programmatic dependent launch, `pdl`; the shared-memory carveout, E0095) and the
cubin checks that did not fit E008x (E0092–E0094), E0099 internal errors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Code:
    """One diagnostic code.

    Attributes:
        code: `E0001`...
        severity: default severity, "error" or "warning".
        title: a short name of the rule.
        description: what the rule checks and why, and how to fix a violation.
        example: a small manifest fragment that violates the rule.
    """

    code: str
    severity: str
    title: str
    description: str
    example: str


_CODES: list[Code] = [
    # --- decoding -------------------------------------------------------------------
    Code("E0001", "error", "not valid JSON",
         "The manifest file is not valid JSON (or not UTF-8), so nothing else can be checked. "
         "The CLI exits with status 2.",
         '{"schema_version": 4, "model": "m",}    // trailing comma'),
    Code("E0002", "error", "duplicate key",
         "A JSON object repeats a key. Every map key of a manifest is a name and names are unique; "
         "JSON's usual 'last one wins' would silently drop a declaration, so it is refused. "
         "Rename or remove one of the two entries.",
         '"buffers": {"x": {...}, "x": {...}}'),
    Code("E0003", "error", "missing field",
         "A required field is absent (e.g. a buffer without `dtype`, a manifest without `programs`). "
         "All top-level keys are required: schema_version, model, vars, states, buffers, modules, ops, programs. "
         "A JSON object with none of them (another tool's JSON, such as a kernels directory's index.json, passed as "
         "the manifest) is one E0003 that says so, not one per missing field and one E0004 per key.",
         '"buffers": {"x": {"shape": [4], "class": "workspace"}}    // no dtype'),
    Code("E0004", "error", "unknown field",
         "A field that the schema does not define. Unknown fields are refused everywhere so that a "
         "misspelled field (`shared_memory` for `shared_mem`) is not silently ignored.",
         '"vars": {"tokens": {"max": 2048, "maximum": 4096}}'),
    Code("E0005", "error", "invalid value",
         "A value has the wrong JSON type or form: a string where an integer is expected, an argument "
         "object with two forms (`{\"buf\": \"x\", \"var\": \"t\"}`), an `offset` on a var argument...",
         '"vars": {"tokens": {"max": "2048"}}'),
    # --- declarations (groups 1-4) --------------------------------------------------
    Code("E0010", "error", "unsupported schema version",
         "This verifier implements manifest schema version 4. Regenerate the manifest with a "
         "generator for version 4, or use the kern release that matches the manifest.",
         '{"schema_version": 3, ...}'),
    Code("E0011", "error", "inconsistent var bounds",
         "A var needs 0 ≤ min ≤ max, max ≥ 1 and max ≤ 2^63−1. Every static check is done at "
         "the bounds, and at run time a value outside them is refused.",
         '"vars": {"tokens": {"min": 8, "max": 4}}'),
    Code("E0012", "error", "bad state size",
         "A state declares exactly one of `bytes_per_token` / `bytes_per_seq`, a positive integer. "
         "A `bytes_per_seq` state is sized by the var `seqs` (its max), which must then be declared.",
         '"states": {"kv": {"bytes_per_token": 0}}'),
    Code("E0013", "error", "state alignment not a power of two",
         "A state's `align` (bytes, default 256) must be a power of two.",
         '"states": {"kv": {"bytes_per_token": 4096, "align": 48}}'),
    Code("E0014", "error", "unknown dtype",
         "A buffer or scratch dtype is not one of bf16 f16 f32 f64 i8 u8 i16 u16 i32 u32 i64 u64 "
         "fp8e4m3 fp8e5m2.",
         '"buffers": {"x": {"dtype": "bfloat16", "shape": [4], "class": "workspace"}}'),
    Code("E0015", "error", "shape dim does not resolve",
         "Each dim of a buffer or scratch shape is a positive integer or the name of a declared var.",
         '"buffers": {"x": {"dtype": "bf16", "shape": ["tokenz", 4096], "class": "workspace"}}'),
    Code("E0016", "error", "buffer size overflows int64",
         "The byte size of a buffer or scratch at the var maxima (product of dims × element size) "
         "must fit in a signed 64-bit integer.",
         '"buffers": {"x": {"dtype": "f64", "shape": [4294967296, 4294967296], "class": "workspace"}}'),
    Code("E0017", "error", "bad module source",
         "A module's `source` is a path relative to the kernels directory (not absolute, no `..` "
         "component, not empty) or `hf:org/repo/path`; an `hf:` source must carry a sha256.",
         '"modules": {"m": {"source": "../other/m.cubin", "sha256": "..."}}'),
    Code("E0018", "error", "malformed sha256",
         "A module's sha256 is 64 hexadecimal digits (the SHA-256 of the cubin file).",
         '"modules": {"m": {"source": "m.cubin", "sha256": "abc123"}}'),
    Code("E0019", "warning", "module without sha256",
         "A local module without sha256 is loaded unchecked: a different cubin with the same name "
         "would run. Add its sha256 (`sha256sum m.cubin`).",
         '"modules": {"m": {"source": "m.cubin"}}'),
    # --- types and expressions ----------------------------------------------------
    Code("E0020", "error", "malformed parameter type",
         "A parameter type string follows the grammar `in|out|inout buffer<dtype>`, `in|out|inout ptr` "
         "or a scalar `i8 u8 i16 u16 i32 u32 i64 u64 f32 f64`. Buffers and pointers need a direction.",
         '"params": ["buffer<bf16>", "int"]'),
    Code("E0021", "error", "bad expression",
         "An expression is an integer, a var name, `{\"ceil_div\": [E, int]}` or `{\"mul\": [E, int]}`. "
         "Its vars must be declared, a ceil_div divisor must be a positive integer, and nothing else "
         "(add, control flow) exists.",
         '"grid": [{"ceil_div": ["tokens", 0]}, 1, 1]'),
    Code("E0022", "error", "unknown buffer class",
         "A buffer's `class` is not one of input, output, weight, workspace, carry. The class decides who "
         "writes the buffer and when (the dataflow rules of group 8, the memory plan, weight binding), so a "
         "buffer of another class would escape every one of those checks.",
         '"buffers": {"x": {"dtype": "bf16", "shape": [4], "class": "scratch"}}    // workspace?'),
    # --- launches (group 5) -------------------------------------------------------
    Code("E0030", "error", "unknown module",
         "A launch names a module that is not declared in `modules`.",
         '"launches": [{"module": "normz", "entry": "rms_norm_kernel", ...}]'),
    Code("E0031", "error", "malformed launch",
         "A kernel launch needs `module`, `entry`, `params`, `block` [x,y,z] and `grid` [e,e,e]; an extern "
         "launch has only `extern` and `args`.",
         '{"extern": "cublaslt.gemm_bf16_tn", "block": [128, 1, 1], "args": [...]}'),
    Code("E0032", "error", "block outside CUDA limits",
         "A block is [x, y, z] with 1 ≤ x, y ≤ 1024, 1 ≤ z ≤ 64 and x·y·z ≤ 1024.",
         '"block": [2048, 1, 1]'),
    Code("E0033", "error", "grid outside CUDA limits",
         "A grid is three expressions; at the var maxima x ≤ 2^31−1 and y, z ≤ 65535, and at the var "
         "minima every dimension is at least 1 (a zero grid is a launch error).",
         '"grid": [{"mul": ["tokens", 65536]}, 1, 1]    // tokens.max = 65536'),
    Code("E0034", "error", "shared memory outside limits",
         "A launch's dynamic `shared_mem` is 0..232448 bytes (227 KiB, the sm_90 per-block maximum).",
         '"shared_mem": 262144'),
    Code("E0035", "error", "argument count mismatch",
         "A launch has exactly one argument per declared parameter (for Triton kernels, include the two "
         "hidden trailing 8-byte parameters, global and profile scratch, passed as `{\"i64\": 0}`).",
         '"params": ["in buffer<bf16>", "i32"], "args": [{"param": 0}]'),
    Code("E0036", "error", "argument does not fit its parameter",
         "Each launch argument must match its launch parameter position by position: a buffer param takes "
         "an interface buffer param or scratch of the same dtype, a ptr param takes an interface ptr, "
         "buffer or scratch (or a 0 literal for an unused pointer), a scalar param takes a scalar.",
         '"params": ["in buffer<f32>"], "args": [{"param": 0}]    // interface param 0 is in buffer<bf16>'),
    Code("E0037", "error", "launch writes an `in` param",
         "A launch passes an interface `in` param to a kernel parameter that writes (`out`/`inout`). The "
         "caller expects `in` arguments to be left untouched; declare the interface param `out` or `inout`.",
         'op params ["in buffer<bf16>"], launch params ["inout buffer<bf16>"], args [{"param": 0}]'),
    Code("E0038", "error", "interface param index out of range",
         "`{\"param\": i}` forwards interface param i; i must be a valid index of the op's `params`.",
         'op params ["in buffer<bf16>"], launch args [{"param": 3}]'),
    Code("E0039", "error", "unknown extern",
         "An extern launch names a built-in of the runtime. Known: cublaslt.gemm_bf16_tn "
         "(in buffer<bf16> a, in buffer<bf16> w, out buffer<bf16> c, i32 m, i32 n, i32 k) and "
         "cublaslt.gemm_bf16_tn_acc (same, c is inout).",
         '{"extern": "cublas.gemm", "args": [...]}'),
    Code("E0040", "error", "argument form not allowed here",
         "Launch arguments are `param`, `scratch`, literals and `expr`; call arguments are `buf`, `state`, "
         "`var`, literals and `expr`. A `var` in a launch is written as `{\"expr\": \"tokens\"}`.",
         'launch args [{"buf": "x"}]'),
    Code("E0041", "error", "`out` param never written",
         "An interface `out` param must be written by some launch of the impl; otherwise the caller reads "
         "garbage. Pass it to a kernel parameter declared `out` or `inout`, or make it `in`.",
         'op params ["out buffer<bf16>"], launch params ["in buffer<bf16>"]'),
    Code("E0042", "error", "interface param unused",
         "Every interface param must be forwarded to some launch (`{\"param\": i}`). Remove the param "
         "from the interface, or pass it.",
         'op params ["in buffer<bf16>", "i32"], launch args only use {"param": 0}'),
    Code("E0043", "error", "scratch does not fit its declaration",
         "A scratch argument names declared scratch; its offset is ≥ 0, aligned to the scratch element "
         "size and inside the scratch at the var maxima; a buffer param takes scratch of its own dtype.",
         '"scratch": {"tmp": {"dtype": "f32", "shape": [64]}}, args [{"scratch": "tmp", "offset": 6}]'),
    Code("E0044", "error", "scratch read before written",
         "A launch reads scratch (through an `in` or `inout` parameter) before any earlier launch of the "
         "impl wrote it. Scratch is not initialised; write it first (reorder the launches or fix the "
         "directions).",
         'launches[0] params ["in buffer<f32>"], args [{"scratch": "partial"}]'),
    Code("E0045", "error", "unused scratch",
         "Scratch declared by an impl but passed to no launch. Remove it.",
         '"scratch": {"tmp": {"dtype": "f32", "shape": [64]}}    // never used'),
    Code("E0046", "error", "`out` param read before written",
         "A launch reads an interface `out` param before any launch of the impl wrote it: an `out` "
         "argument's old content is undefined. Declare the interface param `inout`.",
         'op params ["out buffer<f32>"], launch params ["inout buffer<f32>"]'),
    Code("E0047", "warning", "interface direction wider than its use",
         "An `inout` interface param that no launch writes (or reads) could be `in` (or `out`); "
         "the dataflow checks of every caller are then stricter.",
         'op params ["inout buffer<bf16>"], every launch reads it only'),
    Code("E0048", "error", "op with no launches",
         "An op whose impl has an empty `launches` list: a call of it would do nothing, and none of its interface "
         "params or scratch could be used (those errors are not reported separately). Give it its launches, or "
         "remove the op.",
         '"ops": {"rms_norm": {"params": [...], "impl": {"launches": []}}}'),
    # --- calls (group 7) --------------------------------------------------------
    Code("E0050", "error", "unknown op",
         "A call names an op that is not declared in `ops`.",
         '{"label": "l0.norm", "op": "rmsnorm", "args": [...]}    // the op is rms_norm'),
    Code("E0051", "error", "call argument count mismatch",
         "A call has exactly one argument per interface param of its op.",
         'op params ["in buffer<bf16>", "out buffer<bf16>"], call args [{"buf": "x"}]'),
    Code("E0052", "error", "call argument does not fit its parameter",
         "A call argument must match its op param: a buffer param takes a buffer of exactly its dtype, a "
         "ptr param takes a state (and only a ptr param takes a state), a scalar param takes a var, an "
         "expr or a literal.",
         'op params ["in buffer<bf16>"], call args [{"buf": "logits_f32"}]'),
    Code("E0053", "error", "value range does not fit the scalar type",
         "A var, expression or literal passed to a scalar parameter must fit the type over its whole "
         "range (vars at [min, max]); a literal must also fit its own type key. Vars and expressions are "
         "integers, so they cannot go to f32/f64 params.",
         'op params ["u8"], call args [{"var": "tokens"}]    // tokens.max = 2048'),
    Code("E0054", "error", "unknown name",
         "A call argument names a buffer, state or var that is not declared.",
         '{"buf": "hiden"}'),
    Code("E0055", "error", "misaligned offset",
         "A buffer offset (bytes) is a multiple of the buffer's element size; a state offset is a "
         "multiple of 16 bytes (the widest vector access); offsets are ≥ 0.",
         '{"buf": "qkv", "offset": 3}    // qkv is bf16'),
    Code("E0056", "error", "offset out of bounds",
         "A buffer offset must be inside the buffer: 0 ≤ offset < its size in bytes at the var maxima "
         "(the allocated size). A state offset must be inside the state: below seqs.max × bytes_per_seq for "
         "a per-sequence state; a per-token state's size depends on the capacity, so only offsets over 2^63−1 "
         "are refused there.",
         '{"buf": "x", "offset": 8192}    // x is bf16 [2048] = 4096 bytes'),
    Code("E0057", "error", "duplicate call label",
         "Call labels are unique within their program: diagnostics, profiles and op-by-op comparisons name "
         "calls by label.",
         '[{"label": "l0.norm", ...}, {"label": "l0.norm", ...}]'),
    Code("E0058", "error", "empty call label",
         "A call label is empty or only whitespace. Diagnostics, profiles and op-by-op comparisons name calls "
         "by label, so every call needs one that says which call it is (e.g. `l3.qkv_proj`).",
         '{"label": "", "op": "rms_norm", "args": [...]}'),
    # --- program dataflow (group 8) ----------------------------------------------
    Code("E0060", "error", "workspace read before written",
         "A call reads a workspace buffer (its op param is `in` or `inout`) before any earlier call of "
         "the same program wrote it. Workspace is not kept between runs; write it first in this program, "
         "or make it a `carry` if another program fills it.",
         'decode: [{"op": "rms_norm", "args": [{"buf": "h"}, ...]}]    // h: workspace, nothing wrote it'),
    Code("E0061", "error", "write to input or weight",
         "A call passes an `input` or `weight` buffer to an `out`/`inout` param. The caller owns inputs, "
         "weights are read-only; use a workspace buffer.",
         '{"buf": "token_ids"} to an op param "out buffer<i64>"'),
    Code("E0062", "error", "output or carry never written",
         "An `output` or `carry` buffer is written by no call of any program, so the caller would read "
         "garbage. Write it, or remove it.",
         '"buffers": {"next_token": {"dtype": "i64", "shape": [1], "class": "output"}}    // never written'),
    Code("E0063", "warning", "output read before written",
         "A call reads an `output` buffer before any call of the same program wrote it; its content "
         "from a previous run is not guaranteed. Use a `carry` for values kept between runs.",
         'decode reads next_token before argmax writes it'),
    # --- unused declarations (group 9) -------------------------------------------
    Code("E0070", "error", "unused var",
         "A var used by no shape, grid, argument or state. Remove it.",
         '"vars": {"seqs": {"max": 1}}    // never referenced'),
    Code("E0071", "error", "unused state",
         "A state that no call passes: the runtime would allocate capacity × bytes_per_token for nothing. "
         "Remove it, or pass it to the op that should use it.",
         '"states": {"kv_old": {"bytes_per_token": 4096}}'),
    Code("E0072", "error", "unused buffer",
         "A buffer passed by no call (a weight nobody reads is one too). Remove it.",
         '"buffers": {"tmp": {...}}    // no call names it'),
    Code("E0073", "error", "unused module",
         "A module no launch names. Remove it (the runtime would load it for nothing).",
         '"modules": {"old_kernels": {...}}'),
    Code("E0074", "error", "unused op",
         "An op that no call of any program names: its modules would be loaded and checked for nothing. "
         "Remove it, or call it.",
         '"ops": {"gelu": {...}}    // no call uses gelu'),
    Code("E0075", "error", "program with no calls",
         "A program whose `calls` list is empty, or a manifest with no program at all: running it would do nothing, "
         "and every declaration a call would use is unused (those errors are then folded into one per kind). Add "
         "the calls, or remove the program.",
         '"programs": {"decode": {"calls": []}}'),
    # --- cubin checks (--kernels) -------------------------------------------------
    Code("E0080", "error", "module file missing",
         "With `--kernels DIR`, each local module's `source` must be a readable file under DIR.",
         'kern-verify m.json --kernels build/    // build/norm.cubin does not exist'),
    Code("E0081", "error", "sha256 mismatch",
         "The module file's SHA-256 differs from the manifest's `sha256`: the cubin was rebuilt or "
         "replaced. Update the manifest (regenerate it) or restore the file.",
         '"sha256": "00…00" but sha256sum norm.cubin gives 3f…'),
    Code("E0082", "error", "not a cubin",
         "The module file is not a CUDA ELF cubin (wrong magic, a fatbinary, a PTX file, or corrupt).",
         '"source": "norm.ptx"'),
    Code("E0083", "error", "entry not in module",
         "The launch's `entry` symbol is not a kernel entry of its module's cubin. Entry names are the "
         "ELF symbols, mangled as they are (`_Z8rms_normPKfPfi`).",
         '"entry": "rms_norm"    // the cubin has _Z8rms_normPKfPfi'),
    Code("E0084", "error", "parameter layout differs from the cubin",
         "A launch's declared `params`, laid out with natural alignment (scalars at a multiple of their "
         "size, pointers 8 bytes), must equal the cubin's `.nv.info` parameter table: the same count, "
         "and at each position the same offset and size.",
         '"params": ["in buffer<bf16>", "i32"]    // the kernel takes (const bf16*, int64_t)'),
    Code("E0085", "error", "block does not match the kernel",
         "The launch's block exceeds the kernel's `__launch_bounds__` maximum, or differs from the "
         "block size the kernel requires (`.reqntid`; Triton kernels require num_warps × 32 threads).",
         '"block": [256, 1, 1]    // a Triton kernel compiled with num_warps=4 requires 128'),
    Code("E0086", "warning", "module not checked",
         "An `hf:` module is not present under the kernels directory, so its hash and parameter tables "
         "were not checked offline. Place the file at DIR/<path after hf:org/repo/> to check it.",
         '"source": "hf:org/kernels/norm.cubin"'),
    Code("E0087", "warning", "cubin for another GPU architecture",
         "The module's cubin was built for an SM version other than sm_90 (the H200 target). A cubin only "
         "runs on GPUs of its own major architecture: rebuild it with `-arch=sm_90` (Triton: "
         "GPUTarget(\"cuda\", 90, 32)).",
         'nvcc -cubin -arch=sm_80 norm.cu    // then listed as a module'),
    Code("E0088", "warning", "`pdl` kernel never waits for its predecessor",
         "A launch with `\"pdl\": true` may begin before the previous launch has completed; its kernel promises "
         "to execute `griddepcontrol.wait` (cudaGridDependencySynchronize) before reading anything an earlier launch "
         "wrote. With `--kernels`, the verifier looks for that instruction (SASS `ACQBULK`) in the entry's code "
         "(`.text.<entry>`) and finds none: the kernel would read its inputs while the previous kernel still writes "
         "them. Add the wait (PTX `griddepcontrol.wait;`, sm_90) or remove `pdl`. Only presence is checked, not that "
         "the wait comes before the first dependent read (that stays the kernel's promise); a wait inside a "
         "non-inlined device function is not seen, hence a warning.",
         '"entry": "kern_gemv_m1", "pdl": true    // gemv.cu built without griddepcontrol.wait'),
    Code("E0089", "error", "grid is not a multiple of the kernel's thread-block cluster",
         "The kernel is compiled for a thread-block cluster (`__cluster_dims__(x, y, z)`, read from the cubin's "
         "`.nv.info`): CUDA launches it only with a grid that is a multiple of the cluster on every axis, and "
         "refuses the launch otherwise (CUDA_ERROR_INVALID_CLUSTER_SIZE). Checked here where the grid axis uses "
         "no var (a literal or a constant expression); an axis computed from vars is checked by the runtime "
         "before each launch. Make the grid a multiple (e.g. one cluster per kv head: grid.y = the cluster's y).",
         '"grid": [8, 4, 1]    // the kernel is __cluster_dims__(1, 8, 1): grid.y must be a multiple of 8'),
    Code("E0090", "error", "`pdl` on a built-in",
         "`\"pdl\": true` (programmatic dependent launch) applies to kernel launches only. A built-in (`extern`) is "
         "run by a library (cuBLASLt) that launches its own kernels: none of them promises to execute "
         "`griddepcontrol.wait`, so it could read its inputs before the previous launch finished writing them. "
         "Remove the flag.",
         '{"extern": "cublaslt.gemm_bf16_tn", "pdl": true, "args": [...]}'),
    Code("E0091", "warning", "`pdl` launch with no kernel before it",
         "A `pdl` launch overlaps its start with the previous kernel's tail. Here the previous launch in program "
         "order is a built-in (cuBLASLt kernels never execute `griddepcontrol.launch_dependents`), or there is none "
         "(the first launch of a program: a root node of its CUDA graph). The program stays correct — the kernel's "
         "wait still returns only after everything before it completed, and the launch degrades to an ordinary one "
         "— but the flag buys nothing, hence a warning: an op's impl with `pdl` may be shared by call sites after "
         "kernels and after built-ins. Reported at the call (first launch of an op) or at the launch (after a "
         "built-in of the same impl).",
         'decode: [{"op": "gemm"  /* extern */}, {"op": "gemv"  /* launches[0].pdl = true */}]'),
    Code("E0092", "warning", "non-portable thread-block cluster",
         "The kernel is compiled for a cluster of more than 8 CTAs, the portable maximum. sm_90 (H100, H200) runs "
         "up to 16 once the function opts in (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, which kern's "
         "runtime sets at load), but whether such a cluster can be scheduled depends on the GPU's SM count per GPC "
         "and on the kernel's shared memory and registers: the launch may fail, or run its clusters in waves.",
         '__cluster_dims__(16, 1, 1)    // 16 CTAs of one GPC at once'),
    Code("E0093", "error", "thread-block cluster larger than sm_90 runs",
         "The kernel is compiled for a cluster of more than 16 CTAs (`__cluster_dims__`). nvcc accepts it, but "
         "sm_90 schedules at most 16 CTAs per cluster (with the non-portable opt-in; 8 without), so every launch "
         "fails. Rebuild the kernel with a smaller cluster.",
         '__cluster_dims__(32, 1, 1)'),
    Code("E0094", "error", "static plus dynamic shared memory over the per-block maximum",
         "With `--kernels`, a launch's dynamic `shared_mem` plus the kernel's static shared memory (its `__shared__` "
         "arrays: the cubin's `.nv.shared.<entry>` section less the 1 KB per block sm_90 reserves for the system, "
         "which nvcc's cubins count in it) must fit sm_90's 232448 bytes (227 KiB) per block: "
         "CUDA refuses to raise the function's MAX_DYNAMIC_SHARED_SIZE_BYTES past the maximum minus the static size "
         "(cuFuncSetAttribute), so every launch would fail. (kern's runtime raises that attribute whenever static + "
         "dynamic exceeds the 48 KB default, not only the dynamic part.)",
         '"shared_mem": 229376    // the kernel also declares __shared__ float buf[2048] (8 KB)'),
    Code("E0095", "error", "carveout outside 0..100",
         "A kernel launch's `carveout` (the preferred shared-memory carveout, CUDA's "
         "CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT) is a percent of the device's maximum shared memory "
         "per SM: 0 asks for the smallest shared-memory configuration that fits the launch's blocks (the most L1), "
         "100 for the most shared memory; no other value means anything (the driver's default, -1 in CUDA's "
         "runtime API, is spelled by omitting the field). Within the range it is a hint: the driver rounds it to "
         "a supported configuration and raises it where a block needs more.",
         '"shared_mem": 140288, "carveout": 150    // 100 is the most shared memory'),
    Code("E0099", "error", "internal verifier error",
         "The verifier itself failed on this input. This is a bug in kern-verify; please report it with "
         "the manifest.",
         "(none)"),
]

CODES: dict[str, Code] = {c.code: c for c in _CODES}


def explain(code: str) -> str:
    """The `--explain` text of a code: title, severity, description and example.

    Raises:
        KeyError: unknown code (the message lists how to find valid ones).
    """
    c = CODES.get(code.upper())
    if c is None:
        raise KeyError(f"unknown code `{code}`: codes are E0001..E0099, see `kern-verify --explain list`")
    return f"{c.code}: {c.title} ({c.severity})\n\n{c.description}\n\nExample:\n    {c.example}\n"
