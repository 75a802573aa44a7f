"""The SLA report (docs/how-to/report.md, operate/report.py): figures per rule and period from
the episode history that real claims, acks and ends wrote with the clock moved through
the periods; the CLI's formats; GET /v1/report and its 400s."""

from __future__ import annotations

import csv
import io
import json
import resource
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from slawatch.config.calendars import Calendar
from slawatch.config.rules import Rule, check_calendar_names, load_rules
from slawatch.db import Database
from slawatch.engine.catalog import rule_table
from slawatch.engine.claim import fill_due
from slawatch.engine.migrate import migrate, pending, plan_rule, render
from slawatch.errors import BadInput
from slawatch.operate.admin import AdminServer, create_app, serve_in_thread
from slawatch.operate.lifecycle import ack
from slawatch.operate.report import ReportRow, as_table, query, report
from tests.conftest import ROOT
from tests.integration import test_calendar_claim as calendar_test
from tests.integration import test_deadline_expr as expr_test
from tests.integration import test_partitioned as part
from tests.integration.helpers import SHOP, Conn, claim_all, plans, shop
from tests.integration.test_cli import assert_one_line_error, clean_env, slawatch

T0 = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday, 00:00 UTC
H = timedelta(hours=1)
M = timedelta(minutes=1)
AFTER = 48 * H  # order_unshipped: due 48 h after paid_at


def paid(conn: Conn, order: int, due: datetime) -> None:
    conn.execute("INSERT INTO orders VALUES (%s, 7, 100, 'paid', %s)", (order, due - AFTER))


def ship(conn: Conn, order: int) -> None:
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = %s", (order,))


@pytest.fixture
def history(conn: Conn, db: Database) -> dict[str, Rule]:
    """order_unshipped through two days, claimed as the clock moves (inline tracking):

    day 0: orders 1, 2, 3 fall due at 01:00, 6 at 03:00, 4 at 02:00 (shipped at 00:30:
    due, never breached). 1 is acked 10 min after its notice and ships at 02:00 (1 h
    late), 2 ships at 04:00 (3 h), 6 ships at 02:00 on day 1 (23 h), 3 never ships.
    day 1: order 5 falls due at 01:00 and stays open.
    """
    rules = shop(conn)
    conn.execute("CREATE INDEX orders_paid_at ON orders (paid_at)")  # so `due` is counted
    plan = plans(conn, rules)["order_unshipped"]
    for order in (1, 2, 3):
        paid(conn, order, T0 + H)
    paid(conn, 4, T0 + 2 * H)
    paid(conn, 5, T0 + 25 * H)
    paid(conn, 6, T0 + 3 * H)
    ship(conn, 4)
    assert claim_all(conn, plan, T0 + H + M) == 3
    ack(db, "order_unshipped:1:e1:n1", by="ann", comment="", now=T0 + H + 11 * M)
    ship(conn, 1)
    claim_all(conn, plan, T0 + 2 * H)
    assert claim_all(conn, plan, T0 + 3 * H + M) == 1  # order 6
    ship(conn, 2)
    claim_all(conn, plan, T0 + 4 * H)
    claim_all(conn, plan, T0 + 25 * H + M)  # order 5
    ship(conn, 6)
    claim_all(conn, plan, T0 + 26 * H)
    return rules


def rows(db: Database, rules: dict[str, Rule], **kw: Any) -> list[ReportRow]:
    q = query([rules["order_unshipped"]], rule=None, **kw)
    return db.run("report", lambda c: report(c, q)).rows


def test_figures_per_day_from_a_known_history(history: dict[str, Rule], db: Database) -> None:
    day0, day1 = rows(db, history, since="1d", by="day", now=T0 + 30 * H)
    assert (day0.period, day1.period) == (T0, T0 + 24 * H)
    assert (day0.due, day0.breached, day0.open) == (5, 4, 2)  # 3 and 6 open at 24:00
    assert day0.compliance == pytest.approx(1 - 4 / 5)
    # Lateness of the episodes that ended (1 h, 3 h, 23 h): percentile_cont.
    assert day0.late_p50 == pytest.approx(3 * 3600)
    assert day0.late_p90 == pytest.approx((3 + 0.8 * 20) * 3600)
    assert day0.late_p99 == pytest.approx((3 + 0.98 * 20) * 3600)
    assert (day0.ack_p50, day0.ack_p90) == (600, 600)
    assert (day1.due, day1.breached, day1.open, day1.compliance) == (1, 1, 2, 0.0)
    assert (day1.late_p50, day1.ack_p50) == (None, None)
    assert (day0.actions_ok, day0.actions_failed) == (None, None)  # no action


