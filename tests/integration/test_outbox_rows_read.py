"""The readers of the outbox read its rows too (SLAWATCH_OUTBOX=rows,
docs/explanation/outbox-rows.md): the admin API's alerts and one alert, the on-call
page's counts and chart, ``slawatch status``, the dead letters, the metrics gauges and
an ack, with some alerts in today's shape (slawatch.alert, slawatch.delivery) and some
as elements of slawatch.outbox_row, each row's delivery in slawatch.outbox_send. The
rows are written here with SQL, as the claim in rows writes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from slawatch.clock import Clock
from slawatch.db import Database
from slawatch.operate.inspect import list_alerts, rules_report, stats
from slawatch.operate.metrics import Metrics
from tests.integration.helpers import Conn
from tests.integration.page_helpers import (
    DUE,
    H,
    Servers,
    chart_counts,
    rule_row,
    servers,
)
from tests.integration.test_page import seeded_alerts

__all__ = ["servers"]

RULE = "order_unshipped"
AFTER = timedelta(hours=48)


@dataclass
class Send:
    """One row's delivery to one notifier, as outbox_send holds it."""

    status: str = "pending"
    done: int = 0
    skipped: list[str | None] | None = None
    attempts: int = 0
    last_error: str | None = None
    sent_at: datetime | None = None


@dataclass
class Element:
    key: str
    episode: int = 1
    n: int = 1
    severity: str = "warning"
    deadline: datetime | None = None
    row: dict[str, Any] = field(default_factory=dict)


def add_row(
    conn: Conn,
    fired_at: datetime,
    elements: list[Element],
    sends: dict[str, Send],
    *,
    kind: str = "firing",
    rule: str = RULE,
) -> int:
    """One outbox row and its sends, and the episode history the claim keeps beside
    them (an episode row with each notification #1, its end with a resolved notice);
    the row's id."""
    row = conn.execute(
        "INSERT INTO slawatch.outbox_row (rule, kind, fired_at, after, notifiers, keys,"
        " episodes, ns, severities, deadlines, row_data)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb[]) RETURNING id",
        (
            rule,
            kind,
            fired_at,
            AFTER,
            list(sends),
            [e.key for e in elements],
            [e.episode for e in elements],
            [e.n for e in elements],
            [e.severity for e in elements],
            [e.deadline for e in elements],
            [Jsonb(e.row) for e in elements],
        ),
    ).fetchone()
    assert row is not None
    for notifier, s in sends.items():
        conn.execute(
            "INSERT INTO slawatch.outbox_send (row_id, notifier, status, attempts, done,"
            " next_attempt_at, last_error, sent_at, skipped)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                row[0],
                notifier,
                s.status,
                s.attempts,
                s.done,
                fired_at,
                s.last_error,
                s.sent_at,
                s.skipped,
            ),
        )
    for e in elements:
        if kind == "firing" and e.n == 1:
            conn.execute(
                "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (rule, e.key, e.episode, e.deadline, e.deadline and e.deadline + AFTER, fired_at),
            )
        if kind == "resolved":
            conn.execute(
                "UPDATE slawatch.episode SET ended_at = %s"
                " WHERE rule = %s AND key = %s AND episode = %s",
                (fired_at, rule, e.key, e.episode),
            )
    return int(row[0])


def eid(row: int, place: int) -> int:
    """An element's numeric id (queries.sql, alert_by_id)."""
    return -(row * 128 + place)


