"""Event sources: ``sources/<name>.yaml``, one broker queue or stream per file.

Each file is validated into one of the models below (chosen by ``type``);
:func:`slawatch.events.sources.build` turns one into a consumer that ``slawatch run``
runs (docs/explanation/events.md). A message is one event: as it is (the JSON of ``POST
/v1/events``), or mapped (``map:``) from the message's own JSON, e.g. CloudEvents.

``${VAR}`` in any string value is replaced by the environment variable VAR before
validation, as for notifiers; broker URLs are kept as ``SecretStr`` and never printed.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator

from slawatch.config.durations import duration_validator
from slawatch.config.extras import require_extra
from slawatch.config.files import FileModel, load_dir, shorten
from slawatch.config.notifiers import (
    NAME_PATTERN,
    KafkaUrl,
    SaslMechanism,
    amqp_parse,
    broker_url,
    interpolate,
    redis_parse,
)
from slawatch.config.rules import Rule
from slawatch.errors import ConfigError

EVENT_FIELDS = ("type", "key", "at", "data", "id")
# A path into a message's JSON: keys joined by dots (``data.parcel.id``).
_PATH = re.compile(r"[^.\s]{1,100}(\.[^.\s]{1,100}){0,9}")
# Names the brokers take that slawatch also writes into its own (dead-letter) names.
_QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,249}")
_STREAM_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/{}-]{0,249}")
_GROUP = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,99}")
_NATS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
_NATS_TOKEN = re.compile(r"[A-Za-z0-9_:/-][A-Za-z0-9_:/-]{0,99}")

# Other consumers' entries that waited this long unacknowledged are taken over.
Reclaim = Annotated[
    timedelta, duration_validator(positive=True, limit=timedelta(days=1), limit_text="1 day")
]


def _path(value: Any) -> Any:
    if isinstance(value, str) and not _PATH.fullmatch(value):
        raise ValueError(
            f"{shorten(value)} is not a path into the message: keys joined by dots,"
            " e.g. subject or data.parcel.id"
        )
    return value


MessagePath = Annotated[str, BeforeValidator(_path)]


class EventMap(FileModel):
    """Where each field of an event is found in a message's JSON (dotted paths).

    ``type`` and ``key`` must be given; a field left out, or whose path is not in a
    message, is absent (``at``: the time the message is read)."""

    type: MessagePath
    key: MessagePath
    at: MessagePath | None = None
    data: MessagePath | None = None
    id: MessagePath | None = None

    def paths(self) -> dict[str, str]:
        """Event field -> path, for the fields mapped."""
        return {f: p for f in EVENT_FIELDS if (p := getattr(self, f)) is not None}


# CloudEvents 1.0 in structured mode (the whole event is the message's JSON):
# `subject` is the key (e.g. the parcel), `time` the event's time.
PRESETS: dict[str, dict[str, str]] = {
    "cloudevents": {"type": "type", "key": "subject", "at": "time", "data": "data", "id": "id"},
}


def _map(value: Any) -> Any:
    if isinstance(value, str) and value in PRESETS:
        return PRESETS[value]
    if value is None or isinstance(value, dict | EventMap):
        return value
    raise ValueError(
        f"{shorten(value)} is not a preset ({', '.join(PRESETS)}); or write a mapping"
        " of event fields to paths, e.g. {type: kind, key: order.id}"
    )


class SourceBase(FileModel):
    """What every source has."""

    name: str = Field(pattern=NAME_PATTERN)
    # Messages per transaction (and, for RabbitMQ, the prefetch).
    batch: int = Field(default=100, ge=1, le=10_000)
    map: Annotated[EventMap | None, BeforeValidator(_map)] = None


def _named(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: Any) -> Any:
        if isinstance(value, str) and not pattern.fullmatch(value):
            raise ValueError(f"{shorten(value)} is not {what}")
        return value

    return BeforeValidator(check)


class AmqpSource(SourceBase):
    """A RabbitMQ queue (declared durable if missing); set-aside messages go to the
    queue ``<queue>.dead`` (declared durable)."""

    type: Literal["amqp"]
    url: Annotated[SecretStr, broker_url(("amqp", "amqps"), amqp_parse)] = SecretStr(
        "amqp://guest:guest@127.0.0.1:5672/"
    )
    queue: Annotated[str, _named(_QUEUE, "a queue name (letters, digits, _ . : / -, at most 250)")]

    @field_validator("queue")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.startswith("amq."):
            raise ValueError("names starting with 'amq.' are the broker's own")
        return v

    @property
    def dead(self) -> str:
        return f"{self.queue}.dead"


ConsumerName = Annotated[str, _named(_GROUP, "a consumer name (letters, digits, _ . : -)")]


class RedisSource(SourceBase):
    """A Redis stream read by a consumer group; set-aside entries go to ``<stream>.dead``."""

    type: Literal["redis"]
    url: Annotated[SecretStr, broker_url(("redis", "rediss", "unix"), redis_parse)] = SecretStr(
        "redis://127.0.0.1:6379/0"
    )
    stream: Annotated[
        str, _named(_STREAM_KEY, "a stream key (letters, digits, _ . : / { } -, at most 250)")
    ]
    group: Annotated[str, _named(_GROUP, "a group name (letters, digits, _ . : -)")] = "slawatch"
    # Default: one per process (host name and process id), see events/sources/redis.py.
    consumer: ConsumerName | None = None
    # The entry's field that holds the message's JSON.
    field: Annotated[str, _named(_GROUP, "a field name (letters, digits, _ . : -)")] = "event"
    # Entries another consumer (a process that died) left unacknowledged this long are
    # taken over.
    reclaim_after: Reclaim = timedelta(minutes=1)

    @property
    def dead(self) -> str:
        return f"{self.stream}.dead"


def _subject(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    tokens = value.split(".")
    ok = 1 <= len(tokens) <= 16 and all(
        _NATS_TOKEN.fullmatch(t) or t == "*" or (t == ">" and i == len(tokens) - 1)
        for i, t in enumerate(tokens)
    )
    if not ok:
        raise ValueError(
            f"{shorten(value)} is not a subject (tokens of letters, digits, _ : / - joined by"
            " dots; * for one token, > last for the rest)"
        )
    return value


Subject = Annotated[str, BeforeValidator(_subject)]


def _wild(subject: str) -> bool:
    return any(t in ("*", ">") for t in subject.split("."))


class NatsSource(SourceBase):
    """A NATS JetStream durable pull consumer on ``stream``, filtered to ``subject``;
    set-aside messages are published to ``dead_subject`` (default ``<subject>.dead``)."""

    type: Literal["nats"]
    url: Annotated[SecretStr, broker_url(("nats", "tls", "ws", "wss"))] = SecretStr(
        "nats://127.0.0.1:4222"
    )
    stream: Annotated[str, _named(_NATS_NAME, "a stream name (letters, digits, _ -)")]
    subject: Subject
    durable: Annotated[str, _named(_NATS_NAME, "a consumer name (letters, digits, _ -)")] = (
        "slawatch"
    )
    dead_subject: Subject | None = None

    @model_validator(mode="after")
    def _dead(self) -> NatsSource:
        if self.dead_subject is None:
            if _wild(self.subject):
                raise ValueError(
                    "dead_subject: is required when subject has wildcards (a subject outside"
                    " it, where set-aside messages go)"
                )
        elif _wild(self.dead_subject):
            raise ValueError("dead_subject: must not have wildcards")
        elif _matches(self.subject, self.dead_subject):
            raise ValueError(
                f"dead_subject: {self.dead_subject} is within subject {self.subject}:"
                " set-aside messages would be read again"
            )
        return self

    @property
    def dead(self) -> str:
        return self.dead_subject or f"{self.subject}.dead"


def _matches(pattern: str, subject: str) -> bool:
    """Whether NATS subject ``pattern`` (wildcards allowed) takes ``subject``."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


