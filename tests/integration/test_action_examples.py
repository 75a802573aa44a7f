"""The shipped example actions (rules/: job_hung, task_timeout, receipt_unconfirmed) do
what their files say on the demo shop, and ``run --dry-run`` lists exactly the actions
a claim then runs, with the values their statements are bound to."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.engine.due import dry_run
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, claim_all, episodes, shop
from tests.integration.test_cli import slawatch

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
DAY = timedelta(days=1)


def naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def recorded(conn: Conn, rule: str) -> list[tuple[Any, ...]]:
    """(key, n, status, rows, params) of every attempt of ``rule``'s action."""
    return conn.execute(
        "SELECT key, n, status, rows, params FROM slawatch.action WHERE rule = %s"
        " ORDER BY key::bigint",
        (rule,),
    ).fetchall()


def predicted(conn: Conn, rule: Rule, now: datetime) -> list[tuple[str, int, dict[str, Any]]]:
    """(key, n, params) of each action ``run --dry-run`` says the next claim runs."""
    (got,) = dry_run(conn, [rule], now)
    assert got.acts is not None
    rows, total = got.acts
    assert total == len(rows)
    return [(a.key, a.n, a.params) for a in rows]


def test_job_hung_restarts_the_job(conn: Conn, track: str) -> None:
    """Hung jobs go back to the queue marked 'hanged', once; the dry run listed them."""
    rule = shop(conn, track)["job_hung"]
    beat = naive(T0 - 20 * M)
    conn.execute(
        "INSERT INTO jobs (id, kind, worker, status, heartbeat_at) VALUES"
        " (1, 'mailer', 'w1', 'running', %(beat)s), (2, 'sync', 'w2', 'running', %(beat)s),"
        " (3, 'sync', 'w3', 'running', %(fresh)s), (4, 'sync', 'w4', 'done', %(beat)s)",
        {"beat": beat, "fresh": naive(T0)},
    )
    assert predicted(conn, rule, T0) == [("1", 1, {"id": "1"}), ("2", 1, {"id": "2"})]
    plan = prepare(conn, rule).with_act(runner("on"))
    assert claim_all(conn, plan, T0) == 2
    assert recorded(conn, "job_hung") == [
        ("1", 1, "ok", 1, {"id": "1"}),
        ("2", 1, "ok", 1, {"id": "2"}),
    ]
    jobs = conn.execute("SELECT id, status, error_text, restarts FROM jobs ORDER BY id").fetchall()
    assert jobs == [
        (1, "queued", "hanged", 1),
        (2, "queued", "hanged", 1),
        (3, "running", None, 0),
        (4, "done", None, 0),
    ]
    # Restarted, the jobs are no longer hung: nothing more is due, nor acted on.
    assert predicted(conn, rule, T0 + 10 * M) == []
    assert claim_all(conn, plan, T0 + 10 * M) == 0


def test_task_timeout_reschedules_the_task(conn: Conn, track: str) -> None:
    """A task running 10 minutes past its start is pending again, to run
    retry_interval after its last change (Asyncflow's governance)."""
    rule = shop(conn, track)["task_timeout"]
    started = T0 - 11 * M
    conn.execute(
        "INSERT INTO tasks (id, kind, status, order_time, modify_time, retry_interval) VALUES"
        " (1, 'settle', 'running', %(s)s, %(s)s, '2 minutes'),"
        " (2, 'settle', 'running', %(now)s, %(now)s, '2 minutes'),"
        " (3, 'settle', 'done', %(s)s, %(s)s, '2 minutes')",
        {"s": started, "now": T0},
    )
    assert predicted(conn, rule, T0) == [("1", 1, {"id": "1"})]
    assert claim_all(conn, prepare(conn, rule).with_act(runner("on")), T0) == 1
    assert recorded(conn, "task_timeout") == [("1", 1, "ok", 1, {"id": "1"})]
    tasks = conn.execute("SELECT id, status, order_time, retries FROM tasks ORDER BY id").fetchall()
    assert tasks == [
        (1, "pending", started + 2 * M, 1),
        (2, "running", T0, 0),
        (3, "done", started, 0),
    ]


def test_receipt_unconfirmed_confirms_the_receipt(conn: Conn, track: str) -> None:
    """Ten days after delivery an unconfirmed receipt is confirmed; a confirmed one is
    left alone."""
    rule = shop(conn, track)["receipt_unconfirmed"]
    delivered = T0 - 11 * DAY
    conn.execute(
        "INSERT INTO shipments VALUES (1, 10, 'DHL', 'delivered', %(d)s, NULL),"
        " (2, 20, 'UPS', 'delivered', %(d)s, %(d)s), (3, 30, 'GLS', 'delivered', %(now)s, NULL)",
        {"d": delivered, "now": T0},
    )
    assert predicted(conn, rule, T0) == [("1", 1, {"id": "1"})]
    assert claim_all(conn, prepare(conn, rule).with_act(runner("on")), T0) == 1
    assert recorded(conn, "receipt_unconfirmed") == [("1", 1, "ok", 1, {"id": "1"})]
    confirmed = conn.execute(
        "SELECT id, confirmed_at IS NOT NULL FROM shipments ORDER BY id"
    ).fetchall()
    assert confirmed == [(1, True), (2, True), (3, False)]


