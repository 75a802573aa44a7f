"""The admin server under a hostile or broken world (issue 13): /readyz across a real
database stop and start, the Host check without a token on every route, idle and slow
connections, busy request slots, request bodies over their limit, and page sessions
that end. Real servers throughout: uvicorn in a thread, raw sockets, PostgreSQL."""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from fastapi import FastAPI
from starlette.routing import BaseRoute, Route

from slawatch.clock import Clock
from slawatch.config.notifiers import ConsoleConfig
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.operate.admin import AdminServer, create_app, serve_admin, serve_in_thread
from slawatch.operate.guard import MIB, Limits
from slawatch.operate.page import COOKIE, MAX_LOGIN_BODY
from slawatch.operate.session import PRUNE, SESSION_AGE
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, shop
from tests.integration.test_admin import rules
from tests.pgcluster import PgCluster

__all__ = ["rules"]

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "hardening-token-0123456789"
FOREIGN = "only a loopback Host is answered"


class MovingClock(Clock):
    """The application's clock, set by the test."""

    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


@dataclass
class Served:
    server: AdminServer
    app: FastAPI
    api: httpx.Client

    @property
    def address(self) -> tuple[str, int]:
        return self.server.host, self.server.port


Serve = Callable[..., Served]


@pytest.fixture
def serve(dsn: str) -> Iterator[Serve]:
    """An admin server (create_app's keywords) on a free port, and a client for it."""
    running: list[tuple[Served, Database]] = []

    def start(rules: list[Rule], **kw: Any) -> Served:
        db = Database(dsn, size=2, timeout=5)
        options: dict[str, Any] = {"token": None, "allow_writes": True} | kw
        app = create_app(db, rules, ["console"], **options)
        server = serve_in_thread(app, "127.0.0.1", 0)
        api = httpx.Client(base_url=server.url, timeout=10, follow_redirects=False)
        served = Served(server, app, api)
        running.append((served, db))
        return served

    yield start
    for served, db in running:
        served.api.close()
        served.server.stop()
        db.close()


# ---------------------------------------------------------------- raw HTTP


def head_of(sock: socket.socket, timeout: float) -> tuple[int, str]:
    """The status and (lower-cased) head of the response on ``sock``."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1")
    assert head.startswith("HTTP/1.1 "), data[:200]
    return int(head.split(" ", 2)[1]), head.lower()


def closed_by_server(sock: socket.socket, until: float) -> bool:
    """Whether the server closes ``sock`` before ``until`` (time.monotonic())."""
    while (left := until - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def request_head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ---------------------------------------------------------------- 1. /readyz tells the truth

RULE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
open_when: "status = 'paid'"
notify: [console]
"""
EVERY = 2.0  # the rule's scan interval: /readyz must follow the database within it
MARGIN = 2.0  # seconds for this (shared, 2-core) machine beyond the promise


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


def serving_runner(
    dsn: str, timeout: float, every: str = "2s", poll: float = 0.5
) -> tuple[Runner, threading.Thread, AdminServer]:
    """A Runner serving one rule with the admin API beside it, as `run` does."""
    rule = Rule.model_validate(yaml.safe_load(RULE) | {"name": "late", "every": every})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)"
        )
        migrate(conn, [rule])
    console = ConsoleConfig.model_validate({"name": "console", "type": "console"})
    runner = Runner(dsn, [rule], [console], timeout=timeout, poll=poll)
    serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
    serving.start()
    admin = serve_admin(
        dsn,
        ("127.0.0.1", 0),
        lambda: list(runner.rules.values()),
        lambda: list(runner.notifiers),
        token=None,
        timeout=timeout,
        pooler="auto",
        health=runner.health,
        registry=runner.registry,
    )
    return runner, serving, admin


