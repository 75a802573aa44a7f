"""Per-row deadlines: ``deadline:`` as an SQL expression over the row's columns.

Claimed on both tracks through an expression index, explained, and refused with one
line when it cannot be indexed (another table, a subquery, a volatile or only-stable
function, an unknown column, not a timestamp).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slawatch.config.rules import Rule
from slawatch.engine.baseline import baseline_rule, recorded, render
from slawatch.engine.due import count_due
from slawatch.engine.migrate import check, migrate
from slawatch.engine.ready import prepare
from slawatch.errors import ConfigError
from slawatch.operate.explain import explain
from slawatch.operate.inspect import rule_status
from tests.integration.helpers import Conn, alerts_of, claim_all
from tests.integration.test_cli import assert_one_line_error, slawatch

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)

TICKETS = """
CREATE TABLE tickets (
    id bigint PRIMARY KEY,
    status text NOT NULL,
    created_at timestamptz NOT NULL,
    opened timestamp NOT NULL,
    sla_hours integer NOT NULL
)"""

# A timestamptz column moved into UTC wall time, plus hours: immutable, so indexable.
IN_UTC = "(created_at AT TIME ZONE 'UTC') + make_interval(hours => sla_hours)"


def rule(track: str = "inline", **fields: Any) -> Rule:
    base = {
        "name": "ticket_late",
        "table": "public.tickets",
        "key": "id",
        "deadline": IN_UTC,
        "after": "30m",
        "open_when": "status = 'open'",
        "notify": ["console"],
        "track": track,
    }
    made = Rule.model_validate(base | fields)
    made._source = "rules/ticket_late.yaml"  # type: ignore[assignment]
    return made


def fill(conn: Conn, rows: int) -> None:
    """``rows`` tickets created over the last days, each with its own SLA (1 to 48 h);
    every tenth is closed."""
    conn.execute(TICKETS)
    conn.execute(
        "INSERT INTO tickets SELECT g, CASE WHEN g %% 10 = 0 THEN 'closed' ELSE 'open' END,"
        " %(now)s - g * interval '7 minutes',"
        " (%(now)s - g * interval '7 minutes') AT TIME ZONE 'UTC', 1 + g %% 48"
        " FROM generate_series(1, %(rows)s) g",
        {"now": NOW, "rows": rows},
    )


def due_keys(rows: int, at: datetime = NOW) -> set[str]:
    """The tickets due at ``at``, computed here the slow way: open, and created + SLA
    + 30 min before ``at``."""
    out = set()
    for g in range(1, rows + 1):
        created = NOW - g * timedelta(minutes=7)
        if g % 10 and created + timedelta(hours=1 + g % 48) + timedelta(minutes=30) < at:
            out.add(str(g))
    return out


def alerted(conn: Conn) -> list[str]:
    return [key for (key,) in alerts_of(conn, "ticket_late", "key")]


@pytest.mark.parametrize(
    "deadline",
    [IN_UTC, "opened + sla_hours * interval '1 hour'"],
    ids=["timestamptz-in-utc", "timestamp"],
)
def test_claims_exactly_the_rows_whose_computed_deadline_passed(
    conn: Conn, track: str, deadline: str
) -> None:
    fill(conn, 1000)
    expected = due_keys(1000)
    assert 100 < len(expected) < 900  # some due, some not: the expression decides
    r = rule(track, deadline=deadline)
    migrate(conn, [r])
    plan = prepare(conn, r)
    assert claim_all(conn, plan, NOW) == len(expected)
    got = alerted(conn)
    assert len(got) == len(set(got))  # each once
    assert set(got) == expected
    # The alert carries the computed deadline, and the row the columns it reads.
    (row,) = [
        (d, data)
        for k, e, d, data in alerts_of(
            conn, "ticket_late", "key", "episode", "deadline", "row_data"
        )
        if (k, e) == ("101", 1)
    ]
    created = NOW - 101 * timedelta(minutes=7)
    assert row[0] == created + timedelta(hours=1 + 101 % 48)
    assert set(row[1]) == {"id", "created_at", "sla_hours"} or set(row[1]) == {
        "id",
        "opened",
        "sla_hours",
    }
    # Nothing more is due at the same time. A changed SLA is a new episode; 11 minutes
    # on (past track: table's sweep), it and the rows that fell due since are claimed.
    assert claim_all(conn, plan, NOW) == 0
    conn.execute("UPDATE tickets SET sla_hours = sla_hours + 1 WHERE id = 101")
    later = NOW + timedelta(minutes=11)
    fell_due = due_keys(1000, later) - expected
    assert fell_due and "101" not in fell_due
    assert claim_all(conn, plan, later) == len(fell_due) + 1
    assert set(alerted(conn)) == expected | fell_due
    assert max(e for k, e in alerts_of(conn, "ticket_late", "key", "episode") if k == "101") == 2


def test_dry_run_status_and_baseline_read_the_expression(conn: Conn, track: str) -> None:
    fill(conn, 1000)
    expected = len(due_keys(1000))
    r = rule(track)
    migrate(conn, [r])
    info = check(conn, [r])[r.name]
    assert count_due(conn, r, info, NOW) == expected  # check, run --dry-run
    (status,) = rule_status(conn, [r], NOW)
    assert (status.overdue, status.not_notified, status.problem) == (expected, expected, None)
    # A baseline marks them seen: nothing pages for them.
    assert baseline_rule(conn, r, info, NOW) == expected
    assert claim_all(conn, prepare(conn, r), NOW) == 0


def test_the_printed_baseline_reads_the_expression(conn: Conn, track: str) -> None:
    fill(conn, 1000)
    r = rule(track)
    migrate(conn, [r])
    script = render(r, check(conn, [r])[r.name], NOW, batch=100)
    (block,) = re.findall(
        r"^DO \$slawatch_baseline\$.*?\$slawatch_baseline\$;", script, re.S | re.M
    )
    conn.execute(block.encode())
    assert recorded(conn)["ticket_late"].rows == len(due_keys(1000))
    assert claim_all(conn, prepare(conn, r), NOW) == 0


def test_the_index_is_on_the_expression(conn: Conn, track: str) -> None:
    fill(conn, 10)
    r = rule(track)
    migrate(conn, [r])
    name = r.first_index if track == "inline" else r.due_index
    (definition,) = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,)
    ).fetchone()  # type: ignore[misc]
    assert "((created_at AT TIME ZONE 'UTC'::text) + make_interval(" in definition, definition
    # The episode's deadline value is kept in the expression's type (timestamp here).
    table, column = (
        ("tickets", r.seen_column) if track == "inline" else ("ticket_late_state", "sw_seen")
    )
    (seen_type,) = conn.execute(
        "SELECT data_type FROM information_schema.columns"
        " WHERE table_name = %s AND column_name = %s",
        (table, column),
    ).fetchone()  # type: ignore[misc]
    assert seen_type == "timestamp without time zone"
    # Idempotent: the canonical definition matches the one migrate asks for.
    assert migrate(conn, [r]) == []


def test_explain_shows_the_expression_index_used(conn: Conn, track: str) -> None:
    fill(conn, 50_000)
    conn.execute("UPDATE tickets SET status = 'closed' WHERE id % 100 <> 0")
    r = rule(track)
    migrate(conn, [r])
    conn.execute("ANALYZE tickets")
    result = explain(conn, r, NOW)
    assert result.ok, result.verdict
    assert result.statements[0].seq_scans == []
    wanted = r.first_index if track == "inline" else r.due_index
    assert wanted in result.statements[0].indexes, result.statements[0].text
    assert "make_interval" in result.statements[0].sql


@pytest.mark.empty_database
@pytest.mark.parametrize(
    ("deadline", "expected"),
    [
        (
            "created_at + make_interval(hours => sla_hours)",
            "deadline: operator +(timestamp with time zone,interval) is STABLE, and an index"
            " expression must be IMMUTABLE: compute it in a fixed zone, e.g. (created_at AT"
            " TIME ZONE 'UTC')",
        ),
        (
            "opened + random() * interval '1 hour'",
            "deadline: function random() is VOLATILE, and an index expression must be IMMUTABLE",
        ),
        (
            "opened + sla_hourz * interval '1 hour'",
            "deadline: column 'sla_hourz' not in public.tickets (id, status, created_at, opened,"
            " sla_hours); a deadline is computed from the row's own columns; for a value from"
            " another table, keep the deadline in a column of this table that a trigger fills"
            " in, or use an event rule (docs/how-to/watch-a-table.md)",
        ),
        ("sla_hours + 1", "deadline: (sla_hours + 1) is integer; it must be timestamp"),
        ("opened::date + 1", "deadline: (opened::date + 1) is date; it must be timestamp"),
        ("max(opened)", "deadline: must be one row's value: no aggregate"),
        # A cast through text calls the type's input function (STABLE for timestamptz),
        # which the view's query does not name: building the index on the empty copy
        # is what says it.
        ("status::timestamptz", "deadline: functions in index expression must be marked"),
        ("opened + 'x'", 'deadline: invalid input syntax for type interval: "x"'),
    ],
)
def test_bad_deadline_expressions_change_nothing(conn: Conn, deadline: str, expected: str) -> None:
    fill(conn, 10)
    with pytest.raises(ConfigError) as exc:
        migrate(conn, [rule(name="good", deadline="opened"), rule(deadline=deadline)])
    assert str(exc.value) == f"rules/ticket_late.yaml: {expected}" or str(exc.value).startswith(
        f"rules/ticket_late.yaml: {expected}"
    ), str(exc.value)
    assert "\n" not in str(exc.value)
    assert conn.execute("SELECT to_regnamespace('slawatch')").fetchone() == (None,)


# ------------------------------------------------------- another table: rental + film

RENTALS = """
CREATE TABLE film (film_id int PRIMARY KEY, title text NOT NULL,
                   rental_duration smallint NOT NULL DEFAULT 3);
