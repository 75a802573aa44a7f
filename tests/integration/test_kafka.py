"""The kafka source and notifier against a real Kafka-protocol broker: Tansu, started
privately for this module (tests/tansu.py).

Events in become timers; a poison message goes to ``<topic>.dead`` and its offset is
committed; an offset never moves past a message not yet stored; a restart reads again
what was not committed and the repeats dedupe by id; two ``slawatch run`` processes
share a topic's partitions through the group, and when one is SIGKILLed mid-stream
the other takes its partitions and every event is stored exactly once. The notifier
writes one message per alert keyed by the episode.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from slawatch.clock import Clock
from slawatch.config.notifiers import KafkaConfig
from slawatch.config.sources import KafkaSource
from slawatch.db import Database
from slawatch.delivery.notifiers import build as build_notifier
from slawatch.engine.migrate import migrate
from slawatch.errors import DeliveryError
from slawatch.events.sources import Drained, SourceRunner, build
from slawatch.events.sources.base import Consumer, Message
from tests.conftest import ROOT
from tests.integration.source_helpers import (
    KNOWN,
    RULE,
    Counts,
    count,
    event,
    events_db,
    parcel_rule,
    shipped,
    timers,
)
from tests.integration.test_cli import clean_env
from tests.receivers import closed_port
from tests.tansu import Tansu, tansu
from tests.waiting import wait_until

__all__ = ["events_db", "tansu"]

DAYS_30 = timedelta(days=30)
SEVERITY = {"severity": "warning"}


def source(t: Tansu, topic: str, **more: Any) -> KafkaSource:
    # A group per topic: a group's rebalance waits for every member it still counts.
    # A short session: the group's first join waits on heartbeats (a third of it).
    return KafkaSource.model_validate(
        {"name": "kafka", "type": "kafka", "url": t.url, "topic": topic, "group": topic}
        | {"session_timeout": "6s"}
        | more
    )


def seen(dsn: str) -> int:
    return count(dsn, "SELECT count(*) FROM slawatch.event_seen")


def fetch_all(consumer: Consumer, n: int) -> list[Message]:
    """``n`` messages fetched (the group's assignment takes a moment)."""
    got: list[Message] = []

    def more() -> bool:
        got.extend(consumer.fetch(n, 0.2))
        return len(got) >= n

    wait_until(more, f"{n} messages read")
    assert len(got) == n
    return got


def runner(t: Tansu, topic: str, dsn: str, counts: Counts, **more: Any) -> SourceRunner:
    db = Database(dsn, size=2)
    return SourceRunner(
        build(source(t, topic, **more)),
        db,
        Clock(),
        lambda: KNOWN,
        DAYS_30,
        counts,
        backoff_cap=0.5,
        poll=0.2,
    )


def test_events_become_timers_and_a_poison_message_goes_to_the_dead_topic(
    tansu: Tansu, events_db: str
) -> None:
    topic = tansu.topic(2)
    dead = tansu.topic(1)
    poison = [b"this is not JSON", event("shiped", "typo")]
    good = shipped(range(6))
    tansu.produce(topic, [good[0], poison[0], *good[1:4], poison[1], *good[4:]])
    counts = Counts()
    r = runner(tansu, topic, events_db, counts, dead_topic=dead, batch=3)
    r.start()
    try:
        wait_until(lambda: timers(events_db) == 6 and len(counts.reasons) == 2, "all handled")
        # Every offset committed: the poison ones too, once the dead topic has them.
        wait_until(lambda: tansu.committed(topic, topic) == 8, "offsets committed")
    finally:
        r.stop()
        r.db.close()
    assert counts.accepted == 6 and counts.duplicates == 0
    set_aside = tansu.read(dead, 2)
    assert sorted(m.value() for m in set_aside) == sorted(poison)
    headers = [dict(m.headers()) for m in set_aside]
    reasons = sorted(h["slawatch_reason"].decode() for h in headers)
    assert reasons[0].startswith("not JSON: ") and reasons[1].startswith("type: 'shiped'")
    assert all(h["slawatch_topic"] == topic.encode() for h in headers)


def test_an_offset_never_moves_past_a_message_not_yet_stored(tansu: Tansu) -> None:
    """A poison message set aside before the good ones before it are stored commits
    nothing: a crash then must not skip them."""
    topic = tansu.topic(1)
    dead = tansu.topic(1)
    tansu.produce(topic, [b"a", b"b", b"c"])
    consumer = build(source(tansu, topic, dead_topic=dead))
    consumer.connect()
    try:
        got = fetch_all(consumer, 3)
        consumer.set_aside(got[1], "poison")
        assert tansu.committed(topic, topic) == 0  # a is not stored yet
        consumer.ack([got[0]])
        assert tansu.committed(topic, topic) == 2  # a stored, b set aside; c in hand
        consumer.ack([got[2]])
        assert tansu.committed(topic, topic) == 3
    finally:
        consumer.close()


def test_a_restart_reads_again_what_was_not_committed_and_duplicates_dedupe(
    tansu: Tansu, events_db: str
) -> None:
    topic = tansu.topic(2)
    tansu.produce(topic, shipped(range(10)))
    # A consumer that read everything and died before acknowledging (close, no ack).
    first = build(source(tansu, topic))
    first.connect()
    fetch_all(first, 10)
    first.close()
    assert tansu.committed(topic, topic) == 0
    tansu.produce(topic, shipped(range(5)))  # the same ids again: duplicates
    counts = Counts()
    r = runner(tansu, topic, events_db, counts)
    r.start()
    try:
        wait_until(lambda: counts.accepted + counts.duplicates == 15, "all 15 read")
        wait_until(lambda: tansu.committed(topic, topic) == 15, "offsets committed")
    finally:
        r.stop()
        r.db.close()
    assert (counts.accepted, counts.duplicates) == (10, 5)
    assert seen(events_db) == 10 and timers(events_db) == 10


def test_a_broker_outage_is_one_line_each_way(
    events_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A private broker, stopped and started again on its port (in memory: the topic
    is made again, and the events after the outage are stored)."""
    caplog.set_level(logging.INFO, logger="slawatch")
    broker = Tansu()
    counts = Counts()
    try:
        topic = broker.topic(1)
        broker.produce(topic, shipped(range(3)))
        r = runner(broker, topic, events_db, counts)
        r.start()
        try:
            wait_until(lambda: counts.accepted == 3, "3 stored")
            broker.stop()
            wait_until(lambda: "Kafka unreachable" in caplog.text, "the outage line")
            broker = Tansu(broker.port)
            broker.topic(1, name=topic)
            broker.produce(topic, shipped(range(3, 5)))
            wait_until(lambda: counts.accepted == 5, "2 more stored after the outage")
            wait_until(lambda: "Kafka reachable again" in caplog.text, "the line it is back")
        finally:
            r.stop()
            r.db.close()
    finally:
        broker.stop()
    lines = [r.getMessage() for r in caplog.records if "reachable" in r.getMessage()]
    assert len(lines) == 2, lines
    assert timers(events_db) == 5


def test_a_drain_stores_what_waits_then_ends(tansu: Tansu, events_db: str) -> None:
    """``run --once``: the group's first join takes seconds; the drain goes on while
    the broker counts messages beyond the group's committed offsets."""
    topic = tansu.topic(2)
    tansu.produce(topic, shipped(range(20)), keyed=True)
    r = runner(tansu, topic, events_db, Counts(), batch=5)
    try:
        assert r.drain() == Drained(accepted=20)
    finally:
        r.db.close()
    assert tansu.committed(topic, topic) == 20 and timers(events_db) == 20


class Process:
    """One ``slawatch run`` child, its stderr collected by a thread."""

    def __init__(self, args: list[str], dsn: str) -> None:
        env = clean_env() | {"SLAWATCH_DSN": dsn, "SLAWATCH_LOG_FORMAT": "text"}
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "slawatch", *args, "run"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def assigned(self) -> list[str]:
        """The partition lists this process was assigned, in order."""
        mark = "assigned: "
        return [ln.split(mark, 1)[1].strip() for ln in self.lines if mark in ln]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(10)
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop(signal.SIGKILL)


def test_two_processes_share_the_partitions_and_sigkill_of_one_loses_nothing(
    tansu: Tansu, dsn: str, tmp_path: Path, processes: list[Process]
) -> None:
    topic = tansu.topic(2)
    for name in ("rules", "notifiers", "sources"):
        (tmp_path / name).mkdir()
    (tmp_path / "rules" / "parcel.yaml").write_text(RULE.replace("[hook]", "[console]"))
    (tmp_path / "notifiers" / "console.yaml").write_text("type: console\n")
    (tmp_path / "sources" / "kafka.yaml").write_text(
        f"type: kafka\nurl: {tansu.url}\ntopic: {topic}\ngroup: {topic}\nbatch: 50\n"
        "session_timeout: 6s\n"
    )
    args = [f"--{n}={tmp_path / n}" for n in ("rules", "notifiers", "sources")]
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [parcel_rule()])
        # A slow disk: storing a batch takes a while, so the kill lands while the
        # killed process has a batch in hand (read, not yet committed).
        conn.execute(
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(0.005); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER slow BEFORE INSERT ON slawatch.event_seen"
            " FOR EACH ROW EXECUTE FUNCTION slow()"
        )

    a = Process(args, dsn)
    processes.append(a)
    wait_until(lambda: a.assigned()[-1:] == ["0, 1"], "the first process has both partitions")
    b = Process(args, dsn)
    processes.append(b)
    # The group rebalanced: one partition each.
    wait_until(
        lambda: b.assigned()[-1:] in (["0"], ["1"]) and a.assigned()[-1:] in (["0"], ["1"]),
        "one partition each",
    )
    n = 1000
    # Due in an hour: only stored here. Keyed by parcel: spread over both partitions.
    tansu.produce(topic, [event("shipped", f"p{k}") for k in range(n)], keyed=True)
    wait_until(lambda: seen(dsn) >= 100, "some events stored")
    a.stop(signal.SIGKILL)
    at_kill = seen(dsn)
    # Both partitions are read at about one pace: half of it left means the killed
    # process had messages of its own to go (and, most likely, a batch in hand).
    assert at_kill < n // 2, "the kill came too late: not mid-stream"
    # The survivor takes the dead one's partition once its session times out.
    wait_until(lambda: b.assigned()[-1:] == ["0, 1"], "the survivor has both partitions")
    wait_until(lambda: seen(dsn) == n, f"all {n} events stored", 60)
    wait_until(lambda: tansu.committed(topic, topic) == n, "every offset committed", 30)
    assert timers(dsn) == n  # each stored once: one timer per key, no event lost
    assert b.process.poll() is None
    b.stop()
    assert b.process.returncode == 0, "".join(b.lines[-20:])
    assert "Traceback" not in "".join(b.lines)


def test_the_notifier_keys_each_message_by_its_episode(tansu: Tansu) -> None:
    topic = tansu.topic(3)
    notifier = build_notifier(
        KafkaConfig.model_validate(
            {"name": "k", "type": "kafka", "url": tansu.url, "topic": topic, "timeout": "5s"}
        )
    )
    alerts = [
        {"id": f"parcel:p{k}:e1:n{i}", "rule": "parcel", "key": f"p{k}", "episode": 1, "n": i}
        | SEVERITY
        for k in range(4)
        for i in (1, 2, 3)
    ]
    try:
        notifier.send(alerts)
    finally:
        notifier.close()
    got = tansu.read(topic, len(alerts))
    by_key: dict[bytes, list[Any]] = {}
    for m in got:
        by_key.setdefault(m.key(), []).append(m)
    assert sorted(by_key) == sorted(f"parcel/p{k}/1".encode() for k in range(4))
    for messages in by_key.values():
        assert len({m.partition() for m in messages}) == 1  # one episode, one partition
        assert [orjson.loads(m.value())["n"] for m in messages] == [1, 2, 3]  # in order
        assert [dict(m.headers())["slawatch_id"] for m in messages] == [
            orjson.loads(m.value())["id"].encode() for m in messages
        ]


def test_the_notifier_fails_in_one_line_when_the_broker_is_away() -> None:
    notifier = build_notifier(
        KafkaConfig.model_validate(
            {
                "name": "k",
                "type": "kafka",
                "url": f"kafka://user:s3cret-pw@127.0.0.1:{closed_port()}",
                "topic": "x",
                "timeout": "1s",
            }
        )
    )
    try:
        with pytest.raises(DeliveryError) as caught:
            notifier.send([{"id": "a", "rule": "r", "key": "k", "episode": 1, "n": 1} | SEVERITY])
    finally:
        notifier.close()
    assert "s3cret-pw" not in str(caught.value) and "\n" not in str(caught.value)
