"""Event sources (docs/explanation/events.md): brokers read into
:func:`slawatch.events.ingest.ingest`.

``build(config)`` makes the consumer of a ``sources/<name>.yaml``;
:class:`~slawatch.events.sources.runner.SourceRunner` runs it (a batch read, stored
in one transaction, then acknowledged; bad messages set aside).
"""

from __future__ import annotations

from slawatch.config.sources import (
    AmqpSource,
    KafkaSource,
    NatsSource,
    RedisSource,
    SourceConfig,
)
from slawatch.events.sources.base import BrokerError, Consumer, NoRecorder, Recorder
from slawatch.events.sources.runner import Drained, SourceRunner

__all__ = [
    "BrokerError",
    "Consumer",
    "Drained",
    "NoRecorder",
    "Recorder",
    "SourceRunner",
    "build",
]


def build(config: SourceConfig) -> Consumer:
    """The consumer for one source's configuration (not connected yet). A broker's
    client is imported only when a source of its type is built: each is an extra."""
    if isinstance(config, AmqpSource):
        from slawatch.events.sources.amqp import AmqpConsumer

        return AmqpConsumer(config)
    if isinstance(config, RedisSource):
        from slawatch.events.sources.redis import RedisConsumer

        return RedisConsumer(config)
    if isinstance(config, NatsSource):
        from slawatch.events.sources.nats import NatsConsumer

        return NatsConsumer(config)
    if isinstance(config, KafkaSource):
        from slawatch.events.sources.kafka import KafkaConsumer

        return KafkaConsumer(config)
    raise TypeError(f"no consumer for {type(config).__name__}")