CREATE TABLE inventory (inventory_id int PRIMARY KEY,
                        film_id int NOT NULL REFERENCES film);
CREATE TABLE rental (rental_id int PRIMARY KEY, rental_date timestamp NOT NULL,
                     inventory_id int NOT NULL REFERENCES inventory,
                     return_date timestamp);
INSERT INTO film VALUES (1, 'ACADEMY DINOSAUR', 6), (2, 'ACE GOLDFINGER', 3);
INSERT INTO inventory VALUES (10, 1), (20, 2);
-- Rented 5 days ago: film 1 (6 days) is not due, film 2 (3 days) is; one returned.
INSERT INTO rental SELECT id, (now() AT TIME ZONE 'UTC') - interval '5 days', inv, ret
  FROM (VALUES (100, 10, NULL), (200, 20, NULL),
               (300, 20, (now() AT TIME ZONE 'UTC') - interval '4 days')) v(id, inv, ret);
"""

# docs/how-to/watch-a-table.md, Per-row deadlines: the due date kept by a trigger (a
# generated column cannot read another table).
DUE_AT = """
ALTER TABLE rental ADD COLUMN due_at timestamp;
CREATE FUNCTION rental_due_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.due_at := NEW.rental_date + (SELECT f.rental_duration FROM inventory i
                  JOIN film f USING (film_id) WHERE i.inventory_id = NEW.inventory_id)
                  * interval '1 day';
    RETURN NEW;
