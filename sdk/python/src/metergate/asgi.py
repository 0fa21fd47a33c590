"""ASGI middleware (FastAPI, Starlette, any ASGI app) that admits every request through
metergate before the app serves it, and reports each admitted request's outcome in the
background.

    from metergate import AsyncClient
    from metergate.asgi import MetergateMiddleware, report_units

    client = AsyncClient(METERGATE_URL, SERVICE_TOKEN)
    app.add_middleware(MetergateMiddleware, client=client, units=lambda scope: {"tokens": 1000})

    @app.post("/chat")
    async def chat(request: Request):
        ...
        report_units(request, {"tokens": actual})   # settles the estimate

- A refusal is answered by the middleware, the app does not run: 429 and 402 with admit's
  JSON body and its RateLimit, RateLimit-Policy and Retry-After headers; 401 or 403 when admit
  refuses the caller's API key; admit's other 4xx (400, 409, 422) as admit sent them.
- An admitted request runs with its RequestMeter in the request's state
  (request.state.metergate: the event id, the units reported so far) and the event id in
  the Metergate-Event-Id response header.
- When the app is done, its status (500 if it raised before answering, 499 if it was
  cancelled before answering) and the units it reported go to POST /v1/outcomes through an
  OutcomeQueue: never on the reply's path, dropped and counted when full.
- When admit cannot decide (unreachable, 5xx after the client's retries), the request is
  answered 503 with Retry-After: 1; with fail_open=True it is served instead, unbilled
  (nothing is admitted, so nothing is charged or reported), and counted in
  OutcomeQueue.stats.unbilled.

Only "http" requests are admitted; "websocket" connections pass through unmetered.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, MutableMapping, TypeVar, Union

import httpx

from ._client import Admission, AsyncClient
from .errors import MetergateError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

T = TypeVar("T")
Resolver = Callable[[Scope], Union[T, Awaitable[T]]]
"""A function of the request's ASGI scope (headers, path, query string; not the body),
plain or async."""

UNITS = ("requests", "tokens", "credits", "cost_micros")
"""metergate's units (docs/admission.md, "Units")."""

MAX_AMOUNT = 10**15
"""The most of one unit a request may carry (docs/admission.md, "Maxima")."""

STATE_KEY = "metergate"
"""The key of the RequestMeter in the scope's state (request.state.metergate)."""

_PASSED_HEADERS = ("ratelimit", "ratelimit-policy", "retry-after")

log = logging.getLogger("metergate.asgi")


def header(scope: Scope, name: str) -> str | None:
    """The first value of the request header name (any case), or None."""
    want = name.lower().encode("latin-1")
    for k, v in scope.get("headers", ()):
        if bytes(k).lower() == want:
            return bytes(v).decode("latin-1")
    return None


def bearer_or_api_key(scope: Scope) -> str | None:
    """The default API-key resolver: the token of "Authorization: Bearer <key>", else the
    X-API-Key header."""
    auth = header(scope, "authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = (header(scope, "x-api-key") or "").strip()
    return key or None


def check_units(units: Mapping[str, int]) -> dict[str, int]:
    """units as a dict, or ValueError naming what is wrong: a unit metergate does not know,
    or an amount that is not a whole number from 0 to 10^15."""
    out: dict[str, int] = {}
    for name, n in units.items():
        if name not in UNITS:
            raise ValueError(f"unknown unit {name!r}: metergate's units are {', '.join(UNITS)}")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"units.{name} must be a whole number, not {type(n).__name__}")
        if not 0 <= n <= MAX_AMOUNT:
            raise ValueError(f"units.{name} must be from 0 to 10^15, not {n}")
        out[name] = n
    return out


@dataclass
class RequestMeter:
    """What the middleware knows of one request, in its state (request.state.metergate).
    admission is None when the request was not admitted: a path the middleware skips, or a
    request served unbilled by fail_open."""

    admission: Admission | None
    idempotency_key: str | None = None
    units: dict[str, int] = field(default_factory=dict)
    """The actual units reported so far; they go with the outcome."""

    @property
    def event_id(self) -> str | None:
        return self.admission.event_id if self.admission else None

    def report_units(self, units: Mapping[str, int]) -> None:
        """Adds units to what this request reports as used: call it once per model call
        (llm.Usage.units() gives a response's). Raises ValueError on a unit metergate does
        not know or an amount out of range."""
        add = check_units(units)
        total = dict(self.units)
        for name, n in add.items():
            total[name] = total.get(name, 0) + n
            if total[name] > MAX_AMOUNT:
                raise ValueError(f"units.{name} would pass 10^15 ({total[name]})")
        self.units = total


