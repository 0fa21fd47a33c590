"""The clients: Client (sync) and AsyncClient, over httpx. Both run the operations of
_api.py; this module sends them: the URL, the body, retries, and the reply's decoding."""

from __future__ import annotations

import asyncio
import enum
import random
import time
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Awaitable, Callable, TypeVar, cast

import httpx
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from ._api import Admin, Admission, Portal, Service
from ._operation import Async, Call, Operation, Sync
from .errors import MetergateError, error_for

T = TypeVar("T")

# Failures before the request left: retried whatever the operation, since admit never saw it.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


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


def _retry_after(r: httpx.Response) -> float | None:
    v = r.headers.get("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, (date, datetime)):
        return v.isoformat()
    return str(v)


def _build(http: httpx.Client | httpx.AsyncClient, op: Operation[Any, Any], call: Call[Any]) -> httpx.Request:
    body = call.body
    if isinstance(body, BaseModel):
        body = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
    elif body is not None:
        body = to_jsonable_python(body)
    params = {k: _query_value(v) for k, v in call.query.items() if v is not None}
    return http.build_request(op.method, op.url(call), params=params or None, json=body)


def _decode(call: Call[T], r: httpx.Response) -> T:
    """The reply of a call, or its typed error."""
    if r.status_code >= 300:
        body: dict[str, Any] = {}
        try:
            decoded = r.json()
            if isinstance(decoded, dict):
                body = decoded
        except ValueError:
            body = {"error": {"code": "error", "message": r.text[:200]}}
        raise error_for(r.status_code, body, _retry_after(r), r.headers)
    reply: type[Any] = call.reply
    if reply is type(None):
        return cast(T, None)
    if reply is bytes:
        return cast(T, r.content)
    if reply is Admission:
        return cast(T, Admission.of(r.json(), r.headers))
    return cast(T, cast(type[BaseModel], reply).model_validate_json(r.content))


def _retryable(op: Operation[Any, Any], call: Call[Any], attempt: int, attempts: int,
               error: httpx.TransportError | None, r: httpx.Response | None) -> bool:
    if attempt >= attempts:
        return False
    if error is not None:
        return isinstance(error, _NOT_SENT) or op.retries(call)
    return r is not None and r.status_code == 503 and op.retries(call)


class _SyncRunner(Sync):
    def __init__(self, http: httpx.Client, retry: Retry, sleep: Callable[[float], None]) -> None:
        self.http, self.retry, self.sleep = http, retry, sleep

    def run(self, op: Operation[Any, T], call: Call[T]) -> T:
        request = _build(self.http, op, call)
        attempt = 1
        while True:
            try:
                r = self.http.send(request)
            except httpx.TransportError as e:
                if not _retryable(op, call, attempt, self.retry.attempts, e, None):
                    raise
                self.sleep(self.retry.delay(attempt, None))
            else:
                if not _retryable(op, call, attempt, self.retry.attempts, None, r):
                    return _decode(call, r)
                self.sleep(self.retry.delay(attempt, _retry_after(r)))
            attempt += 1


class _AsyncRunner(Async):
    def __init__(self, http: httpx.AsyncClient, retry: Retry, sleep: Callable[[float], Awaitable[Any]]) -> None:
        self.http, self.retry, self.sleep = http, retry, sleep

    async def run(self, op: Operation[Any, T], call: Call[T]) -> T:
        request = _build(self.http, op, call)
        attempt = 1
        while True:
            try:
                r = await self.http.send(request)
            except httpx.TransportError as e:
                if not _retryable(op, call, attempt, self.retry.attempts, e, None):
                    raise
                await self.sleep(self.retry.delay(attempt, None))
            else:
                if not _retryable(op, call, attempt, self.retry.attempts, None, r):
                    return _decode(call, r)
                await self.sleep(self.retry.delay(attempt, _retry_after(r)))
            attempt += 1


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class Client(Service[Sync]):
    """metergate's APIs over HTTP, synchronously: the service API on the client itself
    (admit, outcome, estimate, usage, balance), the admin API on client.admin, the
    customer API on client.portal. token is the token the calls need: the service token,
    the admin token (or a staff member's), or a customer token ("" for none: openapi())."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 5.0, retry: Retry = Retry(),
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport, headers=_auth(token))
        super().__init__(_SyncRunner(self._http, retry, sleep))
        self.admin = Admin(self._runner)
        self.portal = Portal(self._runner)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient(Service[Async]):
    """Client's twin for asyncio: the same methods, awaited."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 5.0, retry: Retry = Retry(),
                 transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport, headers=_auth(token))
        super().__init__(_AsyncRunner(self._http, retry, sleep))
        self.admin = Admin(self._runner)
        self.portal = Portal(self._runner)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


__all__ = ["Admission", "AsyncClient", "Client", "MetergateError", "Retry"]
