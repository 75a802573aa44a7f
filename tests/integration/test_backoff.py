"""The backoff sequences, step by step, through the code that computes them:

- a rule's ``renotify.backoff`` (first, 2x, 4x ... capped at max): the claim's SQL
  computes the next notification time, read back from ``sw_<rule>_next`` (inline)
  or the state table (``track: table``), with freezegun moving the clock;
- a notifier's ``retry`` (``min(first * 2^(attempt-1), max)``, less up to 20 %
  jitter): the ``next_attempt_at`` the delivery loop writes after each failed
  attempt against a real HTTP receiver that keeps answering 503.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from freezegun import freeze_time
from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Renotify, Rule
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.ready import prepare
from slawatch.engine.statetable import state_table
from tests.integration.helpers import Conn, claim_all, episodes, shop
from tests.integration.test_deliver import (
    CLAIMED,
    T0,
    overdue_orders,
    shown_deliveries,
    shown_statuses,
)
from tests.receivers import Reply, WebhookReceiver

HOUR = timedelta(hours=1)
SECOND = timedelta(seconds=1)


def notified(conn: Conn, rule: Rule) -> tuple[int, datetime | None]:
    """(notifications sent, next notification time) of order 1, wherever ``rule`` keeps them."""
    if rule.track == "inline":
        query = sql.SQL("SELECT {}, {} FROM orders WHERE id = 1").format(
            sql.Identifier(rule.n_column), sql.Identifier(rule.next_column)
        )
    else:
        query = sql.SQL("SELECT sw_n, sw_next FROM {}").format(state_table(rule))
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def test_renotify_backoff_doubles_from_first_and_stays_at_max(conn: Conn, track: str) -> None:
    """first 1h, max 5h, 7 notifications: the waits are 1h, 2h, 4h, 5h, 5h, 5h, and
    after #7 there is no next time. Each is checked one second before it (nothing
    claimed) and one second after (exactly one)."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={
            "renotify": Renotify.model_validate({"backoff": {"first": "1h", "max": "5h"}, "max": 7})
        }
    )
    plan = prepare(conn, rule)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', %s)", (T0,))
    at = T0 + rule.after + SECOND  # just overdue
    waits = []
    for n in range(1, 8):
        with freeze_time(at):
            assert claim_all(conn, plan) == 1, f"notification #{n}"
        sent, nxt = notified(conn, rule)
        assert sent == n
        if n == 7:
            assert nxt is None  # the cap: no next time, the row leaves the re-notify index
            break
        assert nxt is not None
        waits.append(nxt - at)
        with freeze_time(nxt - SECOND):
            assert claim_all(conn, plan) == 0, f"#{n + 1} a second early"
        at = nxt + SECOND
    assert waits == [1 * HOUR, 2 * HOUR, 4 * HOUR, 5 * HOUR, 5 * HOUR, 5 * HOUR]
    with freeze_time(at + timedelta(days=30)):
        assert claim_all(conn, plan) == 0
    assert episodes(conn, "order_unshipped") == [("1", 1, n) for n in range(1, 8)]


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_delivery_retries_double_from_first_and_stay_at_max(
    conn: Conn, db: Database, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    """first 10s, max 60s, 7 attempts, a receiver that answers 503: after attempts 1..6
    the next attempt is 10, 20, 40, 60, 60, 60 s away (each less up to 20 % jitter,
    one jitter for the batch, or the row's send); the 7th attempt was the last, and it
    goes dead. In either shape of the outbox, as `slawatch alerts` shows the deliveries."""
    overdue_orders(conn, 2, notify="hook", outbox=outbox)
    receiver.default = Reply(503)
    hook = WebhookNotifier(
        WebhookConfig.model_validate(
            {
                "name": "hook",
                "type": "webhook",
                "url": receiver.url,
                "retry": {"first": "10s", "max": "60s", "attempts": 7},
            }
        )
    )
    waits = []
    try:
        with freeze_time(CLAIMED) as clock:
            for attempt in range(1, 7):
                now = Clock().now()
                result = deliver_notifier(db, hook, Clock())
                assert (result.retried, result.dead) == (2, 0), f"attempt {attempt}"
                shown = {(d.attempts, d.next_attempt_at) for d in shown_deliveries(conn)}
                (got,) = shown  # both alike: one jitter per batch
                assert got[1] is not None
                assert got[0] == attempt
                waits.append((got[1] - now).total_seconds())
                clock.move_to(got[1] - SECOND)
                assert deliver_notifier(db, hook, Clock()).total == 0  # not due yet
                clock.move_to(got[1])
            assert deliver_notifier(db, hook, Clock()).dead == 2
    finally:
        hook.close()
    for attempt, (wait, full) in enumerate(zip(waits, [10, 20, 40, 60, 60, 60], strict=True)):
        assert 0.8 * full <= wait <= full, (attempt + 1, waits)
    assert len(receiver.requests) == 7  # one request per attempt, none early
    assert shown_statuses(conn) == {"dead": 2}
