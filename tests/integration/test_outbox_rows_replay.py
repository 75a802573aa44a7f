"""Replay across the outbox's two shapes (docs/explanation/outbox-rows.md, "Delivery"):
a firing notification sent again by `slawatch replay` sends again the resolved notice of
its episode that had gone out to that notifier, whichever shape holds each, and the
notice waits for the firing one as it does within a shape. A process switched
SLAWATCH_OUTBOX mid-episode leaves the firing notification in one shape and the
resolved notice in the other."""

from __future__ import annotations

from datetime import timedelta

from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier, replay_deliveries
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_outbox_rows_deliver import (
    NOW,
    RULE,
    hook,
    insert_row,
    send_of,
    todays_alert,
)
from tests.receivers import WebhookReceiver


def delivery_of(conn: Conn, alert_id: int, notifier: str = "hook") -> tuple[str, int] | None:
    """(status, attempts) of the alert's delivery to ``notifier``; None: it has none."""
    row = conn.execute(
        "SELECT status, attempts FROM slawatch.delivery WHERE alert_id = %s AND notifier = %s",
        (alert_id, notifier),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def settle(conn: Conn, alert_id: int, status: str) -> None:
    conn.execute(
        "UPDATE slawatch.delivery SET status = %s, attempts = 4 WHERE alert_id = %s",
        (status, alert_id),
    )


def settle_send(conn: Conn, row_id: int, status: str) -> None:
    """The row's sends settled as ``status``: all of it done where 'sent', none else."""
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = %s, attempts = 4,"
        " done = CASE WHEN %s = 'sent' THEN cardinality(r.keys) ELSE 0 END"
        " FROM slawatch.outbox_row r WHERE r.id = row_id AND row_id = %s",
        (status, status, row_id),
    )


def ids_sent(receiver: WebhookReceiver) -> list[str]:
    return [a["id"] for r in receiver.requests for a in r.alerts]


def replay_again_finds_nothing(db: Database) -> None:
    """A second replay of the same rule and notifier: nothing dead, nothing sent again."""
    with db.connection("replaying") as c:
        again = replay_deliveries(c, NOW, RULE, "hook", configured={"hook"})
    assert (again.count, again.resolved) == (0, 0)


def assert_resolved_after_firing(ids: list[str], *keys: str) -> None:
    """Each key's resolved notice of episode 1 went after its first notification."""
    for key in keys:
        assert ids.index(f"{RULE}:{key}:e1:n1") < ids.index(f"{RULE}:{key}:e1:resolved")


