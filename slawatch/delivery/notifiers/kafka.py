"""The Kafka notifier: one message per alert from an idempotent producer.

The key is the episode (``<rule>/<key>/<episode>``): every message of one episode
goes to one partition, which keeps their order. ``enable.idempotence`` makes the
producer's retries within a send write each message once, in order, acknowledged by
all in-sync replicas; ``send`` returns once every message is acknowledged. A send
that fails is sent again by slawatch's retry: a consumer drops the repeat by the
``slawatch_id`` header (the alert id).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from slawatch.config.notifiers import KafkaConfig, kafka_client
from slawatch.delivery.notifiers.base import BaseNotifier, encode, render
from slawatch.errors import DeliveryError

log = logging.getLogger(__name__)
# librdkafka logs critical problems only: an unreachable broker is our own one line
# each way (or a failed send), where librdkafka would log every reconnect.
QUIET = 2


def episode_key(alert: dict[str, Any]) -> bytes:
    """The message key: one episode of one row of one rule."""
    return f"{alert['rule']}/{alert['key']}/{alert.get('episode', 0)}".encode()


class KafkaNotifier(BaseNotifier):
    def __init__(self, config: KafkaConfig) -> None:
        super().__init__(config)
        self.config = config
        self._producer: confluent_kafka.Producer | None = None

    def _connect(self) -> confluent_kafka.Producer:
        if self._producer is None:
            ms = int(self.timeout * 1000)
            self._producer = confluent_kafka.Producer(
                {
                    **kafka_client(self.config.url.get_secret_value(), self.config.sasl_mechanism),
                    "enable.idempotence": True,
                    "message.timeout.ms": ms,  # librdkafka gives up on a message then
                    "socket.timeout.ms": ms,
                    "linger.ms": 5,
                    "logger": log,
                    "log_level": QUIET,
                }
            )
        return self._producer

    def send(self, alerts: list[dict[str, Any]]) -> None:
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        try:
            producer = self._connect()
            for alert in alerts:
                producer.produce(
                    render(self.config.topic, alert),
                    encode(alert),
                    episode_key(alert),
                    headers=[
                        ("slawatch_id", str(alert["id"]).encode()),
                        ("slawatch_rule", str(alert["rule"]).encode()),
                        ("content-type", b"application/json"),
                    ],
                    on_delivery=delivered,
                )
            # A little past the messages' own timeout: their reports come first.
            left = producer.flush(self.timeout + 1)
        except (KafkaException, BufferError) as exc:
            self.close()
            raise DeliveryError(self.scrub(f"{type(exc).__name__}: {exc}")) from exc
        if failed or left:
            self.close()  # a fresh producer next time: no fatal state carried over
            why = failed[0].str() if failed else f"{left} messages not acknowledged in time"
            raise DeliveryError(self.scrub(f"kafka: {len(failed) or left} of {len(alerts)}: {why}"))

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.purge()
                producer.flush(0)
