"""One way in for events: a batch is checked here, then written in one transaction.

HTTP (``POST /v1/events``), the brokers (sources.py) and ``slawatch event`` all end
in :func:`ingest`. A batch is all or nothing: :func:`parse_events` refuses it whole,
naming the index and field of the first bad event, before anything is written; the
database writes it through ``slawatch.events`` (engine/timers.py) in one statement
and one transaction, so a crash or an outage leaves none of it or all of it. That
function takes its row locks in one order, so batches over the same keys wait for
each other; a deadlock with another writer (the application's own transactions
calling ``slawatch.event()``) or a serialization failure undoes the batch, and
:func:`ingest` tries it again a few times before it answers.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from slawatch.config.durations import format_duration
from slawatch.config.files import shorten
from slawatch.config.rules import EVENT_TYPE
from slawatch.db import Connection, Database, sqlstate, translate
from slawatch.engine.outbox import MAX_DATA as MAX_DATA  # bytes of an event's data, as JSON
from slawatch.engine.timers import FUTURE, KEY_MAX
from slawatch.errors import BadInput, ConfigError, DatabaseError

log = logging.getLogger(__name__)
# Objects and lists nested in an event's data, data itself the first: the 254 orjson
# writes at most, less the two levels write() puts it in (tests/integration/
# test_events_http.py pins it).
MAX_DEPTH = 252

MAX_BATCH = 10_000  # events in one request or call
MAX_ID = 200  # characters of an event id
FIELDS = ("type", "key", "at", "data", "id")
TRIES = 4  # attempts of a batch that hit a deadlock or a serialization failure
PAUSE = 0.05  # seconds before the second attempt, doubled each time, jittered
_RETRY_STATES = {"40P01": "deadlock", "40001": "serialization failure"}
# C0, DEL and C1: in a key they would reach terminals and log lines (ESC, OSC, BEL
# sequences, a CR LF that forges a line).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Event:
    """One event, checked: ``at`` is aware (None: the time it is received)."""

    type: str
    key: str
    at: datetime | None = None
    data: dict[str, Any] | None = None
    id: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "key": self.key}
        if self.at is not None:
            out["at"] = self.at.isoformat()
        if self.data is not None:
            out["data"] = self.data
        if self.id is not None:
            out["id"] = self.id
        return out


class EventError(BadInput):
    """An event of a batch is malformed: ``index`` (0-based) and ``field`` say where."""

    def __init__(self, index: int | None, field: str | None, message: str) -> None:
        where = ".".join(p for p in (f"events[{index}]" if index is not None else None, field) if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.index, self.field, self.reason = index, field, message


@dataclass
class Ingested:
    """What one :func:`ingest` stored: events accepted, repeats dropped, events of types
    the database knows no rule for kept in ``slawatch.event_held``, by type."""

    accepted: int = 0
    duplicates: int = 0
    by_type: Counter[tuple[str, str]] = field(default_factory=Counter)  # (type, outcome)
    held: int = 0


def parse_time(value: Any) -> datetime:
    """An ISO 8601 time with a zone (``Z`` or ``+02:00``)."""
    problem = f"{shorten(value)} is not a time: write ISO 8601, e.g. 2026-11-25T10:00:00Z"
    if not isinstance(value, str):
        raise ValueError(problem)
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(problem) from None
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{shorten(value)} has no time zone: add Z or an offset like +01:00")
    return t


def control_character(text: str, what: str = "keys and types") -> str | None:
    """Why ``text`` is refused for a control character in it (None: it has none):
    ``what`` names the values that must be printable text."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    return (
        f"contains a control character (U+{ord(found.group()):04X} at {found.start()});"
        f" {what} are printable text"
    )


def id_problem(ident: str) -> str | None:
    """Why ``ident`` is refused as an event's id (or a ping's run id); None: it is not."""
    if not 1 <= len(ident) <= MAX_ID:
        return f"must be 1 to {MAX_ID} characters, not {len(ident):,}"
    return control_character(ident, "ids")


