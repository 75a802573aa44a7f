"""A batch's actions as one statement (slawatch/actions/run.py, config/batched.py):
the set form runs when it can, falls back one by one when a row fails or touches
too many rows, and records exactly what running each alone records."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from slawatch.actions.run import Record, run_batch, run_one, runner, set_statement
from slawatch.config.rules import Rule
from slawatch.engine.acting import Due
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, claim_all, episodes

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LATE = T0 + timedelta(minutes=16)

# Five tasks; kinds a, a, b, b, c. Task 3 has two items, the others one (task 5 none).
TABLES = """
DROP TABLE IF EXISTS tasks, items, restarts CASCADE;
CREATE TABLE tasks (id bigint PRIMARY KEY, kind text NOT NULL, status text NOT NULL,
                    tries int NOT NULL DEFAULT 0, heartbeat_at timestamptz NOT NULL);
INSERT INTO tasks SELECT i, (ARRAY['a','a','b','b','c'])[i], 'running', 0,
                         '2026-03-01 12:00Z' FROM generate_series(1, 5) i;
CREATE TABLE items (task_id bigint NOT NULL, note text);
INSERT INTO items VALUES (1, 'x'), (2, 'x'), (3, 'x'), (3, 'y'), (4, 'x');
CREATE TABLE restarts (task_id bigint NOT NULL CHECK (task_id <> 3), kind text NOT NULL,
                       at_try int);
CREATE UNIQUE INDEX ON restarts (task_id, kind);
CREATE OR REPLACE FUNCTION note_restart(task bigint) RETURNS void LANGUAGE sql AS
  $$ INSERT INTO restarts (task_id, kind) VALUES (task + 10, 'fn') $$;
