"""`make test-quick`: every test that starts no real part, and a guard that keeps it so.

A test is `live` when it starts a real part: a process (`appliance serve`, mosquitto, the
GStreamer camera, Chromium, a CLI run), a server on a socket (the in-process LiveServer,
a webhook receiver, a camera on a thread), or a runtime that plays video in real time.
`make test-quick` runs the others (`-m "not live"`); `make test` runs them all.

Which tests are live is decided here, in one place:
- LIVE_FIXTURES: the fixtures that start a real part. A test that takes one, directly or
  through other fixtures (pytest's closure of its fixture names), is live.
- LIVE_TESTS: the modules and tests that start one inline, without such a fixture.
- tests marked `rtsp` (they need the GStreamer RTSP camera).

Under APPLIANCE_TEST_QUICK=1 (set by `make test-quick` only), every test not marked live
runs under a guard: starting a process (subprocess, os.fork, os.posix_spawn, os.system,
multiprocessing) or listening on a socket fails it, naming what it started, so that a
test added later that starts a server cannot slip into the quick loop. The guard is on
during the test's setup, call and teardown only: pytest-xdist's workers (execnet) are
started before any test runs, by the controller, which never runs a test.
"""

from __future__ import annotations

import gc
import multiprocessing.process
import multiprocessing.util
import os
import shlex
import socket
import subprocess
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

QUICK_ENV = "APPLIANCE_TEST_QUICK"
ROOT = Path(__file__).resolve().parents[2]
HERE = "tests/support/quick.py"

