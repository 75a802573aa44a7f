"""Redis Streams: a consumer group reads the stream; each entry's ``field`` (default
``event``) holds the message's JSON.

The group is created at the stream's first entry (``XGROUP CREATE ... 0 MKSTREAM``)
when it does not exist, so nothing written before slawatch's first start is missed.
Each process is its own consumer (default name: host name and process id). At
connect it first reads again what it was given and did not acknowledge; every
``reclaim_after`` it takes over entries another consumer left unacknowledged that
long (a process that died: ``XAUTOCLAIM``). A set-aside entry is added to
``<stream>.dead`` with its fields and ``slawatch_reason``, ``slawatch_source`` and
``slawatch_entry`` (its id), and acknowledged, in one ``MULTI``/``EXEC``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from typing import Any

import redis
import redis.exceptions

from slawatch.config.sources import RedisSource
from slawatch.events.sources.base import Consumer, Message

TIMEOUT = 10.0  # seconds to connect, and for a reply beyond a read's own wait
FORGET_AFTER_MS = 3_600_000  # consumers idle this long with nothing pending are removed
_count = itertools.count(1)
_count_lock = threading.Lock()


def default_consumer() -> str:
    """This process's consumer name: ``<host>-<pid>``, and ``-2``, ``-3``... for the
    further sources of one process (tests run several runners in one process)."""
    with _count_lock:
        n = next(_count)
    name = f"{socket.gethostname()}-{os.getpid()}"
    return name if n == 1 else f"{name}-{n}"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class RedisConsumer(Consumer):
    kind = "Redis"

    def __init__(self, config: RedisSource) -> None:
        super().__init__(config)
        self.source = config
        self.consumer = config.consumer or default_consumer()
        self._client: redis.Redis | None = None
        self._own_pending = True
        self._claim_at = 0.0
        self._cursor = "0-0"

    def connect(self) -> None:
        self.close()
        s = self.source
        try:
            client = redis.Redis.from_url(
                s.url.get_secret_value(),
                socket_connect_timeout=TIMEOUT,
                socket_timeout=TIMEOUT,
            )
            self._client = client
            try:
                client.xgroup_create(s.stream, s.group, id="0", mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._forget_idle_consumers(client)
        except redis.exceptions.RedisError as exc:
            self.close()
            raise self.error(exc, f"stream {s.stream}") from exc
        # Read what this consumer was given before and did not acknowledge, then claim.
        self._own_pending, self._claim_at, self._cursor = True, 0.0, "0-0"

    def _forget_idle_consumers(self, client: redis.Redis) -> None:
        """Each process is a consumer of its own: those gone long ago, with nothing
        pending, are removed (one still running is simply added again when it reads)."""
        s = self.source
        for c in client.xinfo_consumers(s.stream, s.group):
            name = _text(c.get("name"))
            gone = not c.get("pending") and c.get("idle", 0) > FORGET_AFTER_MS
            if gone and name != self.consumer:
                client.xgroup_delconsumer(s.stream, s.group, name)

    def fetch(self, limit: int, wait: float) -> list[Message]:
        client = self._live()
        s = self.source
        try:
            if self._own_pending:
                mine = self._read(client, "0", limit, None)
                if mine:
                    return mine
                self._own_pending = False
            if time.monotonic() >= self._claim_at:
                reply = client.xautoclaim(
                    s.stream,
                    s.group,
                    self.consumer,
                    min_idle_time=int(s.reclaim_after.total_seconds() * 1000),
                    start_id=self._cursor,
                    count=limit,
                )
                self._cursor = _text(reply[0])
                if self._cursor == "0-0":  # went round: look again in half the time
                    self._claim_at = time.monotonic() + s.reclaim_after.total_seconds() / 2
                claimed = [self._message(i, f) for i, f in reply[1] if i is not None]
                if claimed:
                    return claimed
            # The server waits `block` ms: well within the socket's timeout.
            block = min(max(int(wait * 1000), 1), int(TIMEOUT * 500))
            return self._read(client, ">", limit, block)
        except redis.exceptions.RedisError as exc:
            raise self.error(exc, f"reading stream {s.stream}") from exc

    def _read(
        self, client: redis.Redis, start: str, limit: int, block: int | None
    ) -> list[Message]:
        s = self.source
        streams: dict[Any, Any] = {s.stream: start}
        reply: Any = client.xreadgroup(s.group, self.consumer, streams, count=limit, block=block)
        if not reply:
            return []
        _stream, entries = reply[0]
        return [self._message(i, f) for i, f in entries]

    def _message(self, entry_id: Any, fields: dict[bytes, bytes] | None) -> Message:
        ident = _text(entry_id)
        label = f"entry {ident}"
        if not fields:
            # Deleted (XDEL, trimmed) after it was read and before it was acknowledged.
            return Message(None, (ident, {}), label, "the entry is no longer in the stream")
        body = fields.get(self.source.field.encode())
        if body is None:
            names = ", ".join(sorted(_text(k) for k in fields)[:10])
            problem = f"no field {self.source.field!r} in the entry (fields: {names})"
            return Message(None, (ident, fields), label, problem)
        return Message(body, (ident, fields), label)

    def ack(self, messages: list[Message]) -> None:
        s = self.source
        try:
            self._live().xack(s.stream, s.group, *[m.handle[0] for m in messages])
        except redis.exceptions.RedisError as exc:
            raise self.error(exc, f"acknowledging on stream {s.stream}") from exc

    def set_aside(self, message: Message, reason: str) -> None:
        s = self.source
        ident, fields = message.handle
        dead = dict(fields)
        dead.update(
            {
                b"slawatch_reason": reason.encode(),
                b"slawatch_source": self.name.encode(),
                b"slawatch_entry": ident.encode(),
            }
        )
        try:
            pipe = self._live().pipeline(transaction=True)  # both, or neither
            pipe.xadd(s.dead, dead)
            pipe.xack(s.stream, s.group, ident)
            pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise self.error(exc, f"setting aside into stream {s.dead}") from exc

    def keepalive(self, messages: list[Message]) -> None:
        s = self.source
        try:
            # Claiming them again (to itself) resets their idle time: no other consumer
            # takes them over while this one waits for the database.
            self._live().xclaim(
                s.stream, s.group, self.consumer, 0, [m.handle[0] for m in messages], justid=True
            )
        except redis.exceptions.RedisError as exc:
            raise self.error(exc, f"keeping entries of stream {s.stream}") from exc

    def waiting(self) -> int:
        s = self.source
        try:
            client = self._live()
            groups = client.xinfo_groups(s.stream)
            mine = client.xpending_range(s.stream, s.group, "-", "+", 1, self.consumer)
        except redis.exceptions.RedisError as exc:
            raise self.error(exc, f"stream {s.stream}") from exc
        lag = next((g.get("lag") for g in groups if _text(g.get("name")) == s.group), 0)
        # Entries given to this consumer and not acknowledged are read again first.
        return int(lag or 0) + len(mine)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _live(self) -> redis.Redis:
        if self._client is None:
            raise self.error(ConnectionError("not connected"), "connection")
        return self._client
