"""The delivery loop on the outbox: payloads, retries, dead letters, fenced writes."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from psycopg_pool import ConnectionPool

from slawatch.claim import plan_claim
from slawatch.clock import Clock
from slawatch.deliver import deliver_batch, deliver_due
from slawatch.errors import DeliveryError
from slawatch.notifiers import ConsoleConfig, RetrySettings
from slawatch.notifiers.base import BaseNotifier
from slawatch.notifiers.console import ConsoleNotifier
from slawatch.queries import queries
from tests.integration.helpers import Conn, claim_all, shop

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLAIMED = T0 + timedelta(days=3)  # when the alerts were claimed and became deliverable


class FlakyReceiver(BaseNotifier):
    """A receiver that refuses the first ``failures`` sends, then keeps what it gets."""

    def __init__(self, failures: int, retry: RetrySettings | None = None) -> None:
        super().__init__(
            ConsoleConfig(name="console", type="console", retry=retry or RetrySettings())
        )
        self.failures = failures
        self.got: list[dict[str, Any]] = []

    def send(self, alerts: list[dict[str, Any]]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise DeliveryError("ConnectionError: receiver down")
        self.got.extend(alerts)


@pytest.fixture
def pool(dsn: str) -> Any:
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as p:
        yield p


def overdue_orders(conn: Conn, count: int, notify: str = "console") -> None:
    """``count`` orders overdue, claimed at CLAIMED: one pending delivery each to ``notify``."""
    rule = shop(conn)["order_unshipped"].model_copy(update={"notify": [notify]})
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(1, %s::int) g",
        (T0, count),
    )
    assert claim_all(conn, plan_claim(rule, "timestamp with time zone"), CLAIMED) == count


def statuses(conn: Conn) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM slawatch.delivery GROUP BY 1"))


def test_console_prints_the_payload_and_marks_sent(conn: Conn, pool: Any) -> None:
    overdue_orders(conn, 3)
    out = io.StringIO()
    console = ConsoleNotifier(ConsoleConfig(name="console", type="console"), out)
    with freeze_time(CLAIMED):
        result = deliver_due(pool, {"console": console}, Clock(), {"order_unshipped": "late"})
    assert (result.sent, result.retried, result.dead) == (3, 0, 0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[warning] order_unshipped #1 key=1 due 2026-03-03T12:00:00Z {")
    assert json.loads(lines[0].split(" ", 6)[6]) == {
        "id": 1,
        "paid_at": "2026-03-01T12:00:00+00:00",
        "user_id": 7,
        "total_cents": 990,
    }
    assert statuses(conn) == {"sent": 3}


def test_failures_retry_with_backoff_then_go_dead_with_the_error(conn: Conn, pool: Any) -> None:
    overdue_orders(conn, 2)
    retry = RetrySettings(first=timedelta(seconds=10), max=timedelta(seconds=30), attempts=4)
    receiver = FlakyReceiver(failures=99, retry=retry)
    with freeze_time(CLAIMED) as clock:
        waits = []
        for _ in range(3):
            assert deliver_batch(pool, receiver, Clock()).retried == 2
            (nxt,) = conn.execute(
                "SELECT DISTINCT next_attempt_at FROM slawatch.delivery"
            ).fetchone()
            waits.append((nxt - datetime.now(UTC)).total_seconds())
            assert deliver_batch(pool, receiver, Clock()).total == 0  # not due yet
            clock.move_to(nxt)
        # min(first * 2^(attempt-1), max), less up to 20% jitter
        for wait, full in zip(waits, [10, 20, 30], strict=True):
            assert 0.8 * full <= wait <= full
        assert deliver_batch(pool, receiver, Clock()).dead == 2  # the 4th attempt was the last
    assert statuses(conn) == {"dead": 2}
    errors = conn.execute("SELECT DISTINCT last_error FROM slawatch.delivery").fetchall()
    assert errors == [("ConnectionError: receiver down",)]


def test_permanent_failure_is_dead_at_once_and_replay_revives(conn: Conn, pool: Any) -> None:
    overdue_orders(conn, 2)

    class Gone(FlakyReceiver):
        def send(self, alerts: list[dict[str, Any]]) -> None:
            raise DeliveryError("HTTP 410 Gone", permanent=True)

    with freeze_time(CLAIMED):
        assert deliver_batch(pool, Gone(0), Clock()).dead == 2
    assert statuses(conn) == {"dead": 2}
    replay = queries()["replay"]
    none = {"now": CLAIMED, "rule": "nope", "notifier": None}
    assert conn.execute(replay, none).fetchone() == (0,)
    args = {"now": CLAIMED, "rule": "order_unshipped", "notifier": "console"}
    assert conn.execute(replay, args).fetchone() == (2,)
    receiver = FlakyReceiver(failures=0)
    with freeze_time(CLAIMED):
        assert deliver_batch(pool, receiver, Clock()).sent == 2
    assert statuses(conn) == {"sent": 2}


def test_retry_after_is_honoured(conn: Conn, pool: Any) -> None:
    overdue_orders(conn, 1)

    class Busy(FlakyReceiver):
        def send(self, alerts: list[dict[str, Any]]) -> None:
            raise DeliveryError("HTTP 429 Too Many Requests", retry_after=120)

    with freeze_time(CLAIMED):
        assert deliver_batch(pool, Busy(0), Clock()).retried == 1
    (nxt,) = conn.execute("SELECT next_attempt_at FROM slawatch.delivery").fetchone()
    assert nxt == CLAIMED + timedelta(seconds=120)


def test_a_receiver_that_recovers_gets_every_alert(conn: Conn, pool: Any) -> None:
    overdue_orders(conn, 250)
    receiver = FlakyReceiver(failures=3)
    with freeze_time(CLAIMED) as clock:
        for _ in range(10):
            deliver_due(pool, {"console": receiver}, Clock())
            clock.tick(timedelta(minutes=10))
    assert sorted(a["id"] for a in receiver.got) == sorted(
        f"order_unshipped:{k}:e1:n1" for k in range(1, 251)
    )
    assert statuses(conn) == {"sent": 250}


def test_a_lost_lease_fences_the_old_owner_out(conn: Conn) -> None:
    overdue_orders(conn, 1)
    q = queries()
    old, new = uuid.uuid4(), uuid.uuid4()
    lease = timedelta(seconds=30)
    claim = {"limit": 10, "lease": lease, "notifier": "console"}
    (first,) = conn.execute(
        q["claim_deliveries"], claim | {"now": CLAIMED, "owner": old}
    ).fetchall()
    # Not due again while the lease holds...
    assert (
        conn.execute(q["claim_deliveries"], claim | {"now": CLAIMED, "owner": new}).fetchall() == []
    )
    # ...but once it expired (the old owner stalled), another process takes it over.
    later = CLAIMED + lease + timedelta(seconds=1)
    (second,) = conn.execute(q["claim_deliveries"], claim | {"now": later, "owner": new}).fetchall()
    assert first[0] == second[0] and second[2] == 2  # same delivery, attempt 2
    stale = conn.execute(q["mark_sent"], {"ids": [first[0]], "owner": old, "now": later})
    assert stale.rowcount == 0
    stale = conn.execute(q["mark_dead"], {"ids": [first[0]], "owner": old, "error": "x"})
    assert stale.rowcount == 0
    retry = {"ids": [first[0]], "owner": old, "error": "x", "next": CLAIMED}
    assert conn.execute(q["mark_retry"], retry).rowcount == 0  # nor reschedule it
    assert statuses(conn) == {"pending": 1}
    done = conn.execute(q["mark_sent"], {"ids": [first[0]], "owner": new, "now": later})
    assert done.rowcount == 1