# Fixtures that start a real part, as "defining file::name" (a name alone is ambiguous:
# `served`, `server`, `runtime` are each several modules' own). What each starts:
LIVE_FIXTURES: dict[str, str] = {
    # Shared (tests/support, conftests)
    "tests/support/rtsp.py::_gst_rtsp_available": "Debian's python3 probing GStreamer",
    "tests/support/rtsp.py::rtsp_server": "the GStreamer RTSP camera process",
    "tests/support/appliance.py::serve": "`appliance serve` processes",
    "tests/support/appliance.py::runtimes": "in-process runtimes playing clips in real time",
    "tests/server/conftest.py::live_server": "LiveServer: the API on a port and its runtime",
    "tests/server/conftest.py::module_server": "LiveServer, one a module",
    "tests/server/conftest.py::chromium": "Chromium, driven by Playwright",
    "tests/sinks/conftest.py::start_broker": "mosquitto processes",
    "tests/sinks/conftest.py::broker": "mosquitto, one a module (security's conftest too)",
    "tests/faults/conftest.py::broker": "mosquitto",
    "tests/state/conftest.py::boot": "runtimes on a state folder, clips in real time",
    "tests/tune/conftest.py::start_runtime": "a runtime, two cameras in real time",
    "tests/watch/conftest.py::learned": "mosquitto, a webhook receiver, a watched runtime",
    "tests/watch/conftest.py::runtimes": "runtimes with a watch, clips in real time",
    # A module's own
    "tests/client/test_cli_client.py::served": "`appliance serve`",
    "tests/client/test_client.py::served": "`appliance serve`",
    "tests/client/test_profile_cli.py::served": "`appliance serve`",
    "tests/client/test_regressions_cli.py::served": "`appliance serve`",
    "tests/client/test_webhook_receiver.py::docs_receiver": "an aiohttp receiver on a port",
    "tests/deploy/test_monitoring.py::appliance": "LiveServer",
    "tests/deploy/test_monitoring.py::prometheus": "a Prometheus process",
    "tests/faults/test_cameras.py::appliance": "LiveServer",
    "tests/faults/test_sinks.py::start_runtime": "a runtime, a clip in real time",
    "tests/profiling/test_gpu_stages.py::cpu_window": "a runtime, the demo in real time",
    "tests/profiling/test_slowest_live.py::server": "LiveServer",
    "tests/profiling/test_windows.py::runtime": "a runtime, the demo in real time",
    "tests/security/test_api_tls.py::served": "`appliance serve` over TLS",
    "tests/security/test_api_tls.py::swapping": "`appliance serve` over TLS",
    "tests/security/test_audit.py::served": "`appliance serve` with an MQTT sink",
    "tests/security/test_camera_redirects.py::servers": "HTTP cameras on ports",
    "tests/security/test_camera_tls.py::cameras": "TLS cameras on ports",
    "tests/security/test_cross_site.py::chromium": "Chromium, driven by Playwright",
    "tests/security/test_cross_site.py::elsewhere": "a page's HTTP server",
    "tests/security/test_cross_site.py::listed": "a page's HTTP server",
    "tests/security/test_cross_site.py::single": "`appliance serve`",
    "tests/security/test_cross_site.py::workers": "`appliance serve --workers 2`",
    "tests/security/test_cross_site.py::fleet": "a fleet gateway and its replicas",
    "tests/security/test_cross_site.py::target": "single, workers or fleet (by its parameter)",
    "tests/security/test_file_contents.py::site": "LiveServer",
    "tests/security/test_guarded_inputs.py::api": "LiveServer",
    "tests/security/test_mqtt_poison.py::appliance": "LiveServer",
    "tests/security/test_roles.py::deployment": "`appliance serve`, workers, a fleet",
    "tests/security/test_secret_files.py::setup": "LiveServer",
    "tests/security/test_secrets.py::secret_server": "LiveServer",
    "tests/security/test_source_urls.py::server": "LiveServer",
    "tests/security/test_supervision.py::start": "LiveServer",
    "tests/server/test_file_access.py::tree": "LiveServer",
    "tests/server/test_route_fanout.py::alive": "sleeper processes standing for workers",
    "tests/sinks/test_mqtt_command_trust.py::appliance": "LiveServer",
    "tests/sinks/test_outputs_mqtt.py::runtime": "a runtime, the demo in real time",
    "tests/sinks/test_outputs_webhook.py::start": "runtimes, the demo in real time",
    "tests/sources/test_clock_camera.py::clock_camera": "the clock camera process",
    "tests/sources/test_http_source.py::mjpeg_camera": "an MJPEG camera on a port",
    "tests/sources/test_urls.py::header_server": "an HTTP server on a port",
    "tests/state/test_durable_api.py::served": "LiveServers",
    "tests/test_cli.py::validated_demo": "`appliance validate`",
    "tests/test_cli.py::verbose_in_new_york": "`appliance -v validate`",
    "tests/test_fleet.py::fleet": "a fleet gateway and its replicas",
    "tests/test_outputs.py::runtime": "a runtime, two cameras in real time",
    "tests/test_reload_models.py::runtime": "a runtime, clips in real time",
    "tests/test_workers.py::two": "`appliance serve --workers 2`",
    "tests/tools/test_summarize_window.py::window_trace": "a runtime, the demo in real time",
    "tests/tools/test_trace_diff.py::runs": "two runtimes side by side, 60 frames each",
    "tests/tune/test_api.py::server": "LiveServer",
    "tests/tune/test_interrupt.py::on_starting": "a runtime, two cameras in real time",
}

