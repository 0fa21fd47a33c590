"""MetergateMiddleware against a real admit: sdk/sdk_test.go starts one and names it in the
environment (METERGATE_URL, tokens, an org of the suite's own). A Starlette app runs
in-process behind the middleware (httpx.ASGITransport); the test makes accounts and API
keys under the org with the admin API and watches admissions and outcomes land."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, Awaitable, Callable, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import metergate
from metergate.asgi import MetergateMiddleware, OutcomeQueue, report_units

URL = os.environ.get("METERGATE_URL")
pytestmark = pytest.mark.skipif(URL is None, reason="no admit: run through sdk/sdk_test.go (go test ./sdk/)")


def env(name: str) -> str:
    return os.environ[name]


@pytest.fixture(scope="module")
def admin() -> Iterator[httpx.Client]:
    with httpx.Client(base_url=str(URL), headers={"Authorization": f"Bearer {env('METERGATE_ADMIN_TOKEN')}"},
                      timeout=10) as c:
        yield c


COUNTED = {"quota": -1}
"""A quota that never refuses, so that GET /v1/usage shows the team's count."""


def account(admin: httpx.Client, **fields: Any) -> str:
    """A new team under the suite's org, its requests counted, with fields (limits,
    concurrency)."""
    name = f"mw-{uuid.uuid4().hex[:10]}"
    fields.setdefault("limits", {"requests": COUNTED})
    r = admin.post("/v1/admin/accounts", json={"id": name, "kind": "team", "parent": env("METERGATE_ACCOUNT"), **fields})
    assert r.status_code == 201, r.text
    return name


def api_key(admin: httpx.Client, account: str) -> tuple[str, str]:
    """A new API key of account, once admit's policies hold it: (secret, id)."""
    r = admin.post("/v1/admin/api-keys", json={"account": account})
    assert r.status_code == 201, r.text
    key, key_id = r.json()["api_key"], r.json()["id"]
    wait_for(lambda: admit_status(key) != 401, "the key reaches admit's policies")
    return key, key_id


def admit_status(key: str) -> int:
    """The status admit answers key. An admission of no requests counts nothing, and its
    outcome gives its concurrency slot back at once."""
    svc = {"Authorization": f"Bearer {env('METERGATE_SERVICE_TOKEN')}"}
    r = httpx.post(f"{URL}/v1/admit", headers=svc, json={"api_key": key, "units": {"requests": 0}})
    if r.status_code == 200:
        done = httpx.post(f"{URL}/v1/outcomes", headers=svc, json={"event_id": r.json()["event_id"], "status": 200})
        assert done.status_code == 202, done.text
    return r.status_code


def wait_for(ok: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def used(account: str) -> int:
    """The requests account's quota counter holds this period (GET /v1/usage)."""
    r = httpx.get(f"{URL}/v1/usage/{account}", headers={"Authorization": f"Bearer {env('METERGATE_SERVICE_TOKEN')}"})
    assert r.status_code == 200, r.text
    return int(r.json()["units"]["requests"]["used"])


async def chat(request: Request) -> JSONResponse:
    request.app.state.served += 1
    report_units(request, {"tokens": 42})
    return JSONResponse({"event_id": request.state.metergate.event_id, "body": (await request.body()).decode()})


def with_app(test: Callable[[httpx.AsyncClient, OutcomeQueue, Starlette], Awaitable[None]]) -> None:
    """Runs test with an in-process app behind the middleware, on a client of a real admit."""
    async def run() -> None:
        async with metergate.AsyncClient(str(URL), env("METERGATE_SERVICE_TOKEN")) as client:
            outcomes = OutcomeQueue(client)
            app = Starlette(routes=[Route("/chat", chat, methods=["POST"])])
            app.state.served = 0
            app.add_middleware(MetergateMiddleware, client=client, outcomes=outcomes,
                               units=lambda scope: {"tokens": 1000})
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
                await test(http, outcomes, app)
                await outcomes.aclose()
    asyncio.run(asyncio.wait_for(run(), 60))


def test_admissions_and_outcomes_land(admin: httpx.Client) -> None:
    # One request in flight at a time: the second is admitted only once the first's outcome
    # released its slot (otherwise it waits for the lease, a minute).
    team = account(admin, concurrency=1)
    key, _ = api_key(admin, team)
    org_before = used(env("METERGATE_ACCOUNT"))

    async def t(http: httpx.AsyncClient, outcomes: OutcomeQueue, app: Starlette) -> None:
        first = await http.post("/chat", headers={"Authorization": f"Bearer {key}"}, content=b"one")
        assert first.status_code == 200, first.text
        assert first.headers["metergate-event-id"] == first.json()["event_id"]
        assert "ratelimit" in first.headers or "ratelimit-policy" in first.headers
        await outcomes.aclose()  # sent now
        assert outcomes.stats.reported == 1 and outcomes.stats.failed == 0
        second = await http.post("/chat", headers={"X-API-Key": key}, content=b"two")
        assert second.status_code == 200, second.text
        assert second.json()["event_id"] != first.json()["event_id"]
        assert app.state.served == 2

    with_app(t)
    assert used(team) == 2 and used(env("METERGATE_ACCOUNT")) - org_before == 2


def test_refusals_come_from_admit(admin: httpx.Client) -> None:
    team = account(admin, limits={"requests": {"limit": 2, "window_s": 3600, **COUNTED}})
    key, key_id = api_key(admin, team)
    other, other_id = api_key(admin, account(admin))

    async def t(http: httpx.AsyncClient, outcomes: OutcomeQueue, app: Starlette) -> None:
        auth = {"Authorization": f"Bearer {key}"}
        for _ in range(2):
            assert (await http.post("/chat", headers=auth)).status_code == 200
        r = await http.post("/chat", headers=auth)
        assert r.status_code == 429 and r.json()["decision"] == "rate_limited"
        assert int(r.headers["retry-after"]) > 0 and r.headers["ratelimit"] and r.headers["ratelimit-policy"]
        r = await http.post("/chat", headers={"Authorization": "Bearer mgk_not_a_key"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unknown_api_key"
        assert app.state.served == 2

        assert admin.delete(f"/v1/admin/api-keys/{other_id}").status_code == 204
        await asyncio.to_thread(wait_for, lambda: admit_status(other) == 403, "the revocation reaches admit")
        r = await http.post("/chat", headers={"Authorization": f"Bearer {other}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "revoked_api_key"

    with_app(t)
    assert used(team) == 2


def test_an_idempotency_key_buys_no_second_serving(admin: httpx.Client) -> None:
    team = account(admin)
    key, _ = api_key(admin, team)

    async def t(http: httpx.AsyncClient, outcomes: OutcomeQueue, app: Starlette) -> None:
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "one-key-for-many"}
        first = await http.post("/chat", headers=headers, content=b"question 1")
        other = await http.post("/chat", headers=headers, content=b"question 2")
        assert first.status_code == other.status_code == 200
        assert first.json()["event_id"] != other.json()["event_id"]
        resent = await http.post("/chat", headers=headers, content=b"question 1")
        assert resent.status_code == 409 and resent.headers["idempotent-replayed"] == "true"
        assert app.state.served == 2

    with_app(t)
    assert used(team) == 2  # the resend was charged nothing