def test_readyz_follows_a_database_stop_and_start_within_one_scan_interval(
    cluster: PgCluster,
) -> None:
    """The operator's probe: 30 s into an outage /readyz said ready (the runner's own
    "database" entry, not yet in an outage by its grace, overwrote the failed check), and
    after the outage it said not ready for seconds (the runner's view, until its next
    success). The default DB timeout (30 s) is what made the runner's view lag."""
    dsn = cluster.database(f"ready_{uuid.uuid4().hex[:8]}")
    runner, serving, admin = serving_runner(dsn, timeout=30)
    try:
        with httpx.Client(base_url=admin.url, timeout=10) as api:
            wait_for(lambda: api.get("/readyz").status_code == 200, "ready at first")

            cluster.stop()
            took = wait_for(
                lambda: api.get("/readyz").status_code == 503, "not ready", EVERY + MARGIN
            )
            down = api.get("/readyz")
            body = down.json()
            assert down.status_code == 503 and body["ready"] is False, body
            assert body["checks"]["database"] is False and body["checks"]["schema"] is False
            assert body["error"].startswith("database unreachable: "), body
            # It stays so while the database is away (the runner's view does not flip it).
            assert api.get("/readyz").json()["checks"]["database"] is False
            assert took <= EVERY + MARGIN

            cluster.start()
            took = wait_for(
                lambda: api.get("/readyz").status_code == 200, "ready again", EVERY + MARGIN
            )
            up = api.get("/readyz").json()
            assert up["ready"] is True and up["error"] is None, up
            assert up["checks"]["database"] is True and up["checks"]["schema"] is True
    finally:
        admin.stop()
        runner.stop()
        serving.join(60)
        runner.close()


def test_readyz_takes_the_database_from_its_probe_not_from_a_part(
    conn: Conn, dsn: str, serve: Serve
) -> None:
    # After an outage the runner's record says "unreachable" until its own next success,
    # which its backoff may put off by half a minute, while the database is back. A quiet
    # runner (one scan an hour, a poll an hour) keeps that record as it is made here.
    runner, serving, admin = serving_runner(dsn, timeout=1, every="1h", poll=3600)
    try:
        with httpx.Client(base_url=admin.url, timeout=10) as api:
            wait_for(lambda: api.get("/readyz").status_code == 200, "ready")
            # Past the outage record's grace after the last success, a failure counts.
            wait_for(lambda: runner.db.outage.failed("as in an outage"), "the runner's outage")
            assert runner.db.outage.down
            ready = api.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"]["database"] is True
            assert runner.db.outage.down  # still: the answer did not wait for the runner
    finally:
        admin.stop()
        runner.stop()
        serving.join(60)
        runner.close()
    # A part that names a check cannot turn its failure into a success.
    rules = list(shop(conn).values())
    conn.execute("DROP SCHEMA slawatch CASCADE")
    liar = serve(rules, health=lambda: {"schema": True, "database": True, "scheduler": True})
    answer = liar.api.get("/readyz")
    assert answer.status_code == 503, answer.text
    assert answer.json()["checks"] == {"schema": False, "database": True, "scheduler": True}
    assert "slawatch migrate" in answer.json()["error"]


# ---------------------------------------------------------------- 2. the Host check


def every_route(routes: list[BaseRoute]) -> Iterator[Route]:
    """The routes of an app and of the routers it includes (FastAPI 0.165 keeps an
    included router as one entry of ``app.routes``; earlier releases copy its routes)."""
    for route in routes:
        if isinstance(route, Route):
            yield route
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from every_route(inner.routes)


