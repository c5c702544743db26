"""Rules on declarations (DESIGN §3 groups 1–4), module sources and type strings.

- schema version (E0010); var bounds (E0011); states (E0012, E0013);
- buffer and scratch dtype, dims, int64 overflow (E0014–E0016); buffer class (E0022);
- module source paths and sha256 (E0017–E0019);
- every interface and launch parameter type string parses (E0020).
"""

from __future__ import annotations

import re

from kern_schema import BUFFER_CLASSES, DTYPES, SCHEMA_VERSION, ParamTypeError, Path, parse_param_type
from kern_schema.dtypes import INT64_MAX

from .context import Context, suggest
from .diagnostic import Fold

_HEX64 = re.compile(r"[0-9a-fA-F]{64}\Z")
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")


def check_declarations(ctx: Context) -> None:
    """Run every declaration rule on `ctx.m`, reporting into `ctx.r`."""
    m, r = ctx.m, ctx.r
    if m.schema_version != SCHEMA_VERSION:
        r.add("E0010", ("schema_version",),
              f"schema version {m.schema_version} is not supported: this verifier implements version {SCHEMA_VERSION}",
              "regenerate the manifest for schema version 4")
    _vars(ctx)
    _states(ctx)
    for name, b in m.buffers.items():
        check_tensor(ctx, ("buffers", name), f"buffer `{name}`", b.dtype, b.shape)
        if b.class_ not in BUFFER_CLASSES:
            r.add("E0022", ("buffers", name, "class"), f"buffer `{name}` has unknown class `{b.class_}`",
                  suggest(b.class_, BUFFER_CLASSES, "classes: " + ", ".join(BUFFER_CLASSES)))
    _modules(ctx)
    _types(ctx)


def _vars(ctx: Context) -> None:
    for name, v in ctx.m.vars.items():
        path = ("vars", name)
        if v.min < 0:
            ctx.r.add("E0011", path + ("min",), f"var `{name}` has min {v.min} < 0", "vars are non-negative: set min ≥ 0")
        if v.max < 1:
            ctx.r.add("E0011", path + ("max",), f"var `{name}` has max {v.max} < 1", "set max ≥ 1")
        elif v.max > INT64_MAX:
            ctx.r.add("E0011", path + ("max",), f"var `{name}` has max {v.max} > 2^63−1", "vars are 64-bit signed values")
        if v.min > v.max:
            ctx.r.add("E0011", path, f"var `{name}` has min {v.min} > max {v.max}", "swap them or fix one bound")
        if v.min < 0 or v.max < 1 or v.max > INT64_MAX or v.min > v.max:
            ctx.bad_vars.add(name)


def _states(ctx: Context) -> None:
    for name, s in ctx.m.states.items():
        path = ("states", name)
        units = [u for u in ("bytes_per_token", "bytes_per_seq") if getattr(s, u) is not None]
        if len(units) != 1:
            ctx.r.add("E0012", path,
                      f"state `{name}` declares {'both' if units else 'neither'} of bytes_per_token and bytes_per_seq",
                      "declare exactly one: `bytes_per_token` (sized by the capacity) or `bytes_per_seq` (by seqs.max)")
        for u in units:
            val = getattr(s, u)
            if val <= 0:
                ctx.r.add("E0012", path + (u,), f"state `{name}` has {u} = {val}", "a state's size is a positive byte count")
            elif val > INT64_MAX:
                ctx.r.add("E0012", path + (u,), f"state `{name}` has {u} = {val} > 2^63−1", "a state's size must fit in int64")
        if s.bytes_per_seq is not None:
            if "seqs" in ctx.ranges:
                ctx.used_vars.add("seqs")
            elif s.bytes_per_token is None:
                ctx.r.add("E0012", path + ("bytes_per_seq",),
                          f"state `{name}` is sized per sequence but no var `seqs` is declared",
                          'declare `"seqs": {"max": N}` in vars (its max sizes the state)')
        if s.align < 1 or s.align & (s.align - 1):
            ctx.r.add("E0013", path + ("align",), f"state `{name}` has align {s.align}, not a power of two",
                      "use 256 (the default), 512, 4096...")


