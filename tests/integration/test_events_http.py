"""``POST /v1/events`` (slawatch/operate/api/events.py) against a real database, served by
uvicorn in a thread: batches all or nothing, duplicates, the body limit, bad input of
every kind, the ingest token, and the events counted in the metrics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import yaml

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.events.ingest import MAX_DEPTH
from slawatch.operate.admin import EVENTS_AT_ONCE, AdminServer, create_app, serve_in_thread
from slawatch.operate.metrics import Metrics
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_admin import TOKEN, error
from tests.tcpproxy import TcpProxy
from tests.waiting import lock_waits, wait_until

NOW = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
INGEST = "ingest-only-token-0123456789"
PARCEL = """\
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


def event_rule(name: str, text: str) -> Rule:
    return Rule.model_validate(yaml.safe_load(text) | {"name": name})


@pytest.fixture
def rules(conn: Conn) -> list[Rule]:
    """Two event rules, migrated: their timer tables and slawatch.event()."""
    found = [event_rule("parcel_undelivered", PARCEL), event_rule("backup", BACKUP)]
    migrate(conn, found)
    return found


class Served:
    def __init__(self, server: AdminServer, db: Database, metrics: Metrics) -> None:
        self.server, self.db, self.metrics = server, db, metrics
        self.api = httpx.Client(base_url=server.url, timeout=30)

    def count(self, kind: str, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "slawatch_events_total", {"type": kind, "source": "http", "outcome": outcome}
        )
        return value or 0.0


@pytest.fixture
def serve(dsn: str) -> Iterator[Any]:
    """An admin API on a free port (create_app's keywords), counting into its own Metrics."""
    running: list[Served] = []

    def start(
        rules: Any,
        *,
        dsn_: str = dsn,
        timeout: float = 5,
        forwarded_allow_ips: str | None = None,
        **kw: Any,
    ) -> Served:
        db = Database(dsn_, size=2, timeout=timeout)
        current = rules if callable(rules) else lambda: rules
        metrics = Metrics(db, Clock(), lambda: ["console"], current)
        options: dict[str, Any] = {
            "token": None,
            "allow_writes": True,
            "clock": FixedClock(NOW),
            "runner_metrics": metrics,
        } | kw
        app = create_app(db, rules, ["console"], **options)
        server = serve_in_thread(app, "127.0.0.1", 0, forwarded_allow_ips=forwarded_allow_ips)
        served = Served(server, db, metrics)
        running.append(served)
        return served

    yield start
    for served in running:
        served.api.close()
        served.server.stop()
        served.db.close()


def timers(conn: Conn, rule: str = "parcel_undelivered") -> list[tuple[str, bool]]:
    return [
        (str(k), bool(o))
        for k, o in conn.execute(f'SELECT key, open FROM slawatch."{rule}_timers" ORDER BY key')
    ]


def stored(conn: Conn) -> tuple[int, int, int]:
    """Rows of both timer tables and of the dedupe table: (parcels, backups, ids seen)."""
    counts = [
        conn.execute(f"SELECT count(*) FROM slawatch.{t}").fetchone()
        for t in ("parcel_undelivered_timers", "backup_timers", "event_seen")
    ]
    return tuple(int(c[0]) for c in counts if c is not None)  # type: ignore[return-value]


def shipped(key: str, **more: Any) -> dict[str, Any]:
    return {"type": "parcel_shipped", "key": key} | more


def test_one_event_and_a_batch_with_duplicates(rules: list[Rule], conn: Conn, serve: Any) -> None:
    served = serve(rules)
    api = served.api
    one = api.post("/v1/events", json=shipped("p1", at="2026-11-25T09:00:00Z", data={"to": "Oslo"}))
    assert one.status_code == 202, one.text
    assert one.json() == {"accepted": 1, "duplicates": 0}
    row = conn.execute(
        "SELECT open, due_at, data FROM slawatch.parcel_undelivered_timers WHERE key = 'p1'"
    ).fetchone()
    assert row == (True, datetime(2026, 11, 28, 9, 0, tzinfo=UTC), {"to": "Oslo"})

    batch = {
        "events": [
            shipped("p2", id="e-2"),
            shipped("p3", id="e-3"),
            shipped("p2", id="e-2"),  # a repeat within the batch
            {"type": "parcel_delivered", "key": "p1", "id": 7},  # ids may be numbers
            {"type": "backup_ping", "key": 42},  # keys too
        ]
    }
    taken = api.post("/v1/events", json=batch)
    assert taken.status_code == 202, taken.text
    assert taken.json() == {"accepted": 4, "duplicates": 1}
    assert timers(conn) == [("p1", False), ("p2", True), ("p3", True)]
    assert timers(conn, "backup") == [("42", True)]
    # Sent again (a producer's retry): every event with an id is dropped.
    again = api.post("/v1/events", json=batch)
    assert again.json() == {"accepted": 1, "duplicates": 4}
    assert served.count("parcel_shipped", "accepted") == 3
    assert served.count("parcel_shipped", "duplicate") == 4
    assert served.count("parcel_delivered", "duplicate") == 1
    assert served.count("backup_ping", "accepted") == 2


