"""What reading a launches file noticed: failed launches, a cut-short last line, and records that
do not look like one process's capture as the library wrote it (edited or spliced files).

Shared by ``kern-capture summary`` and ``kern-mine`` (and ``kern-mine trim``), so both say the
same thing about the same file. Impossible values (a negative grid, block or shared memory size)
are not warnings: ``LaunchRecord`` refuses them when the line is decoded (a
``CaptureFormatError`` naming the file and line). What is only suspicious is counted here, and
the first few records are named (file:line):

- ``failed_launches``: a non-zero ``result`` (the launch's ``CUresult``): the kernel did not run;
  its grid and arguments are what the program asked for, not what ran.
- ``seq_not_increasing``: ``seq`` not above the previous record's. The library numbers records in
  file order; ``kern-mine trim`` drops whole windows, so gaps are normal, a step back or a repeat
  is not (records reordered, duplicated or spliced from another capture).
- ``second_pid``: a record of another process than the first record's. The library writes each
  process into its own directory (``pid<N>/``), so one file holds one process.
- ``time_backwards``: ``t_ns`` earlier than the previous launch **of the same thread**. ``t_ns``
  is taken at the launch call's entry and the record written at its exit, so across threads the
  times may legitimately go back a little; within one thread calls are sequential.

>>> checker = LaunchChecker("dump/launches.jsonl")        # doctest: +SKIP
>>> for line, rec in enumerate(records, 1): checker.add(rec, line)   # doctest: +SKIP
>>> for w in checker.result().warnings(): print(w)        # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from kern_capture.records import LaunchRecord

__all__ = ["SHOWN", "Example", "Finding", "CaptureChecks", "LaunchChecker", "check_launches"]

SHOWN = 3
"""How many records each finding names (each is counted whatever its number)."""


class Example(msgspec.Struct):
    """One record behind a finding: ``launch`` its 0-based index among the file's records (the launch
    index of ``kern-mine``'s ranges), ``line`` its 1-based line in the file."""

    launch: int
    line: int
    symbol: str
    detail: str


class Finding(msgspec.Struct):
    """How many records showed it, and the first ``SHOWN`` of them."""

    count: int = 0
    first: list[Example] = msgspec.field(default_factory=list)


class CaptureChecks(msgspec.Struct):
    """What reading one launches file noticed (see the module docstring). ``truncated_line``: the
    1-based number of the last line when it was cut short (no newline, not a record) and dropped."""

    source: str = ""
    launches: int = 0
    truncated_line: int | None = None
    failed_launches: Finding = msgspec.field(default_factory=Finding)
    seq_not_increasing: Finding = msgspec.field(default_factory=Finding)
    second_pid: Finding = msgspec.field(default_factory=Finding)
    time_backwards: Finding = msgspec.field(default_factory=Finding)

    @property
    def clean(self) -> bool:
        """Nothing to warn about."""
        return not self.warnings()

    def truncation_warning(self, verb: str = "reading") -> str | None:
        """One line saying which line was dropped (None when none was); ``verb``: what the caller
        does with the launches (``mining``, ``summarising``)."""
        if self.truncated_line is None:
            return None
        return (f"{self.source}:{self.truncated_line}: last line cut short (the target crashed or was still "
                f"writing?); dropped, {verb} the {self.launches} launches before it")

    def warnings(self, verb: str = "reading", failed_consequence: str = "") -> list[str]:
        """One line per finding (count, then the first few records by file:line), truncation first.
        ``failed_consequence`` ends the failed-launches line (what the caller does about them)."""
        out = []
        if (t := self.truncation_warning(verb)) is not None:
            out.append(t)
        src = self.source

        def named(f: Finding, what: str) -> str:
            shown = ", ".join(f"{src}:{e.line} (launch {e.launch}, {_short(e.symbol)}: {e.detail})" for e in f.first)
            more = f", and {f.count - len(f.first)} more" if f.count > len(f.first) else ""
            return f"{_plural(f.count, 'record')} {what}: {shown}{more}"

        f = self.failed_launches
        if f.count:
            shown = ", ".join(f"launch {e.launch} {_short(e.symbol)} ({e.detail}) at {src}:{e.line}" for e in f.first)
            more = f", and {f.count - len(f.first)} more" if f.count > len(f.first) else ""
            out.append(f"{_plural(f.count, 'failed launch', 'failed launches')} (non-zero CUDA result: the kernel "
                       f"did not run, its grid and arguments are what was asked, not what ran): {shown}{more}"
                       + (f"; {failed_consequence}" if failed_consequence else ""))
        if self.seq_not_increasing.count:
            out.append(named(self.seq_not_increasing, "whose seq does not increase (the library numbers records "
                             "in file order: reordered, duplicated or spliced from another capture?)"))
        if self.second_pid.count:
            out.append(named(self.second_pid, "of another process than the first record's (one file holds one "
                             "process, the others are in pid<N>/: spliced from another capture?)"))
        if self.time_backwards.count:
            out.append(named(self.time_backwards, "whose t_ns is earlier than the previous launch of the same "
                             "thread (edited, reordered or spliced?)"))
        return out


class LaunchChecker:
    """Builds a ``CaptureChecks`` one record at a time (``add``), in file order."""

    def __init__(self, source: str | os.PathLike[str]) -> None:
        self.source = str(source)
        self._n = 0
        self._truncated: int | None = None
        self._failed = Finding()
        self._seq = Finding()
        self._pid = Finding()
        self._time = Finding()
        self._prev_seq: int | None = None
        self._pid0: int | None = None
        self._t_by_thread: dict[tuple[int, int], int] = {}

    @staticmethod
    def _note(f: Finding, index: int, line: int, rec: LaunchRecord, detail: str) -> None:
        f.count += 1
        if len(f.first) < SHOWN:
            f.first.append(Example(index, line, rec.symbol, detail))

    def add(self, rec: LaunchRecord, line: int) -> None:
        """The next record, read from 1-based ``line`` of the file."""
        i = self._n
        self._n += 1
        if rec.result:
            self._note(self._failed, i, line, rec, f"result {rec.result}")
        if self._prev_seq is not None and rec.seq <= self._prev_seq:
            self._note(self._seq, i, line, rec, f"seq {rec.seq} after {self._prev_seq}")
        self._prev_seq = rec.seq
        if self._pid0 is None:
            self._pid0 = rec.pid
        elif rec.pid != self._pid0:
            self._note(self._pid, i, line, rec, f"pid {rec.pid}, the first record's is {self._pid0}")
        thread = (rec.pid, rec.tid)
        prev = self._t_by_thread.get(thread)
        if prev is not None and rec.t_ns < prev:
            self._note(self._time, i, line, rec, f"t_ns {prev - rec.t_ns} ns before tid {rec.tid}'s previous launch")
        self._t_by_thread[thread] = rec.t_ns

    def truncated(self, line: int) -> None:
        """The file's last line, ``line``, was cut short and dropped."""
        self._truncated = line

    def result(self) -> CaptureChecks:
        return CaptureChecks(self.source, self._n, self._truncated, self._failed, self._seq, self._pid, self._time)


def check_launches(launches: list[LaunchRecord], source: str | os.PathLike[str] = "") -> CaptureChecks:
    """The checks of launches already in memory (line = index + 1: no blank or dropped lines)."""
    c = LaunchChecker(source)
    for i, rec in enumerate(launches):
        c.add(rec, i + 1)
    return c.result()


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _short(sym: str, n: int = 48) -> str:
    return sym if len(sym) <= n else sym[: n - 1] + "…"
