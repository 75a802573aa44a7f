"""Waiting in tests: on an observable condition, bounded; never a bare sleep that
assumes another thread or process got somewhere by now."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import psycopg
import pytest

WAIT = 60.0  # seconds: generous for a slow machine; a passing test waits far less


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def lock_waits(conn: psycopg.Connection[Any]) -> list[str]:
    """What each other session of this database is blocked on now, when it waits for a
    heavyweight lock (``advisory``, ``tuple``, ``transactionid``, ``relation``, ...):
    PostgreSQL's own word that it waits, not a guess from how long it has been."""
    rows = conn.execute(
        "SELECT wait_event FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' ORDER BY wait_event"
    ).fetchall()
    return [str(r[0]) for r in rows]


class Lines:
    """The lines of a text stream (a child process's stdout or stderr), read by a thread
    as they come, so that a test can wait for one without blocking for good."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)  # the stream ended

    def wait_for(self, text: str, timeout: float = WAIT) -> str:
        """The first line (read so far or to come) that contains ``text``."""
        for line in self.lines:
            if text in line:
                return line
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                new: str | None = self._new.get(timeout=left)
            except queue.Empty:
                break
            if new is None:
                pytest.fail(f"the stream ended without a line containing {text!r}:\n{self}")
            self.lines.append(new)
            if text in new:
                return new
        pytest.fail(f"no line containing {text!r} within {timeout:g}s:\n{self}")

    def rest(self, timeout: float = WAIT) -> str:
        """Everything, once the stream has ended (the process exited)."""
        self._thread.join(timeout)
        while True:
            try:
                line = self._new.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return str(self)

    def __str__(self) -> str:
        return "\n".join(self.lines)
