"""`appliance serve`'s log: aiohttp's line per request stays out of it by default, and
shows from DEBUG on (`serve -v`, `--log-level DEBUG`) (issue 30, item 8)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.appliance import Served

ACCESS_LINE = "aiohttp.access: 127.0.0.1 ["  # aiohttp's format, after our logger name


def _requests_logged(served: Served) -> str:
    """The log after three requests, once the process has ended (its lines flushed)."""
    for _ in range(3):
        assert served.get("/health")[0] == 200
    assert served.terminate() == 0
    return served.log_path.read_text(encoding="utf-8")


def test_access_lines_show_only_at_debug(
    serve: Callable[..., Served], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    config = write_config({"streams": []})
    quiet = _requests_logged(serve(config))
    assert "serving on http://127.0.0.1:" in quiet  # the narration is still there
    assert "aiohttp.access" not in quiet and '"GET /health' not in quiet, quiet

    verbose = _requests_logged(serve(config, "-v"))
    assert verbose.count('"GET /health HTTP/1.1" 200') >= 3, verbose
    assert ACCESS_LINE in verbose, verbose
