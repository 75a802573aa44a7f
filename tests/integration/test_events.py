"""Event rules (docs/explanation/events.md): deadlines opened and closed by events, each semantic
walked with the application clock, against a real PostgreSQL.

Events go in through ``slawatch.event_at`` (the function behind ``slawatch.event``
and ``slawatch.events``) with an explicit receive time, so the tests time-travel;
the claims run through ``drain`` as ``slawatch run`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.claim import drain
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare, prepare_ready
from slawatch.engine.timers import prune_timers
from slawatch.events.ingest import ingest, parse_events
from slawatch.runtime.maintain import prune_events
from tests.integration.helpers import Conn, FixedClock, alerts_of

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)


def parcel(**events: Any) -> Rule:
    spec = {
        "start": "parcel_shipped",
        "stop": ["parcel_delivered", "parcel_returned"],
        "fail": "parcel_lost",
        "within": "72h",
        **events,
    }
    return Rule.model_validate(
        {
            "name": "parcel",
            "events": spec,
            "renotify": {"every": "12h", "max": 3},
            "notify": ["hook"],
            "resolve": True,
        }
    )


def backup(**events: Any) -> Rule:
    return Rule.model_validate(
        {"name": "backup", "events": {"beat": "backup_ping", **events}, "notify": ["hook"]}
    )


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=2, pooler="none") as database:
        yield database


def setup(conn: Conn, *rules: Rule) -> None:
    migrate(conn, list(rules))


def send(
    conn: Conn,
    kind: str,
    key: str,
    at: datetime,
    data: dict[str, Any] | None = None,
    id: str | None = None,
    received: datetime | None = None,
) -> str:
    row = conn.execute(
        "SELECT slawatch.event_at(%s, %s, %s, %s, %s::jsonb, %s)",
        (received or at, kind, key, at, None if data is None else Jsonb(data), id),
    ).fetchone()
    assert row is not None
    return str(row[0])


def scan(db: Database, rule: Rule, at: datetime) -> int:
    """One scan of ``rule`` at ``at``: the alerts it wrote."""
    with db.connection("test") as c:
        plan = prepare(c, rule)
    return drain(db, plan, FixedClock(at)).claimed


def pages(conn: Conn, rule: str = "parcel") -> list[tuple[str, int, int]]:
    """(key, episode, n) of every firing alert, in order, in either shape of the outbox."""
    return [(k, e, n) for k, e, n in alerts_of(conn, rule, "key", "episode", "n", kind="firing")]


def resolved(conn: Conn, rule: str = "parcel") -> list[str]:
    return [k for (k,) in alerts_of(conn, rule, "key", kind="resolved")]


def alert(conn: Conn, key: str, rule: str = "parcel") -> tuple[Any, Any]:
    """(row_data, deadline) of the one firing alert of ``key``."""
    rows = alerts_of(conn, rule, "key", "row_data", "deadline", kind="firing")
    got = [(data, deadline) for k, data, deadline in rows if k == key]
    assert len(got) == 1, got
    return got[0]


def timer(conn: Conn, key: str, rule: str = "parcel") -> tuple[Any, ...] | None:
    """(due_at, open) of one key's timer."""
    return conn.execute(
        psycopg.sql.SQL("SELECT due_at, open FROM {} WHERE key = %s").format(
            psycopg.sql.Identifier("slawatch", f"{rule}_timers")
        ),
        (key,),
    ).fetchone()


def test_a_start_without_its_stop_pages_renotifies_and_resolves_when_the_stop_comes(
    conn: Conn, db: Database
) -> None:
    rule = parcel()
    setup(conn, rule)
    assert send(conn, "parcel_shipped", "1Z", T0, {"to": "Berlin"}) == "accepted"
    assert scan(db, rule, T0 + 72 * H - S) == 0  # not due yet
    assert scan(db, rule, T0 + 72 * H + S) == 1
    row = alert(conn, "1Z")
    assert row[0]["data"] == {"to": "Berlin"}
    # The start is the timer's started_at (the rule has one start type); the events
    # after it are listed (none yet).
    assert row[0]["started_at"] == (T0).isoformat() and row[0]["events"] == []
    assert row[1] == T0 + 72 * H
    assert scan(db, rule, T0 + 84 * H + 2 * S) == 1  # renotify every 12h
    send(conn, "parcel_delivered", "1Z", T0 + 85 * H)
    assert scan(db, rule, T0 + 96 * H + 3 * S) == 0  # closed: no #3
    assert pages(conn) == [("1Z", 1, 1), ("1Z", 1, 2)]
    assert resolved(conn) == ["1Z"]


