"""``slawatch demo``: the shipped rules watching a sample shop on the embedded server.

The shop is reset on every run, with rows already overdue, rows that fall due
while the demo runs, rows not due yet and rows already completed, so each of
the example rules fires and the completed ones never do. Event rules get events
of the same kinds, one of them out of order, and one failure.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import sys
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from pydantic import SecretStr

from slawatch.actions.history import ActionAttempt, list_actions
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.config.settings import Settings
from slawatch.db import Connection, connect, translate
from slawatch.delivery.notifiers.webhook import verify
from slawatch.engine.migrate import migrate
from slawatch.errors import DatabaseError
from slawatch.events.ingest import Event, write
from slawatch.operate.inspect import stats
from slawatch.runtime.boot import EMBEDDED_DATABASE, embedded_database, load_config, start_admin

SHOP = resources.files("slawatch").joinpath("sql/shop.sql").read_text()


_INSERT = {
    "orders": "INSERT INTO public.orders VALUES (%s, %s, %s, %s, %s)",
    "refunds": "INSERT INTO public.refunds VALUES (%s, %s, %s, %s, %s)",
    "shipments": "INSERT INTO public.shipments VALUES (%s, %s, %s, 'delivered', %s, %s)",
    "jobs": "INSERT INTO public.jobs (id, kind, worker, status, heartbeat_at)"
    " VALUES (%s, %s, %s, %s, %s)",
    "tasks": "INSERT INTO public.tasks (id, kind, status, order_time, modify_time)"
    " VALUES (%s, %s, %s, %s, %s)",
}


def _row(table: str, i: int, open_: bool, t: datetime) -> tuple[object, ...]:
    """Row ``i`` of a shop table, still open or completed, with deadline value ``t``."""
    if table == "orders":
        return (i, 1000 + i % 97, 1999 + 100 * i, "paid" if open_ else "shipped", t)
    if table == "refunds":
        return (i, 5000 + i, 500 + 10 * i, "requested" if open_ else "processed", t)
    if table == "shipments":
        return (i, 7000 + i, ("DHL", "UPS", "GLS")[i % 3], t, None if open_ else t)
    if table == "tasks":  # a running task started at t (it was due to start a moment before)
        kind = ("settle-payment", "send-invoice", "sync-stock")[i % 3]
        return (i, kind, "running" if open_ else "done", t - timedelta(seconds=5), t)
    kind = ("invoice-export", "stock-sync", "mailer")[i % 3]
    heartbeat = t.astimezone(UTC).replace(tzinfo=None)
    return (i, kind, f"worker-{i % 4}", "running" if open_ else "done", heartbeat)


# Rows per rule: due already, falling due during the demo, due later, completed.
_MIX = (("overdue", 4), ("soon", 4), ("later", 4), ("done", 4))


def seed(conn: Connection, rules: list[Rule], now: datetime, spread: float) -> dict[str, int]:
    """Reset the shop and insert rows relative to each rule's ``after``; return due counts."""
    rng = random.Random(42)
    expected: dict[str, int] = {}
    with conn.transaction():
        conn.execute(SHOP)  # a fixed script
        for rule in rules:
            if rule.schema_name != "public" or rule.table_name not in _INSERT:
                continue
            due_at = rule.cutoff(now)  # a deadline before this is due now
            rows = []
            i = 0
            for kind, count in _MIX:
                for _ in range(count):
                    i += 1
                    if kind == "overdue":
                        t = due_at - timedelta(minutes=rng.randint(1, 600))
                    elif kind == "soon":  # falls due while the demo runs
                        t = due_at + timedelta(seconds=rng.uniform(1, spread))
                    elif kind == "later":
                        t = due_at + timedelta(hours=rng.randint(2, 48))
                    else:
                        t = due_at - timedelta(hours=rng.randint(1, 48))
                    rows.append(_row(rule.table_name, i, kind != "done", t))
            with conn.cursor() as cur:
                cur.executemany(_INSERT[rule.table_name], rows)
            expected[rule.name] = sum(c for kind, c in _MIX if kind in ("overdue", "soon"))
    return expected


