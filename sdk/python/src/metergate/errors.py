"""Typed errors of metergate's APIs: each carries the reply's status and JSON error."""

from __future__ import annotations

from typing import Any


class MetergateError(Exception):
    """A reply that is not a success: its status, error code, message and body."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body or {}


class RateLimited(MetergateError):
    """429: a rate limit or concurrency cap is reached; nothing was charged."""

    retry_after: float | None
    """Seconds to wait (the Retry-After header), None when the request can never pass."""


class PaymentRequired(MetergateError):
    """402: a quota is spent (quota_exceeded) or a prepaid balance does not cover the request."""


class Unauthorized(MetergateError):
    """401: no credentials, or unknown ones."""


class Forbidden(MetergateError):
    """403: credentials that do not open this route (a revoked key, a missing scope)."""


class Unavailable(MetergateError):
    """503 after every retry: admit could not decide (Redis unavailable, policies loading)."""


def error_for(status: int, body: dict[str, Any], retry_after: float | None) -> MetergateError:
    """The typed error of a reply with status and JSON body."""
    err = body.get("error") if isinstance(body.get("error"), dict) else None
    code = str(err.get("code", "")) if err else str(body.get("decision", body.get("reason", "error")))
    message = str(err.get("message", "")) if err else str(body.get("message", "")) or code
    cls: type[MetergateError] = {
        429: RateLimited, 402: PaymentRequired, 401: Unauthorized, 403: Forbidden, 503: Unavailable,
    }.get(status, MetergateError)
    e = cls(status, code, message, body)
    if isinstance(e, RateLimited):
        e.retry_after = retry_after
    return e