def test_without_a_token_a_foreign_host_gets_nothing_on_any_route(
    rules: list[Rule], serve: Serve
) -> None:
    served = serve(rules)
    routes = list(every_route(served.app.routes))
    paths = {r.path for r in routes}
    # Every route of the app is tried below, so a route added later is covered too.
    assert {"/", "/v1/alerts", "/v1/rules", "/metrics", "/openapi.json", "/login"} <= paths
    tried = 0
    for route in routes:
        path = re.sub(r"\{[^}]*\}", "1", route.path)
        for method in sorted(route.methods or ()):
            for host in ("evil.example", f"evil.example:{served.server.port}", "10.0.0.1"):
                answer = served.api.request(method, path, headers={"host": host})
                if route.path == "/healthz":  # liveness is probed by IP: open, and says nothing
                    assert answer.status_code == 200, (method, path, host)
                    continue
                if route.path.startswith("/ping/"):  # the key is the secret: 404 for a wrong one
                    assert answer.status_code == 404, (method, path, host)
                    continue
                assert answer.status_code == 403, (method, path, host, answer.text)
                assert method == "HEAD" or FOREIGN in answer.json()["error"]
                tried += 1
    assert tried >= 3 * 15
    assert served.api.get("/nowhere", headers={"host": "evil.example"}).status_code == 403
    # The page and the API work under this machine's names, with or without a port.
    port = served.server.port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", "127.0.0.2", "[::1]"):
        page = served.api.get("/", headers={"host": host})
        assert page.status_code == 200 and "order_unshipped" in page.text, host
        assert served.api.get("/v1/alerts", headers={"host": host}).status_code == 200
    # With a token the token decides (a rebound name has no token).
    guarded = serve(rules, token=TOKEN)
    bearer = {"host": "evil.example", "authorization": f"Bearer {TOKEN}"}
    assert guarded.api.get("/v1/rules", headers=bearer).status_code == 200
    assert guarded.api.get("/v1/rules", headers={"host": "evil.example"}).status_code == 401


# ---------------------------------------------------------------- 3. starvation