def seed_events(
    conn: Connection, rules: list[Rule], now: datetime, spread: float, out: TextIO
) -> dict[str, int]:
    """Send each event rule's demo events through the ingest path (the one POST
    /v1/events takes): late, falling due, delivered, one out of order, one lost."""
    rng = random.Random(7)
    expected: dict[str, int] = {}
    for rule in rules:
        events = rule.events
        if events is None or events.start is None or events.within is None:
            continue
        start, stop = events.start[0], (events.stop or [""])[0]
        due_at = now - events.within  # a start before this is late now
        sent: list[Event] = []
        for i in range(4):  # late already
            at = due_at - timedelta(minutes=rng.randint(1, 600))
            sent.append(Event(start, f"1Z{i:03d}", at, {"carrier": "DHL", "to": "Berlin"}))
        for i in range(4, 8):  # falls due while the demo runs
            at = due_at + timedelta(seconds=rng.uniform(1, spread))
            sent.append(Event(start, f"1Z{i:03d}", at, {"carrier": "UPS", "to": "Lyon"}))
        for i in range(8, 11):  # delivered in time
            at = due_at + timedelta(hours=rng.randint(1, 24))
            sent.append(Event(start, f"1Z{i:03d}", at, {"carrier": "GLS"}))
            sent.append(Event(stop, f"1Z{i:03d}", at + timedelta(hours=20)))
        # Out of order: the delivery is received before its shipment; it never pages.
        sent.append(Event(stop, "1Z011", due_at + timedelta(hours=30)))
        sent.append(Event(start, "1Z011", due_at + timedelta(hours=2), {"carrier": "DPD"}))
        late = 8
        if events.fail:  # the carrier reports a parcel lost: paged at once
            sent.append(Event(start, "1Z012", now - timedelta(hours=5)))
            sent.append(Event(events.fail[0], "1Z012", now - timedelta(hours=1)))
            late += 1
        with conn.transaction():
            got = write(conn, sent, now)
        out.write(
            f"rule {rule.name}: {got.accepted} events sent (4 late, 4 falling due,"
            f" 3 delivered, 1 delivered before its shipment arrived"
            f"{', 1 lost' if events.fail else ''})\n"
        )
        expected[rule.name] = late
    return expected


class DemoReceiver:
    """A webhook receiver on 127.0.0.1 that checks each signature and says what arrived."""

    def __init__(self, out: TextIO) -> None:
        self.secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        self.received = 0
        demo = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                ok = verify(demo.secret, headers, body)
                alerts = json.loads(body)["alerts"] if ok else []
                demo.received += len(alerts)
                ids = ", ".join(a["id"] for a in alerts[:3]) + (" ..." if len(alerts) > 3 else "")
                out.write(
                    f"  webhook <- {len(alerts)} alerts, signature "
                    f"{'verified' if ok else 'INVALID'}: {ids}\n"
                )
                out.flush()
                self.send_response(204 if ok else 401)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def action_line(a: ActionAttempt) -> str:
    """The demo's line for an attempt of a rule's action."""
    line = f"  action {a.rule} key={a.key} {a.status}"
    if a.rows is not None:
        line += f" rows={a.rows}"
    if a.error:
        line += f": {a.error}"
    return line


class ActionPrinter:
    """Prints each action attempt once its claim has committed: reads slawatch.action
    (what ``slawatch actions`` lists) four times a second on a connection of its own."""

    def __init__(self, dsn: str, out: TextIO) -> None:
        self.out = out
        self.printed: set[int] = set()
        self._conn = connect(dsn)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the thread's polls and close()'s last one
        self.thread = threading.Thread(target=self._run, name="demo-actions", daemon=True)
        self.thread.start()

    def print_new(self) -> None:
        """Print the attempts not printed yet, oldest first."""
        with self._lock:
            attempts = list_actions(self._conn, limit=1000).actions
            for a in sorted(attempts, key=lambda a: a.id):
                if a.id not in self.printed:
                    self.printed.add(a.id)
                    self.out.write(action_line(a) + "\n")
            self.out.flush()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.print_new()
            except DatabaseError:  # the summary counts them all anyway
                return
            except Exception:  # a bug: say so, and the summary still counts them all
                logging.getLogger(__name__).exception("demo: printing the actions stopped")
                return

    def close(self) -> None:
        """Stop polling, then print what the last claims did."""
        self._stop.set()
        self.thread.join()
        try:
            self.print_new()
        finally:
            self._conn.close()


def shop_settings(settings: Settings) -> Settings:
    """The demo's own rules and notifiers (package data: the checkout's rules/ and
    notifiers/), wherever it runs; --rules or SLAWATCH_RULES_DIR names others."""
    if "rules_dir" in settings.model_fields_set:
        return settings
    shop = Path(str(resources.files("slawatch").joinpath("shop")))
    return settings.model_copy(
        update={"rules_dir": shop / "rules", "notifiers_dir": shop / "notifiers"}
    )