def parse_event(
    raw: Any,
    index: int | None,
    known: Iterable[str],
    now: datetime,
    retention: timedelta,
    unmigrated: Collection[str] = (),
) -> Event:
    """One event from its JSON form, or EventError naming the field. ``unmigrated``:
    types of rules in the rule files that do not run until a migrate (said so)."""

    def bad(name: str | None, message: str) -> EventError:
        return EventError(index, name, message)

    if not isinstance(raw, dict):
        raise bad(None, f"an event is a JSON object, not {type(raw).__name__}")
    extra = [k for k in raw if k not in FIELDS]
    if extra:
        name = str(extra[0])
        name = name if len(name) <= 40 else name[:39] + "…"
        raise bad(name, f"unknown field (known: {', '.join(FIELDS)})")
    kind = raw.get("type")
    if kind is None:
        raise bad("type", "is required")
    if isinstance(kind, str) and (control := control_character(kind)):
        raise bad("type", control)
    if not isinstance(kind, str) or not EVENT_TYPE.fullmatch(kind):
        raise bad("type", f"{shorten(kind)} is not an event type")
    known = known if isinstance(known, set | frozenset) else set(known)
    if kind not in known:
        if kind in unmigrated:
            raise bad(
                "type",
                f"{kind!r}: no running rule uses this type; its rule is in the rule files but"
                " not migrated: run 'slawatch migrate' (then reload)",
            )
        have = ", ".join(sorted(known)[:20]) or "none: no rule has events:"
        raise bad("type", f"{kind!r}: no rule uses this type (rules use: {have})")
    key = raw.get("key")
    if key is None:
        raise bad("key", "is required")
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise bad("key", f"{shorten(key)}: a key is text (or a whole number)")
    key = str(key)
    if not 1 <= len(key) <= KEY_MAX:
        raise bad("key", f"must be 1 to {KEY_MAX} characters, not {len(key):,}")
    if control := control_character(key):
        raise bad("key", control)
    at = None
    if raw.get("at") is not None:
        try:
            at = parse_time(raw["at"])
        except ValueError as exc:
            raise bad("at", str(exc)) from None
        if at > now + FUTURE:
            raise bad("at", f"{raw['at']} is more than 5 minutes in the future")
        if at < now - retention:
            raise bad(
                "at", f"{raw['at']} is older than the retention ({format_duration(retention)})"
            )
    data = raw.get("data")
    if data is not None:
        if not isinstance(data, dict):
            raise bad("data", f"must be a JSON object, not {type(data).__name__}")
        try:
            # As deep as write() puts it, [{..., "data": data}]: what passes here is stored.
            encoded = orjson.dumps([[data]])
        except (TypeError, orjson.JSONEncodeError) as exc:
            if "Recursion limit" in str(exc):  # orjson writes 254 levels at most
                raise bad(
                    "data", f"nested too deep: at most {MAX_DEPTH} levels of objects and lists"
                ) from None
            raise bad("data", f"not JSON: {exc}") from None
        size = len(encoded) - 4  # the two lists' brackets
        if size > MAX_DATA:
            raise bad("data", f"{size:,} bytes as JSON, more than {MAX_DATA:,}")
        if b"\\u0000" in encoded:
            raise bad("data", "must not contain NUL characters (PostgreSQL's jsonb cannot)")
    ident = raw.get("id")
    if ident is not None:
        if isinstance(ident, bool) or not isinstance(ident, str | int):
            raise bad("id", f"{shorten(ident)}: an id is text (or a whole number)")
        ident = str(ident)
        if problem := id_problem(ident):
            raise bad("id", problem)
    return Event(kind, key, at, data, ident)


def parse_events(
    payload: Any,
    known: Iterable[str],
    now: datetime,
    retention: timedelta,
    unmigrated: Collection[str] = (),
) -> list[Event]:
    """One event, or ``{"events": [...]}`` (1 to :data:`MAX_BATCH`): all checked, or
    EventError for the first bad one."""
    known = set(known)
    if isinstance(payload, dict) and "events" in payload and "type" not in payload:
        if set(payload) != {"events"}:
            raise EventError(None, None, 'a batch is {"events": [...]} and nothing else')
        items = payload["events"]
        if not isinstance(items, list):
            raise EventError(None, "events", "must be a list of events")
        if not 1 <= len(items) <= MAX_BATCH:
            raise EventError(
                None, "events", f"holds {len(items):,} events; a batch is 1 to {MAX_BATCH:,}"
            )
        types = set(known)  # once, not per event
        return [
            parse_event(raw, i, types, now, retention, unmigrated) for i, raw in enumerate(items)
        ]
    return [parse_event(payload, None, known, now, retention, unmigrated)]


_INGEST = "SELECT type, outcome, events FROM slawatch.events(%s::jsonb, %s)"


def write(conn: Connection, events: list[Event], now: datetime) -> Ingested:
    """Write ``events`` in the current transaction of ``conn`` (the caller commits)."""
    batch = orjson.dumps([e.as_json() for e in events]).decode()
    with translate("storing events"):
        rows = conn.execute(_INGEST, (batch, now)).fetchall()
    got = Ingested()
    for kind, outcome, count in rows:
        got.by_type[(kind, outcome)] += int(count)
        if outcome == "accepted":
            got.accepted += int(count)
        elif outcome == "duplicate":
            got.duplicates += int(count)
        elif outcome == "held":
            got.held += int(count)
        else:
            # A function of an earlier release: the database is behind (HTTP 503).
            raise ConfigError(
                f"type {kind!r}: the database's slawatch.event() has no rule for it;"
                " run 'slawatch migrate' with these rules"
            )
    return got


def ingest(db: Database, events: list[Event], now: datetime) -> Ingested:
    """Write ``events`` in one transaction; nothing of it is stored when it fails. A
    deadlock or a serialization failure is tried again (:data:`TRIES` in all, after a
    short jittered pause); one that persists is logged and raised."""
    if not events:
        return Ingested()

    def work(conn: Connection) -> Ingested:
        with conn.transaction():  # a function of an earlier release may undo the batch
            return write(conn, events, now)

    for attempt in range(1, TRIES + 1):
        try:
            return db.run("storing events", work)
        except DatabaseError as exc:
            state = sqlstate(exc)
            if state not in _RETRY_STATES:
                raise
            if attempt == TRIES:
                log.warning(
                    "storing %d events: %s %d times in a row, the batch is refused: %s",
                    len(events),
                    _RETRY_STATES[state],
                    TRIES,
                    exc,
                    extra={"events": len(events), "sqlstate": state},
                )
                raise
            log.debug("storing events: %s, trying again: %s", _RETRY_STATES[state], exc)
            time.sleep(PAUSE * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")
