"""The API surface: every operation of the document is a method of both clients, with the
document's method and path (the first tests, which read the document: METERGATE_OPENAPI, or
internal/api/openapi.yaml); then the admin, service and customer APIs against a real admit
(sdk/sdk_test.go starts one and names it in METERGATE_URL, METERGATE_SERVICE_TOKEN,
METERGATE_ADMIN_TOKEN and METERGATE_ACCOUNT, an org of the suite's own)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import typing
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import httpx
import pytest
import yaml

import metergate
from metergate import models as m
from metergate._api import Admin, Portal, Service
from metergate._operation import Operation, operations

ROOT = Path(__file__).resolve().parents[1]
DOC = Path(os.environ.get("METERGATE_OPENAPI") or ROOT.parents[1] / "internal" / "api" / "openapi.yaml")
URL = os.environ.get("METERGATE_URL")
NAMESPACES: dict[str, type] = {"client": Service, "admin": Admin, "portal": Portal}
ODD = "a/b c%é"  # an id that must be escaped to stay one path segment


def document() -> dict[str, tuple[str, str]]:
    """Every operationId of the document, with its method and path."""
    doc = yaml.safe_load(DOC.read_text())
    return {op["operationId"]: (method.upper(), path) for path, item in doc["paths"].items()
            for method, op in item.items() if isinstance(op, dict) and "operationId" in op}


def method_name(namespace: str, operation_id: str) -> str:
    """An operation's method: its operationId in snake case, without the portal prefix on
    client.portal (createAPIKey is create_api_key, portalGetAccount is get_account)."""
    if namespace == "portal":
        operation_id = re.sub(r"^portal", "", operation_id)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", operation_id).lower()


def sdk() -> list[tuple[str, Operation[Any, Any]]]:
    return [(ns, op) for ns, cls in NAMESPACES.items() for op in operations(cls)]


def test_every_operation_has_a_method_with_its_method_and_path() -> None:
    doc = document()
    assert len(doc) >= 65
    declared = {op.operation_id: (ns, op) for ns, op in sdk() if not op.name.endswith("_file")}
    assert sorted(set(doc) - set(declared)) == [], "operations of the document without a method"
    for ns, op in sdk():
        assert op.operation_id in doc, f"{ns}.{op.name}: {op.operation_id} is not in the document"
        assert (op.method, op.path) == doc[op.operation_id], f"{ns}.{op.name} disagrees with the document"
        want = method_name(ns, op.operation_id)
        assert op.name in (want, want + "_file"), f"{op.operation_id} is {ns}.{want}, not {op.name}"
        assert hasattr(metergate.Client("http://x", "t") if ns == "client" else getattr(
            metergate.Client("http://x", "t"), ns), op.name)


class Sent(Exception):
    def __init__(self, request: httpx.Request) -> None:
        self.request = request


def sample(op: Operation[Any, Any]) -> dict[str, Any]:
    """Arguments for a call of op: each required one, of its type; ids that need escaping."""
    hints = typing.get_type_hints(op.build)
    args: dict[str, Any] = {"account": "acme"} if op.operation_id == "admit" else {}
    for name, p in op.signature.parameters.items():
        if p.default is not p.empty or p.kind is p.VAR_KEYWORD:
            continue
        t = hints[name]
        choices = typing.get_args(t) or (t,)
        if name == "rendering":
            args[name] = "pdf"
        elif datetime in choices:
            args[name] = datetime(2026, 11, 1, tzinfo=timezone.utc)
        elif str in choices:
            args[name] = ODD
        elif int in choices:
            args[name] = 7
        else:
            args[name] = {}
    return args


def expected_path(op: Operation[Any, Any], args: dict[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        v = str(args[match.group(1)])
        return quote(v + (f".{args['rendering']}" if "rendering" in args else ""), safe="")
    return re.sub(r"\{(\w+)\}", value, op.path)


def raise_sent(request: httpx.Request) -> httpx.Response:
    raise Sent(request)


@pytest.mark.parametrize("ns,op", sdk(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_each_method_sends_its_request(ns: str, op: Operation[Any, Any]) -> None:
    """Each method of both clients sends the document's method to its path, ids escaped."""
    args = sample(op)
    with metergate.Client("http://admit", "t", transport=httpx.MockTransport(raise_sent)) as c:
        method: Callable[..., Any] = getattr(c if ns == "client" else getattr(c, ns), op.name)
        with pytest.raises(Sent) as sent:
            method(**args)

    async def run() -> httpx.Request:
        async with metergate.AsyncClient("http://admit", "t", transport=httpx.MockTransport(raise_sent)) as c:
            method: Callable[..., Any] = getattr(c if ns == "client" else getattr(c, ns), op.name)
            with pytest.raises(Sent) as sent:
                await method(**args)
            return sent.value.request

    for request in (sent.value.request, asyncio.run(run())):
        assert request.method == op.method
        assert request.url.raw_path.decode().split("?")[0] == expected_path(op, args)


