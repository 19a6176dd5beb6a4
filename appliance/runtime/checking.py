"""Every problem in one pass: a start or `appliance validate` loads each model and
compiles each workflow even after one failed, and reports them all together.

A failure that another one caused is left out (a workflow naming a model that did not
load: BuildContext.unavailable), so one root cause gives one message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from appliance.config import ConfigError
from appliance.errors import FileAccessError, LimitError
from appliance.models import ModelLoadError
from pipelines.errors import WorkflowError

# What a person fixes in a file; anything else (a bug, a full disk) still stops at once.
BAD_INPUT = (ConfigError, WorkflowError, ModelLoadError, FileAccessError, LimitError)


class Problems:
    """Collects the bad-input failures of independent steps (`with problems.check():`)
    of checking one thing, `source` (a config file)."""

    def __init__(self, source: str = "config") -> None:
        self.source = source
        self.failures: list[Exception] = []

    def add(self, failure: Exception) -> None:
        self.failures.append(failure)

    @contextmanager
    def check(self) -> Iterator[None]:
        """Run one step; a bad-input failure is kept and the next step runs."""
        try:
            yield
        except BAD_INPUT as exc:
            self.add(exc)

    def lines(self) -> list[str]:
        """`location: message` for each problem, follow-on errors left out, and a
        location already reported by an earlier failure (the config's check that a
        model file exists, then the model's load) not reported again."""
        out: list[str] = []
        seen: set[str] = set()
        for exc in self.failures:
            lines = problem_lines(exc, self.source)
            out += [line for line in lines if line.split(": ", 1)[0] not in seen]
            seen.update(line.split(": ", 1)[0] for line in lines)
        return out

    def raise_any(self) -> None:
        """Nothing when all went well; one failure as itself (its type says what it is);
        several as one ConfigError listing every problem. A failure that is only
        follow-ons (a workflow whose one fault is a model that did not load) counts as
        none beside its cause."""
        causes = [f for f in self.failures if problem_lines(f, self.source)]
        if len(causes) == 1:
            raise causes[0]
        if causes:
            raise ConfigError(self.lines(), self.source)
        if self.failures:  # follow-ons alone cannot be: their cause failed too
            raise self.failures[0]


def problem_lines(exc: Exception, source: str) -> list[str]:
    """One failure as `location: message` lines (locations within `source` as they
    are); a workflow's follow-ons left out."""
    if isinstance(exc, WorkflowError):
        return [f"{exc.name}: {p}" for p in exc.problems]
    if isinstance(exc, ConfigError):
        return [p if exc.source == source else f"{exc.source}: {p}" for p in exc.problems]
    return [str(exc)]
