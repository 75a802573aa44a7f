"""The claim with SLAWATCH_OUTBOX=rows (docs/explanation/outbox-rows.md): rows of up to
100 alerts in slawatch.outbox_row and a send per notifier of each row, nothing in
slawatch.alert or slawatch.delivery. Each test runs two rules alike on one table,
`today` in today's outbox and `rowed` in rows, and compares what each wrote: the
rows' elements are today's alerts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from slawatch.actions.run import runner
from slawatch.config.notifiers import ConsoleConfig, load_notifiers
from slawatch.config.rules import TRUNCATED, Rule, check_calendar_names
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier
from slawatch.delivery.notifiers.base import BaseNotifier
from slawatch.engine.abandon import give_up
from slawatch.engine.claim import ClaimPlan, DrainResult, drain, plan_claim
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.engine.statetable import state_table
from slawatch.operate.explain import explain
from slawatch.operate.inspect import get_alert, list_alerts
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_calendar_claim import berlin, office

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
SWEPT = 11 * M  # past a table rule's default sweep (10 minutes)
DUE = T0 + H + 5 * M  # every order paid from T0 to T0 + 5 min is due

TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz, note text
);
CREATE TABLE acted (id bigint, at timestamptz DEFAULT clock_timestamp())"""


def rule(name: str, track: str, **fields: Any) -> Rule:
    """A paid order ships within an hour; reminded every 6 h, 3 times at most; from #2
    critical, and to the pager instead of the console."""
    base: dict[str, Any] = {
        "name": name,
        "table": "public.orders",
        "track": track,
        "key": "id",
        "deadline": "paid_at",
        "after": "1h",
        "open_when": "status = 'paid'",
        "renotify": {"every": "6h", "max": 3},
        "columns": ["id", "paid_at", "note"],
        "notify": ["console"],
        "escalate": [{"from": 2, "severity": "critical", "notify": ["pager"]}],
    }
    return Rule.model_validate(base | fields)


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=1) as d:
        yield d


def pair(conn: Conn, track: str, act: bool = False, **fields: Any) -> tuple[ClaimPlan, ClaimPlan]:
    """The plans of `today` (SLAWATCH_OUTBOX=alerts) and `rowed` (rows), alike."""
    conn.execute(TABLE)
    today, rowed = rule("today", track, **fields), rule("rowed", track, **fields)
    migrate(conn, [today, rowed])
    plans = prepare(conn, today, outbox="alerts"), prepare(conn, rowed, outbox="rows")
    if act:
        return plans[0].with_act(runner("on")), plans[1].with_act(runner("on"))
    return plans


def both(db: Database, plans: tuple[ClaimPlan, ClaimPlan], at: datetime) -> list[DrainResult]:
    return [drain(db, plan, FixedClock(at)) for plan in plans]


def orders(conn: Conn, ids: range, paid: datetime, note: str = "") -> None:
    conn.execute(
        "INSERT INTO orders SELECT i, 'paid', %s::timestamptz + (i %% 60) * interval '1 second', %s"
        " FROM unnest(%s::bigint[]) AS i",
        (paid, note, list(ids)),
    )


Element = tuple[str, int, int, str, Any, Any, list[str]]


def elements(conn: Conn, kind: str = "firing", since: datetime | None = None) -> list[Element]:
    """(key, episode, n, severity, deadline, row_data, notifiers) of every element of
    `rowed`'s rows of ``kind`` (fired at ``since`` or later)."""
    rows = conn.execute(
        "SELECT u.key, u.episode, u.n, u.severity, u.deadline, u.row_data, r.notifiers"
        "  FROM slawatch.outbox_row r,"
        "       unnest(r.keys, r.episodes, r.ns, r.severities, r.deadlines, r.row_data)"
        "         AS u(key, episode, n, severity, deadline, row_data)"
        " WHERE r.rule = 'rowed' AND r.kind = %s AND r.fired_at >= %s",
        (kind, since or T0),
    ).fetchall()
    return sorted(((k, e, n, s, d, r, sorted(ns)) for k, e, n, s, d, r, ns in rows), key=order)


