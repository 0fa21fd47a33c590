"""What metergate.asgi.MetergateMiddleware adds to an app's request: the same Starlette
app, served by uvicorn in a process of its own, asked for its route that the middleware
admits and for its route that the middleware skips, interleaved from this process.

bench/sdk.go runs it (make bench BENCH_FLAGS=-only=sdk, docs/bench.md) with PYTHONPATH
naming sdk/python/src, and reads the one JSON line it prints: the latency of every timed
request of each route, in ms, and of a raw admit of the same kind (POST /v1/admit with
the caller's API key, the same units, httpx.AsyncClient as the middleware's client) from
this process: the middleware's call without the middleware. The three calls of a round run in a random order; the figures are the bench's.

The app's two routes answer the same small JSON; the metered one is admitted with the
caller's API key (its Authorization header, the middleware's default) and one request and
500 tokens, and its outcome is reported in the background after the reply, as in any app.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx

UNITS = {"requests": 1, "tokens": 500}


def serve(a: argparse.Namespace) -> None:
    """The app, on the listening socket inherited as a.fd."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import metergate
    from metergate.asgi import MetergateMiddleware

    async def hello(_: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    client = metergate.AsyncClient(base_url=a.url, token=a.token)
    app = Starlette(routes=[Route("/metered", hello), Route("/plain", hello)], middleware=[
        Middleware(MetergateMiddleware, client=client, units=lambda scope: UNITS,
                   skip=lambda scope: scope["path"] == "/plain")])
    # The socket as itself (uvicorn's fd= takes any descriptor for a Unix socket, and
    # asyncio sets TCP_NODELAY only on TCP ones: Nagle's delay would be measured).
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[socket.socket(fileno=a.fd)])


def measure(a: argparse.Namespace) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "serve", "--fd", str(sock.fileno()), "--url", a.url, "--token", a.token],
                              pass_fds=[sock.fileno()])
    sock.close()
    try:
        samples = asyncio.run(timed(a, f"http://127.0.0.1:{port}"))
    finally:
        server.send_signal(signal.SIGTERM)  # the lifespan's shutdown sends the queued outcomes
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
    measures = [{"name": "python_asgi", "kind": "middleware",
                 "subject": "a Starlette route behind metergate.asgi.MetergateMiddleware (uvicorn)",
                 "baseline": "the same app's route the middleware skips",
                 "sdk_ms": samples["metered"], "raw_ms": samples["plain"], "admit_ms": samples["admit"]}]
    json.dump({"sdk": "python", "version": sys.version.split()[0], "measures": measures}, sys.stdout)
    sys.stdout.write("\n")


async def timed(a: argparse.Namespace, app_url: str) -> dict[str, list[float]]:
    # httpx.AsyncClient for all three, as the middleware's client is one: the raw admit
    # is the middleware's call without the middleware.
    auth = {"Authorization": f"Bearer {a.api_key}"}
    async with httpx.AsyncClient(base_url=app_url, headers=auth, timeout=5.0) as app, \
            httpx.AsyncClient(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=5.0) as admit:
        deadline = time.monotonic() + 30
        while True:  # the app is up
            try:
                if (await app.get("/plain")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the app did not answer within 30 s")
            await asyncio.sleep(0.05)

        async def call(name: str) -> None:
            if name == "admit":
                r = await admit.post("/v1/admit", json={"idempotency_key": uuid.uuid4().hex, "api_key": a.api_key, "units": UNITS})
            else:
                r = await app.get("/" + name)
            if r.status_code != 200:
                raise SystemExit(f"{name}: {r.status_code} {r.text[:200]}")
            r.json()

        out: dict[str, list[float]] = {"metered": [], "plain": [], "admit": []}
        for i in range(a.warmup + a.pairs):
            names = list(out)
            random.shuffle(names)
            for name in names:
                begin = time.perf_counter_ns()
                await call(name)
                took = (time.perf_counter_ns() - begin) / 1e6
                if i >= a.warmup:
                    out[name].append(round(took, 4))
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", choices=["measure", "serve"], default="measure")
    p.add_argument("--url", required=True, help="admit's address")
    p.add_argument("--token", required=True, help="the service token")
    p.add_argument("--api-key", help="the caller's API key (measure)")
    p.add_argument("--pairs", type=int, default=1000, help="timed rounds of the three calls")
    p.add_argument("--warmup", type=int, default=100, help="untimed rounds first")
    p.add_argument("--fd", type=int, help="the listening socket (serve)")
    a = p.parse_args()
    if a.mode == "serve":
        serve(a)
    elif not a.api_key:
        p.error("--api-key is required")
    else:
        measure(a)


if __name__ == "__main__":
    main()
