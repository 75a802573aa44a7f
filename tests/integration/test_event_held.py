"""What the database is using is never unregistered, and no event is lost for a type
no rule knows: ``migrate`` keeps the event types of rules its folder lacks (unless
``--drop-event-types``), and ``slawatch.event()`` keeps an event of an unknown type
in ``slawatch.event_held`` until the migrate that brings its rule applies it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slawatch.cli import main
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.migrate import kept_event_types, migrate
from slawatch.engine.ready import prepare_ready
from slawatch.events.ingest import Event, ingest
from slawatch.operate.inspect import rules_report
from slawatch.operate.metrics import OutboxCollector
from slawatch.runtime.maintain import prune_events
from tests.conftest import ROOT
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_event_cli import BACKUP, PARCEL
from tests.integration.test_events_http import serve as serve_admin

serve = serve_admin  # the fixture: an admin API on a free port

T0 = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
H = timedelta(hours=1)

PARCEL_RULE = Rule.model_validate(
    {
        "name": "parcel_undelivered",
        "events": {
            "start": "parcel_shipped",
            "stop": ["parcel_delivered", "parcel_returned"],
            "within": "72h",
        },
        "notify": ["console"],
    }
)
BACKUP_RULE = Rule.model_validate(
    {"name": "backup", "events": {"beat": "backup_ping", "within": "25h"}, "notify": ["console"]}
)
KEPT = (
    "kept event types 'parcel_shipped', 'parcel_delivered', 'parcel_returned' of rule"
    " parcel_undelivered (no rule in this folder); pass --drop-event-types to remove them"
)


def event(conn: Conn, kind: str, key: str, *args: Any) -> str:
    padded = (*args, *([None] * (3 - len(args))))
    row = conn.execute(
        "SELECT slawatch.event(%s, %s, %s::timestamptz, %s::jsonb, %s)", (kind, key, *padded)
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_migrate_keeps_the_event_types_of_rules_its_folder_lacks(conn: Conn) -> None:
    migrate(conn, [PARCEL_RULE, BACKUP_RULE])
    # A second deployment (or a partial checkout) with the backup rule alone.
    assert migrate(conn, [BACKUP_RULE]) == []
    assert kept_event_types(conn, [BACKUP_RULE]) == [KEPT]
    assert event(conn, "parcel_shipped", "1Z") == "accepted"
    # The first deployment's run still starts.
    plans, problems = prepare_ready(conn, [PARCEL_RULE])
    assert list(plans) == ["parcel_undelivered"] and not problems
    # A change of the kept folder's rules keeps the other's part as it is.
    changed = BACKUP_RULE.model_copy(
        update={"events": BACKUP_RULE.events.model_copy(update={"within": timedelta(hours=30)})}  # type: ignore[union-attr]
    )
    assert any("slawatch.event(): updated for 4 event types" in d for d in migrate(conn, [changed]))
    assert event(conn, "parcel_delivered", "1Z") == "accepted"
    assert not prepare_ready(conn, [PARCEL_RULE])[1]
    # Removing them takes the flag; the types' events are held from then on.
    done = migrate(conn, [changed], drop_event_types=True)
    assert done == ["slawatch.event(): updated for 1 event type (removed rule parcel_undelivered)"]
    assert kept_event_types(conn, [changed]) == []
    assert event(conn, "parcel_shipped", "1Z2") == "held"
    assert "run 'slawatch migrate'" in prepare_ready(conn, [PARCEL_RULE])[1]["parcel_undelivered"]


def test_an_event_of_an_unknown_type_is_held_and_applied_by_the_migrate_of_its_rule(
    conn: Conn, dsn: str
) -> None:
    migrate(conn, [BACKUP_RULE])
    with psycopg.connect(dsn) as app:  # the application's transaction goes on and commits
        got = app.execute(
            "SELECT slawatch.event('parcel_shipped', '1Z', %s, '{\"to\": \"Oslo\"}', 'e1')",
            (T0,),
        ).fetchone()
        assert got == ("held",)
        app.commit()
    # The same event again (a producer's retry), and the parcel's stop, later.
    assert event(conn, "parcel_shipped", "1Z", T0 + H, None, "e1") == "held"
    assert event(conn, "parcel_shipped", "2Z", T0) == "held"
    assert event(conn, "parcel_returned", "2Z", T0 + H) == "held"
    assert event(conn, "parcel_typo", "3Z", T0) == "held"
    report = rules_report(conn, [BACKUP_RULE], T0)
    assert report.held_events == {"parcel_returned": 1, "parcel_shipped": 3, "parcel_typo": 1}

    done = migrate(conn, [BACKUP_RULE, PARCEL_RULE])
    assert (
        "slawatch.event_held: applied the held events of 'parcel_returned', 'parcel_shipped'"
        " (4 rows)"
    ) in done
    rows = conn.execute(
        "SELECT key, started_at, due_at, open, data FROM slawatch.parcel_undelivered_timers"
        " ORDER BY key"
    ).fetchall()
    # Each as it came: 1Z's start at its own `at` (the repeat of e1 dropped), 2Z's
    # start then its stop.
    assert rows == [
        ("1Z", T0, T0 + 72 * H, True, {"to": "Oslo"}),
        ("2Z", T0, T0 + 72 * H, False, {}),
    ]
    assert conn.execute("SELECT type FROM slawatch.event_held").fetchall() == [("parcel_typo",)]
    assert migrate(conn, [BACKUP_RULE, PARCEL_RULE]) == []


def test_ingest_holds_a_type_the_database_does_not_know_yet(conn: Conn, dsn: str) -> None:
    """Rules changed, not migrated: HTTP, the brokers and ``slawatch event`` store the
    batch, the unknown type's events held (counted as such), instead of failing it."""
    migrate(conn, [BACKUP_RULE])
    with Database(dsn, size=1, pooler="none") as db:
        got = ingest(db, [Event("backup_ping", "db1", T0), Event("parcel_shipped", "1Z", T0)], T0)
    assert (got.accepted, got.duplicates, got.held) == (1, 0, 1)
    assert got.by_type[("parcel_shipped", "held")] == 1


