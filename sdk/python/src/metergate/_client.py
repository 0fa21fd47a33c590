"""The clients: Client (sync) and AsyncClient, over httpx."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import httpx

from .errors import MetergateError, error_for


@dataclass(frozen=True)
class Retry:
    """How a request that admit could not decide (503, a connection error) is retried: with
    the same idempotency key, so a retry is never charged twice, after Retry-After when
    admit sends one, else an exponential backoff with full jitter."""

    attempts: int = 4
    base: float = 0.05
    cap: float = 2.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before retry number attempt (1 for the first retry)."""
        if retry_after is not None:
            return min(retry_after, self.cap * 4)
        return random.uniform(0, min(self.cap, self.base * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Admission:
    """An admitted request: its event id (report its outcome with it) and the reply."""

    event_id: str
    account: str
    org: str
    period: str
    replayed: bool
    reply: dict[str, Any]


def _admit_body(account: str | None, api_key: str | None, units: Mapping[str, int] | None,
                idempotency_key: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    if (account is None) == (api_key is None):
        raise ValueError("give exactly one of account and api_key")
    body: dict[str, Any] = {"idempotency_key": idempotency_key or uuid.uuid4().hex}
    if account is not None:
        body["account"] = account
    else:
        body["api_key"] = api_key
    if units:
        body["units"] = dict(units)
    body.update(extra)
    return body


def _retry_after(r: httpx.Response) -> float | None:
    v = r.headers.get("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _result(r: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = {}
    try:
        decoded = r.json()
        if isinstance(decoded, dict):
            body = decoded
    except ValueError:
        body = {"error": {"code": "error", "message": r.text[:200]}}
    if r.status_code >= 300:
        raise error_for(r.status_code, body, _retry_after(r))
    return body


def _admission(body: dict[str, Any]) -> Admission:
    return Admission(event_id=str(body["event_id"]), account=str(body.get("account", "")), org=str(body.get("org", "")),
                     period=str(body.get("period", "")), replayed=bool(body.get("replayed", False)), reply=body)


class Client:
    """metergate's APIs over HTTP, synchronously. token is the service token for admit and
    outcomes (or a customer token for the customer API)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 5.0, retry: Retry = Retry(),
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport,
                                  headers={"Authorization": f"Bearer {token}"})
        self._retry, self._sleep = retry, sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(1, self._retry.attempts + 1):
            try:
                r = self._http.post(path, json=body)
            except httpx.TransportError:
                if attempt == self._retry.attempts:
                    raise
                self._sleep(self._retry.delay(attempt, None))
                continue
            if r.status_code == 503 and attempt < self._retry.attempts:
                self._sleep(self._retry.delay(attempt, _retry_after(r)))
                continue
            return _result(r)
        raise AssertionError("unreachable")

    def admit(self, *, account: str | None = None, api_key: str | None = None, units: Mapping[str, int] | None = None,
              idempotency_key: str | None = None, **extra: Any) -> Admission:
        """Asks admit to admit one request (POST /v1/admit). One idempotency key per call,
        made when not given, is sent on every retry: a retry is never charged twice.
        Raises RateLimited (429), PaymentRequired (402), Unauthorized, Forbidden, or
        Unavailable once the retries are spent."""
        return _admission(self._post("/v1/admit", _admit_body(account, api_key, units, idempotency_key, extra)))

    def outcome(self, event_id: str, status: int, units: Mapping[str, int] | None = None) -> None:
        """Reports how an admitted request ended upstream (POST /v1/outcomes): its status and
        its actual units (tokens)."""
        body: dict[str, Any] = {"event_id": event_id, "status": status}
        if units:
            body["units"] = dict(units)
        self._post("/v1/outcomes", body)


class AsyncClient:
    """Client's twin for asyncio."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 5.0, retry: Retry = Retry(),
                 transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport,
                                       headers={"Authorization": f"Bearer {token}"})
        self._retry, self._sleep = retry, sleep

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(1, self._retry.attempts + 1):
            try:
                r = await self._http.post(path, json=body)
            except httpx.TransportError:
                if attempt == self._retry.attempts:
                    raise
                await self._sleep(self._retry.delay(attempt, None))
                continue
            if r.status_code == 503 and attempt < self._retry.attempts:
                await self._sleep(self._retry.delay(attempt, _retry_after(r)))
                continue
            return _result(r)
        raise AssertionError("unreachable")

    async def admit(self, *, account: str | None = None, api_key: str | None = None,
                    units: Mapping[str, int] | None = None, idempotency_key: str | None = None,
                    **extra: Any) -> Admission:
        """Client.admit, awaited."""
        return _admission(await self._post("/v1/admit", _admit_body(account, api_key, units, idempotency_key, extra)))

    async def outcome(self, event_id: str, status: int, units: Mapping[str, int] | None = None) -> None:
        """Client.outcome, awaited."""
        body: dict[str, Any] = {"event_id": event_id, "status": status}
        if units:
            body["units"] = dict(units)
        await self._post("/v1/outcomes", body)


__all__ = ["Admission", "AsyncClient", "Client", "MetergateError", "Retry"]
