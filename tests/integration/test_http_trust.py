"""What producers and people can trust of the admin server (issue 24): producers' own
request slots, every 503 JSON with Retry-After, a stop that answers every batch in
flight, scoped ingest tokens, keys without control characters, the Secure cookie behind
a proxy, and kept-alive connections that outlive clients' pools. Real servers throughout:
uvicorn in a thread or `slawatch run` in a child process, PostgreSQL, raw sockets."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from slawatch.config.rules import Rule, load_rules
from slawatch.config.settings import IngestScope
from slawatch.db import Database
from slawatch.engine.migrate import migrate
from slawatch.operate.admin import DRAIN
from slawatch.operate.guard import Limits
from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.integration.test_admin import TOKEN, error
from tests.integration.test_admin_hardening import (
    MARGIN,
    closed_by_server,
    head_of,
    request_head,
)
from tests.integration.test_cli import clean_env
from tests.integration.test_events_http import BACKUP, INGEST, PARCEL, rules, serve, shipped
from tests.pgcluster import free_port
from tests.tcpproxy import TcpProxy
from tests.waiting import Lines, lock_waits, wait_until

__all__ = ["rules", "serve"]

SCOPED = "scoped-producer-token-0123456789"


def delivered(key: str, **more: Any) -> dict[str, Any]:
    return {"type": "parcel_delivered", "key": key} | more


def parcels(conn: Conn) -> set[str]:
    rows = conn.execute("SELECT key FROM slawatch.parcel_undelivered_timers").fetchall()
    return {str(r[0]) for r in rows}


# ---------------------------------------------------------------- 1. producers' own slots


def test_reads_holding_every_slot_leave_producers_theirs(
    rules: list[Rule], conn: Conn, dsn: str, serve: Any
) -> None:
    """The probe: 30 reports filled the 16 shared slots and a producer got 503. Two
    reports blocked in the database hold both read slots; a batch still gets 202."""
    with Database(dsn, size=2, timeout=5) as events_db:
        served = serve(rules, events_db=events_db, limits=Limits(requests=2))
        answers: list[int] = []

        def report() -> None:
            with httpx.Client(base_url=served.server.url, timeout=60) as client:
                answers.append(client.get("/v1/report").status_code)

        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE slawatch.episode IN ACCESS EXCLUSIVE MODE")
            readers = [threading.Thread(target=report) for _ in range(2)]
            for reader in readers:
                reader.start()
            wait_until(lambda: len(lock_waits(conn)) == 2, "two reports blocked on the lock")
            busy = served.api.get("/v1/stats")
            assert "busy (2 requests at once)" in error(busy, 503)
            taken = served.api.post("/v1/events", json=shipped("p1"))
            assert taken.status_code == 202, taken.text
            assert answers == [] and len(lock_waits(conn)) == 2  # the reads still held
            locker.rollback()
        for reader in readers:
            reader.join(60)
        assert answers == [200, 200]
        assert parcels(conn) == {"p1"}


# ---------------------------------------------------------------- 2. 503: JSON, Retry-After


def test_every_503_is_json_and_says_when_to_retry(
    rules: list[Rule], conn: Conn, dsn: str, serve: Any
) -> None:
    served = serve(rules, limits=Limits(ingest=1, body_timeout=30))
    with socket.create_connection((served.server.host, served.server.port)) as stalled:
        # A batch whose body never comes holds the one producer slot.
        stalled.sendall(request_head("POST", "/v1/events", "Content-Length: 50"))
        # (Not JSON, so that an attempt before the slot is taken stores nothing: a 400.)
        wait_until(
            lambda: served.api.post("/v1/events", content=b"{").status_code == 503,
            "the producers' slot taken",
        )
        busy = served.api.post("/v1/events", json=shipped("p1"))
        assert "busy (1 batches of events at once)" in error(busy, 503)
        assert busy.headers["retry-after"] == "1"
        assert served.api.get("/v1/rules").status_code == 200  # the reads' slots are free
    # The database away: the events, the reads and /readyz all say when to come back.
    proxy, through = TcpProxy.for_dsn(dsn)
    away = serve(rules, dsn_=through, timeout=1)
    assert away.api.post("/v1/events", json=shipped("p2")).status_code == 202
    proxy.close()
    for answer in (away.api.post("/v1/events", json=shipped("p3")), away.api.get("/v1/rules")):
        assert error(answer, 503) and answer.headers["retry-after"] == "5", answer.headers
    page = away.api.get("/")  # a person's browser: HTML, and the same header
    assert page.status_code == 503 and page.headers["retry-after"] == "5", page.headers
    wait_until(lambda: away.api.get("/readyz").status_code == 503, "not ready")
    assert away.api.get("/readyz").headers["retry-after"] == "5"
    assert parcels(conn) == {"p2"}


# ---------------------------------------------------------------- 3. SIGTERM answers all


@pytest.fixture
def rules_dir(conn: Conn, tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "parcel_undelivered.yaml").write_text(PARCEL)
    (folder / "backup.yaml").write_text(BACKUP)
    migrate(conn, load_rules(folder))
    return folder


def test_sigterm_answers_every_batch_in_flight_and_202_means_stored(
    rules_dir: Path, conn: Conn, dsn: str
) -> None:
    """The probe: SIGTERM with batches in flight gave plain-text 500s and tracebacks.
    Four batches are held in the database by row locks (two by each of two lockers);
    after SIGTERM the first locker lets go: its two batches commit during the drain
    (202); the other two are still held when the drain ends: interrupted, rolled back,
    answered a JSON 503 with Retry-After. The process exits 0 and logs no traceback."""
    url = f"http://127.0.0.1:{free_port()}"
    env = clean_env() | {
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(rules_dir),
        "SLAWATCH_NOTIFIERS_DIR": str(ROOT / "notifiers"),
        "SLAWATCH_HTTP": url.removeprefix("http://"),
        "SLAWATCH_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "slawatch", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    log = Lines(proc.stderr)
    answers: dict[int, httpx.Response] = {}
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            except httpx.TransportError:
                assert proc.poll() is None, f"slawatch run ended:\n{log.rest()}"
                return False

        wait_until(up, "the admin API of slawatch run")
        first = {"events": [shipped("held1"), shipped("held2")]}
        assert httpx.post(f"{url}/v1/events", json=first, timeout=60).status_code == 202

        def post(i: int) -> None:
            held = "held1" if i < 2 else "held2"
            batch = {"events": [shipped(f"b{i}"), delivered(held, id=f"d{i}")]}
            with httpx.Client(base_url=url, timeout=120) as client:
                answers[i] = client.post("/v1/events", json=batch)

        with psycopg.connect(dsn) as one, psycopg.connect(dsn) as two:
            for locker, key in ((one, "held1"), (two, "held2")):
                locker.execute(
                    "SELECT 1 FROM slawatch.parcel_undelivered_timers WHERE key = %s FOR UPDATE",
                    (key,),
                )
            posts = [threading.Thread(target=post, args=(i,)) for i in range(4)]
            for thread in posts:
                thread.start()
            wait_until(lambda: len(lock_waits(conn)) == 4, "four batches held by the lockers")
            proc.send_signal(signal.SIGTERM)

            def refused() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), 5).close()
                except ConnectionRefusedError:
                    return True
                return False

            wait_until(refused, "the admin API to stop accepting")
            one.rollback()  # within the drain: these two commit
            for thread in posts[:2]:
                thread.join(60)
            assert [answers[i].status_code for i in (0, 1)] == [202, 202], answers
            for thread in posts[2:]:
                thread.join(DRAIN + 60)
            assert proc.wait(60) == 0
        for i in (2, 3):
            said = error(answers[i], 503)
            assert said.startswith("slawatch is stopping"), said
            assert answers[i].headers["retry-after"] == "5"
        assert parcels(conn) == {"held1", "held2", "b0", "b1"}  # what got 202, and no more
        rest = log.rest()
        assert "Traceback" not in rest and "Exception in ASGI" not in rest, rest
        records = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
        assert not [r for r in records if r["level"] == "ERROR"], rest
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        log.rest()
        proc.stderr.close()


# ---------------------------------------------------------------- 4. scoped tokens


def test_a_scoped_token_posts_its_types_and_keys_only(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    scope = IngestScope.model_validate(
        {"token": SCOPED, "types": ["backup_ping"], "key_prefix": "db"}
    )
    served = serve(rules, token=TOKEN, ingest_token=INGEST, ingest_tokens=[scope])
    api = served.api
    scoped = {"Authorization": f"Bearer {SCOPED}"}
    ping = {"type": "backup_ping", "key": "db1"}
    assert api.post("/v1/events", json=ping, headers=scoped).status_code == 202
    # A stop of any rule, a start, a key outside the prefix: the whole batch refused.
    for body, says in (
        (
            {"events": [{"type": "backup_ping", "key": "db2"}, delivered("p1")]},
            "events[1]: 'parcel_delivered' is not a type this token may post (backup_ping)",
        ),
        (shipped("p1"), "event: 'parcel_shipped' is not a type this token may post"),
        (
            {"events": [{"type": "backup_ping", "key": "web1"}]},
            "events[0]: 'web1' does not start with this token's key_prefix 'db'",
        ),
    ):
        said = error(api.post("/v1/events", json=body, headers=scoped), 403)
        assert said.startswith(says) and said.endswith("nothing was stored"), said
    rows = conn.execute("SELECT key FROM slawatch.backup_timers ORDER BY key").fetchall()
    assert [r[0] for r in rows] == ["db1"] and parcels(conn) == set()
    assert error(api.get("/v1/rules", headers=scoped), 403).startswith("an ingest token")
    # The unscoped ingest token posts every type, as before.
    everything = {"Authorization": f"Bearer {INGEST}"}
    assert api.post("/v1/events", json=shipped("p1"), headers=everything).status_code == 202
    assert served.count("parcel_delivered", "rejected") == 1


# ---------------------------------------------------------------- 5. control characters


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("a\x1b]0;pwned\x07", "U+001B at 1"),  # OSC: retitles the terminal
        ("a\x1b[2J", "U+001B at 1"),  # clears the screen
        ("bell\x07", "U+0007 at 4"),
        ("p9\r\n2026-11-27 INFO forged", "U+000D at 2"),  # a forged log line
        ("c1\x9b2J", "U+009B at 2"),  # CSI in one character
    ],
)
def test_control_characters_in_a_key_are_refused(
    rules: list[Rule], conn: Conn, serve: Any, key: str, says: str
) -> None:
    api = serve(rules).api
    batch = {"events": [shipped("fine"), shipped(key)]}
    said = error(api.post("/v1/events", json=batch), 400)
    assert said == f"events[1].key: contains a control character ({says}); keys and types are " + (
        "printable text"
    )
    bad_type = {"type": "parcel\x1b_shipped", "key": "k"}
    assert error(api.post("/v1/events", json=bad_type), 400).startswith(
        "type: contains a control character (U+001B at 6)"
    )
    assert parcels(conn) == set()


# ---------------------------------------------------------------- 6. the Secure cookie


def login_cookie(api: httpx.Client, **headers: str) -> str:
    answer = api.post("/login", data={"token": TOKEN}, headers=headers)
    assert answer.status_code == 303, answer.text
    return answer.headers["set-cookie"].lower()


def test_the_cookie_is_secure_behind_a_tls_proxy(rules: list[Rule], serve: Any) -> None:
    """The probe: a TLS proxy on another host; uvicorn believed X-Forwarded-Proto from
    loopback only, so the cookie lost Secure."""
    https = {"x-forwarded-proto": "https"}
    # Plain http, nothing else said: no Secure (a browser would not send it back).
    assert "secure" not in login_cookie(serve(rules, token=TOKEN).api)
    # The public URL is https: Secure, whatever the proxy's headers.
    public = serve(rules, token=TOKEN, public_url="https://slawatch.example.com").api
    assert "secure" in login_cookie(public)
    # A proxy's X-Forwarded-Proto counts from the addresses trusted only.
    elsewhere = serve(rules, token=TOKEN, forwarded_allow_ips="10.0.0.7").api
    assert "secure" not in login_cookie(elsewhere, **https)
    here = serve(rules, token=TOKEN, forwarded_allow_ips="127.0.0.1").api
    assert "secure" in login_cookie(here, **https)


# ---------------------------------------------------------------- 7. keep-alive


def test_a_kept_alive_connection_outlives_the_header_timeout(rules: list[Rule], serve: Any) -> None:
    """The probe: a producer's connection idle over 5 s was closed, and its next POST
    broke. Idle after a response, a connection is kept for keep_alive; a request that
    then starts still has header_timeout to complete its headers."""
    limits = Limits(header_timeout=0.5, keep_alive=60)
    served = serve(rules, limits=limits)
    address = (served.server.host, served.server.port)
    with socket.create_connection(address) as sock:
        sock.sendall(request_head("GET", "/healthz"))
        assert head_of(sock, 10)[0] == 200
        assert not closed_by_server(sock, time.monotonic() + 6 * limits.header_timeout)
        sock.sendall(request_head("GET", "/healthz"))
        assert head_of(sock, 10)[0] == 200
    with socket.create_connection(address) as sock:
        sock.sendall(request_head("GET", "/healthz"))
        assert head_of(sock, 10)[0] == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and no more: a slow client
        assert closed_by_server(sock, time.monotonic() + limits.header_timeout + MARGIN)
    short = serve(rules, limits=Limits(header_timeout=0.5, keep_alive=1))
    with socket.create_connection((short.server.host, short.server.port)) as sock:
        sock.sendall(request_head("GET", "/healthz"))
        assert head_of(sock, 10)[0] == 200
        assert closed_by_server(sock, time.monotonic() + 1 + MARGIN)
