"""A rule's generation: one definition of a rule across the fleet at a time.

``slawatch migrate`` records, per rule, a hash of what decides its episodes
(:data:`PARTS`) in ``slawatch.rule_generation``. Each statement of ``slawatch run``
that opens, closes or acts on a rule's episodes (the claims, a ``track: table``
sweep, an event rule's housekeeping) calls ``slawatch.claim_gate`` in its own
transaction (sql/migrations/0009_generation.sql): an instance whose loaded rule is
not the recorded one changes nothing for that rule. So two instances in the middle
of a rolling reload never disagree about an episode: the one not reloaded yet
stops claiming the rule until it is (docs/how-to/rolling-deploys.md). A rule without
a record (a database upgraded, not migrated with the rule since) is claimed by every
instance, as before.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import Connection, sqlstate, translate
from slawatch.errors import DatabaseError

# What decides a rule's episodes: whether a row (or timer) is open, when it is due,
# and what the claim does. Severity, notifiers, renotify, escalate and resolve only
# shape the pages: two instances that differ there do not undo each other's work.
PARTS = (
    "track",
    "table",
    "events",
    "key",
    "deadline",
    "after",
    "timezone",
    "open_when",
    "calendar",
    "action",
)

# claim_gate's SQLSTATEs: another definition is recorded; migrate is recording one now.
STALE_STATE = "SWG01"
BUSY_STATE = "SWG02"

# The claim statements' first CTE: the gate, read by their final SELECT.
GATE_CTE = "sw_gate AS (SELECT slawatch.claim_gate(%(rule)s, %(generation)s) AS ok)"
GATE_WHERE = "\n WHERE (SELECT ok FROM sw_gate)"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _parts(rule: Rule) -> dict[str, Any]:
    """Each part of :data:`PARTS` as plain data."""
    action: dict[str, Any] | None = None
    if rule.action is not None:
        # A webhook's secret and headers say how it authenticates, not whether it acts.
        hook = rule.action.webhook
        action = {
            "sql": rule.action.sql,
            "webhook": None if hook is None else hook.url,
            "on": rule.action.on,
            "max_rows": rule.action.max_rows,
        }
    calendar: dict[str, Any] | None = None
    if rule.calendar is not None:
        loaded = rule.loaded_calendar
        calendar = {"name": rule.calendar, **(loaded.definition() if loaded else {})}
    # A query rule's rows are its query's: in "table", so other rules' hashes stay.
    table: str | None = rule.table if rule.query is None else f"query: {rule.query}"
    if rule.events is not None:
        table = None
    return {
        "track": rule.track,
        "table": table,
        "events": None if rule.events is None else rule.events.model_dump(mode="json"),
        "key": rule.key,
        "deadline": rule.deadline,
        "after": rule.after.total_seconds(),
        "timezone": rule.timezone,
        "open_when": rule.open_when,
        "calendar": calendar,
        "action": action,
    }


def definition(rule: Rule) -> dict[str, str]:
    """A short hash of each part: what ``slawatch.rule_generation.definition`` holds
    (enough to name the parts that differ, nothing an action's SQL or URL could be
    read back from)."""
    return {name: _digest(value)[:8] for name, value in _parts(rule).items()}


def generation(rule: Rule) -> str:
    """The rule's generation: a hash of all its :data:`PARTS`."""
    return _digest(_parts(rule))[:16]


@dataclass(frozen=True)
class Recorded:
    """A rule's definition as migrate last recorded it."""

    generation: str
    definition: dict[str, str]
    at: datetime


def _recorded_anything(conn: Connection) -> bool:
    """Whether the table of recorded definitions is there (migration 0009 ran)."""
    there = conn.execute("SELECT to_regclass('slawatch.rule_generation')").fetchone()
    return there is not None and there[0] is not None