"""


def rule(sql: str, max_rows: int = 1) -> Rule:
    return Rule.model_validate(
        {
            "name": "task_hung",
            "table": "public.tasks",
            "key": "id",
            "deadline": "heartbeat_at",
            "after": "15m",
            "open_when": "status = 'running'",
            "columns": ["id", "kind"],
            "notify": ["console"],
            "action": {"sql": sql, "max_rows": max_rows},
        }
    )


def dues(ids: range = range(1, 6)) -> list[Due]:
    kinds = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c"}
    return [Due(str(i), 1, 1, {"id": str(i), "kind": kinds[i]}) for i in ids]


def state(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
    return {
        t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
        for t in ("tasks", "items", "restarts")
    }


def outcome(records: list[Record]) -> list[tuple[Any, ...]]:
    return [(r.key, r.status, r.rows, r.error) for r in records]


def acting_claim(conn: Conn, sql: str, caplog: pytest.LogCaptureFixture, **kw: Any) -> str:
    """Claim the five hung tasks with ``sql`` as the action; the path it ran."""
    conn.execute(TABLES)
    r = rule(sql, **kw)
    migrate(conn, [r])
    plan = prepare(conn, r).with_act(runner("on"))
    with caplog.at_level(logging.DEBUG, logger="slawatch.actions.run"):
        assert claim_all(conn, plan, LATE) == 5
    paths = [m for m in caplog.messages if "actions ran (" in m]
    assert len(paths) == 1, caplog.messages
    return paths[0]


def records(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT key, status, rows, error FROM slawatch.action ORDER BY key::int"
    ).fetchall()


def test_a_batch_runs_as_one_statement(conn: Conn, caplog: pytest.LogCaptureFixture) -> None:
    path = acting_claim(
        conn, "update tasks set status = 'queued', tries = tries + 1 where id = :id", caplog
    )
    assert path == "rule task_hung: 5 actions ran (set)"
    assert records(conn) == [(str(i), "ok", 1, None) for i in range(1, 6)]
    assert conn.execute("SELECT sum(tries) FROM tasks WHERE status = 'queued'").fetchone() == (5,)


def test_the_set_statement_records_each_alerts_rows(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # The records the set statement writes itself carry each alert's own count.
    path = acting_claim(conn, "delete from items where task_id = :id", caplog, max_rows=2)
    assert path == "rule task_hung: 5 actions ran (set)"
    assert records(conn) == [
        ("1", "ok", 1, None),
        ("2", "ok", 1, None),
        ("3", "ok", 2, None),
        ("4", "ok", 1, None),
        ("5", "ok", 0, None),
    ]


def test_one_failing_action_falls_back_and_fails_alone(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # restarts refuses task 3 (a CHECK): the set fails, each runs alone.
    path = acting_claim(conn, "insert into restarts (task_id, kind) values (:id, :kind)", caplog)
    assert path == "rule task_hung: 5 actions ran (probed)"
    message = 'new row for relation "restarts" violates check constraint "restarts_task_id_check"'
    assert records(conn) == [
        ("1", "ok", 1, None),
        ("2", "ok", 1, None),
        ("3", "failed", None, message),
        ("4", "ok", 1, None),
        ("5", "ok", 1, None),
    ]
    assert [r[0] for r in state(conn)["restarts"]] == [1, 2, 4, 5]  # each once


def test_one_action_past_max_rows_falls_back_and_fails_alone(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    path = acting_claim(conn, "delete from items where task_id = :id", caplog)
    assert path == "rule task_hung: 5 actions ran (probed)"
    assert records(conn) == [
        ("1", "ok", 1, None),
        ("2", "ok", 1, None),
        ("3", "failed", 2, "touched 2 rows, more than max_rows 1: rolled back"),
        ("4", "ok", 1, None),
        ("5", "ok", 0, None),
    ]
    assert state(conn)["items"] == [(3, "x"), (3, "y")]


def test_a_changed_column_type_is_asked_again(conn: Conn) -> None:
    # The placeholders' types are kept per connection; a set statement that fails
    # forgets them, so a column whose type changed is read as its new type.
    conn.execute(TABLES)
    r = rule("update tasks set tries = tries + 1 where id = :id")
    with conn.transaction():
        assert run_batch(conn, r, dues(range(1, 3)))[1] == "set"  # id read as bigint
    conn.execute("ALTER TABLE tasks ALTER COLUMN id TYPE text")
    with conn.transaction():
        ran, path = run_batch(conn, r, dues(range(3, 5)))
    assert (path, outcome(ran)) == ("probed", [("3", "ok", 1, None), ("4", "ok", 1, None)])
    with conn.transaction():
        assert run_batch(conn, r, dues(range(5, 6)))[1] == "set"
    assert conn.execute("SELECT id, tries FROM tasks ORDER BY id").fetchall() == [
        (str(i), 1) for i in range(1, 6)
    ]


def test_the_batch_reaches_its_rows_through_the_index(conn: Conn) -> None:
    # A small table is hashed whole when the planner counts on the batch's 1,000 rows
    # (50,000 rows hashed for 1,000 alerts); counting on a few, it probes the index.
    conn.execute(
        "CREATE TABLE big (id bigint PRIMARY KEY, tries int NOT NULL DEFAULT 0);"
        " INSERT INTO big SELECT g FROM generate_series(1, 50000) g; ANALYZE big"
    )
    r = rule("update big set tries = tries + 1 where id = :id")
    assert r.action is not None
    many = [Due(str(i), 1, 1, {"id": str(i * 7), "kind": "a"}) for i in range(1, 1001)]
    with conn.transaction():
        statement, params = set_statement(conn, r.action, many)
        plan = "\n".join(str(row[0]) for row in conn.execute("EXPLAIN " + statement, params))
    assert "Index Scan using big_pkey on big" in plan, plan
    assert "Seq Scan on big" not in plan, plan


# Each shape an action may have; the set form must record and do what one by one
# does, and the path it takes is the one expected.
SHAPES = [
    ("update tasks set status = 'queued', tries = tries + 1 where id = :id", 1, "set"),
    (
        "update tasks t set tries = t.tries + i.n from (select task_id, count(*)::int n"
        " from items group by 1) i where i.task_id = t.id and t.id = :id",
        1,
        "set",
    ),
    ("update tasks set tries = 1 where id = :id and kind = 'zz'", 1, "set"),
    ("update tasks set tries = :id::int * 2, status = :kind where id = :id", 1, "set"),
    ("update tasks set tries = 1 where id = :id::text::int", 1, "set"),
    ("delete from items where task_id = :id", 5, "set"),
    ("delete from items where note = :kind", 1, "set"),
    ("insert into restarts (task_id, kind) values (:id + 10, :kind)", 1, "set"),
    (
        "insert into restarts (task_id, kind, at_try)"
        " values (:id + 10, :kind, 1), (:id + 20, 'x%', null)",
        2,
        "set",
    ),
    (
        "insert into restarts (task_id, kind) select task_id + 10, note from items"
        " where task_id = :id",
        5,
        "set",
    ),
    ("select note_restart(:id)", 1, "set"),
    # One fails, or touches too many rows: probed, the rest as one statement.
    ("insert into restarts (task_id, kind) values (:id, :kind)", 1, "probed"),
    ("select int4div(1, :id::int - 3)", 1, "probed"),
    ("select generate_series(1, :id::int)", 3, "probed"),
    # Rows that are not one alert's: one by one, for good.
    ("update tasks set tries = tries + 1 where kind = :kind", 5, "one by one"),
    (
        "delete from items using tasks where tasks.id = items.task_id and tasks.kind = :kind",
        5,
        "one by one",
    ),
    (
        "insert into restarts (task_id, kind) values (:id % 2 + 10, 'k') on conflict do nothing",
        1,
        "one by one",
    ),
]


@pytest.mark.parametrize(("sql", "max_rows", "expected"), SHAPES)
def test_the_set_form_records_and_does_what_one_by_one_does(
    conn: Conn, sql: str, max_rows: int, expected: str
) -> None:
    r = rule(sql, max_rows)
    assert r.action is not None and r.action.set_form is not None
    conn.execute(TABLES)
    conn.execute("INSERT INTO restarts VALUES (11, 'k', 0)")  # for on conflict
    before = state(conn)
    with conn.transaction():
        alone = outcome([run_one(conn, r, d) for d in dues()])
        after_alone = state(conn)
        raise psycopg.Rollback()
    assert state(conn) == before
    with conn.transaction():
        together, path = run_batch(conn, r, dues())
        after_together = state(conn)
        raise psycopg.Rollback()
    assert (outcome(together), after_together) == (alone, after_alone)
    assert path == expected


@pytest.mark.parametrize("track", ["inline", "table"])
def test_a_claim_that_meets_its_alerts_again_runs_no_action_twice(
    conn: Conn, track: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Tracking state restored from before the first claim: the claim is sent again with
    its guards (docs/explanation/architecture.md) in a transaction of its own, with its
    actions: no alert and no action a second time, and the rule goes on."""
    conn.execute(TABLES)
    r = Rule.model_validate(
        rule("insert into restarts (task_id, kind) values (:id, 'restart')").model_dump(
            by_alias=True, exclude_unset=True
        )
        | {"track": track}
    )
    migrate(conn, [r])
    plan = prepare(conn, r).with_act(runner("on"))
    state_table = "public.tasks" if track == "inline" else "slawatch.task_hung_state"
    conn.execute(f"CREATE TABLE backup AS SELECT * FROM {state_table}")
    assert claim_all(conn, plan, LATE) == 5
    before = state(conn), records(conn)
    assert len(before[1]) == 5 and len(before[0]["restarts"]) == 4  # task 3: its CHECK
    conn.execute(f"DELETE FROM {state_table}")
    conn.execute(f"INSERT INTO {state_table} SELECT * FROM backup")
    conn.execute("DELETE FROM slawatch.watermark")  # restored too: none before the claim
    plan = prepare(conn, r).with_act(runner("on"))  # a process started on the restore
    with caplog.at_level(logging.WARNING, logger="slawatch.engine.outbox"):
        assert claim_all(conn, plan, LATE + timedelta(minutes=1)) == 0
    assert any("claim for rule task_hung" in m for m in caplog.messages), caplog.messages
    after = state(conn), records(conn)
    assert after[0]["restarts"] == before[0]["restarts"] and after[1] == before[1]
    assert len(episodes(conn, "task_hung")) == 5  # in either shape of the outbox
