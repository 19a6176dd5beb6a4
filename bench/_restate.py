"""`--restate`: give a kept results file made before `method` and `verdicts` existed its
`method` and `verdicts`, derived from the file's own recorded figures, measuring nothing.

For the benches too long to rerun (bench/tune.py, bench/regression_watch.py): each
derives the two entries under its current rules; this module reads the file, checks the
derivation against the recorded `met` (a verdict that disagrees means the rules moved,
and the file is left alone), and writes it back with every existing key and value kept
as it was, `method`, `verdicts` and `run` added after `met` (so the diff is only added
lines, no trailing comma moved). A second `--restate` writes
the same file (the restated date is kept), and a file written by a run of the current
bench (a `run` without `restated`) is refused: it has its own method and verdicts.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS, ROOT

Derive = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, dict[str, Any]]]]
ADDED = ("method", "verdicts", "run")  # what --restate writes


def restate(name: str, derive: Derive, folder: Path = RESULTS) -> Path:
    """Rewrite `folder`/NAME.json with `method` and `verdicts` from `derive(doc)`."""
    path = folder / f"{name}.json"
    doc = json.loads(path.read_text())
    run = doc.get("run")
    if run is not None and "restated" not in run:
        raise SystemExit(f"{_shown(path)} was written by a run of the current bench: "
                         "it has its own method and verdicts, nothing to restate")  # fmt: skip
    how, verdicts = derive(doc)
    _check(doc.get("met", {}), verdicts, path)
    out = restated(doc, how, verdicts, run["restated"] if run else _today())
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"restated {_shown(path)}: {len(verdicts)} verdicts")
    for key, verdict in verdicts.items():
        print(f"  {key}: {'met' if verdict['met'] else 'NOT met'}")
    return path


def restated(
    doc: dict[str, Any], how: dict[str, Any], verdicts: dict[str, Any], note: str
) -> dict[str, Any]:
    """`doc` with its keys in their order and `method`, `verdicts` and `run` after `met`
    (the first two where bench/_common.py's `report` puts them)."""
    # The original run's date and commit were not recorded: null, not guessed.
    added = {"method": how, "verdicts": verdicts,
             "run": {"quick": False, "restated": note, "date": None, "commit": None}}  # fmt: skip
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ADDED:
            continue
        out[key] = value
        if key == "met":
            out |= added
    return out | {k: v for k, v in added.items() if k not in out}


def _check(met: dict[str, Any], verdicts: dict[str, dict[str, Any]], path: Path) -> None:
    """The derived verdicts must judge every recorded target as the run did."""
    wrong = sorted(
        k for k in met.keys() | verdicts.keys()
        if k not in verdicts or met.get(k) != verdicts[k]["met"]
    )  # fmt: skip
    if wrong:
        raise SystemExit(f"{_shown(path)}: the derived verdicts disagree with the recorded "
                         f"`met` on {', '.join(wrong)}; nothing written")  # fmt: skip


def _today() -> str:
    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    return (f"{day}: method and verdicts derived from this file's own figures by "
            "--restate; figures from the original run")  # fmt: skip


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