def alerts(conn: Conn, kind: str = "firing", since: datetime | None = None) -> list[Element]:
    """The same of `today`'s alerts, with the notifiers of their deliveries."""
    rows = conn.execute(
        "SELECT a.key, a.episode, a.n, a.severity, a.deadline, a.row_data,"
        "       array_agg(d.notifier ORDER BY d.notifier)"
        "  FROM slawatch.alert a JOIN slawatch.delivery d ON d.alert_id = a.id"
        " WHERE a.rule = 'today' AND a.kind = %s AND a.fired_at >= %s GROUP BY a.id",
        (kind, since or T0),
    ).fetchall()
    return sorted(((k, e, n, s, d, r, list(ns)) for k, e, n, s, d, r, ns in rows), key=order)


def order(e: Element) -> tuple[str, int, int]:
    return e[0], e[1], e[2]


def nothing_of_today(conn: Conn) -> None:
    """`rowed` wrote no alert and no delivery."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM slawatch.alert WHERE rule = 'rowed'),"
        " (SELECT count(*) FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id"
        "   WHERE a.rule = 'rowed')"
    ).fetchone()
    assert row == (0, 0)


def history(conn: Conn, name: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT key, episode, deadline, due_at, notified_at, ended_at FROM slawatch.episode"
        " WHERE rule = %s ORDER BY key, episode",
        (name,),
    ).fetchall()


def test_rows_of_100_hold_todays_alerts(conn: Conn, db: Database, track: str, dsn: str) -> None:
    plans = pair(conn, track)
    orders(conn, range(1, 251), T0)
    today = drain(db, plans[0], FixedClock(DUE))
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN slawatch_delivery")
        rowed = drain(db, plans[1], FixedClock(DUE))
        # The claim's NOTIFY wakes the delivery workers at its commit.
        woken = list(listener.notifies(timeout=30, stop_after=1))
    assert [n.channel for n in woken] == ["slawatch_delivery"]
    assert (rowed.claimed, rowed.severities) == (today.claimed, today.severities)
    assert (rowed.claimed, rowed.severities) == (250, {"warning": 250})
    got = elements(conn)
    assert len(got) == 250 and got == alerts(conn)
    sizes = conn.execute(
        "SELECT cardinality(keys), kind, fired_at, after, notifiers FROM slawatch.outbox_row"
        " WHERE rule = 'rowed' ORDER BY 1 DESC"
    ).fetchall()
    assert sizes == [(n, "firing", DUE, H, ["console"]) for n in (100, 100, 50)]
    # Each row's elements in deadline order.
    for (deadlines,) in conn.execute(
        "SELECT deadlines FROM slawatch.outbox_row WHERE rule = 'rowed'"
    ).fetchall():
        assert deadlines == sorted(deadlines)
    sends = conn.execute(
        "SELECT s.notifier, s.status, s.attempts, s.done, s.next_attempt_at, s.lease_owner,"
        "       s.skipped FROM slawatch.outbox_send s JOIN slawatch.outbox_row r ON r.id = s.row_id"
        " WHERE r.rule = 'rowed'"
    ).fetchall()
    assert sends == [("console", "pending", 0, 0, DUE, None, None)] * 3
    nothing_of_today(conn)
    assert history(conn, "rowed") == history(conn, "today") and len(history(conn, "rowed")) == 250


def test_renotifications_and_tiers_make_rows_of_their_own(
    conn: Conn, db: Database, track: str
) -> None:
    """One claim writes #2 of orders 1-3 (critical, to the pager) and #1 of orders 4-5
    (to the console): two rows, one per set of notifiers."""
    plans = pair(conn, track)
    orders(conn, range(1, 4), T0)
    both(db, plans, DUE)
    at = DUE + 6 * H + S
    orders(conn, range(4, 6), T0 + 6 * H)
    today, rowed = both(db, plans, at)
    assert rowed.claimed == today.claimed == 5
    assert rowed.severities == today.severities == {"warning": 2, "critical": 3}
    assert elements(conn, since=at) == alerts(conn, since=at)
    rows = conn.execute(
        "SELECT notifiers, keys, ns, severities, fired_at FROM slawatch.outbox_row"
        " WHERE rule = 'rowed' AND fired_at = %s ORDER BY notifiers",
        (at,),
    ).fetchall()
    assert [(n, sorted(k), ns, s) for n, k, ns, s, _ in rows] == [
        (["console"], ["4", "5"], [1, 1], ["warning"] * 2),
        (["pager"], ["1", "2", "3"], [2, 2, 2], ["critical"] * 3),
    ]
    sends = conn.execute(
        "SELECT r.notifiers, s.notifier FROM slawatch.outbox_send s"
        " JOIN slawatch.outbox_row r ON r.id = s.row_id WHERE r.fired_at = %s ORDER BY 2",
        (at,),
    ).fetchall()
    assert sends == [(["console"], "console"), (["pager"], "pager")]
    nothing_of_today(conn)


def test_a_first_notification_whose_episode_is_recorded_is_not_written_again(
    conn: Conn, db: Database, track: str
) -> None:
    """Alert once without an index entry per alert: #1 only where the claim's insert of
    the episode's row did not conflict (tracking state restored from before it, say).
    A later notification is written as ever."""
    plans = pair(conn, track)
    orders(conn, range(1, 3), T0)
    conn.execute(
        "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)"
        " VALUES ('rowed', '1', 1, %s, %s, %s)",
        (T0 + S, T0 + H + S, T0 + H + S),
    )
    today, rowed = both(db, plans, DUE)
    assert (today.claimed, rowed.claimed) == (2, 1)
    assert rowed.severities == {"warning": 1}
    assert [(k, e, n) for k, e, n, *_ in elements(conn)] == [("2", 1, 1)]
    # The episode's row is as it was: written by whoever notified #1.
    assert history(conn, "rowed")[0][4] == T0 + H + S
    at = DUE + 6 * H + S
    today, rowed = both(db, plans, at)
    assert rowed.claimed == today.claimed == 2
    assert elements(conn, since=at) == alerts(conn, since=at)
    assert [(k, n) for k, _, n, *_ in elements(conn, since=at)] == [("1", 2), ("2", 2)]


@pytest.mark.parametrize(
    ("track", "sweep"),
    [("inline", None), ("table", "10m"), ("table", "1d")],
    ids=["inline", "table-swept", "table-at-renotification"],
)
def test_resolved_notices_once_per_episode(
    conn: Conn, db: Database, track: str, sweep: str | None
) -> None:
    """Order 1 ships and order 2's deadline moves to a time already due, both after #2
    (the pager's): each episode gets one resolved notice, n = 0, to the console and the
    pager (every notifier paged in it). A table rule ends order 2's episode in its claim
    (a new episode opened over it), order 1's in its sweep or, with a day between
    sweeps, in the claim at order 1's re-notification time."""
    fields: dict[str, Any] = {"resolve": True}
    if sweep is not None:
        fields["sweep"] = sweep
    plans = pair(conn, track, **fields)
    orders(conn, range(1, 4), T0)
    both(db, plans, DUE)
    t2 = DUE + 6 * H + S
    both(db, plans, t2)
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 2", (t2 - H - 10 * S,))
    for t in (t2 + M, t2 + SWEPT, t2 + 2 * SWEPT, t2 + 6 * H + S, t2 + 6 * H + SWEPT):
        both(db, plans, t)
    got = elements(conn, "resolved")
    assert got == alerts(conn, "resolved")
    assert [(k, e, n, s, ns) for k, e, n, s, _, _, ns in got] == [
        ("1", 1, 0, "critical", ["console", "pager"]),
        ("2", 1, 0, "critical", ["console", "pager"]),
    ]
    assert got[0][5]["id"] == 1 and got[1][5]["id"] == 2  # the rows' data
    # A send per notifier of each row (one row for both inline, ended in one claim).
    sends = conn.execute(
        "SELECT r.notifiers, array_agg(s.notifier ORDER BY s.notifier), s.next_attempt_at"
        "       = r.fired_at FROM slawatch.outbox_row r JOIN slawatch.outbox_send s"
        " ON s.row_id = r.id WHERE r.rule = 'rowed' AND r.kind = 'resolved' GROUP BY r.id, 3"
    ).fetchall()
    assert len(sends) == (1 if track == "inline" else 2)
    assert all(sorted(n) == s and due for n, s, due in sends)
    nothing_of_today(conn)
    assert history(conn, "rowed") == history(conn, "today")


@pytest.mark.parametrize("track", ["inline", "table"])
def test_no_resolved_notice_for_an_episode_ended_already(
    conn: Conn, db: Database, track: str
) -> None:
    """A resolved notice only from the statement that ends its episode in the history:
    an episode whose history says it ended (tracking state restored from before its end,
    say) is closed without another notice."""
    plans = pair(conn, track, resolve=True)
    orders(conn, range(1, 3), T0)
    both(db, plans, DUE)
    conn.execute(
        "UPDATE slawatch.episode SET ended_at = %s WHERE rule = 'rowed' AND key = '1'",
        (DUE + M,),
    )
    conn.execute("UPDATE orders SET status = 'shipped'")
    for t in (DUE + SWEPT, DUE + 2 * SWEPT):
        both(db, plans, t)
    assert [k for k, *_ in alerts(conn, "resolved")] == ["1", "2"]
    assert [k for k, *_ in elements(conn, "resolved")] == ["2"]


def tracked(plan: ClaimPlan) -> tuple[sql.Composable, list[str]]:
    """The table of the rule's tracking state, and its columns (seen, episode, n, next)."""
    r = plan.rule
    if r.track == "table":
        return state_table(r), ["sw_seen", "sw_ep", "sw_n", "sw_next"]
    return sql.Identifier("orders"), [r.seen_column, r.episode_column, r.n_column, r.next_column]


def tracking(conn: Conn, plan: ClaimPlan) -> list[tuple[Any, ...]]:
    """The rule's tracking state of each order, as text (`next` is infinity once given up)."""
    table, cols = tracked(plan)
    query = sql.SQL("SELECT id, {} FROM {}").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in cols), table
    )
    return conn.execute(query).fetchall()


