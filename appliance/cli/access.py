"""`appliance whoami` and `appliance audit`: the token's name and role, and the
appliance's recent changes (who, what, on what, how it ended), over the API."""

from __future__ import annotations

import argparse
from typing import Any

from appliance.cli.calls import client_of, common_options, guarded, print_json, width
from appliance.observe.audit import MAX_ENTRIES
from appliance.observe.status import as_json


def add_access_commands(sub: Any) -> None:
    """Register `whoami` and `audit` on the `appliance` parser's subparsers."""
    common = common_options()
    whoami = sub.add_parser("whoami", parents=[common], help="the API token's name and role")
    whoami.add_argument("--json", action="store_true")
    whoami.set_defaults(func=guarded(cmd_whoami))
    audit = sub.add_parser(
        "audit", parents=[common], help="recent changes: who, what, on what (admin token)"
    )
    audit.add_argument("--limit", type=_limit, default=20, help="how many, newest first")
    audit.add_argument("--json", action="store_true")
    audit.set_defaults(func=guarded(cmd_audit))


def _limit(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_ENTRIES:
        raise argparse.ArgumentTypeError(f"between 1 and {MAX_ENTRIES}")
    return value


def cmd_whoami(args: argparse.Namespace) -> int:
    caller = client_of(args).whoami()
    if args.json:
        print_json(as_json(caller))
    else:
        print(f"{caller.name} ({caller.role}: may do what {', '.join(caller.roles)} may)")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    entries = client_of(args).audit(args.limit).entries
    if args.json:
        print_json(as_json(entries))
        return 0
    rows = [(e.at, e.who, e.action, e.target or "-", e.outcome, e.detail or "") for e in entries]
    titles = ("AT", "WHO", "ACTION", "TARGET", "OUTCOME", "DETAIL")
    widths = [width(t, (r[i] for r in rows)) for i, t in enumerate(titles[:-1])]
    for row in [titles, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    return 0
