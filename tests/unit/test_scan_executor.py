"""The scans' executor (slawatch/runtime/executor.py) with a real APScheduler: runs
go through, a failing run is an event, and nothing a run leaves behind ends a thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from apscheduler.events import EVENT_JOB_ERROR
from apscheduler.schedulers.background import BackgroundScheduler

from slawatch.runtime.executor import ScanExecutor
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
