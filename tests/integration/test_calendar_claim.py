"""A rule with a business calendar claims a row exactly when its working-time
deadline passes: real PostgreSQL, the clock moved over a weekend, both ways to
track. ``run --dry-run``'s count and ``status``'s overdue count agree with the claim,
and ``check`` refuses an unknown calendar (exit 2).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.calendars import Calendar
from slawatch.config.notifiers import ConsoleConfig
from slawatch.config.rules import Rule, check_calendar_names
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due
from slawatch.engine.baseline import baseline_rule
from slawatch.engine.catalog import inspect_table
from slawatch.engine.claim import drain, fill_due
from slawatch.engine.due import dry_run
from slawatch.engine.migrate import migrate
from slawatch.engine.outbox import iso
from slawatch.engine.ready import prepare
from slawatch.operate.inspect import count_overdue
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, FixedClock, alerts_of, claim_all
from tests.integration.lifecycle_helpers import Inbox
from tests.integration.test_cli import assert_one_line_error, slawatch

BERLIN = ZoneInfo("Europe/Berlin")
S = timedelta(seconds=1)


def due_ats(conn: Conn, rule: str) -> list[tuple[str, datetime | None]]:
    """(key, due_at) of every alert of ``rule``, by key, in either shape of the outbox."""
    return [(k, d) for k, d in alerts_of(conn, rule, "key", "due_at")]


TICKETS = """
CREATE TABLE tickets (
    id          integer PRIMARY KEY,
    opened_at   timestamptz NOT NULL,
    answered_at timestamptz
)"""


def berlin(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN)  # type: ignore[misc]


def office() -> Calendar:
    return Calendar.model_validate(
        {
            "name": "office",
            "timezone": "Europe/Berlin",
            "hours": {"mon-fri": "09:00-17:00"},
            "holidays": {"dates": ["2026-12-01"]},
        }
    )


def ticket_rule(track: str, **fields: Any) -> Rule:
    rule = Rule.model_validate(
        {
            "name": "ticket_unanswered",
            "table": "public.tickets",
            "key": "id",
            "track": track,
            "deadline": "opened_at",
            "after": "2h",
            "open_when": "answered_at IS NULL",
            "notify": ["console"],
            "calendar": "office",
        }
        | fields
    )
    check_calendar_names([rule], {"office": office()})
    return rule


# (key, opened_at, the instant its 2 working hours have passed)
TICKETS_DUE = [
    (1, berlin(2026, 11, 27, 15), berlin(2026, 11, 27, 17)),  # Friday: ends at the close
    (2, berlin(2026, 11, 29, 12), berlin(2026, 11, 30, 11)),  # Sunday: from Monday 09:00
    (3, berlin(2026, 11, 30, 16), berlin(2026, 12, 2, 10)),  # Monday, then a holiday
]


def test_a_calendar_rule_claims_each_row_when_its_working_time_has_passed(
    conn: Conn, track: str
) -> None:
    conn.execute(TICKETS)
    rule = ticket_rule(track)
    migrate(conn, [rule])
    for key, opened, _ in TICKETS_DUE:
        conn.execute("INSERT INTO tickets VALUES (%s, %s, NULL)", (key, opened))
    plan = prepare(conn, rule)
    info = inspect_table(conn, "public", "tickets")
    assert info is not None
    claimed: list[str] = []

    def step(now: datetime) -> int:
        """The dry run's and status's counts at now, then the claim's."""
        clock.move_to(now)
        ahead = dry_run(conn, [rule], Clock().now())[0].due
        assert ahead is not None
        overdue = count_overdue(conn, rule, info, Clock().now())
        assert overdue is not None
        got = claim_all(conn, plan)
        assert ahead.first == got
        assert overdue[0] == len(claimed) + got  # every overdue row, notified or not
        claimed[:] = [key for key, _ in due_ats(conn, rule.name)]
        return got

    with freeze_time(berlin(2026, 11, 27, 12)) as clock:
        for key, _, due_at in TICKETS_DUE:
            assert step(due_at) == 0, key  # exactly the working time: not yet
            assert step(due_at + S) == 1, key
            assert claimed[-1] == str(key)
        # Wall clock would have paged ticket 3 on Monday at 18:00 and ticket 2 on Sunday.
        assert step(berlin(2026, 12, 7, 12)) == 0
    assert claimed == ["1", "2", "3"]
    # The alerts' due_at would be per row in working time: left NULL (docs/how-to/calendars.md).
    assert [due for _, due in due_ats(conn, rule.name)] == [None] * 3
    # The history (the SLA report's) gets each episode's working-time due time.
    assert fill_due(conn, rule) == 3
    history = conn.execute("SELECT key, due_at FROM slawatch.episode ORDER BY key").fetchall()
    assert history == [(str(key), due_at) for key, _, due_at in TICKETS_DUE]
    assert fill_due(conn, rule) == 0


