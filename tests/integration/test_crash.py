"""Nothing lost: a delivery process killed mid-pass (either shape of the outbox); the
NOTIFY wake-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import Dispatcher
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.claim import claim_batch, plan_claim
from slawatch.engine.migrate import migrate
from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.receivers import Reply, WebhookReceiver
from tests.waiting import wait_until

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


@pytest.mark.parametrize(
    ("outbox", "batch", "held"),
    [
        ("alerts", 100, 0),
        ("rows", 100, 0),
        # A row of 100 sent in chunks of 40: killed during the second, the first was
        # recorded (its progress) and is not sent again.
        ("rows", 40, 1),
    ],
)
def test_sigkill_mid_delivery_loses_nothing(
    conn: Conn,
    dsn: str,
    tmp_path: Path,
    receiver: WebhookReceiver,
    outbox: str,
    batch: int,
    held: int,
) -> None:
    """With either shape of the outbox (SLAWATCH_OUTBOX, docs/explanation/outbox-rows.md):
    the process killed while the receiver holds request ``held``; a restart sends every
    alert, again only those of the request in flight, with the same ids."""
    orders(conn, 300)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(RULE)
    (tmp_path / "notifiers").mkdir()
    # Lease = 2 * timeout + 2s = 4s: how long the killed process's batch stays claimed.
    # One batch in flight, so the one the receiver holds is the only one killed mid-send.
    (tmp_path / "notifiers" / "hook.yaml").write_text(
        f"type: webhook\nurl: {receiver.url}\nbatch: {batch}\ntimeout: 1s\nconcurrency: 1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")} | {
        "SLAWATCH_HTTP": "",  # no admin port to take from a demo or another test run
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(tmp_path / "rules"),
        "SLAWATCH_NOTIFIERS_DIR": str(tmp_path / "notifiers"),
        "SLAWATCH_OUTBOX": outbox,
    }
    slawatch = [sys.executable, "-m", "slawatch"]
    assert (
        subprocess.run([*slawatch, "migrate"], env=env, cwd=ROOT, capture_output=True).returncode
        == 0
    )
    # The receiver holds request `held` long enough for us to kill the sender mid-request.
    receiver.replies = [Reply(200)] * held + [Reply(200, delay=3.0)]
    with subprocess.Popen([*slawatch, "run"], env=env, cwd=ROOT, stderr=subprocess.DEVNULL) as proc:
        wait_until(lambda: len(receiver.requests) > held, "the held request", timeout=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    before = [a["id"] for r in receiver.requests[:held] for a in r.alerts]
    in_flight = {a["id"] for a in receiver.requests[held].alerts}
    assert len(in_flight) == batch
    assert shapes(conn) == {outbox}

    # Restart: everything is delivered once the killed claim's lease has expired.
    deadline = time.monotonic() + 60
    while unsent(conn) and time.monotonic() < deadline:
        subprocess.run([*slawatch, "run", "--once"], env=env, cwd=ROOT, capture_output=True)
        time.sleep(0.5)
    ids = receiver.alert_ids
    assert set(ids) == {f"late:{k}:e1:n1" for k in range(1, 301)}
    repeated = {i for i, count in Counter(ids).items() if count > 1}
    assert repeated <= in_flight  # duplicates only from the batch in flight, same ids
    assert all(Counter(ids)[i] == 1 for i in before)  # what was recorded is not sent again
    assert unsent(conn) == 0 and sent_alerts(conn) == 300


def shapes(conn: Conn) -> set[str]:
    """The shapes of the outbox that hold alerts."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM slawatch.alert), EXISTS (SELECT 1 FROM slawatch.outbox_row)"
    ).fetchone()
    assert row is not None
    return {name for name, there in zip(("alerts", "rows"), row, strict=True) if there}


def unsent(conn: Conn) -> int:
    """Deliveries and row sends not sent."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM slawatch.delivery WHERE status <> 'sent')"
        " + (SELECT count(*) FROM slawatch.outbox_send WHERE status <> 'sent')"
    ).fetchone()
    return int(row[0])  # type: ignore[index]


def sent_alerts(conn: Conn) -> int:
    """Alerts sent, in either shape (a sent row send: each of its elements)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM slawatch.delivery WHERE status = 'sent')"
        " + (SELECT coalesce(sum(cardinality(r.keys)), 0) FROM slawatch.outbox_send s"
        " JOIN slawatch.outbox_row r ON r.id = s.row_id WHERE s.status = 'sent')"
    ).fetchone()
    return int(row[0])  # type: ignore[index]


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_a_claim_wakes_the_delivery_workers(
    conn: Conn, dsn: str, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    """NOTIFY, not the poll, brings a new alert out: the poll here is a minute. A claim
    into the outbox in rows wakes them as one into today's does."""
    orders(conn, 5)
    rule = Rule.model_validate(yaml.safe_load(RULE) | {"name": "late"})
    migrate(conn, [rule])
    plan = plan_claim(rule, "timestamp with time zone", outbox_in=outbox)
    assert claim_batch(conn, plan, datetime.now(UTC)) == 5  # before anyone listens
    hook = WebhookNotifier(WebhookConfig(name="hook", type="webhook", url=receiver.url))
    with Database(dsn, size=3) as db:
        dispatcher = Dispatcher(db, {"hook": hook}, Clock(), poll=60)
        dispatcher.start()
        try:
            # The worker's first pass sent those 5; it is over once they are recorded as
            # sent (by the statement that also claimed the next, empty, batch): the worker
            # now waits a minute for its poll. And the listener has run its LISTEN.
            wait_until(lambda: sent_alerts(conn) == 5 and listening(conn), "the first pass, LISTEN")
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
    assert shapes(conn) == {outbox}
    hook.close()


def listening(conn: Conn) -> bool:
    """Whether a session of this database has run LISTEN for deliveries (and waits)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query = 'LISTEN slawatch_delivery' AND state = 'idle'"
    ).fetchone()
    return bool(row and row[0])
