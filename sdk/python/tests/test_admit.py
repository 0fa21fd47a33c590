"""The clients against a real admit: sdk/sdk_test.go starts one and names it in the
environment (METERGATE_URL, tokens, an org of the suite's own)."""

from __future__ import annotations

import asyncio
import os

import pytest

import metergate

URL = os.environ.get("METERGATE_URL")
pytestmark = pytest.mark.skipif(URL is None, reason="no admit: run through sdk/sdk_test.go (go test ./sdk/)")


def env(name: str) -> str:
    return os.environ[name]


def test_admit_and_report_the_outcome() -> None:
    with metergate.Client(str(URL), env("METERGATE_SERVICE_TOKEN")) as c:
        a = c.admit(account=env("METERGATE_ACCOUNT"), units={"tokens": 1200})
        assert a.event_id and a.org == env("METERGATE_ACCOUNT") and not a.replayed
        c.outcome(a.event_id, status=200, units={"tokens": 1170})


def test_a_replay_is_the_same_admission() -> None:
    with metergate.Client(str(URL), env("METERGATE_SERVICE_TOKEN")) as c:
        first = c.admit(account=env("METERGATE_ACCOUNT"), idempotency_key="sdk-replay-1")
        second = c.admit(account=env("METERGATE_ACCOUNT"), idempotency_key="sdk-replay-1")
        assert second.event_id == first.event_id and second.replayed


def test_refusals_are_typed() -> None:
    with metergate.Client(str(URL), env("METERGATE_SERVICE_TOKEN")) as c:
        with pytest.raises(metergate.Unauthorized) as e:
            c.admit(api_key="mgk_unknown")
        assert e.value.code == "unknown_api_key"
    with metergate.Client(str(URL), "not-the-token") as bad:
        with pytest.raises(metergate.Unauthorized):
            bad.admit(account=env("METERGATE_ACCOUNT"))


def test_async_client() -> None:
    async def run() -> metergate.Admission:
        async with metergate.AsyncClient(str(URL), env("METERGATE_SERVICE_TOKEN")) as c:
            return await c.admit(account=env("METERGATE_ACCOUNT"), units={"requests": 1})

    assert asyncio.run(run()).event_id
