"""Acknowledgements and silences: what an operator does about an incident that is known.

**Ack.** An ack names one alert and stops the re-notifications of that alert's
episode (docs/explanation/episodes.md); a later episode of the same row pages again from #1. The
ack is a row in ``slawatch.ack`` (rule, key, episode); the claim reads it when the
episode's next re-notification comes due and clears that row's next-notification
time instead of notifying, so the row leaves the re-notify index. Acking writes
nothing on the watched table: it needs no rule definition, never waits behind the
application's row locks, and no claim can undo it (the claim only ever reads
acks). A claim that had already started when the ack committed may still write
the one re-notification it had picked.

What the episode's notifications still owe is settled, not sent: in the ack's own
transaction its pending deliveries (due, or waiting to retry while a receiver is
down) become ``acknowledged`` (``settle_acked``); one in flight is left to its
sender, and should it fail, the delivery claim settles it when it is due again, as
it does one written by that racing claim or replayed later (``claim_deliveries``).
Deliveries a receiver accepted are history; the episode's resolved notice still
goes out.

**Silence.** A silence (rule, optional key, optional matchers, until) suppresses
*delivery*: alerts are still claimed and recorded, and a delivery whose alert
matches a silence active when it is due to be sent is settled as ``silenced``
and never sent (``claim_deliveries``). Matchers are a JSON object of alert row
fields that must be equal, applied as jsonb containment (``row_data @>
matchers``): input from the command line or HTTP is only ever a parameter.
Silences expire at ``until`` by the application's clock; deleting one ends it.

Every function takes the application's time ``now`` (an aware datetime); none
reads a clock itself.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from slawatch.config.durations import parse_duration
from slawatch.config.files import is_ident, shorten
from slawatch.config.rules import Rule
from slawatch.db import Connection, Database, translate
from slawatch.engine.outbox import alert_id
from slawatch.engine.queries import queries
from slawatch.errors import BadInput, NotFound

# An alert's idempotency id: rule:key:eE:nN, or rule:key:eE:resolved. The rule name
# has no ':', and the tail has a fixed form, so a key holding ':' reads back whole.
_ALERT_NAME = re.compile(
    r"(?P<rule>[a-z][a-z0-9_]{0,39}):(?P<key>.*):e(?P<episode>[0-9]+):"
    r"(?:n(?P<n>[0-9]+)|(?P<resolved>resolved))",
    re.DOTALL,
)
MAX_NAME = 2000  # characters in an alert's name (a composite key's text is long)
MAX_TEXT = 2000  # characters in a comment, a key, a matched string
MAX_WHO = 200  # characters in an author's name
MAX_MATCHERS = 32
MAX_SILENCE = timedelta(days=365)
_INT4 = 2**31 - 1
INT8 = 2**63 - 1  # the largest bigint: ids beyond it cannot exist


AckState = Literal["acknowledged", "already acknowledged", "ended"]


@dataclass(frozen=True)
class Ack:
    """The answer to an ack. ``state``: ``acknowledged`` (recorded now), ``already
    acknowledged`` (the first ack of the episode is kept and returned), or ``ended``
    (the episode is over: nothing was recorded; ``current`` names the latest alert of
    the row's later episode, if one started)."""

    alert: str  # the idempotency id of the alert named
    alert_id: int
    rule: str
    key: str
    episode: int
    state: AckState
    acked_at: datetime | None = None
    acked_by: str | None = None
    comment: str | None = None
    current: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["acked_at"] = _iso(self.acked_at)
        return out

    def message(self) -> str:
        """One line for a person."""
        episode = f"episode {self.episode} of {self.rule}:{self.key}"
        if self.state == "acknowledged":
            return (
                f"acknowledged {episode} (alert {self.alert}, id {self.alert_id}) as "
                f"{self.acked_by}: it is not notified again (what was not sent yet is "
                "settled); a new episode pages again"
            )
        if self.state == "already acknowledged":
            return f"{episode} was already acknowledged by {self.acked_by} at {_iso(self.acked_at)}"
        later = f"; the row is overdue again: ack {self.current}" if self.current else ""
        return f"{episode} has ended: nothing to acknowledge{later}"


@dataclass(frozen=True)
class Silence:
    """A silence as stored; ``active`` at the ``now`` it was read with."""

    id: int
    rule: str
    key: str | None
    matchers: dict[str, Any]
    starts_at: datetime
    ends_at: datetime
    created_at: datetime
    author: str
    comment: str
    active: bool

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("starts_at", "ends_at", "created_at"):
            out[k] = _iso(getattr(self, k))
        return out


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------- checking input


def _aware(name: str, value: object) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise BadInput(f"{name}: {shorten(value)} is not a time with a zone")
    return value


def _text(name: str, value: object, limit: int, *, required: bool = False) -> str:
    """A string a person typed: bounded, without NUL (PostgreSQL text cannot hold it)."""
    if not isinstance(value, str):
        raise BadInput(f"{name}: {shorten(value)} is not a string")
    if "\x00" in value:
        raise BadInput(f"{name}: must not contain a NUL character")
    if len(value) > limit:
        raise BadInput(f"{name}: {shorten(value)} is longer than {limit:,} characters")
    if required and not value.strip():
        raise BadInput(f"{name}: must not be empty")
    return value


AlertName = int | tuple[str, str, int, int]


def parse_alert(text: object) -> AlertName:
    """An alert's numeric row id, or its idempotency id as (rule, key, episode, n)
    (n = 0 names an episode's resolved notice). BadInput when it is neither. A negative
    id names an alert kept in the outbox's rows (queries.sql, alert_by_id;
    docs/explanation/outbox-rows.md)."""
    text = _text("alert", text, MAX_NAME, required=True).strip()
    digits = text[1:] if text.startswith("-") else text
    if digits.isascii() and digits.isdigit():
        value = int(text)
        if value == 0 or not -INT8 <= value <= INT8:
            raise NotFound(f"no alert with id {text}")
        return value
    m = _ALERT_NAME.fullmatch(text)
    if m is None:
        raise BadInput(
            f"alert: {shorten(text)} is neither an alert id (a number) nor an idempotency "
            "id like order_unshipped:42:e1:n3"
        )
    episode, n = int(m["episode"]), 0 if m["resolved"] else int(m["n"])
    if episode > _INT4 or n > _INT4:
        raise NotFound(f"no alert {text}")
    return m["rule"], m["key"], episode, n


def parse_until(text: str, now: datetime, field: str = "--until") -> datetime:
    """An ISO 8601 time (no zone: UTC) or a duration from ``now`` (``2h``); errors name
    ``field``: the command line's ``--until``, the API's ``until``."""
    text = _text(field, text, 100, required=True).strip()
    try:
        return now + parse_duration(text)
    except ValueError as exc:
        not_a_duration = str(exc)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        if re.fullmatch(r"[0-9 ]+[smhdw].*|P.*", text):  # meant as a duration: say why not
            raise BadInput(f"{field}: {not_a_duration}") from None
        raise BadInput(
            f"{field}: {shorten(text)} is neither a time (2026-03-01T14:00Z) nor a duration"
            " (2h, 30m, 1d)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def parse_matchers(pairs: list[str]) -> dict[str, Any]:
    """``--match FIELD=VALUE`` pairs as matchers. A VALUE that reads as a JSON number,
    ``true``/``false``/``null`` or a quoted string is that; anything else is a string
    (``user_id=42`` is the number 42, ``status=paid`` and ``code='"42"'`` strings)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        field, sep, raw = pair.partition("=")
        if not sep:
            raise BadInput(f"--match: {shorten(pair)} is not FIELD=VALUE")
        if field in out:
            raise BadInput(f"--match: {shorten(field)} is given twice")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, dict | list):
            value = raw
        out[field] = value
    return out


def _matchers(value: object, rule: Rule) -> dict[str, Any]:
    """Matchers as stored: alert fields (column names) equal to JSON scalars."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadInput(f"matchers: {shorten(value)} is not an object of field: value")
    if len(value) > MAX_MATCHERS:
        raise BadInput(f"matchers: more than {MAX_MATCHERS} fields")
    # Without `columns` or `key` the alert's fields are the primary key (read from the
    # catalog) and the deadline: not known here, so only their form is checked.
    known = rule.alert_columns(list(rule.key or ())) if rule.columns or rule.key else None
    out: dict[str, Any] = {}
    for field, v in value.items():
        if not isinstance(field, str) or not is_ident(field):
            raise BadInput(f"matchers: {shorten(field)} is not a field name (a column name)")
        if known is not None and field not in known:
            raise BadInput(
                f"matchers: the alerts of rule {rule.name} have no field {field!r}"
                f" (they have: {', '.join(known)})"
            )
        if isinstance(v, str):
            _text(f"matchers.{field}", v, MAX_TEXT)
        elif isinstance(v, float) and not math.isfinite(v):
            raise BadInput(f"matchers.{field}: {v} is not a JSON number")
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**30:
            raise BadInput(f"matchers.{field}: {shorten(v)} is out of range")
        elif v is not None and not isinstance(v, str | int | float | bool):
            raise BadInput(
                f"matchers.{field}: {shorten(v)} is not a string, number, boolean or null"
            )
        out[field] = v
    return out


# ---------------------------------------------------------------- ack


def _find_alert(conn: Connection, name: AlertName, text: str) -> dict[str, Any]:
    q = queries()
    cur = conn.cursor(row_factory=dict_row)
    if isinstance(name, int):
        row = cur.execute(q["alert_by_id"], {"id": name}).fetchone()
    else:
        rule, key, episode, n = name
        params = {"rule": rule, "key": key, "episode": episode, "n": n}
        row = cur.execute(q["alert_by_name"], params).fetchone()
    if row is None:
        raise NotFound(f"no alert {text.strip()}")
    return row


def ack(db: Database, alert: str, *, by: str, comment: str, now: datetime) -> Ack:
    """Acknowledge the episode of ``alert`` (a numeric id or an idempotency id): it is not
    notified again. NotFound for an unknown alert, BadInput for a malformed name."""
    name = parse_alert(alert)
    by = _text("by", by, MAX_WHO, required=True)
    comment = _text("comment", comment, MAX_TEXT)
    now = _aware("now", now)
    q = queries()

    def work(conn: Connection) -> Ack:
        with conn.transaction():
            row = _find_alert(conn, name, alert)
            if row["kind"] == "summary":  # it stands for many episodes (slawatch/delivery/storm.py)
                raise BadInput(
                    f"alert {row['id']} is a storm summary: ack the alerts it stands for "
                    f"(slawatch alerts --status summarized --rule {row['rule']})"
                )
            rule, key, episode = row["rule"], row["key"], row["episode"]
            base = {
                "alert": alert_id(rule, key, episode, row["n"], row["kind"]),
                "alert_id": row["id"],
                "rule": rule,
                "key": key,
                "episode": episode,
            }
            where = {"rule": rule, "key": key, "episode": episode}
            latest = conn.execute(q["latest_alert"], where).fetchone()
            assert latest is not None  # one row always
            last_ep, last_n, last_kind, resolved = latest
            if last_ep is not None and last_ep > episode:
                current = alert_id(rule, key, last_ep, last_n, last_kind)
                return Ack(**base, state="ended", current=current)
            if resolved or row["kind"] == "resolved":
                return Ack(**base, state="ended")
            params = where | {"alert_id": row["id"], "now": now, "by": by, "comment": comment}
            added = conn.execute(q["add_ack"], params).fetchone()
            state: AckState = "acknowledged"
            if added is not None:
                conn.execute(q["history_ack"], params)
            if added is None:  # acked before: the first ack stands
                added = conn.execute(q["get_ack"], where).fetchone()
                state = "already acknowledged"
            assert added is not None
            # Again for a repeated ack: a delivery in flight at the first may wait now.
            conn.execute(q["settle_acked"], where | {"now": now})
            acked_at, acked_by, acked_comment = added
            return Ack(
                **base, state=state, acked_at=acked_at, acked_by=acked_by, comment=acked_comment
            )

    return db.run("acknowledging an alert", work)


# ---------------------------------------------------------------- silences


def _silence(row: Mapping[str, Any], now: datetime) -> Silence:
    return Silence(
        **{k: row[k] for k in row if k != "matchers"},
        matchers=dict(row["matchers"]),
        active=row["starts_at"] <= now < row["ends_at"],
    )


def unknown_rule(field: str, name: str, rules: Iterable[str]) -> BadInput:
    """The error for ``name`` in ``field`` when no rule has that name: the rules there
    are, the first 20 of them."""
    names = sorted(rules)
    have = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") or "none"
    return BadInput(f"{field}: no rule named {shorten(name)} (defined: {have})")


def add_silence(
    db: Database,
    *,
    rule: str,
    key: str | None,
    matchers: dict[str, Any] | None,
    until: datetime,
    comment: str,
    author: str,
    now: datetime,
    rules: Mapping[str, Rule],
) -> Silence:
    """Silence the deliveries of ``rule``'s alerts (of one ``key``, and/or those whose row
    has the ``matchers``' values) from ``now`` until ``until``. BadInput for an unknown
    rule, an ``until`` not after ``now`` or more than a year on, or malformed values."""
    now = _aware("now", now)
    until = _aware("until", until)
    _text("rule", rule, 100, required=True)
    found = rules.get(rule)
    if found is None:
        raise unknown_rule("rule", rule, rules)
    if key is not None:
        key = _text("key", key, MAX_TEXT, required=True)
    if until <= now:
        raise BadInput(f"until: {_iso(until)} is not after now ({_iso(now)})")
    if until - now > MAX_SILENCE:
        raise BadInput(f"until: {_iso(until)} is more than a year away; change the rule instead")
    params = {
        "rule": rule,
        "key": key,
        "matchers": Jsonb(_matchers(matchers, found)),
        "until": until,
        "now": now,
        "author": _text("author", author, MAX_WHO, required=True),
        "comment": _text("comment", comment, MAX_TEXT),
    }
    query = queries()["add_silence"]

    def work(conn: Connection) -> Silence:
        row = conn.cursor(row_factory=dict_row).execute(query, params).fetchone()
        assert row is not None
        return _silence(row, now)

    return db.run("adding a silence", work)


def list_silences(db: Database, *, now: datetime, include_expired: bool = False) -> list[Silence]:
    """The silences active at ``now`` (every one with ``include_expired``), oldest first."""
    return db.run(
        "listing silences", lambda conn: silences_on(conn, now=now, include_expired=include_expired)
    )


def silences_on(conn: Connection, *, now: datetime, include_expired: bool = False) -> list[Silence]:
    """:func:`list_silences` on a connection the caller holds."""
    now = _aware("now", now)
    params = {"now": now, "all": bool(include_expired)}
    with translate("listing silences"):
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(queries()["list_silences"], params).fetchall()
    return [_silence(r, now) for r in rows]


def delete_silence(db: Database, silence_id: int, *, now: datetime) -> Silence:
    """End silence ``silence_id`` at ``now`` (one already over keeps its end). NotFound
    when there is no such silence."""
    now = _aware("now", now)
    if isinstance(silence_id, bool) or not isinstance(silence_id, int):
        raise BadInput(f"silence id: {shorten(silence_id)} is not a number")
    if not 0 < silence_id <= INT8:
        raise NotFound(f"no silence with id {silence_id}")
    query = queries()["end_silence"]

    def work(conn: Connection) -> Silence:
        cur = conn.cursor(row_factory=dict_row)
        row = cur.execute(query, {"id": silence_id, "now": now}).fetchone()
        if row is None:
            raise NotFound(f"no silence with id {silence_id}")
        return _silence(row, now)

    return db.run("ending a silence", work)
