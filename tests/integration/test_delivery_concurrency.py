"""Several batches of one notifier in flight: real overlap, never a delivery twice.

A real HTTP server in a thread counts the requests it holds at once; the
Dispatcher's workers claim, send and settle against a real PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import load_rules
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import Dispatcher
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.integration.test_deliver import overdue_orders, shown_deliveries, shown_statuses

WAIT = 60.0  # seconds: generous bounds for a noisy 2-core machine
# A notifier's workers take batches of deliveries and sends of rows alike: the tests of
# what its concurrency does run with each shape of the outbox
# (docs/explanation/outbox-rows.md).
SHAPES = pytest.mark.parametrize("outbox", ["alerts", "rows"])


class CountingReceiver:
    """Records every alert id and the most requests it held at once.

    The first requests are held until ``gate`` of them are in flight (at most
    ``hold`` seconds): if that many batches are really sent at once, they all
    meet here. Every request then takes ``delay`` seconds (a random part of it
    when ``jitter``), so workers that could overlap do.
    """

    def __init__(
        self, gate: int = 1, hold: float = 20.0, delay: float = 0.05, jitter: bool = False
    ) -> None:
        self.ids: list[str] = []
        self.in_flight = self.most = 0
        self.gate_met = False
        self.cond = threading.Condition()
        me = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                with me.cond:
                    me.in_flight += 1
                    me.most = max(me.most, me.in_flight)
                    if me.in_flight >= gate:
                        me.gate_met = True
                        me.cond.notify_all()
                    me.cond.wait_for(lambda: me.gate_met, timeout=hold)
                time.sleep(random.uniform(0, delay) if jitter else delay)
                with me.cond:
                    me.ids.extend(a["id"] for a in json.loads(body)["alerts"])
                    me.in_flight -= 1
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CountingReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=8, timeout=10) as d:
        yield d


def hook(url: str, batch: int) -> WebhookNotifier:
    return WebhookNotifier(
        WebhookConfig(name="hook", type="webhook", url=url, batch=batch, timeout="30s")
    )


def deliver_all(
    db: Database, receiver: CountingReceiver, conn: Conn, count: int, batch: int, **kwargs: Any
) -> None:
    """Run a Dispatcher until every one of ``count`` deliveries is sent."""
    notifier = hook(receiver.url, batch)
    dispatcher = Dispatcher(db, {"hook": notifier}, Clock(), poll=0.2, **kwargs)
    dispatcher.start()
    try:
        wait_for(lambda: len(receiver.ids) >= count, f"{count} alerts received")
        wait_for(lambda: shown_statuses(conn).get("sent") == count, f"{count} deliveries sent")
    finally:
        dispatcher.stop()
        notifier.close()


@SHAPES
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_notifier_has_exactly_concurrency_batches_in_flight(
    conn: Conn, db: Database, concurrency: int, outbox: Outbox
) -> None:
    """4: four requests meet at the receiver (and never a fifth); 1: one at a time."""
    overdue_orders(conn, 800, notify="hook", outbox=outbox)
    with CountingReceiver(gate=concurrency) as receiver:
        deliver_all(db, receiver, conn, 800, batch=100, concurrency={"hook": concurrency})
    assert receiver.most == concurrency
    assert sorted(receiver.ids) == sorted(f"order_unshipped:{k}:e1:n1" for k in range(1, 801))


@SHAPES
def test_without_a_concurrency_a_notifier_sends_one_batch_at_a_time(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """The Dispatcher's default is the old behaviour: one worker per notifier."""
    overdue_orders(conn, 300, notify="hook", outbox=outbox)
    with CountingReceiver() as receiver:
        deliver_all(db, receiver, conn, 300, batch=100)
    assert receiver.most == 1


@SHAPES
def test_run_takes_the_concurrency_from_the_notifier_file(
    conn: Conn, dsn: str, outbox: Outbox
) -> None:
    overdue_orders(conn, 600, notify="hook", outbox=outbox)
    (rule,) = [r for r in load_rules(ROOT / "rules") if r.name == "order_unshipped"]
    rule = rule.model_copy(update={"notify": ["hook"]})
    with CountingReceiver(gate=3) as receiver:
        config = WebhookConfig.model_validate(
            {"name": "hook", "type": "webhook", "url": receiver.url, "concurrency": 3}
        )
        runner = Runner(dsn, [rule], [config], poll=0.2, outbox=outbox)
        serving = threading.Thread(target=runner.serve, name="serve", daemon=True)
        serving.start()
        try:
            wait_for(lambda: len(receiver.ids) >= 600, "600 alerts received")
            # The run's own scans re-notify the 600 (claimed long ago by the clock it
            # reads): every delivery settled, not a count, until retention drops the first.
            wait_for(lambda: set(shown_statuses(conn)) == {"sent"}, "every delivery sent")
        finally:
            runner.stop()
            serving.join(WAIT)
            runner.close()
    assert receiver.most == 3


@SHAPES
def test_no_delivery_is_sent_twice_while_its_lease_holds(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """Eight workers, small batches, uneven receiver times: each alert arrives once,
    in its first attempt."""
    overdue_orders(conn, 1200, notify="hook", outbox=outbox)
    with CountingReceiver(delay=0.02, jitter=True) as receiver:
        deliver_all(db, receiver, conn, 1200, batch=25, concurrency={"hook": 8})
    repeated = [i for i, n in Counter(receiver.ids).items() if n > 1]
    assert repeated == []
    assert len(receiver.ids) == 1200
    assert receiver.most > 1  # the workers did overlap
    assert Counter(d.attempts for d in shown_deliveries(conn)) == {1: 1200}


def test_the_workers_of_a_notifier_report_a_failure_once(
    conn: Conn, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken outbox fails all four workers: one error line, one line when it works again."""
    caplog.set_level(logging.DEBUG, logger="slawatch.delivery.dispatcher")
    overdue_orders(conn, 10, notify="hook")
    conn.execute("ALTER TABLE slawatch.delivery RENAME TO delivery_moved")

    def reports(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == level and r.getMessage().startswith("delivery worker for hook")
        ]

    with CountingReceiver() as receiver:
        notifier = hook(receiver.url, 100)
        dispatcher = Dispatcher(
            db, {"hook": notifier}, Clock(), poll=0.2, backoff_cap=0.5, concurrency={"hook": 4}
        )
        dispatcher.start()
        try:
            # Every worker failed, twice over (the later failures are DEBUG lines).
            wait_for(lambda: len(reports(logging.DEBUG)) >= 8, "the workers to fail")
            conn.execute("ALTER TABLE slawatch.delivery_moved RENAME TO delivery")
            wait_for(lambda: len(receiver.ids) == 10, "the alerts once the outbox is back")
            wait_for(lambda: reports(logging.INFO) != [], "the end-of-failure line")
        finally:
            dispatcher.stop()
            notifier.close()
    (failing,) = reports(logging.ERROR)
    assert failing.startswith("delivery worker for hook failing: ")
    assert "delivery" in failing and "does not exist" in failing
    (back,) = reports(logging.INFO)
    assert back.startswith("delivery worker for hook working again after ")