def meter(request: Any) -> RequestMeter:
    """The RequestMeter of a request: a Starlette/FastAPI Request or an ASGI scope.
    RuntimeError when the request did not pass MetergateMiddleware."""
    scope = getattr(request, "scope", request)
    m = scope.get("state", {}).get(STATE_KEY) if isinstance(scope, Mapping) else None
    if not isinstance(m, RequestMeter):
        raise RuntimeError("this request did not pass MetergateMiddleware: add it to the app")
    return m


def report_units(request: Any, units: Mapping[str, int]) -> None:
    """Adds the actual units a request used (e.g. {"tokens": 1870}) to its outcome:
    meter(request).report_units(units). A request served without an admission (fail_open)
    keeps them and reports nothing."""
    meter(request).report_units(units)


@dataclass
class Stats:
    """The OutcomeQueue's counters since it was made."""

    reported: int = 0
    """Outcomes admit accepted."""
    dropped: int = 0
    """Outcomes never sent: the queue was full, or still held them when aclose timed out."""
    failed: int = 0
    """Outcomes admit refused, or could not take after the client's retries."""
    unbilled: int = 0
    """Requests served without an admission because admit could not decide (fail_open)."""


class OutcomeQueue:
    """Reports outcomes (POST /v1/outcomes) from a bounded queue drained by worker tasks, so
    a reply never waits for admit. submit never blocks: a full queue drops the outcome and
    counts it (the request stays billed at its admitted units, and its concurrency slot is
    released by admit's lease expiry). Each report is retried by the client's Retry policy
    with the same event id (a second report is a duplicate admit's meter drops). aclose
    sends what is queued; the middleware calls it at lifespan shutdown."""

    def __init__(self, client: AsyncClient, *, maxsize: int = 10_000, workers: int = 4,
                 logger: logging.Logger | None = None) -> None:
        if maxsize < 1 or workers < 1:
            raise ValueError("OutcomeQueue needs maxsize >= 1 and workers >= 1")
        self.stats = Stats()
        self._client, self._maxsize, self._workers = client, maxsize, workers
        self._log = logger or log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, int, dict[str, int]]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight = 0

    @property
    def pending(self) -> int:
        """Outcomes queued or being sent."""
        return (self._queue.qsize() if self._queue else 0) + self._inflight

    def submit(self, event_id: str, status: int, units: Mapping[str, int] | None = None) -> bool:
        """Queues an outcome; False (and counted in stats.dropped) when the queue is full.
        Call it from the event loop."""
        q = self._start()
        try:
            q.put_nowait((event_id, status, dict(units or {})))
            return True
        except asyncio.QueueFull:
            self.stats.dropped += 1
            n = self.stats.dropped
            if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: an overload does not flood the log
                self._log.warning("metergate: outcome queue full: %d outcomes dropped so far", n,
                                  extra={"event_id": event_id, "status": status})
            return False

    def _start(self) -> asyncio.Queue[tuple[str, int, dict[str, int]]]:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            # A queue and its workers belong to one event loop (a test client may run
            # each of its sessions in a new one).
            self._loop, self._queue, self._tasks, self._inflight = loop, asyncio.Queue(self._maxsize), [], 0
        self._tasks = [t for t in self._tasks if not t.done()]
        while len(self._tasks) < self._workers:
            self._tasks.append(loop.create_task(self._work(self._queue)))
        return self._queue

    async def _work(self, q: asyncio.Queue[tuple[str, int, dict[str, int]]]) -> None:
        while True:
            event_id, status, units = await q.get()
            self._inflight += 1
            try:
                await self._client.outcome(event_id, status, units or None)
                self.stats.reported += 1
            except Exception as e:  # a worker outlives any one report
                self.stats.failed += 1
                self._log.warning("metergate: report outcome: %s", e, extra={"event_id": event_id, "status": status})
            finally:
                self._inflight -= 1
                q.task_done()

    async def aclose(self, timeout: float = 10.0) -> None:
        """Waits up to timeout seconds for the queued outcomes to be sent, then stops the
        workers; what is left is counted in stats.dropped. Submitting later starts them
        again."""
        q = self._queue
        if q is None or self._loop is not asyncio.get_running_loop():
            return
        try:
            await asyncio.wait_for(q.join(), timeout)
        except asyncio.TimeoutError:
            left = self.pending
            self.stats.dropped += left
            self._log.warning("metergate: %d outcomes not sent before shutdown", left)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks, self._queue, self._inflight = [], None, 0


