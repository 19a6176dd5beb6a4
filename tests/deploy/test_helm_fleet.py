"""The chart's fleet (issue 29): Service → gateway → headless Service → replicas, each
with its state volume. Rendered by `helm template` for 1 and 3 replicas and validated
strictly, then read as Kubernetes would: which pods each Service and budget selects, the
names the gateway dials against the names the StatefulSet gives its pods, and the
volumes behind each `--state-dir`; and the gateway container's own command line, run
with the rendered config against loopback stand-ins for pods that are not up."""

from __future__ import annotations

import functools
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from appliance.cli.main import _parser
from appliance.config import load_config
from appliance.server.crosssite import CrossSite
from tests.deploy.test_helm import KUBERNETES, ROOT, one, render
from tests.support.appliance import APPLIANCE, Served, clean_env
from tests.support.processes import free_port

Doc = dict[str, Any]
NAMESPACE = "site"  # not "default": the gateway's addresses must carry the release's own
REPLICA_STATE = "/var/lib/appliance/state"
TOKEN = "t0ken"  # the token test_helm's values give the chart
GATEWAY_STATE = "/var/lib/appliance/gateway"


def fleet(tmp_path: Path, replicas: int, *sets: str) -> list[Doc]:
    return render(tmp_path, f"replicaCount={replicas}", *sets, namespace=NAMESPACE)


def container(workload: Doc) -> Doc:
    containers: list[Doc] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def flag(args: list[str], name: str) -> str:
    """The value after `name` in a container's args."""
    assert args.count(name) == 1, args
    return args[args.index(name) + 1]


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a Service's selector (or a matchLabels) picks pods with these labels."""
    return all(labels.get(key) == value for key, value in selector.items())


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def mounts(workload: Doc) -> dict[str, str]:
    """mount path -> volume name."""
    return {m["mountPath"]: m["name"] for m in container(workload)["volumeMounts"]}


def volumes(workload: Doc) -> dict[str, Doc]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