def restore(conn: Conn, plan: ClaimPlan, saved: list[tuple[Any, ...]]) -> None:
    """Put back the rule's tracking state of ``tracking`` (as a backup restored would)."""
    table, cols = tracked(plan)
    types = ["timestamptz", "integer", "integer", "timestamptz"]
    update = sql.SQL("UPDATE {} SET {} WHERE id = %s").format(
        table,
        sql.SQL(", ").join(
            sql.SQL("{} = %s::text::{}").format(sql.Identifier(c), sql.SQL(t))
            for c, t in zip(cols, types, strict=True)
        ),
    )
    for row_id, *values in saved:
        conn.execute(update, (*values, row_id))


def test_an_episode_given_up_gets_its_resolved_notice_once(
    conn: Conn, db: Database, track: str
) -> None:
    """give_up_after ends the episode in the history, without a notice; when its row
    completes later, rows write its resolved notice as today's outbox does, once: the
    statement that writes it records so in the history (resolved_notice_at), and the
    same end found again (tracking state restored from before it) writes no second."""
    plans = pair(conn, track, resolve=True, give_up_after="1d")
    orders(conn, range(1, 3), T0)
    both(db, plans, DUE)
    given_up = DUE + 2 * 24 * H
    assert give_up(db, list(plans), given_up) == {"today": 2, "rowed": 2}
    saved = [tracking(conn, plan) for plan in plans]
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    for t in (given_up + SWEPT, given_up + 2 * SWEPT):
        both(db, plans, t)
    got = elements(conn, "resolved")
    assert [(k, e, n, s, ns) for k, e, n, s, _, _, ns in got] == [
        ("1", 1, 0, "warning", ["console"])
    ]
    assert got == alerts(conn, "resolved")
    ended = conn.execute(
        "SELECT key, ended_at, abandoned, resolved_notice_at FROM slawatch.episode"
        " WHERE rule = 'rowed' ORDER BY key"
    ).fetchall()
    assert ended == [("1", given_up, True, given_up + SWEPT), ("2", given_up, True, None)]
    for plan, state in zip(plans, saved, strict=True):
        restore(conn, plan, state)
    for t in (given_up + 3 * SWEPT, given_up + 4 * SWEPT):
        both(db, plans, t)
    assert elements(conn, "resolved") == got == alerts(conn, "resolved")
    assert history(conn, "rowed") == history(conn, "today")


