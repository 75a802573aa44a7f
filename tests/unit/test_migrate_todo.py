"""``check`` says what ``migrate`` will do (Step.todo), in the future: nothing is done yet."""

from __future__ import annotations

import pytest

from slawatch.engine.migrate import Step, will


@pytest.mark.parametrize(
    ("done", "todo"),
    [
        (
            "public.orders: added sw_late_n, sw_late_ep",
            "public.orders: will add sw_late_n, sw_late_ep",
        ),
        (
            "public.orders: built index sw_late_first",
            "public.orders: will build index sw_late_first",
        ),
        (
            "public.o: created index sw_a (3 partitions)",
            "public.o: will create index sw_a (3 partitions)",
        ),
        ("slawatch.t: created (rule t's timers)", "slawatch.t: will be created (rule t's timers)"),
        (
            "slawatch.event(): updated for 2 event types",
            "slawatch.event(): will be updated for 2 event types",
        ),
        (
            "public.orders: dropped index sw_x (unused)",
            "public.orders: will drop index sw_x (unused)",
        ),
        (
            "slawatch.late_state: dropped (track: inline)",
            "slawatch.late_state: will be dropped (track: inline)",
        ),
        ("slawatch's schema: applied 0008_x.sql", "slawatch's schema: will apply 0008_x.sql"),
        (
            "public.orders: analyzed: it had no statistics, which the claim's plan needs",
            "public.orders: will analyze: it has no statistics, which the claim's plan needs",
        ),
        (
            "public.orders: sw_late_seen now timestamptz like the deadline",
            "public.orders: sw_late_seen will be timestamptz like the deadline",
        ),
        # A name that reads like a verb stays: only the first verb after the place changes.
        ("public.added: added sw_added_n", "public.added: will add sw_added_n"),
    ],
)
def test_a_step_still_to_do_is_said_in_the_future(done: str, todo: str) -> None:
    assert will(done) == todo
    assert Step("SELECT 1", done).todo == todo
