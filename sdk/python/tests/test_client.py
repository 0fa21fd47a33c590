"""The clients' retry, idempotency and error behaviour, against httpx's mock transport (the
tests against a real admit are tests/test_admit.py and tests/test_api.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import metergate

ALLOW = {"decision": "allow", "event_id": "ev-1", "account": "acme", "org": "acme", "period": "2026-11"}


class Recorder:
    """A transport that answers each request with the next of replies and keeps the bodies."""

    def __init__(self, *replies: httpx.Response | Exception) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content) if request.content else {})
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def client(rec: Recorder, slept: list[float]) -> metergate.Client:
    return metergate.Client("http://admit", "svc", transport=httpx.MockTransport(rec), sleep=slept.append)


def test_retries_503_and_connection_errors_with_the_same_key() -> None:
    rec = Recorder(httpx.Response(503, headers={"Retry-After": "2"}, json={"error": {"code": "unavailable", "message": "m"}}),
                   httpx.ConnectError("refused"), httpx.Response(200, json=ALLOW))
    slept: list[float] = []
    a = client(rec, slept).admit(account="acme", units={"tokens": 1200})
    assert a.event_id == "ev-1"
    assert len(rec.bodies) == 3
    keys = {b["idempotency_key"] for b in rec.bodies}
    assert len(keys) == 1 and keys != {""}, "one key for the logical request, on every try"
    assert slept[0] == 2.0, "Retry-After honoured"
    assert rec.bodies[0]["units"] == {"tokens": 1200}


def test_each_call_has_its_own_key() -> None:
    rec = Recorder(httpx.Response(200, json=ALLOW), httpx.Response(200, json=ALLOW))
    c = client(rec, [])
    c.admit(account="acme")
    c.admit(account="acme")
    assert rec.bodies[0]["idempotency_key"] != rec.bodies[1]["idempotency_key"]


def test_a_given_key_is_sent_as_is() -> None:
    rec = Recorder(httpx.Response(200, json={**ALLOW, "replayed": True}))
    a = client(rec, []).admit(api_key="mgk_x", idempotency_key="req-7f3a")
    assert rec.bodies[0]["idempotency_key"] == "req-7f3a" and rec.bodies[0]["api_key"] == "mgk_x"
    assert a.replayed


def test_unavailable_once_the_retries_are_spent() -> None:
    rec = Recorder(*[httpx.Response(503, json={"error": {"code": "unavailable", "message": "m"}})] * 4)
    slept: list[float] = []
    with pytest.raises(metergate.Unavailable):
        client(rec, slept).admit(account="acme")
    assert len(rec.bodies) == 4 and len(slept) == 3


@pytest.mark.parametrize("status,body,cls", [
    (429, {"decision": "rate_limited", "account": "a", "org": "a", "blocked_by": {}, "retry_after_ms": 1500},
     metergate.RateLimited),
    (402, {"decision": "quota_exceeded", "account": "a", "org": "a", "blocked_by": {}, "period": "2026-11"},
     metergate.PaymentRequired),
    (401, {"error": {"code": "unknown_api_key", "message": "m"}}, metergate.Unauthorized),
    (403, {"error": {"code": "revoked_api_key", "message": "m"}}, metergate.Forbidden),
    (400, {"error": {"code": "invalid_units", "message": "m"}}, metergate.BadRequest),
    (409, {"error": {"code": "idempotency_key_exhausted", "message": "m"}}, metergate.Conflict),
])
def test_refusals_are_typed_and_never_retried(status: int, body: dict[str, Any], cls: type[Exception]) -> None:
    headers = {"Retry-After": "2"} if status == 429 else {}
    rec = Recorder(httpx.Response(status, headers=headers, json=body))
    with pytest.raises(cls) as e:
        client(rec, []).admit(account="a")
    assert len(rec.bodies) == 1
    err = e.value
    assert isinstance(err, metergate.MetergateError) and err.status == status
    assert err.code in (body.get("decision"), body.get("error", {}).get("code"))
    if isinstance(err, metergate.RateLimited):
        assert err.retry_after == 2.0


def test_async_client_retries_with_the_same_key() -> None:
    rec = Recorder(httpx.Response(503, json={"error": {"code": "unavailable", "message": "m"}}), httpx.Response(200, json=ALLOW))
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async def run() -> metergate.Admission:
        async with metergate.AsyncClient("http://admit", "svc", transport=httpx.MockTransport(rec), sleep=sleep) as c:
            return await c.admit(account="acme")

    assert asyncio.run(run()).event_id == "ev-1"
    assert rec.bodies[0]["idempotency_key"] == rec.bodies[1]["idempotency_key"]
    assert len(slept) == 1


RATELIMIT = {"RateLimit-Policy": '"acme-requests";q=300;w=3', "RateLimit": '"acme-requests";r=12;t=1'}


def test_reply_headers_are_kept() -> None:
    rec = Recorder(httpx.Response(200, headers=RATELIMIT, json=ALLOW),
                   httpx.Response(429, headers={**RATELIMIT, "Retry-After": "1"},
                                  json={"decision": "rate_limited", "retry_after_ms": 900}))
    c = client(rec, [])
    assert c.admit(account="acme").headers["ratelimit"] == RATELIMIT["RateLimit"], "any case"
    with pytest.raises(metergate.RateLimited) as e:
        c.admit(account="acme")
    assert e.value.headers["ratelimit-policy"] == RATELIMIT["RateLimit-Policy"] and e.value.retry_after == 1.0


def test_a_connection_never_made_is_retried_even_for_a_create() -> None:
    key = {"id": "key_0123456789abcdef", "account": "acme", "api_key": "mgk_" + "k" * 43,
           "created_at": "2026-11-02T10:00:00Z"}
    rec = Recorder(httpx.ConnectError("refused"), httpx.Response(201, json=key))
    assert client(rec, []).admin.create_api_key("acme").id == "key_0123456789abcdef"
    assert len(rec.bodies) == 2, "admit never saw the first: sent again"

    rec = Recorder(httpx.ReadTimeout("sent, no reply"), httpx.Response(201, json=key))
    with pytest.raises(httpx.ReadTimeout):
        client(rec, []).admin.create_api_key("acme")
    assert len(rec.bodies) == 1, "it may have been written: not sent again"

    rec = Recorder(httpx.ReadTimeout("sent, no reply"), httpx.Response(200, json=ALLOW))
    assert client(rec, []).admit(account="acme").event_id == "ev-1"
    assert len(rec.bodies) == 2 and rec.bodies[0]["idempotency_key"] == rec.bodies[1]["idempotency_key"]
