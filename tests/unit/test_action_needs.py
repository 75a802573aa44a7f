"""What an action's statement needs (slawatch/config/needs.py), read from its parse tree."""

from __future__ import annotations

import pytest

from slawatch.config.needs import Need, needs, numbered


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "update public.jobs j set status = 3, error_text = 'hanged'"
            " where j.id = :id and status = 1 returning j.updated",
            [
                Need("UPDATE", "public", "jobs", ("status", "error_text")),
                Need("SELECT", "public", "jobs", ("id", "status", "updated")),
            ],
        ),
        (
            "update tasks set order_time = modify_time + retry_interval where id = :id",
            [
                Need("UPDATE", None, "tasks", ("order_time",)),
                Need("SELECT", None, "tasks", ("id", "modify_time", "retry_interval")),
            ],
        ),
        # t.*: every column; another table read: the written one wholly, and that one.
        (
            "update t set a = 1 where t.* is not null",
            [Need("UPDATE", None, "t", ("a",)), Need("SELECT", None, "t")],
        ),
        (
            "delete from t where id = :id and exists (select 1 from ops.u where u.t = :id)",
            [Need("DELETE", None, "t"), Need("SELECT", None, "t"), Need("SELECT", "ops", "u")],
        ),
        ("insert into t values (:id)", [Need("INSERT", None, "t")]),
        (
            "insert into t (a, b) values (:id, 1) on conflict (a) do update"
            " set b = excluded.b, c = t.c + 1",
            [
                Need("INSERT", None, "t", ("a", "b")),
                Need("SELECT", None, "t", ("a",)),
                Need("UPDATE", None, "t", ("b", "c")),
                Need("SELECT", None, "t", ("c",)),
            ],
        ),
        ("select ops.requeue(:id, :kind)", [Need("EXECUTE", "ops", "requeue", function=True)]),
        # A function called by a qualified name: EXECUTE; PostgreSQL's own: nothing.
        (
            "update t set a = ops.label(:id), b = lower(b), c = pg_catalog.upper(c) where id = :id",
            [
                Need("UPDATE", None, "t", ("a", "b", "c")),
                Need("SELECT", None, "t", ("b", "c", "id")),
                Need("EXECUTE", "ops", "label", function=True),
            ],
        ),
        (
            "select ops.requeue(ops.pick(:id))",
            [
                Need("EXECUTE", "ops", "requeue", function=True),
                Need("EXECUTE", "ops", "pick", function=True),
            ],
        ),
    ],
)
def test_needs(sql: str, expected: list[Need]) -> None:
    assert needs(sql) == expected


def test_numbered_is_what_the_server_parses() -> None:
    text = "update t set note = 'a:b 5%' || :kind where id = :id and k = :kind::text"
    assert numbered(text) == "update t set note = 'a:b 5%' || $1 where id = $2 and k = $1::text"
