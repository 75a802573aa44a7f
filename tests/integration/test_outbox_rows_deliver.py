"""The delivery side of the outbox in rows (0020_outbox_rows.sql, 0021_outbox_rows_due.sql):
workers lease one row send at a time, send it in chunks of the notifier's batch to a
real HTTP receiver, record their progress, retry, die, skip acked and silenced alerts,
keep per-episode order, and replay, orphan and prune row sends. The rows are written
here by hand, as the claim would write them."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.db import Database
from slawatch.delivery.dispatcher import (
    Dispatcher,
    RowSent,
    Settled,
    deliver_notifier,
    deliver_row_send,
    deliver_rows,
    deliveries_due,
    due_by_shape,
    lease_for,
    lease_row_send,
    mark_row_sent,
    replay_deliveries,
    settle_orphans,
)
from slawatch.delivery.notifiers.base import encode
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.runtime.maintain import prune
from tests.integration.helpers import Conn, FixedClock, plan_nodes
from tests.receivers import Reply, WebhookReceiver
from tests.waiting import lock_waits, wait_until

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=3)  # when the rows are due
RULE = "order_unshipped"


def hook(url: str, name: str = "hook", **fields: Any) -> WebhookNotifier:
    config = WebhookConfig.model_validate(
        {"name": name, "type": "webhook", "url": url, "timeout": "5s"} | fields
    )
    return WebhookNotifier(config)


def insert_row(
    conn: Conn,
    keys: Sequence[str],
    *,
    notifiers: Sequence[str] = ("hook",),
    kind: str = "firing",
    rule: str = RULE,
    episodes: Sequence[int] | None = None,
    ns: Sequence[int] | None = None,
    deadlines: Sequence[datetime | None] | None = None,
    rows: Sequence[str] | None = None,
    fired_at: datetime = T0 + timedelta(days=2),
    after: timedelta = timedelta(days=1),
    due: datetime = NOW,
) -> int:
    """One outbox_row of ``keys`` and a pending send to each of ``notifiers``, due at ``due``."""
    size = len(keys)
    (row_id,) = conn.execute(
        "INSERT INTO slawatch.outbox_row (rule, kind, fired_at, after, notifiers, keys,"
        " episodes, ns, severities, deadlines, row_data)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb[]) RETURNING id",
        (
            rule,
            kind,
            fired_at,
            after,
            list(notifiers),
            list(keys),
            list(episodes or [1] * size),
            list(ns or [0 if kind == "resolved" else 1] * size),
            ["warning"] * size,
            list(deadlines) if deadlines is not None else [T0] * size,
            list(rows) if rows is not None else [json.dumps({"id": k}) for k in keys],
        ),
    ).fetchone()
    for name in notifiers:
        conn.execute(
            "INSERT INTO slawatch.outbox_send (row_id, notifier, next_attempt_at)"
            " VALUES (%s, %s, %s)",
            (row_id, name, due),
        )
    return int(row_id)


def send_of(conn: Conn, row_id: int, notifier: str = "hook") -> dict[str, Any]:
    cur = conn.execute(
        "SELECT status, attempts, done, next_attempt_at, lease_owner, last_error, sent_at,"
        " skipped FROM slawatch.outbox_send WHERE row_id = %s AND notifier = %s",
        (row_id, notifier),
    )
    names = [c.name for c in cur.description or []]
    row = cur.fetchone()
    assert row is not None
    return dict(zip(names, row, strict=True))


def keys_sent(receiver: WebhookReceiver, requests: Sequence[int] | None = None) -> list[str]:
    picked = receiver.requests if requests is None else [receiver.requests[i] for i in requests]
    return [a["key"] for r in picked for a in r.alerts]


def test_every_element_goes_once_with_the_payload_of_todays_outbox(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """The same alerts in today's outbox and in a row: each sent once per shape, and both
    copies are the same bytes (times in the claim's ISO 'Z' form, the same id)."""
    conn = schema
    fired = datetime(2026, 3, 3, 12, 0, 0, 500000, tzinfo=UTC)
    after = timedelta(days=1, microseconds=1)
    deadlines = [
        datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 0, 0, 120000, tzinfo=UTC),
        None,
        datetime(999, 1, 1, tzinfo=UTC),
    ]
    rows = [
        '{"total": 12.50, "f": 0.1}',
        '{"big": 123456789012345678901234567890, "u64": 18446744073709551615}',
        '{"s": "é\\u0001\\"\\\\", "x": [1, {"a": null}]}',
        "{}",
    ]
    keys = ["1", "2", "3", "4"]
    for key, deadline, row in zip(keys, deadlines, rows, strict=True):
        conn.execute(
            "WITH a AS (INSERT INTO slawatch.alert"
            " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
            " VALUES (%s, %s, 1, 1, 'warning', %s, %s, %s, %s::jsonb) RETURNING id)"
            " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
            " SELECT id, 'hook', %s FROM a",
            (RULE, key, deadline, deadline + after if deadline else None, fired, row, NOW),
        )
    row_id = insert_row(conn, keys, deadlines=deadlines, rows=rows, fired_at=fired, after=after)
    big = insert_row(conn, [f"b{i}" for i in range(100)])
    result = deliver_notifier(db, hook(receiver.url), FixedClock(NOW), {RULE: "late"})
    assert result.sent == 4 + 4 + 100
    payloads: dict[str, list[bytes]] = {}
    for request in receiver.requests:
        for alert in request.alerts:
            payloads.setdefault(alert["id"], []).append(encode(alert))
    assert Counter(len(v) for k, v in payloads.items() if ":b" not in k) == {2: 4}
    assert all(a == b for a, b in (v for v in payloads.values() if len(v) == 2))
    assert Counter(keys_sent(receiver)) == Counter(keys * 2 + [f"b{i}" for i in range(100)])
    got = {a["key"]: a for r in receiver.requests for a in r.alerts}
    assert got["1"]["id"] == f"{RULE}:1:e1:n1"
    assert got["2"]["deadline"] == "2026-03-01T12:00:00.120000Z"
    assert got["2"]["due_at"] == "2026-03-02T12:00:00.120001Z"
    assert got["4"]["deadline"] == "0999-01-01T00:00:00Z"
    assert got["3"]["deadline"] is None and got["3"]["due_at"] is None
    assert got["1"]["fired_at"] == "2026-03-03T12:00:00.500000Z"
    assert got["2"]["row"]["big"] == 123456789012345678901234567890
    assert got["1"]["description"] == "late"
    for rid, size in ((row_id, 4), (big, 100)):
        send = send_of(conn, rid)
        assert (send["status"], send["done"], send["lease_owner"]) == ("sent", size, None)
        assert send["sent_at"] == NOW and send["skipped"] is None
    assert deliver_notifier(db, hook(receiver.url), FixedClock(NOW)).total == 0


