"""The monitoring kit in deploy/: Prometheus rules (checked and unit-tested by promtool),
the scrape config, and the Grafana dashboard, whose every query is run against a real
Prometheus scraping a real appliance on the bundled demo clip.

promtool and prometheus come from Debian's `prometheus` package (tests/install_deps.sh).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.server.conftest import TOKEN, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support import tracecheck
from tests.support.appliance import ROOT
from tests.support.processes import free_port

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "appliance.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
STREAM, BLOCK = "cam", "people"  # the demo stream's id and its detect block's id
# Grafana's variables as the test substitutes them (one stream, one block selected).
SUBSTITUTIONS = {
    "$__rate_interval": "10s",
    "$__interval": "2s",
    "$__range": "1m",
    "${stream}": STREAM,
    "$stream": STREAM,
    "${block}": BLOCK,
    "$block": BLOCK,
}
# Panels that must show data for a running stream: fps, frame age, block latency.
CORE_PANELS = ("Frames per second", "Frame age p50 / p95 / p99", "Block latency p50 / p95 / p99")
ALERTS = {
    "ApplianceStreamDown",
    "ApplianceFrameAgeHigh",
    "ApplianceDropRatioHigh",
    "ApplianceSinkDeadLetters",
    "ApplianceTraceWriteErrors",
    "ApplianceBlockRegression",
    "ApplianceModelRegression",
    "ApplianceHostSlowdown",
}
# What each alert's summary and description name: its stream, sink, model, or the instance.
ALERT_SUBJECT = {"ApplianceSinkDeadLetters": "$labels.sink", "ApplianceModelRegression":
                 "$labels.model", "ApplianceTraceWriteErrors": "$labels.instance",
                 "ApplianceHostSlowdown": "$labels.instance"}  # fmt: skip
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
PROMQL_WORDS |= {"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
QUERY_DEADLINE_S = 25.0
# Scrapes and rule evaluations: a rate needs two samples. (The first scrape still comes
# about 5 s after Prometheus starts: its target discovery sends updates every 5 s.)
SCRAPE = "250ms"
ROTATE_S = 2.0  # the appliance's rolling trace period here

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: install Debian's prometheus (tests/install_deps.sh)"
)
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus missing: install Debian's prometheus (tests/install_deps.sh)",
)


# -- the dashboard's queries ----------------------------------------------------------------
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def panel_queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target, and of every Prometheus annotation query."""
    targets = [(p["title"], t["expr"]) for p in panels(doc) for t in p.get("targets", [])]
    return targets + annotation_queries(doc)


def annotation_queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(`annotation <name>`, expr) of the dashboard's Prometheus annotations."""
    return [
        (f"annotation {a['name']}", a["expr"])
        for a in doc["annotations"]["list"]
        if a.get("datasource", {}).get("type") == "prometheus"
    ]


def variable_queries(doc: dict[str, Any]) -> dict[str, str]:
    """name -> query of the `query` variables (Grafana stores a string or an object)."""
    out = {}
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out[var["name"]] = query["query"] if isinstance(query, dict) else query
    return out


def label_values(query: str) -> tuple[str, str]:
    """`label_values(selector, label)` -> (selector, label)."""
    match = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", query)
    assert match, f"not a label_values(selector, label) query: {query}"
    return match.group(1), match.group(2)


