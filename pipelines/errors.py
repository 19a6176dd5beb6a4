"""Errors of the workflow language; each problem carries its location in the document."""

from __future__ import annotations

import difflib
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
# appliance/policy/masking.py masks URL parameters so named.
SECRET_WORDS = ("pass", "pwd", "token", "key", "secret", "auth", "signature", "credential")


def pydantic_message(
    error: Mapping[str, Any], known: Iterable[str] = (), *, show_input: bool = True
) -> str:
    """Pydantic's message for one error, with the value it got (expected vs got), and
    without pydantic's own prefixes. A secret field's value is not shown, nor any value
    without `show_input` (a document read from a file a request named: its values are
    the file's content). `known`: the parameters there are, for a did-you-mean on an
    unknown one."""
    kind = error.get("type")
    if kind == "extra_forbidden":
        return "unknown parameter" + did_you_mean(str(error["loc"][-1]), known)
    msg = str(error["msg"]).removeprefix("Value error, ")
    if show_input and kind not in ("missing", "value_error") and "input" in error:
        field = str((error.get("loc") or ("",))[-1]).lower()
        if any(word in field for word in SECRET_WORDS):
            value = error["input"]
            size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
            msg += f" (got a value of {size}, not shown)"
        else:
            msg += f" (got {error['input']!r})"
    return msg


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'min_height'?)` for a near miss, else the known names (up to 12)."""
    names = sorted(known)
    if not names:
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return f" (did you mean {close[0]!r}?)"
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f" (known: {shown})"


class WorkflowError(Exception):
    """A workflow that does not compile. `problems` holds every `location: message`;
    `follow_ons` those caused by a failure reported elsewhere (a model that did not
    load), which a report of every problem leaves out. Alone, they are the message."""

    def __init__(
        self, problems: Sequence[str], name: str = "workflow", follow_ons: Sequence[str] = ()
    ) -> None:
        self.problems = list(problems)
        self.follow_ons = list(follow_ons)
        self.name = name
        shown = self.problems or self.follow_ons
        lines = "\n".join(f"  {p}" for p in shown)
        super().__init__(f"{name}: {len(shown)} problem(s)\n{lines}")


class TooManyBlocksError(WorkflowError):
    """A workflow with more blocks than its caller allows, refused on the count alone,
    before any of its blocks is looked at. `count` and `limit` say by how much."""

    def __init__(self, count: int, limit: int, name: str = "workflow") -> None:
        super().__init__([f"blocks: {count} blocks, more than the {limit} allowed"], name)
        self.count = count
        self.limit = limit
