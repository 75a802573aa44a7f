"""Switching a rule's ``track`` carries its state over: no re-page.

Found by an operator on a sample database: a rule switched from ``inline`` to
``track: table`` paged all 183 of its overdue rows again as new first notices.
Now ``migrate`` copies the episodes, notification counts, next-notify times and
baselines into the other track before it drops the old track's indexes; both
directions, in bounded batches, resumable, printable.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from freezegun import freeze_time

from slawatch.config.rules import Rule
from slawatch.engine import trackswitch
from slawatch.engine.baseline import baseline_rule
from slawatch.engine.catalog import inspect_table
from slawatch.engine.migrate import leftovers, migrate, plan, render
from slawatch.engine.ready import prepare
from slawatch.errors import ConfigError, DatabaseError
from tests.integration.helpers import Conn, claim_all, episodes, role_slawatch_app
from tests.integration.test_cli import slawatch

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)

TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz NOT NULL
)"""

BOTH_WAYS = pytest.mark.parametrize(
    ("before", "after"), [("inline", "table"), ("table", "inline")], ids=["to-table", "to-inline"]
)


def rule(**fields: Any) -> Rule:
    base = {
        "name": "late",
        "table": "public.orders",
        "deadline": "paid_at",
        "after": "1h",
        "open_when": "status = 'paid'",
        "renotify": {"every": "6h", "max": 3},
        "notify": ["console"],
    }
    return Rule.model_validate(base | fields)


def baseline(conn: Conn, late: Rule, now: datetime) -> int:
    info = inspect_table(conn, "public", "orders")
    assert info is not None
    return baseline_rule(conn, late, info, now)


def claim(conn: Conn, late: Rule) -> int:
    """One scan at the (frozen) clock's now, as `slawatch run` prepares it."""
    return claim_all(conn, prepare(conn, late))


@BOTH_WAYS
def test_a_switch_pages_nothing_again_and_goes_on_on_schedule(
    conn: Conn, before: str, after: str
) -> None:
    conn.execute(TABLE)
    old, new = rule(track=before), rule(track=after)
    migrate(conn, [old])
    conn.execute(
        "INSERT INTO orders VALUES (1, 'paid', %(t)s), (2, 'shipped', %(t)s), (3, 'paid', %(t)s),"
        " (4, 'paid', %(old)s), (7, 'paid', %(t)s)",
        {"t": T0, "old": T0 - 100 * H},
    )
    assert baseline(conn, old, T0) == 1  # order 4: overdue before the rule ran, never paged
    with freeze_time(T0 + H + S) as clock:
        assert claim(conn, old) == 3  # orders 1, 3 and 7: #1
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 3")
        clock.move_to(T0 + 7 * H + 2 * S)
        assert claim(conn, old) == 2  # orders 1 and 7: #2 (order 3's episode ended)
        clock.move_to(T0 + 8 * H)
        # Order 7 ships after the last scan: its episode ends under the new track.
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 7")
        done = migrate(conn, [new])
        what = "carried over to" if after == "table" else "carried over from"
        assert [d for d in done if what in d] == [
            f"public.orders: rule late's state {what} slawatch.late_state (4 rows)"
        ]
        # Only rows with a history have state: order 2 never had an episode.
        if after == "table":
            assert conn.execute("SELECT count(*) FROM slawatch.late_state").fetchone() == (4,)
        assert migrate(conn, [new]) == []
        assert claim(conn, new) == 0  # nothing paged again: not 1 and 7, not baselined 4
        # Order 3 is paid again (a new deadline): a new episode, which pages; so does 6.
        conn.execute("UPDATE orders SET status = 'paid', paid_at = %s WHERE id = 3", (T0 + 8 * H,))
        conn.execute("INSERT INTO orders VALUES (6, 'paid', %s)", (T0 + 8 * H,))
        clock.move_to(T0 + 9 * H + S)
        assert claim(conn, new) == 2
        # Order 1's third notice: 6 h after its second, not sooner, with n = 3 (the cap).
        clock.move_to(T0 + 13 * H + S)
        assert claim(conn, new) == 0
        clock.move_to(T0 + 13 * H + 3 * S)
        assert claim(conn, new) == 1
        clock.move_to(T0 + 100 * H)
        assert claim(conn, new) == 2  # 3 (episode 2) and 6: #2
        clock.move_to(T0 + 200 * H)
        assert claim(conn, new) == 2  # and #3, the cap
        clock.move_to(T0 + 300 * H)
        assert claim(conn, new) == 0
    assert episodes(conn, "late") == [
        ("1", 1, 1),
        ("1", 1, 2),
        ("1", 1, 3),
        ("3", 1, 1),
        ("3", 2, 1),
        ("3", 2, 2),
        ("3", 2, 3),
        ("6", 1, 1),
        ("6", 1, 2),
        ("6", 1, 3),
        ("7", 1, 1),
        ("7", 1, 2),
    ]


