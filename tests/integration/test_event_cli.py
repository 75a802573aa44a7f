"""``slawatch event`` as a cron script runs it, and ``status``, ``explain`` and
``alerts`` on event rules: output, exit codes, one-line errors, nothing stored from
bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from slawatch.cli import main
from slawatch.config.rules import load_rules
from slawatch.engine.migrate import migrate
from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.integration.test_cli import slawatch
from tests.pgcluster import free_port
from tests.waiting import wait_until

PARCEL = """\
description: parcels that were shipped and never arrived
events:
  start: parcel_shipped
  stop: [parcel_delivered, parcel_returned]
  within: 72h
notify: [console]
"""
BACKUP = """\
events: {beat: backup_ping, within: 25h}
notify: [console]
"""


@pytest.fixture
def ready(conn: Conn, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two event rules in a rules folder, migrated; the settings of an in-process CLI."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "parcel_undelivered.yaml").write_text(PARCEL)
    (rules / "backup.yaml").write_text(BACKUP)
    migrate(conn, load_rules(rules))
    for name, value in {
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(rules),
        "SLAWATCH_NOTIFIERS_DIR": str(ROOT / "notifiers"),
        "SLAWATCH_HTTP": "",
        "SLAWATCH_DB_TIMEOUT": "2",
    }.items():
        monkeypatch.setenv(name, value)
    return rules


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def timers(conn: Conn) -> list[tuple[str, bool, datetime, dict[str, object]]]:
    return conn.execute(
        "SELECT key, open, started_at, data FROM slawatch.parcel_undelivered_timers ORDER BY key"
    ).fetchall()


def test_event_accepted_then_duplicate(
    ready: Path, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    at = "2026-11-25T09:00:00+01:00"
    assert run(capsys, "event", "parcel_shipped", "1Z999", "--at", at, "--data", '{"to": "Oslo"}')[
        :2
    ] == (0, "accepted\n")
    assert timers(conn) == [
        ("1Z999", True, datetime(2026, 11, 25, 8, 0, tzinfo=UTC), {"to": "Oslo"})
    ]
    assert run(capsys, "event", "backup_ping", "db1", "--id", "run-7")[:2] == (0, "accepted\n")
    assert run(capsys, "event", "backup_ping", "db1", "--id", "run-7")[:2] == (0, "duplicate\n")
    assert run(capsys, "event", "parcel_delivered", "1Z999")[:2] == (0, "accepted\n")
    assert [t[:2] for t in timers(conn)] == [("1Z999", False)]


BAD = [
    (["nope", "k"], "TYPE: 'nope': no rule uses this type (rules use: backup_ping, "),
    (["parcel shipped", "k"], "TYPE: 'parcel shipped' is not an event type"),
    (["parcel_shipped", ""], "KEY: must be 1 to 200 characters"),
    (["parcel_shipped", "k" * 201], "KEY: must be 1 to 200 characters, not 201"),
    (["parcel_shipped", "k\x1b]0;x\x07"], "KEY: contains a control character (U+001B at 1)"),
    (["parcel_shipped", "k", "--at", "2026-11-25T09:00:00"], "--at: '2026-11-25T09:00:00' has no"),
    (["parcel_shipped", "k", "--at", "9999-12-31T00:00:00Z"], "--at: 9999-12-31T00:00:00Z is more"),
    (["parcel_shipped", "k", "--at", "1970-01-01T00:00:00Z"], "older than the retention (4w2d)"),
    (["parcel_shipped", "k", "--at", "yesterday"], "--at: 'yesterday' is not a time"),
    (["parcel_shipped", "k", "--data", "{"], "--data: not JSON: unexpected end of data"),
    (["parcel_shipped", "k", "--data", "[1]"], "--data: must be a JSON object, not list"),
    (["parcel_shipped", "k", "--data", "NaN"], "--data: not JSON"),
    (["parcel_shipped", "k", "--data", '{"a": "' + "x" * 70_000 + '"}'], "--data: 70,008 bytes"),
    (["parcel_shipped", "k", "--id", ""], "--id: must be 1 to 200 characters"),
    (["parcel_shipped", "k", "--id", "r\r\nforged"], "--id: contains a control character (U+000D"),
    (["parcel_shipped"], "the following arguments are required: KEY"),
]


def test_bad_input_is_one_line_exit_2_and_nothing_stored(
    ready: Path, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, says in BAD:
        try:
            code, out, err = run(capsys, "event", *args)
        except SystemExit as exc:  # argparse's own usage errors
            code, (out, err) = int(str(exc.code)), capsys.readouterr()
        assert code == 2 and out == "", (args, out, err)
        (line,) = err.splitlines()
        assert line.startswith("slawatch: error: ") and says in line, (args, line)
    assert timers(conn) == []
    assert conn.execute("SELECT count(*) FROM slawatch.event_seen").fetchone() == (0,)


def test_the_database_down_is_exit_1(
    ready: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLAWATCH_DSN", "postgresql://postgres:secret@127.0.0.1:1/shop")
    code, out, err = run(capsys, "event", "backup_ping", "db1")
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith("slawatch: error: cannot connect to postgresql://postgres:***@")


def test_before_migrate_says_what_to_do(
    ready: Path, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute("DROP SCHEMA slawatch CASCADE")
    code, _, err = run(capsys, "event", "backup_ping", "db1")
    assert code == 2 and "run 'slawatch migrate'" in err, err


def test_a_cron_line(ready: Path, dsn: str) -> None:
    """What docs/how-to/events.md shows: the backup's own exit status is not slawatch's."""
    env = {"SLAWATCH_RULES_DIR": str(ready)}
    ok = slawatch("event", "backup_ping", "db1", dsn=dsn, env=env)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "accepted\n", "")


def test_status_explain_and_alerts_of_event_rules(
    ready: Path, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = (datetime.now(UTC) - timedelta(days=4)).isoformat()
    for key in ("lost", "moving"):
        at = lost if key == "lost" else datetime.now(UTC).isoformat()
        assert run(capsys, "event", "parcel_shipped", key, "--at", at)[0] == 0
    assert run(capsys, "event", "backup_ping", "db1")[0] == 0
    code, out, err = run(capsys, "run", "--once")
    assert code == 0, err
    assert "parcel_undelivered #1 key=lost" in out

    code, out, _ = run(capsys, "status")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    # One overdue, and notified by the run: none left unnotified.
    assert rows["parcel_undelivered"][1:4] == ["events", "1", "0"], out
    assert rows["backup"][1:4] == ["events", "0", "0"], out
    report = json.loads(run(capsys, "status", "--json")[1])
    shown = {r["name"]: r for r in report["rules"]}
    assert shown["parcel_undelivered"]["events"] == (
        "parcel_shipped → parcel_delivered, parcel_returned within 3d"
    )
    assert shown["backup"]["events"] == "backup_ping at least every 1d1h"
    assert shown["parcel_undelivered"]["problem"] is None

    # Each event rule is explained among the others (slawatch.event() is all of theirs).
    for name in ("parcel_undelivered", "backup"):
        code, out, err = run(capsys, "explain", name)
        assert code == 0, err
        first, verdict = out.splitlines()[0], out.splitlines()[-1]
        assert first.startswith(f"rule {name} on events: "), first
        assert f"(timers: slawatch.{name}_timers)" in first
        assert verdict.startswith("ok: "), verdict
    explained = json.loads(run(capsys, "explain", "parcel_undelivered", "--json")[1])
    assert explained["ok"] is True
    assert explained["statements"][0]["seq_scans_unavoidable"] == []

    code, out, _ = run(capsys, "alerts")
    _, *lines = out.splitlines()
    assert code == 0 and len(lines) == 1, out
    assert lines[0].split()[3:5] == ["parcel_undelivered", "lost"], out
    page = json.loads(run(capsys, "alerts", "--json")[1])
    row = page["alerts"][0]["row"]
    assert row["data"] == {} and row["events"] == [] and row["started_at"], row


def test_slawatch_run_takes_events_over_http(ready: Path, dsn: str) -> None:
    """The wiring of `slawatch run`: the admin API takes events with the ingest token,
    refuses them past SLAWATCH_RETENTION, and counts them in the runner's metrics."""
    api, ingest = "s3cret-token-0123456789", "ingest-token-0123456789"
    url = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")} | {
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(ready),
        "SLAWATCH_NOTIFIERS_DIR": str(ROOT / "notifiers"),
        "SLAWATCH_HTTP": url.removeprefix("http://"),
        "SLAWATCH_API_TOKEN": api,
        "SLAWATCH_INGEST_TOKEN": ingest,
        "SLAWATCH_RETENTION": "2h",
    }
    as_producer = {"Authorization": f"Bearer {ingest}"}
    as_operator = {"Authorization": f"Bearer {api}"}
    with subprocess.Popen(
        [sys.executable, "-m", "slawatch", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:

            def up() -> bool:
                try:
                    return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
                except httpx.TransportError:
                    assert proc.poll() is None, "slawatch run ended"
                    return False

            wait_until(up, "the admin API of slawatch run")
            with httpx.Client(base_url=url, timeout=30) as client:
                batch = {"events": [{"type": "parcel_shipped", "key": k} for k in ("a", "b")]}
                taken = client.post("/v1/events", json=batch, headers=as_producer)
                assert taken.json() == {"accepted": 2, "duplicates": 0}, taken.text
                old = (datetime.now(UTC) - timedelta(hours=3)).isoformat()
                refused = client.post(
                    "/v1/events",
                    json={"type": "backup_ping", "key": "db1", "at": old},
                    headers=as_producer,
                )
                assert refused.status_code == 400 and "retention (2h)" in refused.text
                assert client.get("/metrics", headers=as_producer).status_code == 403
                metrics = client.get("/metrics", headers=as_operator).text
            labels = 'outcome="accepted",source="http",type="parcel_shipped"'
            assert f"slawatch_events_total{{{labels}}} 2.0" in metrics, metrics
            assert 'slawatch_timers_open{rule="parcel_undelivered"} 2.0' in metrics
            assert 'slawatch_timers_open{rule="backup"} 0.0' in metrics
        finally:
            proc.terminate()
            proc.wait(30)
