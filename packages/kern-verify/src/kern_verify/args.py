"""Checks shared by launch and call arguments: does a var, expression or literal fit a
scalar parameter over its whole value range (E0053, E0054, E0021)?"""

from __future__ import annotations

from kern_schema import SCALARS, Arg, ParamType, Path

from .context import Context, arg_kind, site_of, suggest
from .diagnostic import Fold


def _fmt(v: int | float) -> str:
    return str(v)


def check_scalar_arg(ctx: Context, arg: Arg, path: Path, pt: ParamType, what: str) -> None:
    """`arg` (a var, expr or literal) passed to the scalar param `pt`.

    `what` names the position for messages (`call \\`l0.norm\\` arg 3`). Reports E0054 for an
    unknown var, E0021 for a bad expression, E0053 when the value range does not fit.
    """
    st = pt.scalar
    assert st is not None
    kind = arg_kind(arg)
    rng_desc: str
    if kind == "var":
        name = arg.var
        rng = ctx.ranges.get(name)  # type: ignore[arg-type]
        if rng is None:
            ctx.refer_unknown("vars", name, site_of(what))  # type: ignore[arg-type]
            ctx.r.add("E0054", path + ("var",), f"{what}: `{name}` is not a declared var",
                      suggest(name, ctx.ranges, "declare it in `vars`"),  # type: ignore[arg-type]
                      fold=Fold(("var", name), f"uses of the undeclared var `{name}`", site_of(what)))
            return
        ctx.used_vars.add(name)  # type: ignore[arg-type]
        if name in ctx.bad_vars:
            return  # E0011: its bounds are refused
        rng_desc = f"var `{name}` ranges over [{rng[0]}, {rng[1]}]"
    elif kind == "expr":
        b = ctx.expr_bounds(arg.expr, path + ("expr",), site_of(what))  # type: ignore[arg-type]
        if b is None:
            return
        rng = b
        rng_desc = f"the expression ranges over [{_fmt(rng[0])}, {_fmt(rng[1])}] at the var bounds"
    else:
        lit_t = SCALARS[kind]
        v = arg.literal
        assert v is not None
        if not lit_t.contains(v, v):
            ctx.r.add("E0053", path + (kind,), f"{what}: literal {v} does not fit its own type {kind} [{_fmt(lit_t.lo)}, {_fmt(lit_t.hi)}]",
                      "use a wider literal type or a smaller value")
            return
        if lit_t.is_float != st.is_float:
            ctx.r.add("E0053", path + (kind,), f"{what}: {'float' if lit_t.is_float else 'integer'} literal `{kind}` passed to a `{st.name}` param",
                      f'write the literal with the param\'s type: {{"{st.name}": ...}}')
            return
        if not st.contains(v, v):
            ctx.r.add("E0053", path + (kind,), f"{what}: literal {v} does not fit the param type {st.name} [{_fmt(st.lo)}, {_fmt(st.hi)}]",
                      "change the value or the param's type")
        return
    vpath = path + (kind,)
    if st.is_float:
        ctx.r.add("E0053", vpath, f"{what}: {rng_desc}, an integer, but the param is `{st.name}`",
                  "vars and expressions are integers: make the param an integer type")
        return
    if not st.contains(*rng):
        # one var too wide for one type is one cause, however many sites pass it
        fold = Fold(("range", arg.var, st.name), f"sites pass var `{arg.var}` to {st.name} params",
                    site_of(what)) if kind == "var" else None
        ctx.r.add("E0053", vpath, f"{what}: {rng_desc}, which does not fit {st.name} [{_fmt(st.lo)}, {_fmt(st.hi)}]",
                  "widen the param type (e.g. i32/i64), or narrow the var bounds", fold=fold)
