"""Running one source: read a batch, store it in one transaction, then acknowledge it.

The order is what makes a broker source lose nothing: a message is acknowledged only
after the transaction that stored its event committed. A crash or a lost connection
in between means the broker delivers it again; the repeat is dropped when the event
has an ``id`` (``slawatch.event_seen``), and is harmless otherwise (a second start
while open keeps the first, a stop or beat at the same ``at`` changes nothing).

A message that is no event (not JSON, a bad field, a type no rule uses, too big) is
set aside at once -- the broker's dead-letter place, then acknowledged -- with one
log line and a count, and the rest of its batch is stored: it never blocks the stream.

The database away: the batch in hand is held, unacknowledged, and stored again with
a capped backoff until the database is back; nothing more is read meanwhile. Every
few seconds the consumer's ``keepalive`` keeps the broker connection alive and the
held messages from going to another consumer. The broker away: one line when it
goes, one when it is back, reconnecting with backoff. Anything unexpected (a bug)
is logged with its traceback and the consumer starts again after a backoff: the
thread never ends before :meth:`SourceRunner.stop`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from slawatch.clock import Clock
from slawatch.db import Database, DatabaseUnavailable
from slawatch.errors import SlawatchError
from slawatch.events.ingest import Event, Ingested, ingest
from slawatch.events.sources.base import (
    BrokerError,
    Consumer,
    Message,
    NoRecorder,
    Recorder,
    Unreadable,
    one_line,
    read_event,
)
from slawatch.outage import Backoff, Outage

log = logging.getLogger(__name__)

POLL = 1.0  # seconds a fetch waits for a first message (how soon stop() is noticed)
KEEPALIVE = 5.0  # seconds between keepalives while a batch is held
BACKOFF_CAP = 30.0  # seconds: the longest wait before reconnecting or storing again
ONCE_WAIT = 0.25  # run --once: a fetch waits this long for nothing, then the broker's count
ONCE_LIMIT = 60.0  # run --once: seconds at most per source (producers may never pause)


@dataclass
class Drained:
    """What a source stored and set aside (``run --once``: its one drain)."""

    accepted: int = 0
    duplicates: int = 0
    set_aside: int = 0

    def __iadd__(self, other: Drained) -> Drained:
        self.accepted += other.accepted
        self.duplicates += other.duplicates
        self.set_aside += other.set_aside
        return self


class _Stopped(Exception):
    """stop() came while a batch was held: it is left unacknowledged for redelivery."""


class SourceRunner:
    """One source's consumer thread (:meth:`start`/:meth:`stop`), or one drain of it
    (:meth:`drain`, for ``run --once``).

    ``known()``: the event types the running rules use (read per batch, so a reload
    shows); ``retention``: older events are refused, as over HTTP.
    """

    def __init__(
        self,
        consumer: Consumer,
        db: Database,
        clock: Clock,
        known: Callable[[], Iterable[str]],
        retention: timedelta,
        recorder: Recorder | None = None,
        *,
        backoff_cap: float = BACKOFF_CAP,
        poll: float = POLL,
        unmigrated: Callable[[], Collection[str]] = lambda: (),
    ) -> None:
        self.consumer, self.db, self.clock = consumer, db, clock
        self.unmigrated = unmigrated  # event types whose rules wait for a migrate
        self.config = consumer.config
        self.name = consumer.name
        self.known, self.retention = known, retention
        self.recorder: Recorder = recorder or NoRecorder()
        self.backoff_cap, self.poll = backoff_cap, poll
        where = f"source {self.name}"
        self.broker = Outage(
            f"{where}: {consumer.kind}", log, down="unreachable", up="reachable again"
        )
        self.storing = Outage(f"{where}: storing events", log)
        self.trouble = Outage(where, log)
        self.held = 0  # messages held now, waiting for the database
        self.holds = 0  # attempts to store a held batch that failed, so far
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = 0.0

    # ---------------------------------------------------------------- the thread

    def start(self) -> None:
        """Consume in a thread of its own until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._supervise, name=f"source-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in hand (a held one is left to the broker); wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def alive(self) -> bool:
        """Whether the consumer thread runs (it ends only at :meth:`stop`)."""
        return self._thread is not None and self._thread.is_alive()

    def _supervise(self) -> None:
        backoff = Backoff(cap=self.backoff_cap)
        while not self._stop.is_set():
            self._since = time.monotonic()
            try:
                self._consume(backoff)
            except _Stopped:
                pass
            except BrokerError as exc:
                self.broker.failed(str(exc), self._since)
            except Exception as exc:  # a bug: log it whole, start again after a pause
                reason = f"unexpected {type(exc).__name__}: {exc}"
                self.trouble.failed(reason, self._since, exc_info=exc)
            finally:
                self.consumer.close()
            self._stop.wait(backoff.next())

    def _consume(self, backoff: Backoff) -> None:
        self.consumer.connect()
        self.broker.ok()
        while not self._stop.is_set():
            # When this attempt began: its failure is a new outage (Outage.failed).
            self._since = time.monotonic()
            messages = self.consumer.fetch(self.config.batch, self.poll)
            backoff.reset()
            if messages:
                self._handle(messages, hold=True)
                self.trouble.ok()

    # ---------------------------------------------------------------- run --once

    def drain(self, limit: float = ONCE_LIMIT, wait: float = ONCE_WAIT) -> Drained:
        """Store what is waiting in the source now, then close (``run --once``).

        Stops when a fetch waited ``wait`` seconds for nothing and the broker counts
        nothing waiting, or after ``limit`` seconds. A broker or database error is
        raised (the batch in hand is not acknowledged: the broker keeps it).
        """
        total = Drained()
        end = time.monotonic() + limit
        try:
            self.consumer.connect()
            while time.monotonic() < end:
                messages = self.consumer.fetch(self.config.batch, wait)
                if messages:
                    total += self._handle(messages, hold=False)
                elif not self.consumer.waiting():
                    break
        finally:
            self.consumer.close()
        return total

    # ---------------------------------------------------------------- one batch

    def _handle(self, messages: list[Message], hold: bool) -> Drained:
        """Set aside what is no event; store the rest in one transaction; acknowledge."""
        now = self.clock.now()
        known, unmigrated = set(self.known()), self.unmigrated()  # once a batch
        done = Drained()
        good: list[tuple[Message, Event]] = []
        for message in messages:
            try:
                if message.problem is not None:
                    raise Unreadable(message.problem)
                event = read_event(
                    message.body, self.config.map, known, now, self.retention, unmigrated
                )
            except Unreadable as exc:
                self._set_aside(message, exc.reason)
                done.set_aside += 1
                continue
            except Exception as exc:  # a bug reading this message: it must not block the rest
                reason = f"unexpected {type(exc).__name__}: {exc}"
                self._set_aside(message, reason, exc_info=exc)
                done.set_aside += 1
                continue
            good.append((message, event))
        if good:
            held = [m for m, _ in good]
            got = self._store([e for _, e in good], now, held, hold)
            self.consumer.ack(held)
            done.accepted, done.duplicates = got.accepted, got.duplicates
            self.recorder.ingested(self.name, got)
        return done

    def _set_aside(
        self, message: Message, reason: str, exc_info: BaseException | None = None
    ) -> None:
        reason = one_line(reason)
        self.consumer.set_aside(message, reason)
        log.warning(
            "source %s: set aside %s: %s",
            self.name,
            message.label,
            reason,
            exc_info=exc_info,
            extra={"source": self.name, "entry": message.label, "reason": reason},
        )
        self.recorder.set_aside(self.name, reason)

    def _store(
        self, events: list[Event], now: datetime, held: list[Message], hold: bool
    ) -> Ingested:
        """``ingest`` the batch; while the database is away (``hold``), try again with a
        capped backoff, keeping ``held`` alive at the broker. Raises _Stopped on stop()."""
        backoff = Backoff(cap=self.backoff_cap)
        self.held = len(held)
        try:
            while True:
                since = time.monotonic()
                try:
                    got = ingest(self.db, events, now)  # tries a deadlock again itself
                except DatabaseUnavailable:
                    if not hold:
                        raise
                    # The database's own outage line says it.
                except SlawatchError as exc:
                    if not hold:
                        raise
                    # Not the network: a schema that is not migrated, a permission, a
                    # full disk. The batch waits for the fix, one line says why.
                    self.storing.failed(str(exc), since)
                else:
                    self.storing.ok()
                    return got
                self.holds += 1
                if self._pause(backoff.next(), held):
                    raise _Stopped
        finally:
            self.held = 0

    def _pause(self, seconds: float, held: list[Message]) -> bool:
        """Wait ``seconds``, keeping ``held`` alive; True when stop() came."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._stop.wait(min(left, KEEPALIVE)):
                return True
            self.consumer.keepalive(held)
        return False
