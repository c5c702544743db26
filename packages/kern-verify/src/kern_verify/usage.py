"""Every declaration is used (DESIGN §3 group 9): vars (E0070), states (E0071),
buffers (E0072), modules (E0073), ops (E0074); and every program has a call (E0075).
Runs after the other rules, which record what they use in the `Context`."""

from __future__ import annotations

import difflib

from .context import Context
from .diagnostic import Fold, Note

_KINDS = (
    ("vars", "used_vars", "E0070", "var", "no shape, grid, argument or state refers to it"),
    ("states", "used_states", "E0071", "state", "no call passes it"),
    ("buffers", "used_buffers", "E0072", "buffer", "no call passes it"),
    ("modules", "used_modules", "E0073", "module", "no launch names it"),
    ("ops", "used_ops", "E0074", "op", "no call names it"),
)


def check_programs(ctx: Context) -> bool:
    """E0075 for each program with no calls, or once for a manifest with no program. Returns True when no program
    has a call: every declaration a call would use is then unused, one cause that `check_usage` folds."""
    programs = ctx.m.programs
    if not programs:
        ctx.r.add("E0075", ("programs",), "the manifest declares no program: nothing would ever run",
                  "add the programs the runtime runs (e.g. `prefill` and `decode`), each a list of calls")
        return True
    for name, prog in programs.items():
        if not prog.calls:
            ctx.r.add("E0075", ("programs", name, "calls"), f"program `{name}` has no calls: running it would do "
                      "nothing", f"add its calls, or remove `{name}` from `programs`")
    return not any(prog.calls for prog in programs.values())


def check_usage(ctx: Context) -> None:
    """Report each unused var, state, buffer, module and op, and each program with no calls (E0075). When an
    undeclared name referred to elsewhere is close to an unused declaration (`rms_nrom` for op `rms_norm`), the
    diagnostic says so: the reference is the likely mistake, and fixing it uses the declaration. When no program has
    a call, the unused declarations of each kind are folded into one diagnostic that names that cause."""
    no_calls = check_programs(ctx)
    for section, attr, code, what, why in _KINDS:
        used = getattr(ctx, attr)
        declared = getattr(ctx.m, section)
        unknown = ctx.unknown.get(section, {})
        for name in declared:
            if name in used:
                continue
            notes = []
            hint = f"remove it from `{section}`"
            for ref, sites in unknown.items():
                if difflib.get_close_matches(ref, [k for k in declared if isinstance(k, str)], n=1) == [name]:
                    more = f" and {len(sites) - 1} more" if len(sites) > 1 else ""
                    verb = "name" if more else "names"
                    notes.append(Note(f"{sites[0]}{more} {verb} the undeclared {what} `{ref}` (reported above)"))
                    hint = (f"if `{ref}` means `{name}`, use one name for both (fix the reference or rename the "
                            f"declaration); otherwise remove `{name}` from `{section}`")
            fold = None
            if no_calls:
                notes.append(Note("no program has a call (E0075): every declaration a call would use is unused"))
                fold = Fold(("no calls", section), f"unused {what}s", f"`{name}`")
            ctx.r.add(code, (section, name), f"{what} `{name}` is unused: {why}", hint, notes=tuple(notes), fold=fold)
