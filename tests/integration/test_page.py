"""The on-call page (slawatch/operate/page.py) over HTTP, without a browser: what it shows,
that database values are escaped, the chart's numbers, the keyset pages, and how
a browser authenticates (the login cookie, the page header, the same-origin rule)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from html import escape as html_escape

import httpx
import psycopg
import pytest

from slawatch.actions.run import runner
from slawatch.engine.ready import prepare
from slawatch.operate import inspect
from slawatch.operate import page as page_module
from slawatch.operate.page import COOKIE, PAGE_HEADER
from tests.integration.helpers import Conn, claim_all, shop
from tests.integration.page_helpers import (
    DUE,
    T0,
    TOKEN,
    XSS,
    H,
    M,
    S,
    Servers,
    Shop,
    chart_counts,
    hung_job,
    rule_row,
    seeded,
    servers,
)
from tests.integration.test_inspect import add_alert

__all__ = ["servers"]

JSON = {"content-type": "application/json"}


def page(client: httpx.Client, url: str = "/") -> str:
    response = client.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    return response.text


def seeded_alerts(conn: Conn, users: tuple[int, ...] = (7, 8)) -> Shop:
    """page_helpers.seeded, claimed in today's shape of the outbox (slawatch.alert,
    slawatch.delivery), for a test that writes a delivery's status itself."""
    rules = shop(conn)
    for i, user in enumerate(users, start=1):
        conn.execute("INSERT INTO orders VALUES (%s, %s, %s, 'paid', %s)", (i, user, 1000 + i, T0))
    found = Shop(
        rules,
        {n: prepare(conn, r, outbox="alerts").with_act(runner("off")) for n, r in rules.items()},
    )
    assert claim_all(conn, found.plans["order_unshipped"], DUE) == len(users)
    return found


