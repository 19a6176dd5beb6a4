"""Render the measured figures in README.md and docs/ from bench/results/*.json.

A figure that describes a measurement is written as a link to the field it comes from:

    video p50 [88.5](bench/results/viewer.json#metrics.video_g2g_p50_ms) ms
    a tile costs [2.12](../bench/results/viewer.json#metrics.tile_core_share*100) %

or, to keep a table readable, as a reference link `[88.5][viewer-p50]` with the
definition `[viewer-p50]: bench/results/viewer.json#metrics.video_g2g_p50_ms` anywhere in
the page. The fragment is a dotted path into the JSON (list items by index), optionally
followed by `*K` or `/K` (units: `*100` for a percentage, `/1000` for ms from µs). The
link's text decides the format: as many decimals as it has, thousands separators if it
has them; a range kept as text ("0.97-0.99") is written with the page's decimals, a
boolean as yes/no, null as –, any other string as it is.

    python bench/_figures.py           # rewrite every figure from its results file
    python bench/_figures.py --check   # exit 1 naming each figure that disagrees, has no
                                       # source, or looks measured but is not a link

`make docs` runs the first, `make bench` and the test suite (tests/test_docs_figures.py)
the second. Results of `--quick` runs (bench/results/quick/) are never a source.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "bench/results/"
RANGE = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*[-–]\s*([-+]?\d+(?:\.\d+)?)\s*$")
_N = r"([-+]?\d+(?:\.\d+)?)"
# A median with its interval kept as text ("+0.219 [-0.006, +0.317]"); a link's text cannot
# hold brackets, so the page writes it "+0.219 (-0.006, +0.317)".
BRACKETED = re.compile(rf"^\s*{_N}\s*\[{_N},\s*{_N}\]\s*$")
PARENTHESES = re.compile(rf"^\s*{_N}\s*\({_N},\s*{_N}\)\s*$")
NUMBER = re.compile(r"^([-+−]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")
TARGET = (
    r"(?P<target>[^)\s#]*bench/results/[\w.-]+\.json)#(?P<path>[\w.\-]+?)(?P<scale>[*/][\d.]+)?"
)
INLINE = re.compile(r"\[(?P<text>[^\]\[]*)\]\(" + TARGET + r"\)")
REFDEF = re.compile(r"^\[(?P<label>[^\]]+)\]:\s*" + TARGET + r"\s*$", re.MULTILINE)
REFUSE = re.compile(r"\[(?P<text>[^\]\[]*)\]\[(?P<label>[^\]]+)\]")
# What reads as a measurement when it is not a link: a decimal with a unit of measure, a
# ratio with ×, a range with a unit, or a bare decimal in a table cell. Integers with a
# unit, and seconds, are mostly settings (5 s, a 0.5 s backoff, 30 fps, 320 px) and are
# left to the writer.
UNIT = r"(?:ms|µs|us|fps|%|MB|MiB|GiB|GB|× ?|x\b)"
MEASURED = re.compile(
    r"(?<![\w.×\[])(?:×\s?\d+\.\d+|\d+\.\d+\s?" + UNIT + r"|\d+(?:\.\d+)?\s?[–-]\s?\d+(?:\.\d+)?\s?"
    r"(?:ms|µs|fps|%|×)|\d+\.\d+(?=\s*(?:\||\[|–)))"
)
# A bound, not a measurement: "≤ 0.5 %", "at most 1.48 ×".
BOUND = re.compile(r"(?:[≤≥<>=]|at most|at least|within|under|over|above|below|than|target)\s*$")


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.message}"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def lookup(doc: Any, path: str) -> Any:
    """The value at a dotted path (`metrics.p50_ms`, `rows.3.lost`); a key that itself
    holds dots (`fps.range`) is matched whole, the longest first."""
    value, parts = doc, path.split(".")
    while parts:
        if isinstance(value, list) and parts[0].lstrip("-").isdigit():
            value, parts = value[int(parts[0])], parts[1:]
            continue
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if isinstance(value, dict) and key in value:
                value, parts = value[key], parts[n:]
                break
        else:
            raise KeyError(f"no {parts[0]!r} in {path!r}")
    return value


def shown(text: str, value: Any) -> str:
    """`value` written the way `text` writes its number."""
    if isinstance(value, str) and RANGE.match(value) and RANGE.match(text):
        # a range kept as text ("0.9760-0.9931"), written the page's way ("0.976–0.993")
        ends = [float(v) for v in RANGE.match(value).groups()]  # type: ignore[union-attr]
        return "–".join(shown(t, v) for t, v in zip(RANGE.match(text).groups(), ends, strict=True))  # type: ignore[union-attr]
    if isinstance(value, str) and BRACKETED.match(value) and PARENTHESES.match(text):
        parts = zip(PARENTHESES.match(text).groups(), BRACKETED.match(value).groups(), strict=True)  # type: ignore[union-attr]
        a, b, c = (_signed(t, float(v)) for t, v in parts)
        return f"{a} ({b}, {c})"
    if isinstance(value, bool):  # a verdict's `met`
        return "yes" if value else "no"
    if value is None or not isinstance(value, int | float):
        return "–" if value is None else str(value)
    match = NUMBER.match(text.strip())
    decimals = len(match.group(3) or "") if match else 0
    commas = bool(match and "," in match.group(2))
    body = f"{abs(value):{',' if commas else ''}.{decimals}f}"
    negative = value < 0 and float(body.replace(",", "")) != 0
    sign = (match.group(1) or "-") if negative and match else ("-" if negative else "")
    return sign + body


def _signed(text: str, value: float) -> str:
    """`value` as `text` writes it, with a + when `text` has one."""
    body = shown(text.lstrip("+"), value)
    return "+" + body if text.startswith("+") and value >= 0 else body


class Sources:
    """The results files, each read once; a quick run's file is refused as a source."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._docs: dict[Path, Any] = {}

    def value(self, page: Path, target: str, path: str, scale: str | None) -> Any:
        file = (page.parent / target).resolve()
        if file not in self._docs:
            if not file.is_relative_to(self.root / "bench" / "results") or "quick" in file.parts:
                raise KeyError(f"{target} is not a kept results file (bench/results/NAME.json)")
            try:
                self._docs[file] = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise KeyError(f"{target}: {exc}") from None
            doc = self._docs[file]
            if isinstance(doc, dict) and (doc.get("run") or {}).get("quick"):
                raise KeyError(f"{target} is a --quick run's; rerun the bench in full")
        value = lookup(self._docs[file], path)
        if scale and isinstance(value, int | float) and not isinstance(value, bool):
            factor = float(scale[1:])
            value = value * factor if scale[0] == "*" else value / factor
        return value


