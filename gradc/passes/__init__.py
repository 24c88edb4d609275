"""Graph -> Graph passes, run in order by :func:`run`.

Each pass is a pure function named with a verb; its docstring states the
invariant it establishes.  ``run(..., check=True)`` verifies the graph after
every pass (tests and ``--debug``).
"""
from __future__ import annotations

from typing import Callable, Sequence

from gradc.ir.graph import Graph
from gradc.ir.verify import verify
from gradc.passes.cse import eliminate_common_subexpressions
from gradc.passes.dce import eliminate_dead_code
from gradc.passes.simplify import expand_decompositions, simplify, stabilize

Pass = Callable[[Graph], Graph]


def dissolve_regions(graph: Graph) -> Graph:
    """No custom region is left: once a graph is differentiated, a custom rule's
    forward body is plain nodes like any other (its backward was copied in where
    it was used), which later passes may rewrite, merge and fuse."""
    out = graph.copy()
    out.regions = []
    return out


PIPELINE: tuple[Pass, ...] = (dissolve_regions, eliminate_dead_code, simplify, eliminate_common_subexpressions,
                              simplify, eliminate_dead_code)


def run(graph: Graph, passes: Sequence[Pass] = PIPELINE, *, check: bool = False) -> Graph:
    for p in passes:
        graph = p(graph)
        if check:
            verify(graph, after=p.__name__)
    return graph
