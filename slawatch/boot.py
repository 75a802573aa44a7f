"""Start-up of ``slawatch run``: wait for the database instead of exiting.

A monitor that must find its database up before it starts is quiet after every
joint restart (a host reboot, ``docker compose up``, a failover): the database
often answers seconds after slawatch starts. So ``run`` waits for it: one line
when it starts waiting (which database, and why it is not there), attempts again
with capped exponential backoff (1 s doubling to 30 s, with jitter), and one
line when the database answers.

Waited for (:class:`~slawatch.db.DatabaseUnavailable`): the server is not there
for us yet -- connection refused or timed out, its host name does not resolve
(a container not started yet), "the database system is starting up", too many
clients. Not waited for: the server answered and refused for a reason waiting
cannot change -- no such database or role, failed authentication, no CONNECT
privilege, a TLS mismatch (:func:`slawatch.db.refused`): a ``DatabaseError``
(exit 1) at once; and a DSN that cannot be parsed: a ``ConfigError`` (exit 2).

SIGTERM while waiting raises :class:`Terminated`, so that the caller exits
cleanly; SIGINT raises ``KeyboardInterrupt`` as everywhere.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

from slawatch.db import DatabaseUnavailable, redact
from slawatch.outage import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_WAIT = 1.0  # seconds before the second attempt
MAX_WAIT = 30.0  # seconds: the longest pause between attempts


class Terminated(BaseException):
    """SIGTERM arrived while waiting for the database.

    A ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` on the way
    out may take it for a failure of the attempt it interrupted.
    """


def when_reachable(
    dsn: str,
    start: Callable[[], T],
    *,
    within: float | None = None,
    first: float = FIRST_WAIT,
    cap: float = MAX_WAIT,
) -> T:
    """``start()``, attempted again while it raises ``DatabaseUnavailable``.

    ``start`` connects to ``dsn`` (building the runner does); every other error it
    raises goes to the caller at once. ``within``: seconds after which the last
    ``DatabaseUnavailable`` is raised, saying how long it waited (``run --once``);
    None: as long as it takes (``run``). The pauses double from ``first`` to ``cap``.
    Raises :class:`Terminated` on SIGTERM (when called from the main thread).
    """
    database = redact(dsn)
    began = time.monotonic()
    backoff = Backoff(first, cap)
    waiting = False
    with _terminate_raises():
        while True:
            try:
                result = start()
            except DatabaseUnavailable as exc:
                waited = time.monotonic() - began
                left = None if within is None else within - waited
                if left is not None and left <= 0:
                    if not waiting:
                        raise
                    raise DatabaseUnavailable(f"{exc} (waited {waited:.0f}s for it)") from exc
                # The DSN is said once, at the start of the line, not again in the reason.
                reason = str(exc).removeprefix(f"cannot connect to {database}: ")
                if not waiting:
                    waiting = True
                    log.warning(
                        "waiting for the database %s: %s (trying again, at most every %gs%s)",
                        database,
                        reason,
                        cap,
                        "" if within is None else f", for {within:g}s",
                        extra={"database": database, "reason": reason},
                    )
                else:
                    log.debug("still waiting for the database %s: %s", database, reason)
                pause = backoff.next()
                time.sleep(pause if left is None else min(pause, left))
                continue
            if waiting:
                waited = time.monotonic() - began
                log.info(
                    "database %s reachable after %.0fs of waiting: starting",
                    database,
                    waited,
                    extra={"database": database, "waited_s": round(waited, 1)},
                )
            return result


@contextmanager
def _terminate_raises() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (it cuts a
    connection attempt or a pause short); SIGHUP, which would end the process, is
    ignored: each attempt reads the rules and notifiers again anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    old = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, terminate),
        signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    }
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