def test_http_holds_a_type_the_database_does_not_know_yet(conn: Conn, serve: Any) -> None:
    migrate(conn, [BACKUP_RULE])
    served = serve([BACKUP_RULE, PARCEL_RULE])  # the process's rules changed, not migrated
    body = {
        "events": [{"type": "backup_ping", "key": "db1"}, {"type": "parcel_shipped", "key": "1Z"}]
    }
    taken = served.api.post("/v1/events", json=body)
    assert taken.status_code == 202, taken.text
    assert taken.json() == {"accepted": 1, "duplicates": 0, "held": 1}
    assert served.count("parcel_shipped", "held") == 1
    assert conn.execute("SELECT type, key FROM slawatch.event_held").fetchall() == [
        ("parcel_shipped", "1Z")
    ]


def test_held_events_are_counted_in_metrics_and_pruned_with_the_retention(
    conn: Conn, dsn: str
) -> None:
    migrate(conn, [BACKUP_RULE])
    event(conn, "parcel_shipped", "old")
    conn.execute("UPDATE slawatch.event_held SET received = %s", (T0 - 31 * 24 * H,))
    event(conn, "parcel_shipped", "new")
    with Database(dsn, size=1, pooler="none") as db:
        collector = OutboxCollector(db, FixedClock(T0), lambda: [], lambda: [BACKUP_RULE])
        held = [m for m in collector.collect() if m.name == "slawatch_events_held"]
        assert [s.value for s in held[0].samples] == [2]
        result = prune_events(db, [BACKUP_RULE], FixedClock(T0), timedelta(days=30))
    assert result.held == 1
    assert conn.execute("SELECT key FROM slawatch.event_held").fetchall() == [("new",)]


def test_the_migrate_command_says_what_it_kept(
    conn: Conn,
    dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "parcel_undelivered.yaml").write_text(PARCEL)
    (rules / "backup.yaml").write_text(BACKUP)
    for name, value in {
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(rules),
        "SLAWATCH_NOTIFIERS_DIR": str(ROOT / "notifiers"),
        "SLAWATCH_HTTP": "",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["migrate"]) == 0
    (rules / "parcel_undelivered.yaml").unlink()
    capsys.readouterr()
    assert main(["migrate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [KEPT, "ok: 1 rules migrated (nothing to change)"]
    assert main(["migrate", "--print"]) == 0
    assert f"-- {KEPT}" in capsys.readouterr().out.splitlines()
    assert main(["migrate", "--drop-event-types"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "slawatch.event(): updated for 1 event type (removed rule parcel_undelivered)",
        "ok: 1 rules migrated",
    ]
    assert event(conn, "parcel_shipped", "1Z") == "held"
    assert main(["status"]) == 0
    assert (
        "events held: 1 event of type 'parcel_shipped', which no rule knows: 'slawatch migrate'"
        " with a rule for it applies them"
    ) in capsys.readouterr().out.splitlines()


def test_a_part_changed_by_hand_is_not_kept_blindly(conn: Conn) -> None:
    """A rule's part that cannot be read back as migrate wrote it (its hash in the
    comment differs) is refused in one line, never rebuilt from a guess."""
    from slawatch.engine.timers import function_sql, installed_tags
    from slawatch.errors import ConfigError

    migrate(conn, [PARCEL_RULE, BACKUP_RULE])
    comment = installed_tags(conn)
    other = PARCEL_RULE.model_copy(
        update={"events": PARCEL_RULE.events.model_copy(update={"within": 2 * H})}  # type: ignore[union-attr]
    )
    conn.execute(function_sql([other, BACKUP_RULE]).encode())  # by hand, outside migrate
    conn.execute(
        "COMMENT ON FUNCTION slawatch.event_at(timestamptz, text, text, timestamptz, jsonb,"
        " text) IS " + psycopg.sql.Literal("slawatch " + json.dumps(comment)).as_string(None)
    )
    with pytest.raises(ConfigError, match="rule parcel_undelivered's part of the installed"):
        migrate(conn, [BACKUP_RULE])
    assert migrate(conn, [BACKUP_RULE], drop_event_types=True) == [
        "slawatch.event(): updated for 1 event type (removed rule parcel_undelivered)"
    ]
