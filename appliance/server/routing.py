"""The shape of the one route table: app.py registers it, openapi.py documents it, so the
document cannot drift from the routes that answer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.server.errors import Handler

# A pydantic model or a dataclass (its JSON Schema is generated), or a literal JSON Schema.
Schema = type | Mapping[str, Any]

JSON = "application/json"
_PARAM = re.compile(r"{(\w+)}")


@dataclass(frozen=True, slots=True)
class Reply:
    """One documented success answer."""

    status: int
    description: str
    schema: Schema | None = None
    media_type: str = JSON


@dataclass(frozen=True, slots=True)
class Route:
    """One method on one path. The handler's docstring is the operation's description.

    `errors` lists the statuses a route answers beyond those every route of its kind has
    (401 where a token is needed; 400, 413 and 422 with a body; 404 with a path parameter).
    """

    method: str
    path: str
    handler: Handler
    summary: str
    replies: tuple[Reply, ...]
    errors: tuple[int, ...] = ()
    body: Mapping[str, Schema] = field(default_factory=dict)  # media type -> schema
    # Optional query parameters: name -> (JSON schema, description); 422 when invalid.
    query: Mapping[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    probe: bool = False  # open without a token where the policy opens probes
    public: bool = False  # always open: the web viewer's page and assets hold no data
    streaming: bool = False  # answers for as long as the client reads (no time limit)
    tag: str = "streams"

    @property
    def operation_id(self) -> str:
        return self.handler.__name__

    @property
    def parameters(self) -> list[str]:
        return _PARAM.findall(self.path)

    @property
    def description(self) -> str:
        return " ".join((self.handler.__doc__ or self.summary).split())
