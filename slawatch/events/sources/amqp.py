"""RabbitMQ: consume a queue with manual acknowledgements, ``batch`` messages in flight.

The queue is declared durable when it does not exist (an existing one is used as it
is, whatever its arguments). Set-aside messages are published, with publisher
confirms, to the durable queue ``<queue>.dead`` that slawatch declares, carrying the
original body and properties plus the headers ``x-slawatch-reason``,
``x-slawatch-source`` and ``x-slawatch-queue``; only once the broker confirmed that
copy is the original acknowledged. (Not a dead-letter exchange: that needs arguments
on the queue itself, which slawatch would have to redeclare, and a reject through it
carries no reason.)
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from slawatch.config.sources import AmqpSource
from slawatch.events.sources.base import Consumer, Message

_FAILURES = (pika.exceptions.AMQPError, OSError)
TIMEOUT = 10.0  # seconds to connect, and for a blocked connection


class AmqpConsumer(Consumer):
    kind = "RabbitMQ"

    def __init__(self, config: AmqpSource) -> None:
        super().__init__(config)
        self.source = config
        self._conn: BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._buffer: list[Message] = []

    def connect(self) -> None:
        self.close()
        try:
            params = pika.URLParameters(self.source.url.get_secret_value())
            params.socket_timeout = TIMEOUT
            params.blocked_connection_timeout = TIMEOUT
            params.connection_attempts = 1
            self._conn = pika.BlockingConnection(params)
            channel = self._declare(self._conn, self.source.queue)
            channel.queue_declare(self.source.dead, durable=True)
            channel.confirm_delivery()
            channel.basic_qos(prefetch_count=self.source.batch)
            channel.basic_consume(self.source.queue, self._delivered, auto_ack=False)
            self._channel = channel
        except _FAILURES as exc:
            self.close()
            raise self.error(exc, f"queue {self.source.queue}") from exc

    @staticmethod
    def _declare(conn: BlockingConnection, queue: str) -> BlockingChannel:
        """A channel, the queue there: used as it is, or declared durable when missing."""
        channel = conn.channel()
        try:
            channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            channel = conn.channel()  # a failed passive declare closes its channel
            channel.queue_declare(queue, durable=True)
        return channel

    def _delivered(
        self, channel: Any, method: Any, properties: pika.BasicProperties, body: bytes
    ) -> None:
        tag = method.delivery_tag
        self._buffer.append(Message(body, (tag, properties), f"delivery {tag}"))

    def fetch(self, limit: int, wait: float) -> list[Message]:
        conn = self._live()
        try:
            deadline = time.monotonic() + wait
            while not self._buffer and (left := deadline - time.monotonic()) > 0:
                conn.process_data_events(time_limit=left)  # returns when one arrives
            while 0 < len(self._buffer) < limit:
                before = len(self._buffer)
                conn.process_data_events(time_limit=0)  # the rest already on the way
                if len(self._buffer) == before:
                    break
        except _FAILURES as exc:
            raise self.error(exc, f"reading queue {self.source.queue}") from exc
        batch, self._buffer = self._buffer[:limit], self._buffer[limit:]
        return batch

    def ack(self, messages: list[Message]) -> None:
        channel = self._live_channel()
        try:
            for m in messages:
                channel.basic_ack(m.handle[0])
        except _FAILURES as exc:
            raise self.error(exc, f"acknowledging on queue {self.source.queue}") from exc

    def set_aside(self, message: Message, reason: str) -> None:
        channel = self._live_channel()
        tag, properties = message.handle
        headers = dict(properties.headers or {})
        headers.update(
            {
                "x-slawatch-reason": reason,
                "x-slawatch-source": self.name,
                "x-slawatch-queue": self.source.queue,
            }
        )
        properties.headers = headers
        properties.delivery_mode = pika.DeliveryMode.Persistent.value
        try:
            # Confirmed (confirm_delivery): back only once the broker has the copy.
            channel.basic_publish(
                "", self.source.dead, message.body or b"", properties, mandatory=True
            )
            channel.basic_ack(tag)
        except _FAILURES as exc:
            raise self.error(exc, f"setting aside into queue {self.source.dead}") from exc

    def keepalive(self, messages: list[Message]) -> None:
        try:
            # Heartbeats; deliveries that come meanwhile wait in the buffer (at most
            # `batch` are ever unacknowledged: the prefetch).
            self._live().process_data_events(time_limit=0)
        except _FAILURES as exc:
            raise self.error(exc, "keeping the connection") from exc

    def waiting(self) -> int:
        channel = self._live_channel()
        try:
            declared = channel.queue_declare(self.source.queue, passive=True)
        except _FAILURES as exc:
            raise self.error(exc, f"queue {self.source.queue}") from exc
        return int(declared.method.message_count) + len(self._buffer)

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        self._buffer = []  # unacknowledged: the broker delivers them again
        if conn is not None and conn.is_open:
            with contextlib.suppress(Exception):  # a broken connection: nothing more to do
                conn.close()

    def _live(self) -> BlockingConnection:
        if self._conn is None or not self._conn.is_open:
            raise self.error(ConnectionError("not connected"), "connection")
        return self._conn

    def _live_channel(self) -> BlockingChannel:
        self._live()
        if self._channel is None or not self._channel.is_open:
            raise self.error(ConnectionError("the channel is closed"), "channel")
        return self._channel
