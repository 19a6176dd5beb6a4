"""`appliance tune` as a user runs it: a real process tuning a real runtime on the bundled
clip (tests/tune/conftest.py's two cameras), short windows and only a spinning knob;
its table, JSON, plot and patch; Ctrl+C mid-tune; a running appliance tuned over its
API (`--url`) with the same report; and the mistakes it names."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.cli.main import main
from appliance.cli.tune import ProgressLine, parse_duration
from appliance.config import parse_config
from appliance.tune import report
from tests.server.conftest import TOKEN, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import APPLIANCE, clean_env
from tests.support.warm_cli import run_appliance
from tests.tune.conftest import TuneSetup

# One model's knob of two values: 3 to 7 windows of 0.5 s, 0.2 s to settle after a change.
QUICK = ["--knob", "person.allow_spinning", "--window", "0.5", "--settle", "0.2", "--warmup", "1.5"]
SPINNING = "person.allow_spinning"


def tune(config: Path, *args: str) -> subprocess.Popen[str]:
    """`appliance tune` in a process of its own, followed as it runs."""
    return subprocess.Popen(
        [*APPLIANCE, "tune", "--config", str(config), *QUICK, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip


def run_tune(config: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`appliance tune` run to its end, forked from the warm CLI (tests/support/warm_cli.py)."""
    command = ["tune", "--config", str(config), *QUICK, *args]
    return run_appliance(command, env=clean_env(), timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_tune_reports_and_writes_its_winner(tune_setup: TuneSetup, tmp_path: Path) -> None:
    patch, result, png = tmp_path / "patch.yaml", tmp_path / "tune.json", tmp_path / "tune.png"
    args = ["--budget", "30s", "--write", str(patch), "--json", str(result), "--plot", str(png)]
    done = run_tune(tune_setup.config, *args, timeout=120)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err
    assert "warming up 1.5 s" in err and "tune: best so far  0/" in err  # progress, a line each

    doc: dict[str, Any] = yaml.safe_load(result.read_text(encoding="utf-8"))
    assert doc["outcome"] in ("done", "budget") and doc["candidates"]
    assert [k["key"] for k in doc["knobs"]] == [SPINNING]  # --knob: only that one
    for c in doc["candidates"]:  # the table shows each of them
        assert any(line.startswith(f"{c['knob']}=") and c["verdict"] in line
                   for line in out.splitlines()), c  # fmt: skip
    assert "start (reference)" in out and "why each knob has its value:" in out

    config = yaml.safe_load(tune_setup.config.read_text(encoding="utf-8"))
    tuned = parse_config({**config, **yaml.safe_load(patch.read_text(encoding="utf-8"))},
                         tune_setup.folder).tuning  # fmt: skip
    assert list(tuned.models) == ["person"]
    assert tuned.models["person"].allow_spinning == doc["best"][SPINNING]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_mid_tune_restores_and_writes_nothing(tune_setup: TuneSetup, tmp_path: Path) -> None:
    before = tune_setup.config.read_bytes()
    outputs = [tmp_path / "patch.yaml", tmp_path / "tune.json", tmp_path / "tune.png"]
    proc = tune(tune_setup.config, "--budget", "60s", "--apply", "--write", str(outputs[0]),
                "--json", str(outputs[1]), "--plot", str(outputs[2]))  # fmt: skip
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the first progress line: the search has begun
        seen.append(line)
        if line.startswith("tune: "):
            break
    assert seen and seen[-1].startswith("tune: "), seen
    proc.send_signal(2)  # SIGINT, as Ctrl+C
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: the starting settings are back; nothing written" in err
    assert "outcome: interrupted" in out  # the partial table still
    assert not any(p.exists() for p in outputs)
    assert tune_setup.config.read_bytes() == before  # --apply wrote nothing


# Ctrl+C (or SIGTERM) while the main thread is inside stop.wait(), the tune's every wait,
# holding the Event's lock: a handler that set `stop` there waited for itself forever, and
# the tune hung with its streams running. Rounds of signals at such moments, in a process
# of their own (the signals are its own; a hang is its timeout).
SIGNAL_IN_WAIT = """
import os, signal, threading
from appliance.cli.signals import stopped_by_signals
before = signal.getsignal(signal.SIGINT)  # Python's, or SIG_IGN when started in the background
for i in range(40):
    stop = threading.Event()
    with stopped_by_signals(stop):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        threading.Timer(0.002, os.kill, (os.getpid(), sig)).start()
        while not stop.wait(0):  # as often as can be
            pass
print(signal.getsignal(signal.SIGINT) is before, signal.set_wakeup_fd(-1))
"""


def test_a_signal_while_the_tune_waits_on_its_stop_flag_stops_it() -> None:
    command = [sys.executable, "-c", SIGNAL_IN_WAIT]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=20, env=clean_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "-1"]  # the handler before it back, no wakeup socket


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_running_appliance_is_tuned_with_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(tmp_path, config_doc(demo_stream("cam")), "config.yaml")
    result, patch = tmp_path / "tune.json", tmp_path / "patch.yaml"
    live = LiveServer(config, token=TOKEN).start()
    try:
        wait_for(lambda: live.stream("cam")["frames_processed"] > 0, 30.0, "cam processing")
        remote = ["tune", "--url", live.url, "--knob", "allow_spinning", "--window", "1",
                  "--settle", "0.2", "--budget", "10s"]  # fmt: skip
        assert main([*remote, "--token", "wrong"]) == 1  # refused: said, with what to do
        assert "hint: the token given with --token was refused" in capsys.readouterr().err
        done = main([*remote, "--token", TOKEN, "--json", str(result), "--write", str(patch)])
    finally:
        live.stop()
    out = capsys.readouterr().out
    assert done == 0, out
    doc = json.loads(result.read_text(encoding="utf-8"))
    assert [k["key"] for k in doc["knobs"]] == ["person.allow_spinning"]
    assert doc["candidates"] and out.startswith(report.table(doc))  # the same table
    tuning = yaml.safe_load(patch.read_text(encoding="utf-8"))["tuning"]
    assert tuning["models"]["person"]["allow_spinning"] == doc["best"]["person.allow_spinning"]


