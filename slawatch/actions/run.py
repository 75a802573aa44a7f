"""Running a rule's action where the claim owes it, and recording each attempt.

The claim (engine/claim.py, engine/statetable.py) hands the plan's ``act`` the
alerts it inserted whose number is the action's ``on`` (engine/acting.py), on its
own connection, inside its transaction. The batch's actions run as one statement
under one savepoint (the set form, config/batched.py: one round trip, one
subtransaction). When that statement fails, touches more than ``max_rows`` rows
for some alert, or cannot tell its rows apart per alert, it rolls back and the
batch runs one by one: each action under a savepoint rolled back at once (a
probe: its error or its rows; a failing one is recorded ``failed`` with the
database's message), then the ones that went run again as one statement. Only
when that fails too (the actions of one batch conflict with one another) does each
run for good under its own savepoint, as does every action of a shape with no set
form (whose rule's batch is capped, ``ONE_BY_ONE_BATCH``): a released savepoint
keeps its subtransaction until the commit. The alert is delivered all the same.
Every attempt becomes a row of ``slawatch.action`` in the same transaction (a batch
that went as one statement writes its records in that statement), so a
crash before the commit leaves neither alert nor action, and ``alert_once`` with
``action_once`` keep each action to one attempt per episode however many instances claim.

Every statement of a batch's actions runs under :class:`Bounds`: as the action's
role, with its ``lock_timeout``, and a statement timeout of its ``timeout`` or what is
left of the batch's ``budget``: the claim holds the batch's locks until it commits,
so a slow or blocked action must not hold them for long. An action that waited past
``lock_timeout`` for a row the application holds, or that the batch's time did not
reach, is recorded ``retry`` and runs again at the rule's next scan
(:func:`retry_held`); the others of the batch go ahead.

``SLAWATCH_ACTIONS=off`` or ``dry-run`` records ``would_run`` and logs the
statement with its values instead of running it; an acknowledged or silenced
episode is recorded ``skipped``, and so is an alert whose row, over the bound, was cut
without a column a placeholder reads (engine/acting.py: never run with NULL in its
place; logged as a WARNING; not ``failed``, which ``replay --actions`` would run again).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any, Literal, LiteralString

from psycopg.types.json import Jsonb

from slawatch.actions import webhook
from slawatch.config.batched import COUNTS, batch_relation
from slawatch.config.durations import format_duration
from slawatch.config.rules import Action, Rule, action_numbered
from slawatch.db import (
    LOCK_NOT_AVAILABLE,
    Connection,
    Refuse,
    attempt_state,
    in_savepoint,
    parameter_types,
    translate,
)
from slawatch.engine.acting import TOO_BIG, Act, Due
from slawatch.engine.outbox import MAX_DATA
from slawatch.engine.queries import parse_queries

log = logging.getLogger(__name__)

Mode = Literal["on", "off", "dry-run"]
Status = Literal["ok", "failed", "skipped", "would_run", "retry"]

# The SQLSTATEs of a statement that waited too long: for a row's lock (lock_timeout),
# or in all (statement_timeout).
QUERY_CANCELED = "57014"


@cache
def queries() -> dict[str, LiteralString]:
    """The named queries of ``slawatch/sql/actions.sql``."""
    text = resources.files("slawatch").joinpath("sql/actions.sql").read_text()
    return parse_queries(text)


@dataclass(frozen=True)
class Record:
    """One attempt of an action, as ``slawatch.action`` keeps it."""

    key: str
    episode: int
    n: int
    status: Status
    rows: int | None
    error: str | None
    attempt: int
    params: dict[str, str | None]


def _ms(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}ms"


class Bounds:
    """The claim's transaction while a batch's actions run: as ``action.role`` (when
    set), each statement with the action's ``lock_timeout`` and a statement timeout
    of its ``timeout``, or what is left of its ``budget`` when that is less (set
    before each statement by :meth:`next`). Entered and left outside any savepoint,
    with ``SET LOCAL`` (``set_config(..., true)``): a savepoint rolled back does not
    undo it, and the commit does. The batch's actions so hold the claim's locks for
    at most about ``budget``, whatever each does."""

    def __init__(self, conn: Connection, rule: Rule) -> None:
        assert rule.action is not None
        self.conn = conn
        self.rule = rule
        self.action = rule.action
        self.timeout = rule.action.timeout.total_seconds()
        self.deadline = 0.0
        self.current = self.timeout  # the statement timeout in force
        self.saved: tuple[str, str, str] | None = None

    def __enter__(self) -> Bounds:
        self.deadline = time.monotonic() + self.action.budget.total_seconds()
        params = {
            "timeout": _ms(self.timeout),
            "lock_timeout": _ms(self.action.lock_timeout.total_seconds()),
            "role": self.action.role,
        }
        with translate(f"setting the role and timeouts of rule {self.rule.name}'s action"):
            row = self.conn.execute(queries()["enter_action"], params).fetchone()
        assert row is not None
        self.saved = (str(row[0]), str(row[1]), str(row[2]))
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None or self.saved is None:
            return  # the transaction is lost anyway, and its SET LOCALs with it
        role, timeout, lock_timeout = self.saved
        with translate(f"resetting the role and timeouts after rule {self.rule.name}'s action"):
            self.conn.execute(
                queries()["leave_action"],
                {"role": role, "timeout": timeout, "lock_timeout": lock_timeout},
            )

    def next(self) -> bool:
        """Whether the batch's time allows another statement; its statement timeout
        is then at most what is left."""
        left = self.deadline - time.monotonic()
        if left < 0.01:
            return False
        if left < self.current:
            with translate(f"shortening rule {self.rule.name}'s action timeout"):
                self.conn.execute(queries()["action_timeout"], {"timeout": _ms(left)})
            self.current = left
        return True

    @property
    def shortened(self) -> bool:
        """Whether the statement timeout in force is less than the action's own."""
        return self.current < self.timeout