def test_idle_and_slow_connections_neither_starve_the_server_nor_stay_open(
    rules: list[Rule], serve: Serve
) -> None:
    """The probe: 15 idle sockets got every request a 503 (uvicorn counts connections
    against limit_concurrency), and stayed open 70 s later."""
    deadline = 3.0
    served = serve(rules, limits=Limits(header_timeout=deadline))
    opened = time.monotonic()
    idle = [socket.create_connection(served.address) for _ in range(100)]
    slow = socket.create_connection(served.address)
    slow.sendall(b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never ends
    # One request answered, then the next one's headers begun and never ended.
    kept = socket.create_connection(served.address)
    kept.sendall(request_head("GET", "/healthz"))
    assert head_of(kept, 5)[0] == 200
    kept.sendall(b"GET /v1/stats HTTP/1.1\r\nX-Slow: ")
    slow_ones = [slow, kept]
    try:
        assert served.api.get("/healthz").status_code == 200
        assert served.api.get("/readyz").status_code == 200
        assert served.api.get("/v1/stats").status_code == 200  # idle sockets hold no slot
        # The answers came while every one of them was open.
        assert all(still_open(s) for s in [*idle, *slow_ones])
        assert time.monotonic() - opened < deadline
        # A byte now and then does not keep a request's headers waiting forever.
        while slow_ones:
            assert time.monotonic() - opened < deadline + MARGIN, "a slow one is still open"
            for sock in slow_ones:
                sock.sendall(b"x")
            slow_ones = [s for s in slow_ones if not closed_by_server(s, time.monotonic() + 0.25)]
        limit = opened + deadline + MARGIN
        assert all(closed_by_server(s, limit) for s in idle), "idle sockets left open"
    finally:
        for s in [*idle, slow, kept]:
            s.close()


def test_connections_waiting_for_a_request_are_bounded(rules: list[Rule], serve: Serve) -> None:
    served = serve(rules, limits=Limits(header_timeout=60, idle=5))
    sockets = []
    try:
        for _ in range(8):
            sockets.append(socket.create_connection(served.address))
            # Each is accepted before the next, so they arrive in this order.
            assert served.api.get("/healthz").status_code == 200
        # The oldest are closed as soon as more than 5 wait, long before the 60 s deadline.
        wait_for(lambda: not any(map(still_open, sockets[:3])), "the oldest closed", 10)
        assert all(still_open(s) for s in sockets[-2:])
    finally:
        for s in sockets:
            s.close()


def test_busy_request_slots_leave_health_answering_and_cheap_refusals_first(
    rules: list[Rule], serve: Serve
) -> None:
    limits = Limits(requests=3, body_timeout=2.0)
    served = serve(rules, limits=limits)
    stalled = []
    try:
        # Three writes whose bodies never come each hold a slot.
        for _ in range(3):
            sock = socket.create_connection(served.address)
            sock.sendall(
                request_head(
                    "POST", "/v1/silences", "Content-Type: application/json", "Content-Length: 50"
                )
            )
            stalled.append(sock)
        wait_for(lambda: served.api.get("/v1/stats").status_code == 503, "every slot busy", 10)
        busy = served.api.get("/v1/stats")
        assert "busy" in busy.json()["error"] and busy.headers["retry-after"] == "1"
        assert served.api.get("/healthz").status_code == 200
        assert served.api.get("/readyz").status_code == 200
        # What is refused without a slot is refused as such, not as busy.
        assert served.api.get("/v1/stats", headers={"host": "evil.example"}).status_code == 403
        with socket.create_connection(served.address) as large:
            large.sendall(request_head("POST", "/v1/silences", f"Content-Length: {MIB + 1}"))
            assert head_of(large, 5)[0] == 413
        # The stalled bodies time out: 408, the connection closed, the slots free again.
        for sock in stalled:
            status, head = head_of(sock, limits.body_timeout + MARGIN + 3)
            assert status == 408 and "connection: close" in head
            assert closed_by_server(sock, time.monotonic() + MARGIN)
        assert served.api.get("/v1/stats").status_code == 200
    finally:
        for sock in stalled:
            sock.close()
    # With a token, a request without it is a 401 even when every slot is busy.
    guarded = serve(rules, token=TOKEN, limits=Limits(requests=1, body_timeout=30))
    good = f"Authorization: Bearer {TOKEN}"
    with socket.create_connection(guarded.address) as sock:
        sock.sendall(request_head("POST", "/v1/replay", good, "Content-Length: 10"))
        bearer = {"authorization": f"Bearer {TOKEN}"}
        wait_for(
            lambda: guarded.api.get("/v1/stats", headers=bearer).status_code == 503, "busy", 10
        )
        assert guarded.api.get("/v1/stats").status_code == 401
        assert guarded.api.get("/healthz").status_code == 200
        assert guarded.api.get("/readyz", headers=bearer).status_code == 200


# ---------------------------------------------------------------- 5. body limits


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    rules: list[Rule], serve: Serve
) -> None:
    served = serve(rules)  # the body timeout is 10 s: a 413 sooner never waited for a body
    for path, size, extra in (
        ("/v1/silences", 50 * MIB, ()),
        ("/v1/silences", MIB + 1, ("Expect: 100-continue",)),
        ("/login", MAX_LOGIN_BODY + 1, ()),
    ):
        with socket.create_connection(served.address) as sock:
            sock.sendall(
                request_head(
                    "POST",
                    path,
                    "Content-Type: application/json",
                    f"Content-Length: {size}",
                    *extra,
                )
            )
            status, head = head_of(sock, 5)  # only the headers were sent
            assert status == 413 and "connection: close" in head, (path, size, head)
            assert "100 continue" not in head
            assert closed_by_server(sock, time.monotonic() + MARGIN)
    # At the limit it is read (and then judged by the API).
    exact = served.api.post(
        "/v1/silences", content=b" " * MIB, headers={"content-type": "application/json"}
    )
    assert exact.status_code == 422, exact.text


