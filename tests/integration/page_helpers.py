"""Helpers for the on-call page's tests: a seeded shop and an admin server around it."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.claim import ClaimPlan
from slawatch.operate.admin import AdminServer, create_app, serve_in_thread
from tests.integration.helpers import Conn, FixedClock, claim_all, plans, shop

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DUE = T0 + 48 * H + S  # order_unshipped (every 6 h, 5 at most): paid at T0, overdue here
TOKEN = "page-token-0123456789abcdef"
XSS = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


@dataclass
class Shop:
    rules: dict[str, Rule]
    plans: dict[str, ClaimPlan]

    @property
    def listed(self) -> list[Rule]:
        return list(self.rules.values())


def seeded(conn: Conn, track: str = "inline", users: tuple[int, ...] = (7, 8)) -> Shop:
    """The shop with one paid order per user (ids 1, 2, ...), overdue at DUE, claimed
    at DUE: one alert (#1) each."""
    rules = shop(conn, track)
    for i, user in enumerate(users, start=1):
        conn.execute("INSERT INTO orders VALUES (%s, %s, %s, 'paid', %s)", (i, user, 1000 + i, T0))
    found = Shop(rules, plans(conn, rules))
    assert claim_all(conn, found.plans["order_unshipped"], DUE) == len(users)
    return found


def hung_job(conn: Conn, found: Shop, worker: str, kind: str = "stock-sync") -> None:
    """A running job (id 1) whose heartbeat stopped an hour before DUE, claimed at DUE."""
    conn.execute(
        "INSERT INTO jobs VALUES (1, %s, %s, 'running', %s)",
        (kind, worker, (DUE - H).replace(tzinfo=None)),
    )
    assert claim_all(conn, found.plans["job_hung"], DUE) == 1


class Servers:
    """Admin servers (create_app's keywords) on free ports, stopped at the end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.running: list[tuple[AdminServer, Database]] = []
        self.clients: list[httpx.Client] = []

    def start(self, rules: list[Rule], now: datetime = DUE, **kw: Any) -> AdminServer:
        db = Database(self.dsn, size=2, timeout=5)
        options: dict[str, Any] = {"token": None, "allow_writes": True} | kw
        app = create_app(db, rules, ["console", "hook"], clock=FixedClock(now), **options)
        server = serve_in_thread(app, "127.0.0.1", 0)
        self.running.append((server, db))
        return server

    def client(self, rules: list[Rule], **kw: Any) -> httpx.Client:
        server = self.start(rules, **kw)
        client = httpx.Client(base_url=server.url, timeout=10, follow_redirects=False)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for server, db in self.running:
            server.stop()
            db.close()


@pytest.fixture
def servers(dsn: str) -> Iterator[Servers]:
    running = Servers(dsn)
    yield running
    running.close()


def rule_row(html: str, rule: str) -> dict[str, str]:
    """The numbers of ``rule``'s row of the rules table: {overdue, unnotified, episodes,
    pending, dead}."""
    match = re.search(rf'<tr data-rule="{rule}">(.*?)</tr>', html, re.DOTALL)
    assert match, f"no row of {rule}"
    cells = re.findall(r'class="num (\w+)[^"]*">(.*?)</td>', match.group(1), re.DOTALL)
    return dict(cells)


def chart_counts(html: str, rule: str) -> list[int]:
    """The hourly counts the chart of ``rule`` draws."""
    match = re.search(
        rf'<svg class="chart"[^>]* data-rule="{rule}"[^>]* data-counts="([^"]*)"', html
    )
    assert match, f"no chart of {rule}"
    return [int(c) for c in match.group(1).split(",")]


# ---------------------------------------------------------------- the browser

CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright never downloads a browser here


def require_chromium() -> None:
    """Skip without Debian's chromium or Playwright, or fail under
    SLAWATCH_REQUIRE_SERVICES=1 (CI installs both)."""
    problem = None
    if not os.access(CHROMIUM, os.X_OK):
        problem = f"{CHROMIUM} is missing (apt-get install chromium)"
    elif importlib.util.find_spec("playwright") is None:
        problem = "the playwright package is missing (pip install -e '.[test]')"
    if problem is None:
        return
    if os.environ.get("SLAWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(problem + " and SLAWATCH_REQUIRE_SERVICES=1")
    pytest.skip(problem)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium for a module's tests."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, timeout=20_000)
        yield launched
        launched.close()


Open = Callable[..., "Page"]


@pytest.fixture
def open_tab(browser: Browser) -> Iterator[Open]:
    """A tab in a fresh context (new_context's keywords: viewport, is_mobile, ...) that
    fails the test on a JavaScript error or a dialog (an alert() a value could run)."""
    contexts: list[BrowserContext] = []
    problems: list[str] = []

    def make(**kw: Any) -> Page:
        context = browser.new_context(**({"viewport": {"width": 1280, "height": 900}} | kw))
        contexts.append(context)
        tab = context.new_page()
        tab.set_default_timeout(10_000)
        tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        tab.on(
            "dialog",
            lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()),
        )
        return tab

    yield make
    for context in contexts:
        context.close()
    assert problems == []
