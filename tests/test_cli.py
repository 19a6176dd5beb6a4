"""`appliance run` and `appliance validate` as a user runs them: real processes, real
models, real H.264 video; bad input gets a located message and exit code 1."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.models.session import provider_problem
from tests.support.appliance import (
    APPLIANCE,
    DEMO_CLIP,
    ROOT,
    clean_env,
    detect_workflow,
    person_model,
)
from tests.support.media import MakeClip
from tests.support.warm_cli import run_appliance

WriteConfig = Callable[[dict[str, Any]], Path]
DEMO = str(ROOT / "configs" / "demo.yaml")


def appliance(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m appliance ARGS`, its output captured (tests/support/warm_cli.py)."""
    return run_appliance(args, timeout=timeout)


def file_stream(stream_id: str, url: str, **source: Any) -> dict[str, Any]:
    return {
        "id": stream_id,
        "source": {"url": url, "pace": "fast", "loop": False, **source},
        "workflow": detect_workflow(),
    }


@pytest.fixture(scope="module")
def validated_demo() -> subprocess.CompletedProcess[str]:
    """`appliance validate configs/demo.yaml`, plain: run once, read by several tests
    (each call loads both of the demo's models)."""
    return appliance("validate", DEMO)


@pytest.fixture(scope="module")
def verbose_in_new_york() -> tuple[datetime, subprocess.CompletedProcess[str]]:
    """`appliance -v validate configs/demo.yaml` in a zone that is not UTC (UTC-5 or -4:
    a local stamp would be off), with the time just before it ran."""
    before = datetime.now(UTC)
    return before, run_appliance(["-v", "validate", DEMO], env=clean_env(TZ="America/New_York"))


