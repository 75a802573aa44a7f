"""What every event source shares: a message, the consumer interface each broker
implements, the recorder that counts, and reading a message into an event.

A consumer is used by one thread (its :class:`~slawatch.events.sources.runner.SourceRunner`)
and speaks for its broker: every broker or network error leaves it as a one-line
:class:`BrokerError` with the URL's secrets scrubbed.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import orjson

from slawatch.config.sources import EventMap, SourceConfig
from slawatch.errors import SlawatchError
from slawatch.events.ingest import Event, EventError, Ingested, parse_event

# Bytes of one message. An event's data is at most 64 KiB as JSON (ingest.MAX_DATA);
# a mapped message may carry more than the event, but not this much.
MAX_MESSAGE = 256 * 1024
REASON_MAX = 300  # characters of a set-aside reason (log line, broker header)


class BrokerError(SlawatchError):
    """The broker could not be reached or refused an operation (one line, no secrets)."""


class Unreadable(Exception):
    """A message that is no event: ``reason`` says why, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Message:
    """One message as read: ``body`` (None: there is none to read, ``problem`` says
    why), the broker's ``handle`` for acknowledging it, and a ``label`` for log lines."""

    body: bytes | None
    handle: Any
    label: str
    problem: str | None = None


class Recorder(Protocol):
    """Told what each source did (the metrics ``slawatch_events_total{type,source,outcome}``).

    Called from the source's thread; implementations must be thread-safe."""

    def ingested(self, source: str, got: Ingested) -> None:
        """A batch of ``source`` was committed: ``got.by_type`` counts (type, outcome)."""

    def set_aside(self, source: str, reason: str) -> None:
        """A message of ``source`` was set aside (dead-lettered) for ``reason``."""


class NoRecorder:
    """A :class:`Recorder` that keeps nothing."""

    def ingested(self, source: str, got: Ingested) -> None:
        pass

    def set_aside(self, source: str, reason: str) -> None:
        pass


class Consumer(abc.ABC):
    """One broker connection reading one queue or stream; not thread-safe (one thread).

    :meth:`connect` opens (or reopens) it; after any :class:`BrokerError` the caller
    calls :meth:`close` and, later, :meth:`connect` again. Messages fetched and not
    acknowledged (or set aside) before a close go back to the broker, which delivers
    them again (to this consumer or another).
    """

    kind = "broker"  # the broker's name, for log lines: RabbitMQ, Redis, NATS

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.name = config.name
        self._secrets = _url_secrets(config.url.get_secret_value())

    @abc.abstractmethod
    def connect(self) -> None:
        """Connect, declare what the source needs (the dead-letter place), subscribe."""

    @abc.abstractmethod
    def fetch(self, limit: int, wait: float) -> list[Message]:
        """Up to ``limit`` messages: what is there now, or what comes within ``wait``
        seconds (none: an empty list)."""

    @abc.abstractmethod
    def ack(self, messages: list[Message]) -> None:
        """Acknowledge ``messages``: they were committed; the broker forgets them."""

    @abc.abstractmethod
    def set_aside(self, message: Message, reason: str) -> None:
        """Put ``message`` in the dead-letter place with ``reason``, then acknowledge it."""

    @abc.abstractmethod
    def keepalive(self, messages: list[Message]) -> None:
        """While ``messages`` are held for a database that is away: keep the connection
        alive and the broker from giving them to another consumer, where it can."""

    @abc.abstractmethod
    def waiting(self) -> int:
        """Messages in the source not given to any consumer yet, as the broker counts
        them now (0 when it cannot tell): ``run --once`` drains until none."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection (never raises); unacknowledged messages go back."""

    def error(self, exc: BaseException, what: str) -> BrokerError:
        """``exc`` as a one-line BrokerError about ``what``, without the URL's secrets."""
        text = str(exc) or repr(exc)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return BrokerError(f"{self.kind} {what}: {type(exc).__name__}: {one_line(text)}")


def _url_secrets(url: str) -> list[str]:
    """The parts of a broker URL that must not be printed: the URL, its password."""
    secrets = [url]
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        secrets += [password, unquote(password)]
    return [s for s in secrets if len(s) >= 4]


def one_line(reason: str) -> str:
    """A reason fit for a log line and a broker header: one line, at most REASON_MAX."""
    text = " ".join(reason.split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 1] + "…"


_MISSING = object()


def _lookup(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


def read_event(
    body: bytes | None,
    mapping: EventMap | None,
    known: Iterable[str],
    now: datetime,
    retention: timedelta,
    unmigrated: Collection[str] = (),
) -> Event:
    """The event in a message's body (mapped by ``mapping`` when given), checked as
    ``POST /v1/events`` checks one; :class:`Unreadable` naming the problem otherwise.
    ``unmigrated``: the event types of rules in the files that wait for a migrate (their
    events are told so)."""
    if body is None:
        raise Unreadable("the message has no body")
    if len(body) > MAX_MESSAGE:
        raise Unreadable(f"{len(body):,} bytes, more than {MAX_MESSAGE:,}")
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Unreadable(f"not JSON: {exc}") from None
    paths = mapping.paths() if mapping is not None else {}
    if mapping is not None:
        if not isinstance(raw, dict):
            raise Unreadable(f"a message is a JSON object, not {type(raw).__name__}")
        found = {f: _lookup(raw, p) for f, p in paths.items()}
        raw = {f: v for f, v in found.items() if v is not _MISSING}
    try:
        return parse_event(raw, None, known, now, retention, unmigrated)
    except EventError as exc:
        if exc.field in paths:
            raise Unreadable(f"{exc.field} (from {paths[exc.field]}): {exc.reason}") from None
        raise Unreadable(str(exc)) from None
