"""/openapi.json describes exactly the routes that answer, and the live server keeps to
it: schemathesis sends generated requests, valid and invalid, to every operation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, get_args

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi import checks

from appliance.observe.status import StateName
from appliance.server.auth import AuthPolicy
from appliance.server.errors import CODES
from appliance.server.openapi import build_openapi
from appliance.server.routes import ROUTES
from appliance.server.schemas import ErrorDetail
from appliance.sources import StreamState
from appliance.workers.fleet import UNAVAILABLE
from tests.server.conftest import TOKEN, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer

SENT_CHECKS = [
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.negative_data_rejection,
    checks.ignored_auth,
]


@pytest.fixture(scope="module")
def server(module_server: LiveFactory, light_camera: Path) -> LiveServer:
    # Generated profiling windows last at most 1 s; a start while one runs is a 409.
    cam = demo_stream("fuzz-cam", url=str(light_camera))
    return module_server({**config_doc(cam), "profiling": {"max_window_s": 1}})


def operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}


def test_the_document_lists_exactly_the_served_routes(server: LiveServer) -> None:
    document = server.get_json("/openapi.json")
    assert document == DOCUMENT
    assert document["openapi"] == "3.1.0"
    app = server.app
    assert app is not None
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}
    assert served == operations(document)
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (method, path)
            secured = op["security"] == [{"bearer": []}]
            assert secured == path.startswith("/v1/"), (method, path)  # probes open on loopback
            if secured:
                assert "401" in op["responses"]


def test_the_docs_page_shows_every_operation(server: LiveServer) -> None:
    reply = server.call("GET", "/docs", token=False)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/html")
    page = reply.body.decode()
    for method, path in operations(server.get_json("/openapi.json")):
        assert f'<span class="method">{method}</span><code>{path}</code>' in page


def test_state_names_match_the_runtime() -> None:
    # And the fleet gateway's own: a stream whose replica does not answer.
    assert set(get_args(StateName)) == {s.value for s in StreamState} | {UNAVAILABLE}


def test_error_codes_match_the_ones_answered() -> None:
    documented = get_args(ErrorDetail.model_fields["code"].annotation)
    assert set(documented) == set(CODES.values())


# Built as the server builds it, so tests can be generated at collection time (the
# schemathesis fixture-based loader does not run on pytest 9); the first test checks
# that the live server serves this very document.
POLICY = AuthPolicy.admin_only(TOKEN).with_routes(ROUTES)
DOCUMENT = json.loads(json.dumps(build_openapi(ROUTES, POLICY)))
schema = schemathesis.openapi.from_dict(DOCUMENT)


@schema.parametrize()
# Derandomized: CI sees the same examples every run (no flaky failures); explore with
# random seeds locally by removing `derandomize` (that is how the multipart bug was found),
# and with more examples (FUZZ_EXAMPLES=200). 25 an operation in `make test`: at 40 this
# file was the suite's longest (69 s of test time, 7 Dec), against its 8 minutes.
@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "25")),
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_server_keeps_to_its_document(case: schemathesis.Case[Any], server: LiveServer) -> None:
    case.call_and_validate(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, checks=SENT_CHECKS
    )
