"""A database with history in today's outbox switched to the outbox in rows and back
(docs/explanation/outbox-rows.md, "Turning it on": what was written in one shape is
delivered in that shape, and switching either way loses nothing).

One database, one clock, three Runners in turn (a restart at each switch): today's
outbox (``alerts``), then ``rows``, then ``alerts`` again. At each switch the outbox
the last process leaves holds every kind of pending delivery: waiting to retry (the
receiver answered 503), due and never attempted (written by a scan the process made
before it stopped, without a delivery pass after it), and, at the first switch, leased
by a process that is gone (SIGKILLed mid-send: its lease runs out later). Episodes are
open across both switches: their re-notifications continue with the next n in the
other shape, their resolved notices are written in the other shape and wait there for
the firing notifications of the shape before.

Then the receivers' view is checked against the scenario, not against what slawatch
wrote: every alert once (so every pending delivery at a switch delivered once, none
lost, none sent again), each episode's alerts in order (#1, #2, ... then resolved).
The rules, receivers and tables are the end-to-end test's (test_outbox_rows_e2e.py).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from slawatch.config.settings import Outbox
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn
from tests.integration.test_outbox_rows_e2e import (
    RULES,
    T0,
    TABLES,
    Alert,
    MovedClock,
    Receiver,
    episodes,
    in_order,
    jobs,
    running,
    setup,
    shapes,
    unsettled,
)

M = timedelta(minutes=1)


@pytest.fixture
def pair() -> Iterator[dict[str, Receiver]]:
    made = {"hook": Receiver(), "pager": Receiver()}
    yield made
    for r in made.values():
        r.close()


def refusing(*keys: str) -> Callable[[list[Alert]], bool]:
    """The receiver answers 503 to a request with a firing notification of ``keys``."""

    def refuse(alerts: list[Alert]) -> bool:
        return any(a["status"] == "firing" and a["key"] in keys for a in alerts)

    return refuse


def step(conn: Conn, runner: Runner, clock: MovedClock, minutes: int, deliver: bool = True) -> None:
    """At T0 + ``minutes``: each rule's claim, then (``deliver``) one delivery pass.
    Without the pass, what the claims wrote is due and never attempted."""
    clock.at = T0 + minutes * M
    if deliver:
        result = runner.once()
        assert not result.errors, result.errors
        return
    for rule in TABLES:
        assert runner.scan(rule) is not None


def got(receiver: Receiver) -> set[str]:
    return {a["id"] for a in receiver.got}


def pending(conn: Conn, shape: Outbox) -> Counter[str]:
    """Pending deliveries of ``shape`` per state: waiting to retry, leased, or due and
    never attempted (per alert for a row's send)."""
    if shape == "alerts":
        rows = conn.execute(
            "SELECT CASE WHEN lease_owner IS NOT NULL THEN 'leased'"
            " WHEN attempts > 0 THEN 'retrying' ELSE 'due' END, count(*)"
            " FROM slawatch.delivery WHERE status = 'pending' GROUP BY 1"
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT CASE WHEN s.lease_owner IS NOT NULL THEN 'leased'"
            " WHEN s.attempts > 0 THEN 'retrying' ELSE 'due' END, sum(cardinality(r.keys))"
            " FROM slawatch.outbox_send s JOIN slawatch.outbox_row r ON r.id = s.row_id"
            " WHERE s.status = 'pending' GROUP BY 1"
        ).fetchall()
    return Counter({state: int(n) for state, n in rows})


# What the scenario pages per rule, to each notifier (ids without the rule). Jobs fall
# due at T0 + id min + 10 min, #2 an hour later (critical, to the pager), #3 two hours.
EXPECTED = {
    "hook": {f"{k}:e1:n1" for k in range(1, 7)}
    | {"2:e2:n1", "2:e2:resolved"}
    | {f"{k}:e1:resolved" for k in range(1, 7)},
    "pager": {f"{k}:e1:n2" for k in range(1, 7)}
    | {"4:e1:n3", "5:e1:n3", "2:e2:n2", "2:e2:n3", "2:e2:resolved"}
    | {f"{k}:e1:resolved" for k in range(1, 7)},
}


def test_pending_deliveries_and_open_episodes_carry_over_a_switch_to_rows_and_back(
    dsn: str, tmp_path: Path, pair: dict[str, Receiver]
) -> None:
    folder = tmp_path / "notifiers"
    conn = setup(dsn, folder, pair)
    clock = MovedClock(T0)
    hook, pager = pair["hook"], pair["pager"]
    try:
        # Today's outbox. #1 of every job to the hook, which refuses a request with
        # job 6's (those behind it wait for the next pass); then #2 of every job, for
        # the pager, claimed by a scan with no pass after it.
        hook.refuse = refusing("6")
        with running(dsn, folder, clock, "alerts") as runner:
            step(conn, runner, clock, 20)
            step(conn, runner, clock, 80, deliver=False)
        # Job 4's #2 was being sent by a process SIGKILLed mid-send: leased to it
        # until T0 + 95 min.
        leased = conn.execute(
            "UPDATE slawatch.delivery d SET lease_owner = %s, lease_expires_at = %s"
            " FROM slawatch.alert a WHERE a.id = d.alert_id AND a.key = '4' AND a.n = 2",
            (uuid.uuid4(), T0 + 95 * M),
        ).rowcount
        assert leased == len(TABLES)
        assert set(pending(conn, "alerts")) == {"retrying", "due", "leased"}
        assert hook.got and not pager.got

        # The outbox in rows. Jobs 1 and 6 complete and job 2 gets a new deadline (its
        # episode 2) while their #2 is due and job 6's #1 waits to retry: the resolved
        # notices, in rows, wait for them. Job 4's #2 waits for its lease to run out.
        with running(dsn, folder, clock, "rows") as runner:
            jobs(conn, "status = 'done'", 1, 6)
            jobs(conn, "due_at = '2026-03-01 13:40:00+00'", 2)  # T0 + 100 min
            step(conn, runner, clock, 85)
            assert f"{RULES[0].name}:6:e1:resolved" not in got(hook)
            assert f"{RULES[0].name}:4:e1:n2" not in got(pager)
            hook.refuse = None
            step(conn, runner, clock, 120)  # the retries, the lease run out; 2:e2:n1
            # #3 of jobs 4 and 5 in one row per rule, which the pager refuses; job 3
            # completes.
            pager.refuse = refusing("5")
            jobs(conn, "status = 'done'", 3)
            step(conn, runner, clock, 140)
            step(conn, runner, clock, 175, deliver=False)  # 2:e2:n2, never attempted
        assert pending(conn, "alerts") == {}
        assert set(pending(conn, "rows")) == {"retrying", "due"}

        # Today's outbox again. Job 5 completes while its #3 (in a row) waits to
        # retry: its resolved notice, in today's outbox, waits for it.
        with running(dsn, folder, clock, "alerts") as runner:
            jobs(conn, "status = 'done'", 5)
            step(conn, runner, clock, 180)
            assert f"{RULES[0].name}:5:e1:resolved" not in got(pager)
            pager.refuse = None
            step(conn, runner, clock, 240)  # the row of #3, then 5's resolved; 2:e2:n3
            jobs(conn, "status = 'done'", 2, 4)
            step(conn, runner, clock, 300)
        assert unsettled(conn) == 0
        written = shapes(conn)
        assert written["alerts"] > 0 and written["rows"] > 0, written
    finally:
        conn.close()

    for notifier, receiver in pair.items():
        ids = [a["id"] for a in receiver.got]
        assert Counter(ids) == Counter(f"{r}:{i}" for r in TABLES for i in EXPECTED[notifier])
        # n is the alert's own: the number its id says (0 for a resolved notice).
        assert all(
            a["n"] == (0 if a["status"] == "resolved" else int(a["id"].rsplit(":n", 1)[1]))
            for a in receiver.got
        ), receiver.got
        order = episodes(receiver.got)
        assert all(map(in_order, order.values())), order