# Tests that start a real part inline, without a fixture of LIVE_FIXTURES, by module: ALL
# for every test of it, else by name (each name with all its parameters). A CLI command is a
# process: the tests' `run_appliance` forks it from a warm server (tests/support/warm_cli.py)
# that listens on a Unix socket. What they start:
ALL = "*"
LIVE_TESTS: dict[str, dict[str, str]] = {
    "tests/client/test_cli_client.py": {ALL: "CLI commands"},
    "tests/client/test_client.py": {
        "test_an_error_body_of_another_shape_is_kept_as_the_message": "an HTTP proxy on a port",
    },
    "tests/client/test_profile_cli.py": {ALL: "CLI commands"},
    "tests/client/test_regressions_cli.py": {ALL: "`appliance serve`"},
    "tests/decoders/test_registry.py": {
        "test_decoder_modules_load_only_when_used": "a python (a fresh interpreter's imports)",
    },
    "tests/deploy/test_containers.py": {
        "test_docker_compose_accepts_the_stack": "docker",
        "test_the_compose_prometheus_config_is_valid": "promtool",
    },
    "tests/deploy/test_helm.py": {ALL: "helm (tests/.cache/helm)"},
    "tests/deploy/test_helm_fleet.py": {ALL: "helm"},
    "tests/deploy/test_monitoring.py": dict.fromkeys(
        ("test_prometheus_config", "test_rules_check", "test_rules_unit_tests"), "promtool"
    ),
    "tests/deploy/test_tls.py": {
        "test_a_public_certificate_needs_no_ca_key": "helm",
        "test_the_chart_with_a_tls_secret_serves_https_everywhere": "helm",
        "test_the_chart_without_a_tls_secret_serves_http": "helm",
        "test_the_charts_config_serves_the_secrets_files": "helm",
        "test_the_compose_tls_prometheus_config_is_valid": "promtool",
    },
    "tests/faults/test_process.py": {ALL: "mosquitto, `appliance serve`"},
    "tests/profiling/test_inline_trace.py": {
        "test_a_window_places_operators_under_inline_runs": "a runtime, the demo in real time",
    },
    "tests/profiling/test_tracing.py": {
        "test_an_unwritable_trace_dir_stops_nothing": "the API on a port (aiohttp's TestServer)",
        # Measured: 3-4 CPU seconds each, the quick set's slowest after the shipped workflows
        "test_sampling_and_disabling": "two runtimes over the demo",
        "test_two_workflows_read_right_in_perfetto": "a runtime of three streams, two models",
    },
    "tests/security/test_api_tls.py": {ALL: "`appliance serve` over TLS"},
    "tests/security/test_camera_tls.py": {ALL: "TLS cameras on ports"},
    "tests/security/test_insecure.py": {
        "test_an_insecure_server_warns_at_start_and_ready_says_so": "LiveServer",
    },
    "tests/security/test_reader_disconnects.py": {ALL: "`appliance serve`"},
    "tests/security/test_shutdown.py": {ALL: "`appliance serve`"},
    "tests/security/test_tls_files.py": {
        "test_doctor_prints_it": "`appliance doctor`",
        "test_a_listener_that_cannot_listen_watches_no_files": "LiveServer",
    },
    "tests/server/test_allowed_hosts.py": {
        "test_an_address_outside_the_list_is_refused_from_the_config": "LiveServer",
    },
    "tests/server/test_auth.py": {
        "test_a_port_in_use_is_reported_as_a_config_error": "LiveServer",
        "test_serve_refuses_an_exposed_bind_without_a_token": "`appliance serve`",
    },
    "tests/server/test_file_access.py": {
        "test_the_reproductions_are_refused_with_the_rule": "LiveServer",
    },
    "tests/sinks/test_webhook.py": dict.fromkeys(
        (
            "test_deliveries_carry_body_ids_and_a_valid_signature",
            "test_500s_then_recovery_deliver_once_with_the_same_id",
            "test_429_retry_after_is_honoured",
            "test_a_verifying_receiver_takes_signed_deliveries_and_refuses_a_wrong_key",
            "test_a_delivery_replayed_after_the_tolerance_is_refused",
            "test_a_body_moved_under_another_delivery_id_is_refused",
            "test_a_retry_is_signed_afresh_with_the_same_id",
            "test_a_400_is_dead_lettered_at_once_with_the_answer",
            "test_exhausted_retries_are_dead_lettered_with_the_last_error",
            "test_a_hanging_endpoint_keeps_offer_cheap_and_the_queue_bounded",
            "test_a_receiver_that_is_down_then_up_gets_the_delivery",
            "test_stop_drains_what_is_queued",
        ),
        "a webhook receiver on a port",
    ),
    "tests/sources/test_file_source.py": {
        "test_realtime_file_gives_a_slow_consumer_the_newest_frame": "a clip in real time, 2 s",
    },
    "tests/sources/test_rtsp_connection.py": {ALL: "an RTSP camera on a port"},
    "tests/state/test_sealed_credentials.py": {ALL: "LiveServers, the RTSP camera"},
    "tests/state/test_sealed_fleet.py": {
        "test_the_gateway_refuses_a_camera_with_credentials_without_a_key": "LiveServers",
    },
    "tests/test_cli.py": {ALL: "CLI commands"},  # but one test: QUICK_TESTS
    "tests/test_headless.py": {ALL: "`appliance run`"},
    "tests/test_layers.py": {
        "test_the_cli_starts_without_the_heavy_analysis_libraries": "a python",
    },
    "tests/test_run_source.py": {ALL: "`appliance run`"},
    "tests/test_sharding.py": dict.fromkeys(
        (
            "test_the_same_assignment_in_another_process",
            "test_owner_of_is_the_highest_weight_and_stable_across_processes",
        ),
        "a python",
    ),
    # Measured: 20 CPU seconds, a sixth of the rest of the quick set together
    "tests/test_shipped_workflows.py": {ALL: "the runtime over whole clips, every frame"},
    "tests/watch/test_load_live.py": {ALL: "a runtime, three cameras in real time and fast"},
    "tests/test_workers.py": {
        "test_a_port_in_use_starts_no_worker": "a listener, `appliance serve`",
    },
    "tests/test_workers_readers.py": {ALL: "`appliance serve --workers`"},
    "tests/tools/test_model_compare.py": {
        "test_the_cli_prints_one_table_or_one_json_object": "`appliance model compare`",
    },
    "tests/tools/test_model_fetch.py": {ALL: "`appliance model fetch`"},
    "tests/tune/test_api.py": {ALL: "LiveServers"},
    "tests/tune/test_cli.py": {
        "test_a_running_appliance_is_tuned_with_the_same_report": "LiveServer, `tune --url`",
        "test_a_signal_while_the_tune_waits_on_its_stop_flag_stops_it": "a python",
        "test_a_stream_without_results_after_the_warm_up_is_named": "`appliance tune`",
        "test_a_tune_reports_and_writes_its_winner": "`appliance tune`",
        "test_ctrl_c_mid_tune_restores_and_writes_nothing": "`appliance tune`",
    },
}