@pytest.mark.parametrize("persistence", [False, True])
@pytest.mark.parametrize("replicas", [1, 3])
def test_the_fleet_renders_and_validates(tmp_path: Path, replicas: int, persistence: bool) -> None:
    docs = fleet(tmp_path, replicas, f"persistence.enabled={str(persistence).lower()}")
    for doc in docs:  # raises ValidationError naming the field (strict: no unknown fields)
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = sorted(d["kind"] for d in docs)
    claims = ["PersistentVolumeClaim"] if persistence else []  # the gateway's
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "Service",
            "StatefulSet",
            *claims,
        ]
    )
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "ServiceAccount")]


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_gateway_dials_each_replica_by_its_stable_name(tmp_path: Path, replicas: int) -> None:
    """Replica I is the I-th address: the pod the StatefulSet names `<sts>-I`, through its
    governing (headless) Service, in the release's namespace, on the port the pod serves."""
    docs = fleet(tmp_path, replicas)
    sts, gateway = one(docs, "StatefulSet"), one(docs, "Deployment")
    headless = named(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    (port,) = headless["spec"]["ports"]
    (served,) = container(sts)["ports"]
    assert port["targetPort"] == served["name"]
    name, service = sts["metadata"]["name"], headless["metadata"]["name"]
    expected = [f"{name}-{i}.{service}.{NAMESPACE}.svc:{port['port']}" for i in range(replicas)]
    args = container(gateway)["args"]
    assert args[0] == "gateway"
    assert flag(args, "--replicas").split(",") == expected
    # The gateway places cameras by the rule over as many shards as the pods run.
    env = {e["name"]: e.get("value") for e in container(sts)["env"]}
    assert env["APPLIANCE_SHARD"] == f"auto/{replicas}"
    assert (flag(args, "--host"), flag(args, "--port")) == ("0.0.0.0", str(served["containerPort"]))
    (gateway_port,) = container(gateway)["ports"]
    assert gateway_port["containerPort"] == int(flag(args, "--port"))


def test_each_pod_answers_to_the_names_it_is_called_by(tmp_path: Path) -> None:
    """The Host each caller sends, as the chart's config takes it on its 0.0.0.0 bind (the
    rule that ends DNS rebinding: appliance/server/crosssite.py): the gateway dialing a
    replica, a client of the API Service by any of its cluster names, kubelet's probes and
    Prometheus by pod IP, an ingress's name the values list. A name of another namespace
    or release, or any other, is refused."""
    docs = fleet(tmp_path, 3, "config.server.allowed_hosts={cams.example.com}")
    chart_etc(docs, tmp_path / "etc")
    config = load_config(tmp_path / "etc" / "appliance.yaml")
    rules = CrossSite.for_bind(config.server, config.server.host)
    replicas = flag(container(one(docs, "Deployment"))["args"], "--replicas").split(",")
    dialed = [address.rpartition("://")[2] for address in replicas]  # https:// with TLS
    api = [f"cams-appliance{suffix}:8080" for suffix in ("", f".{NAMESPACE}", f".{NAMESPACE}.svc")]
    called = [*dialed, *api, f"cams-appliance.{NAMESPACE}.svc.cluster.local", "10.244.1.7:8080"]
    called.append("cams-appliance-1.cams-appliance-replicas:8080")  # a client in the namespace
    for host in [*called, "cams.example.com", "[fd00::7]:8080"]:
        assert rules.answers_to(host), host
    for host in ["attacker.example", "cams-appliance.other.svc", "evil-appliance-0.site.svc"]:
        assert not rules.answers_to(host), host


def test_what_the_gateway_runs_parses(tmp_path: Path) -> None:
    """The gateway container's command line is one `appliance gateway` accepts."""
    args = container(one(fleet(tmp_path, 3), "Deployment"))["args"]
    parsed = _parser().parse_args(args)  # SystemExit(2), saying which argument, if not
    assert callable(parsed.func)


def test_the_public_service_goes_to_the_gateway_and_the_headless_one_to_the_replicas(
    tmp_path: Path,
) -> None:
    docs = fleet(tmp_path, 3)
    sts, gateway = one(docs, "StatefulSet"), one(docs, "Deployment")
    replica_pods, gateway_pods = pod_labels(sts), pod_labels(gateway)
    public = named(docs, "Service", "cams-appliance")["spec"]
    headless = named(docs, "Service", sts["spec"]["serviceName"])["spec"]
    assert selects(public["selector"], gateway_pods)
    assert not selects(public["selector"], replica_pods)
    assert selects(headless["selector"], replica_pods)
    assert not selects(headless["selector"], gateway_pods)
    # The gateway reaches a starting replica to say why it is not ready.
    assert headless["publishNotReadyAddresses"] is True
    # No controller or budget claims the other's pods.
    assert not selects(sts["spec"]["selector"]["matchLabels"], gateway_pods)
    assert not selects(gateway["spec"]["selector"]["matchLabels"], replica_pods)
    budget = one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert selects(budget, replica_pods) and not selects(budget, gateway_pods)


def test_the_gateway_pod_is_locked_down_probed_and_alone(tmp_path: Path) -> None:
    docs = fleet(tmp_path, 3, "gpu.enabled=true")
    gateway = one(docs, "Deployment")
    c = container(gateway)
    assert gateway["spec"]["strategy"]["type"] == "Recreate"  # two never hold the claim
    assert gateway["spec"]["replicas"] == 1
    assert gateway["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # /health for readiness too: its /ready fails while any replica is down.
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    token = {e["name"]: e for e in c["env"]}["APPLIANCE_API_TOKEN"]["valueFrom"]
    replica_token = {e["name"]: e for e in container(one(docs, "StatefulSet"))["env"]}
    assert token == replica_token["APPLIANCE_API_TOKEN"]["valueFrom"]
    assert not c["image"].endswith("-gpu")  # it runs no model
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert mounts(gateway)["/etc/appliance"] == "config"


def test_more_gateways_on_one_claim_are_refused(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as refused:
        fleet(tmp_path, 3, "persistence.enabled=true", "gateway.replicaCount=2")
    assert "gateway.replicaCount" in refused.value.stderr


def test_the_state_folders_are_claims_with_persistence(tmp_path: Path) -> None:
    docs = fleet(tmp_path, 3, "persistence.enabled=true", "persistence.stateSize=2Gi")
    sts, gateway = one(docs, "StatefulSet"), one(docs, "Deployment")
    assert flag(container(sts)["args"], "--state-dir") == REPLICA_STATE
    templates = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    state = mounts(sts)[REPLICA_STATE]
    assert templates[state]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert state not in volumes(sts)  # the claim, not an emptyDir
    assert "traces" in templates  # as before
    assert flag(container(gateway)["args"], "--state-dir") == GATEWAY_STATE
    volume = volumes(gateway)[mounts(gateway)[GATEWAY_STATE]]
    claim = one(docs, "PersistentVolumeClaim")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"


def test_the_state_folders_are_empty_dirs_without_persistence(tmp_path: Path) -> None:
    docs = fleet(tmp_path, 3)
    sts, gateway = one(docs, "StatefulSet"), one(docs, "Deployment")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert flag(container(sts)["args"], "--state-dir") == REPLICA_STATE
    assert volumes(sts)[mounts(sts)[REPLICA_STATE]] == {"name": "state", "emptyDir": {}}
    assert flag(container(gateway)["args"], "--state-dir") == GATEWAY_STATE
    assert volumes(gateway)[mounts(gateway)[GATEWAY_STATE]] == {"name": "state", "emptyDir": {}}


@pytest.mark.parametrize("gateway", [True, False])
def test_the_service_monitor_scrapes_each_replica_once_never_the_gateway(
    tmp_path: Path, gateway: bool
) -> None:
    """A ServiceMonitor scrapes the pods behind every Service its selector matches: one
    Service, and it must select the replicas (each pod's own /metrics)."""
    docs = fleet(
        tmp_path, 3, "serviceMonitor.enabled=true", f"gateway.enabled={str(gateway).lower()}"
    )
    monitor = one(docs, "ServiceMonitor")["spec"]
    services = [d for d in docs if d["kind"] == "Service"]
    scraped = [
        s for s in services if selects(monitor["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert len(scraped) == 1, [s["metadata"]["name"] for s in scraped]  # twice: counted twice
    (service,) = scraped
    assert selects(service["spec"]["selector"], pod_labels(one(docs, "StatefulSet")))
    assert service["spec"]["publishNotReadyAddresses"] is True  # a stalled replica's too
    if gateway:
        assert not selects(service["spec"]["selector"], pod_labels(one(docs, "Deployment")))
    assert [e["path"] for e in monitor["endpoints"]] == ["/metrics"]
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} <= ports


@pytest.mark.parametrize("replicas", [1, 3])
def test_without_the_gateway_the_chart_has_its_old_shape(tmp_path: Path, replicas: int) -> None:
    docs = fleet(tmp_path, replicas, "gateway.enabled=false", "persistence.enabled=true")
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "Service",
        "StatefulSet",
    ]
    sts = one(docs, "StatefulSet")
    public = named(docs, "Service", "cams-appliance")["spec"]
    assert selects(public["selector"], pod_labels(sts))  # balanced over the replicas
    assert mounts(sts)[REPLICA_STATE] == "state"  # each replica still keeps its changes


def chart_etc(docs: list[Doc], etc: Path) -> None:
    """The ConfigMap laid out as the pods mount it, the image's paths read from here."""
    (etc / "workflows").mkdir(parents=True)
    for key, text in one(docs, "ConfigMap")["data"].items():
        if key.startswith("workflow-"):
            (etc / "workflows" / key.removeprefix("workflow-")).write_text(text)
    text = one(docs, "ConfigMap")["data"]["appliance.yaml"].replace("/etc/appliance", str(etc))
    (etc / "appliance.yaml").write_text(
        text.replace("/opt/appliance/configs", str(ROOT / "configs"))
    )


def test_the_gateway_pod_probes_alive_while_its_replicas_are_down(tmp_path: Path) -> None:
    """The gateway container's own command and config, the replicas' addresses swapped for
    loopback ports nothing answers on (pods not up yet): its probes' path answers 200, so
    the pod stays in its Service, while its /ready (every replica's) does not; the list
    still answers, naming the config's cameras."""
    docs = fleet(tmp_path, 3)
    chart_etc(docs, tmp_path / "etc")
    c = container(one(docs, "Deployment"))
    args = [a.replace("/etc/appliance", str(tmp_path / "etc")) for a in c["args"]]
    port = free_port()
    swapped = {
        "--replicas": ",".join(f"127.0.0.1:{free_port()}" for _ in range(3)),
        "--host": "127.0.0.1",  # tests listen on loopback only
        "--port": str(port),
        "--state-dir": str(tmp_path / "gateway"),
    }
    for name, value in swapped.items():
        args[args.index(name) + 1] = value
    log_path = tmp_path / "gateway.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*APPLIANCE, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(APPLIANCE_API_TOKEN=TOKEN),
        )
    gateway = Served(process, f"http://127.0.0.1:{port}", log_path)
    try:
        probes = {c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]}
        for path in probes:
            gateway.wait_for(functools.partial(answers, gateway, path), 30, path)
        assert gateway.get("/ready")[0] == 503
        listed = listing(gateway.url)
        assert {s["id"] for s in listed} == {f"cam{i}" for i in range(5)}
        assert {s["state"] for s in listed} == {"unavailable"}
    finally:
        gateway.stop()


def answers(served: Served, path: str) -> bool:
    return served.get(path)[0] == 200


def listing(url: str) -> list[Doc]:
    request = urllib.request.Request(
        url + "/v1/streams", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        body: dict[str, list[Doc]] = json.loads(reply.read())
    return body["streams"]