def test_the_dry_run_lists_a_later_notifications_actions(conn: Conn, track: str) -> None:
    """An action on notification #2: the dry run lists the re-notifications due that
    will carry #2 (not the first notices, not an acknowledged episode), with the
    values of the columns the statement names, and the claim then runs just those."""
    base = shop(conn, track)["job_hung"]
    assert base.action is not None
    sql = "update jobs set worker = :worker where id = :id and kind = :kind"
    rule = base.model_copy(update={"action": base.action.model_copy(update={"sql": sql, "on": 2})})
    migrate(conn, [rule])
    beat = naive(T0 - 20 * M)
    conn.execute(
        "INSERT INTO jobs (id, kind, worker, status, heartbeat_at)"
        " SELECT i, 'sync', 'w' || i, 'running', %s FROM generate_series(1, 3) i",
        (beat,),
    )
    plan = prepare(conn, rule).with_act(runner("on"))
    assert predicted(conn, rule, T0) == []  # first notices: #1 runs nothing
    assert claim_all(conn, plan, T0) == 3
    assert ("2", 1, 1) in episodes(conn, "job_hung")  # in either shape of the outbox
    conn.execute(  # the claim reads acks by rule, key and episode
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " VALUES ('job_hung', '2', 1, 0, %s, 'test')",
        (T0,),
    )
    later = T0 + 16 * M
    expected = [
        ("1", 2, {"worker": "w1", "id": "1", "kind": "sync"}),
        ("3", 2, {"worker": "w3", "id": "3", "kind": "sync"}),
    ]
    assert predicted(conn, rule, later) == expected
    assert claim_all(conn, plan, later) == 2
    assert [(k, n, p) for k, n, _, _, p in recorded(conn, "job_hung")] == expected


def test_run_dry_run_prints_the_statement_and_its_values(conn: Conn, dsn: str) -> None:
    """`run --dry-run` on the shipped rules: each action a claim would run, its
    statement and bound values, in text and in JSON; nothing runs."""
    shop(conn)
    conn.execute(
        "INSERT INTO jobs (id, kind, worker, status, heartbeat_at)"
        " VALUES (5, 'mailer', 'w1', 'running', now() AT TIME ZONE 'UTC' - interval '1 hour')"
    )
    result = slawatch("run", "--dry-run", dsn=dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("  job_hung: 1 alert (1 first, 0 re-notifications) -> console 1")
    assert lines[at + 1 : at + 3] == [
        "    action on #1, would run 1 time: update jobs set status = 'queued',"
        " error_text = 'hanged', restarts = restarts + 1 where id = :id and status = 'running'",
        '      key 5: id="5"',
    ]
    assert "    action on #1, would run 0 times: update tasks set" in result.stdout
    report = json.loads(slawatch("run", "--dry-run", "--json", dsn=dsn).stdout)
    (job,) = [r for r in report["rules"] if r["rule"] == "job_hung"]
    assert job["action"]["would_run"] == 1
    assert job["action"]["rows"] == [{"key": "5", "n": 1, "params": {"id": "5"}}]
    assert "%(id)s" in job["action"]["statement"]
    (orders,) = [r for r in report["rules"] if r["rule"] == "order_unshipped"]
    assert "action" not in orders
    row = conn.execute("SELECT status, restarts FROM jobs WHERE id = 5").fetchone()
    assert row == ("running", 0)
    assert conn.execute("SELECT count(*) FROM slawatch.action").fetchone() == (0,)


def test_the_dry_run_leaves_out_rows_already_notified(conn: Conn, track: str) -> None:
    """A row whose #1 was claimed (its action recorded would_run, so the job is still
    running) is not listed for #1 again."""
    rule = shop(conn, track)["job_hung"]
    conn.execute(
        "INSERT INTO jobs (id, kind, worker, status, heartbeat_at)"
        " VALUES (1, 'sync', 'w1', 'running', %s)",
        (naive(T0 - 20 * M),),
    )
    assert predicted(conn, rule, T0) == [("1", 1, {"id": "1"})]
    assert claim_all(conn, prepare(conn, rule).with_act(runner("off")), T0) == 1
    assert predicted(conn, rule, T0 + M) == []
