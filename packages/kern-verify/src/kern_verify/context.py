"""State shared by the rule modules while one manifest is verified.

`Context` holds the manifest, the report, the var ranges, the parsed
parameter types of every op interface and launch (None where malformed:
those are reported once, by `decls`, and dependent checks are skipped so one
mistake gives one diagnostic), and what has been used (for group 9).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kern_schema import DTYPES, Arg, Expr, ExprError, Manifest, ParamType, ParamTypeError, Path, bounds, format_path, parse_param_type, variables
from kern_schema.expr import ExprNode
from kern_schema.dtypes import INT64_MAX

from .diagnostic import Fold, Report


_FAST_KINDS = ("buf", "var", "i32", "state", "param", "i64", "expr", "scratch", "f32")


def arg_kind(arg: Arg) -> str:
    """`arg.kind`, checking the common forms first (the verifier's hot path)."""
    for k in _FAST_KINDS:
        if getattr(arg, k) is not None:
            return k
    return arg.kind


def parse_type(text: object) -> ParamType | None:
    """`parse_param_type`, None instead of an exception."""
    try:
        return parse_param_type(text)  # type: ignore[arg-type]
    except (ParamTypeError, TypeError):
        return None


@dataclass
class Context:
    """Everything the rules share. Build with `Context.of(manifest)`."""

    m: Manifest
    r: Report = field(default_factory=Report)
    #: var name -> (min, max), as declared (inconsistent bounds are reported by decls).
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: op name -> parsed interface params (None where malformed).
    iface: dict[str, list[ParamType | None]] = field(default_factory=dict)
    used_vars: set[str] = field(default_factory=set)
    used_states: set[str] = field(default_factory=set)
    used_buffers: set[str] = field(default_factory=set)
    used_modules: set[str] = field(default_factory=set)
    used_ops: set[str] = field(default_factory=set)
    #: vars whose bounds are refused (E0011): checks at their bounds (sizes, scalar ranges,
    #: grids) would only repeat that error, so they are skipped.
    bad_vars: set[str] = field(default_factory=set)
    #: buffer name -> bytes at the var maxima (None when unresolvable), filled lazily.
    buffer_bytes: dict[str, int | None] = field(default_factory=dict)
    #: section ("vars", "ops", ...) -> undeclared name -> the sites that refer to it, so
    #: that an unused declaration can say which misspelled reference may have meant it.
    unknown: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    #: ops whose impl writes an interface param declared `in` (E0037): the interface's
    #: directions are wrong or the launch's are, so a call's accesses are unknown.
    unsound_ops: set[str] = field(default_factory=set)
    #: modules whose `source` is refused (E0017: absolute, `..`, empty, malformed hf:): the
    #: cubin checks do not read them (a path outside the kernels directory is never opened).
    bad_sources: set[str] = field(default_factory=set)
    #: program -> index of its first call whose accesses are unknown (unknown op, wrong
    #: arity, malformed param type, an op in `unsound_ops`): dataflow conclusions after it are withheld.
    incomplete_from: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, m: Manifest) -> "Context":
        ctx = cls(m)
        ctx.ranges = {name: (v.min, v.max) for name, v in m.vars.items()}
        ctx.iface = {name: [parse_type(t) for t in op.params] for name, op in m.ops.items()}
        return ctx

    # --- expressions ---------------------------------------------------------------

    def refer_unknown(self, section: str, name: str, site: str) -> None:
        """Record that `site` names `name`, which `section` does not declare."""
        self.unknown.setdefault(section, {}).setdefault(name, []).append(site)

    def expr_bounds(self, e: Expr, path: Path, site: str | None = None) -> tuple[int, int] | None:
        """[lo, hi] of `e` over the var ranges, marking its vars used; reports E0021 and
        returns None when the expression is malformed (unknown var, divisor ≤ 0) or uses a
        var whose bounds are refused (E0011, reported once, by decls). The
        diagnostic keeps `path` and points at the offending token inside the expression;
        uses of one unknown var are folded (`site` names this use in the fold note)."""
        try:
            self._mark_expr_vars(e)
            if self.bad_vars and any(v in self.bad_vars for v in variables(e)):
                return None  # E0011 reported: its bounds mean nothing
            return bounds(e, self.ranges)
        except ExprError as err:
            sub, bad = _bad_token(e, self.ranges)
            span = path + sub
            if isinstance(bad, str):
                self.refer_unknown("vars", bad, site or format_path(path))
                self.r.add("E0021", path, f"bad expression: {err}", suggest(bad, self.ranges, _EXPR_HINT), span=span,
                           fold=Fold(("var", bad), f"expressions use `{bad}`", site or format_path(path)))
            else:
                self.r.add("E0021", path, f"bad expression: {err}", _EXPR_HINT, span=span)
        except RecursionError:
            self.r.add("E0021", path, "expression nested too deeply", _EXPR_HINT)
        return None

    def _mark_expr_vars(self, e: Expr) -> None:
        depth = 0
        while not isinstance(e, (int, str)):
            node = e.ceil_div if e.ceil_div is not None else e.mul
            if node is None:
                return
            e = node[0]
            depth += 1
            if depth > 10_000:
                raise RecursionError
        if isinstance(e, str):
            self.used_vars.add(e)

    # --- sizes ---------------------------------------------------------------------

    def buffer_nbytes(self, name: str) -> int | None:
        """Bytes of declared buffer `name` at the var maxima (memoized)."""
        try:
            return self.buffer_bytes[name]
        except KeyError:
            b = self.m.buffers[name]
            n = self.buffer_bytes[name] = self.nbytes_at_max(b.dtype, b.shape)
            return n

    def nbytes_at_max(self, dtype: str, shape: list[int | str]) -> int | None:
        """Bytes of a tensor at the var maxima, or None when a dim or the dtype does not
        resolve (reported elsewhere)."""
        size = DTYPES.get(dtype)
        if size is None:
            return None
        n = size
        for d in shape:
            if isinstance(d, str):
                r = self.ranges.get(d)
                if r is None:
                    return None
                d = r[1]
            if not isinstance(d, int) or d < 1:
                return None
            n *= d
        return n


def _bad_token(e: Expr, ranges) -> tuple[Path, object]:
    """Where inside `e` evaluation fails, in the order `bounds` checks: the sub-path and
    the unknown var name (str), or the bad divisor (int)."""
    sub: Path = ()
    for _ in range(10_000):
        if isinstance(e, str):
            return sub, e
        if not isinstance(e, ExprNode):
            break
        key = "ceil_div" if e.ceil_div is not None else "mul"
        inner, c = getattr(e, key)
        if key == "ceil_div" and c <= 0:
            return sub + (key, 1), c
        e, sub = inner, sub + (key, 0)
    return sub, None


_EXPR_HINT = (
    "an expression is an integer, a declared var name, {\"ceil_div\": [E, int]} with a positive "
    "divisor, or {\"mul\": [E, int]}"
)

INT64 = INT64_MAX


def site_of(what: str) -> str:
    """A short name of a use for fold notes: "call `l0.norm` arg 3" -> "`l0.norm` arg 3"."""
    return what[5:] if what.startswith("call ") else what


def suggest(name: str, known, fallback: str) -> str:
    """A hint: the closest known name (`did you mean ...?`), else `fallback`."""
    import difflib

    close = difflib.get_close_matches(name, [k for k in known if isinstance(k, str)], n=1)
    return f"did you mean `{close[0]}`?" if close else fallback