def test_one_bad_event_refuses_the_whole_batch(rules: list[Rule], conn: Conn, serve: Any) -> None:
    served = serve(rules)
    events: list[dict[str, Any]] = [shipped(f"p{i}", id=f"e{i}") for i in range(6)]
    events[3] = {"type": "parcel_shipped", "id": "e3"}  # no key
    events.append({"type": "backup_ping", "key": "db1"})
    answer = served.api.post("/v1/events", json={"events": events})
    assert error(answer, 400) == "events[3].key: is required"
    assert stored(conn) == (0, 0, 0)  # neither the events before it nor their ids
    assert served.count("parcel_shipped", "rejected") == 6
    assert served.count("backup_ping", "rejected") == 1
    assert served.count("parcel_shipped", "accepted") == 0
    # The same batch once fixed goes in whole: nothing of the refused one was kept.
    events[3]["key"] = "p3"
    fixed = served.api.post("/v1/events", json={"events": events})
    assert fixed.json() == {"accepted": 7, "duplicates": 0}


def post_raw(api: httpx.Client, body: bytes) -> httpx.Response:
    return api.post("/v1/events", content=body, headers={"content-type": "application/json"})


BAD: list[tuple[Any, str]] = [
    (b"{", "body: not JSON: unexpected end of data"),
    (b"", "body: not JSON: Input is a zero-length, empty document"),
    (b'{"type": "parcel_shipped", "key": "p1",}', "body: not JSON"),
    (b"\xff\xfe", "body: not JSON"),
    (b'{"type": "parcel_shipped", "key": 1' + b"0" * 30 + b"}", "key: 1e+30: a key is text"),
    (b"[" * 5000 + b"]" * 5000, "body: nested too deep (over 1,024 levels"),
    ([1], "an event is a JSON object, not list"),
    ("parcel_shipped", "an event is a JSON object, not str"),
    (None, "an event is a JSON object, not NoneType"),
    ({"events": []}, "events: holds 0 events; a batch is 1 to 10,000"),
    ({"events": {"type": "x"}}, "events: must be a list of events"),
    ({"events": [shipped("p1")], "more": 1}, 'a batch is {"events": [...]} and nothing else'),
    ({"type": "parcel_shiped", "key": "p1"}, "type: 'parcel_shiped': no rule uses this type"),
    ({"type": "order_paid", "key": "p1"}, "(rules use: backup_ping, parcel_delivered, "),
    ({"type": "", "key": "p1"}, "type: '' is not an event type"),
    ({"type": 5, "key": "p1"}, "type: 5 is not an event type"),
    ({"key": "p1"}, "type: is required"),
    (shipped(""), "key: must be 1 to 200 characters"),
    (shipped("k" * 201), "key: must be 1 to 200 characters, not 201"),
    (shipped("a\x00b"), "key: contains a control character (U+0000 at 1)"),
    (shipped(True), "key: True: a key is text"),
    (shipped(["p1"]), "key: ['p1']: a key is text"),
    (shipped("p1", at="9999-12-31T23:59:59Z"), "at: 9999-12-31T23:59:59Z is more than 5 minutes"),
    (shipped("p1", at="2026-11-25T10:06:00Z"), "is more than 5 minutes in the future"),
    (shipped("p1", at="1970-01-01T00:00:00Z"), "older than the retention (4w2d)"),
    (shipped("p1", at="2026-11-25T09:00:00"), "at: '2026-11-25T09:00:00' has no time zone"),
    (shipped("p1", at="2026-02-30T09:00:00Z"), "at: '2026-02-30T09:00:00Z' is not a time"),
    (shipped("p1", at="yesterday"), "at: 'yesterday' is not a time"),
    (shipped("p1", at=1764064800), "at: 1764064800 is not a time"),
    (shipped("p1", data=[1]), "data: must be a JSON object, not list"),
    (shipped("p1", data="x"), "data: must be a JSON object, not str"),
    (shipped("p1", data={"a": "\x00"}), "data: must not contain NUL"),
    (shipped("p1", id=""), "id: must be 1 to 200 characters"),
    (shipped("p1", id="a\x07"), "id: contains a control character (U+0007 at 1); ids are"),
    (shipped("p1", id={"a": 1}), "id: {'a': 1}: an id is text"),
    (shipped("p1", when="now"), "when: unknown field (known: type, key, at, data, id)"),
]


