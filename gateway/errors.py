"""OpenAI-shaped errors, the body every OpenAI SDK parses: {"error": {message, type, param, code}}.

GatewayError                 what the gateway answers instead of an answer
├── BadRequest           400  invalid_request_error: bad JSON, fields, headers, stoker extension
├── Unauthorized         401  authentication_error: no or unknown API key (with a key map set)
├── NotFound             404  not_found_error: no such route
├── ModelNotFound        404  invalid_request_error, model_not_found: a model the upstream does
│                             not list, with strict models (gateway/health.py)
├── MethodNotAllowed     405  invalid_request_error
├── PayloadTooLarge      413  invalid_request_error: a body over the limit
├── NegativeCached       503  upstream_error: this request failed upstream seconds ago (paused)
└── UpstreamFailed       502  upstream_error: the upstream is unreachable or answered garbage
                         504  upstream_error: the upstream timed out
The cache being down is never one of these: the gateway fails open and goes upstream.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from schemas.errors import StokerError


class GatewayError(StokerError):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequest(GatewayError):
    status, type = 400, "invalid_request_error"


class Unauthorized(GatewayError):
    status, type = 401, "authentication_error"


class NotFound(GatewayError):
    status, type = 404, "not_found_error"


class ModelNotFound(GatewayError):
    status, type = 404, "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model", code="model_not_found")


class MethodNotAllowed(GatewayError):
    status, type = 405, "invalid_request_error"


class PayloadTooLarge(GatewayError):
    status, type = 413, "invalid_request_error"


class NegativeCached(GatewayError):
    status, type = 503, "upstream_error"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="negative_cache")
        self.headers["retry-after"] = str(max(1, retry_after_s))


class UpstreamFailed(GatewayError):
    type = "upstream_error"

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message, code="upstream_unavailable" if status == 502 else "timeout")
        self.status = status


def error_response(err: GatewayError, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(err.body()),
        status_code=err.status,
        media_type="application/json",
        headers={**err.headers, **(headers or {})},
    )