def test_open_carries_over_from_before_the_window(history: dict[str, Rule], db: Database) -> None:
    """Day 1 alone: 3 and 6 were open at its start (6 ends in it), 5 opens in it."""
    (day1,) = rows(db, history, since="6h", by="day", now=T0 + 30 * H)
    assert (day1.period, day1.breached, day1.open) == (T0 + 24 * H, 1, 2)


def test_figures_per_hour(history: dict[str, Rule], db: Database) -> None:
    got = rows(db, history, since="4h", by="hour", now=T0 + 4 * H)
    assert [r.period for r in got] == [T0 + i * H for i in range(5)]
    assert [r.due for r in got] == [0, 3, 1, 1, 0]
    assert [r.breached for r in got] == [0, 3, 0, 1, 0]
    assert [r.open for r in got] == [0, 3, 2, 3, 2]


def test_due_is_not_counted_without_an_index_on_the_deadline(
    history: dict[str, Rule], conn: Conn, db: Database
) -> None:
    conn.execute("DROP INDEX orders_paid_at")
    q = query([history["order_unshipped"]], rule=None, since="1d", by="day", now=T0 + 30 * H)
    got = db.run("report", lambda c: report(c, q))
    assert [(r.due, r.compliance, r.breached) for r in got.rows] == [
        (None, None, 4),
        (None, None, 1),
    ]
    assert got.notes == [
        "order_unshipped: due not counted: no index on public.orders (paid_at) for every row;"
        " create one to count it"
    ]
    text = as_table(got)
    assert text.splitlines()[-1].startswith("- order_unshipped: due not counted")


def test_the_report_reads_indexes_never_a_table(history: dict[str, Rule], conn: Conn) -> None:
    """EXPLAIN of the statement over the history: no sequential scan of anything."""
    from slawatch.operate.report import REPORT_SQL

    q = query([history["order_unshipped"]], rule=None, since="1d", by="day", now=T0 + 30 * H)
    conn.execute("SET enable_seqscan = off")  # a tiny table: the planner may prefer a scan
    plan = conn.execute(
        "EXPLAIN (FORMAT JSON) " + REPORT_SQL,
        {"rules": [r.name for r in q.rules], "start": q.start, "until": q.until, "step": q.step},
    ).fetchone()
    assert plan is not None
    text = json.dumps(plan[0])
    assert "Seq Scan" not in text
    for index in ("episode_due", "episode_ended"):
        assert index in text


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"by": "month"}, "by: 'month' is not one of hour, day, week"),
        ({"since": "7 dayz"}, "since: '7 dayz'"),
        ({"since": "0s"}, "since: '0s' must be more than 0"),
        # The value once: the duration's own error quotes it already.
        ({"since": "36501d"}, "since: '36501d' is longer than 100 years, the most"),
        ({"since": ""}, "since: ''"),
        ({"by": ""}, "by: '' is not one of hour, day, week"),
        ({"since": "1000d", "by": "hour"}, "more than 2000 periods"),
        ({"rule": "Bad-Name"}, "is not a rule name"),
    ],
)
def test_bad_parameters_are_one_line(kw: dict[str, str], message: str) -> None:
    params: dict[str, Any] = {"rule": None, "since": "7d", "by": "day"} | kw
    with pytest.raises(BadInput) as got:
        query([], now=T0, **params)
    assert message in str(got.value) and "\n" not in str(got.value)


# ---------------------------------------------------------------- the CLI and the API