async def _resolve(resolver: Resolver[T] | None, scope: Scope) -> T | None:
    if resolver is None:
        return None
    v = resolver(scope)
    if inspect.isawaitable(v):
        return await v
    return v


def _reply_headers(reply: Admission | MetergateError) -> list[tuple[bytes, bytes]]:
    """The RateLimit, RateLimit-Policy and Retry-After headers of admit's reply."""
    headers = {k.lower(): v for k, v in reply.headers.items()}
    return [(name.encode("latin-1"), str(v).encode("latin-1")) for name in _PASSED_HEADERS if (v := headers.get(name))]


async def _send_json(send: Send, status: int, body: Mapping[str, Any],
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body, separators=(",", ":")).encode() + b"\n"
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


class _CallerGone(Exception):
    """The caller hung up before its request's body was read."""


# Codes admit gives when it refuses this service's own token, not the caller's key: a
# misconfiguration of the service, which its callers should not be told is theirs.
_SERVICE_TOKEN_CODES = frozenset({"unauthorized", "forbidden"})


class MetergateMiddleware:
    """Admits every HTTP request through client before app serves it (see the module's
    documentation).

    api_key: the caller's metergate API key, from the scope (default: bearer_or_api_key).
    account: when given, the account to charge (a trusted id the service resolved itself,
      e.g. from its own session); the API key is then not read.
    units: the request's estimated units, e.g. lambda scope: {"tokens": 1000} (None: one
      request). extra: more fields of POST /v1/admit, e.g. {"tool": "llm_call"} or
      {"max_wait_ms": 2000}.
    skip: requests that are not admitted (health checks); they run without an admission.
    idempotency_header: the request header a caller may send so that a resend of a request
      already served is refused 409 idempotency_key_replayed instead of being served and
      charged again. It is never sent to admit as it is: the key admit sees is a hash of the
      caller's credential, the method, the path and query, the header and the body (read
      before admitting, up to max_keyed_body bytes; past that the header is ignored). So a
      caller reusing one key for other requests is served and charged for each, a resend
      of the same request is never served twice for one charge, and no caller can collide
      with another's keys. None ignores the header: every request is new.
    fail_open: when admit cannot decide, serve the request unbilled instead of 503.
    outcomes: the OutcomeQueue to report through (default: one of its own, with defaults);
      give your own to read its stats or to flush it yourself without lifespan events.
    """

    def __init__(self, app: ASGIApp, client: AsyncClient, *,
                 api_key: Resolver[str | None] = bearer_or_api_key,
                 account: Resolver[str | None] | None = None,
                 units: Resolver[Mapping[str, int] | None] | None = None,
                 extra: Resolver[Mapping[str, Any] | None] | None = None,
                 skip: Callable[[Scope], bool] | None = None,
                 idempotency_header: str | None = "idempotency-key",
                 max_keyed_body: int = 1 << 20,
                 event_id_header: str | None = "metergate-event-id",
                 fail_open: bool = False,
                 outcomes: OutcomeQueue | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.app, self.client = app, client
        self._api_key, self._account, self._units, self._extra = api_key, account, units, extra
        self._skip, self._idempotency_header, self._max_keyed_body = skip, idempotency_header, max_keyed_body
        self._event_id_header = event_id_header.lower().encode("latin-1") if event_id_header else None
        self.fail_open = fail_open
        self._log = logger or log
        self.outcomes = outcomes or OutcomeQueue(client, logger=self._log)

    async def aclose(self) -> None:
        """Sends the queued outcomes (OutcomeQueue.aclose); run at lifespan shutdown."""
        await self.outcomes.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
        elif scope["type"] != "http":
            await self.app(scope, receive, send)
        elif self._skip is not None and self._skip(scope):
            scope.setdefault("state", {})[STATE_KEY] = RequestMeter(admission=None)
            await self.app(scope, receive, send)
        else:
            await self._admit(scope, receive, send)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.shutdown":
                await self.aclose()  # before the app's shutdown, which may close the client
            return message
        return wrapped

    async def _idempotency_key(self, scope: Scope, receive: Receive, credential: str) -> tuple[str | None, Receive]:
        """The key admit sees for this request, and the receive the app reads the body from.
        None (the client then makes one key for this request and its retries) unless the
        caller sent the idempotency header and a body of at most max_keyed_body bytes: then
        a hash of the credential, the method, the path and query, the header and the body,
        so that only a resend of the same request by the same caller is its replay."""
        given = header(scope, self._idempotency_header) if self._idempotency_header else None
        if not given:
            return None, receive
        h = hashlib.sha256()
        for part in (credential, str(scope.get("method", "")), str(scope.get("path", "")),
                     bytes(scope.get("query_string", b"")).decode("latin-1"), given):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        read: list[Message] = []
        size, whole = 0, False
        while not whole:
            message = await receive()
            read.append(message)
            if message.get("type") != "http.request":
                raise _CallerGone
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > self._max_keyed_body:
                break
            h.update(chunk)
            whole = not message.get("more_body", False)

        async def replay() -> Message:
            return read.pop(0) if read else await receive()

        return ("mw-" + h.hexdigest()[:48] if whole else None), replay

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        account = await _resolve(self._account, scope) if self._account is not None else None
        api_key = await _resolve(self._api_key, scope) if self._account is None else None
        if not account and not api_key:
            await _send_json(send, 401, _error("missing_credentials", "no API key: send Authorization: Bearer <key>"),
                             [(b"www-authenticate", b"Bearer")])
            return
        credential = f"account:{account}" if account else f"key:{api_key}"
        units = await _resolve(self._units, scope)
        extra = await _resolve(self._extra, scope) or {}
        try:
            key, receive = await self._idempotency_key(scope, receive, credential)
        except _CallerGone:
            return  # nobody to serve, nothing admitted
        try:
            admission = await self.client.admit(account=account or None, api_key=None if account else api_key,
                                                units=units, idempotency_key=key, **extra)
        except MetergateError as e:
            if 400 <= e.status < 500 and not (e.status in (401, 403) and e.code in _SERVICE_TOKEN_CODES):
                await _send_json(send, e.status, e.body or _error(e.code, e.message), _reply_headers(e))
                return
            self._log.error("metergate: admit refused this service or failed: %s", e)
            await self._unavailable(scope, receive, send, fail_open=self.fail_open and e.status >= 500)
            return
        except httpx.HTTPError as e:
            self._log.warning("metergate: admit unreachable: %s", e)
            await self._unavailable(scope, receive, send, fail_open=self.fail_open)
            return

        if admission.replayed and key is not None:
            # The caller's key was admitted, and its request served, before: serving it
            # again would serve a request nobody is billed for.
            await _send_json(send, 409, _error("idempotency_key_replayed",
                                               "a request with this idempotency key was admitted and served already"),
                             [(b"idempotent-replayed", b"true")])
            return
        # (A replay of a key the client made itself is its own retry of this request.)

        m = RequestMeter(admission=admission, idempotency_key=key)
        scope.setdefault("state", {})[STATE_KEY] = m
        extra_headers = _reply_headers(admission)
        if self._event_id_header:
            extra_headers.append((self._event_id_header, admission.event_id.encode("latin-1")))
        status: int | None = None

        async def send_with_event_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start" and status is None:
                status = int(message["status"])
                message = dict(message)
                message["headers"] = [*message.get("headers", ()), *extra_headers]
            await send(message)

        try:
            await self.app(scope, receive, send_with_event_id)
        except asyncio.CancelledError:
            # Cancelled before answering (the server gave up on the request): not the
            # service's failure, so not refunded as a 5xx; the estimate stands.
            status = status or 499
            raise
        finally:
            self.outcomes.submit(admission.event_id, status or 500, m.units)

    async def _unavailable(self, scope: Scope, receive: Receive, send: Send, *, fail_open: bool) -> None:
        if fail_open:
            self.outcomes.stats.unbilled += 1
            scope.setdefault("state", {})[STATE_KEY] = RequestMeter(admission=None)
            await self.app(scope, receive, send)
            return
        await _send_json(send, 503, _error("unavailable", "metering is unavailable; retry later"),
                         [(b"retry-after", b"1")])


__all__ = ["MetergateMiddleware", "OutcomeQueue", "RequestMeter", "Resolver", "Scope", "Stats", "bearer_or_api_key",
           "check_units", "header", "meter", "report_units"]