def test_a_chunked_body_is_counted_while_it_streams_and_stopped_at_the_limit(
    rules: list[Rule], conn: Conn, serve: Serve
) -> None:
    served = serve(rules)
    piece = b" " * (16 * 1024)
    with socket.create_connection(served.address) as sock:
        sock.sendall(
            request_head(
                "POST",
                "/v1/silences",
                "Content-Type: application/json",
                "Transfer-Encoding: chunked",
            )
        )
        sent = 0
        while sent <= MIB:  # one piece past the limit, then nothing (nor the final chunk)
            sock.sendall(
                b"%x\r\n" % len(piece) + piece + (b"\r\n" if sent + len(piece) <= MIB else b"")
            )
            sent += len(piece)
        status, head = head_of(sock, 5)
        assert status == 413 and "connection: close" in head
    # A chunked body within the limit reaches the API whole.
    silence = b'{"rule": "job_hung", "until": "1h", "author": "ana"}'
    made = served.api.post(
        "/v1/silences",
        content=iter([silence[:10], silence[10:]]),
        headers={"content-type": "application/json"},
    )
    assert made.status_code == 201, made.text
    assert conn.execute("SELECT count(*) FROM slawatch.silence").fetchone() == (1,)


# ---------------------------------------------------------------- 4. sessions that end


def login(served: Served) -> str:
    answer = httpx.post(f"{served.api.base_url}/login", data={"token": TOKEN})
    assert answer.status_code == 303, answer.text
    return answer.cookies[COOKIE]


def reads(served: Served, session: str) -> int:
    return httpx.get(f"{served.api.base_url}/v1/rules", cookies={COOKIE: session}).status_code


def test_page_sessions_end_at_logout_and_after_12_hours_on_every_instance(
    rules: list[Rule], conn: Conn, serve: Serve
) -> None:
    clock = MovingClock(NOW)
    one, two = (serve(rules, token=TOKEN, clock=clock) for _ in range(2))
    first, second = login(one), login(one)
    assert first != second  # a random id per login, not a digest of the token
    for served in (one, two):  # instances behind one address share the sessions
        assert reads(served, first) == reads(served, second) == 200
    stored = conn.execute("SELECT id_hash, created_at, expires_at FROM slawatch.session").fetchall()
    assert len(stored) == 2
    assert {(c, e) for _, c, e in stored} == {(NOW, NOW + SESSION_AGE)}
    assert all(
        first.encode() not in bytes(h) and TOKEN.encode() not in bytes(h) for h, *_ in stored
    )

    # Logging out on one instance ends the session on both; the other goes on.
    out = httpx.post(f"{two.api.base_url}/logout", cookies={COOKIE: first})
    assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
    assert reads(one, first) == reads(two, first) == 401
    assert httpx.get(f"{one.api.base_url}/", cookies={COOKIE: first}).status_code == 401
    assert reads(one, second) == 200

    # 12 hours by the application's clock, whatever the cookie's Max-Age says.
    clock.at = NOW + SESSION_AGE - timedelta(seconds=1)
    assert reads(one, second) == reads(two, second) == 200
    clock.at = NOW + SESSION_AGE
    assert reads(one, second) == reads(two, second) == 401

    # A login prunes expired sessions, a bounded number at a time.
    conn.execute(
        "INSERT INTO slawatch.session"
        " SELECT decode(md5(g::text), 'hex'), %(at)s, %(at)s + g * interval '1 second'"
        " FROM generate_series(1, %(n)s) g",
        {"at": NOW - timedelta(days=2), "n": PRUNE + 50},
    )
    third = login(two)
    (expired,) = conn.execute(
        "SELECT count(*) FROM slawatch.session WHERE expires_at <= %s", (clock.at,)
    ).fetchone()  # type: ignore[misc]
    assert expired == 50 + 1  # the 100 oldest went; 50 and the session that just ended stay
    assert reads(one, third) == 200
    # Malformed or unknown ids are no session (and the first are not even looked up).
    for wrong in ("", "x", third[:-1], third + "A", "A" * 43, "!" * 43):
        assert httpx.get(f"{one.api.base_url}/", cookies={COOKIE: wrong}).status_code == 401
