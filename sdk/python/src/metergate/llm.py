"""The tokens a model call used, read from OpenAI's and Anthropic's Python SDK responses (or
their JSON, as dicts), so that actual tokens reach outcomes without hand-written parsing.

    from metergate import llm
    from metergate.asgi import report_units

    completion = openai.chat.completions.create(...)
    report_units(request, llm.units_from_openai(completion))          # {"tokens": 1870}

    stream = openai.chat.completions.create(..., stream=True, stream_options={"include_usage": True})
    for chunk in llm.track_usage(stream, lambda u: report_units(request, u.units())):
        ...

What counts: metergate has one unit for a model's work, "tokens" (docs/admission.md,
"Units"), and admit's estimate of a request counts every input token and the output it may
produce. So Usage.units() is {"tokens": input + output}, with

| Usage field          | OpenAI Chat Completions     | OpenAI Responses           | Anthropic Messages                                               |
|----------------------|-----------------------------|----------------------------|------------------------------------------------------------------|
| input_tokens         | prompt_tokens               | input_tokens               | input_tokens + cache_creation_input_tokens + cache_read_input_tokens |
| output_tokens        | completion_tokens           | output_tokens              | output_tokens                                                    |
| cached_input_tokens  | prompt_tokens_details.cached_tokens | input_tokens_details.cached_tokens | cache_read_input_tokens                          |

Cached and reasoning tokens count in full: a price per kind of token belongs in
cost_micros, computed by the caller. The other names (input_tokens, output_tokens) are not
metergate units: admit refuses an outcome that carries them.

Streams: OpenAI sends usage in a stream's last chunk only when asked (stream_options
{"include_usage": true}); the Responses API in its response.completed (or .incomplete,
.failed) event; Anthropic in message_start (input) and message_delta (output, cumulative).
track_usage passes every chunk on unchanged and records the usage once, when the stream
ends (or is closed after its usage arrived). A stream cut short before its usage arrived
records nothing, so the outcome carries no tokens and the admitted estimate stands.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Callable, Generic, Iterable, Iterator, TypeVar, overload

T = TypeVar("T")


@dataclass(frozen=True)
class Usage:
    """The tokens one model call used (see the module's table)."""

    input_tokens: int
    """Every input token the model read, cached ones included."""
    output_tokens: int
    """Every output token, reasoning included."""
    cached_input_tokens: int = 0
    """Of input_tokens, those read from the provider's prompt cache."""

    @property
    def tokens(self) -> int:
        """What metergate counts: input_tokens + output_tokens."""
        return self.input_tokens + self.output_tokens

    def units(self) -> dict[str, int]:
        """metergate's units for an outcome: {"tokens": input_tokens + output_tokens}."""
        return {"tokens": self.tokens}


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _count(obj: Any, name: str, *, required: bool = True) -> int:
    v = _get(obj, name)
    if v is None and not required:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"usage.{name} must be a whole number >= 0, not {v!r}")
    return int(v)


def _check(obj: Any) -> None:
    if obj is None or isinstance(obj, (str, bytes, int, float, list, tuple)):
        raise TypeError(f"expected a model response (an SDK object or its JSON as a dict), not {type(obj).__name__}")


def _openai(u: Any) -> Usage:
    if _get(u, "prompt_tokens") is not None:  # Chat Completions, Completions
        return Usage(_count(u, "prompt_tokens"), _count(u, "completion_tokens"),
                     _count(_get(u, "prompt_tokens_details") or {}, "cached_tokens", required=False))
    if _get(u, "input_tokens") is not None:  # Responses
        return Usage(_count(u, "input_tokens"), _count(u, "output_tokens"),
                     _count(_get(u, "input_tokens_details") or {}, "cached_tokens", required=False))
    raise ValueError("not an OpenAI usage: it has neither prompt_tokens nor input_tokens")


def _anthropic(u: Any, output_tokens: int | None = None) -> Usage:
    cache_read = _count(u, "cache_read_input_tokens", required=False)
    inputs = _count(u, "input_tokens") + _count(u, "cache_creation_input_tokens", required=False) + cache_read
    return Usage(inputs, _count(u, "output_tokens") if output_tokens is None else output_tokens, cache_read)


def usage_from_openai(response: Any) -> Usage | None:
    """The usage of an OpenAI ChatCompletion, Completion, Response (Responses API), a
    stream's usage chunk or response.completed event; None when it carries none (a
    chunk before the last, a stream without include_usage). ValueError on a malformed
    usage, TypeError on something that is not a response."""
    _check(response)
    u = _get(response, "usage")
    if u is None and _get(response, "response") is not None:  # a Responses stream event
        u = _get(_get(response, "response"), "usage")
    return None if u is None else _openai(u)


def usage_from_anthropic(message: Any) -> Usage | None:
    """The usage of an Anthropic Message (messages.create, or a stream's final message);
    None when it carries none. ValueError on a malformed usage, TypeError on something that
    is not a message."""
    _check(message)
    u = _get(message, "usage")
    return None if u is None else _anthropic(u)