def test_a_stream_without_results_after_the_warm_up_is_named(
    tune_setup: TuneSetup, tmp_path: Path
) -> None:
    doc = yaml.safe_load(tune_setup.config.read_text(encoding="utf-8"))
    doc["streams"] = [{"id": "nowhere", "workflow": "blur.yaml",
                       "source": {"url": "rtsp://127.0.0.1:9/none"}}]  # fmt: skip
    tune_setup.config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    patch = tmp_path / "p.yaml"
    done = run_tune(tune_setup.config, "--warmup", "1", "--write", str(patch), timeout=50)
    err = done.stderr
    assert done.returncode == 1, err
    assert "stream 'nowhere' had no result in the 1 s warm-up" in err
    assert not patch.exists()


def test_an_invalid_config_is_named_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("streams:\n  - id: cam\n    workflow: missing.yaml\n", encoding="utf-8")
    assert main(["tune", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"error: {config}: 1 problem(s)\n  streams[0].source: Field required" in err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("45", 45.0), ("2.5m", 150.0)],
)
def test_a_budget_is_seconds_minutes_or_hours(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "10x"], "argument --budget: '10x': a duration such as 90s"),
        (["--budget", "0"], "argument --budget: '0'"),
        (["--knob", "batch=1"], "argument --knob: unknown knob 'batch'"),
        (["--window", "-1"], "argument --window: '-1': must be more than 0"),
    ],
)
def test_bad_options_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["tune", "--config", "x.yaml", *args])
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_tune_without_a_config_or_url_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tune"]) == 2
    assert "--config FILE is required" in capsys.readouterr().err


def test_an_slo_with_the_latency_objective_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tune", "--config", "x.yaml", "--objective", "latency", "--slo-ms", "100"]) == 2
    assert "--slo-ms is the fps objective's bound" in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_line_rewritten_on_a_terminal_and_a_line_each_otherwise() -> None:
    steps = [{"current": "best so far", "windows": 0, "windows_left": 3, "elapsed_s": 0.0,
              "remaining_s": 21.0, "best": {}},
             {"current": "faces.max_batch_size=1", "windows": 1, "windows_left": 2,
              "elapsed_s": 75.2, "remaining_s": 14.0, "best": {}}]  # fmt: skip
    terminal, log = Terminal(), io.StringIO()
    for out in (terminal, log):
        show = ProgressLine(out)
        for step in steps:
            show(step)
        show.end()
    first = "tune: best so far  0/3 windows  0:00 elapsed, ~0:21 left"
    second = "tune: faces.max_batch_size=1  1/3 windows  1:15 elapsed, ~0:14 left"
    assert log.getvalue() == f"{first}\n{second}\n"
    assert terminal.getvalue() == f"\r{first}\r{second}\n"
