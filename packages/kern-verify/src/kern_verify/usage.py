"""Every declaration is used (DESIGN §3 group 9): vars (E0070), states (E0071),
buffers (E0072), modules (E0073), ops (E0074). Runs after the other rules, which
record what they use in the `Context`."""

from __future__ import annotations

from .context import Context

_KINDS = (
    ("vars", "used_vars", "E0070", "var", "no shape, grid, argument or state refers to it"),
    ("states", "used_states", "E0071", "state", "no call passes it"),
    ("buffers", "used_buffers", "E0072", "buffer", "no call passes it"),
    ("modules", "used_modules", "E0073", "module", "no launch names it"),
    ("ops", "used_ops", "E0074", "op", "no call names it"),
)


def check_usage(ctx: Context) -> None:
    """Report each unused var, state, buffer, module and op."""
    for section, attr, code, what, why in _KINDS:
        used = getattr(ctx, attr)
        for name in getattr(ctx.m, section):
            if name not in used:
                ctx.r.add(code, (section, name), f"{what} `{name}` is unused: {why}", f"remove it from `{section}`")