def test_run_json_summarises_every_stream(write_config: WriteConfig) -> None:
    config = write_config(
        {
            "models": {"person": person_model()},
            "streams": [file_stream("a", str(DEMO_CLIP)), file_stream("b", str(DEMO_CLIP))],
        }
    )
    done = appliance("run", "--config", str(config), "--max-frames", "50", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # nothing else on stdout
    assert set(summary["streams"]) == {"a", "b"}
    for stream in summary["streams"].values():
        assert stream["frames_processed"] == 50
        assert stream["frames_dropped"] == 0  # pace: fast never drops
        assert stream["state"] == "stopped"
        assert stream["detections"] > 0  # the demo clip shows people in most frames
        assert stream["fps"] > 0
        assert 0 < stream["latency_ms"]["p50"] <= stream["latency_ms"]["p99"]


def test_run_plays_a_whole_file_and_prints_a_table(
    write_config: WriteConfig, make_clip: MakeClip
) -> None:
    clip = make_clip(seconds=2.0)  # short: the whole file is played, not a --max-frames
    config = write_config(
        {"models": {"person": person_model()}, "streams": [file_stream("clip", str(clip))]}
    )
    done = appliance("run", "--config", str(config))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["stream", "state", "processed", "dropped"]
    row = lines[1].split()
    assert row[:4] == ["clip", "stopped", "60", "0"]  # every frame of the 2 s, 30 fps clip


def test_a_corrupt_file_fails_its_stream_only(write_config: WriteConfig, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40)
    config = write_config(
        {
            "models": {"person": person_model()},
            "streams": [file_stream("good", str(DEMO_CLIP)), file_stream("bad", str(corrupt))],
        }
    )
    done = appliance("run", "--config", str(config), "--max-frames", "20", "--json")
    assert done.returncode == 3, done.stderr  # a failed stream
    streams = json.loads(done.stdout)["streams"]
    assert streams["good"]["frames_processed"] == 20
    assert streams["bad"]["state"] == "failed"
    assert str(corrupt) in streams["bad"]["last_error"]


def test_invalid_config_lists_every_problem_and_starts_nothing(write_config: WriteConfig) -> None:
    config = write_config(
        {
            "server": {"port": "eighty"},
            "models": {"person": {**person_model(), "decoder": "ssd"}},
            "streams": [
                {"id": "a", "source": {"url": ""}, "workflow": "missing.yaml"},
                {"id": "b", "source": "rtmp://cam/live", "workflow": "missing.yaml"},
            ],
        }
    )
    done = appliance("run", "--config", str(config))
    assert done.returncode == 1
    assert done.stdout == ""
    err = done.stderr
    assert "4 problem(s)" in err
    assert "server.port:" in err
    known = "centerface, dbnet, tf_od, yolo"
    assert f"models.person.decoder: unknown decoder (known: {known}) (got 'ssd')" in err
    assert "streams[0].source.url: must not be empty" in err
    # Not "file not found": a URL of a kind no reader takes is named as such.
    assert "streams[1].source.url: unsupported URL scheme 'rtmp' (supported: rtsp," in err


def test_missing_files_are_named(write_config: WriteConfig) -> None:
    config = write_config(
        {
            "models": {"person": {**person_model(), "path": "nowhere/model.onnx"}},
            "streams": [{"id": "a", "source": str(DEMO_CLIP), "workflow": "flows/none.yaml"}],
        }
    )
    done = appliance("validate", str(config))
    assert done.returncode == 1
    assert "models.person.path: file not found:" in done.stderr
    assert "nowhere/model.onnx" in done.stderr
    assert "streams[0].workflow: file not found: flows/none.yaml" in done.stderr


def test_a_file_that_is_not_onnx_is_named(write_config: WriteConfig, tmp_path: Path) -> None:
    fake = tmp_path / "fake.onnx"
    fake.write_text("not a model")
    config = write_config({"models": {"person": {**person_model(), "path": str(fake)}}})
    done = appliance("validate", str(config))
    assert done.returncode == 1
    assert f"not a valid ONNX model: {fake}" in done.stderr


def test_a_workflow_that_does_not_compile_names_stream_and_block(
    write_config: WriteConfig,
) -> None:
    bad = detect_workflow(model="persn")
    config = write_config(
        {
            "models": {"person": person_model()},
            "streams": [{"id": "a", "source": str(DEMO_CLIP), "workflow": bad}],
        }
    )
    done = appliance("run", "--config", str(config))
    assert done.returncode == 1
    assert "streams[0].workflow" in done.stderr
    assert "blocks[0].model: unknown model 'persn' (models: person)" in done.stderr


def test_a_decoder_that_does_not_fit_the_model_is_a_compile_error(
    write_config: WriteConfig,
) -> None:
    faces = {**person_model(), "path": str(ROOT / "configs/models/centerface.onnx")}
    config = write_config(
        {
            "models": {"faces": faces},  # CenterFace declared as a TF-OD model
            "streams": [
                {"id": "a", "source": str(DEMO_CLIP), "workflow": detect_workflow("faces")}
            ],
        }
    )
    done = appliance("validate", str(config))
    assert done.returncode == 1
    assert "blocks[0]: model 'faces'" in done.stderr
    assert "tf_od" in done.stderr


def test_every_problem_of_a_config_is_reported_in_one_run(
    write_config: WriteConfig, tmp_path: Path
) -> None:
    """A value, a file, a model and a workflow, each wrong on its own: all four named in
    the first run, by `validate` and by a start alike; nothing twice, no follow-ons."""
    fake = tmp_path / "fake.onnx"
    fake.write_text("not a model")
    misspelt = detect_workflow()
    misspelt["blocks"][0]["confidance"] = 0.5
    flow = tmp_path / "misspelt.yaml"
    flow.write_text(yaml.safe_dump({**misspelt, "models": {"person": person_model()}}))
    config = write_config(
        {
            "models": {"broken": {**person_model(), "path": str(fake)}},
            "streams": [
                {
                    "id": "a",
                    "source": {"url": str(DEMO_CLIP), "pace": "slow"},
                    "workflow": str(flow),
                },
                {"id": "b", "source": str(DEMO_CLIP), "workflow": "missing.yaml"},
                # Uses the model that does not load: its failure is the model's, said once.
                {"id": "c", "source": str(DEMO_CLIP), "workflow": detect_workflow("broken")},
            ],
        }
    )
    for command in ("validate", "run"):
        done = appliance(command, *(["--config"] if command == "run" else []), str(config))
        assert done.returncode == 1, done.stderr
        problems = [line.strip() for line in done.stderr.splitlines() if line.startswith("  ")]
        assert problems == [
            "streams[0].source.pace: Input should be 'realtime' or 'fast' (got 'slow')",
            "streams[1].workflow: file not found: missing.yaml",
            f"models.broken: not a valid ONNX model: {fake}: Protobuf parsing failed.",
            f"streams[0].workflow ({flow}): workflow 'detect_person': "
            "blocks[0].confidance: unknown parameter (did you mean 'confidence'?)",
        ], done.stderr
        assert f"error: {config}: 4 problem(s)" in done.stderr


def test_a_workflow_file_is_named_by_its_path_alone(tmp_path: Path) -> None:
    broken = detect_workflow()
    broken["blocks"] = [{"id": "people", "type": "detct", "model": "person"},
                        {"id": "tracks", "type": "track", "detections": "people"}]  # fmt: skip
    broken["outputs"] = {"tracks": "tracks"}
    flow = tmp_path / "flow.yaml"
    flow.write_text(yaml.safe_dump({**broken, "models": {"person": person_model()}}))
    done = appliance("validate", str(flow))
    assert done.returncode == 1
    # The root cause once: nothing about `tracks` reading a block that could not be built.
    assert done.stderr.splitlines() == [
        f"error: {flow}: workflow 'detect_person': 1 problem(s)",
        "  blocks[0].type: unknown block type 'detct' (did you mean 'detect'?)",
    ]


def test_validate_accepts_the_demo_and_its_workflows(
    validated_demo: subprocess.CompletedProcess[str],
) -> None:
    done = validated_demo
    assert done.returncode == 0, done.stderr
    assert "valid config: 2 model(s), 2 stream(s)" in done.stdout
    assert "people-cam: workflow 'people_counter': 4 block(s)" in done.stdout
    for name in ("people_counter", "privacy_blur", "read_text"):
        flow = appliance("validate", str(ROOT / f"configs/workflows/{name}.yaml"))
        assert flow.returncode == 0, flow.stderr
        assert f"valid: workflow {name!r}" in flow.stdout


def test_validate_lists_the_sinks_with_their_targets_masked(write_config: WriteConfig) -> None:
    """Issue 30, item 8: the summary names each sink, its type, where it sends (a URL's
    credentials masked) and the streams whose outputs name it."""
    draw = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
            "outputs": {"video": "drawn"}}  # fmt: skip
    hook = "https://ops:hunter2@hooks.example.com/in?token=s3cret&site=7"
    config = write_config(
        {
            "sinks": {
                "events": {"type": "mqtt", "host": "broker.lan", "port": 8883},
                "alerts": {"type": "webhook", "url": hook},
            },
            "streams": [
                {
                    "id": "door",
                    "source": str(DEMO_CLIP),
                    "workflow": draw,
                    "outputs": [{"sink": "alerts"}],
                },
            ],
        }
    )
    done = appliance("validate", str(config))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("valid config: 0 model(s), 1 stream(s), 2 sink(s)"), lines
    assert lines[2:] == [  # in the config's order (the YAML written here sorts keys)
        "  sink alerts (webhook): https://***:***@hooks.example.com/in?token=***&site=7; "
        "streams: door",
        "  sink events (mqtt): broker broker.lan:8883, topics appliance/; streams: none "
        "(no stream's outputs name it)",
    ]
    assert "hunter2" not in done.stdout and "s3cret" not in done.stdout


