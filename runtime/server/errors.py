"""OpenAI-style error bodies, and the mapping from engine / grammar errors to HTTP statuses.

Every error the server answers has the body
`{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`. Bad input is a 4xx that
says what was wrong; only a bug in the server itself becomes a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

# status -> OpenAI error type
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    501: "not_implemented_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """An error the server answers on purpose, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": param,
            "code": code,
        }
    }


def from_exception(exc: BaseException, param: str | None = None) -> APIError:
    """The APIError for an exception raised by the engine, the grammar or the tokenizer."""
    from grammar import GrammarError, UnsupportedSchemaError
    from runtime.errors import EngineShutdownError, PromptTooLongError
    from runtime.scheduling.compile_pool import CompileBudgetError, CompileWorkerError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, CompileWorkerError):  # the pool's failure, not the constraint's
        return APIError(503, str(exc), param=param, code="compile_worker_unavailable")
    if isinstance(exc, CompileBudgetError):  # names the constraint and the limit
        return APIError(400, str(exc), param=param, code="constraint_too_complex")
    if isinstance(exc, UnsupportedSchemaError):
        return APIError(400, str(exc), param=param, code="unsupported_schema_keyword")
    if isinstance(exc, GrammarError):
        return APIError(400, f"invalid constraint: {exc}", param=param, code="invalid_constraint")
    if isinstance(exc, PromptTooLongError):
        return APIError(413, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, EngineShutdownError):
        return APIError(503, "the server is shutting down", code="shutting_down")
    if isinstance(exc, NotImplementedError):
        return APIError(501, str(exc) or "not implemented", param=param, code="not_implemented")
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return APIError(400, f"{type(exc).__name__}: {exc}", param=param)
    logger.error("unexpected error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def constraint_limit(message: str) -> bool:
    """Whether an engine abort's message says the constraint went past one of its limits."""
    from runtime.scheduling.compile_pool import BUDGET_MARK

    return BUDGET_MARK in message or "state budget" in message


def constraint_refusal(message: str, param: str | None) -> APIError:
    """The 400 for a request the engine aborted because of its constraint (the message only)."""
    if constraint_limit(message):
        return APIError(400, message, param=param, code="constraint_too_complex")
    return APIError(400, f"invalid constraint: {message}", param=param, code="invalid_constraint")


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid" or tuple(first.get("loc", ())) == ("body",):
        msg = f"the body must be a JSON object: {first.get('msg', '')}"
        return APIError(400, msg, code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    return APIError(422, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _other(_: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    # Starlette answers a handler for `Exception` from its outermost middleware and then
    # re-raises (uvicorn logs a traceback): the user's mistakes get handlers of their own, which
    # answer and stop there
    for user_error in (ValueError, TypeError, KeyError, NotImplementedError):
        app.add_exception_handler(user_error, _other)