@BOTH_WAYS
def test_an_interrupted_switch_is_finished_by_the_next_migrate(
    conn: Conn, dsn: str, before: str, after: str
) -> None:
    """The copy goes in batches of its own transactions; the connection is killed after
    the second: migrate says the rule is not ready, and the next migrate finishes."""
    conn.execute(TABLE)
    old, new = rule(track=before), rule(track=after)
    migrate(conn, [old])
    conn.execute("INSERT INTO orders SELECT g, 'paid', %s FROM generate_series(1, 1000) g", (T0,))
    with freeze_time(T0 + H + S):
        assert claim(conn, old) == 1000
    for step in plan(conn, [new]):  # up to the copy: the state table, or the columns
        if step.run is not None:
            break
        conn.execute(step.statement.encode())
    info = inspect_table(conn, "public", "orders")
    assert info is not None
    victim = psycopg.connect(dsn, autocommit=True)
    batches: list[int] = []

    def kill(written: int, pid: int = victim.info.backend_pid) -> None:
        batches.append(written)
        if len(batches) == 2:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    to: trackswitch.Track = "table" if after == "table" else "inline"
    with victim, pytest.raises(DatabaseError, match="track switch of rule late"):
        trackswitch.copy(victim, new, info, to, batch=100, progress=kill)
    assert batches == [100, 199]  # each batch reads its first row again
    with pytest.raises(ConfigError, match="not migrated or changed since the last migrate"):
        prepare(conn, new)
    done = migrate(conn, [new])
    assert any("(801 rows)" in d for d in done), done
    with freeze_time(T0 + 2 * H):
        assert claim(conn, new) == 0
    with freeze_time(T0 + 7 * H + 2 * S):
        assert claim(conn, new) == 1000  # #2 for each, on schedule
    assert {n for _, _, n in episodes(conn, "late")} == {1, 2}


def _run_script(conn: Conn, script: str) -> None:
    """A printed migration as psql runs it: statement by statement, a dollar-quoted
    block (``$$``, ``$slawatch_switch$`` or a probe function's ``$sw_probe$``) being one
    statement."""
    statement: list[str] = []
    for line in script.splitlines():
        if line.startswith("--") and not statement:
            continue
        statement.append(line)
        text = "\n".join(statement)
        quotes = len(re.findall(r"\$(?:slawatch_switch|sw_probe)?\$", text))
        if line.rstrip().endswith(";") and quotes % 2 == 0:
            conn.execute(text.encode())
            statement = []
    assert not "\n".join(statement).strip()


# Creates and drops the cluster-wide role slawatch_app: on one xdist worker with the
# tests in test_migrate.py that do.
@pytest.mark.xdist_group("role_slawatch_app")
@BOTH_WAYS
def test_the_printed_switch_does_what_migrate_does(conn: Conn, before: str, after: str) -> None:
    conn.execute(TABLE)
    old, new = rule(track=before), rule(track=after)
    migrate(conn, [old])
    conn.execute("INSERT INTO orders SELECT g, 'paid', %s FROM generate_series(1, 25) g", (T0,))
    with freeze_time(T0 + H + S):
        assert claim(conn, old) == 25
    script = render([new], plan(conn, [new]), leftovers(conn, [new]))
    assert "DO $slawatch_switch$" in script
    with role_slawatch_app(conn):
        _run_script(conn, script)
    assert migrate(conn, [new]) == []
    with freeze_time(T0 + 2 * H):
        assert claim(conn, new) == 0
    with freeze_time(T0 + 7 * H + 2 * S):
        assert claim(conn, new) == 25