@pytest.fixture
def recent(conn: Conn) -> str:
    """The shop, and a known history early in yesterday's UTC day (the CLI runs on real
    time): all of it past, and the first period of ``--since 1d`` at any time of day."""
    shop(conn)
    now = datetime.now(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    for key, ended in (("1", day + 2 * M), ("2", None)):
        conn.execute(
            "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at,"
            " acked_at, acked_by, ended_at) VALUES ('order_unshipped', %s, 1, %s, %s, %s, %s,"
            " 'ann', %s)",
            (key, day - AFTER, day, day + M, day + 2 * M, ended),
        )
    return day.strftime("%Y-%m-%d")


def test_cli_table_json_and_csv(recent: str, dsn: str) -> None:
    table = slawatch("report", "--rule", "order_unshipped", "--since", "1d", dsn=dsn)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:6] == ["rule", "period", "(UTC)", "due", "breached", "compliance"]
    assert lines[1].split()[:9] == ["order_unshipped", recent, "-", "2", "-", "1", "2m", "2m", "2m"]
    assert lines[-1].startswith("- order_unshipped: due not counted: no index on public.orders")
    js = slawatch(
        "report", "--rule", "order_unshipped", "--since", "1d", "--format", "json", dsn=dsn
    )
    body = json.loads(js.stdout)
    assert body["by"] == "day" and len(body["rows"]) == 2  # yesterday and today
    assert body["rows"][0] | {"period": None} == {
        "rule": "order_unshipped",
        "period": None,
        "due": None,
        "breached": 2,
        "compliance": None,
        "open": 1,
        "late_p50": 120.0,
        "late_p90": 120.0,
        "late_p99": 120.0,
        "ack_p50": 60.0,
        "ack_p90": 60.0,
        "actions_ok": None,
        "actions_failed": None,
    }
    out = slawatch("report", "--since", "2d", "--by", "hour", "--format", "csv", dsn=dsn)
    got = list(csv.DictReader(io.StringIO(out.stdout)))
    assert {r["rule"] for r in got} == {
        "job_hung",
        "order_unshipped",
        "parcel_undelivered",
        "receipt_unconfirmed",
        "refund_unprocessed",
        "task_timeout",
    }
    assert sum(int(r["breached"]) for r in got if r["rule"] == "order_unshipped") == 2


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--by", "month"], "argument --by: invalid choice: 'month'"),
        (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["--since", "soon"], "since: 'soon'"),
        (["--rule", "nope"], "rule: no rule named 'nope'"),
    ],
)
def test_cli_bad_parameters_exit_2_with_one_line(dsn: str, args: list[str], text: str) -> None:
    assert_one_line_error(slawatch("report", *args, dsn=dsn), 2, text)


@pytest.fixture
def api(dsn: str, recent: str, conn: Conn) -> Iterator[httpx.Client]:
    rules = load_rules(ROOT / "rules")
    db = Database(dsn, size=2, timeout=5)
    app = create_app(db, rules, ["console"], token=None, allow_writes=False)
    server: AdminServer = serve_in_thread(app, "127.0.0.1", 0)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client
    server.stop()
    db.close()


def test_api_report_and_its_formats(api: httpx.Client, recent: str) -> None:
    got = api.get("/v1/report", params={"rule": "order_unshipped", "since": "1d"})
    assert got.status_code == 200, got.text
    row, _today = got.json()["rows"]
    assert (row["breached"], row["open"], row["late_p50"]) == (2, 1, 120.0)
    text = api.get("/v1/report", params={"rule": "order_unshipped", "format": "csv"})
    assert text.headers["content-type"].startswith("text/csv")
    assert text.text.splitlines()[0].startswith("rule,period,due,breached")


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({"by": "month"}, "by: 'month' is not one of hour, day, week"),
        ({"since": "soon"}, "since: 'soon'"),
        ({"format": "xml"}, "format: 'xml' is not one of table, json, csv"),
        ({"rule": "nope"}, "rule: no rule named 'nope'"),
    ],
)
def test_api_bad_parameters_are_400_with_one_line(
    api: httpx.Client, params: dict[str, str], text: str
) -> None:
    got = api.get("/v1/report", params=params)
    assert got.status_code == 400, got.text
    assert set(got.json()) == {"error"} and text in got.json()["error"]
    assert "\n" not in got.json()["error"]