def test_a_drain_of_a_calendar_rule_gives_its_episodes_their_due_time(conn: Conn, dsn: str) -> None:
    conn.execute(TICKETS)
    rule = ticket_rule("inline")
    migrate(conn, [rule])
    for key, opened, _ in TICKETS_DUE:
        conn.execute("INSERT INTO tickets VALUES (%s, %s, NULL)", (key, opened))
    plan = prepare(conn, rule)
    with Database(dsn, size=1, timeout=5) as db:
        assert drain(db, plan, FixedClock(berlin(2026, 12, 7, 12))).claimed == 3
    history = conn.execute("SELECT key, due_at FROM slawatch.episode ORDER BY key").fetchall()
    assert history == [(str(key), due_at) for key, _, due_at in TICKETS_DUE]


def test_a_drain_of_a_calendar_rule_gives_its_alerts_their_due_time(
    conn: Conn, dsn: str, track: str
) -> None:
    """Receivers see each alert's working-time due time (not null, nor wall clock):
    written in the claim's transaction, before the NOTIFY wakes a notifier."""
    conn.execute(TICKETS)
    rule = ticket_rule(track)
    migrate(conn, [rule])
    for key, opened, _ in TICKETS_DUE:
        conn.execute("INSERT INTO tickets VALUES (%s, %s, NULL)", (key, opened))
    plan = prepare(conn, rule)
    with Database(dsn, size=1, timeout=5) as db:
        assert drain(db, plan, FixedClock(berlin(2026, 12, 7, 12))).claimed == 3
        inbox = Inbox()
        assert deliver_due(db, {"console": inbox}, FixedClock(berlin(2026, 12, 7, 12))).sent == 3
    payloads = sorted(inbox.got, key=lambda p: p["key"])
    assert [(p["key"], p["due_at"]) for p in payloads] == [
        (str(key), iso(due_at.astimezone(UTC))) for key, _, due_at in TICKETS_DUE
    ]


def test_a_crash_between_claim_and_fill_is_filled_by_maintenance(conn: Conn, dsn: str) -> None:
    """A claim committed, then no fill (a crash): a drain of nothing leaves it (an idle
    scan is one statement), the next maintenance fills it."""
    conn.execute(TICKETS)
    rule = ticket_rule("inline")
    migrate(conn, [rule])
    for key, opened, _ in TICKETS_DUE:
        conn.execute("INSERT INTO tickets VALUES (%s, %s, NULL)", (key, opened))
    plan = prepare(conn, rule)
    at = berlin(2026, 12, 7, 12)
    assert claim_all(conn, plan, at) == 3  # the claim alone: the history's due_at NULL

    def dues() -> list[Any]:
        return conn.execute("SELECT due_at FROM slawatch.episode ORDER BY key").fetchall()

    with Database(dsn, size=1, timeout=5) as db:
        assert drain(db, plan, FixedClock(at + S)).claimed == 0
    assert dues() == [(None,)] * 3
    runner = Runner(dsn, [rule], [ConsoleConfig(name="console", type="console")])
    try:
        runner.maintain()
    finally:
        runner.close()
    assert dues() == [(due_at,) for _, _, due_at in TICKETS_DUE]


def test_a_baseline_marks_what_is_due_in_working_time(conn: Conn, track: str) -> None:
    """migrate --baseline on Monday 10:00: ticket 1 (Friday) is due, ticket 2 (Sunday)
    not before 11:00 (wall clock would mark it too)."""
    conn.execute(TICKETS)
    rule = ticket_rule(track)
    migrate(conn, [rule])
    for key, opened, _ in TICKETS_DUE:
        conn.execute("INSERT INTO tickets VALUES (%s, %s, NULL)", (key, opened))
    info = inspect_table(conn, "public", "tickets")
    assert info is not None
    assert baseline_rule(conn, rule, info, berlin(2026, 11, 30, 10)) == 1
    plan = prepare(conn, rule)
    assert claim_all(conn, plan, berlin(2026, 11, 30, 11) + S) == 1  # ticket 2 pages


def test_a_timestamp_deadline_is_read_in_the_rules_zone(conn: Conn) -> None:
    """A `timestamp` column in the rule's zone, a calendar in another: still exact."""
    conn.execute(TICKETS.replace("timestamptz NOT NULL", "timestamp NOT NULL"))
    rule = ticket_rule("inline", timezone="America/New_York")
    migrate(conn, [rule])
    # Friday 09:00 in New York is 15:00 in Berlin: 2 working hours end at 17:00 Berlin.
    conn.execute("INSERT INTO tickets VALUES (1, '2026-11-27 09:00', NULL)")
    plan = prepare(conn, rule)
    assert claim_all(conn, plan, berlin(2026, 11, 27, 17)) == 0
    assert claim_all(conn, plan, berlin(2026, 11, 27, 17) + S) == 1