_KAFKA_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
# Kafka refuses the topics "." and ".." (InvalidTopicException), as any longer than 249.
_KAFKA_TOPIC = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]{1,249}")
# Kafka's session timeouts: a consumer silent this long leaves the group.
KAFKA_MIN_SESSION = timedelta(seconds=6)
Session = Annotated[
    timedelta,
    duration_validator(positive=True, limit=timedelta(minutes=30), limit_text="30 minutes"),
]


class KafkaSource(SourceBase):
    """A Kafka topic read by a consumer group; offsets are committed once the batch is
    stored; set-aside messages are produced to ``dead_topic`` (default ``<topic>.dead``)."""

    type: Literal["kafka"]
    url: KafkaUrl = SecretStr("kafka://127.0.0.1:9092")
    sasl_mechanism: SaslMechanism = "PLAIN"
    topic: Annotated[
        str, _named(_KAFKA_TOPIC, "a topic name (letters, digits, . _ -; not . or ..)")
    ]
    group: Annotated[str, _named(_KAFKA_NAME, "a group name (letters, digits, . _ -)")] = "slawatch"
    dead_topic: Annotated[
        str | None, _named(_KAFKA_TOPIC, "a topic name (letters, digits, . _ -; not . or ..)")
    ] = None
    # A member of the group not heard from this long (a process that died) loses its
    # partitions to the others.
    session_timeout: Session = timedelta(seconds=45)

    @field_validator("session_timeout")
    @classmethod
    def _broker_minimum(cls, value: timedelta) -> timedelta:
        # Below the brokers' default group.min.session.timeout.ms the consumer could
        # never join its group (INVALID_SESSION_TIMEOUT at run time, not at check).
        if value < KAFKA_MIN_SESSION:
            raise ValueError(
                f"{value.total_seconds():g}s is shorter than"
                f" {KAFKA_MIN_SESSION.total_seconds():g}s, the least Kafka brokers accept by"
                " default (group.min.session.timeout.ms)"
            )
        return value

    @model_validator(mode="after")
    def _apart(self) -> KafkaSource:
        if self.dead == self.topic:
            raise ValueError("dead_topic: must not be the topic itself")
        if len(self.dead) > 249:
            raise ValueError(
                f"dead_topic: the default {shorten(self.dead)} is longer than 249 characters,"
                " the most Kafka accepts: set dead_topic"
            )
        return self

    @property
    def dead(self) -> str:
        return self.dead_topic or f"{self.topic}.dead"


