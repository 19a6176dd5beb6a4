"""The Helm chart, rendered and checked offline: `helm lint`, `helm template` for 1 and 3
replicas validated strictly against Kubernetes 1.33's schemas, and what the manifests
promise: each replica its shard of the streams, the probes, a non-root read-only pod
with a writable traces volume, the token from a Secret, GPUs only when asked, and an
appliance config that the appliance's own loader accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from appliance.cli.main import _parser
from appliance.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/appliance"
HELM = ROOT / "tests/.cache/helm/helm"  # tests/install_deps.sh fetches it
KUBERNETES = "1.33.0"
VALUES = {
    "token": {"value": "t0ken"},
    "workflows": {"people.yaml": {"name": "people", "blocks": [
        {"id": "people", "type": "detect", "model": "person"}], "outputs": {"people": "people"}}},
    "config": {
        "models": {"person": {"path": "/opt/appliance/configs/models/person_ssdlite.onnx",
                              "decoder": "tf_od", "labels": ["person"]}},
        "streams": [{"id": f"cam{i}", "source": {"url": f"rtsp://10.0.0.{i}/live"},
                     "workflow": "/etc/appliance/workflows/people.yaml"} for i in range(5)],
    },
}  # fmt: skip


def helm() -> str:
    if not HELM.is_file():
        pytest.skip("no helm: run sh tests/install_deps.sh")
    return str(HELM)


def render(tmp_path: Path, *sets: str, namespace: str = "default") -> list[dict[str, Any]]:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    args = [helm(), "template", "cams", str(CHART), "-f", str(values), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def test_helm_lint_passes() -> None:
    done = subprocess.run([helm(), "lint", "--strict", str(CHART)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("replicas", [1, 3])
def test_rendered_manifests_are_valid_kubernetes(tmp_path: Path, replicas: int) -> None:
    docs = render(tmp_path, f"replicaCount={replicas}")
    for doc in docs:  # raises ValidationError naming the field (strict: no unknown fields)
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service",
                     "Service", "StatefulSet"]  # fmt: skip
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == replicas
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["APPLIANCE_SHARD"]["value"] == f"auto/{replicas}"


def test_worker_processes_per_pod(tmp_path: Path) -> None:
    for workers in (1, 4):
        docs = render(tmp_path, f"workers={workers}")
        args = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--workers") + 1] == str(workers)
        # What the container runs parses: the CLI accepts these arguments.
        parsed = _parser().parse_args(["serve", *args[1:]])
        assert parsed.workers == workers


def test_the_pod_is_locked_down_and_probed(tmp_path: Path) -> None:
    docs = render(tmp_path)
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/var/lib/appliance/traces"].get("readOnly")  # the writable volume
    assert mounts["/etc/appliance"]["readOnly"] is True
    token = {e["name"]: e for e in container["env"]}["APPLIANCE_API_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert one(docs, "Secret")["stringData"]["token"] == "t0ken"
    assert "t0ken" not in yaml.safe_dump(one(docs, "ConfigMap"))  # never in the ConfigMap
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})


def test_the_mqtt_password_is_a_mounted_secret(tmp_path: Path) -> None:
    docs = render(tmp_path, "mqtt.password=mq-pw")
    assert one(docs, "Secret")["stringData"]["mqtt-password"] == "mq-pw"
    assert "mq-pw" not in yaml.safe_dump(one(docs, "ConfigMap"))
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["secrets"]["mountPath"] == "/etc/appliance-secrets"
    assert mounts["secrets"]["readOnly"] is True
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_gpus_and_persistence_when_asked(tmp_path: Path) -> None:
    docs = render(tmp_path, "gpu.enabled=true", "gpu.count=2", "persistence.enabled=true")
    sts = one(docs, "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["image"].endswith("-gpu")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "traces"
    volumes = {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "traces" not in volumes  # the claim, not an emptyDir


def test_the_rendered_config_is_one_the_appliance_accepts(tmp_path: Path) -> None:
    """The ConfigMap's appliance.yaml and workflows, laid out as the pod mounts them."""
    data = one(render(tmp_path), "ConfigMap")["data"]
    etc = tmp_path / "etc"
    (etc / "workflows").mkdir(parents=True)
    for key, text in data.items():
        if key.startswith("workflow-"):
            (etc / "workflows" / key.removeprefix("workflow-")).write_text(text)
    text = data["appliance.yaml"].replace("/etc/appliance", str(etc))
    text = text.replace("/opt/appliance/configs", str(ROOT / "configs"))
    config = parse_config(yaml.safe_load(text), etc)
    assert config.server.host == "0.0.0.0" and config.server.open_probes is True
    assert [s.id for s in config.streams] == [f"cam{i}" for i in range(5)]


