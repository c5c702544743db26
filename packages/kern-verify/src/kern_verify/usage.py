"""Every declaration is used (DESIGN §3 group 9): vars (E0070), states (E0071),
buffers (E0072), modules (E0073), ops (E0074). Runs after the other rules, which
record what they use in the `Context`."""

from __future__ import annotations

import difflib

from .context import Context
from .diagnostic import Note

_KINDS = (
    ("vars", "used_vars", "E0070", "var", "no shape, grid, argument or state refers to it"),
    ("states", "used_states", "E0071", "state", "no call passes it"),
    ("buffers", "used_buffers", "E0072", "buffer", "no call passes it"),
    ("modules", "used_modules", "E0073", "module", "no launch names it"),
    ("ops", "used_ops", "E0074", "op", "no call names it"),
)


def check_usage(ctx: Context) -> None:
    """Report each unused var, state, buffer, module and op. When an undeclared name
    referred to elsewhere is close to it (`rms_nrom` for op `rms_norm`), the diagnostic
    says so: the reference is the likely mistake, and fixing it uses the declaration."""
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
            ctx.r.add(code, (section, name), f"{what} `{name}` is unused: {why}", hint, notes=tuple(notes))
