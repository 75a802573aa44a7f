"""Actions cannot stall the shop (docs/how-to/actions.md): each statement runs with the
action's statement and lock timeouts inside a budget for the batch, so the claim's
locks are held for a bounded time; a row the application holds is recorded ``retry``
and runs again at the rule's next scan, while the rest of the batch goes ahead."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slawatch.actions import run
from slawatch.actions.run import retry_held
from slawatch.cli import main
from tests.conftest import ROOT
from tests.integration.helpers import Conn, claim_all
from tests.integration.test_action_privileges import write
from tests.integration.test_actions import T0, M, S, actions, job_rule_with, setup
from tests.waiting import wait_until

LATE = T0 + 15 * M + S
# The second job's restart is instant; the first one's sleeps far past any timeout.
SLOW_FOR_ONE = (
    "update jobs set status = 'queued' where id = :id and status = 'running'"
    " and (:id <> 1 or (select true from pg_sleep(60)))"
)
RESTART = "update jobs set status = 'queued' where id = :id and status = 'running'"


def sleeping(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event = 'PgSleep'"
    ).fetchone()
    return bool(row and row[0])


def test_a_stuck_action_holds_the_other_rows_of_its_batch_for_a_bounded_time(
    conn: Conn, dsn: str
) -> None:
    """The claim (inline) locks both rows of its batch until it commits; job 1's action
    sleeps. The application's UPDATE of job 2 waits for the batch's budget at most
    (default timeout 1.5s: 4.5s), not for the sleep; job 1's action is failed by its
    own timeout, job 2's ran."""
    plan = setup(conn, job_rule_with({"sql": SLOW_FOR_ONE, "allow": ["pg_sleep"]}), jobs=2)
    done: list[Any] = []

    def claim() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            done.append(claim_all(own, plan, LATE))

    thread = threading.Thread(target=claim)
    thread.start()
    try:
        wait_until(lambda: sleeping(conn), "the action's pg_sleep")
        with psycopg.connect(dsn, autocommit=True) as app:
            app.execute("SET lock_timeout = '40s'")  # unbounded actions: it waited 60s
            started = time.monotonic()
            app.execute("UPDATE jobs SET kind = 'other' WHERE id = 2")
            waited = time.monotonic() - started
    finally:
        thread.join(timeout=120)
    assert done == [2]
    assert waited < 20, waited  # the bound is ~4.5s; generous for a slow machine
    got = [(k, status, error) for k, _e, _n, status, _r, error, _a in actions(conn)]
    assert got == [
        ("1", "failed", "canceling statement due to statement timeout"),
        ("2", "ok", None),
    ]
    assert conn.execute("SELECT id, status FROM jobs ORDER BY id").fetchall() == [
        (1, "running"),
        (2, "queued"),
    ]


