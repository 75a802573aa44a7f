"""Outages and backoff: how a long-running loop fails without dying or flooding the log.

An :class:`Outage` tracks one thing slawatch depends on (the database, a
notifier's receiver, a rule's scans). Many threads may report failures and
successes; the log gets one line when the outage starts and one when it ends,
however many attempts failed in between. A failure of an attempt that began
before the latest success (or within ``grace`` seconds after it) is a straggler
of an outage that just ended, or a blip, not a new outage: it is logged at
DEBUG only -- unless failures go on, with no success between, for ``after``
seconds: then it is an outage all the same (a database down for 15 s is logged
although every failure came within a 30 s pool timeout of the last success).
"""

from __future__ import annotations

import logging
import random
import threading
import time

# Seconds of failures without a success after which the database is said to be
# unreachable however recent its last success (docs/how-to/operate.md).
UNREACHABLE_AFTER = 5.0


class Outage:
    """One line when ``what`` starts failing, one when it works again (thread-safe).

    ``down`` and ``up`` are the words of the two lines, e.g. ``"unreachable"``
    and ``"reachable again"``: ``database unreachable: claim for rule late: ...``
    then ``database reachable again after 42s``. ``grace``: seconds after a
    success during which a new failure does not start an outage (a pool may
    still be reconnecting while another caller already got through). ``after``:
    seconds of failures with no success between after which a failure starts an
    outage even within the grace (None: never); its line says for how long. The
    end's line says how long since the first failure with no success between.
    """

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        *,
        down: str = "failing",
        up: str = "working again",
        level: int = logging.ERROR,
        grace: float = 0.0,
        after: float | None = None,
    ) -> None:
        self.what, self.log, self.down_words, self.up_words = what, logger, down, up
        self.level, self.grace, self.after = level, grace, after
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._failing_since: float | None = None  # the first failure since the last success
        self._last_ok = float("-inf")
        self.started = 0  # outages started so far (a metric)

    @property
    def down(self) -> bool:
        """True between the first failure and the next success."""
        return self._down_since is not None

    @property
    def failing(self) -> bool:
        """True between any failure (an outage's or not yet) and the next success."""
        return self._failing_since is not None

    def failed(
        self, reason: str, since: float | None = None, *, exc_info: BaseException | None = None
    ) -> bool:
        """Report a failed attempt that began at ``since`` (``time.monotonic()``).

        Returns True when this failure started an outage (and was logged).
        ``exc_info``: an unexpected exception whose traceback belongs in the log.
        """
        with self._lock:
            now = time.monotonic()
            started = since if since is not None else now
            if self._failing_since is None:
                self._failing_since = now
            failing = now - self._failing_since
            long = self.after is not None and failing >= self.after
            if self._down_since is not None or (started < self._last_ok + self.grace and not long):
                self.log.debug("%s %s: %s", self.what, self.down_words, reason)
                return False
            self._down_since = self._failing_since if long else now
            self.started += 1
        if long:
            self.log.log(
                self.level,
                "%s %s for %.0fs: %s",
                self.what,
                self.down_words,
                failing,
                reason,
                exc_info=exc_info,
            )
        else:
            self.log.log(
                self.level, "%s %s: %s", self.what, self.down_words, reason, exc_info=exc_info
            )
        return True

    def ok(self) -> None:
        """Report a successful attempt; ends the outage (one line) if there was one."""
        with self._lock:
            self._last_ok = now = time.monotonic()
            # How long it failed: from the first failure since the last success,
            # which may precede the failure that started (and logged) the outage.
            since = self._failing_since if self._down_since is not None else None
            self._down_since = self._failing_since = None
        if since is not None:
            self.log.info("%s %s after %.0fs", self.what, self.up_words, now - since)


class Backoff:
    """Doubling waits with jitter, from ``first`` up to ``cap`` seconds."""

    def __init__(self, first: float = 1.0, cap: float = 30.0) -> None:
        self.first, self.cap = first, cap
        self._failures = 0

    def next(self) -> float:
        """The wait after one more failure."""
        self._failures += 1
        wait = min(self.first * float(1 << min(self._failures - 1, 30)), self.cap)
        # Jitter keeps the workers of many processes from retrying in step.
        return wait * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        """After a success: the next failure waits ``first`` again."""
        self._failures = 0
