"""The AMQP notifier (RabbitMQ): persistent messages, publisher confirms.

One message per alert, ``message_id`` = the alert id, routing key from a
template. With confirms on, ``basic_publish`` returns only once the broker took
the message; ``mandatory`` makes an unroutable message an error, not a loss.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pika
import pika.exceptions

from slawatch.config.notifiers import AmqpConfig
from slawatch.delivery.notifiers.base import BaseNotifier, encode, render
from slawatch.errors import DeliveryError


class AmqpNotifier(BaseNotifier):
    def __init__(self, config: AmqpConfig) -> None:
        super().__init__(config)
        self.config = config
        self._conn: Any = None
        self._channel: Any = None

    def _connect(self) -> Any:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self.close()
        params = pika.URLParameters(self.config.url.get_secret_value())
        params.socket_timeout = self.timeout
        params.blocked_connection_timeout = self.timeout
        params.connection_attempts = 1
        self._conn = pika.BlockingConnection(params)
        channel = self._conn.channel()
        channel.confirm_delivery()
        if self.config.declare:
            channel.exchange_declare(
                self.config.exchange, exchange_type=self.config.exchange_type, durable=True
            )
        self._channel = channel
        return channel

    def send(self, alerts: list[dict[str, Any]]) -> None:
        try:
            channel = self._connect()
            for alert in alerts:
                channel.basic_publish(
                    exchange=self.config.exchange,
                    routing_key=render(self.config.routing_key, alert),
                    body=encode(alert),
                    properties=pika.BasicProperties(
                        content_type="application/json",
                        delivery_mode=pika.DeliveryMode.Persistent,
                        message_id=alert["id"],
                        type=alert["rule"],
                    ),
                    mandatory=True,
                )
        except pika.exceptions.UnroutableError as exc:
            self.close()
            raise DeliveryError(
                f"unroutable: no queue is bound to exchange {self.config.exchange!r} "
                f"for routing key {render(self.config.routing_key, alerts[0])!r}"
            ) from exc
        except pika.exceptions.NackError as exc:
            self.close()
            raise DeliveryError("the broker refused (nack) the messages") from exc
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()
            detail = str(exc) or repr(exc)
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {detail}")) from exc

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None and conn.is_open:
            with contextlib.suppress(Exception):  # a broken connection: nothing more to do
                conn.close()
