"""An operation of admit's API, declared once for both clients.

Each method of the API (src/metergate/_api.py) is a function that says what one call sends:
a Call, with the reply's type. The @operation decorator names its operationId, HTTP method
and path, as the OpenAPI document does, and turns it into a descriptor: on a namespace of
the sync client the method returns the reply, on one of the async client an awaitable of
it. Both clients run the same declarations (tests/test_api.py checks them against the
document), so nothing is written twice and mypy sees each method's exact signature.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Concatenate, Generic, Mapping, ParamSpec, TypeVar, overload
from urllib.parse import quote

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R", covariant=True)

JSON = Mapping[str, Any]
"""A request body as plain JSON values, in place of its model."""

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


@dataclass(frozen=True)
class Call(Generic[T]):
    """What one call of an operation sends, and what its reply decodes to: reply is a
    model, Admission, bytes (a file) or type(None) (204, no content)."""

    reply: type[T]
    path: Mapping[str, str | int] = field(default_factory=dict)
    query: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    """A model or a mapping of JSON values; None sends no body."""
    retry: bool | None = None
    """Whether a 503 or a connection lost after sending is retried; None: when the method
    is idempotent. A connection that was never made is retried whatever this says."""


class Sync(ABC):
    """Runs calls and returns their replies (Client)."""

    @abstractmethod
    def run(self, op: Operation[Any, T], call: Call[T]) -> T: ...


class Async(ABC):
    """Runs calls and returns awaitables of their replies (AsyncClient)."""

    @abstractmethod
    def run(self, op: Operation[Any, T], call: Call[T]) -> Awaitable[T]: ...


class Namespace(Generic[R]):
    """A group of operations (the client itself, client.admin, client.portal), bound to
    the runner of its client."""

    def __init__(self, runner: R) -> None:
        self._runner: R = runner


class Operation(Generic[P, T]):
    """An operation of the document: its operationId, method and path, and the function
    that makes a Call of the arguments."""

    def __init__(self, operation_id: str, method: str, path: str,
                 build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self.operation_id, self.method, self.path, self.build = operation_id, method, path, build
        self.name = build.__name__
        sig = inspect.signature(build)
        self.signature = sig.replace(parameters=list(sig.parameters.values())[1:])

    def url(self, call: Call[Any]) -> str:
        """The path with each parameter filled in, URL-escaped (a "/" in an id too)."""
        return self.path.format_map({k: quote(str(v), safe="") for k, v in call.path.items()})

    def retries(self, call: Call[Any]) -> bool:
        """Whether a 503, or a connection lost after the request was sent, is retried."""
        return call.retry if call.retry is not None else self.method in IDEMPOTENT

    @overload
    def __get__(self, ns: None, owner: object) -> Operation[P, T]: ...
    @overload
    def __get__(self, ns: Namespace[Sync], owner: object) -> Callable[P, T]: ...
    @overload
    def __get__(self, ns: Namespace[Async], owner: object) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, ns: Namespace[Any] | None, owner: object) -> Any:
        if ns is None:
            return self
        runner: Sync | Async = ns._runner

        @functools.wraps(self.build)
        def method(*args: P.args, **kwargs: P.kwargs) -> Any:
            return runner.run(self, self.build(ns, *args, **kwargs))

        method.__signature__ = self.signature  # type: ignore[attr-defined]
        vars(ns)[self.name] = method  # bound once: the next lookups find it on the instance
        return method


def operation(operation_id: str, method: str, path: str
              ) -> Callable[[Callable[Concatenate[Any, P], Call[T]]], Operation[P, T]]:
    """Declares a method as the operation operation_id (METHOD path) of the document."""
    def declare(build: Callable[Concatenate[Any, P], Call[T]]) -> Operation[P, T]:
        return Operation(operation_id, method, path, build)
    return declare


def operations(cls: type) -> list[Operation[Any, Any]]:
    """The operations a namespace class declares, in order."""
    return [v for v in vars(cls).values() if isinstance(v, Operation)]