def test_a_workflow_using_config_models_validates_with_that_config(
    write_config: WriteConfig, tmp_path: Path
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(yaml.safe_dump(detect_workflow()))
    alone = appliance("validate", str(flow))
    assert alone.returncode == 1
    assert "blocks[0].model: unknown model 'person' (models: none)" in alone.stderr
    config = write_config({"models": {"person": person_model()}})
    done = appliance("validate", str(flow), "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert (
        "valid: workflow 'detect_person': 1 block(s) [people:detect], outputs ['people']"
        in done.stdout
    )


def test_a_workflow_whose_own_model_does_not_load_still_names_its_other_problems(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "fake.onnx"
    fake.write_text("not a model")
    doc = detect_workflow()
    doc["blocks"][0]["confidance"] = 0.5
    doc["blocks"].append({"id": "drawn", "type": "annotate", "detections": "people"})
    doc["outputs"] = {"video": "drawn"}
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        yaml.safe_dump({**doc, "models": {"person": {**person_model(), "path": str(fake)}}})
    )
    done = appliance("validate", str(flow))
    assert done.returncode == 1
    # Both, in one run: the model, and the misspelt parameter of the block that names it.
    assert done.stderr.splitlines() == [
        f"error: {flow}: workflow 'detect_person': 2 problem(s)",
        f"  models.person: not a valid ONNX model: {fake}: Protobuf parsing failed.",
        "  blocks[0].confidance: unknown parameter (did you mean 'confidence'?)",
    ]


def test_a_workflow_is_not_valid_with_a_config_whose_model_does_not_load(
    write_config: WriteConfig, tmp_path: Path
) -> None:
    fake = tmp_path / "fake.onnx"
    fake.write_text("not a model")
    flow = tmp_path / "flow.yaml"
    flow.write_text(yaml.safe_dump(detect_workflow()))
    config = write_config({"models": {"person": {**person_model(), "path": str(fake)}}})
    done = appliance("validate", str(flow), "--config", str(config))
    assert done.returncode == 1
    assert done.stdout == ""  # no "valid" before the error
    # The model's failure, once: not also the block that names it.
    assert done.stderr.splitlines() == [
        f"error: models.person: not a valid ONNX model: {fake}: Protobuf parsing failed."
    ]


def test_one_model_id_declared_twice_differently_names_both_places(
    write_config: WriteConfig,
) -> None:
    faces_as_person = {**person_model(), "path": str(ROOT / "configs/models/centerface.onnx")}
    config = write_config(
        {
            "models": {"person": faces_as_person},
            "streams": [
                {
                    "id": "a",
                    "source": str(DEMO_CLIP),
                    "workflow": str(ROOT / "configs/workflows/people_counter.yaml"),
                }
            ],
        }
    )
    done = appliance("validate", str(config))
    assert done.returncode == 1
    assert "streams[0].workflow" in done.stderr
    assert "model 'person' is already declared differently at models.person" in done.stderr


def test_version_and_help_list_every_command() -> None:
    done = appliance("--version")
    assert done.returncode == 0 and done.stdout.strip() == "appliance 0.1.0"
    listed = appliance("--help").stdout
    for command in ("serve", "run", "validate", "blocks", "streams", "status", "profile",
                    "trace", "model", "doctor", "tune"):  # fmt: skip
        assert f"\n    {command} " in listed, command


def test_the_log_level_goes_after_the_command_too() -> None:
    """`--log-level` after the command wins over the default: ERROR silences the INFO
    and WARNING lines that validating the demo config logs."""
    loud = appliance("validate", DEMO, "--log-level", "DEBUG")
    quiet = appliance("validate", DEMO, "--log-level", "ERROR")
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr + quiet.stderr
    assert " DEBUG " in loud.stderr or " INFO " in loud.stderr
    assert quiet.stderr == ""
    assert quiet.stdout == loud.stdout  # the answer itself is the same
    assert appliance("validate", DEMO, "--log-level", "LOUD").returncode == 2


def test_v_and_q_move_the_level_before_or_after_the_command(
    write_config: WriteConfig,
    validated_demo: subprocess.CompletedProcess[str],
    verbose_in_new_york: tuple[datetime, subprocess.CompletedProcess[str]],
) -> None:
    """-v: INFO lines on a one-shot command (quiet by default); -q: errors only, also on
    a start that warns."""
    plain = validated_demo
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    # `-v validate DEMO` (run in another zone, which changes only the stamps) and
    # `validate DEMO --verbose`.
    for verbose in (verbose_in_new_york[1], appliance("validate", DEMO, "--verbose")):
        assert verbose.returncode == 0, verbose.stderr
        assert " INFO " in verbose.stderr and " DEBUG " not in verbose.stderr
    # A config that warns (a model that asks for CUDA, which this machine lacks) ...
    if provider_problem("cuda") is None:
        pytest.skip("CUDA loads here: asking for it is no warning")
    cuda = {**person_model(), "providers": ["cuda", "cpu"]}
    config = str(write_config({"models": {"person": cuda}}))
    assert " WARNING " in appliance("validate", config).stderr
    for args in (["-q", "validate", config], ["validate", config, "-q"]):
        quiet = appliance(*args)  # ... says nothing with -q, and its answer still
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
        assert "valid config: 1 model(s)" in quiet.stdout


def test_log_lines_are_stamped_in_utc_whatever_the_local_zone(
    verbose_in_new_york: tuple[datetime, subprocess.CompletedProcess[str]],
) -> None:
    """`2026-12-01T05:04:10.146Z`: ISO 8601 in UTC even where the machine's zone is not."""
    before, done = verbose_in_new_york
    assert done.returncode == 0, done.stderr
    stamp = done.stderr.split(" ", 1)[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), done.stderr
    assert abs((datetime.fromisoformat(stamp) - before).total_seconds()) < 60


def test_a_reader_that_leaves_early_is_not_an_error() -> None:
    """`appliance blocks | head -1`: the reader is gone before the listing is written
    (closed here before the command starts up): exit 0, no traceback."""
    proc = subprocess.Popen(
        [*APPLIANCE, "blocks"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # every write the command makes now fails with EPIPE
    with proc.stderr:
        errors = proc.stderr.read()
    assert proc.wait(60) == 0, errors
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors


def test_blocks_says_each_parameter_in_plain_words() -> None:
    """Allowed values, bounds and optional tuples read as words, not typing's reprs."""
    listing = appliance("blocks").stdout
    assert "  - color_by: one of 'track', 'class' = 'track'" in listing
    assert "  - input_size: (int >= 1, int >= 1) or none = None" in listing
    assert "  - kernel: int >= 3, <= 1001 or none = None" in listing
    assert "Literal" not in listing and "FieldInfo" not in listing and "Annotated" not in listing


def test_one_shot_commands_are_quiet_on_the_demo(
    validated_demo: subprocess.CompletedProcess[str],
) -> None:
    """A CPU-only machine, the shipped demo: `validate`, `run` and `model bench` print
    their answer and nothing else on stderr (no GPU warning nobody asked for, no INFO narration)."""
    checked = validated_demo
    assert checked.returncode == 0 and "valid config" in checked.stdout
    assert checked.stderr == ""
    ran = appliance("run", "--config", DEMO, "--max-frames", "3")
    assert ran.returncode == 0 and "people-cam" in ran.stdout
    assert ran.stderr == ""
    model = str(ROOT / "configs" / "models" / "person_ssdlite.onnx")
    bench = appliance("model", "bench", model, "--duration", "0.2", "--warmup", "1")
    assert bench.returncode == 0, bench.stderr
    # Only its progress (the shape it chose), no provider warning: it runs on what loads.
    assert [line.split(":")[0] for line in bench.stderr.splitlines()] == ["bench"]
    if provider_problem("cuda") is not None:
        assert "providers   CPUExecutionProvider (asked: CPUExecutionProvider)" in bench.stdout


def test_doctor_says_what_this_machine_offers() -> None:
    """Providers that really load (CPU always; a GPU provider's missing library named),
    the GPUs, FFmpeg's decoders; the same as JSON."""
    text = appliance("doctor")
    assert text.returncode == 0, text.stderr
    assert "  CPUExecutionProvider: ok" in text.stdout
    assert "decoders: " in text.stdout and "h264" in text.stdout
    report = json.loads(appliance("doctor", "--json").stdout)
    providers = report["onnxruntime"]["providers"]
    assert providers["CPUExecutionProvider"] is None
    for name, problem in providers.items():  # each compiled-in provider: ok, or why not
        assert problem is None or "not found" in problem or "no " in problem, (name, problem)
        assert f"  {name}: {problem or 'ok'}" in text.stdout
    assert "h264" in report["media"]["decoders"]
    assert report["packages"]["av"].startswith("18.")


def test_doctor_reports_the_gpus_or_plainly_why_there_are_none() -> None:
    """NVML's view: each GPU's memory and utilisation and the driver; on a machine
    without a driver (this one), the reason in one line, and no GPU invented."""
    from appliance.tools.doctor import gpus

    found = gpus()
    text = appliance("doctor").stdout
    if found["problem"] is None:
        assert found["driver"] and found["devices"]
        first = found["devices"][0]
        assert 0 < first["memory_used_mib"] <= first["memory_total_mib"]
        assert 0 <= first["utilization_percent"] <= 100
        assert f"gpus: driver {found['driver']}, {len(found['devices'])} found" in text
    else:
        assert found == {"problem": found["problem"], "driver": None, "devices": []}
        assert found["problem"].startswith(("no NVIDIA driver: ", "NVML unavailable: "))
        assert f"gpus: none seen ({found['problem']})" in text


class FakeNvml:
    """NVML's four calls `gpu_row` makes, answering as pynvml does for an H200."""

    class Memory:
        used, total = 1536 * 1024 * 1024, 143771 * 1024 * 1024  # bytes

    class Rates:
        gpu = 37  # percent

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802 (NVML's names)
        return 100 + index

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        assert handle == 101
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> type[FakeNvml.Memory]:  # noqa: N802
        return self.Memory

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> type[FakeNvml.Rates]:  # noqa: N802
        return self.Rates


def test_doctor_reads_a_gpus_memory_in_mib_and_its_utilisation() -> None:
    from appliance.tools.doctor import gpu_row

    assert gpu_row(FakeNvml(), 1) == {
        "index": 1,
        "name": "NVIDIA H200",
        "memory_used_mib": 1536,
        "memory_total_mib": 143771,
        "utilization_percent": 37,
    }


def test_doctor_with_a_config_says_which_decoder_each_stream_gets(
    write_config: WriteConfig,
) -> None:
    from appliance.sources.pyav import device_problem

    frames = {"name": "f", "blocks": [], "outputs": {"frame": "frame"}}
    config = write_config(
        {
            "streams": [
                {"id": "nvdec", "source": {"url": str(DEMO_CLIP), "decoder": {"hwaccel": "cuda"}},
                 "workflow": frames},
                {"id": "cpu", "source": {"url": str(DEMO_CLIP)}, "workflow": frames},
            ]
        }
    )  # fmt: skip
    done = appliance("doctor", "--json", "--config", str(config))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    cuda = device_problem("cuda", 0)
    assert report["media"]["cuda_decode"] == cuda
    assert "cuda" in report["media"]["hwaccel"]
    nvdec, cpu = report["streams"]
    assert cpu == {"id": "cpu", "hwaccel": "none", "decoder": "software", "problem": None}
    if cuda is None:
        assert nvdec == {"id": "nvdec", "hwaccel": "cuda", "decoder": "cuda", "problem": None}
    else:
        assert (nvdec["decoder"], nvdec["problem"]) == (
            "software",
            f"cuda requested: {cuda}; decoding in software",
        )
    text = appliance("doctor", "--config", str(config)).stdout
    assert "  stream cpu: hwaccel none -> software\n" in text


def test_doctor_refuses_a_config_it_cannot_read(write_config: WriteConfig) -> None:
    config = write_config({"streams": [{"id": "a", "source": {"url": str(DEMO_CLIP),
                           "decoder": {"hwaccel": "gpu"}}, "workflow": "x.yaml"}]})  # fmt: skip
    done = appliance("doctor", "--config", str(config))
    assert done.returncode == 1
    assert "streams[0].source.decoder.hwaccel: Input should be 'auto', 'cuda' or 'none'" in (
        done.stderr
    )


def test_a_workflow_whose_model_the_config_declares_hints_at_config(tmp_path: Path) -> None:
    """Validating a workflow file alone: a model it names but does not declare is unknown,
    and the hint says how to validate it with the config that declares it."""
    flow = tmp_path / "falls.yaml"
    flow.write_text(
        "name: falls\nblocks:\n  - {id: people, type: detect, model: person}\n"
        "outputs: {people: people}\n"
    )
    done = appliance("validate", str(flow))
    assert done.returncode == 1
    assert "unknown model 'person'" in done.stderr
    assert f"hint: a model the config declares (models:) is known with it: appliance " \
        f"validate {flow} --config CONFIG" in done.stderr  # fmt: skip
    config = tmp_path / "config.yaml"
    model = ROOT / "configs" / "models" / "person_ssdlite.onnx"
    config.write_text(f"models:\n  person: {{path: {model}, decoder: tf_od}}\n")
    with_config = appliance("validate", str(flow), "--config", str(config))
    assert with_config.returncode == 0, with_config.stderr
