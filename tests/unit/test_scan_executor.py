"""The scans' executor (slawatch/runtime/executor.py) with a real APScheduler: runs
go through, a failing run is an event, and nothing a run leaves behind ends a thread;
the scans' job store keeps APScheduler's own store's order."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from apscheduler.events import EVENT_JOB_ERROR
from apscheduler.jobstores.base import ConflictingIdError, JobLookupError
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from slawatch.runtime.executor import ScanExecutor, ScanJobStore
from tests.waiting import wait_until


@pytest.fixture
def scheduler() -> Any:
    s = BackgroundScheduler(executors={"default": ScanExecutor(1)})
    s.start()
    yield s
    s.shutdown(wait=True)


def test_a_failing_run_is_an_error_event_and_the_next_run_goes_ahead(scheduler: Any) -> None:
    errors: list[BaseException] = []
    scheduler.add_listener(lambda e: errors.append(e.exception), EVENT_JOB_ERROR)
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("scan failed")

    scheduler.add_job(boom)
    wait_until(lambda: len(errors) == 1, "the error event", timeout=10)
    scheduler.add_job(ran.set)
    assert ran.wait(10)
    assert str(errors[0]) == "scan failed"


def test_a_failure_after_the_run_does_not_end_the_thread(
    scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = scheduler._lookup_executor("default")
    settle = executor._run_job_success
    calls = []

    def failing_once(job_id: str, events: Any) -> None:
        calls.append(job_id)
        if len(calls) == 1:
            raise RuntimeError("bookkeeping failed")
        settle(job_id, events)

    monkeypatch.setattr(executor, "_run_job_success", failing_once)
    first, second = threading.Event(), threading.Event()
    scheduler.add_job(first.set)
    assert first.wait(10)
    scheduler.add_job(second.set)  # the one thread is still there to run it
    assert second.wait(10)


def test_the_scan_job_store_keeps_memory_job_stores_order_and_errors() -> None:
    """ScanJobStore against APScheduler's MemoryJobStore, the same jobs and changes in
    each: jobs added at shared and distinct times, paused, resumed, moved and removed;
    the order, the due jobs, the next run time and the errors alike after each step."""
    stores = {"memory": MemoryJobStore(), "scan": ScanJobStore()}
    schedulers = {}
    for name, store in stores.items():
        s = BackgroundScheduler(jobstores={"default": store}, timezone=UTC)
        s.start(paused=True)  # jobs go to the store at once; none runs
        schedulers[name] = s
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    picks = random.Random(7)
    try:
        for step in range(400):
            op = picks.choice(["add", "add", "move", "move", "pause", "resume", "remove"])
            job_id = f"scan:r{picks.randrange(60):03}"
            when = t0 + timedelta(seconds=picks.randrange(8) * 0.25)  # times shared often
            outcomes = []
            for s in schedulers.values():
                try:
                    if op == "add":
                        s.add_job(print, "interval", seconds=5, id=job_id, next_run_time=when)
                    elif op == "move":
                        s.modify_job(job_id, next_run_time=when)
                    elif op == "pause":
                        s.pause_job(job_id)
                    elif op == "resume":
                        s.resume_job(job_id)
                    else:
                        s.remove_job(job_id)
                    outcomes.append("ok")
                except (ConflictingIdError, JobLookupError) as exc:
                    outcomes.append(type(exc).__name__)
            assert outcomes[0] == outcomes[1], (step, op, job_id)
            memory, scan = stores["memory"], stores["scan"]
            assert [j.id for j in scan.get_all_jobs()] == [j.id for j in memory.get_all_jobs()]
            now = t0 + timedelta(seconds=picks.randrange(9) * 0.25)
            assert [j.id for j in scan.get_due_jobs(now)] == [
                j.id for j in memory.get_due_jobs(now)
            ]
            assert scan.get_next_run_time() == memory.get_next_run_time()
        schedulers["scan"].remove_all_jobs()
        assert stores["scan"].get_all_jobs() == []
        schedulers["scan"].add_job(print, "interval", seconds=5, id="again", next_run_time=t0)
        assert [j.id for j in stores["scan"].get_due_jobs(t0)] == ["again"]
    finally:
        for s in schedulers.values():
            s.shutdown(wait=False)