# Tests of a module LIVE_TESTS names whole that start nothing: they stay quick.
QUICK_TESTS: dict[str, dict[str, str]] = {
    "tests/test_cli.py": {
        "test_doctor_reads_a_gpus_memory_in_mib_and_its_utilisation": "nvidia-smi's text parsed",
    },
}


def _fixture_key(fixturedef: Any) -> str:
    path = Path(fixturedef.func.__code__.co_filename).resolve()
    try:
        where = path.relative_to(ROOT).as_posix()
    except ValueError:  # a plugin's fixture (tmp_path, monkeypatch): never live
        where = str(path)
    return f"{where}::{fixturedef.argname}"


def _listed(item: pytest.Item, table: dict[str, dict[str, str]]) -> str | None:
    """What `table` says `item` starts: its module's entry or its own, else None."""
    tests = table.get(item.nodeid.partition("::")[0], {})
    name = getattr(item, "originalname", item.name)  # without its parameters
    return tests.get(name, tests.get(ALL))


def live_reason(item: pytest.Item) -> str | None:
    """What makes `item` live, or None."""
    if item.get_closest_marker("live") is not None:
        return "marked live"
    if item.get_closest_marker("rtsp") is not None:
        return "marked rtsp: the GStreamer RTSP camera"
    inline = _listed(item, LIVE_TESTS)
    if inline is not None and _listed(item, QUICK_TESTS) is None:
        return inline
    if not isinstance(item, pytest.Function):
        return None
    # fixturenames: every fixture the test takes, through other fixtures too; each name's
    # definitions, the overridden ones included (an override may take the one it hides).
    definitions = item._fixtureinfo.name2fixturedefs
    for name in item.fixturenames:
        for fixturedef in definitions.get(name, ()):
            key = _fixture_key(fixturedef)
            if key in LIVE_FIXTURES:
                return f"{key}: {LIVE_FIXTURES[key]}"
    return None


