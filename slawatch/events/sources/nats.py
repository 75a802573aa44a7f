"""NATS JetStream: a durable pull consumer (``durable``, default ``slawatch``) on
``stream``, filtered to ``subject``; the processes that share it are competing consumers.

The stream is created (subjects: ``subject``) and so is the consumer (explicit acks)
when missing. A set-aside message is published to ``dead_subject`` (default
``<subject>.dead``) and awaited (the stream's PubAck), then terminated (``+TERM``: never
delivered again). Its headers are the original's plus ``Slawatch-Reason``,
``Slawatch-Source``, ``Slawatch-Subject``, ``Slawatch-Stream`` and ``Slawatch-Sequence``
(the original's place, which stays in its stream unless the stream's retention
removes it), and ``Nats-Msg-Id`` so that a repeat is dropped. When no stream takes
``dead_subject``, the stream ``<stream>_dead`` is created for it. A message too big to
be copied with those headers is recorded without its body.

nats-py is asyncio: each connection runs on an event loop of its own, driven by the
source's thread (run_until_complete), so nothing else shares it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from slawatch.config.sources import NatsSource
from slawatch.events.sources.base import Consumer, Message

TIMEOUT = 10.0  # seconds for a connection or a JetStream request
_FAILURES = (nats.errors.Error, OSError, TimeoutError)
T = TypeVar("T")


class NatsConsumer(Consumer):
    kind = "NATS"

    def __init__(self, config: NatsSource) -> None:
        super().__init__(config)
        self.source = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        # Fetched, not yet acknowledged nor set aside: given back (+NAK) at close, so
        # they come again at once rather than after the consumer's ack wait.
        self._unsettled: dict[int, Msg] = {}
        self._last_error: Exception | None = None

    async def _failed(self, exc: Exception) -> None:
        """nats-py's error callback: keep the cause (its NoServersError does not say)."""
        self._last_error = exc

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = TIMEOUT) -> T:
        if self._loop is None:
            coro.close()
            raise self.error(ConnectionError("not connected"), "connection")
        return self._loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def connect(self) -> None:
        self.close()
        self._loop = asyncio.new_event_loop()
        try:
            self._run(self._connect(), TIMEOUT * 3)
        except _FAILURES as exc:
            self.close()
            raise self.error(exc, f"stream {self.source.stream}") from exc

    async def _connect(self) -> None:
        s = self.source
        self._last_error = None
        try:
            # One attempt (max_reconnect_attempts=0 would mean: try for ever); the
            # runner reconnects with its own backoff.
            self._nc = nc = await nats.connect(
                s.url.get_secret_value(),
                connect_timeout=int(TIMEOUT),
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=self._failed,
            )
        except nats.errors.NoServersError as exc:
            raise self._last_error or exc from exc
        js = nc.jetstream(timeout=TIMEOUT)
        try:
            await js.stream_info(s.stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(name=s.stream, subjects=[s.subject])
        try:
            await js.find_stream_name_by_subject(s.dead)
        except nats.js.errors.NotFoundError:
            await js.add_stream(name=f"{s.stream}_dead", subjects=[s.dead])
        self._js = js
        self._sub = await js.pull_subscribe(s.subject, durable=s.durable, stream=s.stream)

    def fetch(self, limit: int, wait: float) -> list[Message]:
        sub = self._sub
        if sub is None:
            raise self.error(ConnectionError("not connected"), "connection")

        async def fetch() -> list[Msg]:
            try:
                return await sub.fetch(limit, timeout=wait)
            except TimeoutError:  # nats-py raises its own subclass, or this one
                return []  # none came within `wait`

        try:
            msgs = self._run(fetch(), wait + TIMEOUT)  # beyond that: the connection hangs
        except _FAILURES as exc:
            raise self.error(exc, f"reading stream {self.source.stream}") from exc
        for m in msgs:
            self._unsettled[id(m)] = m
        return [Message(m.data, m, f"stream sequence {_sequence(m)}") for m in msgs]

    def ack(self, messages: list[Message]) -> None:
        async def ack() -> None:
            for m in messages:
                await m.handle.ack()
            assert self._nc is not None
            await self._nc.flush(timeout=int(TIMEOUT))  # the acks are on their way

        try:
            self._run(ack())
        except _FAILURES as exc:
            raise self.error(exc, f"acknowledging on stream {self.source.stream}") from exc
        for m in messages:
            self._unsettled.pop(id(m.handle), None)

    def set_aside(self, message: Message, reason: str) -> None:
        s, msg = self.source, message.handle
        sequence = _sequence(msg)
        headers = dict(msg.headers or {})
        headers.update(
            {
                "Nats-Msg-Id": f"slawatch-dead:{s.stream}:{sequence}",
                "Slawatch-Reason": reason.encode("ascii", "backslashreplace").decode(),
                "Slawatch-Source": self.name,
                "Slawatch-Subject": msg.subject,
                "Slawatch-Stream": s.stream,
                "Slawatch-Sequence": str(sequence),
            }
        )
        body = msg.data or b""

        async def dead() -> None:
            assert self._nc is not None and self._js is not None
            room = self._nc.max_payload - sum(len(k) + len(v) + 4 for k, v in headers.items())
            data = body
            if len(body) > room - 64:
                # Too big to copy with the headers: the original stays in its stream.
                headers["Slawatch-Body"] = f"left out: {len(body):,} bytes"
                data = b""
            await self._js.publish(s.dead, data, headers=headers)
            await msg.term()

        try:
            self._run(dead())
        except _FAILURES as exc:
            raise self.error(exc, f"setting aside to {s.dead}") from exc
        self._unsettled.pop(id(msg), None)

    def keepalive(self, messages: list[Message]) -> None:
        async def working() -> None:
            for m in messages:
                await m.handle.in_progress()  # the ack wait starts again

        try:
            self._run(working())
        except _FAILURES as exc:
            raise self.error(exc, f"keeping messages of stream {self.source.stream}") from exc

    def waiting(self) -> int:
        js, sub = self._js, self._sub
        if js is None or sub is None:
            raise self.error(ConnectionError("not connected"), "connection")
        try:
            info = self._run(js.consumer_info(self.source.stream, self.source.durable))
        except _FAILURES as exc:
            raise self.error(exc, f"stream {self.source.stream}") from exc
        # A fetch that stopped waiting before the server's answer came (a drain's wait is
        # almost nothing) leaves the messages sent to it in the subscription's queue, for
        # the next fetch: the server counts them delivered, not pending. Read after the
        # request above, whose answer came after them on this connection.
        return int(info.num_pending or 0) + sub.pending_msgs

    def close(self) -> None:
        loop, nc, unsettled = self._loop, self._nc, list(self._unsettled.values())
        self._loop, self._nc, self._js, self._sub = None, None, None, None
        self._unsettled = {}
        if loop is None:
            return
        if nc is not None and unsettled:

            async def give_back() -> None:
                for m in unsettled:
                    await m.nak()
                await nc.flush(timeout=int(TIMEOUT))

            with contextlib.suppress(Exception):  # else they come again after the ack wait
                loop.run_until_complete(asyncio.wait_for(give_back(), TIMEOUT))
        if nc is not None:
            with contextlib.suppress(Exception):  # a broken connection: nothing more to do
                loop.run_until_complete(asyncio.wait_for(nc.close(), TIMEOUT))
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _sequence(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except (AttributeError, ValueError, nats.errors.Error):
        return 0
