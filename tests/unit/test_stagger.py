"""The first scans of rules started together: spread over STAGGER, in steps of
STEP_RULES rules and at least SLOT apart, so a thousand rules are not a thousand
wakeups a second apart by 1 ms, and a step's rules are asked in one statement
(docs/performance.md: many rules)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from slawatch.runtime.scheduler import SLOT, STAGGER, STEP_RULES, staggered

NOW = datetime(2026, 11, 28, tzinfo=UTC)


@pytest.mark.parametrize("count", [0, 1, 2, 7, 50, 51, 100, 1000, 5000])
def test_first_scans_spread_over_the_stagger_in_steps_of_a_slot_at_least(count: int) -> None:
    times = staggered(NOW, count)
    assert len(times) == count
    assert times == sorted(times)
    assert all(NOW <= t < NOW + timedelta(seconds=STAGGER) for t in times)
    steps = sorted(set(times))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(steps)]
    assert all(g >= SLOT - 1e-6 for g in gaps), min(gaps)
    # Steps of STEP_RULES rules, or as many steps as the stagger holds when that is
    # too few: evenly shared.
    assert len(steps) == min(-(-count // STEP_RULES), int(STAGGER / SLOT))
    if steps:
        per_step = [times.count(t) for t in steps]
        assert max(per_step) - min(per_step) <= 1