def run_one(
    conn: Connection,
    rule: Rule,
    due: Due,
    attempt_no: int | None = None,
    bounds: Bounds | None = None,
) -> Record:
    """Run ``rule``'s action for ``due`` under a savepoint (and :class:`Bounds`); the
    record of the attempt (number ``attempt_no``, else ``due.attempt``)."""
    assert rule.action is not None
    if attempt_no is not None:
        due = replace(due, attempt=attempt_no)
    if bounds is None:
        with Bounds(conn, rule) as fresh:
            return run_one(conn, rule, due, None, fresh)
    if not bounds.next():
        return held(rule, due, None)
    rows, error, state = attempt_state(
        conn, rule.action.statement, due.params, rule.action.max_rows
    )
    if error is not None:
        if waited(state, bounds):
            return held(rule, due, error)
        return failed(rule, due, rows, error)
    return ok(due, rows or 0)


def waited(state: str | None, bounds: Bounds) -> bool:
    """Whether a statement that failed with ``state`` is to run again at the next scan:
    it waited for a row's lock past ``lock_timeout``, or was stopped by what was left
    of the batch's time (not by the action's own ``timeout``: that is its failure)."""
    return state == LOCK_NOT_AVAILABLE or (state == QUERY_CANCELED and bounds.shortened)


# How a batch's actions ran (logged, and returned for tests and the bench).
Path = Literal["set", "probed", "one by one"]


