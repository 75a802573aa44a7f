"""`slawatch status`, `alerts` and `explain` as an operator runs them: output, --json,
exit codes, one-line errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from slawatch.cli import main
from slawatch.demo import SHOP
from slawatch.engine.migrate import migrate
from tests.integration.helpers import Conn, shop
from tests.integration.test_cli import assert_one_line_error, slawatch


@pytest.fixture
def ready(conn: Conn, dsn: str) -> str:
    """The shop migrated, two overdue orders, one of them notified by `run --once`."""
    shop(conn)
    now = datetime.now(UTC)
    conn.execute(
        "INSERT INTO orders VALUES (1, 1, 100, 'paid', %s), (2, 1, 100, 'paid', %s)",
        (now - timedelta(days=3), now - timedelta(days=4)),
    )
    result = slawatch("run", "--once", dsn=dsn)
    assert result.returncode == 0, result.stderr
    conn.execute("INSERT INTO orders VALUES (3, 1, 100, 'paid', %s)", (now - timedelta(days=3),))
    return dsn


def test_status_table_and_json(ready: str) -> None:
    text = slawatch("status", dsn=ready)
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split()[:7] == [
        "RULE",
        "TRACK",
        "OVERDUE",
        "UNNOTIFIED",
        "NOTIFIED",
        "PENDING",
        "DEAD",
    ]
    order = next(r.split() for r in rows if r.startswith("order_unshipped "))
    # Three overdue: orders 1 and 2 notified by `run --once` (awaiting their
    # re-notification), order 3 not yet.
    assert order[:7] == ["order_unshipped", "inline", "3", "1", "2", "0", "0"]
    # `run --once` records its scan: "<n>s ago", how long it took, then the alerts.
    assert order[-3] == "ago" and order[-2].endswith("ms"), order

    result = slawatch("status", "--json", dsn=ready)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_name = {r["name"]: r for r in report["rules"]}
    assert set(by_name) == {
        "order_unshipped",
        "refund_unprocessed",
        "receipt_unconfirmed",
        "job_hung",
        "parcel_undelivered",
        "task_timeout",
    }
    order_status = by_name["order_unshipped"]
    assert (order_status["overdue"], order_status["not_notified"]) == (3, 1)
    assert order_status["notified"] == 2
    assert not order_status["overdue_capped"] and not order_status["not_notified_capped"]
    assert by_name["receipt_unconfirmed"]["notified"] is None
    assert by_name["order_unshipped"]["last_scan"]["claimed"] == 2


def test_status_before_migrate(conn: Conn, dsn: str) -> None:
    conn.execute(SHOP)
    result = slawatch("status", dsn=dsn)
    assert_one_line_error(result, 2, "slawatch's schema is missing or out of date")


def test_alerts_table_json_and_filters(ready: str) -> None:
    text = slawatch("alerts", dsn=ready)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["ID", "FIRED", "RULE", "KEY", "EP", "N", "SEVERITY", "DELIVERIES"]
    assert len(lines) == 3 and all("console:sent" in ln for ln in lines[1:])

    # A page of one, then the rest from its cursor: the whole list, in its order
    # (ids count up in today's outbox, down in rows: docs/explanation/outbox-rows.md).
    every = json.loads(slawatch("alerts", "--json", dsn=ready).stdout)
    ids = [a["id"] for a in every["alerts"]]
    assert len(ids) == 2 and every["next_cursor"] is None
    page = json.loads(slawatch("alerts", "--json", "--limit", "1", dsn=ready).stdout)
    assert len(page["alerts"]) == 1 and page["next_cursor"] == str(page["alerts"][0]["id"])
    rest = slawatch("alerts", "--json", "--cursor", page["next_cursor"], dsn=ready)
    older = json.loads(rest.stdout)
    assert [a["id"] for a in page["alerts"] + older["alerts"]] == ids
    assert older["next_cursor"] is None

    for args in (["--status", "dead"], ["--rule", "job_hung"], ["--since", "2999-01-01"]):
        result = slawatch("alerts", *args, dsn=ready)
        assert (result.returncode, result.stdout) == (0, "no alerts\n"), args
    sent = json.loads(
        slawatch("alerts", "--json", "--status", "sent", "--since", "1h", dsn=ready).stdout
    )
    assert {a["key"] for a in sent["alerts"]} == {"1", "2"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--limit", "0"], "argument --limit: 0 is not from 1 to 1000"),
        (["--limit", "1001"], "argument --limit: 1001 is not from 1 to 1000"),
        (["--limit", "lots"], "argument --limit: 'lots' is not a whole number"),
        (["--limit", "9" * 5000], "is not a whole number"),
        (["--status", "late"], "argument --status: invalid choice: 'late'"),
        (["--rule", "Bad Name"], "argument --rule: 'Bad Name' is not a rule name"),
        (["--cursor", "5x"], "argument --cursor: '5x' is not a cursor"),
        (["--since", "yesterday"], "since: 'yesterday' is neither a time"),
        (["--since", "2026-13-45"], "since: '2026-13-45' is neither a time"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_alerts_bad_flags_are_one_line(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process (no interpreter start per case); no database is needed to refuse them.
    monkeypatch.setenv("SLAWATCH_DSN", "postgresql://nobody@127.0.0.1:1/none")
    try:
        code = main(["alerts", *args])
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("slawatch: error: ") and says in line, line


def test_explain_prints_the_plan_and_passes(ready: str) -> None:
    result = slawatch("explain", "order_unshipped", dsn=ready)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("rule order_unshipped on public.orders (track: inline), at ")
    assert "-- claim --\nWITH sw_gate AS (" in out and "-- with after = 2d, batch = 10000" in out
    assert "CTE first" in out  # the planner's text
    assert out.rstrip().splitlines()[-1].startswith("ok: ")

    data = json.loads(slawatch("explain", "order_unshipped", "--json", dsn=ready).stdout)
    assert data["ok"] is True and data["statements"][0]["name"] == "claim"


def test_explain_exits_1_on_a_large_table_read_whole(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = shop(conn)
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 100, 'shipped', now() FROM generate_series(1, 50000) g"
    )
    conn.execute("ANALYZE orders")
    migrate(conn, list(rules.values()))
    monkeypatch.setenv("PGOPTIONS", "-c random_page_cost=100000")  # indexes priced out
    result = slawatch("explain", "order_unshipped", "--json", dsn=dsn)
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["ok"] is False


def test_explain_of_an_unknown_rule(dsn: str) -> None:
    assert_one_line_error(slawatch("explain", "nope", dsn=dsn), 2, "no rule named 'nope'")
    assert_one_line_error(slawatch("explain", dsn=dsn), 2, "the following arguments are required")