def test_the_row_data_is_capped_as_today(conn: Conn, db: Database, track: str) -> None:
    plans = pair(conn, track)
    orders(conn, range(1, 2), T0, note="x" * 70_000)
    orders(conn, range(2, 3), T0, note="small")
    both(db, plans, DUE)
    got = elements(conn)
    assert got == alerts(conn)
    assert TRUNCATED in got[0][5] and "note" not in got[0][5] and got[0][5]["id"] == 1
    assert got[1][5]["note"] == "small"


def test_an_action_runs_as_today(conn: Conn, db: Database, track: str) -> None:
    """The action on #1 runs in the claim's transaction for each alert of the rows."""
    action = {"sql": "insert into acted (id) values (:id)"}
    plans = pair(conn, track, act=True, action=action)
    orders(conn, range(1, 4), T0)
    _, rowed = both(db, plans, DUE)
    assert rowed.claimed == 3
    acted = conn.execute(
        "SELECT rule, key, episode, n, status FROM slawatch.action ORDER BY rule, key"
    ).fetchall()
    assert acted == [(name, str(k), 1, 1, "ok") for name in ("rowed", "today") for k in range(1, 4)]
    assert conn.execute("SELECT count(*) FROM acted").fetchone() == (6,)
    # #2 owes no action: nothing more runs.
    both(db, plans, DUE + 6 * H + S)
    assert conn.execute("SELECT count(*) FROM acted").fetchone() == (6,)
    nothing_of_today(conn)