SourceConfig = AmqpSource | RedisSource | NatsSource | KafkaSource
BY_TYPE: dict[str, type[FileModel]] = {
    "amqp": AmqpSource,
    "redis": RedisSource,
    "nats": NatsSource,
    "kafka": KafkaSource,
}


def load_sources(directory: Path, *, required: bool = False) -> list[SourceConfig]:
    """Load ``directory/*.yaml``. A missing folder means no sources, unless ``required``
    (it was named by ``--sources`` or ``SLAWATCH_SOURCES_DIR``): then it is an error."""
    if not directory.exists() and not required:
        return []
    configs = load_dir(directory, _model_for, "sources", prepare=interpolate)
    return cast(list[SourceConfig], configs)


def check_sources(sources: list[SourceConfig], rules: list[Rule]) -> None:
    """Refuse sources when no rule takes events: every message would be set aside."""
    if sources and not any(r.events is not None for r in rules):
        raise ConfigError(
            f"{sources[0].source}: no rule has events:, so every message of this source"
            " would be set aside (add an event rule, or remove the source)"
        )


def _model_for(data: dict[str, Any], path: Path) -> type[FileModel]:
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in BY_TYPE:
        known = ", ".join(BY_TYPE)
        got = "is required" if kind is None else f"{shorten(kind)} is not a source type"
        raise ConfigError(f"{path}: type: {got} (one of {known})")
    require_extra(kind, path)
    return BY_TYPE[kind]