def test_a_replayed_firing_delivery_sends_its_episodes_resolved_row_again_after_it(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A dead firing notification of today's outbox replayed puts back to pending the
    send to that notifier of a resolved row of its episode that had gone out (the
    row's other notices go again too, with their ids), counted as `resolved`; the row
    follows the firing notification. Not a resolved row of another episode, of another
    rule, or one fired before the firing notification; one pending already is left as
    it is, and one the same replay takes as dead is counted once, as dead."""
    conn = schema
    later = NOW + timedelta(minutes=1)
    b = todays_alert(conn, "b")
    y = todays_alert(conn, "y")
    for alert in (b, y):
        settle(conn, alert, "dead")
    b_resolved = insert_row(conn, ["z", "b"], kind="resolved", episodes=[7, 1], fired_at=later)
    other_episode = insert_row(conn, ["b"], kind="resolved", episodes=[2], fired_at=later)
    other_rule = insert_row(conn, ["b"], kind="resolved", rule="job_hung", fired_at=later)
    before = insert_row(conn, ["b"], kind="resolved", fired_at=NOW - timedelta(days=1))
    y_dead = insert_row(conn, ["y"], kind="resolved", fired_at=later)
    for row in (b_resolved, other_episode, other_rule, before):
        settle_send(conn, row, "sent")
    settle_send(conn, y_dead, "dead")

    with db.connection("replaying") as c:
        done = replay_deliveries(c, NOW, RULE, "hook", configured={"hook"})
    # In alerts: b's and y's deliveries, y's resolved row; both notices of b's row.
    assert (done.dead, done.orphaned, done.resolved) == (3, 0, 2)
    send = send_of(conn, b_resolved)
    assert (send["status"], send["done"], send["attempts"]) == ("pending", 0, 0)
    assert {send_of(conn, r)["status"] for r in (other_episode, other_rule, before)} == {"sent"}
    assert send_of(conn, y_dead)["status"] == "pending"
    replay_again_finds_nothing(db)

    result = deliver_notifier(db, hook(receiver.url), FixedClock(NOW))
    assert result.sent == 2 + 2 + 1
    ids = ids_sent(receiver)
    assert sorted(ids) == sorted(
        [
            f"{RULE}:b:e1:n1",
            f"{RULE}:y:e1:n1",
            f"{RULE}:z:e7:resolved",
            f"{RULE}:b:e1:resolved",
            f"{RULE}:y:e1:resolved",
        ]
    )
    assert_resolved_after_firing(ids, "b", "y")


def test_a_replayed_firing_row_sends_its_episodes_resolved_notices_of_todays_outbox_again(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """A dead firing row replayed goes again from its `done` on; the resolved notice in
    today's outbox of an episode it sends again, gone out to that notifier, goes back to
    pending, counted as `resolved`, and waits for the row. Not that of an alert the send
    had got past (before `done`), nor of another episode; one pending already is left,
    and one the same replay takes as dead is counted once, as dead."""
    conn = schema
    firing = insert_row(conn, ["a", "b", "c", "e"])
    conn.execute(
        "UPDATE slawatch.outbox_send SET status = 'dead', done = 1, attempts = 4 WHERE row_id = %s",
        (firing,),
    )
    a = todays_alert(conn, "a", kind="resolved")  # `a` went before the resolved notice
    b = todays_alert(conn, "b", kind="resolved")
    c_other = todays_alert(conn, "c", kind="resolved", episode=2)
    c_pending = todays_alert(conn, "c", kind="resolved", due=NOW + timedelta(days=1))
    e = todays_alert(conn, "e", kind="resolved")
    for alert in (a, b, c_other):
        settle(conn, alert, "sent")
    settle(conn, e, "dead")

    with db.connection("replaying") as c:
        done = replay_deliveries(c, NOW, RULE, "hook", configured={"hook"})
    # In alerts: b, c and e of the row (a was accepted), e's delivery; b's notice.
    assert (done.dead, done.orphaned, done.resolved) == (4, 0, 1)
    assert delivery_of(conn, b) == ("pending", 0)
    assert {delivery_of(conn, x) for x in (a, c_other)} == {("sent", 4)}
    assert delivery_of(conn, c_pending) == ("pending", 0)
    assert delivery_of(conn, e) == ("pending", 0)
    replay_again_finds_nothing(db)

    # Today's resolved notices wait while the firing row is pending, and follow it.
    result = deliver_notifier(db, hook(receiver.url), FixedClock(NOW))
    assert result.sent == 3 + 2
    ids = ids_sent(receiver)
    assert sorted(ids) == sorted(
        [
            f"{RULE}:b:e1:n1",
            f"{RULE}:c:e1:n1",
            f"{RULE}:e:e1:n1",
            f"{RULE}:b:e1:resolved",
            f"{RULE}:e:e1:resolved",
        ]
    )
    assert_resolved_after_firing(ids, "b", "e")


def test_moved_to_another_notifier_the_resolved_notice_of_the_other_shape_follows(
    schema: Conn, db: Database, receiver: WebhookReceiver
) -> None:
    """Moved with `to`, a firing notification starts over at the new notifier, in either
    shape: the resolved notice of its episode in the other shape gets a delivery (a
    send) to that notifier where it had none, and follows it there."""
    conn = schema
    gone = todays_alert(conn, "a")
    conn.execute(
        "UPDATE slawatch.delivery SET notifier = 'gone', status = 'orphaned' WHERE alert_id = %s",
        (gone,),
    )
    a_resolved = insert_row(
        conn, ["a"], kind="resolved", notifiers=["gone"], fired_at=NOW + timedelta(minutes=1)
    )
    settle_send(conn, a_resolved, "sent")
    firing = insert_row(conn, ["b"], notifiers=["gone"])
    settle_send(conn, firing, "orphaned")
    b_resolved = todays_alert(conn, "b", kind="resolved")
    conn.execute(
        "UPDATE slawatch.delivery SET notifier = 'gone', status = 'sent' WHERE alert_id = %s",
        (b_resolved,),
    )

    with db.connection("replaying") as c:
        moved = replay_deliveries(c, NOW, None, "gone", to="hook", configured={"hook"})
    assert (moved.orphaned, moved.resolved) == (2, 2)
    assert send_of(conn, a_resolved, "hook")["status"] == "pending"
    assert send_of(conn, a_resolved, "gone")["status"] == "sent"
    assert delivery_of(conn, b_resolved) == ("pending", 0)
    assert delivery_of(conn, b_resolved, "gone") == ("sent", 0)

    assert deliver_notifier(db, hook(receiver.url), FixedClock(NOW)).sent == 4
    ids = ids_sent(receiver)
    assert_resolved_after_firing(ids, "a", "b")
