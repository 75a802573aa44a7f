"""The on-call page in headless Chromium (Debian's chromium, driven by Playwright):
it loads, shows a seeded alert, an ack click stops the episode's re-notifications,
a silence made on the page keeps the next alert from a real webhook receiver, a
script in a row value stays text, and a phone shows it without sideways scrolling."""

from __future__ import annotations

import json

import pytest

from slawatch.config.notifiers import WebhookConfig
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.ready import prepare
from slawatch.operate.inspect import list_alerts
from tests.integration.helpers import Conn, FixedClock, claim_all, episodes, shop
from tests.integration.page_helpers import (
    DUE,
    T0,
    TOKEN,
    XSS,
    H,
    M,
    Open,
    S,
    Servers,
    browser,
    hung_job,
    open_tab,
    seeded,
    servers,
)
from tests.receivers import WebhookReceiver

__all__ = ["browser", "open_tab", "servers"]

pytestmark = pytest.mark.browser


def no_overflow(tab: object) -> None:
    """The document is no wider than the window: nothing scrolls sideways."""
    widths = tab.evaluate(  # type: ignore[attr-defined]
        "[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]"
    )
    assert max(widths[:2]) <= widths[2], widths


def test_the_page_loads_and_shows_a_seeded_alert(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    from playwright.sync_api import expect

    found = seeded(conn, users=(7, 8))
    server = servers.start(found.listed)
    tab = open_tab()
    tab.goto(server.url)
    expect(tab).to_have_title("slawatch — on call")
    card = tab.locator('article[data-id="order_unshipped:1:e1:n1"]')
    expect(card).to_be_visible()
    assert card.locator("dl.row dt").all_inner_texts() == [
        "id",
        "user_id",
        "total_cents",
        "paid_at",
    ]
    values = card.locator("dl.row dd").all_inner_texts()
    assert values[:3] == ["1", "7", "1001"] and values[3].startswith("2026-03-01T12:00:00")
    expect(card.locator("ul.deliveries")).to_contain_text("console pending")
    row = tab.locator('tr[data-rule="order_unshipped"]')
    expect(row.locator("td.episodes")).to_have_text("2")
    expect(row.locator("td.pending")).to_have_text("2")
    assert row.locator("svg.chart rect:not(.axis)").count() == 24
    assert tab.locator("article.alert").count() == 2
    no_overflow(tab)


def test_an_ack_click_stops_the_episodes_renotification(
    conn: Conn, servers: Servers, open_tab: Open, track: str
) -> None:
    """Logged in with the token (the cookie, and the page's header on the write)."""
    from playwright.sync_api import expect

    found = seeded(conn, track)
    server = servers.start(found.listed, token=TOKEN, now=DUE + M)
    tab = open_tab()
    tab.goto(server.url)
    tab.fill('input[name="token"]', TOKEN)
    tab.click('button:has-text("Log in")')
    card = tab.locator('article[data-id="order_unshipped:1:e1:n1"]')
    expect(card).to_be_visible()
    tab.fill("#who", "ana")
    card.locator('button[data-action="ack"]').click()
    expect(card.locator(".acked")).to_contain_text("acknowledged by ana")
    assert conn.execute("SELECT key, episode, acked_by FROM slawatch.ack").fetchall() == [
        ("1", 1, "ana")
    ]
    # Walk the claim past every re-notification: order 2 gets #2..#5, order 1 nothing more.
    t = DUE
    for _ in range(6):
        t += 6 * H + S
        claim_all(conn, found.plans["order_unshipped"], t)
    assert episodes(conn, "order_unshipped") == [("1", 1, 1)] + [("2", 1, n) for n in range(1, 6)]


def test_a_name_typed_before_the_pages_script_ran_is_kept(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    """The page's script is deferred: a name typed while it loads (a quick hand, or a
    test) is the one an ack carries, not replaced by the stored one (none here)."""
    from playwright.sync_api import Route, expect

    found = seeded(conn, "inline")
    server = servers.start(found.listed, now=DUE + M)
    tab = open_tab()
    held: list[Route] = []
    tab.route("**/static/page.js", lambda route: held.append(route))  # held until let through
    tab.goto(server.url, wait_until="commit")  # DOMContentLoaded waits for the script
    card = tab.locator('article[data-id="order_unshipped:1:e1:n1"]')
    expect(card).to_be_visible()
    tab.fill("#who", "ana")
    tab.wait_for_function("() => true")  # a round trip: the route's request is in
    assert len(held) == 1
    held[0].continue_()
    tab.wait_for_load_state("load")
    card.locator('button[data-action="ack"]').click()
    expect(card.locator(".acked")).to_contain_text("acknowledged by ana")


def test_a_silence_made_on_the_page_keeps_the_next_alert_from_the_receiver(
    conn: Conn, servers: Servers, open_tab: Open, receiver: WebhookReceiver, db: Database
) -> None:
    from playwright.sync_api import expect

    rules = shop(conn)
    rules["order_unshipped"] = rules["order_unshipped"].model_copy(update={"notify": ["hook"]})
    plan = prepare(conn, rules["order_unshipped"])
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 100, 'paid', %(t)s), (2, 8, 200, 'paid', %(t)s)",
        {"t": T0},
    )
    hook = {"hook": WebhookNotifier(WebhookConfig(name="hook", type="webhook", url=receiver.url))}
    server = servers.start(list(rules.values()), now=DUE - M)  # loopback, no token
    tab = open_tab()
    tab.goto(server.url)
    tab.fill("#who", "bo")
    tab.locator('tr[data-rule="order_unshipped"] button[data-action="silence"]').click()
    form = tab.locator("#silence-form")
    expect(form).to_be_visible()
    assert form.locator('select[name="rule"]').input_value() == "order_unshipped"
    form.locator('input[name="matchers"]').fill(json.dumps({"user_id": 7}))
    form.locator('input[name="comment"]').fill("customer 7 moved")
    form.locator('button[type="submit"]').click()
    silence = tab.locator("ul.silences li[data-silence]")
    expect(silence).to_contain_text("customer 7 moved")
    expect(silence).to_contain_text('{"user_id": 7}')

    assert claim_all(conn, plan, DUE) == 2
    deliver_due(db, hook, FixedClock(DUE))
    assert receiver.alert_ids == ["order_unshipped:2:e1:n1"]  # order 1 (user 7): silenced
    # As the API lists them, whichever shape of the outbox holds them.
    with db.connection("listing") as c:
        listed = list_alerts(c, rule="order_unshipped").alerts
    assert sorted((a.key, [d.status for d in a.deliveries]) for a in listed) == [
        ("1", ["silenced"]),
        ("2", ["sent"]),
    ]

    # Expired from the page: the next re-notification of order 1 is sent.
    silence.locator('button[data-action="expire"]').click()
    expect(tab.locator("ul.silences")).to_contain_text("none active")
    assert claim_all(conn, plan, DUE + 6 * H + S) == 2
    deliver_due(db, hook, FixedClock(DUE + 6 * H + S))
    assert receiver.alert_ids[1:] == ["order_unshipped:1:e1:n2", "order_unshipped:2:e1:n2"]


