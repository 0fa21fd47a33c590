"""MetergateMiddleware against a fake admit (httpx.MockTransport) and a Starlette app
driven in-process (httpx.ASGITransport, and the lifespan protocol by hand)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, MutableMapping

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from metergate import AsyncClient, Retry
from metergate.asgi import MetergateMiddleware, OutcomeQueue, RequestMeter, meter, report_units

RATELIMIT = {"RateLimit": '"acme-requests";r=0;t=3', "RateLimit-Policy": '"acme-requests";q=10;w=1'}


def eid(n: int) -> str:
    """The event id admit would give the nth request."""
    return f"01a20804-77e5-7ea0-a840-{n:012d}.15.acme"


async def no_sleep(_: float) -> None:
    return None


@dataclass
class FakeAdmit:
    """admit's decision API: each POST /v1/admit is answered by the next of admit_replies
    (then by allow), each POST /v1/outcomes by the next of outcome_replies (then 202), after
    outcome_gate is set."""

    admit_replies: list[httpx.Response | Exception] = field(default_factory=list)
    outcome_replies: list[httpx.Response | Exception] = field(default_factory=list)
    admits: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    outcome_gate: asyncio.Event | None = None
    outcome_entered: asyncio.Event = field(default_factory=asyncio.Event)
    said: list[str] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/admit":
            self.admits.append(body)
            reply = self.admit_replies.pop(0) if self.admit_replies else self.allow(eid(len(self.admits)))
        else:
            self.outcome_entered.set()
            if self.outcome_gate is not None:
                await self.outcome_gate.wait()
            self.outcomes.append(body)
            self.said.append("outcome")
            reply = self.outcome_replies.pop(0) if self.outcome_replies else httpx.Response(
                202, json={"event_id": body["event_id"], "status": "accepted"})
        if isinstance(reply, Exception):
            raise reply
        return reply

    @staticmethod
    def allow(event_id: str, replayed: bool = False) -> httpx.Response:
        return httpx.Response(200, headers=RATELIMIT, json={
            "decision": "allow", "event_id": event_id, "account": "acme", "org": "acme", "period": "2026-11",
            **({"replayed": True} if replayed else {})})


async def chat(request: Request) -> JSONResponse:
    request.app.state.served += 1
    report_units(request, {"tokens": 1234})
    m: RequestMeter = request.state.metergate
    return JSONResponse({"event_id": m.event_id, "body": (await request.body()).decode()})


async def boom(request: Request) -> PlainTextResponse:
    request.app.state.served += 1
    raise RuntimeError("the model fell over")


async def stream(request: Request) -> StreamingResponse:
    async def chunks() -> Any:
        for i in range(3):
            yield f"chunk {i}\n"
        report_units(request, {"tokens": 30})  # known once the stream ends
    return StreamingResponse(chunks())


async def health(request: Request) -> PlainTextResponse:
    meter(request)  # present, with no admission
    return PlainTextResponse("ok" if meter(request).admission is None else "admitted")


@dataclass
class Bundle:
    admit: FakeAdmit
    client: AsyncClient
    outcomes: OutcomeQueue
    app: Starlette
    http: httpx.AsyncClient


def setup(admit: FakeAdmit | None = None, maxsize: int = 100, workers: int = 1, **options: Any) -> Bundle:
    admit = admit or FakeAdmit()
    client = AsyncClient("http://admit", "svc", transport=httpx.MockTransport(admit), sleep=no_sleep,
                         retry=Retry(attempts=3))
    outcomes = OutcomeQueue(client, maxsize=maxsize, workers=workers)
    app = Starlette(routes=[Route("/chat", chat, methods=["POST"]), Route("/boom", boom), Route("/stream", stream),
                            Route("/healthz", health)])
    app.state.served = 0
    app.add_middleware(MetergateMiddleware, client=client, outcomes=outcomes,
                       units=lambda scope: {"tokens": 1000}, skip=lambda scope: scope["path"] == "/healthz", **options)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://app")
    return Bundle(admit, client, outcomes, app, http)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


KEY = {"Authorization": "Bearer mgk_alice"}


def test_an_admitted_request_runs_with_its_event_id_and_reports_actual_units() -> None:
    async def t() -> None:
        b = setup()
        r = await b.http.post("/chat", headers=KEY, content=b"hi")
        assert r.status_code == 200
        assert r.json()["event_id"] == eid(1) and r.headers["metergate-event-id"] == eid(1)
        assert b.admit.admits[0]["api_key"] == "mgk_alice" and b.admit.admits[0]["units"] == {"tokens": 1000}
        await b.outcomes.aclose()
        assert b.admit.outcomes == [{"event_id": eid(1), "status": 200, "units": {"tokens": 1234}}]
        assert b.outcomes.stats.reported == 1
    run(t)


def test_the_api_key_comes_from_x_api_key_or_a_resolver_and_none_is_401() -> None:
    async def t() -> None:
        b = setup()
        assert (await b.http.post("/chat", headers={"X-API-Key": "mgk_bob"})).status_code == 200
        r = await b.http.post("/chat")
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_credentials"
        assert [a["api_key"] for a in b.admit.admits] == ["mgk_bob"]  # nothing asked for the second

        c = setup(account=lambda scope: "team-a")
        assert (await c.http.post("/chat", headers=KEY)).status_code == 200
        assert c.admit.admits[0]["account"] == "team-a" and "api_key" not in c.admit.admits[0]
    run(t)


@pytest.mark.parametrize("status,code,retry_after", [(429, "rate_limited", "3"), (402, "quota_exceeded", None)])
def test_refusals_are_answered_with_admits_body_and_headers(status: int, code: str, retry_after: str | None) -> None:
    async def t() -> None:
        body = {"decision": code, "account": "acme", "org": "acme",
                "blocked_by": {"account": "acme", "level": "org", "unit": "requests"}}
        headers = dict(RATELIMIT, **({"Retry-After": retry_after} if retry_after else {}))
        b = setup(FakeAdmit(admit_replies=[httpx.Response(status, headers=headers, json=body)]))
        r = await b.http.post("/chat", headers=KEY)
        assert r.status_code == status and r.json() == body
        assert r.headers.get("retry-after") == retry_after
        assert b.app.state.served == 0
        await b.outcomes.aclose()
        assert b.admit.outcomes == []  # nothing admitted, nothing to report
    run(t)


@pytest.mark.parametrize("status", [200, 429, 402])
def test_ratelimit_fields_reach_the_caller(status: int) -> None:
    async def t() -> None:
        reply = FakeAdmit.allow(eid(1)) if status == 200 else httpx.Response(status, headers=RATELIMIT, json={})
        b = setup(FakeAdmit(admit_replies=[reply]))
        r = await b.http.post("/chat", headers=KEY)
        assert r.status_code == status
        assert r.headers.get("ratelimit") == RATELIMIT["RateLimit"]
        assert r.headers.get("ratelimit-policy") == RATELIMIT["RateLimit-Policy"]
    run(t)


@pytest.mark.parametrize("status,code,want", [
    (401, "unknown_api_key", 401),  # the caller's key
    (403, "revoked_api_key", 403),
    (422, "idempotency_key_reused", 422),
    (401, "unauthorized", 503),  # this service's token: not the caller's fault
    (403, "forbidden", 503),
])
def test_key_refusals_pass_and_service_token_refusals_do_not(status: int, code: str, want: int) -> None:
    async def t() -> None:
        err = {"error": {"code": code, "message": "no"}}
        b = setup(FakeAdmit(admit_replies=[httpx.Response(status, json=err)]), fail_open=True)
        r = await b.http.post("/chat", headers=KEY)
        assert r.status_code == want and b.app.state.served == 0
        if want != 503:
            assert r.json() == err
    run(t)


def test_admit_unavailable_fails_closed_or_open_unbilled() -> None:
    async def t() -> None:
        down = [httpx.Response(503, headers={"Retry-After": "1"}, json={"error": {"code": "unavailable"}})] * 3
        b = setup(FakeAdmit(admit_replies=list(down)))
        r = await b.http.post("/chat", headers=KEY)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "unavailable" and b.app.state.served == 0
        assert len(b.admit.admits) == 3  # the client's retries, spent

        dead = setup(FakeAdmit(admit_replies=[httpx.ConnectError("refused")] * 3))
        assert (await dead.http.post("/chat", headers=KEY)).status_code == 503

        o = setup(FakeAdmit(admit_replies=[httpx.ConnectError("refused")] * 3), fail_open=True)
        r = await o.http.post("/chat", headers=KEY)
        assert r.status_code == 200 and r.json()["event_id"] is None and "metergate-event-id" not in r.headers
        await o.outcomes.aclose()
        assert o.outcomes.stats.unbilled == 1 and o.admit.outcomes == []
    run(t)


def test_a_retried_admit_keeps_its_key() -> None:
    async def t() -> None:
        b = setup(FakeAdmit(admit_replies=[httpx.Response(503, json={"error": {"code": "unavailable"}}),
                                           httpx.ReadTimeout("slow")]))
        r = await b.http.post("/chat", headers=KEY)
        assert r.status_code == 200
        keys = [a["idempotency_key"] for a in b.admit.admits]
        assert len(keys) == 3 and len(set(keys)) == 1 and keys[0]
    run(t)


def test_a_crash_reports_500_and_a_stream_its_units_at_the_end() -> None:
    async def t() -> None:
        b = setup()
        assert (await b.http.get("/boom", headers=KEY)).status_code == 500
        r = await b.http.get("/stream", headers=KEY)
        assert r.status_code == 200 and r.text == "chunk 0\nchunk 1\nchunk 2\n"
        await b.outcomes.aclose()
        assert b.admit.outcomes == [{"event_id": eid(1), "status": 500},  # a 5xx is refunded
                                    {"event_id": eid(2), "status": 200, "units": {"tokens": 30}}]
    run(t)


def test_skipped_paths_run_without_an_admission() -> None:
    async def t() -> None:
        b = setup()
        r = await b.http.get("/healthz")
        assert r.status_code == 200 and r.text == "ok" and b.admit.admits == []
    run(t)


def test_a_reused_idempotency_key_buys_nothing() -> None:
    async def t() -> None:
        b = setup()
        idem = {"Idempotency-Key": "k-1"}
        await b.http.post("/chat", headers={**KEY, **idem}, content=b"question 1")
        await b.http.post("/chat", headers={**KEY, **idem}, content=b"question 2")  # another request, same key
        await b.http.post("/chat", headers={"Authorization": "Bearer mgk_bob", **idem}, content=b"question 1")
        await b.http.post("/chat", headers=KEY, content=b"question 1")  # no key: the client makes one
        keys = [a["idempotency_key"] for a in b.admit.admits]
        assert all(k != "k-1" for k in keys)
        assert len(set(keys)) == 4, "each request is charged on its own key"
        assert all(k.startswith("mw-") for k in keys[:3])

        # The same request resent with its key is its replay: refused, not served again.
        b.admit.admit_replies.append(FakeAdmit.allow(eid(1), replayed=True))
        r = await b.http.post("/chat", headers={**KEY, **idem}, content=b"question 1")
        assert r.status_code == 409 and r.headers["idempotent-replayed"] == "true"
        assert r.json()["error"]["code"] == "idempotency_key_replayed"
        assert b.admit.admits[-1]["idempotency_key"] == keys[0]
        assert b.app.state.served == 4

        # The app still reads the body it was sent, and a body too large to hash is not keyed.
        c = setup(max_keyed_body=4)
        r = await c.http.post("/chat", headers={**KEY, **idem}, content=b"a longer body")
        assert r.json()["body"] == "a longer body" and not c.admit.admits[0]["idempotency_key"].startswith("mw-")
    run(t)


def test_a_replayed_key_the_client_made_is_served() -> None:
    async def t() -> None:
        # admit answered a try whose reply was lost: the retry is replayed, and it is this request.
        b = setup(FakeAdmit(admit_replies=[httpx.ReadTimeout("lost"), FakeAdmit.allow(eid(9), replayed=True)]))
        r = await b.http.post("/chat", headers=KEY)
        assert r.status_code == 200 and r.json()["event_id"] == eid(9)
    run(t)


def test_outcomes_never_hold_a_reply_and_a_full_queue_drops() -> None:
    async def t() -> None:
        gate = asyncio.Event()
        b = setup(FakeAdmit(outcome_gate=gate), maxsize=2, workers=1)
        assert (await asyncio.wait_for(b.http.post("/chat", headers=KEY), 5)).status_code == 200
        await b.admit.outcome_entered.wait()  # the worker holds the first outcome, and admit does not answer
        for _ in range(9):
            r = await asyncio.wait_for(b.http.post("/chat", headers=KEY), 5)  # fails if a reply waits for outcomes
            assert r.status_code == 200
        assert b.outcomes.pending == 3 and b.outcomes.stats.dropped == 7
        gate.set()
        await b.outcomes.aclose()
        assert b.outcomes.stats.reported == 3 and len(b.admit.outcomes) == 3
    run(t)


def test_a_failed_outcome_is_retried_with_its_event_id_then_counted() -> None:
    async def t() -> None:
        b = setup(FakeAdmit(outcome_replies=[httpx.ConnectError("down"), httpx.Response(503, json={}),
                                             httpx.Response(202, json={"event_id": eid(1), "status": "accepted"}),
                                             httpx.Response(400, json={"error": {"code": "invalid_event_id"}})]))
        await b.http.post("/chat", headers=KEY)
        await b.http.post("/chat", headers=KEY)
        await b.outcomes.aclose()
        assert [o["event_id"] for o in b.admit.outcomes] == [eid(1), eid(1), eid(1), eid(2)]
        assert b.outcomes.stats.reported == 1 and b.outcomes.stats.failed == 1
    run(t)


def test_lifespan_shutdown_sends_what_is_queued() -> None:
    async def t() -> None:
        gate = asyncio.Event()
        b = setup(FakeAdmit(outcome_gate=gate))
        to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        said: list[str] = []  # what the app told the server, and when outcomes reached admit

        async def receive() -> dict[str, Any]:
            message = await to_app.get()
            if message["type"] == "lifespan.shutdown":
                gate.set()  # admit answers outcomes only from now on
            return message

        async def send(message: MutableMapping[str, Any]) -> None:
            said.append(message["type"])

        b.admit.said = said
        lifespan = asyncio.create_task(b.app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                             receive, send))
        await to_app.put({"type": "lifespan.startup"})
        for _ in range(3):
            assert (await b.http.post("/chat", headers=KEY)).status_code == 200
        await to_app.put({"type": "lifespan.shutdown"})
        await lifespan
        # Sent before the server was told it may stop.
        assert said == ["lifespan.startup.complete", "outcome", "outcome", "outcome", "lifespan.shutdown.complete"]
    run(t)


def test_a_request_cancelled_before_its_answer_reports_499() -> None:
    async def t() -> None:
        admit = FakeAdmit()
        client = AsyncClient("http://admit", "svc", transport=httpx.MockTransport(admit))
        entered = asyncio.Event()

        async def hangs(scope: Any, receive: Any, send: Any) -> None:
            entered.set()
            await asyncio.Event().wait()

        mw = MetergateMiddleware(hangs, client)
        scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"authorization", b"Bearer k")]}

        async def send(_: Any) -> None:
            return None

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        task = asyncio.create_task(mw(scope, receive, send))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await mw.aclose()
        assert admit.outcomes == [{"event_id": eid(1), "status": 499}]  # not a 5xx: no refund
    run(t)


def test_report_units_checks_its_input() -> None:
    m = RequestMeter(admission=None)
    m.report_units({"tokens": 10})
    m.report_units({"tokens": 5, "credits": 1})
    assert m.units == {"tokens": 15, "credits": 1}
    cases: list[tuple[Mapping[str, Any], str]] = [
        ({"tokenz": 1}, "unknown unit"), ({"tokens": -1}, "from 0"), ({"tokens": 1.5}, "whole number"),
        ({"tokens": True}, "whole number"), ({"tokens": 10**15}, r"pass 10\^15")]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m.report_units(bad)
    assert m.units == {"tokens": 15, "credits": 1}  # a refused report changes nothing
    with pytest.raises(RuntimeError, match="MetergateMiddleware"):
        report_units({"type": "http"}, {"tokens": 1})