def substitute(expr: str) -> str:
    for name, value in SUBSTITUTIONS.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges and grouping clauses are cut, that are neither functions nor keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set(re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", s))
    return names - PROMQL_WORDS


def exported_names(exposition: str) -> set[str]:
    """Every sample name /metrics exports, also of families with no child yet (a sink's
    counters before a sink exists): a histogram's _bucket/_sum/_count, a counter's _total."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_metric_names_are_extracted() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (stream, le) (rate(a_bucket{stream=~"x|y"}[5m])))'
        " / on (stream) group_left b_total + c offset 5m > bool 1"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


# -- files ---------------------------------------------------------------------------------
def test_dashboard_shape() -> None:
    doc = dashboard()
    assert 36 <= doc["schemaVersion"] <= 41
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert set(variable_queries(doc)) == {"stream", "block"}
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = {p["title"] for p in panels(doc)}
    assert set(CORE_PANELS) <= titles
    for panel in panels(doc):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
    heatmaps = [p for p in panels(doc) if p["type"] == "heatmap"]
    assert any("appliance_block_latency_seconds_bucket" in t["expr"]
               for p in heatmaps for t in p["targets"])  # fmt: skip
    exprs = " ".join(e for _, e in panel_queries(doc))
    for name in ("appliance_webrtc_sessions", "appliance_trace_write_errors_total",
                 "appliance_sink_queue_depth", "appliance_model_batch_size_bucket",
                 "appliance_model_inference_seconds_bucket", "appliance_model_queue_seconds_bucket",
                 "appliance_stream_reconnects_total", "appliance_sink_messages_total"):  # fmt: skip
        assert name in exprs, name
    # The regression watch: each row's state and ratio, the host's; its changes as annotations.
    regressions = " ".join(e for t, e in panel_queries(doc) if t == "Regressions")
    for name in ("appliance_block_regression", "appliance_block_regression_ratio",
                 "appliance_model_regression", "appliance_host_slowdown_ratio"):  # fmt: skip
        assert name in metric_names(regressions), name
    annotated = {n for _, e in annotation_queries(doc) for n in metric_names(substitute(e))}
    assert {"appliance_block_regression", "appliance_host_slowdown"} <= annotated
    # Exemplars (docs/exemplars.md): every quantile of a histogram whose buckets name a
    # frame shows them, so a point leads to that frame's trace; other targets do not ask.
    with_exemplars = ("appliance_block_latency_seconds", "appliance_workflow_latency_seconds",
                      "appliance_frame_age_seconds", "appliance_model_inference_seconds",
                      "appliance_model_queue_seconds")  # fmt: skip
    latency_panels = set()
    for panel in panels(doc):
        for target in panel.get("targets", []):
            names = metric_names(target["expr"])
            framed = any(f"{h}_bucket" in names for h in with_exemplars)
            if framed and "histogram_quantile" in target["expr"]:
                latency_panels.add(panel["title"])
                assert target.get("exemplar") is True, (panel["title"], target["refId"])
            else:
                assert "exemplar" not in target, (panel["title"], target["refId"])
    assert {"Frame age p50 / p95 / p99", "Workflow latency p50 / p95 / p99",
            "Block latency p50 / p95 / p99", "Model inference time p50 / p95 / p99",
            "Model queue time p50 / p95 / p99"} <= latency_panels  # fmt: skip


def test_grafana_provisioning() -> None:
    source = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (ds,) = source["datasources"]
    assert ds["type"] == "prometheus" and ds["url"].startswith("http")
    # An exemplar's trace_id (`<stream>/frames/<seq>`) links to the frame in the web
    # viewer (/streams/{id}/frames/{seq}: a page, open without a token, that asks for one
    # and draws the frame's trace; the API's route would answer the tab 401): `$$` is a
    # literal `$` to Grafana's provisioning, which expands the environment's
    # ${APPLIANCE_URL} (compose.yaml sets it) and leaves ${__value.raw}.
    (link,) = ds["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id" and link["urlDisplayLabel"]
    assert link["url"] == "${APPLIANCE_URL}/streams/$${__value.raw}"
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "appliance.yml").read_text())
    (prov,) = provider["providers"]
    assert prov["type"] == "file" and prov["options"]["path"]


@needs_promtool
def test_rules_check() -> None:
    done = _promtool("check", "rules", "rules.yml")
    assert "SUCCESS" in done.stdout, done.stdout
    rules = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == ALERTS
    for name, rule in alerts.items():
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            assert ALERT_SUBJECT.get(name, "$labels.stream") in text, (name, key)
    for name in ("ApplianceBlockRegression", "ApplianceModelRegression", "ApplianceHostSlowdown"):
        assert "GET /v1/regressions" in alerts[name]["annotations"]["description"], name


@needs_promtool
def test_rules_unit_tests() -> None:
    """rules_test.yml: every alert fires and stays quiet as designed; a recording rule."""
    tests = yaml.safe_load((PROMETHEUS_DIR / "rules_test.yml").read_text())
    covered = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    assert covered == ALERTS
    done = _promtool("test", "rules", "rules_test.yml")
    assert "SUCCESS" in done.stdout, done.stdout


@needs_promtool
def test_prometheus_config(tmp_path: Path) -> None:
    """prometheus.yml, with its token file made to exist, passes promtool's full check."""
    token = tmp_path / "appliance-token"
    token.write_text(TOKEN + "\n")
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
    assert "/etc/prometheus/appliance-token" in text
    (tmp_path / "prometheus.yml").write_text(
        text.replace("/etc/prometheus/appliance-token", str(token))
    )
    shutil.copy(PROMETHEUS_DIR / "rules.yml", tmp_path / "rules.yml")
    config = yaml.safe_load(text)
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "appliance"
    assert job["static_configs"] == [{"targets": ["appliance:8080"]}]
    done = _promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS" in done.stdout, done.stdout


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# -- a live appliance, and Prometheus scraping it --------------------------------------------
@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("appliance")
    # Short trace periods, few kept: a frame's rolling file closes, then rotates away,
    # within a test (test_an_exemplar_leads_to_its_frame...).
    doc = {**config_doc(demo_stream(STREAM)), "profiling": {"rotate_s": ROTATE_S, "keep_files": 3}}
    live = LiveServer(write_yaml(folder, doc, "config.yaml"), token=TOKEN)
    live.start()
    try:
        wait_for(lambda: live.stream(STREAM)["frames_processed"] > 0, 30.0, "demo stream")
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def prometheus(appliance: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus on loopback scraping `appliance` every SCRAPE, with our rules loaded,
    sending the token as the deployed config does; yields its base URL."""
    assert PROMETHEUS is not None
    folder = tmp_path_factory.mktemp("prometheus")
    rules = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = SCRAPE  # as the global one: the recording group waits 30 s else
    (folder / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": ["rules.yml"],
        "scrape_configs": [{
            "job_name": "appliance",
            "authorization": {"type": "Bearer", "credentials": TOKEN},
            "static_configs": [{"targets": [f"127.0.0.1:{appliance.port}"]}],
        }],
    }  # fmt: skip
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--enable-feature=exemplar-storage"],
        stdout=log, stderr=subprocess.STDOUT, cwd=folder,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url) or process.poll() is not None, 20.0, "prometheus ready")
        assert process.poll() is None, (folder / "prometheus.log").read_text()[-3000:]
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _api(url: str, path: str, **params: str) -> dict[str, Any]:
    """One Prometheus HTTP API call; a 400 (bad query) comes back as its JSON too."""
    query = "?" + urllib.parse.urlencode(params) if params else ""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=10) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def _query(url: str, expr: str) -> dict[str, Any]:
    return _api(url, "query", query=expr)


def test_dashboard_uses_only_exported_metrics(appliance: LiveServer) -> None:
    reply = appliance.call("GET", "/metrics")
    assert reply.status == 200
    exported = exported_names(reply.body.decode())
    doc = dashboard()
    used: dict[str, set[str]] = {}
    for title, expr in panel_queries(doc):
        names = metric_names(substitute(expr))
        assert names, f"{title}: no metric in {expr}"
        used[expr] = names
    for name, query in variable_queries(doc).items():
        selector, _ = label_values(query)
        used[f"${name}"] = metric_names(substitute(selector))
    unknown = {expr: names - exported for expr, names in used.items() if names - exported}
    assert not unknown, f"not exported by the appliance: {unknown}"


def test_operations_doc_lists_every_metric(appliance: LiveServer) -> None:
    """docs/operations.md's reference table names every family /metrics declares."""
    reply = appliance.call("GET", "/metrics")
    families = {
        line.split()[2]
        for line in reply.body.decode().splitlines()
        if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")
    }
    assert len(families) >= 20, families
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert not {f for f in families if f"| `{f}` |" not in doc}


@pytest.mark.slow
@needs_prometheus
def test_dashboard_queries_run_in_prometheus(appliance: LiveServer, prometheus: str) -> None:
    """Every dashboard expression parses and runs; the core panels show data; the rules load
    and the recording rules produce series."""
    doc = dashboard()
    queries = [(title, substitute(expr)) for title, expr in panel_queries(doc)]
    for name, query in variable_queries(doc).items():
        selector, label = label_values(substitute(query))
        queries.append((f"variable {name}", f"group by ({label}) ({selector})"))
    must_have_data = [(t, e) for t, e in queries if t in CORE_PANELS or t.startswith("variable")]
    must_have_data.append(
        ("recording rule", "stream_block:appliance_block_latency_seconds:p99_rate5m")
    )

    def empty() -> list[str]:
        return [e for _, e in must_have_data if not _query(prometheus, e)["data"]["result"]]

    deadline = time.monotonic() + QUERY_DEADLINE_S
    while (missing := empty()) and time.monotonic() < deadline:
        time.sleep(0.2)
    up = _query(prometheus, 'up{job="appliance"}')["data"]["result"]
    assert not missing, f"no data for {missing}; up: {up}"
    assert [s["value"][1] for s in up] == ["1"]

    failed = {}
    for title, expr in queries:
        reply = _query(prometheus, expr)
        if reply["status"] != "success":
            failed[f"{title}: {expr}"] = reply.get("error")
    assert not failed, failed

    # The core panels' numbers are sane: the stream runs at a few fps, frames are young.
    processed = next(e for t, e in queries if t == "Frames per second")
    fps = [float(s["value"][1]) for s in _query(prometheus, processed)["data"]["result"]]
    assert fps and all(v > 0 for v in fps), (processed, fps)

    groups = _api(prometheus, "rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules if r["type"] == "alerting"} == ALERTS
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = {a["labels"]["alertname"] for a in _api(prometheus, "alerts")["data"]["alerts"]}
    assert not firing & {"ApplianceStreamDown", "ApplianceTraceWriteErrors"}, firing


@needs_prometheus
def test_an_exemplar_leads_to_its_frames_trace_then_its_file_then_a_404(
    appliance: LiveServer, prometheus: str
) -> None:
    """Prometheus keeps the exemplars of a block's histogram (it scrapes OpenMetrics);
    the link Grafana makes of one (`/streams/${__value.raw}`, trace_id) is the viewer's
    page, open without a token, and the trace that page fetches for it
    (`/v1/streams/${__value.raw}/trace`) is a strict trace holding that frame's span of
    that block, of the exemplar's duration: from memory, then from its rolling file,
    then 404 naming the oldest frame held."""
    series = f'appliance_block_latency_seconds_bucket{{stream="{STREAM}",block="{BLOCK}"}}'

    def exemplars() -> list[dict[str, Any]]:
        now = time.time()
        reply = _api(prometheus, "query_exemplars", query=series, start=str(now - 60), end=str(now))
        return [e for s in reply.get("data") or [] for e in s["exemplars"]]

    found: list[dict[str, Any]] = []

    def some() -> bool:
        found.extend(exemplars())
        return bool(found)

    wait_for(some, 30.0, "exemplars in Prometheus")
    newest = max(found, key=lambda e: e["timestamp"])
    labels, seq = newest["labels"], int(newest["labels"]["seq"])
    assert labels["stream"] == STREAM and labels["trace_id"] == f"{STREAM}/frames/{seq}"
    assert labels["trace"].startswith("trace-") and labels["trace"].endswith(".json")
    page = appliance.call("GET", f"/streams/{labels['trace_id']}", token=False)
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    link = f"/v1/streams/{labels['trace_id']}/trace"

    def span_of_block(doc: dict[str, Any]) -> dict[str, Any]:
        tracecheck.check(doc)
        events = doc["traceEvents"]
        (run,) = [e for e in events if e["name"] == "workflow.run" and e["args"]["seq"] == seq]
        inside = [
            e for e in events
            if e["ph"] == "X" and e["name"] == BLOCK and e["tid"] == run["tid"]
            and run["ts"] <= e["ts"] <= e["ts"] + e["dur"] <= run["ts"] + run["dur"]
        ]  # fmt: skip
        assert len(inside) == 1, inside
        return dict(inside[0])

    reply = appliance.call("GET", link)
    assert reply.status == 200, reply.body
    assert reply.headers["x-trace-source"] == "ring"
    block = span_of_block(reply.json())
    # The span is the observation: µs floored at each end (tracer.py), 2 µs at most apart.
    assert abs(block["dur"] - float(newest["value"]) * 1e6) <= 2.0, (block, newest)

    def source() -> str:
        found = appliance.call("GET", link)
        return "" if found.status != 200 else found.headers["x-trace-source"]

    wait_for(lambda: source().startswith("file:trace-"), 6 * ROTATE_S + 10, "its rolling file")
    assert span_of_block(appliance.call("GET", link).json())["dur"] == block["dur"]

    wait_for(lambda: appliance.call("GET", link).status == 404, 6 * ROTATE_S + 10, "rotation")
    gone = appliance.call("GET", link).json()["error"]
    assert f"frame {seq} is in no trace still held" in gone["message"]
    (oldest,) = gone["details"]
    assert oldest.startswith("oldest_seq: ") and int(oldest.split()[-1]) > seq
