"""The fleet gateway's added latency: `appliance gateway` in front of replicas, against
going to the replica directly (issue 29).

Two replicas (`appliance serve --shard I/2`, each its own process and port) run two live
cameras (the demo clip in real time, the person detector), one each; one gateway
(`appliance gateway --replicas ...`) is in front of both. Measured on the camera of
replica 1 (the second address: the gateway's HOLDER rule asks replica 0 first when a
WebRTC session is ended, its worst case):

- **latest**: `GET /v1/streams/{id}/latest`, one keep-alive connection per arm, REQUESTS
  calls in a row;
- **signalling**: `POST /v1/streams/{id}/webrtc` with a real aiortc offer (made once,
  `RTCConfiguration(iceServers=[])`: the same SDP each time, each POST a new session on
  the replica) until the answer is in, then `DELETE /v1/webrtc/{session}`; OFFERS pairs.

The arms (direct, gateway) alternate in one run, the order rotated each round
(bench/_compare.py). Per round, each arm's p50 and p99; the figure is the gateway's
added time, p50(gateway) - p50(direct), per round, its median with a bootstrap 95 %
interval; met only by the interval's upper bound.

    python bench/gateway.py [--quick] [--rounds N] [--requests N] [--offers N]
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection

from appliance.runtime.sharding import assign
from bench._common import bench_parser, report_judged
from bench._compare import judge, method, rotations
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model
from tests.support.processes import end_process, free_port

ARMS = ["direct", "gateway"]
# One more HTTP hop on loopback through aiohttp (parse, forward on a pooled connection,
# copy the answer back): about a millisecond; 5 ms leaves room for a loaded 2-core host.
LATEST_ADDED_MS = 5.0
# The offer's answer waits for the replica's ICE gathering either way; the hop is the same
# as for `latest`, plus the HOLDER rule's extra try for the DELETE (not in this figure).
SIGNALLING_ADDED_MS = 10.0
STREAMS = ["cam-0", "cam-1", "cam-2", "cam-3"]


def write_config(folder: Path) -> Path:
    doc = {
        "server": {"drain_timeout_s": 3},
        "profiling": {"dir": str(folder / "traces")},
        "models": {"person": person_model()},
        "webrtc": {"host_addresses": ["127.0.0.1"], "max_sessions": 64},
        "streams": [
            {"id": s, "source": {"url": str(DEMO_CLIP), "pace": "realtime"},
             "workflow": detect_workflow()}
            for s in pick_streams()
        ],
    }  # fmt: skip
    path = folder / "appliance.yaml"
    path.write_text(json.dumps(doc))
    return path


def pick_streams() -> list[str]:
    """One camera on each of the two replicas (by the config's rule)."""
    placed = assign(STREAMS, 2)
    return [next(s for s in STREAMS if placed[s] == i) for i in (0, 1)]


def start(argv: list[str], log: Path) -> subprocess.Popen[str]:
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "appliance", "--log-level", "WARNING", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def wait_ready(port: int, proc: subprocess.Popen[str], log: Path, path: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError, ValueError):
            status, body = call(
                http.client.HTTPConnection("127.0.0.1", port, timeout=5), "GET", path
            )
            if status == 200 and (path != "/ready" or json.loads(body).get("ready")):
                return
        time.sleep(0.3)
    raise RuntimeError(f"port {port} did not get ready: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def fleet(folder: Path) -> Iterator[tuple[int, int]]:
    """Two replicas and a gateway; (replica 1's port, the gateway's port)."""
    config, log = write_config(folder), folder / "fleet.log"
    ports = [free_port(), free_port()]
    procs = [
        start(["serve", "--config", str(config), "--shard", f"{i}/2", "--port", str(p),
               "--stats-interval", "600"], log)
        for i, p in enumerate(ports)
    ]  # fmt: skip
    gw_port = free_port()
    replicas = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs.append(start(["gateway", "--replicas", replicas, "--config", str(config),
                        "--port", str(gw_port)], log))  # fmt: skip
    try:
        for port, proc in zip(ports, procs, strict=False):
            wait_ready(port, proc, log, "/ready")
        wait_ready(gw_port, procs[-1], log, "/health")
        yield ports[1], gw_port
    finally:
        for proc in reversed(procs):
            end_process(proc, timeout_s=20)


def call(
    conn: http.client.HTTPConnection, method: str, path: str, body: Any = None
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def timed(fn: Callable[[], None], n: int) -> list[float]:
    """`fn` n times; each call's wall time in ms."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def make_offer() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("predictions")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


class Arm:
    """One way in (direct or through the gateway): its keep-alive connection."""

    def __init__(self, port: int, stream: str, offer: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.stream, self.offer = stream, offer

    def latest(self) -> None:
        status, _ = call(self.conn, "GET", f"/v1/streams/{self.stream}/latest")
        assert status == 200, status

    def wait_for_result(self, timeout_s: float) -> None:
        """Until the stream has a result (its /latest answers 200), `timeout_s` at most."""
        deadline = time.monotonic() + timeout_s
        while call(self.conn, "GET", f"/v1/streams/{self.stream}/latest")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no result of {self.stream} within {timeout_s} s")
            time.sleep(0.1)

    def signal(self) -> tuple[float, float]:
        """(offer → answer ms, DELETE ms)."""
        body = {"sdp": self.offer, "type": "offer", "max_width": 320}
        t0 = time.perf_counter()
        status, raw = call(self.conn, "POST", f"/v1/streams/{self.stream}/webrtc", body)
        t1 = time.perf_counter()
        assert status == 201, (status, raw[:300])
        session = json.loads(raw)["session_id"]
        status, _ = call(self.conn, "DELETE", f"/v1/webrtc/{session}")
        assert status == 204, status
        return (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--offers", type=int, default=30)
    args = parser.parse_args()
    rounds, requests, offers = args.rounds, args.requests, args.offers
    if args.quick:
        rounds, requests, offers = 4, 100, 8
    stream = pick_streams()[1]
    offer = asyncio.run(make_offer())
    per: dict[str, dict[str, list[float]]] = {
        f"{k}.{a}": {"p50": [], "p99": []} for k in ("latest", "offer", "delete") for a in ARMS
    }
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp, fleet(Path(tmp)) as ports:
        arms = {"direct": Arm(ports[0], stream, offer), "gateway": Arm(ports[1], stream, offer)}
        arms["direct"].wait_for_result(60.0)  # ready may come before the first result
        for arm in arms.values():  # warm: connections, the gateway's owner table
            timed(arm.latest, 20)
            arm.signal()
        for r, order in enumerate(rotations(ARMS, rounds)):
            for name in order:
                arm = arms[name]
                samples = {"latest": timed(arm.latest, requests)}
                pairs = [arm.signal() for _ in range(offers)]
                samples["offer"] = [p[0] for p in pairs]
                samples["delete"] = [p[1] for p in pairs]
                for kind, values in samples.items():
                    per[f"{kind}.{name}"]["p50"].append(pct(values, 50))
                    per[f"{kind}.{name}"]["p99"].append(pct(values, 99))
            print(f"round {r + 1}/{rounds}: latest p50 direct "
                  f"{per['latest.direct']['p50'][-1]:.2f} gateway "
                  f"{per['latest.gateway']['p50'][-1]:.2f} ms; offer p50 direct "
                  f"{per['offer.direct']['p50'][-1]:.1f} gateway "
                  f"{per['offer.gateway']['p50'][-1]:.1f} ms", flush=True)  # fmt: skip
    verdicts = {}
    metrics: dict[str, Any] = {"rounds": rounds, "requests": requests, "offers": offers}
    for kind in ("latest", "offer", "delete"):
        for q in ("p50", "p99"):
            d, g = per[f"{kind}.direct"][q], per[f"{kind}.gateway"][q]
            metrics[f"{kind}.direct_{q}_ms"] = round(float(np.median(d)), 2)
            metrics[f"{kind}.gateway_{q}_ms"] = round(float(np.median(g)), 2)
            added = [b - a for a, b in zip(d, g, strict=True)]
            target = {("latest", "p50"): LATEST_ADDED_MS, ("offer", "p50"): SIGNALLING_ADDED_MS}
            verdict = judge(added, at_most=target.get((kind, q)))
            metrics[f"{kind}.added_{q}_ms"] = round(verdict.median, 2)
            if (kind, q) in target:
                verdicts[f"{kind}.added_{q}_ms"] = verdict
    how = method(
        "the gateway's added latency: the same calls straight to the replica that owns the "
        "stream and through `appliance gateway` (2 replicas, 2 live cameras with the person "
        "detector), on keep-alive connections",
        ARMS,
        rounds,
        f"{requests} GET /latest, then {offers} offer+DELETE pairs, per arm",
        figure="median over rounds of p50(gateway) - p50(direct) (ms); p99 the same way",
    )
    report_judged("gateway", metrics, verdicts, how)


if __name__ == "__main__":
    main()
