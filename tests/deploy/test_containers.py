"""The images and the compose stack, checked statically (Docker cannot run here): pinned
bases, a non-root user, a health check, exec-form commands, a build context without the
repository's weight, a compose file whose services are pinned and whose mounted files
exist, and the appliance configs they carry valid by the appliance's own loader. With the
compose plugin installed, `docker compose config` must accept the stack too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "deploy/docker/Dockerfile", ROOT / "deploy/docker/Dockerfile.gpu"]
COMPOSE = ROOT / "deploy/compose/compose.yaml"
# A tag that names a version: digits, not `latest`, not a bare major like `3`.
PINNED_TAG = re.compile(r":(?!latest\b)[\w.-]*\d+\.\d+[\w.-]*$")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def base_images(steps: list[tuple[str, str]]) -> list[str]:
    """Every FROM's image, ARG defaults substituted; stage names are not images."""
    args = {}
    for word, rest in steps:
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value
    stages: set[str] = set()
    images = []
    for word, rest in steps:
        if word != "FROM":
            continue
        parts = rest.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
        if image not in stages:
            images.append(image)
        if len(parts) == 3 and parts[1].upper() == "AS":
            stages.add(parts[2])
    return images


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_a_dockerfile_follows_the_rules(path: Path) -> None:
    steps = instructions(path)
    images = base_images(steps)
    assert images, "no FROM"
    for image in images:
        assert PINNED_TAG.search(image), f"{path.name}: base image not pinned: {image}"
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users, f"{path.name}: the final stage runs as root"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]
    assert any(word == "HEALTHCHECK" for word, _ in final), f"{path.name}: no HEALTHCHECK"
    for word, rest in final:
        if word in ("CMD", "ENTRYPOINT") or (word == "HEALTHCHECK" and "CMD" in rest):
            command = rest.split("CMD", 1)[1].strip() if word == "HEALTHCHECK" else rest
            assert isinstance(json.loads(command), list), f"{path.name}: {word} not exec form"
    for word, rest in steps:
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source}: not in the repo"


def test_the_build_context_leaves_out_what_the_images_do_not_need() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for heavy in (".git", ".venv", "tests", "bench", "traces"):
        assert heavy in ignored, heavy
    copied = {s for p in DOCKERFILES for w, r in instructions(p) if w == "COPY"
              for s in r.split()[:-1] if not s.startswith("--")}  # fmt: skip
    assert not copied & ignored, copied & ignored  # nothing the images copy is ignored


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def test_the_compose_stack_is_pinned_and_its_files_exist() -> None:
    services = compose()["services"]
    assert {"appliance", "mosquitto", "camera", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        image = service.get("image", "")
        if "build" in service:
            dockerfile = (
                COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]
            )
            assert dockerfile.is_file(), dockerfile
        else:
            assert PINNED_TAG.search(image), f"{name}: image not pinned: {image}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):  # a file of the repository, not a named volume
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} missing"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} published beyond loopback"
    appliance = services["appliance"]
    assert appliance["read_only"] is True
    assert "APPLIANCE_API_TOKEN" in appliance["environment"]


@pytest.mark.parametrize(
    "config",
    [ROOT / "deploy/docker/appliance.yaml", ROOT / "deploy/compose/appliance.yaml"],
    ids=["image", "compose"],
)
def test_the_shipped_configs_are_valid(config: Path) -> None:
    """Valid by the appliance's own loader, the image's paths read from this checkout
    (the image copies configs/ to /opt/appliance/configs): the workflows they name load."""
    text = config.read_text().replace("/opt/appliance/configs", str(ROOT / "configs"))
    parsed = parse_config(yaml.safe_load(text), config.parent)  # raises with every problem
    assert parsed.server.host == "0.0.0.0" and parsed.server.token is None  # from the env
    assert str(parsed.profiling.dir).startswith("/var/lib/appliance/traces")


def compose_plugin() -> str | None:
    """The docker CLI, if it has the compose plugin."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
    return docker if probe.returncode == 0 else None


def test_docker_compose_accepts_the_stack() -> None:
    docker = compose_plugin()
    if docker is None:
        pytest.skip("no docker compose plugin here: the checks above stand in for it")
    env = {"APPLIANCE_API_TOKEN": "x", "GRAFANA_ADMIN_PASSWORD": "x", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_compose_prometheus_config_is_valid(tmp_path: Path) -> None:
    """As the stack mounts it: its config beside the shared rules (promtool checks both)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: run sh tests/install_deps.sh")
    shutil.copy(COMPOSE.parent / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(ROOT / "deploy/prometheus/rules.yml", tmp_path / "rules.yml")
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def owned_by_the_user(path: Path) -> set[str]:
    """The folders a Dockerfile's RUN steps hand to uid 10001 (`chown 10001:10001 ...`)."""
    owned: set[str] = set()
    for word, rest in instructions(path):
        for step in rest.split("&&") if word == "RUN" else []:
            command = step.split()
            if command[:2] == ["chown", "10001:10001"]:
                owned.update(command[2:])
    return owned


def test_the_compose_prometheus_keeps_exemplars() -> None:
    """Exemplar storage on (docs/exemplars.md), with the image's own config and storage
    flags kept (a `command` replaces the image's whole CMD); no override file drops it,
    and Grafana's exemplar links get the appliance's published address."""
    services = compose()["services"]
    command = services["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in command
    assert "--config.file=/etc/prometheus/prometheus.yml" in command
    assert "--storage.tsdb.path=/prometheus" in command
    mounts = [v.split(":")[1] for v in services["prometheus"]["volumes"]]
    assert "/etc/prometheus/prometheus.yml" in mounts
    tls: dict[str, Any] = yaml.safe_load((COMPOSE.parent / "compose.tls.yaml").read_text())
    for name, service in tls["services"].items():
        assert (
            "command" not in service or "--enable-feature=exemplar-storage" in service["command"]
        ), name
    (port,) = services["appliance"]["ports"]
    published = port.split(":")[1]  # 127.0.0.1:HOST:CONTAINER
    env = services["grafana"]["environment"]
    assert env["APPLIANCE_URL"] == f"${{APPLIANCE_URL:-http://localhost:{published}}}"
    assert tls["services"]["grafana"]["environment"]["APPLIANCE_URL"].endswith(
        f"https://localhost:{published}}}"
    )


def test_the_compose_appliance_keeps_its_state_on_a_volume() -> None:
    """Its server.state_dir is a named volume, and the images make that folder the
    appliance user's: a fresh named volume takes the owner of the folder it is mounted on,
    and the root filesystem is read-only."""
    text = (COMPOSE.parent / "appliance.yaml").read_text()
    text = text.replace("/opt/appliance/configs", str(ROOT / "configs"))
    state_dir = str(parse_config(yaml.safe_load(text), COMPOSE.parent).server.state_dir)
    doc = compose()
    volumes = [v.split(":") for v in doc["services"]["appliance"]["volumes"]]
    (name,) = [source for source, target, *_ in volumes if target == state_dir]
    assert name in doc["volumes"], f"{name}: not a named volume"
    for path in DOCKERFILES:
        assert state_dir in owned_by_the_user(path), f"{path.name}: {state_dir} is root's"