def test_a_webhook_action_has_its_alert_on_todays_tables(
    conn: Conn, db: Database, track: str
) -> None:
    """A webhook action is a delivery of an alert of today's outbox in both modes: with
    rows, its alerts are written there too (without deliveries to the notifiers)."""
    action = {"webhook": {"url": "http://127.0.0.1:9/hook"}}
    plans = pair(conn, track, act=True, action=action)
    orders(conn, range(1, 3), T0)
    both(db, plans, DUE)
    got = conn.execute(
        "SELECT x.key, x.status, d.notifier FROM slawatch.action x"
        " JOIN slawatch.delivery d ON d.id = x.delivery_id"
        " WHERE x.rule = 'rowed' ORDER BY x.key"
    ).fetchall()
    assert got == [("1", "pending", "action:rowed"), ("2", "pending", "action:rowed")]
    notifiers = conn.execute(
        "SELECT DISTINCT d.notifier FROM slawatch.delivery d"
        " JOIN slawatch.alert a ON a.id = d.alert_id WHERE a.rule = 'rowed'"
    ).fetchall()
    assert notifiers == [("action:rowed",)]
    assert len(elements(conn)) == 2


def test_an_event_rule_writes_rows(conn: Conn, db: Database) -> None:
    """An event rule's timers claim the same way: #1, #2, and the resolved notice when
    the stop comes, as elements of rows (the alerts of test_events.py's first test)."""
    rule = Rule.model_validate(
        {
            "name": "rowed",
            "events": {"start": "parcel_shipped", "stop": "parcel_delivered", "within": "72h"},
            "renotify": {"every": "12h", "max": 3},
            "notify": ["hook"],
            "resolve": True,
        }
    )
    migrate(conn, [rule])
    plan = prepare(conn, rule, outbox="rows")

    def event(kind: str, at: datetime, data: dict[str, Any] | None = None) -> None:
        conn.execute(
            "SELECT slawatch.event_at(%s, %s, '1Z', %s, %s::jsonb, NULL)",
            (at, kind, at, None if data is None else Jsonb(data)),
        )

    event("parcel_shipped", T0, {"to": "Berlin"})
    assert drain(db, plan, FixedClock(T0 + 72 * H - S)).claimed == 0
    assert drain(db, plan, FixedClock(T0 + 72 * H + S)).claimed == 1
    assert drain(db, plan, FixedClock(T0 + 84 * H + 2 * S)).claimed == 1
    event("parcel_delivered", T0 + 85 * H)
    assert drain(db, plan, FixedClock(T0 + 96 * H + 3 * S)).claimed == 0
    got = [(k, e, n, s, d, ns) for k, e, n, s, d, _, ns in elements(conn)]
    assert got == [
        ("1Z", 1, 1, "warning", T0 + 72 * H, ["hook"]),
        ("1Z", 1, 2, "warning", T0 + 72 * H, ["hook"]),
    ]
    assert elements(conn)[0][5]["data"] == {"to": "Berlin"}
    notices = [(k, e, n, ns) for k, e, n, _, _, _, ns in elements(conn, "resolved")]
    assert notices == [("1Z", 1, 0, ["hook"])]
    nothing_of_today(conn)


