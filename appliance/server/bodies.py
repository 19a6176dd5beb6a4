"""Request bodies: JSON objects validated by a pydantic model, and multipart forms.

Both are read whole but never past `client_max_size` (aiohttp answers 413 beyond it, and
the multipart reader below counts its own bytes), and parsed off the loop: a 16 MiB
base64 image takes tens of milliseconds to decode.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel

from appliance.server.context import in_thread
from appliance.server.errors import BadRequestError, InvalidError, PayloadTooLargeError
from pipelines.errors import format_location

M = TypeVar("M", bound=BaseModel)

CHUNK_BYTES = 64 * 1024


async def parse_json(request: web.Request, model: type[M]) -> M:
    """The body as `model`: 400 unless it is a JSON object, 422 with every problem
    (`location: message`) unless it validates."""
    raw = await request.read()
    return await in_thread(_validate, raw, model)


def _validate(raw: bytes, model: type[M]) -> M:
    json_object(raw)
    # Strict, as the published JSON Schema says: "5" is not a number, 1 is not true.
    return model.model_validate_json(raw, strict=True)


def json_object(raw: bytes) -> dict[str, Any]:
    """Parse `raw` as a JSON object without NUL characters in its strings."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BadRequestError("malformed JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits (CPython's limit)
        raise BadRequestError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequestError(f"the body must be a JSON object, got {_json_type(data)}")
    reject_nul(data)
    return data


def reject_nul(data: Any) -> None:
    """422 for a NUL character in any string or key: no path, URL or name holds one, and
    the OS calls behind paths raise ValueError on them."""
    pending: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while pending:  # iterative: JSON may nest as deep as the parser allows
        loc, value = pending.pop()
        if isinstance(value, dict):
            pending.extend(((*loc, k), v) for k, v in value.items())
            pending.extend(((*loc, k), k) for k in value if "\x00" in k)
        elif isinstance(value, list):
            pending.extend(((*loc, i), v) for i, v in enumerate(value))
        elif isinstance(value, str) and "\x00" in value:
            where = format_location(loc)
            raise InvalidError("NUL character in the body", [f"{where}: contains a NUL character"])


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


async def read_form(request: web.Request, limit: int) -> dict[str, bytes]:
    """A multipart/form-data body as {part name: bytes}, at most `limit` bytes of parts."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLargeError(limit)  # said up front: nothing needs to be read
    try:
        reader = await request.multipart()
        parts: dict[str, bytes] = {}
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or not part.name:
                raise BadRequestError("multipart: every part must be a named form field")
            if part.name in parts:
                raise BadRequestError(f"multipart: part {part.name!r} given twice")
            parts[part.name] = await _read_part(part, limit, sum(map(len, parts.values())))
    except (ValueError, AssertionError, RuntimeError, HttpProcessingError) as exc:
        # aiohttp's malformed-body errors: part headers that do not parse raise
        # InvalidHeader (an HttpProcessingError), boundaries and framing ValueError.
        raise BadRequestError(f"malformed multipart body: {_short(exc)}") from None
    return parts


async def _read_part(part: BodyPartReader, limit: int, used: int) -> bytes:
    """One part's bytes, the form's earlier parts having `used` bytes of `limit`."""
    data = bytearray()
    while chunk := await part.read_chunk(CHUNK_BYTES):
        data += chunk
        if used + len(data) > limit:
            raise PayloadTooLargeError(limit)
    return bytes(data)


def _short(exc: Exception) -> str:
    """aiohttp's messages carry a status prefix and the raw bytes: keep one line."""
    text = str(exc).replace("\n", " ").strip()
    return text if len(text) <= 200 else text[:200] + "..."