def test_queries_skip_what_is_not_given() -> None:
    with metergate.Client("http://admit", "t", transport=httpx.MockTransport(raise_sent)) as c:
        with pytest.raises(Sent) as sent:
            c.portal.usage("acme", from_="2026-11-01", granularity="month", limit=5)
        assert dict(sent.value.request.url.params) == {"from": "2026-11-01", "granularity": "month", "limit": "5"}
        with pytest.raises(Sent) as sent:
            c.admin.list_customer_tokens(include_revoked=True)
        assert str(sent.value.request.url.params) == "include_revoked=true"


def test_files_are_bytes_and_204_is_none() -> None:
    replies = {"/v1/admin/invoices/12.pdf": httpx.Response(200, content=b"%PDF-1.7 ...",
                                                           headers={"Content-Type": "application/pdf"}),
               "/v1/admin/alerts/al_1": httpx.Response(204)}
    with metergate.Client("http://admit", "t", transport=httpx.MockTransport(lambda r: replies[r.url.path])) as c:
        assert c.admin.get_invoice_file(12, "pdf") == b"%PDF-1.7 ..."
        assert c.admin.delete_alert("al_1") is None


def test_a_grant_gets_one_idempotency_key_for_its_retries() -> None:
    bodies: list[bytes] = []
    grant = {"id": "gr_" + "0" * 32, "org": "acme", "account": "acme", "unit": "credits", "amount": 5, "priority": 0,
             "source": "purchase", "effective_at": "2026-11-01T00:00:00Z", "created_at": "2026-11-01T00:00:00Z"}

    def admit(r: httpx.Request) -> httpx.Response:
        bodies.append(r.content)
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "m"}}) if len(bodies) == 1 \
            else httpx.Response(201, json=grant)

    with metergate.Client("http://admit", "t", transport=httpx.MockTransport(admit), sleep=lambda _: None) as c:
        assert c.admin.create_grant("acme", {"unit": "credits", "amount": 5, "source": "purchase"}).amount == 5
    assert len(bodies) == 2 and bodies[0] == bodies[1] and b'"idempotency_key"' in bodies[0]


def test_a_create_is_not_retried_after_a_503() -> None:
    calls: list[httpx.Request] = []

    def admit(r: httpx.Request) -> httpx.Response:
        calls.append(r)
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "m"}})

    with metergate.Client("http://admit", "t", transport=httpx.MockTransport(admit), sleep=lambda _: None) as c:
        with pytest.raises(metergate.Unavailable):
            c.admin.create_account({"id": "t1", "kind": "team", "parent": "acme"})
        assert len(calls) == 1, "a POST without an idempotency key may have been written"
        with pytest.raises(metergate.Unavailable):
            c.admin.get_account("t1")
        assert len(calls) == 1 + 4, "a GET is retried"


# Against a real admit.

needs_admit = pytest.mark.skipif(URL is None, reason="no admit: run through sdk/sdk_test.go (go test ./sdk/)")


def env(name: str) -> str:
    return os.environ[name]


def unique(prefix: str) -> str:
    """An id of this suite's own: other suites share the org (and run in parallel)."""
    return f"{env('METERGATE_ACCOUNT')}-{prefix}-{uuid.uuid4().hex[:8]}"