def test_the_page_shows_rules_alerts_and_silences(conn: Conn, servers: Servers, dsn: str) -> None:
    # One delivery of three made dead: a delivery of today's shape (a row's send is
    # dead from its `done` on; test_outbox_rows_read.py counts those on the page).
    found = seeded_alerts(conn, users=(7, 8, 9))
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'dead', last_error = 'HTTP 500' "
        "WHERE alert_id = (SELECT id FROM slawatch.alert WHERE key = '3')"
    )
    client = servers.client(found.listed)
    made = client.post(
        "/v1/silences",
        json={
            "rule": "order_unshipped",
            "key": "2",
            "until": "2h",
            "author": "ana",
            "comment": "carrier strike",
        },
    )
    assert made.status_code == 201, made.text
    html = page(client)
    # Security headers: nothing but this server's own scripts and styles.
    response = client.get("/")
    assert response.headers["content-security-policy"] == (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    assert response.headers["x-frame-options"] == "DENY"
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert "http://" not in html and "https://" not in html  # nothing from elsewhere
    # The rules: order_unshipped's three alerts were claimed: 3 open episodes, all
    # three overdue now though none is left to notify first (each awaits its
    # re-notification), 2 deliveries pending, 1 dead.
    assert rule_row(html, "order_unshipped") == {
        "overdue": "3",
        "unnotified": "0",
        "episodes": "3",
        "pending": "2",
        "dead": "1",
    }
    assert rule_row(html, "job_hung") == {
        "overdue": "0",
        "unnotified": "0",
        "episodes": "0",
        "pending": "0",
        "dead": "0",
    }
    # Six hours later all three are due again (the next scan re-notifies them).
    later = page(servers.client(found.listed, now=DUE + 6 * H + S))
    assert rule_row(later, "order_unshipped")["overdue"] == "3"
    # The alerts with the row's columns and their deliveries.
    card = alert_card(html, "order_unshipped:1:e1:n1")
    for column, value in (("id", "1"), ("user_id", "7"), ("total_cents", "1001")):
        assert f"<dt>{column}</dt><dd>{value}</dd>" in card
    assert "<dt>paid_at</dt><dd>2026-03-01T12:00:00" in card
    assert "<b>console</b> pending" in card
    assert 'data-action="ack"' in card
    assert '<span class="err">HTTP 500</span>' in alert_card(html, "order_unshipped:3:e1:n1")
    # The active silence with its expire button; the form offers every rule.
    silences = section(html, "silences")
    assert "carrier strike" in silences and f'data-silence="{made.json()["id"]}"' in silences
    assert silences.count("<option ") == len(found.rules)


def test_rules_that_need_a_look_come_first_and_quiet_ones_fold(
    conn: Conn, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more rules than FULL_RULES, the rules with something to look at are rows in
    full (first, whatever their place in the configuration); quiet rules fill the rows
    left, and the rest are one link each, folded."""
    found = seeded(conn, users=(7,))  # order_unshipped: overdue, an open episode
    monkeypatch.setattr(page_module, "FULL_RULES", 2)
    listed = sorted(found.listed, key=lambda r: r.name != "order_unshipped")[::-1]
    assert listed[-1].name == "order_unshipped"  # configured last
    html = page(servers.client(listed))
    rows = re.findall(r'<tr data-rule="([^"]+)">', section(html, "rules"))
    assert rows == ["order_unshipped", listed[0].name]
    assert rule_row(html, "order_unshipped")["overdue"] == "1"
    folded = re.search(r'<details class="quiet">(.*?)</details>', html, re.DOTALL)
    assert folded, "no folded rules"
    assert f"{len(listed) - 2} more rules" in folded.group(1)
    assert re.findall(r'data-rule="([^"]+)"', folded.group(1)) == [r.name for r in listed[1:-1]]
    assert f"{len(listed)} rules, 1 with something to look at" in html
    # A failed scan is something to look at too.
    quiet = listed[2].name
    conn.execute("INSERT INTO slawatch.scan VALUES (%s, %s, 5, 0, 'boom')", (quiet, DUE))
    html = page(servers.client(listed))
    rows = re.findall(r'<tr data-rule="([^"]+)">', section(html, "rules"))
    assert rows == [quiet, "order_unshipped"]


def test_with_tables_locked_the_page_answers_at_the_counts_deadline(
    conn: Conn, servers: Servers, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watched tables locked (ACCESS EXCLUSIVE, held by another session): the page and
    /v1/rules answer once the rules' counts reach COUNTS_TIMEOUT, not after READ_TIMEOUT
    per locked table. The rules counted by then have their numbers; the first locked one
    and those after it show a dash (not counted; the API's overdue null, no problem)."""
    found = seeded(conn)  # two paid orders overdue
    monkeypatch.setattr(inspect, "READ_TIMEOUT", "8s")
    monkeypatch.setattr(inspect, "COUNTS_TIMEOUT", 1.0)
    # The locks waited out as a slow count is (a lock timeout would end them sooner).
    monkeypatch.setattr(inspect, "COUNT_LOCK_TIMEOUT", "8s")
    client = servers.client(found.listed)  # job_hung, order_unshipped, ... in that order
    assert [r.name for r in found.listed][:2] == ["job_hung", "order_unshipped"]
    assert rule_row(page(client), "order_unshipped")["overdue"] == "2"
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE orders, shipments")
        html = page(client)  # the client waits 10 s at most: 16 s without the deadline
        listed = client.get("/v1/rules").json()["rules"]
    assert rule_row(html, "job_hung")["overdue"] == "0"
    late = [r.name for r in found.listed[1:]]
    not_counted = '<span class="muted">—</span>'
    assert [rule_row(html, name)["overdue"] for name in late] == [not_counted] * len(late)
    assert [(r["name"], r["overdue"], r["problem"]) for r in listed] == [
        ("job_hung", 0, None),
        *((name, None, None) for name in late),
    ]
    assert rule_row(page(client), "order_unshipped")["overdue"] == "2"  # free again


def test_with_tables_locked_the_page_counts_the_free_ones(
    conn: Conn, servers: Servers, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watched tables locked, READ_TIMEOUT and COUNTS_TIMEOUT longer than the client
    waits (10 s): a count waits for its table's lock the scans' lock timeout at most,
    so the page and /v1/rules answer, the locked tables' rules not counted (a dash,
    no problem), every other rule counted, those after a locked one too."""
    found = seeded(conn)  # two paid orders overdue
    monkeypatch.setattr(inspect, "READ_TIMEOUT", "30s")
    monkeypatch.setattr(inspect, "COUNTS_TIMEOUT", 30.0)
    client = servers.client(found.listed)
    names = [r.name for r in found.listed]
    locked = {"order_unshipped", "receipt_unconfirmed"}  # orders, shipments
    assert locked < set(names) and names[-1] not in locked  # a free rule after them
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE orders, shipments")
        html = page(client)
        listed = client.get("/v1/rules").json()["rules"]
    not_counted = '<span class="muted">—</span>'
    for name in names:
        shown = rule_row(html, name)["overdue"]
        assert (shown == not_counted) == (name in locked), (name, shown)
    assert [(r["name"], r["overdue"] is None, r["problem"]) for r in listed] == [
        (name, name in locked, None) for name in names
    ]


def alert_card(html: str, idempotency_id: str) -> str:
    match = re.search(
        rf'<article [^>]*data-id="{re.escape(idempotency_id)}">(.*?)</article>', html, re.DOTALL
    )
    assert match, f"no alert {idempotency_id}"
    return match.group(1)


def section(html: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', html, re.DOTALL)
    assert match, name
    return match.group(1)


def test_database_values_are_escaped(conn: Conn, servers: Servers) -> None:
    found = seeded(conn, users=(7,))
    hung_job(conn, found, worker=XSS, kind='"><b>bold</b>')
    add_alert(conn, "order_unshipped", XSS, DUE, {"<i>hook</i>": "dead"})
    conn.execute("UPDATE slawatch.delivery SET last_error = %s", (XSS,))
    conn.execute("INSERT INTO slawatch.scan VALUES ('job_hung', %s, 5, 0, %s)", (DUE, XSS))
    client = servers.client(found.listed)
    made = client.post(
        "/v1/silences",
        json={
            "rule": "job_hung",
            "key": XSS,
            "matchers": {"worker": XSS},
            "until": "1h",
            "author": XSS,
            "comment": XSS,
        },
    )
    assert made.status_code == 201, made.text
    html = page(client)
    assert "<script>" not in html.replace('<script src="/static/page.js" defer></script>', "")
    assert "<img" not in html and "<b>bold</b>" not in html and "<i>hook</i>" not in html
    escaped = "&lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=&quot;"
    card = alert_card(html, "job_hung:1:e1:n1")
    assert f"<dt>worker</dt><dd>{escaped}window.pwned=2&quot;&gt;</dd>" in card
    assert "<dt>kind</dt><dd>&quot;&gt;&lt;b&gt;bold&lt;/b&gt;</dd>" in card
    assert escaped in alert_card(
        html,
        f"order_unshipped:{XSS}:e1:n1".replace('"', "&quot;")
        .replace("<", "&lt;")
        .replace(">", "&gt;"),
    )
    assert f'data-key="{escaped}' in html  # the silence button's attribute
    silences = section(html, "silences")
    assert silences.count(escaped) == 3  # key, author, comment
    assert html_escape(json.dumps({"worker": XSS})) in silences  # the matchers, as JSON
    assert f"failed: {escaped}" in html  # the last scan's error


def test_the_chart_counts_firing_alerts_per_hour_of_the_last_day(
    conn: Conn, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = seeded(conn, users=())
    now = datetime.fromisoformat("2026-03-01T12:30:00+00:00")
    start = datetime.fromisoformat("2026-02-28T13:00:00+00:00")  # 23 hours before 12:00
    for key, fired in [
        ("a", start - S),  # the day before: not drawn
        ("b", start),  # hour 0
        ("c", start + 30 * M),
        ("d", now - 31 * M),  # 11:59: hour 22
        ("e", now - 30 * M),  # 12:00: hour 23, the current one
        ("f", now),
        ("g", start + 24 * H),  # 13:00: the next hour, not yet
    ]:
        add_alert(conn, "order_unshipped", key, fired, {"console": "sent"})
    add_alert(conn, "job_hung", "x", now, {})
    resolved = add_alert(conn, "order_unshipped", "b", now, {}, n=0)
    conn.execute("UPDATE slawatch.alert SET kind = 'resolved' WHERE id = %s", (resolved,))
    html = page(servers.client(found.listed, now=now))
    expected = [2] + [0] * 21 + [1, 2]
    assert chart_counts(html, "order_unshipped") == expected
    assert chart_counts(html, "job_hung") == [0] * 23 + [1]
    assert chart_counts(html, "refund_unprocessed") == [0] * 24
    assert 'data-start="2026-02-28T13:00:00+00:00"' in html
    assert "<title>13:00 UTC: 2 alerts</title>" in html
    assert '<span class="total">5</span>' in html
    # A storm is read only up to the cap, and drawn as capped.
    monkeypatch.setattr(inspect, "HOURLY_CAP", 3)
    capped = page(servers.client(found.listed, now=now))
    assert sum(chart_counts(capped, "order_unshipped")) == 3
    assert '<span class="total">3+</span>' in capped


def test_older_alerts_a_page_at_a_time(conn: Conn, servers: Servers) -> None:
    found = seeded(conn, users=())
    for i in range(40):  # k0, k5, ... order_unshipped; the rest (32) job_hung
        add_alert(conn, "order_unshipped" if i % 5 == 0 else "job_hung", f"k{i}", DUE, {})
    client = servers.client(found.listed)
    first = page(client)
    assert keys(first) == [f"k{i}" for i in range(39, 9, -1)]  # 30 a page
    second = page(client, more_link(first))
    assert keys(second) == [f"k{i}" for i in range(9, -1, -1)]
    assert 'class="more"' not in second
    # One rule's alerts: the filter is kept on the next page's link.
    hung = page(client, "/?rule=job_hung")
    assert len(keys(hung)) == 30 and "k35" not in keys(hung)
    assert keys(page(client, more_link(hung))) == ["k2", "k1"]


def more_link(html: str) -> str:
    more = re.search(r'<a class="more" href="([^"]*)"', html)
    assert more is not None
    return more.group(1).replace("&amp;", "&")


def keys(html: str) -> list[str]:
    return re.findall(r'<code class="key">([^<]*)</code>', section(html, "alerts"))


def test_an_acked_episode_shows_who_acked_it(conn: Conn, servers: Servers, dsn: str) -> None:
    found = seeded(conn)
    client = servers.client(found.listed)
    answer = client.post("/v1/alerts/order_unshipped:1:e1:n1/ack", json={"by": "ana <x>"})
    assert answer.status_code == 200, answer.text
    html = page(client)
    acked = alert_card(html, "order_unshipped:1:e1:n1")
    assert "acknowledged by ana &lt;x&gt;" in acked and 'data-action="ack"' not in acked
    assert 'data-action="ack"' in alert_card(html, "order_unshipped:2:e1:n1")


def test_bad_input_and_an_unmigrated_database(conn: Conn, servers: Servers) -> None:
    found = seeded(conn, users=())
    client = servers.client(found.listed)
    for url, status, says in [
        ("/?cursor=garbage", 400, "cursor: &#x27;garbage&#x27; is not a cursor"),
        ("/?cursor=--1", 400, "is not a cursor"),
        ("/?cursor=99999999999999999999", 400, "is not a cursor"),
        ("/?rule=%3Cscript%3E", 400, "rule: &#x27;&lt;script&gt;&#x27; is not a rule name"),
        ("/?rule=a%00b", 400, "is not a rule name"),
    ]:
        response = client.get(url)
        assert response.status_code == status, url
        assert response.headers["content-type"].startswith("text/html")
        assert says in response.text, (url, response.text)
    too_long = client.get("/?rule=" + "r" * 10_000)
    assert too_long.status_code == 422 and too_long.json()["error"].startswith("rule: String")
    assert client.get("/?rule=nobody").status_code == 200  # no such rule: no alerts
    assert client.get("/static/nope.js").status_code == 404
    assert client.get("/static/page.js").headers["content-type"].startswith("text/javascript")
    conn.execute("DROP SCHEMA slawatch CASCADE")
    down = client.get("/")
    assert down.status_code == 503
    assert "run &#x27;slawatch migrate&#x27;" in down.text


# ---------------------------------------------------------------- auth


def test_with_a_token_a_browser_logs_in_for_a_cookie(conn: Conn, servers: Servers) -> None:
    found = seeded(conn)
    client = servers.client(found.listed, token=TOKEN)
    asked = client.get("/")
    assert asked.status_code == 401 and asked.headers["content-type"].startswith("text/html")
    assert 'name="token"' in asked.text and "order_unshipped" not in asked.text
    assert client.get("/static/page.css").status_code == 200  # the login form's style
    assert client.get("/v1/rules").status_code == 401

    wrong = client.post("/login", data={"token": TOKEN + "x"})
    assert wrong.status_code == 401 and "not this server&#x27;s token" in wrong.text
    assert COOKIE not in wrong.cookies and COOKIE not in client.cookies
    for form in ({"other": TOKEN}, {"token": ""}, {f"f{i}": "x" for i in range(50)}):
        assert client.post("/login", data=form).status_code == 401, form
    assert client.post("/login", content=b"\xff\x00token=\x00").status_code == 401
    assert (
        client.post(
            "/login",
            content=b"token=" + b"x" * 5000,
            headers={"content-type": "application/x-www-form-urlencoded"},
        ).status_code
        == 413
    )
    good = client.post("/login", data={"token": TOKEN})
    assert good.status_code == 303 and good.headers["location"] == "/"
    cookie = good.headers["set-cookie"]
    session = good.cookies[COOKIE]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", session), session  # a random session id
    attributes = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/", "max-age=43200"} <= attributes
    assert "secure" not in attributes  # plain HTTP here; set behind https
    assert TOKEN not in cookie  # a session id, not the API's credential

    html = page(client)  # the cookie is kept by the client now
    assert "order_unshipped" in html and 'action="/logout"' in html
    assert client.get("/v1/rules").status_code == 200  # the API reads the cookie too
    silence = {"rule": "order_unshipped", "until": "1h", "author": "ana"}
    refused = client.post("/v1/silences", json=silence)
    assert refused.status_code == 403 and PAGE_HEADER in refused.json()["error"]
    assert client.post("/v1/alerts/1/ack", json={"by": "ana"}).status_code == 403
    made = client.post("/v1/silences", json=silence, headers={PAGE_HEADER: "1"})
    assert made.status_code == 201, made.text
    # A browser sends Origin with every write: another site's is refused.
    evil = client.post(
        "/v1/silences", json=silence, headers={PAGE_HEADER: "1", "origin": "http://evil.example"}
    )
    assert evil.status_code == 403 and evil.json()["error"] == "cross-origin writes are refused"
    own = client.post(
        "/v1/silences",
        json=silence,
        headers={PAGE_HEADER: "1", "origin": str(client.base_url).rstrip("/")},
    )
    assert own.status_code == 201, own.text
    # A session of another token (rotated) is worth nothing; the Bearer header still works.
    rotated = servers.client(found.listed, token=TOKEN + "-new")
    assert httpx.get(f"{rotated.base_url}/", cookies={COOKIE: session}).status_code == 401
    bearer = httpx.get(f"{client.base_url}/", headers={"authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200 and 'action="/logout"' not in bearer.text
    bad_bearer = httpx.get(
        f"{client.base_url}/v1/rules",
        cookies={COOKIE: session},
        headers={"authorization": "Bearer nope"},
    )
    assert bad_bearer.status_code == 401  # a wrong header is not rescued by the cookie

    out = client.post("/logout")
    assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
    assert client.get("/").status_code == 401


def test_without_a_token(conn: Conn, servers: Servers) -> None:
    found = seeded(conn)
    silence = {"rule": "order_unshipped", "until": "1h", "author": "ana"}
    # Not bound to loopback: the page shows, read-only, without buttons.
    readonly = servers.client(found.listed, allow_writes=False)
    html = page(readonly)
    assert "Read-only" in html and "data-action" not in html and "silence-form" not in html
    assert readonly.post("/v1/silences", json=silence).status_code == 403
    # On loopback: writes, but only from this server's page or a client that sends no Origin.
    client = servers.client(found.listed)
    assert 'data-action="ack"' in page(client) and "Read-only" not in page(client)
    assert client.post("/v1/silences", json=silence).status_code == 201
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1", "file://"):
        answer = client.post("/v1/silences", json=silence, headers={"origin": origin})
        assert answer.status_code == 403, origin
    assert (
        client.delete("/v1/silences/1", headers={"origin": "http://evil.example"}).status_code
        == 403
    )
    own = str(client.base_url).rstrip("/")
    assert client.post("/v1/silences", json=silence, headers={"origin": own}).status_code == 201
    # A site's name resolved to 127.0.0.1 (DNS rebinding) is same-origin to itself, but
    # its Host is not loopback.
    port = client.base_url.port
    rebound = client.post(
        "/v1/silences",
        json=silence,
        headers={"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"},
    )
    assert rebound.status_code == 403 and "loopback Host" in rebound.json()["error"]
    assert (
        client.post("/v1/silences", json=silence, headers={"host": f"localhost:{port}"}).status_code
        == 201
    )
    # No token: /login has nothing to check.
    assert client.post("/login", data={"token": "x"}).status_code == 303
    assert client.get("/login").status_code == 303
    assert conn.execute("SELECT count(*) FROM slawatch.silence").fetchone() == (3,)
