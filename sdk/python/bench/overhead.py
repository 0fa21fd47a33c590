"""The Python SDK's client-side overhead: the same admit, timed through metergate.Client
(and AsyncClient) and through a raw httpx call, interleaved in one process.

bench/sdk.go runs it (make bench BENCH_FLAGS=-only=sdk, docs/bench.md) with PYTHONPATH
naming sdk/python/src, and reads the one JSON line it prints: for each client, the
latency of every timed call of the SDK and of the raw call, in ms. The two calls of a pair
run in a random order; the figures are the bench's, not this script's.

The raw call is what a caller without the SDK writes: a POST /v1/admit on a keep-alive
httpx client with the same body and a fresh idempotency key, its status checked and its
JSON decoded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from typing import Any, Awaitable, Callable

import httpx

import metergate

UNITS = {"requests": 1, "tokens": 500}


def raw_body(account: str) -> dict[str, Any]:
    return {"idempotency_key": uuid.uuid4().hex, "account": account, "units": dict(UNITS)}


def check(r: httpx.Response) -> dict[str, Any]:
    if r.status_code != 200:
        raise SystemExit(f"raw admit: {r.status_code} {r.text[:200]}")
    body: dict[str, Any] = r.json()
    return body


def interleave(pairs: int, warmup: int, sdk: Callable[[], object], raw: Callable[[], object]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"sdk_ms": [], "raw_ms": []}
    for i in range(warmup + pairs):
        calls = [("sdk_ms", sdk), ("raw_ms", raw)]
        random.shuffle(calls)
        for name, call in calls:
            begin = time.perf_counter_ns()
            call()
            took = (time.perf_counter_ns() - begin) / 1e6
            if i >= warmup:
                out[name].append(round(took, 4))
    return out


async def ainterleave(pairs: int, warmup: int, sdk: Callable[[], Awaitable[object]],
                      raw: Callable[[], Awaitable[object]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"sdk_ms": [], "raw_ms": []}
    for i in range(warmup + pairs):
        calls = [("sdk_ms", sdk), ("raw_ms", raw)]
        random.shuffle(calls)
        for name, call in calls:
            begin = time.perf_counter_ns()
            await call()
            took = (time.perf_counter_ns() - begin) / 1e6
            if i >= warmup:
                out[name].append(round(took, 4))
    return out


def sync_client(a: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {a.token}"}
    with metergate.Client(base_url=a.url, token=a.token) as client, \
            httpx.Client(base_url=a.url, headers=headers, timeout=5.0) as http:
        samples = interleave(a.pairs, a.warmup,
                             lambda: client.admit(account=a.account, units=UNITS),
                             lambda: check(http.post("/v1/admit", json=raw_body(a.account))))
    return {"name": "python_client", "kind": "client", "subject": "metergate.Client.admit",
            "baseline": "httpx.Client.post (keep-alive), status checked, JSON decoded", **samples}


async def async_client(a: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {a.token}"}
    async with metergate.AsyncClient(base_url=a.url, token=a.token) as client, \
            httpx.AsyncClient(base_url=a.url, headers=headers, timeout=5.0) as http:
        async def raw() -> dict[str, Any]:
            return check(await http.post("/v1/admit", json=raw_body(a.account)))
        samples = await ainterleave(a.pairs, a.warmup, lambda: client.admit(account=a.account, units=UNITS), raw)
    return {"name": "python_async_client", "kind": "client", "subject": "metergate.AsyncClient.admit",
            "baseline": "httpx.AsyncClient.post (keep-alive), status checked, JSON decoded", **samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="admit's address")
    p.add_argument("--token", required=True, help="the service token")
    p.add_argument("--account", required=True, help="the account every call admits")
    p.add_argument("--pairs", type=int, default=1000, help="timed pairs of calls of each client")
    p.add_argument("--warmup", type=int, default=100, help="untimed pairs first")
    a = p.parse_args()
    measures = [sync_client(a), asyncio.run(async_client(a))]
    json.dump({"sdk": "python", "version": sys.version.split()[0], "measures": measures}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
