"""metergate.llm against the real OpenAI and Anthropic SDKs: each reply below is JSON (or
SSE) of the shape the providers send, served through httpx2.MockTransport (httpx's fork,
which both SDKs use) and parsed by the SDK itself into its own types."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx2  # the HTTP package of the OpenAI and Anthropic SDKs (httpx's fork)
import openai
import pytest

from metergate import llm
from metergate.llm import Usage, track_usage, units_from_anthropic, units_from_openai, usage_from_openai

CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1795950000, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello.", "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                  "prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}},
        "system_fingerprint": "fp_1"}


def chat_chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None, choices: bool = True) -> dict[str, Any]:
    return {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1795950000, "model": "gpt-4o",
            "system_fingerprint": "fp_1", "usage": usage,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else []}


def chat_stream(include_usage: bool) -> bytes:
    chunks = [chat_chunk({"role": "assistant", "content": ""}), chat_chunk({"content": "Hel"}),
              chat_chunk({"content": "lo"}), chat_chunk({}, "stop")]
    if include_usage:
        chunks.append(chat_chunk({}, usage={"prompt_tokens": 19, "completion_tokens": 2, "total_tokens": 21,
                                            "prompt_tokens_details": {"cached_tokens": 0}}, choices=False))
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1795950000, "status": "completed", "model": "gpt-4.1",
            "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
            "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0,
            "usage": {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 0},
                      "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 50}, "total_tokens": 123}}


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def responses_stream() -> bytes:
    created = dict(RESPONSE, status="in_progress", output=[], usage=None)
    return sse([{"type": "response.created", "sequence_number": 0, "response": created},
                {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "output_index": 0,
                 "content_index": 0, "delta": "Hello.", "logprobs": []},
                {"type": "response.completed", "sequence_number": 2, "response": RESPONSE}])


MESSAGE_USAGE = {"input_tokens": 25, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000,
                 "output_tokens": 40, "service_tier": "standard"}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-5-5",
           "content": [{"type": "text", "text": "Hello."}], "stop_reason": "end_turn", "stop_sequence": None,
           "usage": MESSAGE_USAGE}


def anthropic_stream(delta_usage: dict[str, Any]) -> bytes:
    start = dict(MESSAGE, content=[], stop_reason=None, usage=dict(MESSAGE_USAGE, output_tokens=1))
    return sse([{"type": "message_start", "message": start},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "ping"},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello."}},
                {"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                 "usage": delta_usage},
                {"type": "message_stop"}])


def reply(body: Any) -> httpx2.Response:
    if isinstance(body, bytes):
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})
    return httpx2.Response(200, json=body)


def openai_client(body: Any) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url="http://openai/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(lambda _: reply(body))))


def async_openai_client(body: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="sk-test", base_url="http://openai/v1", max_retries=0,
                              http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(lambda _: reply(body))))


def anthropic_client(body: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-test", base_url="http://anthropic", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(lambda _: reply(body))))


def async_anthropic_client(body: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url="http://anthropic", max_retries=0,
                                    http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(lambda _: reply(body))))


MESSAGES: Any = [{"role": "user", "content": "Say hello."}]


def test_a_chat_completion() -> None:
    completion = openai_client(CHAT).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert usage_from_openai(completion) == Usage(input_tokens=19, output_tokens=10, cached_input_tokens=3)
    assert units_from_openai(completion) == {"tokens": 29}
    assert units_from_openai(CHAT) == {"tokens": 29}  # its JSON, as a dict


def test_a_responses_api_response() -> None:
    response = openai_client(RESPONSE).responses.create(model="gpt-4.1", input="Say hello.")
    assert usage_from_openai(response) == Usage(input_tokens=36, output_tokens=87, cached_input_tokens=6)
    assert units_from_openai(response) == {"tokens": 123}


def test_an_anthropic_message_counts_cached_input() -> None:
    message = anthropic_client(MESSAGE).messages.create(model="claude-sonnet-5-5", max_tokens=100, messages=MESSAGES)
    assert llm.usage_from_anthropic(message) == Usage(input_tokens=1125, output_tokens=40, cached_input_tokens=1000)
    assert units_from_anthropic(message) == {"tokens": 1165}


def test_a_chat_stream_passes_its_chunks_and_records_the_last_chunks_usage() -> None:
    plain = list(openai_client(chat_stream(True)).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}))
    got: list[Usage] = []
    stream = track_usage(openai_client(chat_stream(True)).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}), got.append)
    chunks = []
    for chunk in stream:
        assert not got, "recorded before the stream ended"
        chunks.append(chunk)
    assert chunks == plain and type(chunks[0]) is type(plain[0])
    assert got == [Usage(19, 2, 0)] and stream.usage == Usage(19, 2, 0)
    stream.close()
    assert len(got) == 1  # once


def test_a_running_total_on_every_chunk_records_the_last() -> None:
    # Some OpenAI-compatible servers (vLLM's continuous_usage_stats) put usage on every chunk.
    chunks = [chat_chunk({"content": "a"}, usage={"prompt_tokens": 5, "completion_tokens": n}) for n in (1, 2, 3)]
    stream = track_usage(iter(chunks))
    assert list(stream) == chunks and stream.usage == Usage(5, 3)


def test_a_chat_stream_without_include_usage_records_nothing() -> None:
    got: list[Usage] = []
    stream = track_usage(openai_client(chat_stream(False)).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True), got.append)
    assert len(list(stream)) == 4
    assert got == [] and stream.usage is None


def test_a_stream_cut_short_records_nothing() -> None:
    got: list[Usage] = []
    with track_usage(openai_client(chat_stream(True)).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}), got.append) as s:
        next(iter(s))
    assert got == []  # the estimate stands


def test_an_async_chat_stream() -> None:
    async def t() -> tuple[int, Usage | None]:
        stream = await async_openai_client(chat_stream(True)).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
        tracked = track_usage(stream)
        n = 0
        async for _ in tracked:
            n += 1
        return n, tracked.usage
    assert asyncio.run(t()) == (5, Usage(19, 2, 0))


def test_a_responses_stream() -> None:
    got: list[Usage] = []
    events = list(track_usage(openai_client(responses_stream()).responses.create(
        model="gpt-4.1", input="Say hello.", stream=True), got.append))
    assert [e.type for e in events] == ["response.created", "response.output_text.delta", "response.completed"]
    assert got == [Usage(36, 87, 6)]


@pytest.mark.parametrize("delta_usage,want", [
    ({"output_tokens": 15}, Usage(1125, 15, 1000)),  # input from message_start
    ({"input_tokens": 30, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000, "output_tokens": 15},
     Usage(1130, 15, 1000)),  # cumulative input in the delta wins
])
def test_an_anthropic_stream(delta_usage: dict[str, Any], want: Usage) -> None:
    got: list[Usage] = []
    events = list(track_usage(anthropic_client(anthropic_stream(delta_usage)).messages.create(
        model="claude-sonnet-5-5", max_tokens=100, messages=MESSAGES, stream=True), got.append))
    assert [e.type for e in events][0] == "message_start" and len(events) == 6  # the SDK drops the ping
    assert got == [want] and want.units() == {"tokens": want.input_tokens + want.output_tokens}


def test_an_async_anthropic_stream_and_the_stream_helper() -> None:
    async def t() -> list[Usage]:
        got: list[Usage] = []
        stream = await async_anthropic_client(anthropic_stream({"output_tokens": 15})).messages.create(
            model="claude-sonnet-5-5", max_tokens=100, messages=MESSAGES, stream=True)
        async for _ in track_usage(stream, got.append):
            pass
        async with async_anthropic_client(anthropic_stream({"output_tokens": 15})).messages.stream(
                model="claude-sonnet-5-5", max_tokens=100, messages=MESSAGES) as helper:
            async for _ in track_usage(helper, got.append):
                pass
        return got
    assert asyncio.run(t()) == [Usage(1125, 15, 1000)] * 2


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="model response"):
        units_from_openai("not a response")
    with pytest.raises(ValueError, match="prompt_tokens"):
        units_from_openai({"usage": {"prompt_tokens": -1, "completion_tokens": 2}})
    with pytest.raises(ValueError, match="neither"):
        units_from_openai({"usage": {"tokens": 3}})
    with pytest.raises(ValueError, match="output_tokens"):
        units_from_anthropic({"usage": {"input_tokens": 1, "output_tokens": "2"}})
    with pytest.raises(TypeError, match="stream"):
        track_usage(42)  # type: ignore[call-overload]
    assert units_from_openai({"id": "chatcmpl-3", "usage": None}) == {}
