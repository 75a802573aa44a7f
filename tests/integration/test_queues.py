"""Queue notifiers against the real RabbitMQ, Redis and NATS on 127.0.0.1.

Without them these tests skip, unless SLAWATCH_REQUIRE_SERVICES=1 (CI), where
they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pika
import pytest
import redis

from slawatch.config.notifiers import AmqpConfig, NatsConfig, RedisConfig
from slawatch.delivery.notifiers.amqp import AmqpNotifier
from slawatch.delivery.notifiers.nats import NatsNotifier
from slawatch.delivery.notifiers.redis import RedisNotifier
from slawatch.errors import DeliveryError
from tests.receivers import closed_port, require_service


def alerts(count: int, rule: str = "job_hung") -> list[dict[str, Any]]:
    return [
        {
            "id": f"{rule}:{k}:1",
            "rule": rule,
            "key": str(k),
            "n": 1,
            "severity": "critical",
            "deadline": "2026-03-01T12:00:00Z",
            "due_at": "2026-03-01T12:15:00Z",
            "fired_at": "2026-03-01T12:15:01Z",
            "row": {"id": k},
            "description": "",
        }
        for k in range(1, count + 1)
    ]


# --- RabbitMQ -----------------------------------------------------------------------


@pytest.fixture
def rabbit() -> Iterator[tuple[str, Any]]:
    """A fresh exchange with a queue bound to every routing key."""
    require_service("RabbitMQ", 5672)
    exchange = f"slawatch_test_{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F"))
    channel = conn.channel()
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, exchange, routing_key="#")
    try:
        yield exchange, (channel, queue)
    finally:
        channel.exchange_delete(exchange)
        conn.close()


def amqp(exchange: str, **fields: Any) -> AmqpNotifier:
    base = {"name": "rabbit", "type": "amqp", "exchange": exchange}
    return AmqpNotifier(AmqpConfig.model_validate(base | fields))


def test_amqp_messages_are_persistent_and_carry_the_alert_id(rabbit: tuple[str, Any]) -> None:
    exchange, (channel, queue) = rabbit
    notifier = amqp(exchange)
    notifier.send(alerts(3))
    got = []
    for _ in range(3):
        method, props, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        got.append((method.routing_key, props.message_id, props.delivery_mode, json.loads(body)))
    assert [g[1] for g in got] == ["job_hung:1:1", "job_hung:2:1", "job_hung:3:1"]
    assert {g[0] for g in got} == {"job_hung.critical"}  # the default {rule}.{severity}
    assert {g[2] for g in got} == {2}  # persistent
    assert got[0][3]["row"] == {"id": 1}
    notifier.close()


def test_amqp_unroutable_is_an_error_not_a_loss(rabbit: tuple[str, Any]) -> None:
    require_service("RabbitMQ", 5672)
    lonely = f"slawatch_test_{uuid.uuid4().hex[:8]}"  # declared by the notifier, nothing bound
    notifier = amqp(lonely)
    with pytest.raises(DeliveryError, match="unroutable"):
        notifier.send(alerts(1))
    notifier.close()
    channel, _ = rabbit[1]
    channel.exchange_delete(lonely)


def test_amqp_broker_down_is_retried() -> None:
    url = f"amqp://guest:s3cret@127.0.0.1:{closed_port()}/%2F"
    notifier = amqp("x", url=url, timeout="2s")
    with pytest.raises(DeliveryError) as exc:
        notifier.send(alerts(1))
    assert not exc.value.permanent and "s3cret" not in str(exc.value)
    notifier.close()


# --- Redis Streams ------------------------------------------------------------------


@pytest.fixture
def stream() -> Iterator[tuple[str, redis.Redis]]:
    """A fresh stream name and a client to read it; deleted afterwards."""
    require_service("Redis", 6379)
    name = f"slawatch_test:{uuid.uuid4().hex[:8]}"
    client = redis.Redis()
    try:
        yield name, client
    finally:
        client.delete(name)
        client.close()


def redis_notifier(stream: str, maxlen: int) -> RedisNotifier:
    config = {"name": "r", "type": "redis", "stream": stream, "maxlen": maxlen}
    return RedisNotifier(RedisConfig.model_validate(config))


def test_redis_stream_entries_carry_the_alert_id(stream: tuple[str, redis.Redis]) -> None:
    name, client = stream
    notifier = redis_notifier(name, 1000)
    notifier.send(alerts(3))
    entries = client.xrange(name)
    assert [e[1][b"id"] for e in entries] == [b"job_hung:1:1", b"job_hung:2:1", b"job_hung:3:1"]
    assert json.loads(entries[0][1][b"alert"])["rule"] == "job_hung"
    notifier.close()


def test_redis_stream_is_trimmed_approximately(stream: tuple[str, redis.Redis]) -> None:
    name, client = stream
    notifier = redis_notifier(name, 10)
    for _ in range(30):
        notifier.send(alerts(100))
    assert client.xlen(name) < 3000
    notifier.close()


def test_redis_down_is_retried() -> None:
    url = f"redis://:s3cret@127.0.0.1:{closed_port()}/0"
    config = {"name": "r", "type": "redis", "url": url, "timeout": "2s"}
    notifier = RedisNotifier(RedisConfig.model_validate(config))
    with pytest.raises(DeliveryError) as exc:
        notifier.send(alerts(1))
    assert not exc.value.permanent and "s3cret" not in str(exc.value)
    notifier.close()


@pytest.fixture
def redis_without_hello(tmp_path: Path) -> Iterator[int]:
    """A private redis-server that does not know HELLO, as Redis before 6 and servers with
    ``rename-command HELLO ""`` are: it answers ``unknown command 'HELLO', with args
    beginning with: '3' 'AUTH' 'default' '<the password>'``."""
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (a private server is started for this test)"
        if os.environ.get("SLAWATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " and SLAWATCH_REQUIRE_SERVICES=1")
        pytest.skip(message)
    port = closed_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    args += ["no", "--dir", str(tmp_path), "--rename-command", "HELLO", ""]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_redis_error_that_quotes_the_password_is_scrubbed(redis_without_hello: int) -> None:
    password = "redis-pw-s3cret"
    url = f"redis://:{password}@127.0.0.1:{redis_without_hello}/0?protocol=3"
    config = {"name": "r", "type": "redis", "url": url, "timeout": "5s"}
    notifier = RedisNotifier(RedisConfig.model_validate(config))
    with pytest.raises(DeliveryError) as exc:
        notifier.send(alerts(1))
    message = str(exc.value)
    # The server's own words are kept (what failed), the password is not.
    assert "unknown command 'HELLO'" in message and "'AUTH' 'default' '***'" in message, message
    assert password not in message
    notifier.close()


# --- NATS JetStream -----------------------------------------------------------------


def test_nats_jetstream_publish_is_acknowledged_and_deduplicated() -> None:
    require_service("NATS", 4222)
    tag = f"slawatch_test_{uuid.uuid4().hex[:8]}"
    config = {
        "name": "n",
        "type": "nats",
        "subject": tag + ".{rule}.{severity}",
        "stream": tag.upper(),
    }
    notifier = NatsNotifier(NatsConfig.model_validate(config))
    try:
        notifier.send(alerts(3))
        notifier.send(alerts(3))  # a repeat: same Nats-Msg-Id, dropped by the stream

        async def read() -> list[tuple[str, str]]:
            nc = await nats.connect("nats://127.0.0.1:4222")
            js = nc.jetstream()
            info = await js.stream_info(tag.upper())
            out = []
            for seq in range(1, info.state.messages + 1):
                msg = await js.get_msg(tag.upper(), seq)
                out.append((msg.subject, (msg.headers or {}).get("Nats-Msg-Id", "")))
            await js.delete_stream(tag.upper())
            await nc.close()
            return out

        got = asyncio.run(read())
    finally:
        notifier.close()
    assert got == [
        (f"{tag}.job_hung.critical", "job_hung:1:1"),
        (f"{tag}.job_hung.critical", "job_hung:2:1"),
        (f"{tag}.job_hung.critical", "job_hung:3:1"),
    ]


def test_nats_down_is_retried() -> None:
    config = {
        "name": "n",
        "type": "nats",
        "url": f"nats://127.0.0.1:{closed_port()}",
        "timeout": "2s",
    }
    notifier = NatsNotifier(NatsConfig.model_validate(config))
    with pytest.raises(DeliveryError) as exc:
        notifier.send(alerts(1))
    assert not exc.value.permanent
    # The connection's own error, not send()'s time-out on a client left connecting.
    assert "ConnectionRefusedError" in str(exc.value), exc.value
    notifier.close()
