"""Actions (docs/explanation/actions.md): a rule's statement runs in the claim's transaction, once
per (rule, key, episode), recorded in slawatch.action.

The rule is job_hung's shape; its action writes a row of ``restarts`` (a table of
the test's), so every run of the statement can be counted, and the watched row is
left as it was (re-notifications and the cap still happen).
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from slawatch.actions.history import prune_actions
from slawatch.actions.run import Mode, runner
from slawatch.cli import main
from slawatch.config.rules import Rule
from slawatch.db import Database, DatabaseError
from slawatch.demo import SHOP
from slawatch.engine.acting import Due
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from tests.conftest import ROOT
from tests.integration.helpers import Conn, alerts, claim_all, episodes

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
RESTART = "insert into restarts (job_id, kind) values (:id, :kind)"


def naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def job_rule_with(action: dict[str, Any], track: str = "inline", notifications: int = 3) -> Rule:
    """The shop's job_hung rule (renotified every 15 minutes, ``notifications`` times in
    all) with ``action``."""
    return Rule.model_validate(
        {
            "name": "job_hung",
            "table": "public.jobs",
            "key": "id",
            "track": track,
            "deadline": "heartbeat_at",
            "after": "15m",
            "open_when": "status = 'running'",
            "renotify": {"every": "15m", "max": notifications},
            "columns": ["id", "kind", "worker", "heartbeat_at"],
            "notify": ["console"],
            "action": action,
        }
    )


def job_rule(track: str = "inline", **action: Any) -> Rule:
    return job_rule_with({"sql": RESTART} | action, track)


def setup(conn: Conn, rule: Rule, mode: Mode = "on", jobs: int = 1) -> ClaimPlan:
    conn.execute(SHOP)
    conn.execute("DROP TABLE IF EXISTS restarts")
    conn.execute("CREATE TABLE restarts (job_id bigint NOT NULL, kind text NOT NULL)")
    migrate(conn, [rule])
    conn.execute(
        "INSERT INTO jobs SELECT i, 'sync', 'w1', 'running', %s FROM generate_series(1, %s) i",
        (naive(T0), jobs),
    )
    return prepare(conn, rule).with_act(runner(mode))


def restarts(conn: Conn) -> list[int]:
    return [r[0] for r in conn.execute("SELECT job_id FROM restarts ORDER BY job_id")]


def ack_paged(conn: Conn, at: datetime) -> None:
    """Acknowledge at ``at`` every episode of job_hung paged so far, in either shape of
    the outbox (the claim reads acks by rule, key and episode)."""
    paged = {(k, e) for k, e, _ in episodes(conn, "job_hung")}
    assert paged
    for k, e in sorted(paged):
        conn.execute(
            "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
            " VALUES ('job_hung', %s, %s, 0, %s, 'test')",
            (k, e, at),
        )


def actions(conn: Conn) -> list[tuple[Any, ...]]:
    """(key, episode, n, status, rows, error, attempt) of every action, in order."""
    return conn.execute(
        "SELECT key, episode, n, status, rows, error, attempt FROM slawatch.action"
        " ORDER BY key, episode, attempt"
    ).fetchall()


def test_the_action_runs_once_at_the_first_notification(conn: Conn, track: str) -> None:
    plan = setup(conn, job_rule(track))
    assert claim_all(conn, plan, T0 + 15 * M - S) == 0
    assert restarts(conn) == [] and actions(conn) == []
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    assert restarts(conn) == [1]
    assert actions(conn) == [("1", 1, 1, "ok", 1, None, 1)]
    params = conn.execute("SELECT params FROM slawatch.action").fetchone()
    assert params is not None and params[0] == {"id": "1", "kind": "sync"}
    # Re-notifications up to the cap: alerts, and no second run.
    for k in (2, 3):
        assert claim_all(conn, plan, T0 + 15 * M * k + k * S) == 1
    assert episodes(conn, "job_hung") == [("1", 1, 1), ("1", 1, 2), ("1", 1, 3)]
    assert restarts(conn) == [1] and len(actions(conn)) == 1


@pytest.mark.parametrize(("on", "at"), [(2, 2), ("cap", 3)])
def test_on_names_the_notification_that_acts(conn: Conn, on: Any, at: int) -> None:
    plan = setup(conn, job_rule(on=on))
    for k in (1, 2, 3):
        assert claim_all(conn, plan, T0 + 15 * M * k + k * S) == 1
        assert restarts(conn) == ([1] if k >= at else [])
    assert actions(conn) == [("1", 1, at, "ok", 1, None, 1)]


def test_a_new_episode_acts_again(conn: Conn, track: str) -> None:
    plan = setup(conn, job_rule(track))
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    # The job recovers (its heartbeat moves on), then hangs again.
    conn.execute("UPDATE jobs SET heartbeat_at = %s", (naive(T0 + 20 * M),))
    claim_all(conn, plan, T0 + 25 * M)  # ends episode 1 (track: table: at its next check)
    assert claim_all(conn, plan, T0 + 35 * M + S) == 1
    assert [(e, n) for _, e, n in episodes(conn, "job_hung")] == [(1, 1), (2, 1)]
    assert restarts(conn) == [1, 1]
    assert [a[:4] for a in actions(conn)] == [("1", 1, 1, "ok"), ("1", 2, 1, "ok")]


def test_an_ack_of_an_older_episode_does_not_skip_the_new_episodes_action(
    conn: Conn, track: str
) -> None:
    """An ack is of one episode: the key hanging again is a new episode, acted on."""
    plan = setup(conn, job_rule(track))
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    ack_paged(conn, T0 + 16 * M)
    conn.execute("UPDATE jobs SET heartbeat_at = %s", (naive(T0 + 20 * M),))
    claim_all(conn, plan, T0 + 25 * M)  # ends episode 1 (track: table: at its next check)
    assert claim_all(conn, plan, T0 + 35 * M + S) == 1
    assert restarts(conn) == [1, 1]
    assert [a[:4] for a in actions(conn)] == [("1", 1, 1, "ok"), ("1", 2, 1, "ok")]


def test_a_failing_statement_rolls_back_alone_and_the_alert_is_delivered(
    conn: Conn, track: str
) -> None:
    plan = setup(conn, job_rule(track, sql="update jobs set worker = null where id = :id"))
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    (row,) = actions(conn)
    assert row[:5] == ("1", 1, 1, "failed", None)
    assert 'null value in column "worker"' in row[5]
    # The alert and its delivery are there, the statement's change is not.
    assert [(k, n, ns) for k, n, _, ns in alerts(conn, "job_hung")] == [("1", 1, ["console"])]
    assert conn.execute("SELECT worker FROM jobs").fetchone() == ("w1",)
    # The claim went on: the next notification comes, and is not acted on again.
    assert claim_all(conn, plan, T0 + 30 * M + 2 * S) == 1
    assert len(actions(conn)) == 1


def test_a_statement_touching_more_than_max_rows_is_rolled_back(conn: Conn) -> None:
    plan = setup(conn, job_rule(sql="update jobs set worker = 'x' where kind = :kind"), jobs=2)
    assert claim_all(conn, plan, T0 + 15 * M + S) == 2
    rows = actions(conn)
    assert [r[:5] for r in rows] == [("1", 1, 1, "failed", 2), ("2", 1, 1, "failed", 2)]
    assert "more than max_rows 1: rolled back" in rows[0][5]
    assert {w for (w,) in conn.execute("SELECT worker FROM jobs")} == {"w1"}
    # max_rows: 2 lets the same statement through.
    plan = setup(
        conn, job_rule(sql="update jobs set worker = 'x' where kind = :kind", max_rows=2), jobs=2
    )
    claim_all(conn, plan, T0 + 15 * M + S)
    assert [r[3] for r in actions(conn)] == ["ok", "ok"]


def test_a_crash_before_the_commit_leaves_neither_alert_nor_action(
    conn: Conn, dsn: str, track: str
) -> None:
    """The backend dies inside the claim's transaction (the action terminates its own
    connection): nothing of the claim survives, and the next claim does it all."""
    kill = "select pg_terminate_backend(pg_backend_pid()) where :id > 0"
    plan = setup(conn, job_rule(track, sql=kill, allow=["pg_terminate_backend", "pg_backend_pid"]))
    with psycopg.connect(dsn, autocommit=True) as other, pytest.raises(DatabaseError):
        claim_all(other, plan, T0 + 15 * M + S)
    assert episodes(conn, "job_hung") == [] and actions(conn) == []
    unsent = (
        "SELECT (SELECT count(*) FROM slawatch.delivery)"
        " + (SELECT count(*) FROM slawatch.outbox_send)"
    )
    assert conn.execute(unsent).fetchone() == (0,)

    # The same with an error of slawatch's own between the actions and the commit.
    def act_then_crash(c: Conn, r: Rule, d: list[Due], n: datetime) -> None:
        runner("on")(c, r, d, n)
        raise RuntimeError("crash")

    plan = setup(conn, job_rule(track)).with_act(act_then_crash)
    with pytest.raises(RuntimeError):
        claim_all(conn, plan, T0 + 15 * M + S)
    assert episodes(conn, "job_hung") == [] and actions(conn) == [] and restarts(conn) == []
    plan = plan.with_act(runner("on"))
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    assert restarts(conn) == [1] and len(actions(conn)) == 1


def test_concurrent_claimers_act_on_each_row_exactly_once(dsn: str, conn: Conn, track: str) -> None:
    rule = job_rule(track).model_copy(update={"batch": 7})
    plan = setup(conn, rule, jobs=300)
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                start.wait()
                for _ in range(3):
                    claim_all(c, plan, T0 + 15 * M + S)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert restarts(conn) == list(range(1, 301))
    rows = actions(conn)
    assert sorted(int(r[0]) for r in rows) == list(range(1, 301))
    assert {r[3] for r in rows} == {"ok"}


def silence_1_ack_2(conn: Conn) -> None:
    """Job 1 silenced for the hour from T0; job 2's episode 1 acknowledged at T0 (as an
    ack that committed while a claim ran would be)."""
    conn.execute(
        "INSERT INTO slawatch.silence (rule, key, starts_at, ends_at, created_at, author)"
        " VALUES ('job_hung', '1', %s, %s, %s, 'test')",
        (T0, T0 + 60 * M, T0),
    )
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " VALUES ('job_hung', '2', 1, 0, %s, 'test')",
        (T0,),
    )


def test_a_silenced_or_acknowledged_episode_is_not_acted_on(conn: Conn) -> None:
    plan = setup(conn, job_rule(), jobs=3)
    silence_1_ack_2(conn)
    assert claim_all(conn, plan, T0 + 15 * M + S) == 3
    assert restarts(conn) == [3]
    assert [(r[0], r[3], r[5]) for r in actions(conn)] == [
        ("1", "skipped", "silenced"),
        ("2", "skipped", "acknowledged"),
        ("3", "ok", None),
    ]


def test_an_ack_before_the_acting_notification_means_no_action(conn: Conn) -> None:
    plan = setup(conn, job_rule(on=2))
    assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    ack_paged(conn, T0 + 20 * M)
    assert claim_all(conn, plan, T0 + 30 * M + 2 * S) == 0
    assert restarts(conn) == [] and actions(conn) == []


@pytest.mark.parametrize("mode", ["off", "dry-run"])
def test_off_and_dry_run_record_would_run(
    conn: Conn, mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    plan = setup(conn, job_rule(), mode=mode)
    with caplog.at_level("INFO", logger="slawatch.actions.run"):
        assert claim_all(conn, plan, T0 + 15 * M + S) == 1
    assert restarts(conn) == []
    assert [r[3] for r in actions(conn)] == ["would_run"]
    assert "would run action for key 1" in caplog.text


def test_a_rule_with_an_action_and_no_runner_refuses_to_claim(conn: Conn) -> None:
    plan = setup(conn, job_rule())
    plan = prepare(conn, plan.rule)  # as composed: no runner attached
    with pytest.raises(ValueError, match="no runner"):
        claim_all(conn, plan, T0 + 15 * M + S)
    assert episodes(conn, "job_hung") == []


def two_failed(conn: Conn, dsn: str, tmp_path: Path) -> tuple[ClaimPlan, list[str]]:
    """Two jobs' actions failed (no table ``restarts``); the rule in a folder of its own,
    and the command line's arguments for it."""
    plan = setup(conn, job_rule(), jobs=2)
    conn.execute("DROP TABLE restarts")  # the statement fails: no such table
    assert claim_all(conn, plan, T0 + 15 * M + S) == 2
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "job_hung.yaml").write_text(
        yaml.safe_dump(
            plan.rule.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"name"})
        )
    )
    return plan, ["--dsn", dsn, "--rules", str(rules), "--notifiers", str(ROOT / "notifiers")]