def test_the_state_key_reaches_the_replicas_and_the_gateway(tmp_path: Path) -> None:
    key = "c2VhbC10aGUtY2FtZXJhLWNyZWRlbnRpYWxzLTEyMzQ="
    docs = render(tmp_path, f"stateKey.value={key}")
    assert one(docs, "Secret")["stringData"]["state-key"] == key
    assert key not in yaml.safe_dump(one(docs, "ConfigMap"))
    for kind in ("StatefulSet", "Deployment"):  # the replicas, and the gateway's store
        container = one(docs, kind)["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["APPLIANCE_STATE_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "state-key"
    mine = render(tmp_path, "stateKey.existingSecret=site-keys")
    container = one(mine, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    ref = {e["name"]: e for e in container["env"]}["APPLIANCE_STATE_KEY"]["valueFrom"]
    assert ref["secretKeyRef"] == {"name": "site-keys", "key": "state-key"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_no_prometheus_of_its_own_by_default(tmp_path: Path) -> None:
    docs = render(tmp_path, "serviceMonitor.enabled=true")
    assert not [d for d in docs if d["kind"] in ("Prometheus", "ServiceAccount", "Role")]


def test_its_own_prometheus_keeps_exemplars_of_its_service_monitor(tmp_path: Path) -> None:
    """monitoring.prometheus.create: a Prometheus resource with exemplar storage on
    (docs/exemplars.md) whose selector picks the chart's ServiceMonitor, and an account
    allowed to discover the replicas; without the ServiceMonitor the chart refuses it."""
    docs = render(tmp_path, "serviceMonitor.enabled=true", "monitoring.prometheus.create=true")
    prometheus = one(docs, "Prometheus")
    assert prometheus["apiVersion"] == "monitoring.coreos.com/v1"
    spec = prometheus["spec"]
    assert spec["enableFeatures"] == ["exemplar-storage"]
    assert spec["exemplars"]["maxSize"] > 0
    monitor = one(docs, "ServiceMonitor")
    wanted = spec["serviceMonitorSelector"]["matchLabels"]
    assert wanted and wanted.items() <= monitor["metadata"]["labels"].items()
    assert "serviceMonitorNamespaceSelector" not in spec  # its own namespace: the monitor's
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert spec["serviceAccountName"] == account
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == one(docs, "Role")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": "default"}]  # fmt: skip
    granted = {r for rule in one(docs, "Role")["rules"] if "list" in rule["verbs"]
               for r in rule["resources"]}  # fmt: skip
    assert {"services", "endpoints", "pods"} <= granted
    for doc in docs:  # the operator's kinds have no schema here
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)

    mine = render(tmp_path, "serviceMonitor.enabled=true", "monitoring.prometheus.create=true",
                  "monitoring.prometheus.serviceAccountName=prom")  # fmt: skip
    assert one(mine, "Prometheus")["spec"]["serviceAccountName"] == "prom"
    assert not [d for d in mine if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render(tmp_path, "monitoring.prometheus.create=true")
    assert "needs serviceMonitor.enabled" in refused.value.stderr
