"""One line when something starts failing, one when it works again, from many threads."""

from __future__ import annotations

import logging
import threading
import time
import types

import pytest

from slawatch import outage as outage_module
from slawatch.outage import Backoff, Outage

log = logging.getLogger("test.outage")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == log.name and r.levelno >= logging.INFO
    ]


def test_many_failing_threads_make_one_line_each_way(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    outage = Outage("database", log, down="unreachable", up="reachable again")
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(50):
            outage.failed("connection refused", time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outage.down
    outage.ok()
    outage.ok()
    assert not outage.down
    assert lines(caplog) == [
        (logging.ERROR, "database unreachable: connection refused"),
        (logging.INFO, "database reachable again after 0s"),
    ]
    # The other 399 failures are there for whoever debugs.
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 399


def test_an_attempt_that_began_before_the_last_success_is_a_straggler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage("database", log, down="unreachable", up="reachable again")
    began = time.monotonic()
    outage.ok()  # another thread got through meanwhile
    assert not outage.failed("timed out", began)
    assert lines(caplog) == []
    assert outage.failed("timed out", time.monotonic())  # a new attempt: a new outage
    assert lines(caplog) == [(logging.ERROR, "database unreachable: timed out")]


def test_within_the_grace_after_a_success_a_failure_is_no_new_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage("database", log, down="unreachable", up="reachable again", grace=60)
    outage.ok()
    assert not outage.failed("pool still reconnecting", time.monotonic())
    assert lines(caplog) == []


def test_failures_within_the_grace_for_longer_than_after_are_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every failure within the grace of the last success, but failing on for ``after``
    seconds with no success between: an outage, said with how long it lasted so far."""
    caplog.set_level(logging.INFO)
    outage = Outage("database", log, down="unreachable", up="reachable again", grace=60, after=0.2)
    outage.ok()
    began = time.monotonic()
    assert not outage.failed("connection refused", time.monotonic())
    deadline = began + 30
    while not outage.failed("connection refused", time.monotonic()):
        assert time.monotonic() < deadline
    assert time.monotonic() - began >= 0.2
    outage.ok()
    assert lines(caplog) == [
        (logging.ERROR, "database unreachable for 0s: connection refused"),
        (logging.INFO, "database reachable again after 0s"),
    ]
    # A success starts the count again: a failure just after it is no outage.
    assert not outage.failed("connection refused", time.monotonic())
    assert not outage.down


def test_the_end_says_how_long_since_the_first_failure(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure within the grace is no outage yet, but the outage a later one starts
    began with it: "again after" counts from it, not from the line that said so."""
    caplog.set_level(logging.INFO)
    now = [1000.0]
    monkeypatch.setattr(outage_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    outage = Outage("database", log, down="unreachable", up="reachable again", grace=10)
    outage.ok()
    now[0] += 5
    assert not outage.failed("pool still reconnecting", now[0])  # the first failure
    now[0] += 15
    assert outage.failed("connection refused", now[0])  # past the grace: logged
    now[0] += 30
    outage.ok()
    assert lines(caplog) == [
        (logging.ERROR, "database unreachable: connection refused"),
        (logging.INFO, "database reachable again after 45s"),
    ]


def test_unexpected_errors_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage("rule r: scans", log)
    try:
        raise RuntimeError("bug")
    except RuntimeError as exc:
        outage.failed("unexpected RuntimeError: bug", exc_info=exc)
    (record,) = caplog.records
    assert record.getMessage() == "rule r: scans failing: unexpected RuntimeError: bug"
    assert record.exc_info is not None


def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(first=1, cap=30)
    waits = [backoff.next() for _ in range(8)]
    for wait, full in zip(waits, [1, 2, 4, 8, 16, 30, 30, 30], strict=True):
        assert 0.8 * full <= wait <= full
    backoff.reset()
    assert backoff.next() <= 1