def test_a_replay_whose_actions_fail_again_ends(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, base = two_failed(conn, dsn, tmp_path)
    assert main([*base, "replay", "--actions"]) == 1
    assert "0 actions ran again, 2 failed again" in capsys.readouterr().out
    assert [(r[0], r[3], r[6]) for r in actions(conn)] == [
        ("1", "failed", 1),
        ("1", "failed", 2),
        ("2", "failed", 1),
        ("2", "failed", 2),
    ]


def test_replay_runs_each_failed_action_once_more(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, base = two_failed(conn, dsn, tmp_path)
    assert [r[3] for r in actions(conn)] == ["failed", "failed"]
    assert 'relation "restarts" does not exist' in actions(conn)[0][5]
    conn.execute("CREATE TABLE restarts (job_id bigint NOT NULL, kind text NOT NULL)")
    # A failed attempt of the rule's earlier webhook action: not replayed as SQL.
    conn.execute(
        "INSERT INTO slawatch.action (rule, key, episode, n, kind, status, error, at)"
        " VALUES (%s, '3', 1, 1, 'webhook', 'failed', 'HTTP 500', %s)",
        (plan.rule.name, T0),
    )
    assert main([*base, "replay", "--actions"]) == 0
    assert "ok: 2 actions ran again, 0 failed again" in capsys.readouterr().out
    webhook = conn.execute("SELECT count(*) FROM slawatch.action WHERE key = '3'").fetchone()
    assert webhook == (1,)
    conn.execute("DELETE FROM slawatch.action WHERE key = '3'")
    assert restarts(conn) == [1, 2]
    assert [(r[0], r[3], r[6]) for r in actions(conn)] == [
        ("1", "failed", 1),
        ("1", "ok", 2),
        ("2", "failed", 1),
        ("2", "ok", 2),
    ]
    # Once each: nothing failed is left to retry.
    assert main([*base, "replay", "--actions"]) == 0
    assert "ok: 0 actions ran again" in capsys.readouterr().out
    assert restarts(conn) == [1, 2]
    # The list, newest first, of one status.
    assert main([*base, "actions", "--status", "ok", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["actions"]
    assert [(a["key"], a["attempt"], a["status"]) for a in listed] == [
        ("2", 2, "ok"),
        ("1", 2, "ok"),
    ]
    assert main([*base, "actions"]) == 0
    assert "does not exist" in capsys.readouterr().out


def test_retention_prunes_old_attempts(conn: Conn, dsn: str) -> None:
    plan = setup(conn, job_rule(), jobs=3)
    assert claim_all(conn, plan, T0 + 15 * M + S) == 3
    conn.execute("UPDATE slawatch.action SET at = %s WHERE key = '3'", (T0 + 20 * M,))
    with Database(dsn, size=1) as db:
        assert prune_actions(db, T0 + 16 * M, batch=1) == 2
    assert [r[0] for r in actions(conn)] == ["3"]


@pytest.mark.parametrize("mode", ["on", "off"])
def test_run_once_acts_as_slawatch_actions_says(
    conn: Conn, dsn: str, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner attaches the action to its plans, in the mode of SLAWATCH_ACTIONS."""
    rule = job_rule()
    setup(conn, rule)
    conn.execute("UPDATE jobs SET heartbeat_at = now() - interval '1 hour'")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "job_hung.yaml").write_text(
        yaml.safe_dump(rule.model_dump(mode="json", by_alias=True, exclude_unset=True))
    )
    monkeypatch.setenv("SLAWATCH_ACTIONS", mode)
    monkeypatch.setenv("SLAWATCH_HTTP", "")
    args = ["--dsn", dsn, "--rules", str(rules), "--notifiers", str(ROOT / "notifiers")]
    assert main([*args, "run", "--once"]) == 0
    assert restarts(conn) == ([1] if mode == "on" else [])
    assert [r[3] for r in actions(conn)] == ["ok" if mode == "on" else "would_run"]
