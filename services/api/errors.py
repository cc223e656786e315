"""One error type for the API and one place that renders every error.

Every failure leaves as `{"code": "...Error", "message": "..."}` with the
right status; nothing a client sends may produce a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from kombu.exceptions import OperationalError
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from werkzeug.exceptions import HTTPException

from shared.state.accounts import NoSuchAccount

log = logging.getLogger("pai.api")

# What a client is told to wait when Redis cannot be reached (a restart
# replays its append-only file in about a second per 100 MB).
STORE_RETRY_AFTER_SECONDS = 2


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400, *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.status, self.extra = code, message, status, extra
        self.headers = headers or {}

    def response(self) -> tuple[Response, int]:
        body = {"code": self.code, "message": self.message, **self.extra}
        response = jsonify(body)
        response.headers.update(self.headers)  # e.g. Retry-After with a 429
        return response, self.status


_HTTP_CODES = {
    400: "BadRequestError", 401: "UnauthorizedUserError", 403: "ForbiddenUserError",
    404: "NotFoundError", 405: "MethodNotAllowedError", 409: "ConflictError",
    413: "RequestEntityTooLargeError", 415: "UnsupportedMediaTypeError",
    429: "TooManyRequestsError", 503: "ServiceUnavailableError",
}


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(error: ApiError) -> tuple[Response, int]:
        return error.response()

    @app.errorhandler(NoSuchAccount)
    def _gone(error: NoSuchAccount) -> tuple[Response, int]:
        # The user or VC was deleted between the view's check and its write.
        return ApiError("NotFoundError", str(error), 404).response()

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> tuple[Response, int]:
        status = error.code or 500
        message = error.description or error.name
        if status == 413:
            message = "request body is larger than the 1 MiB limit"
        response, status = ApiError(_HTTP_CODES.get(status, "HttpError"), message,
                                    status).response()
        for name, value in error.get_headers():  # e.g. the Allow a 405 must carry
            if name.lower() != "content-type":
                response.headers[name] = value
        return response, status

    @app.errorhandler(RedisConnectionError)
    @app.errorhandler(RedisTimeoutError)
    @app.errorhandler(BusyLoadingError)
    @app.errorhandler(OperationalError)  # a Celery send that outlasted its retries
    def _store_unreachable(error: Exception) -> tuple[Response, int]:
        # Redis restarting, loading its append-only file, or failing over:
        # nothing was decided, and the client may simply try again.
        log.warning("Redis is unreachable: %s", error)
        return ApiError("ServiceUnavailableError",
                        "the platform's store is unreachable; try again shortly", 503,
                        headers={"Retry-After": str(STORE_RETRY_AFTER_SECONDS)}).response()

    @app.errorhandler(ResponseError)
    def _refused(error: ResponseError) -> tuple[Response, int]:
        # A primary with too few replicas in step refuses writes
        # (min-replicas-to-write, docs/high-availability.md): nothing was
        # written, and it passes once a replica catches up.
        if str(error).startswith("NOREPLICAS"):
            return _store_unreachable(error)
        return _unexpected(error)

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> tuple[Response, int]:
        log.exception("unhandled error")
        return ApiError("InternalServerError", "internal error; see the api log",
                        500).response()
