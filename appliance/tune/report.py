"""A tune's report, made from its JSON (results.result_json), so a local tune and a
remote one (GET /v1/tune's result) print the same: the table of every candidate, the
plot of fps against frame-age p99 with the Pareto front, and the winner as the YAML
patch of the config's `tuning:` section, which `apply_to_file` puts into the file.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from appliance.config import ConfigError, TuningConfig, load_config
from appliance.tune.space import SETTINGS, SOURCES

Point = tuple[float, float]  # (fps, p99 ms)
TOP_KEY = re.compile(r"^[^\s#]")  # a line that starts a top-level key (or `---`)
TUNING_LINE = re.compile(r"^tuning\s*:")


# -- table ------------------------------------------------------------------------------
def table(result: Mapping[str, Any]) -> str:
    """Every candidate (knob=value, verdict, score ratio median [low–high], fps and p99
    of its windows, whether it met the objective's constraint), the starting settings'
    own windows, then the winner: what changed, why each knob has its value, the outcome."""
    objective = result["objective"]
    met_title = "SLO met" if objective["kind"] == "fps" else "kept up"
    rows = [["candidate", "verdict", "ratio", "interval", "fps", "p99 ms", met_title]]
    for c in result["candidates"]:
        rows.append(
            [
                f"{c['knob']}={_value(c['value'])}",
                c["verdict"],
                "-" if c["ratio"] is None else f"{c['ratio']:.3f}",
                "-"
                if c["interval"] is None
                else f"[{c['interval'][0]:.3f}–{c['interval'][1]:.3f}]",
                *_figures(c["windows"], c["met"]),
            ]
        )
    start = [r for r in result["reference"] if r["settings"] == result["start"]]
    if start:
        windows = f"{len(start)} window{'s' * (len(start) != 1)}"
        met = [bool(r["met"]) for r in start]
        rows.append(["start (reference)", windows, "1.000", "", *_figures(start, met)])
    lines = [f"objective: {objective['description']}", *_aligned(rows), ""]
    return "\n".join(lines + _winner(result))


def _figures(windows: Sequence[Mapping[str, Any]], met: Sequence[bool]) -> list[str]:
    """Median fps and p99 of the windows; `yes`, `no` or `k/n` windows met."""
    if not windows:
        return ["-", "-", "-"]
    fps = statistics.median(w["fps"] for w in windows)
    ages = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    p99 = f"{statistics.median(ages):.1f}" if ages else "-"
    kept = sum(met)
    verdict = "yes" if kept == len(met) else "no" if kept == 0 else f"{kept}/{len(met)}"
    return [f"{fps:.1f}", p99, verdict]


def _aligned(rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; the text ones left, the figures right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = {0, 1, 3}
    out = []
    for row in rows:
        cells = [
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def _winner(result: Mapping[str, Any]) -> list[str]:
    outcome = {
        "done": "done",
        "budget": "stopped at the budget",
        "interrupted": "interrupted",
        "failed": "failed",
    }.get(result["outcome"], result["outcome"])
    lines = [f"outcome: {outcome} after {result['elapsed_s']:g} s, {result['windows']} windows"]
    if result.get("problem"):
        lines.append(f"problem: {result['problem']}")
    # An interrupted or failed tune's best is only what it had found: never applied.
    title = "winner" if result["outcome"] in ("done", "budget") else "best so far (not applied)"
    changed = result["changed"]
    if changed:
        lines.append(
            f"{title}: "
            + ", ".join(
                f"{k} {_value(result['start'].get(k))} → {_value(v)}" for k, v in changed.items()
            )
        )
    else:
        lines.append(f"{title}: the starting settings (no knob changed)")
    keys = [k["key"] for k in result["knobs"]]
    reasons = result["reasons"]
    width = max((len(k) for k in [*keys, *reasons]), default=0)
    lines.append("why each knob has its value:")
    for key in [*keys, *(k for k in reasons if k not in keys)]:
        reason = reasons.get(key, "not searched: the tune ended before this knob")
        lines.append(f"  {key:<{width}}  {reason}")
    return lines


def _value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, bool) or v is None else str(v)


# -- plot -------------------------------------------------------------------------------
def pareto(points: Sequence[Point]) -> list[int]:
    """The indices of the points no other point beats on both axes (more fps, lower p99,
    one of them strictly), by rising fps: the trade-offs worth choosing between."""
    front = [
        i
        for i, (fps, p99) in enumerate(points)
        if not any(
            f >= fps and p <= p99 and (f > fps or p < p99)
            for j, (f, p) in enumerate(points)
            if j != i
        )
    ]
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))


def plot(result: Mapping[str, Any], path: Path) -> Path | None:
    """A PNG at `path`: fps against frame-age p99 for each candidate and the starting
    settings (the median of their windows; the start's own windows faint too), their
    Pareto front as a line, the winner circled, the SLO as a line for the fps objective.
    None when matplotlib is not installed (`pip install appliance[plot]`)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    labels, points = _candidate_points(result)
    start_rows = [r for r in result["reference"] if r["settings"] == result["start"]]
    start = [p for r in start_rows if (p := _point([r])) is not None]
    start_median = _point(start_rows)
    if start_median is not None:  # the trade-offs: the candidates' and the start's medians
        labels, points = [*labels, "start"], [*points, start_median]
    fig = Figure(figsize=(8, 5.5), dpi=100)
    FigureCanvasAgg(fig)  # the Agg canvas, without pyplot's global state
    ax = fig.add_subplot()
    if start:
        ax.scatter(*_xy(start), marker="s", s=14, color="0.7", label="starting settings' windows")
    if points:
        ax.scatter(
            *_xy(points), color="tab:blue", label="candidates and start (median of their windows)"
        )
        for label, (x, y) in zip(labels, points, strict=True):
            ax.annotate(label, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    front = [points[i] for i in pareto(points)]
    if front:
        ax.plot(
            *_xy(front),
            color="tab:orange",
            marker="o",
            mfc="none",
            markersize=10,
            label="Pareto front (more fps, lower p99)",
        )
    winner = _point(_windows_of(result, result["best"]))
    if winner is not None:
        ax.scatter(
            [winner[0]],
            [winner[1]],
            s=260,
            facecolors="none",
            edgecolors="tab:red",
            linewidths=2,
            label="winner",
        )
    objective = result["objective"]
    if objective["kind"] == "fps":
        ax.axhline(
            objective["slo_ms"],
            color="tab:red",
            linestyle="--",
            linewidth=1,
            label=f"SLO {objective['slo_ms']:g} ms",
        )
    ax.set_xlabel("processed fps (all streams)")
    ax.set_ylabel("frame age p99 (ms)")
    ax.set_title(f"appliance tune: {objective['description']}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _xy(points: Sequence[Point]) -> tuple[list[float], list[float]]:
    return [x for x, _ in points], [y for _, y in points]


def _candidate_points(result: Mapping[str, Any]) -> tuple[list[str], list[Point]]:
    labels, points = [], []
    for c in result["candidates"]:
        point = _point(c["windows"])
        if point is not None:
            labels.append(f"{c['knob']}={_value(c['value'])}")
            points.append(point)
    return labels, points


def _windows_of(result: Mapping[str, Any], settings: Mapping[str, Any]) -> list[Any]:
    """Every window measured on exactly `settings`: a candidate's and the reference's."""
    found = [w for c in result["candidates"] if c["settings"] == settings for w in c["windows"]]
    return found + [r for r in result["reference"] if r["settings"] == settings]


def _point(windows: Iterable[Mapping[str, Any]]) -> Point | None:
    """The median fps and p99 of windows that saw frames (an empty one's p99 is null)."""
    seen = [w for w in windows if w["p99_ms"] is not None]
    if not seen:
        return None
    return statistics.median(w["fps"] for w in seen), statistics.median(w["p99_ms"] for w in seen)


# -- the YAML patch ---------------------------------------------------------------------
def patch_yaml(result: Mapping[str, Any], keep: Mapping[str, Any] | None = None) -> str:
    """The config's `tuning:` section with every searched knob at its best value, each
    with its reason as a comment. `keep`: the `tuning:` the tune started from (as
    TuningConfig.model_dump(exclude_none=True)); its settings of knobs not searched are
    carried over, since the winner was measured with them."""
    models: dict[str, dict[str, tuple[Any, str]]] = {}
    sources: dict[str, tuple[Any, str]] = {}
    for scope, entries in (keep or {}).get("models", {}).items():
        if not entries:
            continue
        for name, value in entries.items():
            models.setdefault(scope, {})[name] = (value, "the config's own: not searched")
    for name, value in (keep or {}).get("sources", {}).items():
        sources[name] = (value, "the config's own: not searched")
    for key, value in result["best"].items():
        scope, name = _split(key)
        into = sources if scope == SOURCES else models.setdefault(scope, {})
        into[name] = (value, result["reasons"].get(key, "measured best"))
    lines = [
        "tuning:",
        f"  # appliance tune: {result['objective']['description']}; {result['outcome']} "
        f"after {result['elapsed_s']:g} s, {result['windows']} windows",
    ]
    if models:
        lines.append("  models:")
        for scope, entries in models.items():
            if not entries:
                continue
            lines.append(f"    {_scalar(scope)}:")
            lines += _settings(entries, "      ")
    if sources:
        lines.append("  sources:")
        lines += _settings(sources, "    ")
    if not models and not sources:
        lines[0] = "tuning: {}"
    return "\n".join(lines) + "\n"


def _split(key: str) -> tuple[str, str]:
    """`faces.max_batch_size` -> ("faces", "max_batch_size"); a model id may hold dots."""
    scope, _, name = key.rpartition(".")
    if not scope or name not in SETTINGS:
        raise ValueError(f"{key!r}: not a knob key (<model>.<setting> or sources.<setting>)")
    return scope, name


def _settings(entries: Mapping[str, tuple[Any, str]], indent: str) -> list[str]:
    text = [(f"{indent}{name}: {_scalar(value)}", why) for name, (value, why) in entries.items()]
    width = max(len(t) for t, _ in text)
    return [f"{t:<{width}}  # {_one_line(reason)}" for t, reason in text]


def _scalar(value: Any) -> str:
    """A value or key as YAML writes it (`true`, `2.0`, `all`, a quoted odd string)."""
    return str(yaml.safe_dump([value], default_flow_style=True, width=1_000)).strip()[1:-1]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# -- applying it ------------------------------------------------------------------------
def apply_to_file(config_path: Path, patch: str) -> None:
    """Put `patch`'s top-level `tuning:` block into the config file: in place of the
    file's own `tuning:` block (its line up to the next top-level key), or at the end.
    The rest of the file, comments included, is left as it was. The new file is
    validated (load_config, and its `tuning:` must be the patch's) before it replaces
    the old one atomically; ConfigError naming the file, and nothing written, if not."""
    path = Path(config_path).resolve()  # a symlinked config: its target is rewritten
    try:
        old = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"cannot read: {exc.strerror or exc}"], str(config_path)) from None
    block = _block(patch.splitlines(keepends=True))
    if block is None:
        raise ConfigError(["the patch has no top-level `tuning:` block"], str(config_path))
    new = _replaced(old.splitlines(keepends=True), block)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tune", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        _check(Path(temp), "".join(block), str(config_path))
        os.chmod(temp, path.stat().st_mode & 0o7777)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _check(temp: Path, block: str, name: str) -> None:
    """The written file is a valid config, and its `tuning:` is the patch's (not, say, a
    second `tuning:` key further down that would win over it)."""
    try:
        expected = TuningConfig.model_validate(yaml.safe_load(block)["tuning"] or {})
    except (yaml.YAMLError, ValueError) as exc:
        problem = _one_line(str(exc))
        raise ConfigError([f"the tuning patch is not a valid `tuning:`: {problem}"], name) from None
    try:
        config = load_config(temp)
    except ConfigError as exc:
        raise ConfigError(exc.problems, f"{name} (with the tuning patch)") from None
    if config.tuning != expected:
        raise ConfigError(
            ["tuning: the file's `tuning:` would not be the patch's (a second `tuning:` key?)"],
            name,
        )


def _block(lines: list[str]) -> list[str] | None:
    """The lines of the top-level `tuning:` block (to the next top-level key or the end)."""
    span = _span(lines)
    if span is None:
        return None
    block = lines[span[0] : span[1]]
    if block and not block[-1].endswith("\n"):
        block[-1] += "\n"
    return block


def _span(lines: list[str]) -> tuple[int, int] | None:
    """[first, end) of the top-level `tuning:` block; the blank and comment lines at its
    end belong to what follows (a comment about the next key)."""
    first = next((i for i, line in enumerate(lines) if TUNING_LINE.match(line)), None)
    if first is None:
        return None
    end = next((i for i in range(first + 1, len(lines)) if TOP_KEY.match(lines[i])), len(lines))
    while end - 1 > first and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1
    return first, end


def _replaced(lines: list[str], block: list[str]) -> str:
    span = _span(lines)
    if span is not None:
        return "".join(lines[: span[0]] + block + lines[span[1] :])
    head = "".join(lines)
    if head and not head.endswith("\n"):
        head += "\n"
    return head + ("\n" if head.strip() else "") + "".join(block)