def test_report_without_history_is_all_zero(conn: Conn, db: Database) -> None:
    rules = shop(conn)
    got = rows(db, rules, since="1d", by="day", now=T0)
    assert [(r.breached, r.open, r.late_p50) for r in got] == [(0, 0, None), (0, 0, None)]


def test_actions_ok_and_failed_per_period_for_a_rule_with_an_action(
    conn: Conn, db: Database
) -> None:
    from slawatch.config.rules import Action

    rule = shop(conn)["order_unshipped"]
    acting = rule.model_copy(
        update={"action": Action(sql="update orders set status = 'held' where id = :id")}
    )
    for at, status in ((T0 + H, "ok"), (T0 + 2 * H, "ok"), (T0 + 3 * H, "failed")):
        conn.execute(
            "INSERT INTO slawatch.action (rule, key, episode, n, status, at)"
            " VALUES ('order_unshipped', %s, 1, 1, %s, %s)",
            (str(at.hour), status, at),
        )
    conn.execute(  # another rule's attempt is not this rule's
        "INSERT INTO slawatch.action (rule, key, episode, n, status, at)"
        " VALUES ('job_hung', '1', 1, 1, 'failed', %s)",
        (T0 + H,),
    )
    q = query([acting], rule=None, since="1d", by="day", now=T0 + 25 * H)
    got = db.run("report", lambda c: report(c, q)).rows
    assert [(r.actions_ok, r.actions_failed) for r in got] == [(2, 1), (0, 0)]
    assert as_table(db.run("report", lambda c: report(c, q))).splitlines()[1].endswith("2/1")


def test_an_event_rules_due_counts_its_timers(conn: Conn, db: Database) -> None:
    """parcel_undelivered (72 h from parcel_shipped): the timers' deadlines, through the
    index migrate gives every timer table."""
    rules = shop(conn)
    for key, at in (("p1", T0 - 72 * H + H), ("p2", T0 - 72 * H + 2 * H), ("p3", T0 - 48 * H)):
        conn.execute(
            "SELECT slawatch.event('parcel_shipped', %s, %s, '{}', %s)", (key, at, "id-" + key)
        )
    q = query([rules["parcel_undelivered"]], rule=None, since="1d", by="day", now=T0 + 25 * H)
    got = db.run("report", lambda c: report(c, q))
    assert [r.due for r in got.rows] == [2, 1]
    assert got.notes == []


# ---------------------------------------------------------------- due as the claim has it


def test_a_calendar_rules_due_falls_when_its_working_time_has_passed(
    conn: Conn, db: Database
) -> None:
    """Tickets opened every 37 minutes from Friday 00:00 to Monday 20:00 (Berlin), never
    answered; 2 h of office time (mon-fri 09-17, Tuesday 1 December a holiday). Each falls
    due when its working time has passed: on Friday if opened by 15:00, on Monday if
    opened by Monday 15:00, else on Wednesday; never at the weekend, as wall-clock
    ``deadline + after`` would have it. Per hour, ``due`` is what the claim's history
    says fell due (every ticket was breached)."""
    conn.execute(calendar_test.TICKETS)
    conn.execute("CREATE INDEX tickets_opened_at ON tickets (opened_at)")  # so due is counted
    rule = calendar_test.ticket_rule("inline")
    migrate(conn, [rule])
    berlin = calendar_test.berlin
    first, last = berlin(2026, 11, 27), berlin(2026, 11, 30, 20)
    opened = [first + i * 37 * M for i in range(int((last - first) / (37 * M)) + 1)]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO tickets VALUES (%s, %s, NULL)", [(i, t) for i, t in enumerate(opened)]
        )
    now = berlin(2026, 12, 3, 12)
    assert claim_all(conn, plans(conn, {rule.name: rule})[rule.name], now) == len(opened)
    while fill_due(conn, rule):  # the history's due_at, as a drain gives it
        pass

    def report_by(by: str) -> list[ReportRow]:
        q = query([rule], rule=None, since="7d", by=by, now=now)
        got = db.run("report", lambda c: report(c, q))
        assert got.notes == []
        return got.rows

    friday, monday = berlin(2026, 11, 27, 15), berlin(2026, 11, 30, 15)
    expected = {
        datetime(2026, 11, 27, tzinfo=UTC): sum(t <= friday for t in opened),
        datetime(2026, 11, 30, tzinfo=UTC): sum(friday < t <= monday for t in opened),
        datetime(2026, 12, 2, tzinfo=UTC): sum(t > monday for t in opened),
    }
    days = report_by("day")
    assert {r.period: r.due for r in days if r.due} == expected
    assert [r.due for r in days] == [r.breached for r in days]
    assert {r.compliance for r in days if r.due} == {0.0}
    hours = report_by("hour")
    assert [r.due for r in hours] == [r.breached for r in hours]
    assert sum(r.due or 0 for r in hours) == len(opened)


