"""`appliance shadow ...` as a user runs it against a live appliance: start a shadow of
the stream's own workflow file, read it, promote it behind a gate, roll back, stop."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.client import TOKEN, WORKFLOW, served_appliance
from tests.support.appliance import ROOT, Served, clean_env
from tests.support.warm_cli import run_appliance

WAIT_S = 60.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_appliance(tmp_path_factory.mktemp("shadow-cli")) as served:
        served.wait_for(lambda: json.loads(served.get("/ready")[1])["ready"], 30, "/ready")
        yield served


def shadow(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ("shadow", *args, "--url", served.url, "--token", TOKEN)
    return run_appliance(argv, timeout=30, cwd=ROOT, env=clean_env())


def test_start_read_promote_roll_back_and_stop(served: Served) -> None:
    workflow = str(WORKFLOW.relative_to(ROOT))  # a local file: sent as an absolute path
    # No budget (--max-live-cost 1): sampled as asked however busy the suite keeps the cores.
    options = ("--workflow", workflow, "--every", "1", "--max-live-cost", "1", "--publish")
    done = shadow(served, "start", "people-cam", *options)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("people-cam: shadow people_counter (")

    deadline = time.monotonic() + WAIT_S
    while True:  # the promotion's gates are judged on 30 compared frames
        done = shadow(served, "status", "people-cam", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["publish"] is True
        if report["comparison"]["frames"] >= 30:
            break
        assert time.monotonic() < deadline, done.stdout
        time.sleep(1.0)
    done = shadow(served, "status", "people-cam")
    lines = done.stdout.splitlines()
    # The same workflow; its tracker started later and sees the frames it had time for,
    # so a new track may be confirmed a frame apart: nearly, not always exactly, 1.
    assert lines[2].startswith("  agreement ") and ": matched " in lines[2]
    assert float(lines[2].split()[1]) >= 0.8, lines

    done = shadow(served, "promote", "people-cam", "--min-agreement", "0.8", "--no-auto-rollback")
    assert done.returncode == 0, done.stderr
    promoted, kept = done.stdout.strip().splitlines()
    assert kept == "  rollback within 300 s"  # the default window, and not by itself
    stream, _, versions = promoted.partition(": workflow ")
    new, _, old = versions.removesuffix(")").partition(" (was ")
    # The same document: the same version, switched to the shadow's warm instance.
    assert (stream, new) == ("people-cam", old)

    done = shadow(served, "rollback", "people-cam")
    assert (done.returncode, done.stdout.strip()) == (0, f"people-cam: workflow {old} (was {new})")
    done = shadow(served, "stop", "people-cam")
    assert done.returncode == 1 and "404" in done.stderr and "runs no shadow" in done.stderr