def test_a_script_in_a_row_value_is_shown_as_text(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    from playwright.sync_api import Error, expect

    found = seeded(conn, users=(7,))
    hung_job(conn, found, worker=XSS)
    tab = open_tab()
    tab.goto(servers.start(found.listed).url)
    card = tab.locator('article[data-id="job_hung:1:e1:n1"]')
    expect(card).to_be_visible()
    worker = card.locator("dl.row dd").nth(2)
    expect(worker).to_have_text(XSS)  # the characters, as written
    assert tab.evaluate("window.pwned") is None  # neither the script nor the onerror ran
    assert tab.locator("script").count() == 1  # the page's own
    assert tab.locator("article img").count() == 0
    # Were a value ever written unescaped, the Content-Security-Policy would still keep an
    # inline script from running.
    with pytest.raises(Error, match="Content Security Policy"):
        tab.add_script_tag(content="window.pwned = 3")
    assert tab.evaluate("window.pwned") is None


def test_a_phone_shows_the_page_without_sideways_scrolling(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    from playwright.sync_api import expect

    found = seeded(conn, users=(7, 8))
    hung_job(conn, found, worker="w" * 300, kind="k-" * 80)  # long words wrap
    tab = open_tab(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    tab.goto(servers.start(found.listed).url)
    expect(tab.locator('article[data-id="job_hung:1:e1:n1"]')).to_be_visible()
    assert tab.evaluate("window.innerWidth") == 390
    no_overflow(tab)
    # The silence form, opened from an alert, fits too.
    tab.locator('article[data-id="job_hung:1:e1:n1"] button[data-action="silence"]').click()
    expect(tab.locator("#silence-form")).to_be_visible()
    assert tab.locator('#silence-form input[name="key"]').input_value() == "1"
    no_overflow(tab)


def test_the_page_works_at_localhost_and_a_logout_ends_the_session(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    """Issue 13: the Host check without a token leaves localhost and 127.0.0.1 working;
    with a token, the session a browser logged in with is refused after its logout."""
    import httpx
    from playwright.sync_api import expect

    from slawatch.operate.page import COOKIE

    found = seeded(conn, users=(7,))
    open_server = servers.start(found.listed)
    for name in ("localhost", "127.0.0.1"):
        tab = open_tab()
        tab.goto(f"http://{name}:{open_server.port}/")
        expect(tab.locator('article[data-id="order_unshipped:1:e1:n1"]')).to_be_visible()

    server = servers.start(found.listed, token=TOKEN)
    tab = open_tab()
    tab.goto(server.url)
    tab.fill('input[name="token"]', TOKEN)
    tab.click('button:has-text("Log in")')
    expect(tab.locator('article[data-id="order_unshipped:1:e1:n1"]')).to_be_visible()
    (session,) = [c["value"] for c in tab.context.cookies() if c["name"] == COOKIE]
    tab.click('button:has-text("Log out")')
    expect(tab.locator('input[name="token"]')).to_be_visible()
    assert tab.context.cookies() == []
    # The id the browser held is worth nothing now, wherever it is replayed from.
    replayed = httpx.get(f"{server.url}/v1/rules", cookies={COOKIE: session})
    assert replayed.status_code == 401


def test_the_sla_chart_shows_breaches_per_day_and_the_compliance_line(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    """Drawn by page.js from /v1/report: a bar per day (the 2 episodes due on the last
    day), and the compliance where deadlines are counted (an index on paid_at): 100 %
    the day before (one order due, shipped in time), 0 % on the last day."""
    from playwright.sync_api import expect

    found = seeded(conn, users=(7, 8))
    conn.execute("CREATE INDEX orders_paid_at ON orders (paid_at)")
    conn.execute("INSERT INTO orders VALUES (3, 9, 1003, 'shipped', %s)", (T0 - 24 * H,))
    tab = open_tab()
    tab.goto(servers.start(found.listed).url)
    expect(tab.locator('.sla-charts[data-loaded="1"]')).to_be_attached()
    figure = tab.locator('figure.sla[data-rule="order_unshipped"]')
    expect(figure).to_be_visible()
    bars = figure.locator("rect.breached")
    assert bars.count() == 8  # 7 days back, and today
    assert [bars.nth(i).get_attribute("data-breached") for i in range(8)] == ["0"] * 7 + ["2"]
    assert int(bars.nth(7).get_attribute("height") or 0) > 0
    assert int(bars.nth(6).get_attribute("height") or 0) == 0
    points = (figure.locator("polyline.compliance").get_attribute("points") or "").split()
    assert [float(p.split(",")[1]) for p in points] == [1.0, 59.0]  # 100 %, then 0 %
    expect(figure.locator("figcaption")).to_have_text("order_unshipped: 2 breached")
    # Rules without episodes get their (empty) chart too.
    expect(tab.locator('figure.sla[data-rule="job_hung"]')).to_be_visible()


def test_the_cli_draws_the_same_sla_chart_as_the_page(
    conn: Conn, servers: Servers, open_tab: Open
) -> None:
    """`report --format html|svg` (operate/chart.py) against page.js, from the same
    /v1/report: the same bars (place, size, period, count, title) and compliance line."""
    import xml.etree.ElementTree as ET

    from playwright.sync_api import expect

    from slawatch.operate.chart import by_rule, rule_chart
    from slawatch.operate.report import Report

    found = seeded(conn, users=(7, 8))
    conn.execute("CREATE INDEX orders_paid_at ON orders (paid_at)")
    conn.execute("INSERT INTO orders VALUES (3, 9, 1003, 'shipped', %s)", (T0 - 24 * H,))
    tab = open_tab()
    url = servers.start(found.listed).url
    tab.goto(url)
    expect(tab.locator('.sla-charts[data-loaded="1"]')).to_be_attached()
    got = tab.request.get(f"{url}/v1/report?by=day&since=7d")
    assert got.ok, got.text()
    report = Report.model_validate_json(got.body())
    top = max([1, *(r.breached for r in report.rows)])
    keys = ["x", "y", "width", "height", "data-period", "data-breached"]
    ns = "{http://www.w3.org/2000/svg}"
    for rule, rows in by_rule(report).items():
        page = tab.locator(f'figure.sla[data-rule="{rule}"] svg').evaluate(
            """(svg) => ({
                bars: [...svg.querySelectorAll("rect.breached")].map((r) => [
                    ...["x", "y", "width", "height", "data-period", "data-breached"].map(
                        (k) => r.getAttribute(k)), r.querySelector("title").textContent]),
                line: svg.querySelector("polyline.compliance")?.getAttribute("points") ?? null,
                viewBox: svg.getAttribute("viewBox"),
            })"""
        )
        ours = ET.fromstring(rule_chart(rule, rows, top))
        line = ours.find(f"{ns}polyline")
        assert page == {
            "bars": [
                [*(r.get(k) for k in keys), r.findtext(f"{ns}title")]
                for r in ours.findall(f"{ns}rect")
            ],
            "line": None if line is None else line.get("points"),
            "viewBox": ours.get("viewBox"),
        }, rule
    assert any(r.compliance is not None for r in report.rows)  # a line was compared