def test_an_expression_deadline_is_counted_through_an_index_on_it(
    conn: Conn, db: Database, track: str
) -> None:
    """tickets: created_at in UTC wall time plus each ticket's own SLA hours (a
    ``timestamp`` expression), 30 min after. Counted through an index on the expression
    written another way; without one, or without the rule's own index on it (migrate
    makes it; both ways to track have one), the report says why."""
    rule = expr_test.rule(track)
    own = rule.first_index if track == "inline" else rule.due_index
    expr_test.fill(conn, 300)  # 300 tickets created every 7 minutes before NOW
    q = query([rule], rule=None, since="2d", by="hour", now=expr_test.NOW)

    def got() -> Any:
        return db.run("report", lambda c: report(c, q))

    migrate(conn, [rule])
    if track == "table":  # migrate made the report's index too (test_due_of_a_table_rule...)
        assert got().notes == []
        conn.execute(f"DROP INDEX {rule.deadline_index}")
    (note,) = got().notes
    assert note == (
        f"ticket_late: due not counted: no index on public.tickets (({expr_test.IN_UTC}))"
        " for every row; create one to count it"
    )
    # The same expression, written without the parentheses (AT binds tighter than +).
    conn.execute(
        "CREATE INDEX tickets_due ON tickets"
        " ((created_at at time zone 'UTC' + make_interval(hours => sla_hours)))"
    )
    counted = got()
    assert counted.notes == []
    conn.execute(f"DROP INDEX {own}")  # no index of the rule's to compare with
    (note,) = got().notes
    assert note == (
        f"ticket_late: due not counted: the rule's index {own} on its deadline"
        " expression is not there (slawatch migrate makes it)"
    )
    due: dict[datetime, int] = {}
    for g in range(1, 301):  # every ticket, open or closed: deadline + 30 min
        created = expr_test.NOW - g * 7 * M
        at = created + (1 + g % 48) * H + 30 * M
        period = at.replace(minute=0, second=0, microsecond=0)
        if q.start <= period < q.until:
            due[period] = due.get(period, 0) + 1
    assert {r.period: r.due for r in counted.rows if r.due} == due


NOTED = """
CREATE FUNCTION noted(t timestamptz) RETURNS timestamptz IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
    -- What the session is like when the report reads this row's deadline.
    RAISE NOTICE 'read_only=% jit=% begun_before=%', current_setting('transaction_read_only'),
        current_setting('jit'), transaction_timestamp() < statement_timestamp();
    RETURN t;
END $$"""


def test_the_report_reads_in_one_read_only_transaction_without_jit(conn: Conn, dsn: str) -> None:
    """A deadline expression that tells, for each row it is evaluated on, how the
    session reading it is set: the count of ``due`` runs read-only, JIT off, in the
    transaction that read the history before it."""
    conn.execute(calendar_test.TICKETS)
    conn.execute(NOTED)
    rule = calendar_test.ticket_rule("inline", deadline="noted(opened_at)", calendar=None)
    migrate(conn, [rule])
    conn.execute("CREATE INDEX tickets_noted ON tickets (noted(opened_at))")
    conn.execute("INSERT INTO tickets VALUES (1, %s, NULL)", (T0 + H,))
    seen: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as reader:
        reader.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        q = query([rule], rule=None, since="1d", by="day", now=T0 + 25 * H)
        got = report(reader, q)
    assert [r.due for r in got.rows] == [1, 0] and got.notes == []
    assert seen and set(seen) == {"read_only=on jit=off begun_before=t"}