def check_tensor(ctx: Context, path: Path, what: str, dtype: str, shape: list[int | str]) -> None:
    """dtype known (E0014), dims resolve (E0015), bytes at the var maxima fit int64 (E0016)."""
    r = ctx.r
    size = DTYPES.get(dtype)
    if size is None:
        r.add("E0014", path + ("dtype",), f"{what} has unknown dtype `{dtype}`", "dtypes: " + " ".join(DTYPES))
    n = size or 1
    ok = True
    for i, d in enumerate(shape):
        if isinstance(d, str):
            rng = ctx.ranges.get(d)
            if rng is None:
                ctx.refer_unknown("vars", d, what)
                r.add("E0015", path + ("shape", i), f"{what}: dim {i} names `{d}`, which is not a declared var",
                      suggest(d, ctx.ranges, "declare it in `vars`"),
                      fold=Fold(("var", d), f"shapes use `{d}`", what))
                ok = False
                continue
            ctx.used_vars.add(d)
            if d in ctx.bad_vars:
                ok = False  # E0011: no size at bounds that are refused
                continue
            d = rng[1]
        elif d < 1:
            r.add("E0015", path + ("shape", i), f"{what}: dim {i} is {d}", "a dim is a positive integer or a var name")
            ok = False
            continue
        n *= max(d, 0)
    if ok and size is not None and n > INT64_MAX:
        r.add("E0016", path + ("shape",), f"{what} is {n} bytes at the var maxima, more than int64 can hold",
              "reduce the dims or the var maxima")


def _modules(ctx: Context) -> None:
    for name, mod in ctx.m.modules.items():
        path = ("modules", name)
        src = mod.source
        if src.startswith("hf:"):
            parts = src[3:].split("/")
            if len(parts) < 3 or any(p in ("", ".", "..") for p in parts):
                ctx.bad_sources.add(name)
                ctx.r.add("E0017", path + ("source",), f"module `{name}`: `{src}` is not of the form hf:org/repo/path",
                          "write hf:<org>/<repo>/<path inside the repo>")
            if mod.sha256 is None:
                ctx.r.add("E0017", path, f"module `{name}` comes from the Hub (`{src}`) but has no sha256",
                          "an hf: source must be pinned: add its \"sha256\"")
        else:
            parts = src.replace("\\", "/").split("/")
            if not src:
                ctx.bad_sources.add(name)
                ctx.r.add("E0017", path + ("source",), f"module `{name}` has an empty source", "give the cubin's path relative to the kernels directory")
            elif src.startswith(("/", "\\")) or _DRIVE.match(src):
                ctx.bad_sources.add(name)
                ctx.r.add("E0017", path + ("source",), f"module `{name}`: `{src}` is an absolute path",
                          "module paths are relative to the manifest's kernel directory")
            elif ".." in parts:
                ctx.bad_sources.add(name)
                ctx.r.add("E0017", path + ("source",), f"module `{name}`: `{src}` leaves the kernels directory (`..`)",
                          "module paths stay inside the manifest's kernel directory")
            if mod.sha256 is None:
                ctx.r.add("E0019", path, f"module `{name}` has no sha256: the runtime cannot check the file",
                          f"add \"sha256\": the output of `sha256sum {src or 'FILE'}`")
        if mod.sha256 is not None and not _HEX64.match(mod.sha256):
            ctx.r.add("E0018", path + ("sha256",),
                      f"module `{name}`: sha256 `{mod.sha256[:80]}` is not 64 hexadecimal digits ({len(mod.sha256)} characters)",
                      "paste the full SHA-256 (sha256sum prints 64 hex digits)")


def _types(ctx: Context) -> None:
    for oname, op in ctx.m.ops.items():
        for i, t in enumerate(op.params):
            _one_type(ctx, ("ops", oname, "params", i), t, f"op `{oname}` param {i}")
        for li, launch in enumerate(op.impl.launches):
            for i, t in enumerate(launch.params or []):
                _one_type(ctx, ("ops", oname, "impl", "launches", li, "params", i), t,
                          f"op `{oname}` launch {li} param {i}")


def _one_type(ctx: Context, path: Path, text: str, what: str) -> None:
    try:
        parse_param_type(text)
    except ParamTypeError as e:
        ctx.r.add("E0020", path, f"{what}: {e}",
                  "types: `in|out|inout buffer<dtype>`, `in|out|inout ptr`, or a scalar "
                  "(i8 u8 i16 u16 i32 u32 i64 u64 f32 f64)")

