"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right status, never a traceback."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}
Body = TypeVar("Body", bound=BaseModel)
log = logging.getLogger("rooftop.serve")


class ApiError(Exception):
    """An error response: its status, a message that names the problem, the offending field if any, and headers
    beyond its status's own."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.headers)


# vLLM's older guided decoding fields, which its structured_outputs replaced: each its structured_outputs key
GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": status,
        }
    }


RETRY_AFTER_S = 1  # a 429's hint: a slot frees as soon as a running request finishes
STATUS_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": str(RETRY_AFTER_S)}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    headers = STATUS_HEADERS.get(status, {}) | (headers or {})
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def check_json(request: Request) -> None:
    """415 unless the body is declared JSON (application/json or a +json type) or not declared (raw bytes). A web
    page may POST a form or text/plain anywhere without a CORS preflight: those never reach a handler."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise ApiError(415, f"the body must be JSON: send Content-Type: application/json, not {declared[:80]!r}")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past `limit` bytes (declared or actually sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {int(declared)} bytes; the limit is {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes")
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected while sending the body") from None
    return bytes(body)


def parse_body(body: bytes, model: type[Body]) -> Body:
    """The body as `model`, or a 400 naming the first field that is wrong."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise ApiError(400, *_describe(e.errors()[0])) from None


def _describe(error: dict) -> tuple[str, str | None]:
    """(message, param) of one pydantic error, e.g. ("temperature: Input should be a valid number, got 'hot'", "temperature")."""
    if error["type"] == "json_invalid":
        return f"the body is not valid JSON: {error['msg'].removeprefix('Invalid JSON: ')}", None
    if error["type"] == "extra_forbidden":  # a field of any name (a key need not be an identifier)
        parent, name = _path(error["loc"][:-1]), str(error["loc"][-1])
        path = f"{parent}.{name}" if parent else name
        instead = f": vLLM's structured_outputs.{GUIDED[name]} replaced it" if not parent and name in GUIDED else ""
        return f"{path} is not a field rooftop implements (refused rather than ignored){instead}", path
    path = _path(error["loc"])
    if not path:
        return f"the body must be a JSON object: {error['msg']}", None
    if error["type"] == "missing":
        return f"{path} is required", path
    got = _as_json(error.get("input"))  # as the client wrote it: true, null, "5"
    got = got if len(got) <= 40 else got[:37] + "..."
    return f"{path}: {error['msg']}, got {got}", path


def _as_json(value) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):  # not from JSON (a value a validator made)
        return repr(value)


def _path(loc: tuple) -> str:
    """("messages", 0, "content", "str") -> "messages[0].content": union-member tags are dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in ("str", "int", "float", "bool", "list", "dict"):
            path += f".{part}" if path else part
    return path


class InternalErrors:
    """ASGI middleware: an exception no handler took becomes a plain 500 on a connection that stays usable (Starlette's
    own error middleware re-raises it to the server, which then drops the keep-alive connection and logs it again).
    The body names no internals, only an id to find the one log line with the traceback; `on_error(path)` counts it."""

    def __init__(self, app, on_error: Callable[[str], None]):
        self.app, self.on_error = app, on_error

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("internal error %s in %s %s", error_id, scope.get("method"), scope.get("path"))
            self.on_error(scope.get("path", ""))
            if not started:  # a stream that already began ends here; its client sees the stream stop
                await error_response(500, f"internal error (id {error_id}; the server log has the details)")(
                    scope, receive, send
                )