# ---------------------------------------------------------------- the CLI's configuration


def _calendar_config(tmp_path: Path, calendar: str = "office", notify: str = "console") -> None:
    for folder in ("rules", "notifiers", "calendars"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notifiers" / "console.yaml").write_text("type: console\n")
    (tmp_path / "rules" / "ticket_unanswered.yaml").write_text(
        "table: tickets\nkey: id\ndeadline: opened_at\nafter: 2h\n"
        f"open_when: answered_at IS NULL\nnotify: [{notify}]\ncalendar: {calendar}\n"
    )
    (tmp_path / "calendars" / "office.yaml").write_text(
        "timezone: Europe/Berlin\nhours: {mon-fri: '09:00-17:00'}\n"
    )


def test_cli_report_counts_a_calendar_rules_due_in_working_time(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """`slawatch report` loads the rules as every command does, with their calendars: a
    ticket opened on a Saturday at 12:00 (Berlin) falls due on Monday at 11:00, not on
    Saturday at 14:00."""
    _calendar_config(tmp_path)
    conn.execute(calendar_test.TICKETS)
    conn.execute("CREATE INDEX tickets_opened_at ON tickets (opened_at)")
    assert slawatch("migrate", dsn=dsn, cwd=tmp_path).returncode == 0
    today = datetime.now(UTC).date() - timedelta(days=9)
    saturday = today - timedelta(days=(today.weekday() - 5) % 7)  # 9 to 15 days ago
    conn.execute(
        "INSERT INTO tickets VALUES (1, %s, NULL)",
        (datetime(saturday.year, saturday.month, saturday.day, 12, tzinfo=calendar_test.BERLIN),),
    )
    out = slawatch("report", "--since", "16d", "--format", "json", dsn=dsn, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["notes"] == []
    monday = (saturday + timedelta(days=2)).isoformat()
    assert {r["period"][:10]: r["due"] for r in body["rows"] if r["due"]} == {monday: 1}


@pytest.mark.parametrize(
    ("calendar", "notify", "text"),
    [
        ("ofice", "console", "rules/ticket_unanswered.yaml: calendar: unknown calendar 'ofice'"),
        ("office", "pager", "rules/ticket_unanswered.yaml: notify: unknown notifier 'pager'"),
    ],
)
def test_cli_report_refuses_a_broken_config_as_check_does(
    dsn: str, tmp_path: Path, calendar: str, notify: str, text: str
) -> None:
    """The same one line and exit 2 as `check`, before any database is read."""
    _calendar_config(tmp_path, calendar, notify)
    assert_one_line_error(slawatch("check", cwd=tmp_path), 2, text)
    assert_one_line_error(slawatch("report", dsn=dsn, cwd=tmp_path), 2, text)


def test_a_timestamp_deadline_in_the_hour_summer_time_ends_counts_once(
    conn: Conn, db: Database
) -> None:
    """Wall-time (``timestamp``) deadlines in Berlin, 5 min of a UTC calendar that stops
    from 01:10 to 01:55 on Sunday 25 October 2026, when Berlin's clocks go back from
    03:00 to 02:00 (01:00 UTC). The claim's cutoffs at the hours 00:00 to 04:00 UTC, as
    wall times: 01:55, 02:55, 02:10 (back: 01:10 UTC is 02:10 in winter time), 03:55,
    04:55. Each deadline counts once, in the period at whose end the claim first has it
    due: 02:00 and 02:30 by 01:00 UTC (period 00:00), 02:58 and 03:30 by 03:00 (period
    02:00), 04:00 by 04:00 (period 03:00); none in period 01:00."""
    conn.execute("CREATE TABLE runs (id integer PRIMARY KEY, due timestamp NOT NULL)")
    conn.execute("CREATE INDEX runs_due ON runs (due)")
    rule = Rule.model_validate(
        {
            "name": "run_late",
            "table": "runs",
            "key": "id",
            "deadline": "due",
            "after": "5m",
            "open_when": "true",
            "notify": ["console"],
            "timezone": "Europe/Berlin",
            "calendar": "clock",
        }
    )
    clock = Calendar.model_validate(
        {
            "name": "clock",
            "timezone": "UTC",
            "hours": {"mon-sat": "00:00-24:00", "sun": "00:00-01:10, 01:55-24:00"},
        }
    )
    check_calendar_names([rule], {"clock": clock})
    migrate(conn, [rule])
    for i, wall in enumerate(("02:00", "02:30", "02:58", "03:30", "04:00")):
        conn.execute("INSERT INTO runs VALUES (%s, %s)", (i, f"2026-10-25 {wall}"))
    sunday = datetime(2026, 10, 25, tzinfo=UTC)
    q = query([rule], rule=None, since="3h", by="hour", now=sunday + 3 * H)
    got = db.run("report", lambda c: report(c, q))
    assert [(r.period, r.due) for r in got.rows] == [
        (sunday, 2),
        (sunday + H, 0),
        (sunday + 2 * H, 2),
        (sunday + 3 * H, 1),
    ]


def test_due_not_counted_when_the_deadline_or_table_is_gone(conn: Conn, db: Database) -> None:
    """Renamed or dropped since migrate: one note each, and the history's figures still."""
    rules = shop(conn)
    gone = rules["job_hung"].model_copy(update={"table": "public.nowhere"})
    conn.execute("ALTER TABLE orders RENAME COLUMN paid_at TO paid_on")
    q = query([rules["order_unshipped"], gone], rule=None, since="1d", by="day", now=T0)
    got = db.run("report", lambda c: report(c, q))
    assert {r.due for r in got.rows} == {None}
    assert got.notes == [
        "job_hung: due not counted: public.nowhere is not there",
        "order_unshipped: due not counted: its deadline paid_at is not a timestamp of"
        " public.orders",
    ]


def test_due_of_a_table_rule_is_counted_on_a_fresh_database(conn: Conn, db: Database) -> None:
    """track: table out of the box: migrate builds the rule's index on the deadline of every
    row (printed by --print, CONCURRENTLY), so compliance is counted with no index made
    by the operator; a rule runs without it, and an identical index of the operator's is
    used instead of a second one."""
    rules = shop(conn, "table")  # migrated: no CREATE INDEX of ours
    rule = rules["order_unshipped"]
    plan = plans(conn, rules)["order_unshipped"]
    for order in (1, 2, 3, 4):
        paid(conn, order, T0 + H)
    ship(conn, 4)  # due at 01:00, shipped before: due, never breached
    claim_all(conn, plan, T0 + H + M)
    (day0,) = rows(db, rules, since="1h", by="day", now=T0 + 2 * H)
    assert (day0.due, day0.breached, day0.compliance) == (4, 3, pytest.approx(1 - 3 / 4))

    info = rule_table(conn, rule)
    assert info is not None
    conn.execute(f"DROP INDEX {rule.deadline_index}")
    assert pending(conn, rule, info) == []  # the claim does not need it
    (step,) = [s for s in plan_rule(conn, rule, info) if rule.deadline_index in s.done]
    assert step.statement == (
        f'CREATE INDEX CONCURRENTLY "{rule.deadline_index}" ON "public"."orders" ("paid_at")'
    )
    assert step.statement + ";" in render([rule], plan_rule(conn, rule, info))
    conn.execute("CREATE INDEX orders_paid_at ON orders (paid_at)")  # the operator's own
    assert plan_rule(conn, rule, info) == []
    assert migrate(conn, [rule]) == []
    (day0,) = rows(db, rules, since="1h", by="day", now=T0 + 2 * H)
    assert day0.due == 4


def test_cli_report_of_a_table_rule_on_a_fresh_database_and_its_chart(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """The shop's tables, `slawatch migrate` of a track: table rule, no index of the
    operator's: `report` counts compliance; `--format html -o FILE` writes one page with the
    chart (one bar per period, the rule named), `--format svg` the chart alone."""
    conn.execute(SHOP)
    rules = tmp_path / "rules"
    rules.mkdir()
    text = (ROOT / "rules" / "order_unshipped.yaml").read_text()
    (rules / "order_unshipped.yaml").write_text(f"{text}\ntrack: table\n")
    done = slawatch("--rules", str(rules), "migrate", dsn=dsn)
    assert done.returncode == 0, done.stderr
    assert "built index sw_order_unshipped_deadline" in done.stdout
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - 24 * H
    for order in (1, 2, 3, 4):  # due yesterday at 01:00; not claimed: none breached
        paid(conn, order, day + H)

    def report_(*args: str) -> subprocess.CompletedProcess[str]:
        return slawatch("--rules", str(rules), "report", "--since", "1d", *args, dsn=dsn)

    table = report_()
    assert table.returncode == 0, table.stderr
    first = table.stdout.splitlines()[1].split()
    assert first[:5] == ["order_unshipped", day.strftime("%Y-%m-%d"), "4", "0", "100.0%"]
    page = tmp_path / "sla.html"
    wrote = report_("--format", "html", "-o", str(page))
    assert wrote.returncode == 0, wrote.stderr
    html = page.read_text()
    body = html[html.index("<svg") : html.index("</svg>") + len("</svg>")]
    chart = ET.fromstring(body)
    assert chart.get("data-rule") == "order_unshipped"
    ns = "{http://www.w3.org/2000/svg}"
    assert len(chart.findall(f"{ns}rect")) == 2  # yesterday and today
    assert chart.find(f"{ns}polyline") is not None  # compliance known
    svg = report_("--format", "svg")
    assert svg.returncode == 0, svg.stderr
    assert len(ET.fromstring(svg.stdout).findall(f"{ns}g/{ns}svg/{ns}rect")) == 2
    missing = report_("--format", "html", "-o", str(tmp_path / "no" / "sla.html"))
    assert_one_line_error(missing, 2, "--output: ")


def test_a_partitioned_table_rule_gets_its_report_index_in_each_partition(
    conn: Conn, db: Database
) -> None:
    """On a partitioned table the report's index is built as the claim's are (ON ONLY the
    parent, CONCURRENTLY in each partition, attached), and counts every partition's rows."""
    part.partitioned_orders(conn)
    rule = part.rule(track="table")
    done = migrate(conn, [rule])
    assert f"public.orders: built index {rule.deadline_index} (3 partitions)" in done
    for i, day in enumerate(("2026-01-10", "2026-02-10", "2026-02-10")):
        conn.execute("INSERT INTO orders VALUES (%s, 'paid', %s)", (i, day))
    q = query([rule], rule=None, since="40d", by="week", now=datetime(2026, 2, 14, tzinfo=UTC))
    got = db.run("report", lambda c: report(c, q))
    assert got.notes == []
    assert sum(r.due or 0 for r in got.rows) == 3


def test_report_output_is_written_whole_or_not_at_all(conn: Conn, dsn: str, tmp_path: Path) -> None:
    """`report -o FILE` that cannot write the whole report (here a file size limit, as a
    full disk would) is one line, exit 2, and leaves FILE as it was: it used to truncate
    last week's report and leave the first 1,024 bytes of the new one. `-o -` is stdout."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "backup.yaml").write_text("events: {beat: backup_ok, within: 1h}\nnotify: [console]\n")
    assert slawatch("--rules", str(rules), "migrate", dsn=dsn).returncode == 0
    page = tmp_path / "sla.html"
    page.write_text("last week's report\n")
    page.chmod(0o640)
    config = ["--rules", str(rules), "--notifiers", str(ROOT / "notifiers")]
    args = [sys.executable, "-m", "slawatch", *config, "report", "--format", "html"]

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    cut = subprocess.run(
        [*args, "-o", "sla.html"],
        cwd=tmp_path,
        env=clean_env() | {"SLAWATCH_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=small_files,
    )
    assert_one_line_error(cut, 2, "--output: 'sla.html': File too large")
    assert page.read_text() == "last week's report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules", "sla.html"]  # no temp left
    whole = slawatch(*config, "report", "--format", "html", "-o", str(page), dsn=dsn)
    assert whole.returncode == 0, whole.stderr
    assert page.read_text().startswith("<!doctype html>") and len(page.read_text()) > 1024
    assert stat.S_IMODE(page.stat().st_mode) == 0o640
    out = slawatch(*config, "report", "--format", "svg", "-o", "-", dsn=dsn, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("<svg"), out
    assert not (tmp_path / "-").exists()