def stale_entries() -> list[str]:
    """Entries of the tables that name no fixture or test any more (renamed, removed)."""
    named = [key.partition("::") for key in LIVE_FIXTURES]
    for table in (LIVE_TESTS, QUICK_TESTS):
        named += [(path, "::", name) for path, tests in table.items() for name in tests]
    stale = []
    for path, _, name in named:
        file = ROOT / path
        if not file.is_file() or (name != ALL and f"def {name}(" not in file.read_text("utf-8")):
            stale.append(f"{path}::{name}")
    return stale


@pytest.hookimpl(tryfirst=True)  # before `-m "not live"` deselects (pytest's mark plugin)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("live") is None and live_reason(item) is not None:
            item.add_marker(pytest.mark.live)


def pytest_configure(config: pytest.Config) -> None:
    # A stale LIVE entry lets its test into the quick run, where the guard stops it; a stale
    # QUICK_TESTS entry would drop its test from it unseen. Checked for `make test-quick`
    # only: a test renamed elsewhere must not stop everyone's other runs.
    stale = stale_entries() if os.environ.get(QUICK_ENV) == "1" else []
    if stale:
        raise pytest.UsageError(f"{HERE} names what no longer exists: {', '.join(stale)}")


# -- the guard ------------------------------------------------------------------------


class LiveTestError(RuntimeError):
    """A test not marked live started a process or listened on a socket."""


def _argv(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args)
    return shlex.join(os.fsdecode(a) for a in args)


def _address(sock: socket.socket) -> str:
    try:
        name = sock.getsockname()
    except OSError:
        return "a socket"
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    return os.fsdecode(name) or "an unnamed socket"


@dataclass
class Guard:
    """While installed, refuses every process start and socket listen in this process
    (any thread: a server thread's listen is the test's), and keeps what it refused."""

    nodeid: str
    refused: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list)

    def refuse(self, what: str) -> NoReturn:
        message = f"{self.nodeid} {what}: a live test — mark it in {HERE}"
        self.refused.append(message)
        raise LiveTestError(message)

    def install(self) -> None:
        guard = self

        def execute_child(popen: Any, args: Any, *rest: Any, **kw: Any) -> NoReturn:
            guard.refuse(f"starts a process ({_argv(args)})")

        def fork(*args: Any, **kw: Any) -> NoReturn:
            guard.refuse("starts a process (os.fork)")

        def spawn(path: Any, argv: Any, *args: Any, **kw: Any) -> NoReturn:
            guard.refuse(f"starts a process ({_argv(argv)})")

        def system(command: Any) -> NoReturn:
            guard.refuse(f"starts a process ({_argv(command)})")

        def process_start(process: Any) -> NoReturn:
            guard.refuse(f"starts a process (multiprocessing: {process.name})")

        def listen(sock: socket.socket, *args: Any) -> NoReturn:
            guard.refuse(f"listens on {_address(sock)}")

        self._patch(subprocess.Popen, "_execute_child", execute_child)
        for name in ("fork", "forkpty"):
            self._patch(os, name, fork)
        for name in ("posix_spawn", "posix_spawnp"):
            self._patch(os, name, spawn)
        self._patch(os, "system", system)
        self._patch(multiprocessing.process.BaseProcess, "start", process_start)
        self._patch(multiprocessing.util, "spawnv_passfds", spawn)
        self._patch(socket.socket, "listen", listen)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        # socket.socket inherits listen from _socket.socket: shadowed here, then removed.
        if name in vars(owner):
            original = vars(owner)[name]
            self._undo.append(lambda: setattr(owner, name, original))
        else:
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, replacement)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    """A runtest phase (setup, call, teardown) under the guard; it fails with every refusal,
    whether the test saw the error or a thread of it swallowed it."""
    if os.environ.get(QUICK_ENV) != "1" or item.get_closest_marker("live") is not None:
        return (yield)
    guard = Guard(item.nodeid)
    try:
        guard.install()
        result = yield
    except BaseException:
        if not guard.refused:
            raise
        result = None
    finally:
        guard.uninstall()
    if guard.refused:
        # What the refused start left half made (a temporary folder, a pipe) is collected
        # now, its ResourceWarning this test's rather than a later one's.
        gc.collect()
        pytest.fail("\n".join(dict.fromkeys(guard.refused)), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    return (yield from _guarded(item))
