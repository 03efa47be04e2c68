"""The error answer of `bundle serve`'s API, in OpenAI's shape: raised by the request checks, the routes and the
decoding worker, answered by the app's error handlers and the middleware."""

from __future__ import annotations

__all__ = ["ApiError"]

from typing import Any


class ApiError(Exception):
    """An OpenAI-style error answer: HTTP status, message, type, param, code."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
