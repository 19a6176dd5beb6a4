"""The walks of a workflow's dependency graph, on block ids: order and cycles.

Each is iterative and linear in blocks + references, so a graph's depth costs neither the
interpreter's recursion limit nor quadratic time (a chain of 1000 blocks once took 4 s
and ended in RecursionError); its size is capped before it gets here (limits.max_blocks).
"""

from __future__ import annotations

from collections.abc import Mapping


def levels(deps: Mapping[str, set[str]]) -> tuple[list[str], dict[str, set[str]]]:
    """Kahn's topological sort by levels: a block's level is one more than the highest of
    the blocks it reads, and blocks run level by level, in `deps`' order within one.

    `deps` maps each block to the blocks it reads (all keys of `deps`). Returns the order
    and the blocks left over (on or behind a cycle), each with its unplaced dependencies.
    """
    waiting = {block: len(reads) for block, reads in deps.items()}  # reads not yet placed
    readers: dict[str, list[str]] = {block: [] for block in deps}
    for block, reads in deps.items():
        for read in reads:
            readers[read].append(block)
    level = dict.fromkeys(deps, 0)
    placed = [block for block, count in waiting.items() if count == 0]
    for block in placed:  # grows while it is walked: a queue
        for reader in readers[block]:
            level[reader] = max(level[reader], level[block] + 1)
            waiting[reader] -= 1
            if waiting[reader] == 0:
                placed.append(reader)
    done = set(placed)
    by_level: list[list[str]] = [[] for _ in range(max(level.values(), default=0) + 1)]
    for block in deps:  # in `deps`' order
        if block in done:
            by_level[level[block]].append(block)
    left = {block: reads - done for block, reads in deps.items() if block not in done}
    return [block for blocks in by_level for block in blocks], left


def cycles(left: Mapping[str, set[str]]) -> list[list[str]]:
    """One representative path per cycle among the blocks `levels` left over: from each
    block not yet seen, follow its least unplaced dependency until a block comes round
    again. Each block is walked once (positions in a dict, not a search of the path)."""
    seen: set[str] = set()
    found = []
    for start in left:
        if start in seen:
            continue
        path: dict[str, int] = {}  # block -> its position on this walk
        block = start
        while block not in path and block not in seen:
            path[block] = len(path)
            block = min(left[block])
        if block in path:
            found.append(list(path)[path[block] :])
        seen.update(path)
    return found
