"""Nothing lost: a delivery process killed mid-pass; the NOTIFY wake-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import yaml

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.delivery.dispatcher import Dispatcher
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.claim import claim_batch, plan_claim
from slawatch.engine.migrate import migrate
from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.receivers import Reply, WebhookReceiver, receiver
from tests.waiting import wait_until

__all__ = ["receiver"]

RULE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
open_when: "status = 'paid'"
notify: [hook]
"""


def orders(conn: Conn, count: int, first: int = 1) -> None:
    """``count`` orders overdue since a day, ids from ``first`` (the table made at 1)."""
    if first == 1:
        conn.execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)"
        )
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', now() - interval '1 day'"
        " FROM generate_series(%s::int, %s::int) g",
        (first, first + count - 1),
    )


def test_sigkill_mid_delivery_loses_nothing(
    conn: Conn, dsn: str, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    orders(conn, 300)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(RULE)
    (tmp_path / "notifiers").mkdir()
    # Lease = 2 * timeout + 2s = 4s: how long the killed process's batch stays claimed.
    # One batch in flight, so the one the receiver holds is the only one killed mid-send.
    (tmp_path / "notifiers" / "hook.yaml").write_text(
        f"type: webhook\nurl: {receiver.url}\nbatch: 100\ntimeout: 1s\nconcurrency: 1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")} | {
        "SLAWATCH_HTTP": "",  # no admin port to take from a demo or another test run
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(tmp_path / "rules"),
        "SLAWATCH_NOTIFIERS_DIR": str(tmp_path / "notifiers"),
    }
    slawatch = [sys.executable, "-m", "slawatch"]
    assert (
        subprocess.run([*slawatch, "migrate"], env=env, cwd=ROOT, capture_output=True).returncode
        == 0
    )
    # The receiver holds the first request long enough for us to kill the sender mid-request.
    receiver.replies = [Reply(200, delay=3.0)]
    with subprocess.Popen([*slawatch, "run"], env=env, cwd=ROOT, stderr=subprocess.DEVNULL) as proc:
        assert receiver.received.wait(30), "no delivery started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    in_flight = set(receiver.alert_ids)
    assert len(in_flight) == 100

    # Restart: everything is delivered once the killed claim's lease has expired.
    def pending() -> int:
        row = conn.execute("SELECT count(*) FROM slawatch.delivery WHERE status <> 'sent'")
        return int(row.fetchone()[0])  # type: ignore[index]

    deadline = time.monotonic() + 60
    while pending() and time.monotonic() < deadline:
        subprocess.run([*slawatch, "run", "--once"], env=env, cwd=ROOT, capture_output=True)
        time.sleep(0.5)
    ids = receiver.alert_ids
    assert set(ids) == {f"late:{k}:e1:n1" for k in range(1, 301)}
    repeated = {i for i, count in Counter(ids).items() if count > 1}
    assert repeated <= in_flight  # duplicates only from the batch in flight, same ids
    sent = conn.execute("SELECT status, count(*) FROM slawatch.delivery GROUP BY 1").fetchall()
    assert sent == [("sent", 300)]


def test_a_claim_wakes_the_delivery_workers(
    conn: Conn, dsn: str, receiver: WebhookReceiver
) -> None:
    """NOTIFY, not the poll, brings a new alert out: the poll here is a minute."""
    orders(conn, 5)
    rule = Rule.model_validate(yaml.safe_load(RULE) | {"name": "late"})
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone")
    assert claim_batch(conn, plan, datetime.now(UTC)) == 5  # before anyone listens
    hook = WebhookNotifier(WebhookConfig(name="hook", type="webhook", url=receiver.url))
    with Database(dsn, size=3) as db:
        dispatcher = Dispatcher(db, {"hook": hook}, Clock(), poll=60)
        dispatcher.start()
        try:
            # The worker's first pass sent those 5; it is over once they are recorded as
            # sent (by the statement that also claimed the next, empty, batch): the worker
            # now waits a minute for its poll. And the listener has run its LISTEN.
            wait_until(lambda: sent(conn) == 5 and listening(conn), "the first pass, LISTEN")
            orders(conn, 3, first=6)
            assert claim_batch(conn, plan, datetime.now(UTC)) == 3
            wait_until(
                lambda: len(receiver.alert_ids) == 8,
                "the claim's NOTIFY to wake the worker (its poll is a minute away)",
                timeout=20,
            )
        finally:
            dispatcher.stop()
    assert sorted(receiver.alert_ids) == sorted(f"late:{k}:e1:n1" for k in range(1, 9))
    assert len(receiver.requests) == 2  # the first pass, then the woken one
    hook.close()


def sent(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM slawatch.delivery WHERE status = 'sent'")
    return int(row.fetchone()[0])  # type: ignore[index]


def listening(conn: Conn) -> bool:
    """Whether a session of this database has run LISTEN for deliveries (and waits)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query = 'LISTEN slawatch_delivery' AND state = 'idle'"
    ).fetchone()
    return bool(row and row[0])
