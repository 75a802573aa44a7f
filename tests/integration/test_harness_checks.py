"""The fault harness's own checks (tests/faultharness.py, which bench/faults.py runs long;
docs/explanation/guarantees.md): with ``resolve=True`` its rule sends resolved notices
and its check counts them, once per ended episode; a receiver outage that no delivery
meets ends with the receiver accepting again."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.faultharness import FaultRun

pytestmark = pytest.mark.faults


def test_the_rule_resolves_and_the_check_counts_each_ended_episode_once(
    dsn: str, tmp_path: Path, fault_runs: list[FaultRun]
) -> None:
    """One process, no fault: every episode that ended (completed, or a new deadline)
    gets its resolved notice, received after its notifications; an open one none."""
    seed = random.randrange(1 << 32)
    run = FaultRun(dsn, tmp_path / "run", rows=300, spread=8, seed=seed, resolve=True)
    fault_runs.append(run)
    run.setup()
    run.spawn()
    run.settle(timeout=120, fresh=False)
    report = run.verify()
    assert report.ok, f"seed {seed}: {report}\n" + "\n".join(report.problems)
    assert report.resolved_expected > 0, f"seed {seed}: no episode ended"
    assert report.resolved == report.resolved_expected, f"seed {seed}: {report}"
    assert report.misordered == 0
    # The order check can fail: one resolved notice made the first id the receiver took.
    first = run.receiver.first
    notice = next(name for name in first if name.endswith(":resolved"))
    run.receiver.first = {notice: first[notice]} | first
    again = run.verify()
    assert (again.misordered, again.ok) == (1, False)
    assert any(notice + " received before" in p for p in again.problems), again.problems


def test_an_outage_no_delivery_meets_ends_with_the_receiver_accepting(
    dsn: str, tmp_path: Path, fault_runs: list[FaultRun]
) -> None:
    """No process runs, so nothing is sent while the receiver refuses: the outage says
    so (TimeoutError) after its wait, and leaves the receiver accepting, not refusing."""
    run = FaultRun(dsn, tmp_path / "run", rows=10, spread=60, seed=1)
    fault_runs.append(run)
    run.setup()
    with pytest.raises(TimeoutError, match="no delivery attempt"):
        run.receiver_outage(refuse=0.2, closed=0.2, wait=0.5)
    assert not run.receiver.refusing
