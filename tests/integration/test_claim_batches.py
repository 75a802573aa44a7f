"""A backlog is claimed several batches at a time (dispatcher.CLAIM_BATCHES) and sent
one batch per request; the first request the receiver refuses ends the claim: what
went before is sent, the refused batch retries or goes dead, the rest is released
untried (its attempt not counted)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import ConsoleConfig, RetrySettings
from slawatch.db import Database
from slawatch.delivery.dispatcher import CLAIM_BATCHES, deliver_notifier, lease_for
from slawatch.delivery.notifiers.base import BaseNotifier
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED, overdue_orders

BATCH = 2


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=2, timeout=10) as d:
        yield d


class Watching(BaseNotifier):
    """Records each request's alert keys and, at the time of the request, the
    deliveries under a lease (how many, how many owners, their expiries); refuses
    the requests whose number (from 1) is in ``refuse``."""

    def __init__(
        self,
        conn: Conn,
        refuse: dict[int, DeliveryError] | None = None,
        then: Callable[[int], None] | None = None,
    ) -> None:
        retry = RetrySettings(first=timedelta(seconds=10), max=timedelta(seconds=60))
        super().__init__(ConsoleConfig(name="console", type="console", batch=BATCH, retry=retry))
        self.conn, self.refuse, self.then = conn, refuse or {}, then
        self.requests: list[list[str]] = []
        self.leases: list[tuple[int, int, list[Any]]] = []

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.requests.append([a["key"] for a in alerts])
        row = self.conn.execute(
            "SELECT count(*), count(DISTINCT lease_owner),"
            " array_agg(DISTINCT lease_expires_at) FROM slawatch.delivery"
            " WHERE lease_owner IS NOT NULL"
        ).fetchone()
        assert row is not None
        self.leases.append((row[0], row[1], row[2]))
        if self.then is not None:
            self.then(len(self.requests))
        if len(self.requests) in self.refuse:
            raise self.refuse[len(self.requests)]


def test_a_backlog_is_claimed_several_batches_at_once_and_sent_a_batch_per_request(
    conn: Conn, db: Database
) -> None:
    """23 due, batch 2: the first claim takes one batch; it was full, so the next
    claims take 4 batches (8 deliveries) in one statement, under one owner and a lease
    long enough for 4 sends, and send them as 4 requests of 2, in order."""
    assert CLAIM_BATCHES == 4
    overdue_orders(conn, 23)
    hook = Watching(conn)
    with freeze_time(CLAIMED):
        result = deliver_notifier(db, hook, Clock())
    assert (result.sent, result.retried, result.dead) == (23, 0, 0)
    assert hook.requests == [[str(2 * i + 1), str(2 * i + 2)] for i in range(11)] + [["23"]]
    one, four = CLAIMED + lease_for(hook), CLAIMED + lease_for(hook, 4)
    assert lease_for(hook, 4) - lease_for(hook) == 3 * timedelta(seconds=hook.timeout)
    claims = [(2, 1, [one])] + [(8, 1, [four])] * 8 + [(5, 1, [four])] * 3
    assert hook.leases == claims
    assert conn.execute("SELECT count(*), sum(attempts) FROM slawatch.delivery").fetchone() == (
        23,
        23,
    )


@pytest.mark.parametrize("permanent", [False, True])
def test_a_refused_request_ends_the_claim_and_releases_the_batches_after_it(
    conn: Conn, db: Database, permanent: bool
) -> None:
    """Request 3 (the second of a claim of 4 batches, keys 5 and 6) is refused: keys 1
    to 4 are sent; 5 and 6 retry (or are dead: a permanent failure); 7 to 10, never
    tried, are pending again with no lease and no attempt counted, due when 5 and 6
    retry (or at once, when nothing retries); 11 and on were never claimed."""
    overdue_orders(conn, 12)
    error = DeliveryError("HTTP 503", permanent=permanent)
    hook = Watching(conn, refuse={3: error})
    with freeze_time(CLAIMED):
        result = deliver_notifier(db, hook, Clock())
    retried = 0 if permanent else 2
    assert (result.sent, result.retried, result.dead) == (4, retried, 2 - retried)
    assert hook.requests == [["1", "2"], ["3", "4"], ["5", "6"]]
    rows = conn.execute(
        "SELECT a.key::int, d.status, d.attempts, d.next_attempt_at, d.lease_owner"
        " FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id ORDER BY 1"
    ).fetchall()
    by_key = {r[0]: r[1:] for r in rows}
    assert [by_key[k][0] for k in range(1, 5)] == ["sent"] * 4
    failed = {by_key[5], by_key[6]}
    assert len(failed) == 1  # one jitter for the batch
    ((status, attempts, retry_at, owner),) = failed
    assert (status, attempts, owner) == ("pending" if retried else "dead", 1, None)
    if retried:  # first 10 s, less up to 20 % jitter
        assert CLAIMED + timedelta(seconds=8) <= retry_at <= CLAIMED + timedelta(seconds=10)
    released = CLAIMED if permanent else retry_at
    assert [by_key[k] for k in range(7, 11)] == [("pending", 0, released, None)] * 4
    assert [by_key[k] for k in (11, 12)] == [("pending", 0, CLAIMED, None)] * 2


def test_a_stop_between_requests_releases_the_rest_of_the_claim_due_at_once(
    conn: Conn, db: Database
) -> None:
    """Stop is set during request 2 (the first of a claim of 4 batches): the worker
    sends nothing more; keys 1 to 4 are sent, 5 to 10 pending again at once, with no
    lease and no attempt counted, for whichever process runs next."""
    overdue_orders(conn, 12)
    stop = threading.Event()
    hook = Watching(conn, then=lambda n: stop.set() if n == 2 else None)
    with freeze_time(CLAIMED):
        result = deliver_notifier(db, hook, Clock(), stop=stop)
    assert (result.sent, result.retried, result.dead) == (4, 0, 0)
    assert hook.requests == [["1", "2"], ["3", "4"]]
    rows = conn.execute(
        "SELECT a.key::int, d.status, d.attempts, d.next_attempt_at, d.lease_owner"
        " FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id ORDER BY 1"
    ).fetchall()
    assert [r[1] for r in rows[:4]] == ["sent"] * 4
    assert [r[1:] for r in rows[4:]] == [("pending", 0, CLAIMED, None)] * 8
