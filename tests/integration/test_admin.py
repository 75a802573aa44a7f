"""The admin API (slawatch/operate/admin.py) over a real database, served by uvicorn in a thread
on a free port, called with httpx; and a property-based run against its own
/openapi.json (schemathesis) that finds no 5xx."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry, Counter
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.errors import ConfigError
from slawatch.operate.admin import AdminServer, create_app, serve_admin, serve_in_thread
from tests.integration.helpers import Conn, FixedClock, shop
from tests.integration.test_inspect import add_alert

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "s3cret-token-0123456789"

Start = Callable[..., httpx.Client]


@pytest.fixture
def rules(conn: Conn) -> list[Rule]:
    """The shop with 12 alerts: even i job_hung, odd order_unshipped; sent/pending/dead by i % 3."""
    found = shop(conn)
    for i in range(12):
        rule = "order_unshipped" if i % 2 else "job_hung"
        status = ("sent", "pending", "dead")[i % 3]
        add_alert(conn, rule, f"k{i}", NOW + timedelta(hours=i), {"console": status})
    return list(found.values())


@pytest.fixture
def start(dsn: str) -> Iterator[Start]:
    """Start an admin API (create_app's keywords) on a free port; a client for it."""
    servers: list[tuple[AdminServer, Database, httpx.Client]] = []

    def run(rules: list[Rule], **kw: Any) -> httpx.Client:
        db = Database(dsn, size=2, timeout=5)
        options: dict[str, Any] = {"token": None, "allow_writes": True} | kw
        app = create_app(db, rules, ["console"], **options)
        server = serve_in_thread(app, "127.0.0.1", 0)
        client = httpx.Client(base_url=server.url, timeout=10)
        servers.append((server, db, client))
        return client

    yield run
    for server, db, client in servers:
        client.close()
        server.stop()
        db.close()


def error(response: httpx.Response, status: int) -> str:
    """The error text of a JSON error response with ``status``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    return str(body["error"])


def test_health_ready_and_metrics(rules: list[Rule], start: Start) -> None:
    registry = CollectorRegistry()
    Counter("slawatch_test_things", "things", registry=registry).inc(3)
    workers = {"console": True}
    parts = {"scheduler": True, "workers": workers}
    api = start(rules, health=lambda: parts, registry=registry)
    assert api.get("/healthz").json()["status"] == "ok"
    ready = api.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "ready": True,
        "checks": {"schema": True, "database": True, "scheduler": True, "workers.console": True},
        "error": None,
    }
    workers["console"] = False
    down = api.get("/readyz")
    assert down.status_code == 503
    assert down.json()["error"] == "workers.console is not running"
    metrics = api.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "slawatch_test_things_total 3.0" in metrics.text


def test_not_ready_before_migrate(conn: Conn, start: Start) -> None:
    rules = list(shop(conn).values())
    conn.execute("DROP SCHEMA slawatch CASCADE")
    api = start(rules)
    ready = api.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"] == {"schema": False, "database": True}
    assert "slawatch migrate" in error(api.get("/v1/rules"), 503)
    assert "does not exist" in error(api.get("/v1/stats"), 503)


def test_rules(rules: list[Rule], start: Start) -> None:
    current = list(rules)
    api = start(lambda: current)  # read per request: a reload shows at once
    report = api.get("/v1/rules").json()
    assert [r["name"] for r in report["rules"]] == [r.name for r in rules]
    one = api.get("/v1/rules/job_hung").json()
    assert (one["name"], one["pending"], one["dead"]) == ("job_hung", 2, 2)
    assert error(api.get("/v1/rules/nope"), 404) == "no rule named 'nope'"
    current[:] = [r for r in rules if r.name != "job_hung"]
    assert error(api.get("/v1/rules/job_hung"), 404) == "no rule named 'job_hung'"
    assert len(api.get("/v1/rules").json()["rules"]) == len(rules) - 1
    assert "is not a rule name" in error(api.get("/v1/rules/Bad Name"), 400)
    assert error(api.get("/v1/rules/" + "x" * 101), 422).startswith("rule: String should have")


def test_alerts_filters_and_pages(rules: list[Rule], start: Start) -> None:
    api = start(rules)
    everything = api.get("/v1/alerts", params={"limit": 1000}).json()
    keys = [a["key"] for a in everything["alerts"]]
    assert keys == [f"k{i}" for i in range(11, -1, -1)] and everything["next_cursor"] is None
    default = api.get("/v1/alerts").json()
    assert len(default["alerts"]) == 12  # default limit 50

    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 5} | ({"cursor": cursor} if cursor else {})
        page = api.get("/v1/alerts", params=params).json()
        pages.append([a["key"] for a in page["alerts"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [k for p in pages for k in p] == keys

    def keys_for(**params: Any) -> list[str]:
        response = api.get("/v1/alerts", params=params)
        assert response.status_code == 200, response.text
        return [a["key"] for a in response.json()["alerts"]]

    assert keys_for(rule="job_hung", status="pending") == ["k10", "k4"]
    # Only a pending delivery has a next attempt.
    shown = {a["key"]: a["deliveries"][0] for a in everything["alerts"]}
    assert shown["k10"]["next_attempt_at"] == "2026-03-01T22:00:00Z"
    assert shown["k9"]["next_attempt_at"] is None and shown["k11"]["next_attempt_at"] is None
    assert keys_for(status="dead") == ["k11", "k8", "k5", "k2"]
    assert keys_for(since=(NOW + timedelta(hours=10)).isoformat()) == ["k11", "k10"]
    assert keys_for(since="2026-03-01T21:00:00Z", rule="order_unshipped") == ["k11", "k9"]
    assert keys_for(since="1h") == []  # an hour before the machine's now: none
    assert keys_for(rule="nobody") == []
    assert keys_for(status="silenced") == []


BAD_ALERT_QUERIES: list[tuple[dict[str, Any], int, str]] = [
    ({"limit": 0}, 422, "limit: Input should be greater than or equal to 1"),
    ({"limit": 1001}, 422, "limit: Input should be less than or equal to 1000"),
    ({"limit": "ten"}, 422, "limit: Input should be a valid integer"),
    ({"limit": "9" * 400}, 422, "limit: "),
    ({"status": "late"}, 422, "status: Input should be 'pending', 'sent', 'dead', 'silenced', "),
    ({"cursor": "garbage"}, 400, "cursor: 'garbage' is not a cursor from a previous page"),
    ({"cursor": "0"}, 400, "cursor: '0' is not a cursor"),
    ({"cursor": "99999999999999999999"}, 400, "is not a cursor"),
    ({"cursor": "--1"}, 400, "is not a cursor"),
    ({"since": "soon"}, 400, "since: 'soon' is neither a time"),
    ({"since": "2026-02-30"}, 400, "is neither a time"),
    ({"since": "99999999w"}, 400, "is neither a time"),
    ({"since": "a\x00b"}, 400, "is neither a time"),
    ({"rule": "x\x00y"}, 400, "is not a rule name"),
    ({"rule": "r" * 10_000}, 422, "rule: String should have at most 100 characters"),
]


def test_alerts_bad_input_is_a_4xx_json_error(rules: list[Rule], start: Start) -> None:
    api = start(rules)
    for params, status, says in BAD_ALERT_QUERIES:
        assert says in error(api.get("/v1/alerts", params=params), status), params


def test_one_alert(rules: list[Rule], conn: Conn, start: Start) -> None:
    key = "a:b/c d"  # ':' and '/' and a space: the path carries them all
    number = add_alert(conn, "order_unshipped", key, NOW, {"console": "sent"})
    api = start(rules)
    by_number = api.get(f"/v1/alerts/{number}").json()
    assert by_number["idempotency_id"] == f"order_unshipped:{key}:e1:n1"
    assert by_number["deliveries"][0]["notifier"] == "console"
    quoted = httpx.URL(f"/v1/alerts/order_unshipped:{key}:e1:n1")
    assert api.get(quoted).json() == by_number
    assert error(api.get(f"/v1/alerts/{number + 1}"), 404) == f"no alert '{number + 1}'"
    assert error(api.get("/v1/alerts/order_unshipped:zz:e1:n1"), 404).startswith("no alert")
    assert error(api.get("/v1/alerts/9223372036854775808"), 404).startswith("no alert")
    assert error(api.get("/v1/alerts/-3"), 404) == "no alert '-3'"  # none in the outbox's rows
    assert "idempotency id" in error(api.get("/v1/alerts/--3"), 400)
    assert "NUL" in error(api.get("/v1/alerts/1%00"), 400)
    assert error(api.get("/v1/alerts/" + "x" * 3000), 422).startswith("alert: String should")
    assert error(api.get("/v1/nothing"), 404) == "Not Found"
    assert error(api.delete("/v1/alerts/1"), 405) == "Method Not Allowed"


def test_stats(rules: list[Rule], start: Start) -> None:
    api = start(rules)
    got = api.get("/v1/stats").json()
    assert got["alerts"] == [
        {"rule": "job_hung", "severity": "warning", "alerts": 6},
        {"rule": "order_unshipped", "severity": "warning", "alerts": 6},
    ]
    assert got["deliveries"] == [
        {"notifier": "console", "status": s, "deliveries": 4} for s in ("dead", "pending", "sent")
    ]


def test_replay(rules: list[Rule], conn: Conn, start: Start) -> None:
    api = start(rules)
    assert api.post("/v1/replay", json={"rule": "job_hung"}).json() == {"replayed": 2}
    assert api.post("/v1/replay", json={"notifier": "console"}).json() == {"replayed": 2}
    assert api.post("/v1/replay").json() == {"replayed": 0}  # no body: all (none left)
    (dead,) = conn.execute("SELECT count(*) FROM slawatch.delivery WHERE status = 'dead'")
    assert dead == (0,)
    assert error(api.post("/v1/replay", json={"rule": "nope"}), 400) == "rule: no rule named 'nope'"
    assert "no notifier" in error(api.post("/v1/replay", json={"notifier": "pager"}), 400)
    assert error(api.post("/v1/replay", json={"rules": "x"}), 422).startswith("body.rules: ")
    assert error(api.post("/v1/replay", json=[1]), 422).startswith("body: ")
    bad_json = api.post("/v1/replay", content=b"{", headers={"content-type": "application/json"})
    assert error(bad_json, 422).startswith("body")


def test_a_token_guards_everything_but_healthz(rules: list[Rule], start: Start) -> None:
    api = start(rules, token=TOKEN, allow_writes=True)
    assert api.get("/healthz").status_code == 200
    for path in ("/readyz", "/metrics", "/v1/rules", "/v1/alerts", "/v1/stats", "/openapi.json"):
        missing = api.get(path)
        assert "Authorization: Bearer" in error(missing, 401), path
        assert missing.headers["www-authenticate"] == "Bearer"
    for header in (f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN[:-1]}"):
        assert api.get("/v1/stats", headers={"Authorization": header}).status_code == 401, header
    assert api.post("/v1/replay").status_code == 401
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert api.get("/v1/stats", headers=good).status_code == 200
    assert api.get("/v1/stats", headers={"authorization": f"bearer {TOKEN}"}).status_code == 200
    assert api.post("/v1/replay", headers=good).json() == {"replayed": 4}


def test_without_a_token_writes_need_loopback(rules: list[Rule], start: Start) -> None:
    api = start(rules, token=None, allow_writes=False)
    assert api.get("/v1/stats").status_code == 200
    assert "writes are refused" in error(api.post("/v1/replay"), 403)


def test_serve_admin_bound_to_every_interface_refuses_writes_without_a_token(
    rules: list[Rule], dsn: str
) -> None:
    server = serve_admin(
        dsn, ("0.0.0.0", 0), rules, ["console"], token=None, timeout=5, pooler="auto"
    )
    try:
        # Only this machine's loopback address is ever sent to.
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as api:
            assert api.get("/v1/stats").status_code == 200
            assert error(api.post("/v1/replay"), 403).startswith("writes are refused")
    finally:
        server.stop()
    loopback = serve_admin(
        dsn, ("127.0.0.1", 0), rules, ["console"], token=None, timeout=5, pooler="auto"
    )
    try:
        with httpx.Client(base_url=loopback.url, timeout=10) as api:
            assert api.post("/v1/replay").json() == {"replayed": 4}
    finally:
        loopback.stop()


def test_an_unexpected_error_is_a_logged_500(
    rules: list[Rule], start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Mapping[str, bool]:
        raise RuntimeError("a bug")

    api = start(rules, health=broken)
    with caplog.at_level(logging.ERROR):
        assert error(api.get("/readyz"), 500) == "internal error (logged)"
    assert any("GET /readyz failed" in r.getMessage() for r in caplog.records)


def test_a_port_in_use_is_one_line(rules: list[Rule], start: Start) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = create_app(None, rules, [], token=None, allow_writes=False)  # type: ignore[arg-type]
        with pytest.raises(
            ConfigError, match=f"SLAWATCH_HTTP: cannot listen on 127.0.0.1:{port}: "
        ):
            serve_in_thread(app, "127.0.0.1", port)


def test_openapi_document(rules: list[Rule], start: Start) -> None:
    doc = start(rules).get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/rules",
        "/v1/rules/{rule}",
        "/v1/alerts",
        "/v1/alerts/{alert}",
        "/v1/actions",
        "/v1/stats",
        "/v1/report",
        "/v1/replay",
        "/v1/alerts/{alert}/ack",
        "/v1/silences",
        "/v1/silences/{silence}",
        "/v1/events",
        "/ping/{key}",
        "/ping/{key}/{action}",
    }
    alerts = doc["paths"]["/v1/alerts"]["get"]
    assert {p["name"] for p in alerts["parameters"]} == {
        "rule",
        "status",
        "since",
        "limit",
        "cursor",
    }
    assert alerts["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }


# ---------------------------------------------------------------- acks and silences


def test_ack(rules: list[Rule], conn: Conn, start: Start) -> None:
    number = add_alert(conn, "order_unshipped", "a:b", NOW, {"console": "sent"})
    api = start(rules, clock=FixedClock(NOW + timedelta(minutes=5)))
    first = api.post(f"/v1/alerts/{number}/ack", json={"by": "ana", "comment": "on it"})
    assert first.status_code == 200, first.text
    assert first.json() | {"acked_at": None} == {
        "alert": "order_unshipped:a:b:e1:n1",
        "alert_id": number,
        "rule": "order_unshipped",
        "key": "a:b",
        "episode": 1,
        "state": "acknowledged",
        "acked_at": None,
        "acked_by": "ana",
        "comment": "on it",
        "current": None,
    }
    assert first.json()["acked_at"] == "2026-03-01T12:05:00Z"
    again = api.post("/v1/alerts/order_unshipped:a:b:e1:n1/ack", json={"by": "bo"}).json()
    assert (again["state"], again["acked_by"]) == ("already acknowledged", "ana")
    assert conn.execute("SELECT acked_by FROM slawatch.ack").fetchall() == [("ana",)]

    assert error(api.post(f"/v1/alerts/{number + 1}/ack", json={"by": "x"}), 404)
    assert "neither" in error(api.post("/v1/alerts/x y/ack", json={"by": "x"}), 400)
    assert error(api.post(f"/v1/alerts/{number}/ack", json={}), 422) == "body.by: Field required"
    assert error(api.post(f"/v1/alerts/{number}/ack", json={"by": ""}), 422).startswith("body.by")
    assert "NUL" in error(api.post(f"/v1/alerts/{number}/ack", json={"by": "a\x00"}), 400)
    extra = api.post(f"/v1/alerts/{number}/ack", json={"by": "a", "until": "1h"})
    assert error(extra, 422).startswith("body.until: Extra inputs")
    assert "writes are refused" in error(
        start(rules, allow_writes=False).post(f"/v1/alerts/{number}/ack", json={"by": "a"}), 403
    )


def test_silences(rules: list[Rule], conn: Conn, start: Start) -> None:
    api = start(rules, clock=FixedClock(NOW))
    made = api.post(
        "/v1/silences",
        json={
            "rule": "order_unshipped",
            "matchers": {"user_id": 1},
            "until": "2h",
            "author": "ana",
            "comment": "warehouse closed",
        },
    )
    assert made.status_code == 201, made.text
    silence = made.json()
    assert (silence["rule"], silence["key"], silence["matchers"]) == (
        "order_unshipped",
        None,
        {"user_id": 1},
    )
    assert (silence["ends_at"], silence["active"]) == ("2026-03-01T14:00:00Z", True)
    keyed = api.post(
        "/v1/silences",
        json={"rule": "job_hung", "key": "7", "until": "2026-03-02T00:00:00Z", "author": "bo"},
    ).json()
    assert (keyed["rule"], keyed["key"], keyed["matchers"]) == ("job_hung", "7", {})
    assert [s["id"] for s in api.get("/v1/silences").json()["silences"]] == [
        silence["id"],
        keyed["id"],
    ]

    ended = api.delete(f"/v1/silences/{silence['id']}")
    assert ended.status_code == 200, ended.text
    assert (ended.json()["ends_at"], ended.json()["active"]) == ("2026-03-01T12:00:00Z", False)
    assert [s["id"] for s in api.get("/v1/silences").json()["silences"]] == [keyed["id"]]
    every = api.get("/v1/silences", params={"all": "true"}).json()["silences"]
    assert [s["id"] for s in every] == [silence["id"], keyed["id"]]

    assert error(api.delete("/v1/silences/999"), 404) == "no silence with id 999"
    assert error(api.delete("/v1/silences/0"), 422).startswith("silence: ")
    assert error(api.delete("/v1/silences/abc"), 422).startswith("silence: ")
    assert error(api.delete("/v1/silences/" + "9" * 30), 422).startswith("silence: ")
    good = {"rule": "job_hung", "until": "1h", "author": "ana"}
    for change, status, says in [
        ({"rule": "nope"}, 400, "rule: no rule named 'nope'"),
        ({"until": "2020-01-01"}, 400, "is not after now"),
        ({"until": "soon"}, 400, "is neither a time"),
        ({"until": "400d"}, 400, "more than a year away"),
        ({"matchers": {"no such": 1}}, 400, "is not a field name"),
        ({"matchers": {"kind": "x" * 3000}}, 400, "longer than 2,000 characters"),
        ({"comment": "a\x00b"}, 400, "NUL"),
        ({"author": None}, 422, "body.author: "),
        ({"matchers": [1]}, 422, "body.matchers: "),
        ({"rule": "r" * 101}, 422, "body.rule: String should have at most 100"),
    ]:
        assert says in error(api.post("/v1/silences", json=good | change), status), change
    # The API names its own field, not the command line's --until.
    for until, says in [
        ("99999-12-31T23:59:59Z", "until: '99999-12-31T23:59:59Z' is neither a time"),
        ("3 dayz", "until: '3 dayz' is not a duration"),
        ("", "until: must not be empty"),
    ]:
        assert error(api.post("/v1/silences", json=good | {"until": until}), 400).startswith(says)
    (count,) = conn.execute("SELECT count(*) FROM slawatch.silence").fetchone()  # type: ignore[misc]
    assert count == 2  # none of the refused ones was written


# ---------------------------------------------------------------- schemathesis
# Its pytest plugin (``from_fixture``) does not run on pytest 9.2, so the cases come
# from its Hypothesis strategy over every operation, called the same way.


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(
    rules: list[Rule], start: Start, mode: GenerationMode
) -> None:
    client = start(rules, token=None, allow_writes=True)
    schema = schemathesis.openapi.from_url(f"{client.base_url}/openapi.json")
    statuses: dict[int, int] = {}

    @given(case=schema.as_strategy(mode))
    # Derandomized: the same 300 cases every run, so that the count of valid requests
    # below does not vary from run to run (24 of 300 once, where it asks for 26).
    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: schemathesis.Case) -> None:
        response = case.call_and_validate(checks=[not_a_server_error])
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    call()
    # Valid requests reached the handlers; invalid ones were refused with a 4xx.
    if mode is GenerationMode.POSITIVE:
        assert statuses.get(200, 0) + statuses.get(201, 0) > 25, statuses
    else:
        assert sum(n for s, n in statuses.items() if 400 <= s < 500) > 200, statuses
