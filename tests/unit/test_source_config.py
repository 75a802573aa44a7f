"""``sources/<name>.yaml``: validation with one-line errors naming file and field, the
folder rules, and reading a message into an event (as is, or mapped)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
import yaml
from pydantic import ValidationError

from slawatch.cli import build_parser, settings_from
from slawatch.config.notifiers import KafkaConfig, kafka_client
from slawatch.config.rules import Rule
from slawatch.config.settings import Settings
from slawatch.config.sources import (
    AmqpSource,
    EventMap,
    KafkaSource,
    NatsSource,
    RedisSource,
    check_sources,
    load_sources,
)
from slawatch.errors import ConfigError
from slawatch.events.sources import build
from slawatch.events.sources.base import MAX_MESSAGE, Unreadable, read_event
from slawatch.runtime.boot import load_event_sources
from tests.conftest import ROOT

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
KNOWN = {"parcel_shipped", "parcel_delivered"}
RETENTION = timedelta(days=30)


def error_of(tmp_path: Path, text: str, name: str = "src.yaml") -> str:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_sources(tmp_path)
    return str(exc.value)


def test_shipped_examples_load_and_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBIT_PASSWORD", "s3cret-pw")
    configs = {c.name: c for c in load_sources(ROOT / "sources" / "examples")}
    assert sorted(configs) == [
        "carrier-cloudevents",
        "orders-kafka",
        "parcels-rabbit",
        "parcels-stream",
    ]
    ce = configs["carrier-cloudevents"]
    assert isinstance(ce, NatsSource) and ce.dead == "carrier.events.dead"
    assert ce.map == EventMap(type="type", key="subject", at="time", data="data", id="id")
    rabbit = configs["parcels-rabbit"]
    assert isinstance(rabbit, AmqpSource) and rabbit.dead == "parcels.dead"
    assert "s3cret-pw" not in repr(rabbit)  # the URL is a secret
    assert [type(build(c)).__name__ for c in configs.values()] == [
        "NatsConsumer",
        "KafkaConsumer",
        "AmqpConsumer",
        "RedisConsumer",
    ]
    # No top-level file: the shipped ./sources folder runs no source.
    assert load_sources(ROOT / "sources") == []


def test_defaults() -> None:
    amqp = AmqpSource.model_validate({"name": "a", "type": "amqp", "queue": "q"})
    assert amqp.url.get_secret_value() == "amqp://guest:guest@127.0.0.1:5672/"
    assert (amqp.batch, amqp.map) == (100, None)
    r = RedisSource.model_validate({"name": "r", "type": "redis", "stream": "s"})
    assert (r.group, r.consumer, r.field, r.dead) == ("slawatch", None, "event", "s.dead")
    n = NatsSource.model_validate({"name": "n", "type": "nats", "stream": "S", "subject": "a.b"})
    assert (n.durable, n.dead) == ("slawatch", "a.b.dead")
    k = KafkaSource.model_validate({"name": "k", "type": "kafka", "topic": "orders"})
    assert (k.group, k.dead, k.session_timeout) == (
        "slawatch",
        "orders.dead",
        timedelta(seconds=45),
    )
    assert k.url.get_secret_value() == "kafka://127.0.0.1:9092"


@pytest.mark.parametrize(
    ("url", "conf"),
    [
        ("kafka://a:9092,b:9093", {"bootstrap.servers": "a:9092,b:9093"}),
        ("kafkas://a:9093", {"bootstrap.servers": "a:9093", "security.protocol": "SSL"}),
        (
            "kafkas://u:p%40ss@a:9093",
            {"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p@ss"},
        ),
    ],
)
def test_kafka_urls(url: str, conf: dict[str, str]) -> None:
    k = KafkaSource.model_validate({"name": "k", "type": "kafka", "topic": "t", "url": url})
    assert conf.items() <= kafka_client(k.url.get_secret_value(), k.sasl_mechanism).items()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://a:9092", "must start with kafka:// or kafkas://"),
        ("kafka://u:secret@a:99999", "host:port joined by commas"),
        ("kafka://a", "host:port joined by commas"),
    ],
)
def test_bad_kafka_urls_are_one_line_without_the_password(url: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        KafkaSource.model_validate({"name": "k", "type": "kafka", "topic": "t", "url": url})
    (error,) = caught.value.errors()
    assert words in error["msg"] and "secret" not in error["msg"]


def test_the_dead_topic_is_not_the_topic() -> None:
    with pytest.raises(ValidationError, match="must not be the topic itself"):
        KafkaSource.model_validate({"name": "k", "type": "kafka", "topic": "t", "dead_topic": "t"})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"topic": "."}, "topic: '.' is not a topic name"),
        ({"topic": "..", "dead_topic": "d"}, "topic: '..' is not a topic name"),
        ({"topic": "t", "dead_topic": ".."}, "dead_topic: '..' is not a topic name"),
        ({"topic": "t" * 245}, "dead_topic: the default 'ttt"),
    ],
    ids=["dot", "dotdot", "dead-dotdot", "long-default-dead"],
)
def test_topics_kafka_refuses_are_one_line(
    tmp_path: Path, fields: dict[str, str], expected: str
) -> None:
    """Kafka refuses the topics "." and ".." and any longer than 249 characters: the
    default dead topic <topic>.dead of a 245-character topic would be one, refused at
    the first bad message instead of at check."""
    body = {"type": "kafka", "url": "kafka://127.0.0.1:9092"} | fields
    message = error_of(tmp_path, yaml.safe_dump(body, width=10**6))
    (line,) = message.splitlines()
    assert line.startswith(f"{tmp_path / 'src.yaml'}: {expected}"), line


def test_a_session_timeout_kafka_refuses_is_one_line(tmp_path: Path) -> None:
    body = {"type": "kafka", "topic": "t", "session_timeout": "5s"}
    (line,) = error_of(tmp_path, yaml.safe_dump(body)).splitlines()
    assert line.startswith(f"{tmp_path / 'src.yaml'}: session_timeout: 5s is shorter than 6s")
    for accepted in ("6s", "30m"):
        KafkaSource.model_validate(
            {"name": "k", "type": "kafka", "topic": "t"} | {"session_timeout": accepted}
        )


def test_topics_at_kafkas_limits_are_accepted() -> None:
    for fields in ({"topic": "..."}, {"topic": "t" * 244}, {"topic": "t" * 249, "dead_topic": "d"}):
        KafkaSource.model_validate({"name": "k", "type": "kafka"} | fields)


@pytest.mark.parametrize("topic", [".", ".."])
def test_the_kafka_notifier_refuses_the_topics_kafka_refuses(topic: str) -> None:
    with pytest.raises(ValidationError, match=r"is not a topic \(letters, digits, \. _ -; not"):
        KafkaConfig.model_validate({"name": "k", "type": "kafka", "topic": topic})
    KafkaConfig.model_validate({"name": "k", "type": "kafka", "topic": "..."})


def test_a_missing_default_folder_is_no_sources_a_named_one_is_an_error(tmp_path: Path) -> None:
    assert load_sources(tmp_path / "nope") == []
    with pytest.raises(ConfigError, match="sources folder not found"):
        load_sources(tmp_path / "nope", required=True)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("type: sqs\n", "src.yaml: type: 'sqs' is not a source type (one of amqp, redis"),
        ("queue: q\n", "src.yaml: type: is required"),
        ("type: amqp\n", "src.yaml: queue: is required"),
        ("type: amqp\nqueue: q\nbatch: 0\n", "src.yaml: batch: 0: Input should be greater"),
        ("type: amqp\nqueue: q\nbatch: 10001\n", "src.yaml: batch: 10001: Input should be less"),
        ("type: amqp\nqueue: amq.x\n", "src.yaml: queue: names starting with 'amq.'"),
        ("type: amqp\nqueue: 'a b'\n", "src.yaml: queue: 'a b' is not a queue name"),
        ("type: amqp\nqueue: q\nprefetch: 5\n", "src.yaml: prefetch: unknown field"),
        ("type: amqp\nqueue: q\nurl: http://x\n", "src.yaml: url: must start with amqp://"),
        ("type: redis\nstream: s\nmap: {type: kind}\n", "src.yaml: map.key: is required"),
        ("type: redis\nstream: s\nmap: {key: k}\n", "src.yaml: map.type: is required"),
        (
            "type: redis\nstream: s\nmap: {type: t, key: k, when: w}\n",
            "src.yaml: map.when: unknown field",
        ),
        ("type: redis\nstream: s\nmap: {type: t, key: 'a..b'}\n", "map.key: 'a..b' is not"),
        ("type: redis\nstream: s\nmap: avro\n", "src.yaml: map: 'avro' is not a preset"),
        ("type: redis\nstream: s\nmap: [type]\n", "src.yaml: map: ['type'] is not a preset"),
        ("type: redis\nstream: s\nreclaim_after: 2d\n", "src.yaml: reclaim_after: "),
        ("type: nats\nstream: S\nsubject: 'a.>'\n", "src.yaml: dead_subject: is required when"),
        (
            "type: nats\nstream: S\nsubject: 'a.>'\ndead_subject: a.dead\n",
            "src.yaml: dead_subject: a.dead is within subject a.>",
        ),
        ("type: nats\nstream: S\nsubject: 'a.*'\ndead_subject: 'b.*'\n", "must not have wildcards"),
        ("type: nats\nstream: S.x\nsubject: a\n", "src.yaml: stream: 'S.x' is not a stream name"),
        ("type: nats\nstream: S\nsubject: 'a..b'\n", "src.yaml: subject: 'a..b' is not a subject"),
        ("type: nats\nstream: S\nsubject: '>.a'\n", "src.yaml: subject: '>.a' is not a subject"),
        ("type: redis\nstream: s\nurl: ${NO_SUCH_VAR_X}\n", "src.yaml: url: environment variable"),
    ],
)
def test_bad_files_are_one_line_naming_file_and_field(
    tmp_path: Path, text: str, error: str
) -> None:
    message = error_of(tmp_path, text)
    assert error in message
    assert message.startswith(str(tmp_path / "src.yaml") + ": ")
    assert "\n" not in message


def test_every_bad_file_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("type: amqp\n")
    (tmp_path / "b.yaml").write_text("type: redis\n")
    message = error_of(tmp_path, "type: nats\nstream: S\n", "c.yaml")
    assert len(message.splitlines()) == 3


def test_a_broker_url_error_never_quotes_the_password(tmp_path: Path) -> None:
    message = error_of(tmp_path, "type: amqp\nqueue: q\nurl: amqp://u:pa/ss@h:99999/\n")
    assert "pa/ss" not in message and "url: not a valid URL" in message


def test_a_source_needs_an_event_rule() -> None:
    source = AmqpSource.model_validate({"name": "a", "type": "amqp", "queue": "q"})
    table_rule = Rule.model_validate(
        {"name": "t", "table": "t", "deadline": "d", "open_when": "true", "notify": ["x"]}
    )
    with pytest.raises(ConfigError, match="no rule has events:"):
        check_sources([source], [table_rule])
    event_rule = Rule.model_validate(
        yaml.safe_load("name: e\nevents: {beat: ping, within: 1h}\nnotify: [x]")
    )
    check_sources([source], [table_rule, event_rule])
    check_sources([], [table_rule])


# --- reading a message -------------------------------------------------------------------


def read(body: bytes | None, mapping: EventMap | None = None) -> object:
    return read_event(body, mapping, KNOWN, NOW, RETENTION)


def unreadable(body: bytes | None, mapping: EventMap | None = None) -> str:
    with pytest.raises(Unreadable) as exc:
        read(body, mapping)
    return exc.value.reason


CLOUDEVENTS = EventMap(type="type", key="subject", at="time", data="data", id="id")


def test_a_message_as_is_is_an_event() -> None:
    body = b'{"type": "parcel_shipped", "key": 42, "at": "2026-11-25T11:00:00Z", "id": "e1"}'
    event = read(body)
    assert (event.type, event.key, event.id) == ("parcel_shipped", "42", "e1")  # type: ignore[attr-defined]


def test_cloudevents_are_mapped() -> None:
    body = orjson.dumps(
        {
            "specversion": "1.0",
            "type": "parcel_shipped",
            "source": "/carrier",
            "id": "A234-1234",
            "subject": "1Z999",
            "time": "2026-11-25T11:00:00.123456789Z",  # Go's nanoseconds
            "datacontenttype": "application/json",
            "data": {"weight": 2},
        }
    )
    event = read(body, CLOUDEVENTS)
    assert event.key == "1Z999" and event.id == "A234-1234"  # type: ignore[attr-defined]
    assert event.data == {"weight": 2}  # type: ignore[attr-defined]
    assert event.at == datetime(2026, 11, 25, 11, 0, 0, 123456, tzinfo=UTC)  # type: ignore[attr-defined]


def test_a_mapping_reads_nested_paths_and_leaves_out_what_is_missing() -> None:
    mapping = EventMap(type="kind", key="parcel.id")
    event = read(b'{"kind": "parcel_delivered", "parcel": {"id": "p1"}, "other": [1]}', mapping)
    assert (event.key, event.at, event.data) == ("p1", None, None)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "mapping", "reason"),
    [
        (None, None, "the message has no body"),
        (b"", None, "not JSON: "),
        (b"\xff\xfe", None, "not JSON: "),
        (b'{"type": "parcel_shipped", "key": "\\ud800"}', None, "not JSON: "),
        (b'["parcel_shipped"]', None, "an event is a JSON object, not list"),
        (b'{"type": "nope", "key": "k"}', None, "type: 'nope': no rule uses this type"),
        (b'{"type": "parcel_shipped"}', None, "key: is required"),
        (b'{"type": "parcel_shipped", "key": "k", "x": 1}', None, "x: unknown field"),
        (b'{"type": "parcel_shipped", "subject": 1.5}', CLOUDEVENTS, "key (from subject): "),
        (b'{"type": "parcel_shipped", "id": "i"}', CLOUDEVENTS, "key (from subject): is required"),
        (b'"text"', CLOUDEVENTS, "a message is a JSON object, not str"),
        (
            b'{"type": "parcel_shipped", "subject": "k", "time": "yesterday"}',
            CLOUDEVENTS,
            "at (from time): 'yesterday' is not a time",
        ),
        (
            b'{"type": "parcel_shipped", "subject": "k", "data": "text"}',
            CLOUDEVENTS,
            "data (from data): must be a JSON object, not str",
        ),
    ],
)
def test_what_is_no_event_says_why(
    body: bytes | None, mapping: EventMap | None, reason: str
) -> None:
    assert unreadable(body, mapping).startswith(reason)


def test_a_message_too_big_is_refused_before_it_is_parsed() -> None:
    body = b"[" * (MAX_MESSAGE + 1)  # parsing this would recurse; it is never parsed
    assert unreadable(body) == f"{MAX_MESSAGE + 1:,} bytes, more than {MAX_MESSAGE:,}"
    data = b'{"type": "parcel_shipped", "key": "k", "data": {"b": "' + b"x" * 70_000 + b'"}}'
    assert unreadable(data).startswith("data: 70,008 bytes as JSON, more than 65,536")


def test_the_folder_named_by_a_flag_or_the_environment_must_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = Rule.model_validate(
        yaml.safe_load("name: e\nevents: {beat: b, within: 1h}\nnotify: [x]")
    )
    monkeypatch.chdir(tmp_path)  # no ./sources here
    assert load_event_sources(Settings(), [rule]) == []
    missing = tmp_path / "nope"
    flag = settings_from(build_parser().parse_args(["--sources", str(missing), "check"]))
    with pytest.raises(ConfigError, match="nope: sources folder not found"):
        load_event_sources(flag, [rule])
    monkeypatch.setenv("SLAWATCH_SOURCES_DIR", str(missing))
    with pytest.raises(ConfigError, match="nope: sources folder not found"):
        load_event_sources(Settings(), [rule])


def test_a_broker_error_never_shows_the_password() -> None:
    url = "amqp://slawatch:s3cret%2Fpw@rabbit.internal:5672/"
    consumer = build(
        AmqpSource.model_validate({"name": "a", "type": "amqp", "url": url, "queue": "q"})
    )
    driver = OSError(f"cannot reach {url} (password s3cret/pw)\nsecond line")
    error = str(consumer.error(driver, "queue q"))
    assert error == "RabbitMQ queue q: OSError: cannot reach *** (password ***) second line"