def mixed(conn: Conn) -> tuple[Any, int, int]:
    """The shop's two alerts of today's shape (keys 1 and 2, claimed at DUE, one
    pending delivery each to console), then two rows an hour later: the first with
    three elements (keys 10, 11, 12) sent to hook up to element 1, element 2 acked
    unsent, element 3 dead; to console all pending; the second a re-notification (key
    13, n 2) whose console send is sent."""
    found = seeded_alerts(conn)  # today's shape, beside the rows written here
    deadline = DUE - AFTER
    first = add_row(
        conn,
        DUE + H,
        [
            Element("10", deadline=deadline, row={"id": 10, "user_id": 70}),
            Element("11", deadline=deadline, row={"id": 11}),
            Element("12", severity="critical", row={"id": 12}),
        ],
        {
            "console": Send(),
            "hook": Send(
                status="dead",
                done=1,
                skipped=[None, "acknowledged", None],
                attempts=5,
                last_error="HTTP 500",
                sent_at=DUE + H,
            ),
        },
    )
    conn.execute(
        "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at)"
        " VALUES (%s, '13', 1, %s, %s, %s)",
        (RULE, deadline, DUE, DUE),
    )
    second = add_row(
        conn,
        DUE + 2 * H,
        [Element("13", n=2, severity="critical", deadline=deadline, row={"id": 13})],
        {"console": Send(status="sent", done=1, attempts=1, sent_at=DUE + 2 * H)},
    )
    return found, first, second


def statuses(alert: dict[str, Any]) -> dict[str, str]:
    return {d["notifier"]: d["status"] for d in alert["deliveries"]}


