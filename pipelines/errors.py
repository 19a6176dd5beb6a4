"""Errors of the workflow language; each problem carries its location in the document."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def format_location(loc: Iterable[int | str]) -> str:
    """('streams', 1, 'source', 'url') -> 'streams[1].source.url'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top)"


# Names that hold secrets, lower-cased, matched as substrings: a config field so named
# keeps its value out of error messages (its length is said instead), and
# appliance/masking.py masks URL parameters so named.
SECRET_WORDS = ("pass", "pwd", "token", "key", "secret", "auth", "signature", "credential")


def pydantic_message(error: Mapping[str, Any]) -> str:
    """Pydantic's message for one error, with the value it got (expected vs got), and
    without pydantic's own prefixes. A secret field's value is not shown."""
    kind = error.get("type")
    if kind == "extra_forbidden":
        return "unknown parameter"
    msg = str(error["msg"]).removeprefix("Value error, ")
    if kind not in ("missing", "value_error") and "input" in error:
        field = str((error.get("loc") or ("",))[-1]).lower()
        if any(word in field for word in SECRET_WORDS):
            value = error["input"]
            size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
            msg += f" (got a value of {size}, not shown)"
        else:
            msg += f" (got {error['input']!r})"
    return msg


class WorkflowError(Exception):
    """A workflow that does not compile. `problems` holds every `location: message`."""

    def __init__(self, problems: Sequence[str], name: str = "workflow") -> None:
        self.problems = list(problems)
        self.name = name
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{name}: {len(self.problems)} problem(s)\n{lines}")