def render(page: Path, text: str, sources: Sources) -> tuple[str, list[Problem]]:
    """The page with every figure rendered from its source, and the figures that have none."""
    problems: list[Problem] = []
    name = str(page.relative_to(sources.root))
    refs = {m["label"]: m for m in REFDEF.finditer(text)}

    def fill(match: re.Match[str], target: str, path: str, scale: str | None) -> str:
        line = text.count("\n", 0, match.start()) + 1
        try:
            value = sources.value(page, target, path, scale)
        except (KeyError, IndexError, TypeError) as exc:
            problems.append(Problem(name, line, f"figure {match['text']!r} has no source: {exc}"))
            return match.group(0)
        new = shown(match["text"], value)
        return match.group(0).replace(f"[{match['text']}]", f"[{new}]", 1)

    def inline(m: re.Match[str]) -> str:
        return fill(m, m["target"], m["path"], m["scale"])

    def reference(m: re.Match[str]) -> str:
        ref = refs.get(m["label"])
        if ref is None:
            return m.group(0)  # an ordinary reference link
        return fill(m, ref["target"], ref["path"], ref["scale"])

    return REFUSE.sub(reference, INLINE.sub(inline, text)), problems


def prose(text: str, refs: set[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line outside fenced code blocks, with code spans, HTML
    comments and figure links (inline, or by a reference in `refs`) blanked out."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        bare = re.sub(r"`[^`]*`|<!--.*?-->", " ", line)
        bare = INLINE.sub(" ", bare)
        yield number, REFUSE.sub(lambda m: " " if m["label"] in refs else m.group(0), bare)


def unsourced(page: Path, text: str, root: Path) -> list[Problem]:
    """Numbers that read as measurements but are not links to a results file."""
    name = str(page.relative_to(root))
    refs = {m["label"] for m in REFDEF.finditer(text)}
    found = []
    for number, line in prose(text, refs):
        for m in MEASURED.finditer(line):
            if BOUND.search(line[: m.start()]):
                continue
            found.append(Problem(name, number, f"{m.group(0).strip()!r} looks measured but "
                                 "is not a link to a bench/results file"))  # fmt: skip
    return found


def check(root: Path = ROOT, fix: bool = False) -> list[Problem]:
    """Every problem in every page; with `fix`, pages are rewritten from their sources."""
    sources = Sources(root)
    problems = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        new, missing = render(page, text, sources)
        problems += missing
        if new != text and fix:
            page.write_text(new, encoding="utf-8")
        elif new != text:
            problems += _differences(page, root, text, new)
        problems += unsourced(page, new if fix else text, root)
    return problems


def _differences(page: Path, root: Path, old: str, new: str) -> list[Problem]:
    name = str(page.relative_to(root))
    out = []
    for number, (a, b) in enumerate(zip(old.splitlines(), new.splitlines(), strict=True), 1):
        if a != b:
            got = [m["text"] for m in INLINE.finditer(a)] + [m["text"] for m in REFUSE.finditer(a)]
            want = [m["text"] for m in INLINE.finditer(b)] + [m["text"] for m in REFUSE.finditer(b)]
            diff = ", ".join(
                f"{g} (results: {w})" for g, w in zip(got, want, strict=False) if g != w
            )
            out.append(Problem(name, number, f"figures disagree with their results: {diff}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report, do not rewrite")
    args = parser.parse_args()
    problems = check(fix=not args.check)
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("every figure matches its results file" if args.check else "figures rendered")


if __name__ == "__main__":
    main()