def test_the_first_table_scan_after_a_switch_sweeps(conn: Conn) -> None:
    """table → inline → table within minutes: the watermark of the first table period is
    gone, so a row that opened with an old deadline while inline had not scanned it yet
    is found by the first scan, not ten minutes later by the next sweep."""
    conn.execute(TABLE)
    table, inline = rule(track="table"), rule(track="inline")
    migrate(conn, [table])
    with freeze_time(T0):
        assert claim(conn, table) == 0  # sweeps, records its watermark
        migrate(conn, [inline])
        conn.execute("INSERT INTO orders VALUES (1, 'paid', %s)", (T0 - 100 * H,))
        migrate(conn, [table])
    with freeze_time(T0 + M):
        assert claim(conn, table) == 1


def test_what_a_switch_to_table_left_is_named_with_its_drop(conn: Conn) -> None:
    conn.execute(TABLE)
    migrate(conn, [rule(track="inline")])
    conn.execute("CREATE INDEX by_hand ON orders (sw_late_next)")
    late = rule(track="table")
    # Before migrate (what --print shows), inline's own indexes are there still: they
    # are not named, migrate drops them.
    before = leftovers(conn, [late])
    migrate(conn, [late])
    (left,) = leftovers(conn, [late])
    assert before == [left]
    assert left.what == (
        "public.orders: left by rule late's track: inline, unused by track: table: columns"
        " sw_late_n, sw_late_next, sw_late_seen, sw_late_ep; index by_hand on them goes with"
        " them. slawatch does not drop them; to drop them (a brief exclusive lock, no rewrite):"
    )
    assert left.statement == (
        'ALTER TABLE "public"."orders" DROP COLUMN "sw_late_n", DROP COLUMN "sw_late_next",'
        ' DROP COLUMN "sw_late_seen", DROP COLUMN "sw_late_ep";'
    )
    assert f"--   {left.statement}" in render([late], plan(conn, [late]), [left])
    conn.execute(left.statement.encode())
    assert leftovers(conn, [late]) == []
    assert migrate(conn, [late]) == []


