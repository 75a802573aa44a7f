"""Re-notifications fall due at exactly their interval (docs/explanation/guarantees.md).

A scan's time is taken a few milliseconds into the scan, and how many varies: the
re-notification written at one scan's time is then a few milliseconds after the
scan one interval later. The claim takes re-notifications due within a small lead
(``Rule.renotify_cutoff``), so that scan sends it instead of the next one; first
notices have no lead. The scans here are called with the clock frozen at each tick
(freezegun), as the runner's ticks would call them.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

from freezegun import freeze_time

from slawatch.config.rules import RENOTIFY_LEAD, Renotify
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, alerts_of, claim_all, episodes, shop
from tests.integration.test_deliver import T0

EVERY = timedelta(seconds=5)  # the scan period
MS = timedelta(milliseconds=1)


def test_renotify_every_30s_with_5s_scans_pages_every_6th_scan(conn: Conn, track: str) -> None:
    """Scans every 5 s, each a few ms into its tick; renotify every 30 s: the pages
    come at scans 0, 6, 12, 18 (30 s apart), not every 7th (35 s) as when a scan that
    started 3 ms earlier than the last page's missed it."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={"every": EVERY, "renotify": Renotify.model_validate({"every": "30s"})}
    )
    plan = prepare(conn, rule)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', %s)", (T0,))
    start = T0 + rule.after + timedelta(seconds=1)  # tick 0: the row is overdue
    paged = []
    for tick in range(25):
        # The first scan's time is 4 ms into its tick, every later one 1 ms.
        at = start + tick * EVERY + (4 * MS if tick == 0 else MS)
        with freeze_time(at):
            if claim_all(conn, plan):
                paged.append(tick)
    assert paged == [0, 6, 12, 18, 24]
    assert episodes(conn, "order_unshipped") == [("1", 1, n) for n in range(1, 6)]
    # Each notification's claim time, in either shape of the outbox.
    fired = [at for _, at in alerts_of(conn, "order_unshipped", "n", "fired_at")]
    gaps = [b - a for a, b in itertools.pairwise(fired)]
    assert gaps == [timedelta(seconds=30) - 3 * MS] + [timedelta(seconds=30)] * 3


def test_the_lead_is_small_and_first_notices_have_none(conn: Conn, track: str) -> None:
    """A re-notification is taken at most the lead (a tenth of the scan period, at most
    1 s) before its time, never earlier; a first notice never before its due time."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={"every": EVERY, "renotify": Renotify.model_validate({"every": "30s"})}
    )
    lead = min(RENOTIFY_LEAD, EVERY / 10)
    assert rule.renotify_cutoff(T0) - T0 == lead == timedelta(milliseconds=500)
    plan = prepare(conn, rule)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', %s)", (T0,))
    due = T0 + rule.after
    with freeze_time(due - MS):
        assert claim_all(conn, plan) == 0  # a first notice: not a millisecond early
    with freeze_time(due + MS):
        assert claim_all(conn, plan) == 1
    nxt = due + MS + timedelta(seconds=30)
    with freeze_time(nxt - lead - MS):
        assert claim_all(conn, plan) == 0  # earlier than the lead: not yet
    with freeze_time(nxt - lead + MS):
        assert claim_all(conn, plan) == 1
