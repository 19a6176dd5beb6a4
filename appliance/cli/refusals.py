"""What to do about the appliance's refusal of a CLI call: the `hint:` line printed under
the error, chosen by its status. A 401 is about the token (where this command took one
from, if anywhere); a 403 for a file outside `server.file_roots` is about where files
named over the API may lie, and never about the token; a 403 for a role too low is about
which token to use; other refusals get none (their message says it)."""

from __future__ import annotations

import argparse
import os

from appliance.client import TOKEN_ENV, ApplianceAPIError

OUTSIDE_ROOTS = "outside the file roots"  # appliance/policy/files.py's rule
ROLE_NEEDED = " role; the token "  # appliance/server/auth.py's `require`: the role is too low


def refusal_hint(exc: ApplianceAPIError, args: argparse.Namespace) -> str | None:
    """The hint for `exc`, or None."""
    if exc.status == 401:
        return token_hint(args)
    if exc.status == 403 and ROLE_NEEDED in exc.message:
        return (
            "hint: use a token with that role (server.tokens in the appliance's config); "
            "`appliance whoami` says the role of the one this command sends"
        )
    if exc.status == 403 and OUTSIDE_ROOTS in exc.message:
        # The answer said what to do; the CLI adds how to reload.
        return "hint: after editing server.file_roots, reload: SIGHUP, or POST /v1/config/reload"
    return None


def token_hint(args: argparse.Namespace) -> str:
    """What to do about a refused token: where this command took one from, if anywhere."""
    if getattr(args, "token", None):
        given = "the token given with --token was refused"
    elif os.environ.get(TOKEN_ENV):
        given = f"the token in ${TOKEN_ENV} was refused"
    else:
        given = "no token was sent"
    return (
        f"hint: {given}; pass the appliance's API token with --token TOKEN or ${TOKEN_ENV} "
        "(its server.token, or the APPLIANCE_API_TOKEN it runs with)"
    )