def run_batch(
    conn: Connection,
    rule: Rule,
    dues: Sequence[Due],
    at: datetime | None = None,
    bounds: Bounds | None = None,
) -> tuple[list[Record], Path]:
    """Run ``rule``'s action for each of ``dues`` in the transaction ``conn`` is in,
    under :class:`Bounds`: one statement for all when it can, else one by one (see
    the module's doc); the records in the order of ``dues``, and which way they ran.
    With ``at``, the records of a batch that ran as one statement (path "set") were
    written by that statement (at ``at``: only for attempts 1, run as slawatch's own
    role); the caller writes the others (:func:`record`)."""
    action = rule.action
    assert action is not None
    if bounds is None:
        with Bounds(conn, rule) as fresh:
            return run_batch(conn, rule, dues, at, fresh)
    if action.set_form is not None and dues:
        if not bounds.next():
            return [held(rule, d, None) for d in dues], "one by one"
        counts, why = run_set(conn, action, dues, None if at is None else (rule.name, at))
        if counts is not None:
            return [ok(due, rows) for due, rows in zip(dues, counts, strict=True)], "set"
        log.info(
            "rule %s: its %d actions as one statement did not go (%s): one by one",
            rule.name,
            len(dues),
            why,
        )
        probes: list[Record | None] = []  # None: it went (rolled back, to run below)
        # Not run again below: it waited for a lock or its time ran out (the batch's
        # time is not spent on it twice).
        timed_out: set[int] = set()
        for i, d in enumerate(dues):
            if not bounds.next():
                probes.append(held(rule, d, None))
                timed_out.add(i)
                continue
            rows, error, state = attempt_state(
                conn, action.statement, d.params, action.max_rows, keep=False
            )
            if state in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
                timed_out.add(i)
            if error is None:
                probes.append(None)
            elif waited(state, bounds):
                probes.append(held(rule, d, error))
            else:
                probes.append(failed(rule, d, rows, error))
        went = [i for i, probe in enumerate(probes) if probe is None]
        if went and not bounds.next():
            return [p or held(rule, d, None) for d, p in zip(dues, probes, strict=True)], "probed"
        counts, why = run_set(conn, action, [dues[i] for i in went]) if went else ([], None)
        if counts is not None:
            applied = dict(zip(went, counts, strict=True))
            records = [
                ok(d, applied[i]) if p is None else p
                for i, (d, p) in enumerate(zip(dues, probes, strict=True))
            ]
            return records, "probed"
        log.warning(
            "rule %s: %d actions that go one by one do not go as one statement (%s):"
            " each runs for good under its own savepoint (a subtransaction each until"
            " the claim commits)",
            rule.name,
            len(went),
            why,
        )
        return [
            p if i in timed_out and p is not None else run_one(conn, rule, d, None, bounds)
            for i, (d, p) in enumerate(zip(dues, probes, strict=True))
        ], "one by one"
    return [run_one(conn, rule, due, None, bounds) for due in dues], "one by one"


# The placeholders' types of each action statement, per connection: PREPARE, read,
# DEALLOCATE are three round trips a batch otherwise. Forgotten when a set statement
# fails (a column's type may have changed), and with the connection.
_types: weakref.WeakKeyDictionary[Connection, dict[str, list[str]]] = weakref.WeakKeyDictionary()


