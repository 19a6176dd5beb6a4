"""How a CLI command calls a running appliance's API: the options every such command
takes (`--url`, `--token`, `--ca-file`), its client, and the client's failures mapped to
a message on stderr and an exit code: 0 ok; 1 the API refused (`error: <status> <code>:
<message>`, the details and a hint on stderr); 2 usage (a CA file that does not load);
4 the appliance cannot be reached (the URL is printed, its credentials masked). Used by
`streams`, `status`, `profile` (cli/client.py), `whoami`, `audit` (cli/access.py) and
`tune --url` (cli/tune.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from appliance.cli.refusals import refusal_hint
from appliance.client import (
    TOKEN_ENV,
    ApplianceAPIError,
    ApplianceClient,
    ApplianceConnectionError,
)
from appliance.client_transport import CA_FILE_ENV, CaFileError
from appliance.policy.masking import mask_url

URL_ENV = "APPLIANCE_URL"
DEFAULT_URL = "http://127.0.0.1:8080"
EXIT_API_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 4

Command = Callable[[argparse.Namespace], int]


def common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"the appliance (default ${URL_ENV} or {DEFAULT_URL})")
    common.add_argument("--token", help=f"the API bearer token (default ${TOKEN_ENV})")
    common.add_argument(
        "--ca-file",
        type=Path,
        metavar="PEM",
        help=f"trust this CA for an https URL (default ${CA_FILE_ENV}, else the system's CAs)",
    )
    return common


def guarded(command: Command) -> Command:
    """Map the client's failures to a message on stderr and the exit code."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ApplianceAPIError as exc:
            print(f"error: {mask_url(str(exc))}", file=sys.stderr)
            for line in _detail_lines(exc.details):
                print(f"  {mask_url(line)}", file=sys.stderr)
            hint = refusal_hint(exc, args)
            if hint:
                print(hint, file=sys.stderr)
            return EXIT_API_ERROR
        except ApplianceConnectionError as exc:
            print(f"error: {mask_url(str(exc))}", file=sys.stderr)
            print(
                f"hint: is it running (`appliance serve --config FILE`)? --url or ${URL_ENV} "
                "names another one",
                file=sys.stderr,
            )
            return EXIT_UNREACHABLE
        except CaFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE

    return run


def _detail_lines(details: Any) -> list[str]:
    if details is None:
        return []
    if isinstance(details, list):
        return [str(d) for d in details]
    return [json.dumps(details)]


def client_of(args: argparse.Namespace) -> ApplianceClient:
    url = args.url or os.environ.get(URL_ENV) or DEFAULT_URL
    return ApplianceClient(url, token=args.token, ca_file=args.ca_file)


def print_json(doc: Any) -> None:
    """JSON on stdout; the appliance masks URLs already, an older one may not have."""
    print(mask_url(json.dumps(doc, indent=2)))


def width(title: str, values: Iterable[str]) -> int:
    return max([len(title), *(len(v) for v in values)]) + 2