def test_a_row_the_application_holds_is_retried_at_the_next_scan(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """track: table (the claim locks no watched row): the application holds job 1 in
    an open transaction. Its action waits lock_timeout, is recorded ``retry``, and
    job 2's goes ahead; once the application commits, the rule's next scan (``run
    --once``) runs job 1's again as attempt 2."""
    rule = job_rule_with({"sql": RESTART, "lock_timeout": "200ms"}, track="table")
    plan = setup(conn, rule, jobs=2)
    with psycopg.connect(dsn) as app:
        app.execute("UPDATE jobs SET kind = 'held' WHERE id = 1")  # open: holds the row
        started = time.monotonic()
        assert claim_all(conn, plan, LATE) == 2
        assert time.monotonic() - started < 20
        rows = actions(conn)
        assert [(k, status, a) for k, _e, _n, status, _r, _err, a in rows] == [
            ("1", "retry", 1),
            ("2", "ok", 1),
        ]
        error = rows[0][5]
        assert error.startswith("canceling statement due to lock timeout (lock_timeout 200ms)")
        assert error.endswith(": runs again at the rule's next scan")
        # Still held: a retry now waits again and stays retry (attempt 2), nothing else.
        assert retry_held(conn, rule, LATE + M) == 1
        assert [(r[0], r[3], r[6]) for r in actions(conn)][:2] == [
            ("1", "retry", 1),
            ("1", "retry", 2),
        ]
        app.commit()
    assert conn.execute("SELECT id, status FROM jobs ORDER BY id").fetchall() == [
        (1, "running"),
        (2, "queued"),
    ]
    write(tmp_path / "rules", rule)
    args = ["--dsn", dsn, "--rules", str(tmp_path / "rules")]
    assert main([*args, "--notifiers", str(ROOT / "notifiers"), "run", "--once"]) == 0
    capsys.readouterr()
    assert [(r[0], r[3], r[6]) for r in actions(conn)] == [
        ("1", "retry", 1),
        ("1", "retry", 2),
        ("1", "ok", 3),
        ("2", "ok", 1),
    ]
    assert conn.execute("SELECT status FROM jobs WHERE id = 1").fetchone() == ("queued",)


def test_a_batch_of_held_rows_takes_its_budget_not_a_lock_timeout_each(
    conn: Conn, dsn: str
) -> None:
    """Forty held rows, lock_timeout 500ms: one by one that is 20 s of the claim holding
    its locks. The batch's budget (3 x timeout = 3 s) ends it: the actions it did not
    reach are recorded ``retry`` (the time ran out) as well."""
    rule = job_rule_with({"sql": RESTART, "timeout": "1s"}, track="table")
    plan = setup(conn, rule, jobs=40)
    with psycopg.connect(dsn) as app:
        app.execute("UPDATE jobs SET kind = 'held'")
        started = time.monotonic()
        assert claim_all(conn, plan, LATE) == 40
        took = time.monotonic() - started
        app.rollback()
    assert took < 12, took
    rows = actions(conn)
    assert {r[3] for r in rows} == {"retry"} and len(rows) == 40
    errors = [r[5] for r in rows]
    assert any("lock timeout" in e for e in errors)
    assert any(e.startswith("the batch's time for actions (3s) ran out") for e in errors)


def test_an_action_that_timed_out_alone_is_not_run_again_one_by_one(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Jobs 1 and 2 insert the same row (the batch's statement cannot hold both, so the
    batch ends one by one); job 3's action sleeps. Its probe ran out its timeout: it is
    failed once, not run (and waited for) a second time one by one."""
    sql = (
        "insert into restarts (job_id, kind) select 1, :kind"
        " where :id <> 3 or (select true from pg_sleep(60))"
    )
    rule = job_rule_with({"sql": sql, "timeout": "500ms", "allow": ["pg_sleep"]}, track="table")
    plan = setup(conn, rule, jobs=3)
    conn.execute("CREATE UNIQUE INDEX ON restarts (job_id)")
    with caplog.at_level(logging.INFO, logger="slawatch.actions.run"):
        assert claim_all(conn, plan, LATE) == 3
    got = [(k, status, (error or "")[:30]) for k, _e, _n, status, _r, error, _a in actions(conn)]
    assert got == [
        ("1", "ok", ""),
        ("2", "failed", "duplicate key value violates u"),
        ("3", "failed", "canceling statement due to sta"),
    ]
    about_3 = [r.getMessage() for r in caplog.records if "for key 3 " in r.getMessage()]
    assert len(about_3) == 1, about_3


def test_a_row_held_for_good_is_given_up_at_the_retry_limit(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each scan waits lock_timeout for it once more, up to RETRY_LIMIT attempts; then
    it is failed (for ``slawatch replay --actions``), and scans stop waiting for it."""
    monkeypatch.setattr(run, "RETRY_LIMIT", 3)
    rule = job_rule_with({"sql": RESTART, "lock_timeout": "100ms"}, track="table")
    plan = setup(conn, rule, jobs=1)
    with psycopg.connect(dsn) as app:
        app.execute("UPDATE jobs SET kind = 'held' WHERE id = 1")
        assert claim_all(conn, plan, LATE) == 1
        assert retry_held(conn, rule, LATE + M) == 1
        assert retry_held(conn, rule, LATE + 2 * M) == 1
        assert retry_held(conn, rule, LATE + 3 * M) == 0
        app.rollback()
    rows = actions(conn)
    assert [(r[3], r[6]) for r in rows] == [("retry", 1), ("retry", 2), ("failed", 3)]
    assert rows[2][5].startswith("canceling statement due to lock timeout (lock_timeout 100ms)")
    assert rows[2][5].endswith(": still held at attempt 3, given up")