RULE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
open_when: "status = 'paid'"
notify: [console, hook]
"""


def slawatch(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``slawatch *args`` in a child process, with ``env`` the only SLAWATCH_ settings."""
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "slawatch", *args],
        cwd=ROOT,
        env=clean | {"SLAWATCH_HTTP": ""} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("slawatch: error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("track", ["inline"])
def test_rows_with_a_storm_pass_check(tmp_path: Path, dsn: str, track: str) -> None:
    """Storms fold the outbox's rows (tests/integration/test_outbox_rows_storm.py):
    SLAWATCH_OUTBOX=rows beside a notifier with `storm` is no longer refused."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(RULE)
    (tmp_path / "notifiers").mkdir()
    (tmp_path / "notifiers" / "console.yaml").write_text("type: console\n")
    hook = "type: webhook\nurl: http://127.0.0.1:9/hook\n"
    (tmp_path / "notifiers" / "hook.yaml").write_text(hook + "storm: 50\n")
    env = {
        "SLAWATCH_RULES_DIR": str(tmp_path / "rules"),
        "SLAWATCH_NOTIFIERS_DIR": str(tmp_path / "notifiers"),
        "SLAWATCH_DSN": dsn,
    }
    rows = env | {"SLAWATCH_OUTBOX": "rows"}
    # check goes on to the database (the table is not there), as with today's outbox.
    assert "SLAWATCH_OUTBOX" not in slawatch("check", env=rows).stderr
    line = one_error(slawatch("check", env=env | {"SLAWATCH_OUTBOX": "row"}))
    assert line == "slawatch: error: SLAWATCH_OUTBOX: Input should be 'alerts' or 'rows'"


def test_a_calendar_rule_plans_rows_with_due_times() -> None:
    """A row of a calendar rule has a due time per element (due_ats)."""
    late = rule("late", "inline", calendar="office")
    plan = plan_claim(late, "timestamp with time zone", outbox_in="rows")
    assert plan.rows and "due_ats" in plan.statement.as_string(None)


def dated(conn: Conn, db: Database, track: str) -> tuple[ClaimPlan, ClaimPlan]:
    """`today` and `rowed` with the office calendar (test_calendar_claim.py's: Berlin,
    Monday to Friday 09:00-17:00, 1 December a holiday): `after` counts working time."""
    conn.execute(TABLE)
    rules = [rule(n, track, calendar="office", resolve=True) for n in ("today", "rowed")]
    check_calendar_names(rules, {"office": office()})
    migrate(conn, rules)
    return prepare(conn, rules[0], outbox="alerts"), prepare(conn, rules[1], outbox="rows")


# Orders paid at (Berlin), and when their hour of working time has passed (None: the
# deadline is not finite, and so no due time, as today's alert has none).
PAID = [
    (1, berlin(2026, 11, 27, 16, 30), berlin(2026, 11, 30, 9, 30)),  # Friday, then Monday
    (2, berlin(2026, 11, 29, 12), berlin(2026, 11, 30, 10)),  # Sunday: from Monday 09:00
    (3, berlin(2026, 11, 30, 16, 30), berlin(2026, 12, 2, 9, 30)),  # Monday, then a holiday
    (4, "-infinity", None),
]


def element_dues(conn: Conn) -> list[tuple[str, int, int, str, Any]]:
    """(key, episode, n, kind, due_at) of every element of `rowed`'s rows, its due time
    as the readers take it (queries.sql)."""
    return conn.execute(
        "SELECT u.key, u.episode, u.n, r.kind, coalesce(r.due_ats[u.i], u.deadline + r.after)"
        "  FROM slawatch.outbox_row r, unnest(r.keys, r.episodes, r.ns, r.deadlines)"
        "       WITH ORDINALITY AS u(key, episode, n, deadline, i)"
        " WHERE r.rule = 'rowed' ORDER BY 1, 2, 3, 4"
    ).fetchall()


class Payloads(BaseNotifier):
    """Keeps what it is sent."""

    def __init__(self, name: str) -> None:
        super().__init__(ConsoleConfig(name=name, type="console"))
        self.got: list[dict[str, Any]] = []

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.got.extend(alerts)


def test_a_calendar_rule_writes_rows_with_each_alerts_due_time(
    conn: Conn, db: Database, track: str
) -> None:
    """A calendar's due times are each alert's own: a row of a calendar rule has no
    `after` and its elements' due times in due_ats, those today's alerts get (firing and
    resolved), filled in before the claim commits; the API's reads and the receivers
    see them."""
    plans = dated(conn, db, track)
    for key, paid, _ in PAID:
        conn.execute("INSERT INTO orders VALUES (%s, 'paid', %s, '')", (key, paid))
    at = berlin(2026, 12, 7, 12)
    rowed = drain(db, plans[1], FixedClock(at))
    assert drain(db, plans[0], FixedClock(at)).claimed == rowed.claimed == 4
    conn.execute("UPDATE orders SET status = 'shipped'")
    for t in (at + SWEPT, at + 2 * SWEPT):
        both(db, plans, t)
    want = [
        (str(key), 1, n, kind, due)
        for key, _, due in PAID
        for n, kind in ((0, "resolved"), (1, "firing"))
    ]
    assert element_dues(conn) == sorted(want)
    today = conn.execute(
        "SELECT key, episode, n, kind, due_at FROM slawatch.alert WHERE rule = 'today'"
        " ORDER BY 1, 2, 3, 4"
    ).fetchall()
    assert today == sorted(want)
    shapes = conn.execute(
        "SELECT kind, after, cardinality(due_ats) = cardinality(keys) FROM slawatch.outbox_row"
        " WHERE rule = 'rowed' ORDER BY kind"
    ).fetchall()
    assert shapes == [("firing", None, True), ("resolved", None, True)]
    nothing_of_today(conn)
    # The API's reads: the list, one alert by its number and by its idempotency id.
    page = list_alerts(conn, rule="rowed")
    assert sorted((a.key, a.n, a.due_at) for a in page.alerts) == sorted(
        (k, n, due) for k, _, n, _, due in want
    )
    for a in page.alerts:
        assert get_alert(conn, str(a.id)).due_at == a.due_at
        assert get_alert(conn, a.idempotency_id).due_at == a.due_at
    # The receivers: each alert's due_at as today's (the lease of the row's send).
    console = Payloads("console")
    deliver_notifier(db, console, FixedClock(at + 3 * SWEPT))
    sent = {
        r: sorted(
            (p["key"], p["n"], p["status"], p["due_at"]) for p in console.got if p["rule"] == r
        )
        for r in ("today", "rowed")
    }
    assert sent["rowed"] == sent["today"] and len(sent["rowed"]) == 8
    assert ("3", 1, "firing", "2026-12-02T08:30:00Z") in sent["rowed"]


def test_a_runner_with_rows_claims_into_rows_beside_a_storm(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """`slawatch run`'s Runner takes SLAWATCH_OUTBOX: its claims write rows, also after a
    reload that adds a notifier with `storm` (storms fold rows), and at a start with one."""
    conn.execute(TABLE)
    rowed = rule("rowed", "inline")
    migrate(conn, [rowed])
    orders(conn, range(1, 4), T0)
    for name in ("console", "pager"):
        (tmp_path / f"{name}.yaml").write_text("type: console\n")
    notifiers = load_notifiers(tmp_path)
    runner = Runner(dsn, [rowed], notifiers, clock=FixedClock(DUE), outbox="rows")
    try:
        assert runner.once().claimed == 3
        assert [(k, n) for k, _, n, *_ in elements(conn)] == [("1", 1), ("2", 1), ("3", 1)]
        nothing_of_today(conn)
        (tmp_path / "pager.yaml").write_text("type: console\nstorm: 50\n")
        stormy = load_notifiers(tmp_path)
        assert runner.apply([rowed], stormy) is True
        # The next due notifications go on into rows.
        orders(conn, range(4, 5), T0)
        assert runner.once().claimed == 1 and len(elements(conn)) == 4
    finally:
        runner.close()
    Runner(dsn, [rowed], stormy, clock=FixedClock(DUE), outbox="rows").close()


def cli_setup(tmp_path: Path, dsn: str) -> dict[str, str]:
    """A rules and a notifiers folder for the command line (the rule ``late`` to the
    console), and the environment that points ``slawatch`` at them and at ``dsn``."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(RULE.replace("[console, hook]", "[console]"))
    (tmp_path / "notifiers").mkdir()
    (tmp_path / "notifiers" / "console.yaml").write_text("type: console\n")
    return {
        "SLAWATCH_RULES_DIR": str(tmp_path / "rules"),
        "SLAWATCH_NOTIFIERS_DIR": str(tmp_path / "notifiers"),
        "SLAWATCH_DSN": dsn,
    }


@pytest.mark.parametrize("track", ["inline"])
def test_run_once_with_rows_writes_rows(conn: Conn, dsn: str, tmp_path: Path, track: str) -> None:
    conn.execute(TABLE)
    orders(conn, range(1, 4), T0)
    env = cli_setup(tmp_path, dsn)
    assert slawatch("migrate", env=env).returncode == 0
    done = slawatch("run", "--once", env=env | {"SLAWATCH_OUTBOX": "rows"})
    assert done.returncode == 0, done.stderr
    rows = conn.execute(
        "SELECT rule, kind, keys, notifiers FROM slawatch.outbox_row ORDER BY id"
    ).fetchall()
    assert [(r, k, sorted(keys), n) for r, k, keys, n in rows] == [
        ("late", "firing", ["1", "2", "3"], ["console"])
    ]
    assert conn.execute("SELECT count(*) FROM slawatch.alert").fetchone() == (0,)


def test_explain_shows_the_statement_that_writes_rows(
    conn: Conn, dsn: str, tmp_path: Path, track: str
) -> None:
    """`slawatch explain` plans the statements the process would run: with
    SLAWATCH_OUTBOX=rows, those that write the outbox in rows."""
    conn.execute(TABLE)
    late = rule("late", track, resolve=True)
    migrate(conn, [late])

    def writes(outbox: Outbox) -> set[str]:
        result = explain(conn, late, DUE, outbox=outbox)
        assert result.ok and result.outbox == outbox
        text = " ".join(s.sql for s in result.statements)
        return {t for t in ("slawatch.outbox_row", "slawatch.delivery") if f"INTO {t}" in text}

    assert writes("rows") == {"slawatch.outbox_row"}
    assert writes("alerts") == {"slawatch.delivery"}
    if track == "table":
        return
    env = cli_setup(tmp_path, dsn)
    shown = slawatch("explain", "late", env=env | {"SLAWATCH_OUTBOX": "rows"})
    assert shown.returncode == 0, shown.stderr
    assert "outbox: rows" in shown.stdout and "INSERT INTO slawatch.outbox_row" in shown.stdout
    assert "INSERT INTO slawatch.delivery" not in shown.stdout
    today = slawatch("explain", "late", env=env | {"SLAWATCH_OUTBOX": "alerts"})
    assert today.returncode == 0, today.stderr
    assert "outbox: rows" not in today.stdout and "INSERT INTO slawatch.delivery" in today.stdout