def run_demo(settings: Settings, seconds: float | None) -> int:
    """Reset and seed the shop, migrate, run the scheduler, print a summary."""
    from slawatch.runtime.scheduler import Runner

    rules, notifiers = load_config(shop_settings(settings))
    out = sys.stdout
    receiver = DemoReceiver(out)
    hook = WebhookConfig(
        name="demo-webhook", type="webhook", url=receiver.url, secret=SecretStr(receiver.secret)
    )
    # The demo's pace: scan every second so rows falling due show up at once; and
    # every alert also goes to the demo's own webhook receiver.
    rules = [
        r.model_copy(update={"every": timedelta(seconds=1), "notify": [*r.notify, hook.name]})
        for r in rules
    ]
    notifiers = [*notifiers, hook]
    dsn = embedded_database(settings)
    spread = min(seconds * 0.6, 60.0) if seconds else 30.0
    with connect(dsn) as conn:
        with translate("seeding the demo shop"):
            expected = seed(conn, rules, datetime.now(UTC), spread)
        migrate(conn, rules)
        with translate("sending the demo's events"):
            expected |= seed_events(conn, rules, datetime.now(UTC), spread, out)
    out.write(
        f"slawatch demo: embedded PostgreSQL, database {EMBEDDED_DATABASE!r} in "
        f"{settings.data_dir}/pgdata\n"
        f"watching {len(rules)} rules: {', '.join(r.name for r in rules)}\n"
        f"alerts go to the console and, signed, to a webhook receiver at {receiver.url}\n"
        f"rows keep falling due for the next {spread:.0f}s; "
        + (f"stopping after {seconds:g}s" if seconds else "Ctrl-C to stop")
        + "\n\n"
    )
    out.flush()
    # The demo prints each alert and each webhook request: the log's line per scan and
    # per delivered batch would say it all again (SLAWATCH_LOG_LEVEL=DEBUG shows them).
    activity = logging.getLogger("slawatch.activity")
    if not activity.isEnabledFor(logging.DEBUG):
        activity.setLevel(logging.WARNING)
    runner = Runner(dsn, rules, notifiers, actions=settings.actions, outbox=settings.outbox)
    actions = ActionPrinter(dsn, out)
    admin = None
    try:
        admin = start_admin(settings, dsn, runner, any_port=True)
        if admin is not None:
            out.write(
                f"on-call page and admin API: {admin.url}/  (JSON under {admin.url}/v1,"
                f" OpenAPI at {admin.url}/openapi.json, metrics at {admin.url}/metrics)\n\n"
            )
            out.flush()
        runner.serve(seconds, http=admin.url if admin is not None else None)
    finally:
        if admin is not None:
            admin.stop()
        runner.close()
        receiver.close()
        actions.close()
    with connect(dsn) as conn:
        # Both shapes of the outbox, counted as `slawatch stats` and the API count them
        # (docs/explanation/outbox-rows.md).
        counted = stats(conn)
        counts: dict[str, int] = {}
        for c in counted.alerts:
            counts[c.rule] = counts.get(c.rule, 0) + c.alerts
        sent = (
            sum(d.deliveries for d in counted.deliveries if d.status == "sent"),
            sum(d.deliveries for d in counted.deliveries),
        )
        acted = {
            rule: (ok, all_)
            for rule, ok, all_ in conn.execute(
                "SELECT rule, count(*) FILTER (WHERE status = 'ok'), count(*)"
                " FROM slawatch.action GROUP BY rule"
            ).fetchall()
        }
    out.write("\nsummary\n")
    out.write(f"  {'rule':<22} {'alerts':>6}  {'seeded due':>10}  {'actions ok':>10}\n")
    for rule in rules:
        ok, all_ = acted.get(rule.name, (0, 0))
        did = "-" if rule.action is None else f"{ok}" + (f" of {all_}" if all_ != ok else "")
        out.write(
            f"  {rule.name:<22} {counts.get(rule.name, 0):>6}  {expected.get(rule.name, 0):>10}"
            f"  {did:>10}\n"
        )
    out.write(f"  deliveries sent: {sent[0]} of {sent[1]}\n")
    out.write(f"  webhook received and verified: {receiver.received} alerts\n")
    return 0
