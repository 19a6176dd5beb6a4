"""One change to the set of streams at a time: the runtime's control lock as a decorator.

Whoever asks (HTTP, SIGHUP, MQTT commands, the supervisor), an id is checked and its stream
started in two steps, and two requests for one id must not both pass the check. The lock
is reentrant: a public change may call another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Controlled(Protocol):
    _control: threading.RLock


C = TypeVar("C", bound=Controlled)


def one_change_at_a_time(
    method: Callable[Concatenate[C, P], T],
) -> Callable[Concatenate[C, P], T]:
    """Runs the method under its object's `_control` lock."""

    def locked(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._control:
            return method(self, *args, **kwargs)

    # functools.wraps would do, but its _Wrapped type loses the Concatenate for mypy.
    locked.__name__, locked.__doc__ = method.__name__, method.__doc__
    return locked
