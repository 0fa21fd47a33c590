"""A FastAPI app serving a fake chat model (OpenAI's chat completions shape, deterministic
token counts) behind metergate's ASGI middleware: each request is admitted with an
estimate of its tokens, and the tokens the model really used go to admit as the outcome.

    METERGATE_URL=http://127.0.0.1:8080 METERGATE_SERVICE_TOKEN=... \\
        PYTHONPATH=../../sdk/python/src uvicorn app:app --port 9000

README.md has the whole walk-through.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

import metergate
from metergate import llm
from metergate.asgi import MetergateMiddleware, Scope, header, report_units

MAX_OUTPUT_TOKENS = 256
"""The most tokens the fake model answers with: the estimate charges them up front."""


def settings() -> tuple[str, str]:
    missing = [n for n in ("METERGATE_URL", "METERGATE_SERVICE_TOKEN") if not os.environ.get(n)]
    if missing:
        raise RuntimeError(f"set {' and '.join(missing)}: admit's address and its service token")
    return os.environ["METERGATE_URL"], os.environ["METERGATE_SERVICE_TOKEN"]


def estimated_units(scope: Scope) -> dict[str, int]:
    """Before the body is read: about 4 bytes of JSON per input token, plus the most the
    model may answer. The outcome's actual tokens settle the difference."""
    length = int(header(scope, "content-length") or 0)
    return {"tokens": math.ceil(length / 4) + MAX_OUTPUT_TOKENS}


url, token = settings()
client = metergate.AsyncClient(url, token)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    yield
    # The middleware has sent the queued outcomes by now (it does so when the server
    # announces shutdown, before this runs).
    await client.aclose()


app = FastAPI(title="metergate FastAPI example", lifespan=lifespan)
app.add_middleware(MetergateMiddleware, client=client, units=estimated_units,
                   skip=lambda scope: scope["path"] == "/healthz",
                   fail_open=os.environ.get("METERGATE_FAIL_OPEN") == "1")


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str
    messages: list[Message]
    stream: bool = False


def fake_model(req: ChatRequest) -> dict[str, Any]:
    """A chat completion as OpenAI answers it, deterministic: the reply echoes the last
    message's first words; a token is a word, plus 4 per message."""
    words = req.messages[-1].content.split() if req.messages else []
    answer = " ".join(["You", "said:", *words][:MAX_OUTPUT_TOKENS])
    prompt_tokens = sum(len(m.content.split()) + 4 for m in req.messages)
    completion_tokens = len(answer.split())
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def fake_stream(completion: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The completion as OpenAI streams it with stream_options {"include_usage": true}: a
    chunk per word, then one with the usage and no choices."""
    chunk = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
             "model": completion["model"], "usage": None}
    for i, word in enumerate(completion["choices"][0]["message"]["content"].split()):
        yield {**chunk, "choices": [{"index": 0, "delta": {"content": word if i == 0 else " " + word},
                                     "finish_reason": None}]}
    yield {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    yield {**chunk, "choices": [], "usage": completion["usage"]}


@app.post("/v1/chat/completions", response_model=None)
async def chat(body: ChatRequest, request: Request) -> JSONResponse | StreamingResponse:
    completion = fake_model(body)  # a real app: await openai.chat.completions.create(...)
    if not body.stream:
        report_units(request, llm.units_from_openai(completion))  # {"tokens": total_tokens}
        return JSONResponse(completion)

    # A stream's usage comes in its last chunk: track_usage reports it when the stream ends.
    chunks = llm.track_usage(fake_stream(completion), lambda usage: report_units(request, usage.units()))

    def sse() -> Iterator[str]:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
