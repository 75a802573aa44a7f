"""Make docs/page.png: the on-call page over the demo's shop, after a day of scans.

    .venv/bin/python scripts/page_screenshot.py [DSN] [OUT]

DSN: a server where a scratch database may be made (default: $SLAWATCH_TEST_DSN or the
machine's postgresql://postgres@127.0.0.1:5432/postgres); the database is dropped after.
Needs Debian's chromium (/usr/bin/chromium) and the test extra's playwright.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from playwright.sync_api import sync_playwright
from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.rules import load_rules
from slawatch.db import Database, with_database
from slawatch.demo import seed
from slawatch.engine.claim import claim_batch
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare_all
from slawatch.operate.admin import create_app, serve_in_thread
from slawatch.operate.lifecycle import ack, add_silence

ROOT = Path(__file__).resolve().parent.parent
NAME = "slawatch_page_screenshot"


class FixedClock(Clock):
    def __init__(self, now: datetime) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now


def main() -> int:
    server = sys.argv[1] if len(sys.argv) > 1 else None
    server = server or os.environ.get("SLAWATCH_TEST_DSN")
    server = server or "postgresql://postgres@127.0.0.1:5432/postgres"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "page.png"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(NAME))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(NAME)))
    try:
        shoot(with_database(server, NAME), out)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(NAME)))
    print(f"{out}: {out.stat().st_size:,} bytes")
    return 0


def shoot(dsn: str, out: Path) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    rules = load_rules(ROOT / "rules")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The demo's rows, seeded as of ten hours ago, then a scan every 20 minutes since.
        seed(conn, rules, now - timedelta(hours=10), spread=30)
        migrate(conn, rules)
        plans = prepare_all(conn, rules)
        t = now - timedelta(hours=10)
        while t <= now:
            for plan in plans.values():
                while claim_batch(conn, plan, t) >= plan.rule.batch:
                    pass
            t += timedelta(minutes=20)
        # Most deliveries went out; one receiver failed for good; the latest still wait.
        conn.execute(
            "UPDATE slawatch.delivery d SET status = 'sent', sent_at = a.fired_at, attempts = 1"
            " FROM slawatch.alert a WHERE a.id = d.alert_id AND a.fired_at < %s",
            (now - timedelta(minutes=30),),
        )
        conn.execute(
            "UPDATE slawatch.delivery SET status = 'dead', attempts = 8, sent_at = NULL,"
            " last_error = 'HTTP 503 from the receiver: upstream unavailable'"
            " WHERE id = (SELECT max(d.id) FROM slawatch.delivery d JOIN slawatch.alert a"
            " ON a.id = d.alert_id WHERE a.rule = 'refund_unprocessed')"
        )
        for plan in plans.values():  # what the runner records after each scan
            conn.execute(
                "INSERT INTO slawatch.scan VALUES (%s, %s, 12, 0, NULL)",
                (plan.rule.name, now - timedelta(seconds=20)),
            )
        latest = conn.execute(
            "SELECT id FROM slawatch.alert WHERE rule = 'order_unshipped' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    with Database(dsn, size=2, timeout=10) as db:
        if latest is not None:
            ack(db, str(latest[0]), by="ana", comment="warehouse called", now=now)
        add_silence(
            db,
            rule="job_hung",
            key=None,
            matchers={"kind": "stock-sync"},
            until=now + timedelta(hours=2),
            comment="supplier API maintenance",
            author="ana",
            now=now,
            rules={r.name: r for r in rules},
        )
        app = create_app(
            db, rules, ["console"], token=None, allow_writes=True, clock=FixedClock(now)
        )
        admin = serve_in_thread(app, "127.0.0.1", 0)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
                tab = browser.new_page(viewport={"width": 1200, "height": 1000})
                tab.goto(admin.url)
                tab.fill("#who", "ana")
                out.parent.mkdir(parents=True, exist_ok=True)
                tab.screenshot(path=str(out))
                browser.close()
        finally:
            admin.stop()


if __name__ == "__main__":
    sys.exit(main())
