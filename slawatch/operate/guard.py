"""What keeps the admin server answering when clients misbehave: a deadline for a
request's headers on every connection, a bound on the connections waiting for one,
and request bodies read with a size limit and a deadline.

uvicorn alone has none of the first two: h11 waits for headers forever, and its
keep-alive timeout starts only after a first response, so a socket that connects
and sends nothing (or a byte a minute) stays open. Its ``limit_concurrency``
counts *connections*, so such sockets also turn every request away with a 503,
``/healthz`` included. :func:`guarded_protocol` is uvicorn's h11 protocol with a
timer: armed when a connection opens (``header_timeout``) and whenever a response is
complete (``keep_alive``: an idle kept-alive connection, until the next request's
first byte, then ``header_timeout`` again), disarmed when the next request's headers
are complete; when it fires the connection is closed. The connections whose timer
runs are kept in arrival order, and past ``Limits.idle`` the oldest is closed at
once, so open sockets cannot use up the process's file descriptors either. How many
requests run at once is counted per request by the admin API (``admin._Gate``),
after its cheap checks.

:func:`read_body` reads a request body before the application sees it: a declared
``Content-Length`` over the limit is refused before a byte of the body is read
(the gate checks it), and a chunked body is counted while it streams and stops at
the limit; the whole body must arrive within ``Limits.body_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.types import Message, Receive
from uvicorn.protocols.http.h11_impl import H11Protocol

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The admin server's bounds.

    ``requests``: requests served at once (``/healthz`` and ``/readyz`` are not
    counted: they read no database and must answer when the rest is busy); more are
    answered 503 at once. ``ingest``: the same for ``POST /v1/events``, slots of its
    own, so that readers never turn producers away. ``header_timeout``: seconds from a
    connection's opening (or the first byte of a request on a kept-alive connection)
    to the end of the request's headers. ``keep_alive``: seconds a connection may
    stay idle after a response (longer than clients' connection pools keep one idle,
    Go's 90 s the longest: a producer never sends on a connection being closed).
    ``body_timeout``: seconds to receive a whole request body. ``idle``: connections
    waiting for a request; past it the oldest is closed. ``body``: bytes of a request
    body, unless ``bodies`` names the path (an upload endpoint may allow more).
    """

    requests: int = 16
    ingest: int = 16
    header_timeout: float = 5.0
    keep_alive: float = 100.0
    body_timeout: float = 10.0
    idle: int = 200
    body: int = MIB
    bodies: Mapping[str, int] = field(default_factory=dict)

    def body_limit(self, path: str) -> int:
        """The most bytes a request body to ``path`` may have."""
        return self.bodies.get(path, self.body)


class TooLarge(Exception):
    """A request body went past its limit (nothing more of it is read)."""


class TooSlow(Exception):
    """A request body did not arrive in time."""


class Disconnected(Exception):
    """The client went away before its body was complete."""


def declared_length(value: str | None) -> int | None:
    """A ``Content-Length`` header's value (None: none given); ValueError if malformed.

    h11 refuses malformed values before a request gets here; this is the second guard.
    """
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ValueError(f"Content-Length {value[:40]!r} is not a number")
    return int(value)


async def read_body(receive: Receive, limit: int, timeout: float) -> bytes:
    """The whole request body from ``receive``: at most ``limit`` bytes (TooLarge past
    it, reading no further), complete within ``timeout`` seconds (TooSlow)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Disconnected
                chunk: bytes = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise TooLarge
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise TooSlow from None


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole once, then whatever ``receive`` gives
    (a disconnect, which streaming responses wait for)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def guarded_protocol(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers and at most
    ``limits.idle`` connections waiting for one (one class per server: the waiting
    connections are the server's)."""
    waiting: dict[Guarded, None] = {}  # insertion-ordered: the oldest first

    class Guarded(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _idle = False  # kept alive after a response, and no byte of a request yet

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_request(limits.header_timeout)

        def data_received(self, data: bytes) -> None:
            if self._idle:
                # A request begins: its headers are due within the header timeout.
                self._await_request(limits.header_timeout)
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self._got_request()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._got_request()  # headers complete: the app has the request now

        def on_response_complete(self) -> None:
            # Armed first: the call below may start a pipelined request (disarming it).
            if not self.transport.is_closing():
                self._await_request(limits.keep_alive, idle=True)
            super().on_response_complete()

        def _await_request(self, timeout: float, *, idle: bool = False) -> None:
            self._got_request()
            self._deadline = self.loop.call_later(timeout, self._too_slow)
            self._idle = idle
            waiting[self] = None
            while len(waiting) > limits.idle:
                next(iter(waiting))._too_slow()

        def _got_request(self) -> None:
            self._idle = False
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            waiting.pop(self, None)

        def _too_slow(self) -> None:
            self._got_request()
            if not self.transport.is_closing():
                self.transport.close()

    return Guarded