def test_a_stop_in_time_never_pages(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_shipped", "A", T0)
    send(conn, "parcel_returned", "A", T0 + 10 * H)
    assert scan(db, rule, T0 + 100 * H) == 0
    assert timer(conn, "A") == (T0 + 72 * H, False)


def test_a_stop_that_arrives_before_its_start_is_kept_so_reordering_never_pages(
    conn: Conn, db: Database
) -> None:
    rule = parcel()
    setup(conn, rule)
    # The stop (at 10:00) is received first; its start (at 09:00) an hour later.
    send(conn, "parcel_delivered", "B", T0 + H)
    assert scan(db, rule, T0 + H) == 0
    send(conn, "parcel_shipped", "B", T0, received=T0 + 2 * H)
    assert timer(conn, "B") == (T0 + 72 * H, False)
    assert scan(db, rule, T0 + 100 * H) == 0
    assert pages(conn) == []


def test_a_stop_received_first_with_its_starts_own_time_completes_the_timer(
    conn: Conn, db: Database
) -> None:
    """Start and stop at the same instant (one transaction's now), the stop received
    first: the cycle is done, not a timer left open that pages."""
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_delivered", "E", T0)
    send(conn, "parcel_shipped", "E", T0, received=T0 + H)
    assert timer(conn, "E") == (T0 + 72 * H, False)
    assert scan(db, rule, T0 + 100 * H) == 0
    assert pages(conn) == []


def test_a_stop_from_before_the_open_start_does_not_close_it(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_shipped", "C", T0)
    send(conn, "parcel_delivered", "C", T0 - H)  # an old cycle's stop, received late
    assert timer(conn, "C") == (T0 + 72 * H, True)
    assert scan(db, rule, T0 + 73 * H) == 1


def test_a_second_start_while_open_keeps_the_first(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_shipped", "D", T0)
    send(conn, "parcel_shipped", "D", T0 + 10 * H)
    assert timer(conn, "D") == (T0 + 72 * H, True)
    assert scan(db, rule, T0 + 72 * H + S) == 1


def test_a_new_start_after_a_closed_cycle_opens_the_next(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_shipped", "E", T0)
    send(conn, "parcel_delivered", "E", T0 + H)
    send(conn, "parcel_shipped", "E", T0 + 2 * H)
    assert timer(conn, "E") == (T0 + 74 * H, True)
    assert scan(db, rule, T0 + 74 * H + S) == 1


def test_a_repeat_of_type_and_id_is_dropped_until_the_dedupe_window_prunes_its_id(
    conn: Conn, db: Database
) -> None:
    rule = parcel()
    setup(conn, rule)
    assert send(conn, "parcel_shipped", "F", T0, id="evt-1") == "accepted"
    assert send(conn, "parcel_shipped", "G", T0, id="evt-1", received=T0 + H) == "duplicate"
    assert timer(conn, "G") is None
    # The same id of another type is another event.
    assert send(conn, "parcel_delivered", "F", T0 + H, id="evt-1") == "accepted"
    # The window is a setting (SLAWATCH_DEDUPE_WINDOW): 2 hours here. Within it the
    # maintenance keeps the id; past it, it prunes the id, which may then come again.
    window = timedelta(hours=2)
    prune_events(db, [rule], FixedClock(T0 + 2 * H - S), timedelta(days=30), dedupe=window)
    assert send(conn, "parcel_shipped", "G", T0, id="evt-1", received=T0 + 2 * H) == "duplicate"
    got = prune_events(db, [rule], FixedClock(T0 + 2 * H + S), timedelta(days=30), dedupe=window)
    assert got.event_ids == 1  # evt-1 of parcel_shipped; that of parcel_delivered is newer
    later = T0 + 2 * H + M
    assert send(conn, "parcel_shipped", "G", later, id="evt-1") == "accepted"


def test_a_start_whose_deadline_already_passed_pages_at_the_next_scan(
    conn: Conn, db: Database
) -> None:
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_shipped", "H", T0 - 100 * H, received=T0)
    assert scan(db, rule, T0 + S) == 1


def test_a_stop_sooner_than_min_pages_once(conn: Conn, db: Database) -> None:
    rule = parcel(min="5m")
    setup(conn, rule)
    send(conn, "parcel_shipped", "I", T0)
    send(conn, "parcel_delivered", "I", T0 + 2 * M)  # ran too fast
    send(conn, "parcel_shipped", "J", T0)
    send(conn, "parcel_delivered", "J", T0 + 6 * M)  # in its time
    assert scan(db, rule, T0 + 3 * M) == 1
    assert alert(conn, "I")[0]["too_fast"] is True
    # Once: later scans close it (a resolved notice, as for any episode) and page no more.
    assert scan(db, rule, T0 + 13 * H) == 0
    assert scan(db, rule, T0 + 100 * H) == 0
    assert pages(conn) == [("I", 1, 1)]
    assert timer(conn, "I") == (T0 + 2 * M, False)


def test_a_stop_that_came_first_and_too_soon_after_its_start_pages_once(
    conn: Conn, db: Database
) -> None:
    rule = parcel(min="5m")
    setup(conn, rule)
    send(conn, "parcel_delivered", "K", T0 + M)
    send(conn, "parcel_shipped", "K", T0, received=T0 + 2 * M)
    assert scan(db, rule, T0 + 3 * M) == 1
    assert scan(db, rule, T0 + 100 * H) == 0


def test_a_heartbeat_opens_at_its_first_beat_and_each_beat_closes_the_last(
    conn: Conn, db: Database
) -> None:
    rule = backup(within="25h")
    setup(conn, rule)
    assert scan(db, rule, T0 + 100 * H) == 0  # no beat yet: nothing expected
    send(conn, "backup_ping", "db1", T0)
    send(conn, "backup_ping", "db1", T0 + 24 * H)
    assert scan(db, rule, T0 + 26 * H) == 0  # the second beat moved the deadline
    assert scan(db, rule, T0 + 49 * H + S) == 1  # the third never came
    send(conn, "backup_ping", "db1", T0 + 50 * H)
    assert scan(db, rule, T0 + 51 * H) == 0
    assert timer(conn, "db1", "backup") == (T0 + 75 * H, True)
    # An older beat received late changes nothing.
    send(conn, "backup_ping", "db1", T0 + 30 * H, received=T0 + 51 * H)
    assert timer(conn, "db1", "backup") == (T0 + 75 * H, True)
    assert pages(conn, "backup") == [("db1", 1, 1)]


def test_a_scheduled_beat_is_due_at_the_next_scheduled_time_plus_grace(
    conn: Conn, db: Database
) -> None:
    rule = backup(schedule="0 2 * * *", grace="1h", timezone="Europe/Berlin")
    setup(conn, rule)
    send(conn, "backup_ping", "db1", T0)  # 10:00 in Berlin
    assert scan(db, rule, T0) == 0
    # Next 02:00 Berlin is 01:00 UTC on 3 March; plus an hour of grace.
    due = datetime(2026, 3, 3, 2, 0, tzinfo=UTC)
    assert timer(conn, "db1", "backup") == (due, True)
    assert scan(db, rule, due - S) == 0
    assert scan(db, rule, due + S) == 1
    send(conn, "backup_ping", "db1", due + M)
    assert scan(db, rule, due + 2 * M) == 0
    assert timer(conn, "db1", "backup") == (due + 24 * H, True)


def test_a_failure_pages_at_once_in_the_open_episode(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    # Not yet due: a failure makes it due now.
    send(conn, "parcel_shipped", "L", T0)
    send(conn, "parcel_lost", "L", T0 + H)
    assert scan(db, rule, T0 + H + S) == 1
    # Paged already: a failure is the next notification, now, in the same episode.
    send(conn, "parcel_lost", "L", T0 + 2 * H)
    assert scan(db, rule, T0 + 2 * H + S) == 1
    # No open deadline: a failure opens one, due now.
    send(conn, "parcel_lost", "M", T0 + 3 * H)
    assert scan(db, rule, T0 + 3 * H + S) == 1
    assert pages(conn) == [("L", 1, 1), ("L", 1, 2), ("M", 1, 1)]


def test_the_sql_function_is_part_of_the_applications_transaction(conn: Conn, dsn: str) -> None:
    setup(conn, parcel())
    with psycopg.connect(dsn) as app:  # not autocommit: the application's transaction
        app.execute("SELECT slawatch.event('parcel_shipped', 'rolled-back')")
        app.rollback()
        app.execute("SELECT slawatch.event('parcel_shipped', 'committed', now(), '{}', 'x')")
        app.commit()
    assert timer(conn, "rolled-back") is None
    assert timer(conn, "committed") is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("parcel_shipped", "k" * 201), "key must be 1 to 200 characters"),
        (("parcel_shipped", ""), "key must be 1 to 200 characters"),
        (("parcel_shipped", None), "type and key are required"),
        (("parcel_shipped", "k", "9999-01-01"), "more than 5 minutes in the future"),
        (("parcel_shipped", "k", None, "[1]"), "data must be a JSON object"),
    ],
)
def test_the_sql_function_refuses_bad_events(
    conn: Conn, args: tuple[Any, ...], message: str
) -> None:
    setup(conn, parcel())
    padded = (*args, *([None] * (5 - len(args))))
    with pytest.raises(psycopg.DataError, match=message):
        conn.execute("SELECT slawatch.event(%s, %s, %s::timestamptz, %s::jsonb, %s)", padded)
    assert conn.execute("SELECT count(*) FROM slawatch.parcel_timers").fetchone() == (0,)


def test_an_unknown_type_is_held_not_applied(conn: Conn) -> None:
    setup(conn, parcel())
    assert conn.execute("SELECT slawatch.event('parcel_shiped', 'k')").fetchone() == ("held",)
    assert conn.execute("SELECT count(*) FROM slawatch.parcel_timers").fetchone() == (0,)
    held = conn.execute("SELECT type, key FROM slawatch.event_held").fetchall()
    assert held == [("parcel_shiped", "k")]


def test_a_batch_is_all_or_nothing(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    now = T0
    events = parse_events(
        {"events": [{"type": "parcel_shipped", "key": str(i), "id": f"e{i}"} for i in range(5)]},
        {"parcel_shipped"},
        now,
        timedelta(days=30),
    )
    got = ingest(db, events, now)
    assert (got.accepted, got.duplicates) == (5, 0)
    again = ingest(db, events, now)
    assert (again.accepted, again.duplicates) == (0, 5)
    # A type the database's function does not know (rules changed, not migrated):
    # held, and the rest of the batch stored.
    mixed = parse_events(
        {"events": [{"type": "parcel_shipped", "key": "new"}, {"type": "other", "key": "x"}]},
        {"parcel_shipped", "other"},
        now,
        timedelta(days=30),
    )
    got = ingest(db, mixed, now)
    assert (got.accepted, got.duplicates, got.held) == (1, 0, 1)
    assert timer(conn, "new") is not None


def test_changed_event_types_need_a_migrate_before_the_rule_runs(conn: Conn) -> None:
    setup(conn, parcel())
    changed = parcel(stop="parcel_delivered")
    plans, problems = prepare_ready(conn, [changed])
    assert not plans
    assert "run 'slawatch migrate'" in problems["parcel"]
    done = migrate(conn, [changed])
    assert any("slawatch.event(): updated" in line for line in done)
    assert migrate(conn, [changed]) == []
    plans, problems = prepare_ready(conn, [changed])
    assert list(plans) == ["parcel"] and not problems


def test_retention_removes_closed_timers_and_stops_that_waited_too_long(
    conn: Conn, db: Database
) -> None:
    rule = parcel()
    setup(conn, rule)
    send(conn, "parcel_shipped", "old", T0)
    send(conn, "parcel_delivered", "old", T0 + H)
    send(conn, "parcel_shipped", "open", T0)
    send(conn, "parcel_delivered", "orphan-stop", T0 + 100 * H)  # its start never comes
    send(conn, "parcel_shipped", "middle", T0 + 140 * H)  # closed within retention
    send(conn, "parcel_delivered", "middle", T0 + 150 * H)
    send(conn, "parcel_shipped", "recent", T0 + 290 * H)
    send(conn, "parcel_delivered", "recent", T0 + 291 * H)
    now = T0 + 300 * H
    with db.connection("test") as c:
        # Retention of 10 days: "old" goes; the orphan stop, newer than that, waited
        # longer than `within` (72h) for its start.
        removed = prune_timers(c, rule, now - 240 * H, now, 1000)
    assert removed == 2
    keys = conn.execute("SELECT key FROM slawatch.parcel_timers ORDER BY key").fetchall()
    assert [k for (k,) in keys] == ["middle", "open", "recent"]


def test_maintenance_prunes_timers_and_old_event_ids_in_bounded_batches(
    conn: Conn, db: Database
) -> None:
    rule = parcel()
    setup(conn, rule)
    for i in range(5):
        send(conn, "parcel_shipped", f"k{i}", T0, id=f"s{i}")
        send(conn, "parcel_delivered", f"k{i}", T0 + H, id=f"d{i}")
    send(conn, "parcel_shipped", "fresh", T0 + 40 * H, id="fresh")
    now = T0 + 48 * H
    result = prune_events(db, [rule], FixedClock(now), timedelta(days=1), batch=2)
    assert (result.timers, result.event_ids) == (5, 10)
    assert result.batches == 3 + 6 + 1  # 2+2+1 timers, 2*5+0 ids, 0 held events
    left = conn.execute("SELECT id FROM slawatch.event_seen").fetchall()
    assert left == [("fresh",)]


def test_the_printed_grants_let_slawatch_run_and_the_application_send_events(
    conn: Conn, dsn: str
) -> None:
    """Least privilege: the run role ingests batches and claims with the printed GRANTs;
    the application's role calls slawatch.event and nothing else of slawatch's."""
    import uuid

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from slawatch.engine.claim import claim_batch
    from slawatch.engine.migrate import grants, render

    rule = parcel()
    setup(conn, rule)
    tag = uuid.uuid4().hex[:6]
    run_role, app_role = f"sw_run_{tag}", f"sw_app_{tag}"
    conn.execute(f"CREATE ROLE {run_role} LOGIN")
    conn.execute(f"CREATE ROLE {app_role} LOGIN")

    def as_role(role: str) -> psycopg.Connection[Any]:
        params = conninfo_to_dict(dsn) | {"user": role}
        params.pop("password", None)
        return psycopg.connect(make_conninfo(**params), autocommit=True)

    try:
        for g in grants([rule], run_role):
            conn.execute(g)
        printed = render([rule])
        assert "GRANT EXECUTE ON FUNCTION slawatch.event(" in printed
        for line in printed.splitlines():
            if "your_app_role" in line and line.startswith("GRANT"):
                conn.execute(line.replace("your_app_role", app_role))
        with as_role(app_role) as app:
            app.execute("SELECT slawatch.event('parcel_shipped', 'via-app', %s)", (T0,))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT * FROM slawatch.parcel_timers")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT * FROM slawatch.events('[]', now())")
        with as_role(run_role) as run:
            got = run.execute(
                "SELECT outcome FROM slawatch.events(%s::jsonb, %s)",
                ('[{"type": "parcel_shipped", "key": "via-run"}]', T0),
            ).fetchall()
            assert got == [("accepted",)]
            plan = prepare(run, rule)
            assert claim_batch(run, plan, T0 + 73 * H) == 2
    finally:
        for role in (run_role, app_role):
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_a_process_running_some_of_the_event_rules_needs_no_migrate_for_them(
    conn: Conn,
) -> None:
    """slawatch.event() serves every event rule; a process (or explain, or a test) that
    prepares one of them must not take the others' parts for a pending change."""
    both = [parcel(), backup(within="25h")]
    setup(conn, *both)
    assert migrate(conn, list(reversed(both))) == []  # the order of the rules is no change
    plans, problems = prepare_ready(conn, [both[1]])
    assert list(plans) == ["backup"] and not problems
    prepare(conn, both[0])


def test_with_several_start_types_the_alert_says_which_one_started_it(
    conn: Conn, db: Database
) -> None:
    rule = parcel(start=["parcel_shipped", "parcel_picked_up"])
    setup(conn, rule)
    send(conn, "parcel_picked_up", "N", T0)
    assert scan(db, rule, T0 + 73 * H) == 1
    assert [e["type"] for e in alert(conn, "N")[0]["events"]] == ["parcel_picked_up"]


def test_the_events_of_one_batch_are_applied_in_the_batchs_order(conn: Conn, db: Database) -> None:
    rule = parcel()
    setup(conn, rule)
    raw = [  # the first start received wins, whatever its `at`
        {"type": "parcel_shipped", "key": "P", "at": (T0 + H).isoformat()},
        {"type": "parcel_shipped", "key": "P", "at": T0.isoformat()},
    ]
    events = parse_events({"events": raw}, {"parcel_shipped"}, T0 + 3 * H, timedelta(days=30))
    assert ingest(db, events, T0 + 3 * H).accepted == 2
    assert timer(conn, "P") == (T0 + 73 * H, True)


def test_the_run_prunes_event_ids_past_its_dedupe_window(conn: Conn, dsn: str) -> None:
    """SLAWATCH_DEDUPE_WINDOW reaches the maintenance of ``slawatch run``."""
    from slawatch.runtime.scheduler import Runner

    setup(conn, parcel())
    send(conn, "parcel_shipped", "a", T0, id="old")
    send(conn, "parcel_shipped", "b", T0 + 2 * H, id="new")
    runner = Runner(dsn, [], [], clock=FixedClock(T0 + 3 * H), dedupe_window=2 * H)
    try:
        result = runner.maintain()
    finally:
        runner.close()
    assert result is not None and result.event_ids == 1
    assert conn.execute("SELECT id FROM slawatch.event_seen").fetchall() == [("new",)]