def set_statement(
    conn: Connection,
    action: Action,
    dues: Sequence[Due],
    recording: tuple[str, datetime] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The set form of ``action`` for ``dues`` (see :func:`run_set`) and its
    parameters; the placeholders' types are asked of the server once per connection."""
    form = action.set_form
    assert form is not None
    names = action.placeholders
    known = _types.setdefault(conn, {})
    types = known.get(action.statement)
    if types is None:
        types = parameter_types(conn, action_numbered(action.statement, names))
        known[action.statement] = types
    statement = f"WITH {batch_relation(types)}, {form.body}"
    params: dict[str, Any] = {"ord": list(range(len(dues)))}
    for i, name in enumerate(names, 1):
        params[f"a{i}"] = [d.params.get(name) for d in dues]
    if recording is not None:
        statement += f", {queries()['record_set']}"
        params |= {
            "rule": recording[0],
            "at": recording[1],
            "keys": [d.key for d in dues],
            "episodes": [d.episode for d in dues],
            "ns": [d.n for d in dues],
            "params": Jsonb([d.params for d in dues]),
        }
    return statement + COUNTS, params


def run_set(
    conn: Connection,
    action: Action,
    dues: Sequence[Due],
    recording: tuple[str, datetime] | None = None,
) -> tuple[list[int] | None, str | None]:
    """Run ``action`` for all ``dues`` as one statement under one savepoint: the rows
    it touched for each (in order), or (None, why) after rolling it back.
    ``recording`` (rule name, at): the same statement writes each alert's ``ok``
    record (``record_set``), rolled back with it when it does not go."""

    def work() -> list[int]:
        statement, params = set_statement(conn, action, dues, recording)
        counts = [0] * len(dues)
        total = 0
        for ord_, count in conn.execute(statement, params).fetchall():
            if ord_ is None:
                total = int(count)
            else:
                counts[ord_] = int(count)
        if sum(counts) != total:
            raise Refuse(
                f"{sum(counts)} rows by alert, {total} in all: not one row per alert"
                " (two alerts' values reach the same row?)"
            )
        over = [c for c in counts if c > action.max_rows]
        if over:
            raise Refuse(
                f"an action touched {max(over)} rows, more than max_rows {action.max_rows}"
            )
        return counts

    counts, why = in_savepoint(conn, "actions", work)
    if counts is None:
        _types.get(conn, {}).pop(action.statement, None)
    return counts, why


def ok(due: Due, rows: int) -> Record:
    """The record of an action that went."""
    return Record(due.key, due.episode, due.n, "ok", rows, None, due.attempt, due.params)


def failed(rule: Rule, due: Due, rows: int | None, error: str) -> Record:
    """The record (and the log line) of an action that failed."""
    log.warning(
        "rule %s: action for key %s (episode %d) failed: %s",
        rule.name,
        due.key,
        due.episode,
        error,
    )
    return Record(due.key, due.episode, due.n, "failed", rows, error, due.attempt, due.params)


def held(rule: Rule, due: Due, error: str | None) -> Record:
    """The record (and the log line) of an action to run again at the rule's next
    scan: it waited for a row's lock past ``lock_timeout`` (``error``: the database's
    message), or the batch's time ran out before it (``error`` None)."""
    action = rule.action
    assert action is not None
    if error is None:
        why = f"the batch's time for actions ({format_duration_ms(action.budget)}) ran out"
    else:
        why = f"{error} (lock_timeout {format_duration_ms(action.lock_timeout)})"
    log.info(
        "rule %s: action for key %s (episode %d) runs again at the next scan: %s",
        rule.name,
        due.key,
        due.episode,
        why,
    )
    reason = f"{why}: runs again at the rule's next scan"
    return Record(due.key, due.episode, due.n, "retry", None, reason, due.attempt, due.params)


def gave_up(rule: Rule, held_again: Record) -> Record:
    """``held_again`` (status retry), recorded failed instead at :data:`RETRY_LIMIT`."""
    if held_again.attempt < RETRY_LIMIT:
        return held_again
    error = (held_again.error or "").removesuffix(": runs again at the rule's next scan")
    error = f"{error}: still held at attempt {held_again.attempt}, given up"
    log.warning(
        "rule %s: action for key %s (episode %d) failed: %s",
        rule.name,
        held_again.key,
        held_again.episode,
        error,
    )
    return replace(held_again, status="failed", error=error)


def format_duration_ms(value: timedelta) -> str:
    """``value`` as the rule would write it (``2s``), or in ms below a second."""
    if value < timedelta(seconds=1):
        return f"{round(value.total_seconds() * 1000)}ms"
    if value.microseconds:
        return f"{value.total_seconds():g}s"
    return format_duration(value)


def record(conn: Connection, rule: Rule, records: list[Record], at: datetime) -> None:
    """Write ``records`` (one statement) in the transaction ``conn`` is in."""
    if not records:
        return
    with translate(f"recording the actions of rule {rule.name}"):
        conn.execute(
            queries()["record_actions"],
            {"rule": rule.name, "at": at, "records": Jsonb([vars(r) for r in records])},
        )


def runner(mode: Mode, counted: Callable[[str, str], None] | None = None) -> Act:
    """The ``act`` of claim plans (``ClaimPlan.with_act``): runs, or in ``off`` and
    ``dry-run`` only logs, the due actions, and records each. ``counted(rule,
    status)`` is called per record once the records are written (the metrics): a
    claim whose commit then fails (its connection lost at that moment) was counted."""

    def act(conn: Connection, rule: Rule, dues: list[Due], now: datetime) -> None:
        assert rule.action is not None
        if rule.action.webhook is not None:  # through the outbox instead (webhook.py)
            webhook.act(conn, rule, dues, now, mode, counted)
            return
        records: list[Record | None] = []
        todo: list[Due] = []
        for due in dues:
            if due.skip == TOO_BIG:
                missing = [":" + k for k, v in due.params.items() if v is None]
                log.warning(
                    "rule %s: action for key %s (episode %d) not run, recorded skipped: its"
                    " row data was over %s bytes, and the alert's row (cut to fit) has no"
                    " value for %s (docs/reference/rules.md, columns)",
                    rule.name,
                    due.key,
                    due.episode,
                    f"{MAX_DATA:,}",
                    ", ".join(missing),
                )
            if due.skip is not None:
                records.append(
                    Record(due.key, due.episode, due.n, "skipped", None, due.skip, 1, due.params)
                )
            elif mode != "on":
                log.info(
                    "rule %s: would run action for key %s (episode %d): %s with %s"
                    " (SLAWATCH_ACTIONS=%s)",
                    rule.name,
                    due.key,
                    due.episode,
                    rule.action.sql,
                    due.params,
                    mode,
                )
                records.append(
                    Record(due.key, due.episode, due.n, "would_run", None, None, 1, due.params)
                )
            else:
                records.append(None)  # run below, with the others
                todo.append(due)
        # Skipped and would-run records: written below whichever way the others ran.
        unrun = [r for r in records if r is not None]
        path = None
        # The set statement writes its records only as slawatch's own role: an action's
        # role has no business writing slawatch.action.
        own = rule.action.role is None
        if todo:
            ran, path = run_batch(conn, rule, todo, now if own else None)
            log.debug("rule %s: %d actions ran (%s)", rule.name, len(ran), path)
            done = iter(ran)
            records = [r if r is not None else next(done) for r in records]
        # The set statement wrote its own records; otherwise all are written here.
        written = path == "set" and own
        record(conn, rule, unrun if written else [r for r in records if r is not None], now)
        if counted is not None:
            for r in records:
                if r is not None:
                    counted(rule.name, r.status)

    return act


def params_of(value: Any) -> dict[str, str | None]:
    """Stored ``params`` as read back."""
    return {str(k): (None if v is None else str(v)) for k, v in dict(value or {}).items()}


# The most attempts recorded 'retry' one scan runs again (one batch, one transaction).
RETRY_BATCH = 100
# An action still held at this attempt is recorded failed: a row the application holds
# for good is left to a person (`slawatch replay --actions`), not waited for each scan.
RETRY_LIMIT = 10


def retry_held(
    conn: Connection,
    rule: Rule,
    now: datetime,
    counted: Callable[[str, str], None] | None = None,
) -> int:
    """Run again, in one transaction on ``conn``, the actions of ``rule`` recorded
    ``retry`` and not run since (at most :data:`RETRY_BATCH`, those another instance
    is running left out), each recorded as its next attempt; how many it ran."""
    if rule.action is None or rule.action.sql is None:
        return 0
    with translate(f"running rule {rule.name}'s held actions again"), conn.transaction():
        rows = conn.execute(
            queries()["held_actions"], {"rule": rule.name, "limit": RETRY_BATCH}
        ).fetchall()
        dues = [
            Due(key, episode, n, params_of(params), attempt=attempt + 1)
            for key, episode, n, attempt, params in rows
        ]
        if not dues:
            return 0
        records, path = run_batch(conn, rule, dues)
        log.info("rule %s: %d held actions ran again (%s)", rule.name, len(records), path)
        records = [gave_up(rule, r) if r.status == "retry" else r for r in records]
        record(conn, rule, records, now)
    if counted is not None:
        for r in records:
            counted(rule.name, r.status)
    return len(records)
