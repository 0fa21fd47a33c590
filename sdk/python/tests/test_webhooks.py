"""metergate.webhooks.verify against signatures made by the standard (HMAC-SHA256 over
"<id>.<timestamp>.<body>", computed here) and by metergate's own Go signer."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
import standardwebhooks.webhooks

from metergate.webhooks import VerificationError, verify

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
EVENT: dict[str, Any] = {"specversion": "1.0", "id": "invoice.issued/MG-2026-000123", "source": "meter",
         "type": "io.metergate.invoice.issued.v1", "subject": "invoice/MG-2026-000123",
         "data": {"number": "MG-2026-000123", "org": "acme", "currency": "EUR", "total_minor": 142800}}

# Made once by internal/webhook.Sign (the Go deliverer's signer) with a throwaway
# `go run` of:
#   webhook.Sign("alert/acme/requests/p80/2026-11", time.Unix(1795950000, 0), body, GO_SECRETS...)
# signing with two secrets, as during a rotation.
GO_SECRETS = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tdGVzdHM=")
GO_HEADERS = {
    "Webhook-Id": "alert/acme/requests/p80/2026-11",
    "Webhook-Timestamp": "1795950000",
    "Webhook-Signature": "v1,2vhk/+sp/kvu2qi06yrPJWcPSjFRw7HvtWScAWF7LRI= v1,2lAm743ZtBxK7FhQ9M3hSQNhzHoi4xvPKSGm14cdJL0=",
}
GO_BODY = (b'{"specversion":"1.0","id":"alert/acme/requests/p80/2026-11","source":"meter",'
           b'"type":"io.metergate.usage.threshold.v1","subject":"acme","time":"2026-11-23T10:47:20Z",'
           b'"datacontenttype":"application/json","data":{"org":"acme","account":"acme","unit":"requests",'
           b'"period":"2026-11","threshold":"p80","quota":50000,"used":40001}}')


def sign(secret: str, msg_id: str, ts: int, body: bytes) -> dict[str, str]:
    """The headers of a delivery, per the specification, computed here."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts),
            "webhook-signature": "v1," + base64.b64encode(mac).decode()}


def body_of(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode()


def test_a_delivery_signed_now_verifies() -> None:
    body = body_of(EVENT)
    headers = sign(SECRET, EVENT["id"], int(time.time()), body)
    assert verify(SECRET, body, headers) == EVENT
    assert verify(SECRET, body.decode(), {k.title(): v for k, v in headers.items()}) == EVENT  # any case


@pytest.fixture
def at_go_fixture_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's clock at the Go fixture's timestamp (it takes no clock of its own)."""
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Frozen:
            return cls.fromtimestamp(1795950000 + 30, tz)
    monkeypatch.setattr(standardwebhooks.webhooks, "datetime", Frozen)


@pytest.mark.parametrize("secret", GO_SECRETS)
@pytest.mark.usefixtures("at_go_fixture_time")
def test_the_go_signers_delivery_verifies_with_either_secret(secret: str) -> None:
    event = verify(secret, GO_BODY, GO_HEADERS)
    assert event["type"] == "io.metergate.usage.threshold.v1" and event["data"]["used"] == 40001
    # and the signature made here is the Go signer's
    assert sign(secret, GO_HEADERS["Webhook-Id"], 1795950000, GO_BODY)["webhook-signature"] in \
        GO_HEADERS["Webhook-Signature"].split(" ")


@pytest.mark.usefixtures("at_go_fixture_time")
def test_the_go_signers_delivery_tampered_fails() -> None:
    with pytest.raises(VerificationError, match="No matching signature"):
        verify(GO_SECRETS[0], GO_BODY.replace(b"40001", b"1"), GO_HEADERS)
    with pytest.raises(VerificationError, match="No matching signature"):
        verify(GO_SECRETS[0], GO_BODY, dict(GO_HEADERS, **{"Webhook-Id": "alert/other"}))


def test_the_go_signers_delivery_is_too_old_today() -> None:
    with pytest.raises(VerificationError, match="timestamp too (old|new)"):
        verify(GO_SECRETS[0], GO_BODY, GO_HEADERS)


@pytest.mark.parametrize("change,message", [
    (lambda h, b: (dict(h, **{"webhook-timestamp": str(int(time.time()) - 301)}), b), "too old"),
    (lambda h, b: (dict(h, **{"webhook-timestamp": str(int(time.time()) + 301)}), b), "too new"),
    (lambda h, b: (dict(h, **{"webhook-timestamp": "yesterday"}), b), "Invalid Signature Headers"),
    (lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b), "missing webhook-signature"),
    (lambda h, b: (dict(h, **{"webhook-signature": "garbage"}), b), "malformed signature"),
    (lambda h, b: (dict(h, **{"webhook-signature": "v1,not base64!"}), b), "malformed signature|No matching"),
    (lambda h, b: (dict(h, **{"webhook-signature": "v2," + h["webhook-signature"][3:]}), b), "No matching"),
    (lambda h, b: (h, b + b" "), "No matching"),
])
def test_bad_deliveries_are_refused(change: Any, message: str) -> None:
    body = body_of(EVENT)
    headers, body = change(sign(SECRET, EVENT["id"], int(time.time()), body), body)
    with pytest.raises(VerificationError, match=message):
        verify(SECRET, body, headers)


def test_a_signed_body_that_is_not_an_event_is_refused() -> None:
    now = int(time.time())
    for body, message in [(b"\xff\xfe", "not UTF-8"), (b"[1, 2]", "JSON list"), (b"{oops", "not JSON")]:
        with pytest.raises(VerificationError, match=message):
            verify(SECRET, body, sign(SECRET, "id-1", now, body))


def test_a_bad_secret_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="webhook secret"):
        verify("whsec_", b"{}", sign(SECRET, "id-1", int(time.time()), b"{}"))
    with pytest.raises(VerificationError):  # another secret: no signature matches
        verify("whsec_" + base64.b64encode(b"x" * 32).decode(), b"{}", sign(SECRET, "id-1", int(time.time()), b"{}"))