def test_the_api_lists_alerts_of_both_shapes(conn: Conn, servers: Servers) -> None:
    found, first, second = mixed(conn)
    client = servers.client(found.listed, now=DUE + 3 * H)
    got = client.get("/v1/alerts")
    assert got.status_code == 200, got.text
    alerts = got.json()["alerts"]
    # The rows' elements first, newest row first, then today's alerts newest first.
    ids = [a["id"] for a in alerts]
    assert ids[:4] == [eid(second, 1), eid(first, 3), eid(first, 2), eid(first, 1)]
    assert [a["key"] for a in alerts] == ["13", "12", "11", "10", "2", "1"]
    assert all(i > 0 for i in ids[4:])
    ten = alerts[3]
    assert ten["idempotency_id"] == f"{RULE}:10:e1:n1"
    assert (ten["rule"], ten["episode"], ten["n"], ten["kind"]) == (RULE, 1, 1, "firing")
    assert ten["severity"] == "warning" and ten["row"] == {"id": 10, "user_id": 70}
    assert ten["deadline"] == (DUE - AFTER).isoformat().replace("+00:00", "Z")
    assert ten["due_at"] == DUE.isoformat().replace("+00:00", "Z")
    assert ten["fired_at"] == (DUE + H).isoformat().replace("+00:00", "Z")
    # Per notifier, each element's own status: hook sent element 1 (done), element 2
    # was settled unsent (skipped), element 3 is what went dead.
    assert [statuses(a) for a in alerts[1:4]] == [
        {"console": "pending", "hook": "dead"},
        {"console": "pending", "hook": "acknowledged"},
        {"console": "pending", "hook": "sent"},
    ]
    hook = {d["notifier"]: d for d in alerts[1]["deliveries"]}["hook"]
    assert (hook["attempts"], hook["last_error"], hook["sent_at"]) == (5, "HTTP 500", None)
    sent = {d["notifier"]: d for d in ten["deliveries"]}["hook"]
    assert sent["last_error"] is None and sent["sent_at"] is not None
    assert statuses(alerts[0]) == {"console": "sent"} and alerts[0]["n"] == 2
    assert alerts[1]["deadline"] is None and alerts[1]["due_at"] is None
    assert statuses(alerts[4]) == {"console": "pending"}

    # Pages of two go through both parts, each alert once.
    seen: list[int] = []
    cursor: str | None = None
    while True:
        query = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/alerts", params=query).json()
        seen += [a["id"] for a in page["alerts"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    # A rule and a time filter the rows as they do today's alerts.
    since = client.get("/v1/alerts", params={"since": (DUE + H).isoformat()}).json()
    assert [a["key"] for a in since["alerts"]] == ["13", "12", "11", "10"]
    assert client.get("/v1/alerts", params={"rule": "job_hung"}).json()["alerts"] == []


def test_one_alert_of_a_row_by_id_and_by_name(conn: Conn, servers: Servers) -> None:
    found, first, _ = mixed(conn)
    client = servers.client(found.listed, now=DUE + 3 * H)
    by_id = client.get(f"/v1/alerts/{eid(first, 2)}")
    assert by_id.status_code == 200, by_id.text
    assert (by_id.json()["key"], by_id.json()["id"]) == ("11", eid(first, 2))
    assert statuses(by_id.json()) == {"console": "pending", "hook": "acknowledged"}
    by_name = client.get(f"/v1/alerts/{RULE}:12:e1:n1")
    assert by_name.status_code == 200, by_name.text
    assert by_name.json()["id"] == eid(first, 3) and by_name.json()["severity"] == "critical"
    renotified = client.get(f"/v1/alerts/{RULE}:13:e1:n2").json()
    assert renotified["n"] == 2 and renotified["key"] == "13"
    # Past the row's elements, or a place no row has: none.
    assert client.get(f"/v1/alerts/{eid(first, 4)}").status_code == 404
    assert client.get(f"/v1/alerts/{eid(first + 5, 1)}").status_code == 404
    assert client.get(f"/v1/alerts/{RULE}:12:e1:n2").status_code == 404
    # Today's alerts are found as before.
    (one,) = conn.execute("SELECT id FROM slawatch.alert WHERE key = '1'").fetchone() or ()
    assert client.get(f"/v1/alerts/{one}").json()["key"] == "1"
    assert client.get(f"/v1/alerts/{RULE}:2:e1:n1").json()["key"] == "2"


def test_the_dead_letters_hold_the_dead_elements(conn: Conn, servers: Servers) -> None:
    found, first, _ = mixed(conn)
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'dead' WHERE notifier = 'console'"
        " AND alert_id = (SELECT id FROM slawatch.alert WHERE key = '2')"
    )
    client = servers.client(found.listed, now=DUE + 3 * H)
    dead = client.get("/v1/alerts", params={"status": "dead"}).json()["alerts"]
    # Element 3 of the dead send; not 1 (sent before) nor 2 (settled acknowledged).
    assert [a["key"] for a in dead] == ["12", "2"]
    assert dead[0]["id"] == eid(first, 3)
    sent = client.get("/v1/alerts", params={"status": "sent"}).json()["alerts"]
    assert [a["key"] for a in sent] == ["13", "10"]
    acked = client.get("/v1/alerts", params={"status": "acknowledged"}).json()["alerts"]
    assert [a["key"] for a in acked] == ["11"]


def test_counts_on_the_page_in_status_stats_and_metrics(
    conn: Conn, servers: Servers, dsn: str
) -> None:
    found, first, _ = mixed(conn)
    now = DUE + 3 * H
    # slawatch status (and /v1/rules): pending and dead count each element's delivery
    # not settled: today's 2 to console, the first row's 3 to console; 1 dead (hook's
    # element 3). The oldest pending is today's, claimed at DUE.
    report = rules_report(conn, found.listed, now)
    (order,) = [r for r in report.rules if r.name == RULE]
    assert (order.pending, order.dead, order.orphaned) == (5, 1, 0)
    assert order.oldest_pending_seconds == 3 * 3600
    client = servers.client(found.listed, now=now)
    html = client.get("/").text
    cells = rule_row(html, RULE)
    assert (cells["pending"], cells["dead"]) == ("5", "1")
    # The chart: two alerts in the hour of DUE, three an hour later, one the next.
    counts = chart_counts(html, RULE)
    assert counts[-4:] == [2, 3, 1, 0]
    # The page's list shows the rows' elements with an ack button naming their id.
    assert f'data-action="ack" data-alert="{eid(first, 3)}"' in html

    # Only the rows: pending counts and the oldest come from them alone.
    conn.execute("DELETE FROM slawatch.delivery")
    (order,) = [r for r in rules_report(conn, found.listed, now).rules if r.name == RULE]
    assert (order.pending, order.dead) == (3, 1)
    assert order.oldest_pending_seconds == 2 * 3600

    counted = stats(conn)
    alerts = {(c.rule, c.severity): c.alerts for c in counted.alerts}
    assert alerts[(RULE, "warning")] == 2 + 2 and alerts[(RULE, "critical")] == 2
    deliveries = {(c.notifier, c.status): c.deliveries for c in counted.deliveries}
    assert deliveries == {
        ("console", "pending"): 3,
        ("console", "sent"): 1,
        ("hook", "sent"): 1,
        ("hook", "acknowledged"): 1,
        ("hook", "dead"): 1,
    }

    db = Database(dsn, size=1, timeout=5)
    try:
        registry = Metrics(db, Clock(), lambda: ["console", "hook"]).registry
        pending = registry.get_sample_value("slawatch_deliveries_pending", {"notifier": "console"})
        dead = registry.get_sample_value("slawatch_deliveries_dead", {"notifier": "hook"})
        assert (pending, dead) == (3, 1)
        assert registry.get_sample_value("slawatch_deliveries_pending", {"notifier": "hook"}) == 0
    finally:
        db.close()


def test_an_ack_names_an_element_of_a_row(conn: Conn, servers: Servers) -> None:
    found, first, _ = mixed(conn)
    client = servers.client(found.listed, now=DUE + 3 * H)
    acked = client.post(f"/v1/alerts/{eid(first, 1)}/ack", json={"by": "ana"})
    assert acked.status_code == 200, acked.text
    body = acked.json()
    assert (body["state"], body["alert"], body["alert_id"]) == (
        "acknowledged",
        f"{RULE}:10:e1:n1",
        eid(first, 1),
    )
    assert conn.execute(
        "SELECT alert_id, acked_by FROM slawatch.ack WHERE rule = %s AND key = '10'", (RULE,)
    ).fetchone() == (eid(first, 1), "ana")
    # By its idempotency id: the same episode, acknowledged already.
    again = client.post(f"/v1/alerts/{RULE}:10:e1:n1/ack", json={"by": "bo"}).json()
    assert (again["state"], again["acked_by"]) == ("already acknowledged", "ana")
    # A re-notification named by name; today's alerts as before.
    assert (
        client.post(f"/v1/alerts/{RULE}:13:e1:n2/ack", json={"by": "cy"}).json()["state"]
        == "acknowledged"
    )
    assert (
        client.post(f"/v1/alerts/{RULE}:1:e1:n1/ack", json={"by": "cy"}).json()["state"]
        == "acknowledged"
    )
    # An episode a row of kind resolved ended: nothing to acknowledge.
    add_row(conn, DUE + 3 * H, [Element("11", n=0)], {"hook": Send()}, kind="resolved")
    ended = client.post(f"/v1/alerts/{eid(first, 2)}/ack", json={"by": "ana"}).json()
    assert ended["state"] == "ended" and ended["current"] is None
    # The row's next episode began in a later row: the ack names it.
    later = add_row(conn, DUE + 4 * H, [Element("12", episode=2)], {"hook": Send()})
    moved = client.post(f"/v1/alerts/{eid(first, 3)}/ack", json={"by": "ana"}).json()
    assert (moved["state"], moved["current"]) == ("ended", f"{RULE}:12:e2:n1")
    assert client.get(f"/v1/alerts/{eid(later, 1)}").json()["episode"] == 2
    assert client.post("/v1/alerts/-1/ack", json={"by": "ana"}).status_code == 404


def test_the_cli_reads_negative_ids(conn: Conn) -> None:
    """``slawatch alerts --cursor`` and ``slawatch ack`` take an element's id."""
    from slawatch.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["alerts", "--cursor", "-1281"])
    assert args.cursor == -1281
    assert parser.parse_args(["ack", "-1281"]).alert == "-1281"
    _, first, _ = mixed(conn)
    page = list_alerts(conn, cursor=eid(first, 2), limit=2)
    assert [a.key for a in page.alerts] == ["10", "2"]
