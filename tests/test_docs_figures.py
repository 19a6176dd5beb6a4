"""Every measured figure in README.md and docs/ is rendered from a kept results file
(bench/_figures.py): a page that disagrees with its results, a figure whose source is
missing or a --quick run's, and a number that reads as measured but is no link, all fail."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


figures = _load()


def test_every_page_agrees_with_its_results() -> None:
    problems = figures.check(ROOT)
    assert not problems, "\n".join(map(str, problems))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A copy of the pages and the results files they are rendered from."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "bench" / "results", tmp_path / "bench" / "results",
                    ignore=shutil.ignore_patterns("quick"))  # fmt: skip
    return tmp_path


def _first_figure(site: Path) -> tuple[Path, str, str]:
    """A page holding an inline figure link, the link, and its text."""
    for page in figures.pages(site):
        match = figures.INLINE.search(page.read_text(encoding="utf-8"))
        if match:
            return page, match.group(0), match["text"]
    raise AssertionError("no page has a figure link")


def test_a_figure_edited_by_hand_is_named(site: Path) -> None:
    page, link, text = _first_figure(site)
    wrong = text[:-1] + ("2" if text[-1] == "1" else "1")  # one digit off, same format
    edited = link.replace(f"[{text}]", f"[{wrong}]", 1)
    page.write_text(page.read_text(encoding="utf-8").replace(link, edited, 1), encoding="utf-8")
    problems = [str(p) for p in figures.check(site)]
    name = str(page.relative_to(site))
    assert any(p.startswith(name) and f"{wrong} (results: {text})" in p for p in problems), problems
    figures.check(site, fix=True)  # rendering puts the results' figure back
    assert link in page.read_text(encoding="utf-8")
    assert not figures.check(site)


def test_a_changed_result_is_named_until_rendered(site: Path) -> None:
    page = site / "docs" / "extra.md"
    (site / "bench" / "results" / "probe.json").write_text(
        json.dumps({"metrics": {"p50_ms": 12.34, "share": 0.0212, "rows": [{"n": 1234}]}})
    )
    page.write_text(
        "p50 [12.3](../bench/results/probe.json#metrics.p50_ms) ms, "
        "[2.12](../bench/results/probe.json#metrics.share*100) %, "
        "[1,234][n] frames\n\n[n]: ../bench/results/probe.json#metrics.rows.0.n\n"
    )
    assert not [p for p in figures.check(site) if "extra.md" in str(p)]
    (site / "bench" / "results" / "probe.json").write_text(
        json.dumps({"metrics": {"p50_ms": 15.0, "share": 0.0212, "rows": [{"n": 20000}]}})
    )
    problems = [str(p) for p in figures.check(site) if "extra.md" in str(p)]
    assert problems == ["docs/extra.md:1: figures disagree with their results: "
                        "12.3 (results: 15.0), 1,234 (results: 20,000)"], problems  # fmt: skip
    figures.check(site, fix=True)
    assert page.read_text().startswith("p50 [15.0](../bench/results/probe.json#metrics.p50_ms) ms")
    assert "[20,000][n] frames" in page.read_text()


def test_figures_without_a_kept_source_are_named(site: Path) -> None:
    quick = site / "bench" / "results" / "fast.json"
    quick.write_text(json.dumps({"metrics": {"x": 1.0}, "run": {"quick": True}}))
    (site / "docs" / "extra.md").write_text(
        "[1.0](../bench/results/fast.json#metrics.x) and [2.0](../bench/results/gone.json#a) "
        "and [3.0](../bench/results/probe.json#metrics.nope)\n"
    )
    (site / "bench" / "results" / "probe.json").write_text(json.dumps({"metrics": {}}))
    problems = [str(p) for p in figures.check(site) if "extra.md" in str(p)]
    assert len(problems) == 3, problems
    assert "--quick run" in problems[0] and "gone.json" in problems[1], problems
    assert "'nope'" in problems[2], problems


def test_a_measured_looking_number_must_be_a_link(site: Path) -> None:
    (site / "docs" / "extra.md").write_text(
        "The model took 12.5 ms at p50, 1.34× the frames, 2.09–2.23 % of a core.\n"
        "| run | 0.15 | 3 |\n"
        "Targets and settings are not figures: ≤ 0.5 %, at most 1.48 ×, a 5 s timeout, "
        "`backoff: 0.5`, and in a block:\n\n```\nlatency 9.9 ms\n```\n"
    )
    problems = [str(p) for p in figures.check(site) if "extra.md" in str(p)]
    flagged = [p.split("'")[1] for p in problems]
    assert flagged == ["12.5 ms", "1.34×", "2.09–2.23 %", "0.15"], problems