def test_a_row_goes_in_chunks_and_a_failed_chunk_retries_from_the_progress(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A row of 100 to a notifier with batch 20: 5 requests; the 3rd refused, the send
    retries later from element 40 and never sends 0-39 again."""
    conn = schema
    keys = [str(i) for i in range(100)]
    row_id = insert_row(conn, keys)
    notifier = hook(receiver.url, batch=20, retry={"first": "10s", "max": "1m", "attempts": 5})
    receiver.replies = [Reply(), Reply(), Reply(status=503)]
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert (result.sent, result.retried, result.dead) == (40, 60, 0)
    assert len(receiver.requests) == 3
    send = send_of(conn, row_id)
    assert (send["status"], send["done"], send["attempts"]) == ("pending", 40, 1)
    assert send["lease_owner"] is None and "503" in send["last_error"]
    # Backoff 10 s with jitter 0.8..1.0: not due before, due after.
    assert NOW + timedelta(seconds=8) <= send["next_attempt_at"] <= NOW + timedelta(seconds=10)
    assert deliver_notifier(db, notifier, FixedClock(NOW + timedelta(seconds=5))).total == 0
    later = NOW + timedelta(seconds=11)
    result = deliver_notifier(db, notifier, FixedClock(later))
    assert (result.sent, result.retried, result.dead) == (60, 0, 0)
    assert len(receiver.requests) == 6
    accepted = keys_sent(receiver, [0, 1, 3, 4, 5])
    assert accepted == keys
    assert keys_sent(receiver, [2]) == keys[40:60]  # the refused chunk, sent again
    send = send_of(conn, row_id)
    assert (send["status"], send["done"], send["attempts"]) == ("sent", 100, 2)
    assert send["last_error"] is None and send["sent_at"] == later


def test_a_turn_of_sends_goes_on_while_no_delivery_is_due(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """25 rows, nothing due in today's outbox: one run of deliver_rows sends them all,
    each settled by the next lease (none by a statement of its own), though a turn is
    10 sends."""
    conn = schema
    rows = [insert_row(conn, [f"r{r}"]) for r in range(25)]
    notifier = hook(receiver.url)
    result, leased = deliver_rows(db, notifier, FixedClock(NOW), turn=10)
    assert (result.sent, leased) == (25, 25)
    assert keys_sent(receiver) == [f"r{r}" for r in range(25)]
    assert {send_of(conn, r)["status"] for r in rows} == {"sent"}


def test_a_turn_of_sends_ends_when_a_delivery_is_due(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A delivery of today's outbox due: the turn ends after its 10th send, settled at
    once, and deliver_notifier sends the delivery before the 11th row."""
    conn = schema
    rows = [insert_row(conn, [f"r{r}"]) for r in range(25)]
    conn.execute(
        "WITH a AS (INSERT INTO slawatch.alert"
        " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
        " VALUES (%s, 'd1', 1, 1, 'warning', %s, %s, %s, '{}') RETURNING id)"
        " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, 'hook', %s FROM a",
        (RULE, T0, T0, NOW, NOW),
    )
    notifier = hook(receiver.url)
    result, leased = deliver_rows(db, notifier, FixedClock(NOW), turn=10)
    assert (result.sent, leased) == (10, 10)
    assert [send_of(conn, r)["status"] for r in rows[9:11]] == ["sent", "pending"]
    assert send_of(conn, rows[10])["lease_owner"] is None
    assert deliver_notifier(db, notifier, FixedClock(NOW)).sent == 16
    assert keys_sent(receiver) == [f"r{r}" for r in range(10)] + ["d1"] + [
        f"r{r}" for r in range(10, 25)
    ]


class Recorded:
    """The metrics the dispatcher reports to."""

    def __init__(self) -> None:
        self.settled: list[Settled] = []

    def delivered(self, batch: Settled) -> None:
        self.settled.append(batch)


def test_workers_drain_both_shapes_each_alert_once(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Three workers of a notifier, running: every element of 30 rows and every delivery
    of today's outbox reaches the receiver once, and the metrics count each sent alert."""
    conn = schema
    rows = [insert_row(conn, [f"r{r}-{i}" for i in range(10)]) for r in range(30)]
    conn.execute(
        "WITH a AS (INSERT INTO slawatch.alert"
        " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
        " SELECT %s, 'd' || g, 1, 1, 'warning', %s, %s, %s, '{}'"
        " FROM generate_series(1, 50) g RETURNING id)"
        " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, 'hook', %s FROM a",
        (RULE, T0, T0, NOW, NOW),
    )
    notifier = hook(receiver.url, batch=7)
    metrics = Recorded()
    dispatcher = Dispatcher(
        db, {"hook": notifier}, Clock(), poll=0.2, concurrency={"hook": 3}, metrics=metrics
    )
    dispatcher.start()
    try:

        def drained() -> bool:
            (pending,) = conn.execute(
                "SELECT (SELECT count(*) FROM slawatch.outbox_send WHERE status <> 'sent')"
                " + (SELECT count(*) FROM slawatch.delivery WHERE status <> 'sent')"
            ).fetchone()  # type: ignore[misc]
            return pending == 0

        wait_until(drained, "every send and delivery sent")
    finally:
        dispatcher.stop()
        notifier.close()
    expected = [f"r{r}-{i}" for r in range(30) for i in range(10)] + [f"d{g}" for g in range(1, 51)]
    assert sorted(keys_sent(receiver)) == sorted(expected)
    assert sum(len(s.fired) for s in metrics.settled) == len(expected)
    assert {send_of(conn, r)["done"] for r in rows} == {10}


def test_dead_after_the_last_attempt_and_at_once_when_permanent(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    conn = schema
    retrying = insert_row(conn, ["1", "2"])
    notifier = hook(receiver.url, retry={"first": "10s", "max": "10s", "attempts": 2})
    receiver.default = Reply(status=500)
    assert deliver_notifier(db, notifier, FixedClock(NOW)).retried == 2
    assert send_of(conn, retrying)["status"] == "pending"
    later = NOW + timedelta(seconds=11)
    assert deliver_notifier(db, notifier, FixedClock(later)).dead == 2
    send = send_of(conn, retrying)
    assert (send["status"], send["attempts"], send["lease_owner"]) == ("dead", 2, None)
    assert "500" in send["last_error"]
    assert not deliveries_due(db, notifier, later + timedelta(days=1))

    refused = insert_row(conn, ["3"], due=later)
    receiver.default = Reply(status=400)
    assert deliver_notifier(db, notifier, FixedClock(later)).dead == 1
    send = send_of(conn, refused)
    assert (send["status"], send["attempts"]) == ("dead", 1)
    assert "400" in send["last_error"]


def test_a_failed_send_waits_as_long_as_the_receiver_says(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Retry-After wins over the notifier's backoff, as for deliveries (retry_delay)."""
    conn = schema
    row_id = insert_row(conn, ["1"])
    receiver.replies = [Reply(status=429, headers={"Retry-After": "120"})]
    notifier = hook(receiver.url, retry={"first": "1s", "max": "10m"})
    assert deliver_notifier(db, notifier, FixedClock(NOW)).retried == 1
    assert send_of(conn, row_id)["next_attempt_at"] == NOW + timedelta(seconds=120)


def test_acked_and_silenced_elements_are_skipped_and_recorded(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    conn = schema
    row_id = insert_row(
        conn,
        ["1", "2", "3", "4", "5"],
        rows=['{"id": 1}', '{"id": 2}', '{"id": 3}', '{"id": 4, "zone": "eu"}', '{"id": 5}'],
    )
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " VALUES (%s, '2', 1, 0, %s, 'ann')",
        (RULE, NOW),
    )
    active = (RULE, NOW, NOW + timedelta(hours=1), NOW)
    conn.execute(
        "INSERT INTO slawatch.silence (rule, key, matchers, starts_at, ends_at, created_at,"
        " author) VALUES (%s, '3', '{}', %s, %s, %s, 'bob'),"
        " (%s, NULL, '{\"zone\": \"eu\"}', %s, %s, %s, 'bob'),"
        " (%s, '5', '{}', %s, %s, %s, 'ended')",
        (*active, *active, RULE, NOW - timedelta(hours=2), NOW - timedelta(hours=1), NOW),
    )
    result = deliver_notifier(db, hook(receiver.url), FixedClock(NOW))
    assert (result.sent, result.acknowledged, result.silenced) == (2, 1, 2)
    assert keys_sent(receiver) == ["1", "5"]
    send = send_of(conn, row_id)
    assert send["status"] == "sent" and send["done"] == 5
    assert send["skipped"] == [None, "acknowledged", "silenced", "silenced", None]


def test_a_resolved_row_waits_for_the_earlier_firing_row_of_a_shared_key(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Per episode and notifier, "resolved" never goes before "firing": a resolved row's
    send waits while a firing row of the same rule with a lower id that shares a key has
    a pending send to the notifier (waiting to retry here), and while a firing
    notification of one of its episodes in today's outbox is pending there."""
    conn = schema
    later = NOW + timedelta(minutes=5)
    firing = insert_row(conn, ["a", "b"], due=later)
    other_rule = insert_row(conn, ["c"], rule="job_hung", due=later)
    resolved = insert_row(conn, ["b"], kind="resolved")
    unrelated = insert_row(conn, ["z"], kind="resolved")
    notifier = hook(receiver.url)
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert result.sent == 1 and keys_sent(receiver) == ["z"]
    assert send_of(conn, resolved)["status"] == "pending"
    assert send_of(conn, unrelated)["status"] == "sent"
    result = deliver_notifier(db, notifier, FixedClock(later))
    assert result.sent == 4
    ids = [a["id"] for r in receiver.requests[1:] for a in r.alerts]
    assert sorted(ids) == sorted(
        [f"{RULE}:a:e1:n1", f"{RULE}:b:e1:n1", "job_hung:c:e1:n1", f"{RULE}:b:e1:resolved"]
    )
    assert ids.index(f"{RULE}:b:e1:n1") < ids.index(f"{RULE}:b:e1:resolved")
    assert {send_of(conn, r)["status"] for r in (firing, other_rule, resolved)} == {"sent"}

    # Across shapes: the firing notification in today's outbox, the resolved one in a row.
    conn.execute(
        "WITH a AS (INSERT INTO slawatch.alert"
        " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
        " VALUES (%s, 'd', 1, 1, 'warning', %s, %s, %s, '{}') RETURNING id)"
        " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, 'hook', %s FROM a",
        (RULE, T0, T0, NOW, later + timedelta(minutes=5)),
    )
    held = insert_row(conn, ["d"], kind="resolved", due=later)
    assert deliver_notifier(db, notifier, FixedClock(later)).sent == 0
    assert send_of(conn, held)["status"] == "pending"
    result = deliver_notifier(db, notifier, FixedClock(later + timedelta(minutes=5)))
    assert result.sent == 2
    assert [a["id"] for a in receiver.requests[-2].alerts] == [f"{RULE}:d:e1:n1"]
    assert [a["id"] for a in receiver.requests[-1].alerts] == [f"{RULE}:d:e1:resolved"]


def test_a_send_whose_worker_died_is_taken_over_and_the_stale_owner_changes_nothing(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    conn = schema
    keys = [str(i) for i in range(40)]
    row_id = insert_row(conn, keys)
    notifier = hook(receiver.url, batch=20)
    stale = lease_row_send(db, notifier, NOW)  # a worker that then stalled (or died)
    assert stale.row_id == row_id and stale.left == 40
    send = send_of(conn, row_id)
    assert send["lease_owner"] == stale.owner and send["attempts"] == 1
    # Leased: not due, not leased again, until the lease runs out.
    assert not deliveries_due(db, notifier, NOW + timedelta(seconds=1))
    assert lease_row_send(db, notifier, NOW + timedelta(seconds=1)).row_id is None
    expired = NOW + lease_for(notifier) + timedelta(seconds=1)
    assert deliveries_due(db, notifier, expired)
    taken = lease_row_send(db, notifier, expired)
    assert taken.row_id == row_id and taken.owner != stale.owner and taken.attempts == 2

    # The stale owner wakes: its first chunk goes out, its progress is refused, it stops.
    result, following = deliver_row_send(db, notifier, FixedClock(expired), stale, {}, True)
    assert (result.sent, following) == (20, None)
    mark_row_sent(db, notifier, expired, RowSent(row_id, stale.owner, 40, None))
    send = send_of(conn, row_id)
    assert (send["status"], send["done"], send["lease_owner"]) == ("pending", 0, taken.owner)

    # The new owner sends the whole row and settles it.
    result, following = deliver_row_send(db, notifier, FixedClock(expired), taken, {}, True)
    assert result.sent == 40 and following is not None and following.row_id is None
    send = send_of(conn, row_id)
    assert (send["status"], send["done"], send["lease_owner"]) == ("sent", 40, None)
    assert Counter(keys_sent(receiver)) == Counter(keys + keys[:20])


def test_a_send_the_next_lease_could_not_lock_is_settled_after_it(
    schema: Conn, db: Database, dsn: str
) -> None:
    """The lease of the next send settles the one sent with SKIP LOCKED (two leases never
    wait for each other); one it skipped, locked by another for a moment, is settled by
    mark_row_sent once the lock is gone."""
    conn = schema
    first, second = insert_row(conn, ["1"]), insert_row(conn, ["2"], due=NOW + timedelta(1))
    notifier = hook("http://127.0.0.1:9/none")
    leased = lease_row_send(db, notifier, NOW)
    assert leased.row_id == first
    got: list[Any] = []
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM slawatch.outbox_send WHERE row_id = %s FOR UPDATE", (first,))
        sent = RowSent(first, leased.owner, 1, None)
        worker = threading.Thread(
            target=lambda: got.append(
                lease_row_send(db, notifier, NOW + timedelta(days=1), sent=sent)
            )
        )
        worker.start()
        wait_until(lambda: bool(lock_waits(conn)), "mark_row_sent waiting for the lock")
        assert send_of(conn, first)["status"] == "pending"
        holder.rollback()
    worker.join()
    assert got[0].row_id == second and not got[0].settled
    send = send_of(conn, first)
    assert (send["status"], send["done"], send["lease_owner"]) == ("sent", 1, None)


def test_orphaned_sends_and_replay(schema: Conn, db: Database, receiver: WebhookReceiver) -> None:
    conn = schema
    gone = insert_row(conn, ["1", "1b", "1c"], notifiers=["gone"])
    # Two of its alerts went to 'gone' before it was removed: the move starts over.
    conn.execute("UPDATE slawatch.outbox_send SET done = 2 WHERE row_id = %s", (gone,))
    both = insert_row(conn, ["2"], notifiers=["gone", "hook"])
    clock = FixedClock(NOW)
    assert settle_orphans(db, {"hook"}, clock) == {"gone": 2}
    assert send_of(conn, gone, "gone")["status"] == "orphaned"
    assert send_of(conn, both, "hook")["status"] == "pending"
    assert settle_orphans(db, {"hook"}, clock) == {}

    dead = insert_row(conn, [str(i) for i in range(5)])
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = 'dead', done = 3, attempts = 4,"
        " last_error = 'x' WHERE row_id = %s",
        (dead,),
    )
    with db.connection("replaying") as c:
        moved = replay_deliveries(c, NOW, None, "gone", to="hook", configured={"hook"})
    # Counted in alerts, as `slawatch status` counts them: the moved send owes its 3 again
    # (it starts over), the one left as it was its 1.
    assert (moved.orphaned, moved.taken, moved.count) == (3, 1, 3)
    send = send_of(conn, gone)
    assert (send["status"], send["done"], send["attempts"]) == ("pending", 0, 0)
    assert send_of(conn, both, "gone")["status"] == "orphaned"
    with db.connection("replaying") as c:
        again = replay_deliveries(c, NOW, RULE, "hook", configured={"hook"})
    assert (again.dead, again.count) == (2, 2)  # 5 alerts, 3 accepted already
    send = send_of(conn, dead)
    assert (send["status"], send["done"], send["attempts"]) == ("pending", 3, 0)
    result = deliver_notifier(db, hook(receiver.url), clock)
    assert result.sent == 3 + 1 + 2
    assert sorted(keys_sent(receiver)) == ["1", "1b", "1c", "2", "3", "4"]


def test_deliveries_due_sees_a_due_send(schema: Conn, db: Database) -> None:
    conn = schema
    notifier = hook("http://127.0.0.1:9/none")
    assert not deliveries_due(db, notifier, NOW)
    row_id = insert_row(conn, ["1"], due=NOW + timedelta(minutes=1))
    assert not deliveries_due(db, notifier, NOW)
    assert not deliveries_due(db, hook("http://127.0.0.1:9/none", name="other"), NOW)
    assert deliveries_due(db, notifier, NOW + timedelta(minutes=1))
    conn.execute("UPDATE slawatch.outbox_send SET status = 'sent' WHERE row_id = %s", (row_id,))
    assert not deliveries_due(db, notifier, NOW + timedelta(minutes=1))


def test_the_wake_up_probe_answers_per_shape(schema: Conn, db: Database) -> None:
    """due_by_shape tells deliveries and row sends apart: a worker claims deliveries only
    where some are due, and leases a row send only where one is (deliver_notifier)."""
    conn = schema
    notifier = hook("http://127.0.0.1:9/none")
    at = NOW + timedelta(minutes=1)
    assert due_by_shape(db, notifier, at) == (False, False)
    row_id = insert_row(conn, ["1"], due=at)
    assert due_by_shape(db, notifier, at) == (False, True)
    conn.execute(
        "WITH a AS (INSERT INTO slawatch.alert"
        " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
        " VALUES (%s, 'd', 1, 1, 'warning', %s, %s, %s, '{}') RETURNING id)"
        " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, 'hook', %s FROM a",
        (RULE, T0, T0, NOW, at),
    )
    assert due_by_shape(db, notifier, at) == (True, True)
    conn.execute("UPDATE slawatch.outbox_send SET status = 'sent' WHERE row_id = %s", (row_id,))
    assert due_by_shape(db, notifier, at) == (True, False)
    assert due_by_shape(db, notifier, NOW) == (False, False)


def test_the_wake_up_probe_reads_the_due_index_of_the_sends(schema: Conn) -> None:
    """deliveries_due's second probe on its generic plan reads outbox_send_due, never the
    sends of the whole history (the sent ones of the retention window)."""
    conn = schema
    for _ in range(20):
        insert_row(conn, [str(i) for i in range(100)])
    conn.execute(
        "INSERT INTO slawatch.outbox_send (row_id, notifier, next_attempt_at, status)"
        " SELECT r.id, 'n' || g, %s, 'sent' FROM slawatch.outbox_row r,"
        " generate_series(1, 100) g",
        (NOW,),
    )
    conn.execute("ANALYZE slawatch.outbox_send")
    (source,) = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'deliveries_due_by_shape'"
    ).fetchone()  # type: ignore[misc]
    start = source.index("(SELECT s.next_attempt_at")
    inner = source[start + 1 : source.index(") <= at", start)]
    body = inner.replace("notifier_name", "$1").replace("<= at", "<= $2")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE due_probe(text, timestamptz) AS {body}")
    (plan,) = conn.execute(
        f"EXPLAIN (FORMAT JSON) EXECUTE due_probe('hook', '{NOW.isoformat()}')"
    ).fetchone()  # type: ignore[misc]
    # The sends are kept in id ranges (0026_outbox_rows_ranges.sql): a range's partition
    # is read through its part of outbox_send_due.
    scans = [
        conn.execute(
            "SELECT pg_partition_root(%s::regclass)::text", ("slawatch." + node["Index Name"],)
        ).fetchone()[0]  # type: ignore[index]
        if "Index Name" in node
        else node["Node Type"]
        for node in plan_nodes(plan[0]["Plan"])
        if node.get("Relation Name", "").startswith("outbox_send")
    ]
    assert scans == ["slawatch.outbox_send_due"], scans


def test_retention_removes_old_rows_whose_every_send_is_settled(schema: Conn, db: Database) -> None:
    conn = schema
    old = T0 - timedelta(days=30)
    done = insert_row(conn, ["1"], notifiers=["hook", "other"], fired_at=old)
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = CASE notifier WHEN 'hook' THEN 'sent'"
        " ELSE 'dead' END WHERE row_id = %s",
        (done,),
    )
    waiting = insert_row(conn, ["2"], notifiers=["hook", "other"], fired_at=old)
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = 'sent' WHERE row_id = %s AND notifier = 'hook'",
        (waiting,),
    )
    young = insert_row(conn, ["3"], fired_at=NOW)
    conn.execute("UPDATE slawatch.outbox_send SET status = 'sent' WHERE row_id = %s", (young,))
    result = prune(db, FixedClock(NOW), timedelta(days=7))
    assert (result.rows, result.sends) == (1, 2)
    left = conn.execute("SELECT id FROM slawatch.outbox_row ORDER BY id").fetchall()
    assert left == [(waiting,), (young,)]
    sends = conn.execute("SELECT row_id, notifier FROM slawatch.outbox_send ORDER BY 1, 2")
    assert sends.fetchall() == [(waiting, "hook"), (waiting, "other"), (young, "hook")]


def todays_alert(
    conn: Conn, key: str, *, kind: str = "firing", episode: int = 1, due: datetime = NOW
) -> int:
    """A notification (or with ``kind`` 'resolved' a resolved notice, n = 0) in today's
    outbox, with a delivery to hook due at ``due``; its alert id."""
    (alert_id,) = conn.execute(
        "WITH a AS (INSERT INTO slawatch.alert"
        " (rule, key, episode, n, kind, severity, deadline, due_at, fired_at, row_data)"
        " VALUES (%s, %s, %s, %s, %s, 'warning', %s, %s, %s, '{}') RETURNING id)"
        " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
        " SELECT id, 'hook', %s FROM a RETURNING alert_id",
        (RULE, key, episode, 0 if kind == "resolved" else 1, kind, T0, T0, NOW, due),
    ).fetchone()  # type: ignore[misc]
    return int(alert_id)


def test_a_resolved_notice_of_todays_outbox_waits_for_the_firing_row_of_its_episode(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Across shapes the other way (the setting switched from 'rows' to 'alerts'
    mid-episode): a resolved notice in today's outbox waits while a firing row of its
    episode (rule, key, episode) has a pending send to the notifier, and follows it in
    the pass that sends it. Another episode of the key, another rule's row, a send to
    another notifier and a resolved row hold nothing back."""
    conn = schema
    later = NOW + timedelta(minutes=5)
    firing = insert_row(conn, ["x", "e"], due=later)  # waiting to retry
    insert_row(conn, ["e"], episodes=[2], ns=[3], due=later + timedelta(hours=1))
    insert_row(conn, ["e"], rule="job_hung", due=later + timedelta(hours=1))
    insert_row(conn, ["e"], notifiers=["other"], due=later + timedelta(hours=1))
    insert_row(conn, ["e"], kind="resolved", due=later + timedelta(hours=1))
    todays_alert(conn, "e", kind="resolved")
    unheld = todays_alert(conn, "f", kind="resolved")
    notifier = hook(receiver.url)
    result = deliver_notifier(db, notifier, FixedClock(NOW))
    assert result.sent == 1 and [a["key"] for a in receiver.requests[0].alerts] == ["f"]
    assert unheld and send_of(conn, firing)["status"] == "pending"
    assert deliver_notifier(db, notifier, FixedClock(NOW + timedelta(minutes=1))).sent == 0

    # One pass sends the firing row, then the resolved notice it held.
    result = deliver_notifier(db, notifier, FixedClock(later))
    assert result.sent == 3
    ids = [a["id"] for r in receiver.requests[1:] for a in r.alerts]
    assert ids == [f"{RULE}:x:e1:n1", f"{RULE}:e:e1:n1", f"{RULE}:e:e1:resolved"]
    assert send_of(conn, firing)["status"] == "sent"


def test_replaying_a_dead_firing_row_sends_its_episodes_resolved_rows_again_after_it(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A dead firing row replayed goes again from its `done` on; a resolved row of one of
    those episodes already sent to the notifier goes back to pending (the receiver is
    told "resolved" after the replayed "firing" again), counted as `resolved`. Not one of
    an alert the send had got past, of another episode, or one pending already."""
    conn = schema
    firing = insert_row(conn, ["a", "b", "c"])
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = 'dead', done = 1, attempts = 4 WHERE row_id = %s",
        (firing,),
    )
    b_resolved = insert_row(conn, ["z", "b"], kind="resolved", episodes=[7, 1])
    a_resolved = insert_row(conn, ["a"], kind="resolved")  # `a` went before the resolved
    c_other = insert_row(conn, ["c"], kind="resolved", episodes=[2])
    c_pending = insert_row(conn, ["c"], kind="resolved", due=NOW + timedelta(days=1))
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = 'sent', done = cardinality(r.keys)"
        " FROM slawatch.outbox_row r WHERE r.id = row_id AND row_id = ANY(%s)",
        ([b_resolved, a_resolved, c_other],),
    )
    with db.connection("replaying") as c:
        done = replay_deliveries(c, NOW, RULE, "hook", configured={"hook"})
    # In alerts: b and c of the firing row, both notices of the resolved row.
    assert (done.dead, done.count, done.resolved) == (2, 2, 2)
    send = send_of(conn, b_resolved)
    assert (send["status"], send["done"], send["attempts"]) == ("pending", 0, 0)
    assert {send_of(conn, r)["status"] for r in (a_resolved, c_other)} == {"sent"}
    assert send_of(conn, c_pending)["status"] == "pending"
    with db.connection("replaying") as c:  # again: nothing dead, nothing more
        assert replay_deliveries(c, NOW, RULE, "hook", configured={"hook"}).resolved == 0

    result = deliver_notifier(db, hook(receiver.url), FixedClock(NOW))
    assert result.sent == 2 + 2
    ids = [a["id"] for r in receiver.requests for a in r.alerts]
    assert ids.index(f"{RULE}:b:e1:n1") < ids.index(f"{RULE}:b:e1:resolved")
    assert sorted(ids) == sorted(
        [f"{RULE}:b:e1:n1", f"{RULE}:c:e1:n1", f"{RULE}:z:e7:resolved", f"{RULE}:b:e1:resolved"]
    )


def test_moving_a_firing_row_sends_its_episodes_resolved_rows_to_the_new_notifier(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Moved to another notifier, a firing row's send starts over: a resolved row of its
    episodes gets a send to that notifier, after it, where it had none."""
    conn = schema
    firing = insert_row(conn, ["a", "b"], notifiers=["gone"])
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = 'orphaned', done = 2 WHERE row_id = %s",
        (firing,),
    )
    resolved = insert_row(conn, ["a"], kind="resolved", notifiers=["gone"])
    conn.execute("UPDATE slawatch.outbox_send SET status = 'sent' WHERE row_id = %s", (resolved,))
    with db.connection("replaying") as c:
        moved = replay_deliveries(c, NOW, None, "gone", to="hook", configured={"hook"})
    assert (moved.orphaned, moved.resolved) == (2, 1)  # in alerts
    assert send_of(conn, resolved, "hook")["status"] == "pending"
    assert send_of(conn, resolved, "gone")["status"] == "sent"
    assert deliver_notifier(db, hook(receiver.url), FixedClock(NOW)).sent == 3
    ids = [a["id"] for r in receiver.requests for a in r.alerts]
    assert ids == [f"{RULE}:a:e1:n1", f"{RULE}:b:e1:n1", f"{RULE}:a:e1:resolved"]