def test_check_refuses_an_unknown_calendar_and_shows_a_known_one(tmp_path: Path) -> None:
    rules, notifiers, calendars = (tmp_path / d for d in ("rules", "notifiers", "calendars"))
    for folder in (rules, notifiers, calendars):
        folder.mkdir()
    (notifiers / "console.yaml").write_text("type: console\n")
    (rules / "ticket_unanswered.yaml").write_text(
        "table: tickets\ndeadline: opened_at\nafter: 4h\nopen_when: answered_at IS NULL\n"
        "notify: [console]\ncalendar: ofice\n"
    )
    (calendars / "office.yaml").write_text(
        "timezone: Europe/Berlin\nhours: {mon-fri: '09:00-17:00'}\n"
    )
    result = slawatch("check", cwd=tmp_path)
    assert_one_line_error(
        result,
        2,
        "rules/ticket_unanswered.yaml: calendar: unknown calendar 'ofice' (defined: office)",
    )
    (rules / "ticket_unanswered.yaml").write_text(
        (rules / "ticket_unanswered.yaml").read_text().replace("ofice", "office")
    )
    assert slawatch("check", cwd=tmp_path).returncode == 0
    # A named folder that is not there is an error; the default one may be missing.
    missing = slawatch("--calendars", "nowhere", "check", cwd=tmp_path)
    assert_one_line_error(missing, 2, "nowhere: calendars folder not found")


def test_explain_shows_the_working_time_cutoff(conn: Conn, dsn: str, tmp_path: Path) -> None:
    conn.execute(TICKETS)
    for folder in ("rules", "notifiers", "calendars"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notifiers" / "console.yaml").write_text("type: console\n")
    (tmp_path / "rules" / "ticket_unanswered.yaml").write_text(
        "table: tickets\nkey: id\ndeadline: opened_at\nafter: 2h\n"
        "open_when: answered_at IS NULL\nnotify: [console]\ncalendar: office\n"
    )
    (tmp_path / "calendars" / "office.yaml").write_text(
        "timezone: Europe/Berlin\nhours: {mon-fri: '09:00-17:00'}\n"
    )
    assert slawatch("migrate", dsn=dsn, cwd=tmp_path).returncode == 0
    result = slawatch("explain", "ticket_unanswered", dsn=dsn, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    at = datetime.fromisoformat(header.rsplit(" at ", 1)[1])
    prefix = "after: 2h of working time (calendar office): due now if opened_at < "
    # Beside the outbox's shape when it is rows (a line of its own before this one).
    line = next((t for t in lines if t.startswith("after: ")), lines[0])
    assert line.startswith(prefix), line
    cutoff = datetime.fromisoformat(line.removeprefix(prefix))
    # Office hours hold at most the wall-clock time: the cutoff is 2 h or more back.
    assert cutoff <= at - timedelta(hours=2) + S
    assert office().working_time(cutoff, at + S) >= timedelta(hours=2) - S


def test_a_calendar_rule_restored_from_a_backup_is_not_paged_twice(
    conn: Conn, dsn: str, track: str
) -> None:
    """Tracking state restored from before the first drain: the claim meets its alerts
    again. It runs in the transaction that gives its alerts their due time, where a
    failed statement would abort the transaction: there it is sent with its guards at
    once (docs/explanation/architecture.md). Nothing is paged twice, the due times stay."""
    conn.execute(TICKETS)
    rule = ticket_rule(track)
    migrate(conn, [rule])
    for key, opened, _ in TICKETS_DUE:
        conn.execute("INSERT INTO tickets VALUES (%s, %s, NULL)", (key, opened))
    state = "public.tickets" if track == "inline" else "slawatch.ticket_unanswered_state"
    conn.execute(f"CREATE TABLE backup AS SELECT * FROM {state}")
    clock = FixedClock(berlin(2026, 12, 7, 12))
    with Database(dsn, size=1, timeout=5) as db:
        assert drain(db, prepare(conn, rule), clock).claimed == 3
        conn.execute(f"DELETE FROM {state}")
        conn.execute(f"INSERT INTO {state} SELECT * FROM backup")
        conn.execute("DELETE FROM slawatch.watermark")
        assert drain(db, prepare(conn, rule), clock, sweep=True).claimed == 0
    assert sorted(due_ats(conn, rule.name)) == [
        (str(key), due_at) for key, _, due_at in TICKETS_DUE
    ]