END $$;
CREATE TRIGGER rental_due_at BEFORE INSERT OR UPDATE OF rental_date, inventory_id
    ON rental FOR EACH ROW EXECUTE FUNCTION rental_due_at();
UPDATE rental SET rental_date = rental_date;  -- fills due_at for the rows there
"""


def rental_rule(tmp_path: Path, deadline: str) -> None:
    (tmp_path / "rental_overdue.yaml").write_text(
        "table: public.rental\n"
        f'deadline: "{deadline}"\n'
        "open_when: return_date IS NULL\n"
        "track: table\n"
        "notify: [console]\n"
    )


def test_a_deadline_from_another_table_says_the_two_ways_then_a_trigger_kept_column_works(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    conn.execute(RENTALS)
    rental_rule(tmp_path, "rental_date + rental_duration * interval '1 day'")
    result = slawatch("--rules", str(tmp_path), "check", dsn=dsn)
    assert_one_line_error(
        result,
        2,
        "rental_overdue.yaml: deadline: column 'rental_duration' not in public.rental"
        " (rental_id, rental_date, inventory_id, return_date); a deadline is computed from"
        " the row's own columns; for a value from another table, keep the deadline in a"
        " column of this table that a trigger fills in, or use an event rule",
    )
    rental_rule(tmp_path, "rental_date + film.rental_duration * interval '1 day'")
    result = slawatch("--rules", str(tmp_path), "check", dsn=dsn)
    assert_one_line_error(result, 2, "deadline: film.rental_duration is another table's column")
    # The documented way: a column a trigger keeps, and the rule on it.
    conn.execute(DUE_AT)
    rental_rule(tmp_path, "due_at")
    assert slawatch("--rules", str(tmp_path), "migrate", dsn=dsn).returncode == 0
    run = slawatch("--rules", str(tmp_path), "run", "--once", dsn=dsn)
    assert run.returncode == 0, run.stderr
    assert alerts_of(conn, "rental_overdue", "key") == [("200",)]


def test_check_refuses_an_only_stable_deadline_before_migrate(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    conn.execute(TICKETS)
    (tmp_path / "ticket_late.yaml").write_text(
        "table: public.tickets\n"
        'deadline: "created_at + make_interval(hours => sla_hours)"\n'
        "open_when: status = 'open'\n"
        "notify: [console]\n"
    )
    result = slawatch("--rules", str(tmp_path), "check", dsn=dsn)
    assert_one_line_error(
        result, 2, "deadline: operator +(timestamp with time zone,interval) is STABLE"
    )
