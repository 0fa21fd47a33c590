"""Typed errors of metergate's APIs: each carries the reply's status, JSON error and headers."""

from __future__ import annotations

from typing import Any, Mapping


class MetergateError(Exception):
    """A reply that is not a success: its status, error code, message, body and headers
    (the RateLimit fields of a refusal among them)."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body or {}
        self.headers: Mapping[str, str] = headers if headers is not None else {}


class BadRequest(MetergateError):
    """400: malformed input; code says which (invalid_json, unknown_field, invalid_id, ...)."""


class Unauthorized(MetergateError):
    """401: no credentials, or unknown ones."""


class PaymentRequired(MetergateError):
    """402: a quota is spent (quota_exceeded) or a prepaid balance does not cover the request."""


class Forbidden(MetergateError):
    """403: credentials that do not open this route (a revoked key, a missing scope)."""


class NotFound(MetergateError):
    """404: no such account, key, plan, invoice, ... (or one outside a customer token's subtree)."""


class Conflict(MetergateError):
    """409: the id is taken, the change is not allowed in this state, or an idempotency key
    was replayed or spent."""


class RateLimited(MetergateError):
    """429: a rate limit or concurrency cap is reached; nothing was charged."""

    retry_after: float | None
    """Seconds to wait (the Retry-After header), None when the request can never pass."""


class Unavailable(MetergateError):
    """503 after every retry: admit could not decide (Redis unavailable, policies loading)."""


_BY_STATUS: dict[int, type[MetergateError]] = {
    400: BadRequest, 401: Unauthorized, 402: PaymentRequired, 403: Forbidden, 404: NotFound, 409: Conflict,
    429: RateLimited, 503: Unavailable,
}


def error_for(status: int, body: dict[str, Any], retry_after: float | None,
              headers: Mapping[str, str] | None = None) -> MetergateError:
    """The typed error of a reply with status, JSON body and headers."""
    err = body.get("error") if isinstance(body.get("error"), dict) else None
    code = str(err.get("code", "")) if err else str(body.get("decision", body.get("reason", "error")))
    message = str(err.get("message", "")) if err else str(body.get("message", "")) or code
    e = _BY_STATUS.get(status, MetergateError)(status, code, message, body, headers)
    if isinstance(e, RateLimited):
        e.retry_after = retry_after
    return e