def recorded(conn: Connection) -> dict[str, Recorded]:
    """Every rule's recorded definition, by rule name; empty before migration 0009."""
    with translate("reading the rules' recorded definitions"):
        if not _recorded_anything(conn):
            return {}
        rows = conn.execute(
            "SELECT rule, generation, definition, recorded_at FROM slawatch.rule_generation"
        ).fetchall()
    return {r[0]: Recorded(r[1], dict(r[2]), r[3]) for r in rows}


def recorded_generations(conn: Connection) -> dict[str, str]:
    """Every rule's recorded generation alone, by rule name; empty before migration
    0009. What a running instance compares with its own rules' every few seconds: the
    definitions (:func:`recorded_one`) only say which parts differ, when one does."""
    with translate("reading the rules' recorded definitions"):
        if not _recorded_anything(conn):
            return {}
        rows = conn.execute("SELECT rule, generation FROM slawatch.rule_generation").fetchall()
    return {r[0]: r[1] for r in rows}


def recorded_one(conn: Connection, rule: str) -> Recorded | None:
    """``rule``'s recorded definition (None: none is recorded, or no table yet)."""
    with translate(f"reading rule {rule}'s recorded definition"):
        if not _recorded_anything(conn):
            return None
        r = conn.execute(
            "SELECT generation, definition, recorded_at FROM slawatch.rule_generation"
            " WHERE rule = %s",
            (rule,),
        ).fetchone()
    return None if r is None else Recorded(r[0], dict(r[1]), r[2])


def record_statement(rule: Rule) -> str:
    """The statement that records ``rule``'s definition (``migrate``, and printed by
    ``migrate --print``): it waits for the claims made under the old record to end."""
    return (
        sql.SQL("SELECT slawatch.record_generation({}, {}, {}::jsonb)")
        .format(
            sql.Literal(rule.name),
            sql.Literal(generation(rule)),
            sql.Literal(json.dumps(definition(rule), sort_keys=True)),
        )
        .as_string(None)
    )


def differing(rule: Rule, record: Recorded) -> list[str]:
    """The parts of ``rule`` that are not as recorded (all of them if none is named)."""
    mine = definition(rule)
    found = [p for p in PARTS if record.definition.get(p) != mine[p]]
    return found or list(PARTS)


def mismatch(rule: Rule, record: Recorded | None) -> str | None:
    """Why an instance running ``rule`` does not claim it, in one line; None when the
    recorded definition is this one (or there is none)."""
    if record is None or record.generation == generation(rule):
        return None
    return (
        f"rule {rule.name}: its definition here ({', '.join(differing(rule, record))}"
        f" differ) is not the one slawatch migrate recorded at"
        f" {record.at:%Y-%m-%d %H:%M:%S%z}; not claiming it until this instance is"
        " reloaded with the recorded definition, or migrate records this one"
    )


def unrecorded(rule: Rule, record: Recorded | None) -> str | None:
    """What ``check`` and ``status`` say of a rule whose files define it otherwise than
    migrate recorded (None when they match, or nothing is recorded)."""
    if record is None or record.generation == generation(rule):
        return None
    return (
        f"not the definition slawatch migrate recorded at {record.at:%Y-%m-%d %H:%M:%S%z}"
        f" ({', '.join(differing(rule, record))} differ): an instance running these files"
        " does not claim it until 'slawatch migrate' records them"
    )


def gate(conn: Connection, rule: Rule) -> None:
    """Call the gate in the transaction ``conn`` is in (before statements that are not
    claims: an event rule's housekeeping); raises as the claims do (:func:`refusal`)."""
    with translate(f"checking the definition of rule {rule.name}"):
        conn.execute("SELECT slawatch.claim_gate(%s, %s)", (rule.name, generation(rule))).fetchone()


def refusal(exc: BaseException) -> str | None:
    """``"stale"`` when ``exc`` is the gate refusing a definition that is not the
    recorded one, ``"busy"`` when migrate was recording one (try the next scan);
    None for any other error."""
    if not isinstance(exc, DatabaseError):
        return None
    state = sqlstate(exc)
    return {STALE_STATE: "stale", BUSY_STATE: "busy"}.get(state or "")
