"""CUDA graphs of programs.

A program captured for one set of var values (`Runtime.capture`) becomes one
executable graph replayed with a single `cuGraphLaunch`. Grids and scalar
arguments are frozen in the graph at capture time, so a replay with other var
values is refused. Pointers are frozen too, which is why everything the
graph touches lives in the runtime's arena (inputs are written by
`write_input` outside the graph, into the same device buffers, before each
replay; a captured host-to-device copy would replay from whatever the pinned
host buffer holds at replay time, so staging copies are never captured).
"""

from __future__ import annotations

from typing import Any

from .cuda import check, drv
from .errors import KernDriverError


def programmatic_edges(graph: Any) -> int:
    """Number of programmatic dependency edges of a CUDA graph (-1 when the query fails)."""
    try:
        n = int(check(drv.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")[3])
        if n == 0:
            return 0
        _, _, data, got = check(drv.cuGraphGetEdges(graph, n), "cuGraphGetEdges")
        prog = drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        return sum(1 for e in list(data)[: int(got)] if e is not None and e.type == prog)
    except Exception:  # pragma: no cover - informational only
        return -1


class Graph:
    """A captured program. `replay(**vars)` launches it; the attributes `program`,
    `vars` (the captured values), `launches` (kernel launches + built-ins captured) and
    `nodes` (nodes in the CUDA graph: cuBLASLt may add more than one per GEMM) and
    `programmatic_edges` (edges of type CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC: stream
    capture turns each `pdl` launch that follows a kernel into one; -1 when the query
    failed) describe it."""

    def __init__(self, runtime: Any, program: str, vars: dict[str, int], graph: Any, exec_: Any, launches: int):
        self._rt = runtime
        self.program = program
        self.vars = dict(vars)
        self._graph = graph
        self._exec = exec_
        self.launches = launches
        try:
            self.nodes = int(check(drv.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])
        except Exception:  # pragma: no cover - informational only
            self.nodes = -1
        self.programmatic_edges = programmatic_edges(graph)

    def replay(self, **vars: int) -> None:
        """Enqueue one replay on the runtime's stream (asynchronous). `vars` may restate the
        captured values; a var the program's launches do not use (given at capture for
        `read_output`'s shapes) may take another value, which the replay records for those
        shapes, as `run(graph=True)` does.

        Raises:
            KernDriverError: `vars` names a var the graph was not captured with or gives a var
                the launches use a value other than the captured one, the graph was destroyed,
                or cuGraphLaunch failed.
        """
        if self._exec is None:
            raise KernDriverError(f"graph of program `{self.program}` {self.vars} was destroyed (runtime closed or cache evicted)",
                                  hint="capture it again with rt.capture(...) or use rt.run(program, graph=True, ...)")
        used = self._rt._programs[self.program].required if vars else set()
        for k, v in vars.items():
            if k not in self.vars:
                raise KernDriverError(
                    f"graph of program `{self.program}` has no var `{k}` (it was captured with {self.vars})",
                    hint="pass only the vars the graph was captured with, or none: a replay uses the captured values")
            if self.vars[k] != v and k in used:
                raise KernDriverError(
                    f"graph of program `{self.program}` was captured with {self.vars}; replay with {k}={v} is refused",
                    hint="grids and scalar arguments are frozen in a graph: capture one per set of var values "
                    "(rt.run(program, graph=True, **vars) keeps a cache)",
                )
        self._rt._replay(self, {**self.vars, **vars})

    def destroy(self) -> None:
        """Free the executable graph and the graph (idempotent)."""
        if self._exec is not None:
            drv.cuGraphExecDestroy(self._exec)
            drv.cuGraphDestroy(self._graph)
            self._exec = None

    def __repr__(self) -> str:
        return (f"Graph({self.program!r}, {self.vars}, launches={self.launches}, nodes={self.nodes}, "
                f"programmatic_edges={self.programmatic_edges})")
