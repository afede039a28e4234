"""An error in the shape its route's clients read: Anthropic's for /v1/messages (and its
count_tokens), OpenAI's everywhere else. Used where no route has run yet (the API-key and
body-size middleware) and by the app's exception handlers."""

from __future__ import annotations

from minivllm.entrypoints.anthropic.output import error_body as anthropic_body
from minivllm.entrypoints.server.errors import ErrorResponse, error_body

ANTHROPIC_PREFIX = "/v1/messages"


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_for_path(
    path: str, message: str, status: int = 400, param: str | None = None
) -> ErrorResponse:
    if is_anthropic_path(path):
        return ErrorResponse(anthropic_body(message, status), status)
    return ErrorResponse(error_body(message, status, param), status)
