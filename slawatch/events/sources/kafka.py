"""Kafka: a consumer group reads the topic; each message's value is the event's JSON.

Offsets are committed by hand, never automatically: after the transaction that stored
a batch committed, each partition's offset moves past what was stored or set aside,
and not past a message still in hand. A process that dies, or a rebalance that moves
a partition, leaves the uncommitted messages to the next owner, which reads them again
(an event with an ``id`` is then a duplicate, dropped). A commit refused because the
partition moved meanwhile is no error: its new owner reads those messages again.

A set-aside message is produced (idempotent, all in-sync replicas) to ``<topic>.dead``
with its key and value and the headers ``slawatch_reason``, ``slawatch_source``,
``slawatch_topic``, ``slawatch_partition`` and ``slawatch_offset``; its offset is
committed once the dead topic has it. Topics are not created: the broker's
``auto.create.topics.enable``, or the operator, does that.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from slawatch.config.notifiers import kafka_client
from slawatch.config.sources import KafkaSource
from slawatch.events.sources.base import Consumer, Message

log = logging.getLogger(__name__)
# librdkafka logs critical problems only: an unreachable broker is our own one line
# each way (or a failed send), where librdkafka would log every reconnect.
QUIET = 2

TIMEOUT = 10.0  # seconds for a metadata, commit or offset request, and a dead-letter send
# A commit the group refused because the partition moved to another member.
_MOVED = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._ASSIGNMENT_LOST,
}


class KafkaConsumer(Consumer):
    kind = "Kafka"

    def __init__(self, config: KafkaSource) -> None:
        super().__init__(config)
        self.source = config
        self._client = kafka_client(config.url.get_secret_value(), config.sasl_mechanism)
        self._consumer: confluent_kafka.Consumer | None = None
        self._producer: confluent_kafka.Producer | None = None
        # Per partition: the offsets fetched and not committed yet, in order, and
        # those of them stored or set aside.
        self._open: dict[int, list[int]] = {}
        self._done: dict[int, set[int]] = {}
        self._trouble: KafkaError | None = None

    def connect(self) -> None:
        self.close()
        s = self.source
        session = int(s.session_timeout.total_seconds() * 1000)
        conf: dict[str, Any] = {
            **self._client,
            "group.id": s.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",  # a new group reads what was there before it
            "session.timeout.ms": session,
            # Kafka's default (3 s), or a third of a shorter session: a rebalance waits on it.
            "heartbeat.interval.ms": max(min(3000, session // 3), 100),
            "socket.timeout.ms": int(TIMEOUT * 1000),
            "logger": log,
            "log_level": QUIET,
            "error_cb": self._error,
        }
        try:
            consumer = confluent_kafka.Consumer(conf)
            self._consumer = consumer
            # Reaches a broker, or says why not; the topic must exist.
            topics = consumer.list_topics(s.topic, timeout=TIMEOUT).topics
            found = topics.get(s.topic)
            if found is None or found.error is not None:
                why = found.error.str() if found is not None and found.error else "not found"
                raise KafkaException(f"topic {s.topic}: {why}")
            consumer.subscribe(
                [s.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
            )
        except (KafkaException, ValueError) as exc:
            self.close()
            raise self.error(exc, f"topic {s.topic}") from exc

    def _error(self, error: KafkaError) -> None:
        # librdkafka reconnects by itself and consume() just returns nothing meanwhile:
        # every broker down (or a fatal error) is raised at the next fetch instead, so
        # the runner says it in one line and reconnects when the broker is back.
        if error.fatal() or error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._trouble = error

    def _assigned(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        numbers = ", ".join(str(p) for p in sorted(tp.partition for tp in partitions)) or "none"
        log.info("source %s: partitions of %s assigned: %s", self.name, self.source.topic, numbers)
        for tp in partitions:
            self._open[tp.partition], self._done[tp.partition] = [], set()

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        # Their messages in hand are read again by the next owner; nothing to commit.
        for tp in partitions:
            self._open.pop(tp.partition, None)
            self._done.pop(tp.partition, None)

    def fetch(self, limit: int, wait: float) -> list[Message]:
        consumer = self._live()
        try:
            got = consumer.consume(num_messages=limit, timeout=wait)
        except KafkaException as exc:
            raise self.error(exc, f"reading topic {self.source.topic}") from exc
        if self._trouble is not None:
            raise self.error(KafkaException(self._trouble), f"reading topic {self.source.topic}")
        out = []
        for m in got:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise self.error(KafkaException(error), f"reading topic {self.source.topic}")
            partition, offset = int(m.partition() or 0), int(m.offset() or 0)
            self._open.setdefault(partition, []).append(offset)
            self._done.setdefault(partition, set())
            label = f"partition {partition} offset {offset}"
            value = m.value()
            if value is None:
                out.append(Message(None, m, label, "the message has no value (a tombstone)"))
            else:
                out.append(Message(value, m, label))
        return out

    def ack(self, messages: list[Message]) -> None:
        self._settle(messages)

    def _settle(self, messages: list[Message]) -> None:
        """Mark ``messages`` done; commit each partition past its done prefix."""
        touched = set()
        for m in messages:
            partition, offset = m.handle.partition(), m.handle.offset()
            if partition in self._done:  # else: revoked meanwhile
                self._done[partition].add(offset)
                touched.add(partition)
        commits = []
        for partition in touched:
            offsets, done = self._open[partition], self._done[partition]
            n = 0
            while n < len(offsets) and offsets[n] in done:
                n += 1
            if n:
                commits.append(TopicPartition(self.source.topic, partition, offsets[n - 1] + 1))
                done.difference_update(offsets[:n])
                del offsets[:n]
        if not commits:
            return
        try:
            self._live().commit(offsets=commits, asynchronous=False)
        except KafkaException as exc:
            code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
            if code not in _MOVED:
                raise self.error(exc, f"committing on topic {self.source.topic}") from exc
            log.info("source %s: a commit came after a rebalance; read again: %s", self.name, exc)

    def set_aside(self, message: Message, reason: str) -> None:
        s = self.source
        m = message.handle
        headers: list[tuple[str, str | bytes | None]] = [
            ("slawatch_reason", reason.encode()),
            ("slawatch_source", self.name.encode()),
            ("slawatch_topic", s.topic.encode()),
            ("slawatch_partition", str(m.partition()).encode()),
            ("slawatch_offset", str(m.offset()).encode()),
        ]
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        try:
            producer = self._dead_producer()
            producer.produce(s.dead, m.value(), m.key(), headers=headers, on_delivery=delivered)
            left = producer.flush(TIMEOUT)
        except (KafkaException, BufferError) as exc:
            raise self.error(exc, f"setting aside into topic {s.dead}") from exc
        if failed or left:
            why = failed[0].str() if failed else "timed out"
            raise self.error(KafkaException(why), f"setting aside into topic {s.dead}")
        self._settle([message])

    def _dead_producer(self) -> confluent_kafka.Producer:
        if self._producer is None:
            self._producer = confluent_kafka.Producer(
                {
                    **self._client,
                    "enable.idempotence": True,
                    "message.timeout.ms": int(TIMEOUT * 1000),
                    "logger": log,
                    "log_level": QUIET,
                }
            )
        return self._producer

    def keepalive(self, messages: list[Message]) -> None:
        # librdkafka heartbeats the group from a thread of its own: the partitions stay
        # this member's while the database is away, up to max.poll.interval.ms (5
        # minutes); past that the group moves them, and their next owner reads the
        # batch again (duplicates by id are dropped).
        self._live()

    def waiting(self) -> int:
        s = self.source
        consumer = self._live()
        try:
            meta = consumer.list_topics(s.topic, timeout=TIMEOUT).topics.get(s.topic)
            partitions = [TopicPartition(s.topic, p) for p in (meta.partitions if meta else {})]
            total = 0
            for tp in consumer.committed(partitions, timeout=TIMEOUT):
                low, high = consumer.get_watermark_offsets(tp, timeout=TIMEOUT, cached=False)
                total += max(0, high - (tp.offset if tp.offset >= 0 else low))
        except KafkaException as exc:
            raise self.error(exc, f"topic {s.topic}") from exc
        return total

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        self._open, self._done, self._trouble = {}, {}, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()  # leaves the group: its partitions move at once
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.flush(0)

    def _live(self) -> confluent_kafka.Consumer:
        if self._consumer is None:
            raise self.error(ConnectionError("not connected"), "connection")
        return self._consumer
