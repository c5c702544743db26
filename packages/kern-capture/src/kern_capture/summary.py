"""Per-kernel summary of a capture (``kern-capture summary DIR``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kern_capture.checks import CaptureChecks, LaunchChecker
from kern_capture.records import LAUNCHES_FILE, Capture, LaunchRecord, launches_path

__all__ = ["KernelSummary", "CaptureSummary", "summarize", "format_summary"]


# What kern-capture 0.1.0 before extra_hex's advice wrote for extra-buffer launches; shown with the
# current wording (the record itself is left as written).
_OLD_EXTRA_SUFFIX = "; per-parameter capture not possible"


def _reason(launch: LaunchRecord) -> str:
    r = launch.params_reason or ""
    if r.endswith(_OLD_EXTRA_SUFFIX) and "extra buffer" in r:
        r = r[: -len(_OLD_EXTRA_SUFFIX)] + (
            "; raw bytes in extra_hex: LaunchRecord.params_from_extra(layout) cuts them"
            if launch.extra_hex is not None
            else "; extra_hex absent (buffer over 4 KiB, or dropped by kern-mine trim)"
        )
    return r


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "es" if word.endswith("h") else "s")


@dataclass
class KernelSummary:
    """What the capture saw of one kernel (symbol + module)."""

    symbol: str
    module_id: int | None
    first_seq: int
    count: int = 0
    flat_count: int = 0
    grids: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    blocks: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    apis: Counter[str] = field(default_factory=Counter)
    param_counts: Counter[int] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def abi(self) -> str:
        """``flat`` when every launch had all its parameters captured,
        ``not flat`` when none did, ``partial`` otherwise."""
        if self.flat_count == self.count:
            return "flat"
        if self.flat_count == 0:
            return "not flat"
        return "partial"

    def add(self, launch: LaunchRecord) -> None:
        self.count += 1
        self.grids[launch.grid] += 1
        self.blocks[launch.block] += 1
        self.apis[launch.api] += 1
        if launch.params is not None:
            self.flat_count += 1
            self.param_counts[len(launch.params)] += 1
        elif launch.params_reason:
            self.reasons[_reason(launch)] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol,
            "module_id": self.module_id,
            "count": self.count,
            "abi": self.abi,
            "flat_count": self.flat_count,
            "grids": [{"grid": list(g), "count": n} for g, n in self.grids.most_common()],
            "blocks": [{"block": list(b), "count": n} for b, n in self.blocks.most_common()],
            "apis": dict(self.apis),
            "param_counts": {str(k): v for k, v in self.param_counts.items()},
            "reasons": dict(self.reasons),
        }


@dataclass
class CaptureSummary:
    dir: str
    pid: int | None
    launches: int
    modules: int
    module_kinds: Counter[str]
    kernels: list[KernelSummary]
    unresolved_modules: int
    error: dict[str, Any] | None
    subcaptures: list[CaptureSummary] = field(default_factory=list)
    checks: CaptureChecks = field(default_factory=CaptureChecks)

    def warnings(self) -> list[str]:
        """The warnings of this capture's launches file (``kern_capture.checks``), then of each
        ``pid<N>/`` sub-capture's."""
        return self.checks.warnings("summarising") + [w for s in self.subcaptures for w in s.warnings()]

    @property
    def failed(self) -> bool:
        """True when this capture or any ``pid<N>/`` sub-capture has an ``error.json``."""
        return self.error is not None or any(s.failed for s in self.subcaptures)

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": self.dir,
            "pid": self.pid,
            "launches": self.launches,
            "modules": self.modules,
            "module_kinds": dict(self.module_kinds),
            "unresolved_modules": self.unresolved_modules,
            "error": self.error,
            "kernels": [k.to_json() for k in self.kernels],
            "checks": msgspec.to_builtins(self.checks),
            "subcaptures": [s.to_json() for s in self.subcaptures],
        }


def summarize(cap: Capture) -> CaptureSummary:
    """Aggregate a capture per (symbol, module id), in order of first launch."""
    kernels: dict[tuple[str, int | None], KernelSummary] = {}
    n = 0
    unresolved = 0
    try:
        source = launches_path(cap.dir)
    except FileNotFoundError:  # a failed capture without a launch file: no launches
        source = cap.dir / LAUNCHES_FILE
    checker = LaunchChecker(source)
    for launch in cap.launches(checker=checker):
        n += 1
        if launch.module_id is None:
            unresolved += 1
        key = (launch.symbol, launch.module_id)
        k = kernels.get(key)
        if k is None:
            k = kernels[key] = KernelSummary(launch.symbol, launch.module_id, launch.seq)
        k.add(launch)
    pid = cap.info.get("pid") if isinstance(cap.info, dict) else None
    return CaptureSummary(
        dir=str(cap.dir),
        pid=pid,
        launches=n,
        modules=len(cap.modules),
        module_kinds=Counter(m.kind for m in cap.modules.values()),
        kernels=sorted(kernels.values(), key=lambda k: k.first_seq),
        unresolved_modules=unresolved,
        error=cap.error,
        subcaptures=[summarize(s) for s in cap.subcaptures()],
        checks=checker.result(),
    )


def _fmt3(t: tuple[int, int, int]) -> str:
    return f"[{t[0]},{t[1]},{t[2]}]"


def format_summary(s: CaptureSummary, max_grids: int = 6) -> str:
    """Human-readable summary: one block per kernel."""
    lines: list[str] = []
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(s.module_kinds.items()))
    flat = sum(k.flat_count for k in s.kernels)
    lines.append(f"capture {s.dir}" + (f" (pid {s.pid})" if s.pid is not None else ""))
    if s.error:
        lines.append(f"  ERROR: {s.error.get('message', s.error)}")
    lines.append(
        f"  {_n(s.launches, 'launch')} of {_n(len(s.kernels), 'kernel')}, {_n(s.modules, 'module')}"
        + (f" ({kinds})" if kinds else "")
        + f"; {_n(flat, 'launch')} with all parameters, {s.launches - flat} without"
    )
    if s.unresolved_modules:
        lines.append(f"  {_n(s.unresolved_modules, 'launch')} with no module id")
    for w in s.checks.warnings("summarising"):
        lines.append(f"  warning: {w}")
    if s.kernels:
        lines.append("")
        lines.append(f"  {'count':>7}  {'abi':<8}  {'module':>6}  {'params':>6}  kernel")
    for k in s.kernels:
        params = ",".join(str(p) for p in sorted(k.param_counts)) or "-"
        mod = "?" if k.module_id is None else str(k.module_id)
        lines.append(f"  {k.count:>7}  {k.abi:<8}  {mod:>6}  {params:>6}  {k.symbol}")
        grids = " ".join(f"{_fmt3(g)}x{n}" for g, n in k.grids.most_common(max_grids))
        more = len(k.grids) - max_grids
        if more > 0:
            grids += f" (+{more} more)"
        blocks = " ".join(_fmt3(b) for b in k.blocks)
        apis = ",".join(k.apis)
        lines.append(f"  {'':>7}  grids {grids}; block {blocks}; {apis}")
        for reason in k.reasons:
            lines.append(f"  {'':>7}  params null: {reason}")
    for sub in s.subcaptures:
        lines.append("")
        lines.append(format_summary(sub, max_grids))
    return "\n".join(lines)
