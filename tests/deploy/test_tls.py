"""The API over TLS as the deployments give it (docs/deploy.md, "TLS"): the chart with
`tls.secretName` (a kubernetes.io/tls Secret mounted in every pod, server.tls set, the
probes, the gateway's calls to the replicas and the ServiceMonitor over https), and the
compose stack's optional override. The rendered config is loaded, and its files served,
by the appliance's own code, from a certificate made here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from appliance.cli.main import _parser
from appliance.config import load_config, parse_config
from appliance.server.tls import ApiTls
from tests.deploy.test_helm import KUBERNETES, ROOT, one
from tests.deploy.test_helm_fleet import NAMESPACE, chart_etc, container, flag, fleet
from tests.support.tls import TestCA

Doc = dict[str, Any]
MOUNT = "/etc/appliance-tls"
COMPOSE = ROOT / "deploy/compose"
TLS_SET = "tls.secretName=cams-tls"


def volume_of(workload: Doc, name: str) -> Doc:
    volumes: list[Doc] = workload["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == name]
    return volume


def probes(workload: Doc) -> list[Doc]:
    c = container(workload)
    return [c[p]["httpGet"] for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in c]


def test_the_chart_with_a_tls_secret_serves_https_everywhere(tmp_path: Path) -> None:
    docs = fleet(tmp_path, 3, TLS_SET, "serviceMonitor.enabled=true")
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":  # a CRD: not among Kubernetes' own schemas
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    for workload in (one(docs, "StatefulSet"), one(docs, "Deployment")):
        assert volume_of(workload, "tls")["secret"]["secretName"] == "cams-tls"
        mount = {m["name"]: m for m in container(workload)["volumeMounts"]}["tls"]
        assert mount == {"name": "tls", "mountPath": MOUNT, "readOnly": True}
        assert {p["scheme"] for p in probes(workload)} == {"HTTPS"}
    args = container(one(docs, "Deployment"))["args"]
    assert flag(args, "--replica-ca") == f"{MOUNT}/ca.crt"
    parsed = _parser().parse_args(args)  # what the gateway container runs parses
    assert [a.https for a in parsed.replicas] == [True] * 3
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "cams-tls", "key": "ca.crt"}},
        "serverName": f"cams-appliance.{NAMESPACE}.svc",  # the name every pod's cert has
    }


def test_the_charts_config_serves_the_secrets_files(tmp_path: Path) -> None:
    """The ConfigMap's server.tls names the Secret's keys as mounted: a kubernetes.io/tls
    Secret's tls.crt and tls.key, laid out here and loaded as the server loads them."""
    docs = fleet(tmp_path, 1, TLS_SET)
    etc = tmp_path / "etc"
    chart_etc(docs, etc)  # /etc/appliance... read from here: the mount is <etc>-tls
    secret = Path(f"{etc}-tls")
    issued = TestCA().issue("cams-appliance.site.svc")
    issued.write(secret / "tls.crt", secret / "tls.key")
    config = load_config(etc / "appliance.yaml")
    tls = ApiTls.of(config, lambda: config)
    assert tls is not None and tls.served.serial == f"{issued.serial:X}"


def test_the_chart_without_a_tls_secret_serves_http(tmp_path: Path) -> None:
    docs = fleet(tmp_path, 3, "serviceMonitor.enabled=true")
    for workload in (one(docs, "StatefulSet"), one(docs, "Deployment")):
        names = {v["name"] for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert "tls" not in names
        assert all("scheme" not in p for p in probes(workload))
    args = container(one(docs, "Deployment"))["args"]
    assert "--replica-ca" not in args and "https://" not in flag(args, "--replicas")
    assert "scheme" not in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["appliance.yaml"])
    assert "tls" not in config["server"]


def test_a_public_certificate_needs_no_ca_key(tmp_path: Path) -> None:
    """tls.caKey "": the replicas' certificate is checked against the system's CAs."""
    docs = fleet(tmp_path, 2, TLS_SET, "tls.caKey=", "serviceMonitor.enabled=true")
    assert "--replica-ca" not in container(one(docs, "Deployment"))["args"]
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["tlsConfig"] == {"serverName": f"cams-appliance.{NAMESPACE}.svc"}


# -- compose ------------------------------------------------------------------------------
def uncommented_tls(config: Path) -> str:
    """The compose config with its commented server.tls block taken in, as the override's
    instructions say."""
    lines = config.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "compose.tls.yaml" in line) + 1
    end = start
    while end < len(lines) and lines[end].startswith("  # "):
        lines[end] = "  " + lines[end].removeprefix("  # ")
        end += 1
    assert end - start == 3, lines[start:end]
    return "\n".join(lines)


def test_the_compose_override_mounts_the_files_its_config_names() -> None:
    override = yaml.safe_load((COMPOSE / "compose.tls.yaml").read_text())
    (mount,) = override["services"]["appliance"]["volumes"]
    assert mount == f"./tls:{MOUNT}:ro"
    text = uncommented_tls(COMPOSE / "appliance.yaml")
    text = text.replace("/opt/appliance/configs", str(ROOT / "configs"))
    tls = parse_config(yaml.safe_load(text), COMPOSE).server.tls
    assert tls is not None
    assert (str(tls.cert_file), str(tls.key_file)) == (f"{MOUNT}/cert.pem", f"{MOUNT}/key.pem")
    healthcheck = " ".join(override["services"]["appliance"]["healthcheck"]["test"])
    assert "https://127.0.0.1:8080/health" in healthcheck
    prometheus = [v.split(":")[1] for v in override["services"]["prometheus"]["volumes"]]
    assert "/etc/prometheus/prometheus.yml" in prometheus


def test_the_compose_tls_prometheus_config_is_valid(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: run sh tests/install_deps.sh")
    ca = TestCA().write_ca(tmp_path / "appliance-ca.pem")
    text = (COMPOSE / "prometheus.tls.yml").read_text()
    (tmp_path / "prometheus.yml").write_text(
        text.replace("/etc/prometheus/appliance-ca.pem", str(ca))
    )
    shutil.copy(ROOT / "deploy/prometheus/rules.yml", tmp_path / "rules.yml")
    done = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
