"""Running a rule's action where the claim owes it, and recording each attempt.

The claim (engine/claim.py, engine/statetable.py) hands the plan's ``act`` the
alerts it inserted whose number is the action's ``on`` (engine/acting.py), on its
own connection, inside its transaction. Each action runs under its own savepoint
(db.attempt): a statement the database refuses, or one touching more than
``max_rows`` rows, rolls back alone and is recorded ``failed`` with the reason;
the alert is delivered all the same. Every attempt becomes a row of
``slawatch.action`` in the same transaction, so a crash before the commit leaves
neither alert nor action, and ``alert_once`` with ``action_once`` keep each
action to one attempt per episode however many instances claim.

``SLAWATCH_ACTIONS=off`` or ``dry-run`` records ``would_run`` and logs the
statement with its values instead of running it; an acknowledged or silenced
episode is recorded ``skipped``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, Literal, LiteralString

from psycopg.types.json import Jsonb

from slawatch.config.rules import Rule
from slawatch.db import Connection, attempt, translate
from slawatch.engine.acting import Act, Due
from slawatch.engine.queries import parse_queries

log = logging.getLogger(__name__)

Mode = Literal["on", "off", "dry-run"]
Status = Literal["ok", "failed", "skipped", "would_run"]


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


def run_one(conn: Connection, rule: Rule, due: Due, attempt_no: int = 1) -> Record:
    """Run ``rule``'s action for ``due`` under a savepoint; the record of the attempt."""
    assert rule.action is not None
    rows, error = attempt(conn, rule.action.statement, due.params, rule.action.max_rows)
    if error is not None:
        log.warning(
            "rule %s: action for key %s (episode %d) failed: %s",
            rule.name,
            due.key,
            due.episode,
            error,
        )
        return Record(due.key, due.episode, due.n, "failed", rows, error, attempt_no, due.params)
    return Record(due.key, due.episode, due.n, "ok", rows, None, attempt_no, due.params)


def record(conn: Connection, rule: Rule, records: list[Record], at: datetime) -> None:
    """Write ``records`` (one statement) in the transaction ``conn`` is in."""
    if not records:
        return
    with translate(f"recording the actions of rule {rule.name}"):
        conn.execute(
            queries()["record_actions"],
            {"rule": rule.name, "at": at, "records": Jsonb([asdict(r) for r in records])},
        )


def runner(mode: Mode, counted: Callable[[str, str], None] | None = None) -> Act:
    """The ``act`` of claim plans (``ClaimPlan.with_act``): runs, or in ``off`` and
    ``dry-run`` only logs, the due actions, and records each. ``counted(rule,
    status)`` is called per record once the records are written (the metrics): a
    claim whose commit then fails (its connection lost at that moment) was counted."""

    def act(conn: Connection, rule: Rule, dues: list[Due], now: datetime) -> None:
        assert rule.action is not None
        records = []
        for due in dues:
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
                records.append(run_one(conn, rule, due))
        record(conn, rule, records, now)
        if counted is not None:
            for r in records:
                counted(rule.name, r.status)

    return act


def params_of(value: Any) -> dict[str, str | None]:
    """Stored ``params`` as read back."""
    return {str(k): (None if v is None else str(v)) for k, v in dict(value or {}).items()}
