"""Verifies metergate's webhook deliveries (usage alerts, billing events: docs/webhooks.md),
signed per Standard Webhooks, with the specification's own library (pip install
'metergate[webhooks]').

    from metergate import webhooks

    @app.post("/metergate")
    async def hook(request: Request) -> Response:
        try:
            event = webhooks.verify(SECRET, await request.body(), request.headers)
        except webhooks.VerificationError:
            return Response(status_code=401)
        if seen(request.headers["webhook-id"]):  # retries and replays carry the same id
            return Response(status_code=204)
        ...  # event is the CloudEvent: event["type"], event["data"]

A delivery carries webhook-id (the event's id), webhook-timestamp (Unix seconds) and
webhook-signature ("v1,<base64 HMAC-SHA256 of id.timestamp.body>", keyed with the base64
key after the secret's "whsec_"; two of them, space-separated, while a secret is rotated).
"""

from __future__ import annotations

import binascii
import json
from typing import Any, Mapping

try:
    import standardwebhooks
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("metergate.webhooks needs the standardwebhooks package: pip install 'metergate[webhooks]'") from e

HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")
"""The headers of a signed delivery."""


class VerificationError(Exception):
    """A delivery that is not metergate's: a missing header, a signature that matches no
    secret, a timestamp more than 5 minutes from this clock, or a body that is not a JSON
    object."""


def verify(secret: str, body: bytes | str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The delivery's CloudEvent, once its signature and timestamp check out against
    secret ("whsec_..."); VerificationError otherwise. body must be the request's bytes
    as received (parsing and re-serializing the JSON changes them). ValueError when secret
    is not a webhook secret."""
    try:
        wh = standardwebhooks.Webhook(secret)
    except (binascii.Error, standardwebhooks.webhooks.EmptyWebhookSecretError, RuntimeError) as e:
        raise ValueError(f"not a webhook secret (whsec_<base64>): {e}") from None
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise VerificationError("the body is not UTF-8") from None
    lower = {k.lower(): v for k, v in headers.items()}
    missing = [h for h in HEADERS if not lower.get(h)]
    if missing:
        raise VerificationError(f"missing {', '.join(missing)}")
    try:
        wh.verify(body, lower, json_parse=False)
    except standardwebhooks.webhooks.WebhookVerificationError as e:
        raise VerificationError(str(e)) from None
    except ValueError as e:  # a signature that is not "v1,<base64>", a malformed timestamp
        raise VerificationError(f"malformed signature header: {e}") from None
    try:
        event = json.loads(body)
    except ValueError as e:
        raise VerificationError(f"the body is not JSON: {e}") from None
    if not isinstance(event, dict):
        raise VerificationError(f"the body is a JSON {type(event).__name__}, not an object")
    return event


__all__ = ["HEADERS", "VerificationError", "verify"]
