"""Paths that lead from inside a file root to a real file outside it, planted on disk, for
the file-access policy's tests (tests/server/test_file_access.py).

Each `Escape` is one way out: `..` segments, symlinks (to the file, to its folder, to
another symlink), or a symlink followed by `..`, which a path normalised as text keeps
inside the root while the kernel, taking `..` after the link, lands outside. `plant`
makes the folders, hard links and symlinks, and checks that the kernel really resolves
each path to the planted file: a test that fed the policy paths to nothing would pass
whatever the policy did.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

ROUTES = ("dotdot", "overshoot", "link_file", "link_dir", "chain", "link_dotdot")
_FRESH = itertools.count()  # a fresh folder per planted example


@dataclass(frozen=True)
class Escape:
    """A path from inside the root to a real file outside it.

    route: `dotdot` climbs out with `..` to the outside folder; `overshoot` climbs past
    `/` and descends the file's absolute path; `link_file` is a symlink in the root to
    the file; `link_dir` one to its folder, the path going on through it; `chain` a
    symlink to a symlink (inside the root) to the file; `link_dotdot` a symlink to a
    folder below the file's, then `..`: as text the path stays in the root
    (`root/start/link/../file` -> `root/start/file`), the kernel lands outside.
    depth: the real folders inside the root the path starts in; extra: surplus `..`
    (`overshoot`); absolute: the path names the root absolutely (else relative to it);
    relative_link: links hold relative targets (else absolute); dots: `.` segments
    between the others; name: the planted files' name stem.
    """

    route: str
    depth: int
    extra: int
    absolute: bool
    relative_link: bool
    dots: bool
    name: str


ESCAPES = st.builds(
    Escape,
    route=st.sampled_from(ROUTES),
    depth=st.integers(0, 3),
    extra=st.integers(0, 3),
    absolute=st.booleans(),
    relative_link=st.booleans(),
    dots=st.booleans(),
    name=st.text(alphabet="abz09-_", min_size=1, max_size=8),
)


def plant(root: Path, outside: Path, plan: Escape, files: Mapping[str, str]) -> dict[str, str]:
    """For each key of `files`, a path by `plan` from `root` (the config's folder, where
    relative paths start) to a hard link of `outside / files[key]`, planted in a fresh
    folder under `outside` (a sibling of `root`); key -> the path."""
    n = next(_FRESH)
    away = outside / f"g{n}"
    (away / "deep").mkdir(parents=True)
    start = root / f"g{n}"
    for i in range(plan.depth):
        start /= f"d{i}"
    start.mkdir(parents=True)
    paths = {}
    for key, content in files.items():
        file = away / f"{plan.name}-{content}"
        if not file.exists():
            os.link(outside / content, file)
        parts = [*start.relative_to(root).parts, *_tail(root, start, file, plan)]
        joined = ("/./" if plan.dots else "/").join(parts)
        paths[key] = f"{root}/{joined}" if plan.absolute else joined
        # The plan works: the kernel takes the path to the planted file.
        assert os.path.samefile(root / paths[key], file), (plan, paths[key])
    return paths


def _tail(root: Path, start: Path, file: Path, plan: Escape) -> list[str]:
    """The segments from `start` to `file` (links made as needed)."""
    climb = [".."] * (len(start.relative_to(root).parts) + 1)  # start -> root's parent
    if plan.route == "dotdot":
        return [*climb, file.parent.parent.name, file.parent.name, file.name]
    if plan.route == "overshoot":
        return [*climb, *[".."] * (len(root.parts) + plan.extra), *file.parts[1:]]
    if plan.route in ("link_file", "chain"):
        link = start / f"to-{file.name}"
        target = file
        if plan.route == "chain":
            target = root / start.relative_to(root).parts[0] / f"hop-{file.name}"
            _link(target, file, plan.relative_link)
        _link(link, target, plan.relative_link)
        return [link.name]
    if plan.route == "link_dir":
        _link(start / "out", file.parent, plan.relative_link)
        return ["out", file.name]
    _link(start / "deep", file.parent / "deep", plan.relative_link)  # link_dotdot
    return ["deep", "..", file.name]


def _link(link: Path, target: Path, relative: bool) -> None:
    if not link.is_symlink():  # made for an earlier key of the same plan
        link.symlink_to(os.path.relpath(target, link.parent) if relative else target)
