"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
from http import HTTPStatus

from fastapi.responses import JSONResponse

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """Raised anywhere in request handling; becomes an OpenAI-shaped error response."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.headers = headers or {}  # e.g. Retry-After on a 503


def renamed(error: APIError, names: dict[str, str]) -> APIError:
    """error with its field named as another API names it (names: chat's name -> its), in
    param and where the message starts with the field."""
    param = names.get(error.param, error.param)
    message = error.message
    if error.param and param != error.param and message.startswith(error.param + " "):
        message = param + message[len(error.param) :]
    return APIError(message, error.status, param, error.headers)


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    err_type = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


class ErrorResponse(JSONResponse):
    """A JSON error, ASCII-escaped: its message may quote request text (a model name), and a
    lone surrogate in it ("\\ud800" in the request's JSON) has no UTF-8 encoding."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_json(message: str, status: int = 400, param: str | None = None) -> ErrorResponse:
    return ErrorResponse(error_body(message, status, param), status)


def error_response(error: APIError) -> ErrorResponse:
    response = error_json(error.message, error.status, error.param)
    response.headers.update(error.headers)
    return response


def sse_error(error: APIError) -> str:
    """An error after the 200 of a stream: one data chunk (the stream then ends with [DONE])."""
    return f"data: {json.dumps(error_body(error.message, error.status, error.param))}\n\n"