def units_from_openai(response: Any) -> dict[str, int]:
    """usage_from_openai(response).units(), or {} when it carries no usage."""
    u = usage_from_openai(response)
    return u.units() if u else {}


def units_from_anthropic(message: Any) -> dict[str, int]:
    """usage_from_anthropic(message).units(), or {} when it carries no usage."""
    u = usage_from_anthropic(message)
    return u.units() if u else {}


_RESPONSES_END = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Tracker:
    """Reads the usage out of a stream's chunks, whichever provider's they are."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.ended = False  # the chunk that ends the stream went by
        self._start: Any = None  # Anthropic's message_start usage

    def feed(self, chunk: Any) -> None:
        kind = _get(chunk, "type")
        if kind == "message_start":
            self._start = _get(_get(chunk, "message"), "usage")
        elif kind == "message_delta":
            delta = _get(chunk, "usage")
            if delta is not None:
                # Cumulative: its input counts, when given, replace message_start's.
                start = self._start or {}
                merged = {name: _get(delta, name) if _get(delta, name) is not None else _get(start, name)
                          for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")}
                merged["input_tokens"] = merged["input_tokens"] or 0
                self.usage = _anthropic(merged, _count(delta, "output_tokens"))
        elif kind == "message_stop":
            self.ended = True
        elif kind in _RESPONSES_END:
            u = _get(_get(chunk, "response"), "usage")
            if u is not None:
                self.usage = _openai(u)
            self.ended = True
        elif kind is None and _get(chunk, "usage") is not None:
            # Chat Completions: the last chunk's (some servers send a running total on
            # every chunk, so the latest wins, at the stream's end).
            self.usage = _openai(_get(chunk, "usage"))


class _Recorder:
    """What UsageStream and AsyncUsageStream share: the tracker, and recording its usage once."""

    def __init__(self, on_usage: Callable[[Usage], object] | None) -> None:
        self.usage: Usage | None = None
        self._on_usage, self._tracker, self._done = on_usage, _Tracker(), False

    def _see(self, chunk: object) -> None:
        self._tracker.feed(chunk)
        if self._tracker.ended:
            self._finish()

    def _finish(self) -> None:
        if self._done or self._tracker.usage is None:
            return
        self._done, self.usage = True, self._tracker.usage
        if self._on_usage is not None:
            self._on_usage(self.usage)


class UsageStream(_Recorder, Generic[T]):
    """An iterator over stream's chunks, unchanged, that records their usage in .usage (and
    calls on_usage with it) once, when the stream ends or is closed after its usage came.
    Other attributes are the stream's."""

    def __init__(self, stream: Iterable[T], on_usage: Callable[[Usage], object] | None = None) -> None:
        super().__init__(on_usage)
        self._stream, self._it = stream, iter(stream)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        try:
            chunk = next(self._it)
        except StopIteration:
            self._finish()
            raise
        self._see(chunk)
        return chunk

    def close(self) -> None:
        """Closes the stream (its close, if it has one); records the usage if it came."""
        close = getattr(self._stream, "close", None)
        if callable(close):
            close()
        self._finish()

    def __enter__(self) -> UsageStream[T]:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class AsyncUsageStream(_Recorder, Generic[T]):
    """UsageStream for async iterators (AsyncOpenAI, AsyncAnthropic streams)."""

    def __init__(self, stream: AsyncIterable[T], on_usage: Callable[[Usage], object] | None = None) -> None:
        super().__init__(on_usage)
        self._stream, self._it = stream, stream.__aiter__()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            self._finish()
            raise
        self._see(chunk)
        return chunk

    async def aclose(self) -> None:
        """Closes the stream (its close or aclose, if it has one); records the usage if it
        came."""
        close = getattr(self._stream, "close", None) or getattr(self._stream, "aclose", None)
        if callable(close):
            closed = close()
            if inspect.isawaitable(closed):
                await closed
        self._finish()

    async def __aenter__(self) -> AsyncUsageStream[T]:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@overload
def track_usage(stream: AsyncIterable[T], on_usage: Callable[[Usage], object] | None = None) -> AsyncUsageStream[T]:
    ...


@overload
def track_usage(stream: Iterable[T], on_usage: Callable[[Usage], object] | None = None) -> UsageStream[T]:
    ...


def track_usage(stream: Iterable[T] | AsyncIterable[T],
                on_usage: Callable[[Usage], object] | None = None) -> UsageStream[T] | AsyncUsageStream[T]:
    """Wraps an OpenAI or Anthropic stream (sync or async): chunks pass unchanged, and the
    usage is recorded when the stream ends (see the module's documentation)."""
    if isinstance(stream, AsyncIterable):
        return AsyncUsageStream(stream, on_usage)
    if isinstance(stream, Iterable):
        return UsageStream(stream, on_usage)
    raise TypeError(f"expected a stream (an iterable of chunks), not {type(stream).__name__}")


__all__ = ["AsyncUsageStream", "Usage", "UsageStream", "track_usage", "units_from_anthropic", "units_from_openai",
           "usage_from_anthropic", "usage_from_openai"]