@needs_admit
def test_admin_service_and_portal() -> None:
    org = env("METERGATE_ACCOUNT")
    team = unique("py-team")
    with metergate.Client(str(URL), env("METERGATE_ADMIN_TOKEN")) as admin, \
            metergate.Client(str(URL), env("METERGATE_SERVICE_TOKEN")) as service:
        # Admin: a team under the org, an API key for it, an alert rule.
        created = admin.admin.create_account({"id": team, "kind": "team", "parent": org})
        assert isinstance(created, m.AccountReply) and created.id == team and created.kind is m.Kind.team
        assert admin.admin.get_account(team).parent == org
        key = admin.admin.create_api_key(team)
        assert key.account == team and key.api_key.startswith("mgk_")
        rule = admin.admin.create_alert(m.AlertCreate(account=team, kind=m.AlertKind.quota_percent,
                                                      unit=m.AlertCreateUnit.tokens, thresholds=[50, 90]))
        assert rule.account == team and rule.thresholds == [50, 90]
        assert [r.id for r in admin.admin.list_alerts(account=team).alerts] == [rule.id]
        assert admin.admin.get_alert(rule.id).id == rule.id
        admin.admin.delete_alert(rule.id)
        with pytest.raises(metergate.NotFound):
            admin.admin.get_alert(rule.id)

        # Service: admit by the team's API key once admit has the key (a second at most).
        a = poll(lambda: service.admit(api_key=key.api_key, units={"tokens": 1200}), metergate.Unauthorized)
        assert a.account == team and a.org == org and a.allowed.event_id == a.event_id
        assert service.outcome(a.event_id, 200, {"tokens": 1100}).status is m.OutcomeReplyStatus.accepted
        est = service.estimate({"request": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}],
                                            "max_tokens": 16}})
        assert est.output_tokens == 16 and est.total_tokens > 16
        assert service.usage(org).account == org
        assert service.balance(team).account == team

        # Portal: a customer token of the org, made with the admin API.
        made = admin.admin.create_customer_token({"account": org, "scopes": ["usage:read", "accounts:write"],
                                                  "name": "sdk python"})
        assert admin.admin.get_customer_token(made.id).account == org
    with metergate.Client(str(URL), made.token) as customer:
        me = customer.portal.me()
        assert me.id == made.id and set(me.scopes) == {m.CustomerScope.usage_read, m.CustomerScope.accounts_write}
        view = customer.portal.get_account(team)
        assert view.account.id == team
        assert customer.portal.usage(org, granularity="month").account == org
        children = customer.portal.children(org, limit=199)
        assert team in [c.id for c in children.accounts]
        with pytest.raises(metergate.Forbidden) as e:
            customer.portal.invoices()  # billing:read is not among its scopes
        assert e.value.code == "missing_scope"


def poll(call: Callable[[], metergate.Admission], until_not: type[Exception]) -> metergate.Admission:
    """call's result once it stops raising until_not: admit learns of a new key within a
    second (LISTEN/NOTIFY)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return call()
        except until_not:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@needs_admit
def test_a_bad_input_is_a_typed_error_with_its_code() -> None:
    with metergate.Client(str(URL), env("METERGATE_ADMIN_TOKEN")) as c:
        with pytest.raises(metergate.BadRequest) as bad:
            c.admin.create_account({"id": "not an id!", "kind": "team", "parent": env("METERGATE_ACCOUNT")})
        assert bad.value.status == 400 and bad.value.code == "invalid_id" and bad.value.message
        with pytest.raises(metergate.NotFound) as missing:
            c.admin.get_account(unique("nobody"))
        assert missing.value.code == "not_found"
        with pytest.raises(metergate.NotFound):
            c.admin.get_account(ODD)  # escaped: one segment, an id no account has


@needs_admit
def test_the_async_client() -> None:
    async def run() -> None:
        async with metergate.AsyncClient(str(URL), env("METERGATE_ADMIN_TOKEN")) as c:
            org = await c.admin.get_account(env("METERGATE_ACCOUNT"))
            assert org.kind is m.Kind.org
            plans = await c.admin.list_plans()
            assert isinstance(plans, m.ListPlansResponse)

    asyncio.run(run())


@needs_admit
def test_the_served_document_makes_these_models(tmp_path: Path) -> None:
    """What CI does: the models generated from the document admit serves are models.py."""
    with metergate.Client(str(URL), "") as c:
        served = tmp_path / "openapi.yaml"
        served.write_bytes(c.openapi())
    r = subprocess.run(["sh", str(ROOT / "scripts" / "generate.sh"), "--check", str(served)],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True)
    assert r.returncode == 0, f"models.py is not the served document's: run scripts/generate.sh\n{r.stdout[-3000:]}"
