"""`appliance shadow start|status|promote|rollback|stop ID`: a stream's shadow workflow
over the HTTP API (docs/shadow.md). Exit codes as the other client commands'
(appliance/cli/client.py): 1 when the API refuses, a gate that failed included."""

from __future__ import annotations

import argparse
from typing import Any

from appliance.cli.calls import client_of, common_options, guarded, print_json
from appliance.cli.client import workflow_arg


def add_shadow_commands(sub: Any) -> None:
    """Register `shadow ...` on the `appliance` parser's subparsers."""
    common = common_options()
    shadow = sub.add_parser("shadow", help="try a workflow on a stream's live frames, then switch")
    actions = shadow.add_subparsers(required=True, metavar="ACTION")
    start = actions.add_parser("start", parents=[common], help="run a candidate beside it")
    start.add_argument("id")
    start.add_argument("--workflow", required=True, help="a workflow file, or inline as JSON")
    start.add_argument("--every", type=int, default=1, help="every Nth frame (default 1)")
    start.add_argument("--max-fps", type=float, help="at most this many frames a second")
    start.add_argument(
        "--max-live-cost", type=float, help="the live fps it may cost (default 0.05: 5 %%)"
    )
    start.add_argument(
        "--publish", action="store_true", help="its results on MQTT <prefix>/<stream>/shadow"
    )
    promote = actions.add_parser(
        "promote", parents=[common], help="switch the stream to the candidate, behind gates"
    )
    promote.add_argument("id")
    promote.add_argument("--min-agreement", type=float, help="refuse below this agreement")
    promote.add_argument("--max-latency-ratio", type=float, help="refuse above this ratio")
    promote.add_argument("--rollback-s", type=float, help="keep the old workflow this long")
    promote.add_argument(
        "--no-auto-rollback",
        dest="auto_rollback",
        action="store_false",
        default=None,
        help="keep it even if the regression watch finds it slower within --rollback-s",
    )
    for name, text in (
        ("status", "the comparison so far"),
        ("stop", "stop the shadow: its final comparison"),
        ("rollback", "switch back to the workflow the last promotion replaced"),
    ):
        actions.add_parser(name, parents=[common], help=text).add_argument("id")
    for name, parser in actions.choices.items():
        parser.add_argument("--json", action="store_true", help="print the API's JSON")
        parser.set_defaults(func=guarded(cmd_shadow), action_name=name)


def cmd_shadow(args: argparse.Namespace) -> int:
    action = args.action_name
    body: dict[str, Any] = {}
    if action == "start":
        body = {"workflow": workflow_arg(args.workflow), "every": args.every}
        optional = {"max_fps": args.max_fps, "max_live_cost": args.max_live_cost,
                    "publish": args.publish or None}  # fmt: skip
        body |= {k: v for k, v in optional.items() if v is not None}
    elif action == "promote":
        gates = ("min_agreement", "max_latency_ratio", "rollback_s", "auto_rollback")
        body = {k: getattr(args, k) for k in gates if getattr(args, k) is not None}
    answer = client_of(args).shadow(args.id, action, body)
    if args.json:
        print_json(answer)
    else:
        print("\n".join(summary(action, answer)))
    return 0


def summary(action: str, answer: dict[str, Any]) -> list[str]:
    """The answer as a few lines for people."""
    if action in ("promote", "rollback"):
        lines = [f"{answer['stream']}: workflow {answer['workflow']} (was {answer['previous']})"]
        if action == "promote":
            itself = ", or by itself on a regression" if answer["auto_rollback"] else ""
            lines.append(f"  rollback within {answer['rollback_s']:g} s{itself}")
        return lines
    c = answer["comparison"]
    low, high = c["agreement_interval"]
    interval = f" [{low:.3f}–{high:.3f}]" if low is not None else ""
    latency = c["latency_ms"]
    lines = [
        f"{answer['stream']}: shadow {answer['workflow']} ({answer['source']}), "
        f"{'running' if answer['running'] else 'stopped'}",
        f"  frames compared {c['frames']}, ran {answer['ran']}, skipped {answer['skipped']}, "
        f"failed {answer['failed']}",
        f"  agreement {c['agreement']:.3f}{interval}: matched {c['matched']}, "
        f"missed {c['missed']}, extra {c['extra']}",
    ]
    for what, figures in (("latency", latency), ("CPU", c["cpu_ms"])):
        if figures["live_p50"] is not None and figures["ratio_p50"] is not None:
            lines.append(
                f"  {what} p50 {figures['live_p50']:.1f} ms live, "
                f"{figures['candidate_p50']:.1f} ms candidate (×{figures['ratio_p50']:.2f})"
            )
    lines += [
        f"  {e['kind']} seq {e['seq']} {e['output']}: {e['label']} {e['confidence']:.2f} "
        f"at {e['box']}"
        for e in c["examples"][:5]
    ]
    return lines