def test_migrate_prints_what_is_left(conn: Conn, dsn: str, tmp_path: Path) -> None:
    conn.execute(TABLE)
    text = (
        "table: orders\nkey: id\ndeadline: paid_at\nafter: 1h\nopen_when: status = 'paid'\n"
        "notify: [console]\n"
    )
    (tmp_path / "late.yaml").write_text(text)
    assert slawatch("--rules", str(tmp_path), "migrate", dsn=dsn).returncode == 0
    (tmp_path / "late.yaml").write_text(text + "track: table\n")
    result = slawatch("--rules", str(tmp_path), "migrate", dsn=dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "public.orders: rule late's state carried over to slawatch.late_state (0 rows)" in lines
    assert lines[-2].startswith("public.orders: left by rule late's track: inline")
    assert lines[-1] == (
        '  ALTER TABLE "public"."orders" DROP COLUMN "sw_late_n", DROP COLUMN "sw_late_next",'
        ' DROP COLUMN "sw_late_seen", DROP COLUMN "sw_late_ep";'
    )


def test_a_state_table_of_another_key_is_not_carried_over(conn: Conn) -> None:
    conn.execute(TABLE)
    conn.execute("ALTER TABLE orders ADD COLUMN ref text NOT NULL UNIQUE")
    migrate(conn, [rule(track="table", key="ref")])
    with pytest.raises(ConfigError, match=r"slawatch.late_state \(keyed by ref\) cannot be"):
        migrate(conn, [rule(track="inline", key="id")])


@BOTH_WAYS
def test_a_copy_run_again_writes_nothing(conn: Conn, before: str, after: str) -> None:
    conn.execute(TABLE)
    old, new = rule(track=before), rule(track=after)
    migrate(conn, [old])
    conn.execute("INSERT INTO orders SELECT g, 'paid', %s FROM generate_series(1, 30) g", (T0,))
    with freeze_time(T0 + H + S):
        assert claim(conn, old) == 30
    for step in plan(conn, [new]):
        if step.run is not None:
            break
        conn.execute(step.statement.encode())
    info = inspect_table(conn, "public", "orders")
    assert info is not None
    to: trackswitch.Track = "table" if after == "table" else "inline"
    assert trackswitch.copy(conn, new, info, to, batch=7) == 30
    assert trackswitch.copy(conn, new, info, to, batch=7) == 0


def test_a_state_table_left_by_an_abandoned_switch_is_made_to_match(conn: Conn) -> None:
    """A state table with a row that inline's columns no longer have (here: a baselined
    episode of order 1 that ended, then the order opened again with the same deadline):
    the copy takes inline's word for it, so order 1 pages in its new episode."""
    conn.execute(TABLE)
    inline, table = rule(track="inline"), rule(track="table")
    migrate(conn, [inline])
    conn.execute("INSERT INTO orders VALUES (1, 'shipped', %s)", (T0,))
    for step in plan(conn, [table]):  # only the state table, as an older switch left it
        if step.statement.startswith("CREATE TABLE"):
            conn.execute(step.statement.encode())
    conn.execute("INSERT INTO slawatch.late_state VALUES (1, %s, 0, 0, NULL)", (T0,))
    conn.execute("UPDATE orders SET status = 'paid'")
    migrate(conn, [table])
    with freeze_time(T0 + H + S):
        assert claim(conn, table) == 1


def test_a_state_table_not_carried_over_is_named_and_left_alone(conn: Conn) -> None:
    """An older slawatch switched to inline without carrying the state over (it dropped
    the due index, kept the state table): that state is stale, so it is not copied into
    the columns; migrate names the table and how to drop it."""
    conn.execute(TABLE)
    table, inline = rule(track="table"), rule(track="inline")
    migrate(conn, [table])
    conn.execute("INSERT INTO orders VALUES (1, 'paid', %s)", (T0,))
    with freeze_time(T0 + H + S):
        assert claim(conn, table) == 1
    conn.execute("DROP INDEX sw_late_due")
    assert not [d for d in migrate(conn, [inline]) if "carried over" in d]
    assert conn.execute("SELECT sw_late_ep FROM orders").fetchone() == (0,)
    (left,) = leftovers(conn, [inline])
    assert left.what.startswith("slawatch.late_state: left by rule late's track: table, unused")
    assert left.statement == 'DROP TABLE "slawatch"."late_state";'


def test_a_partitioned_table_switches_both_ways(conn: Conn) -> None:
    """Rows are found by the whole key (id, paid_at) in every partition."""
    conn.execute(
        "CREATE TABLE orders (id bigint, status text NOT NULL, paid_at timestamptz NOT NULL,"
        " PRIMARY KEY (id, paid_at)) PARTITION BY RANGE (paid_at);"
        " CREATE TABLE orders_a PARTITION OF orders"
        " FOR VALUES FROM ('2026-01-01') TO ('2026-03-01');"
        " CREATE TABLE orders_b PARTITION OF orders"
        " FOR VALUES FROM ('2026-03-01') TO ('2026-05-01')"
    )
    inline, table = rule(track="inline"), rule(track="table")
    migrate(conn, [inline])
    # The same id in both partitions: two rows.
    conn.execute(
        "INSERT INTO orders VALUES (1, 'paid', %s), (1, 'paid', %s), (2, 'paid', %s)",
        (T0 - 24 * H, T0, T0),
    )
    with freeze_time(T0 + H + S) as clock:
        assert claim(conn, inline) == 3
        assert any("(3 rows)" in d for d in migrate(conn, [table]))
        assert claim(conn, table) == 0
        clock.move_to(T0 + 7 * H + 2 * S)
        assert claim(conn, table) == 3  # #2 of each, on schedule
        assert any("(3 rows)" in d for d in migrate(conn, [inline]))
        assert claim(conn, inline) == 0
        clock.move_to(T0 + 13 * H + 3 * S)
        assert claim(conn, inline) == 3  # #3
    assert sorted(n for _, _, n in episodes(conn, "late")) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