def test_data_nested_too_deep_says_so_and_the_limit(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    """Was "data: not JSON: Recursion limit reached". The limit is orjson's; json.dumps
    writes the bodies (orjson would refuse the deepest itself)."""

    def nested(depth: int) -> dict[str, Any]:
        data: dict[str, Any] = {"leaf": [1]}  # a list is a level too
        for _ in range(depth - 2):
            data = {"a": data}
        return data

    served = serve(rules)
    deep = json.dumps(shipped("p1", data=nested(MAX_DEPTH + 1))).encode()
    answer = post_raw(served.api, deep)
    assert error(answer, 400) == (
        f"data: nested too deep: at most {MAX_DEPTH} levels of objects and lists"
    )
    assert MAX_DEPTH == 252
    assert stored(conn) == (0, 0, 0)
    fits = json.dumps(shipped("p2", data=nested(MAX_DEPTH))).encode()
    assert post_raw(served.api, fits).status_code == 202


def test_bad_input_is_a_400_naming_the_problem(rules: list[Rule], conn: Conn, serve: Any) -> None:
    served = serve(rules)
    for body, says in BAD:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        answer = post_raw(served.api, raw)
        assert says in error(answer, 400), (body, answer.text)
    # In a batch, the index comes first.
    late = {"events": [shipped("p1"), shipped("p2", at="9999-01-01T00:00:00Z")]}
    assert error(served.api.post("/v1/events", json=late), 400).startswith("events[1].at: ")
    too_many = {"events": [shipped(f"p{i}") for i in range(10_001)]}
    assert "holds 10,001 events" in error(served.api.post("/v1/events", json=too_many), 400)
    assert stored(conn) == (0, 0, 0)
    assert served.count("-", "rejected") > 10  # types no rule uses, or none at all


def test_big_bodies(rules: list[Rule], conn: Conn, serve: Any) -> None:
    served = serve(rules)
    # 10 MB of data in one event: under the body limit, over an event's.
    huge = shipped("p1", data={"blob": "x" * 10_000_000})
    says = error(served.api.post("/v1/events", json=huge), 400)
    assert says.startswith("data: 10,000,011 bytes as JSON, more than 65,536"), says
    # Over the body limit (16 MiB): refused before it is read.
    over = orjson.dumps(shipped("p1", data={"blob": "x" * (17 << 20)}))
    assert "at most 16,777,216 bytes" in error(post_raw(served.api, over), 413)
    # A full batch of 10,000 events with some data each goes in whole.
    data = {"order": "o" * 100, "carrier": "UPS", "weight_g": 1200}
    full = {"events": [shipped(f"p{i}", id=f"e{i}", data=data) for i in range(10_000)]}
    taken = served.api.post("/v1/events", json=full)
    assert taken.status_code == 202, taken.text
    assert taken.json() == {"accepted": 10_000, "duplicates": 0}
    assert stored(conn) == (10_000, 0, 10_000)


def test_the_known_types_follow_a_reload(rules: list[Rule], conn: Conn, serve: Any) -> None:
    current = rules[:1]  # the backup rule is not loaded (yet)
    served = serve(lambda: current)
    ping = {"type": "backup_ping", "key": "db1"}
    assert "'backup_ping': no rule uses this type" in error(
        served.api.post("/v1/events", json=ping), 400
    )
    current.append(rules[1])
    assert served.api.post("/v1/events", json=ping).json() == {"accepted": 1, "duplicates": 0}


def test_the_ingest_token_posts_events_and_nothing_else(rules: list[Rule], serve: Any) -> None:
    api = serve(rules, token=TOKEN, ingest_token=INGEST).api
    ingest = {"Authorization": f"Bearer {INGEST}"}
    full = {"Authorization": f"Bearer {TOKEN}"}
    assert api.post("/v1/events", json=shipped("p1"), headers=ingest).status_code == 202
    assert api.post("/v1/events", json=shipped("p2"), headers=full).status_code == 202
    assert "Authorization: Bearer" in error(api.post("/v1/events", json=shipped("p3")), 401)
    bad = {"Authorization": f"Bearer {INGEST}x"}
    assert error(api.post("/v1/events", json=shipped("p3"), headers=bad), 401)
    only = "an ingest token is only for POST /v1/events"
    for method, path, body in [
        ("POST", "/v1/replay", None),
        ("POST", "/v1/alerts/1/ack", {"by": "x"}),
        ("POST", "/v1/silences", {"rule": "backup", "until": "1h", "author": "x"}),
        ("DELETE", "/v1/silences/1", None),
        ("GET", "/v1/rules", None),
        ("GET", "/v1/alerts", None),
        ("GET", "/v1/events", None),
        ("GET", "/metrics", None),
        ("GET", "/openapi.json", None),
        ("GET", "/", None),
    ]:
        answer = api.request(method, path, json=body, headers=ingest)
        assert error(answer, 403) == only, (method, path)
    assert api.get("/healthz", headers=ingest).status_code == 200
    # The page's login takes the API token only.
    login = api.post("/login", data={"token": INGEST}, follow_redirects=False)
    assert login.status_code == 401 and "set-cookie" not in login.headers
    # A browser on another site gets nothing, token or not.
    evil = ingest | {"Origin": "https://evil.example"}
    assert error(api.post("/v1/events", json=shipped("p4"), headers=evil), 403).startswith(
        "cross-origin"
    )


def test_without_the_api_token(rules: list[Rule], serve: Any) -> None:
    # Bound to loopback: writes are open to this machine, events as any other.
    assert serve(rules).api.post("/v1/events", json=shipped("p1")).status_code == 202
    # Bound to every interface: writes are refused ...
    public = serve(rules, allow_writes=False, ingest_token=INGEST).api
    refused = error(public.post("/v1/events", json=shipped("p2")), 403)
    assert refused.startswith("writes are refused")
    # ... and the ingest token still lets producers post events, from any Host.
    ingest = {"Authorization": f"Bearer {INGEST}", "Host": "slawatch.example:8181"}
    assert public.post("/v1/events", json=shipped("p3"), headers=ingest).status_code == 202
    assert error(public.post("/v1/replay", headers=ingest), 403).startswith("an ingest token")
    assert error(public.get("/v1/rules", headers={"Host": "slawatch.example"}), 403)


def test_the_database_down_is_a_503_and_nothing_is_lost(
    rules: list[Rule], conn: Conn, dsn: str, serve: Any
) -> None:
    proxy, through = TcpProxy.for_dsn(dsn)
    served = serve(rules, dsn_=through, timeout=1)
    assert served.api.post("/v1/events", json=shipped("p1")).status_code == 202
    proxy.close()
    down = served.api.post("/v1/events", json={"events": [shipped("p2"), shipped("p3")]})
    assert error(down, 503).startswith("storing events: ")
    assert timers(conn) == [("p1", True)]
    assert served.count("parcel_shipped", "rejected") == 0  # the producer retries it


def test_the_rules_and_the_page_show_what_an_event_rule_watches(
    rules: list[Rule], serve: Any
) -> None:
    api = serve(rules, clock=Clock()).api
    assert api.post("/v1/events", json=shipped("p1")).status_code == 202
    report = {r["name"]: r for r in api.get("/v1/rules").json()["rules"]}
    parcel = report["parcel_undelivered"]
    assert parcel["events"] == "parcel_shipped → parcel_delivered, parcel_returned within 3d"
    assert (parcel["table"], parcel["problem"]) == ("slawatch.parcel_undelivered_timers", None)
    assert (parcel["overdue"], parcel["notified"]) == (0, None)
    assert report["backup"]["events"] == "backup_ping at least every 1d1h"
    one = api.get("/v1/rules/backup").json()
    assert one["events"] == report["backup"]["events"]
    page = api.get("/")
    assert page.status_code == 200, page.text
    assert "events: parcel_shipped → parcel_delivered, parcel_returned within 3d" in page.text
    assert "slawatch.parcel_undelivered_timers" not in page.text


def test_busy_producers_wait_their_turn_and_leave_the_reads_alone(
    rules: list[Rule], conn: Conn, dsn: str, serve: Any
) -> None:
    """Six batches at once while the timer table is locked: four wait in the database on
    the events' own pool, two wait their turn in slawatch, none is turned away as if the
    database were down, and the reads keep their own connections meanwhile."""
    pool_wait = 0.5  # the events pool's timeout: waiting on the pool past it is an outage
    with Database(dsn, size=EVENTS_AT_ONCE, timeout=pool_wait) as events_db:
        served = serve(rules, events_db=events_db)
        answers: list[int] = []

        def post(i: int) -> None:
            with httpx.Client(base_url=served.server.url, timeout=60) as client:
                answers.append(client.post("/v1/events", json=shipped(f"p{i}")).status_code)

        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE slawatch.parcel_undelivered_timers IN EXCLUSIVE MODE")
            posts = [threading.Thread(target=post, args=(i,)) for i in range(6)]
            for thread in posts:
                thread.start()
            wait_until(lambda: len(lock_waits(conn)) == EVENTS_AT_ONCE, "four batches writing")
            # The lock is held well past the pool's timeout: that span is what is tested
            # (a batch that waited on the pool would be answered 503 within it).
            time.sleep(4 * pool_wait)
            assert served.api.get("/v1/rules").status_code == 200  # the reads' own pool
            assert answers == [] and len(lock_waits(conn)) == EVENTS_AT_ONCE
            locker.commit()
        for thread in posts:
            thread.join(60)
        assert answers == [202] * 6
        assert not events_db.outage.down and not served.db.outage.down
        assert len(timers(conn)) == 6
