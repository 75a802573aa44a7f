"""Start-up pieces every long-running command needs: the database to use (the
embedded server's when no DSN is set), the rules and notifiers read and
cross-checked, and the admin server beside a runner. ``slawatch run`` and the demo
both start this way.

Waiting for the database at start:

Start-up of ``slawatch run``: wait for the database instead of exiting.

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
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from psycopg import sql

from slawatch.config.calendars import load_calendars
from slawatch.config.notifiers import NotifierConfig, load_notifiers
from slawatch.config.rules import (
    Rule,
    check_calendar_names,
    check_notifier_names,
    load_rules,
    with_action_role,
)
from slawatch.config.settings import Settings, is_loopback, parse_bind
from slawatch.config.sources import SourceConfig, check_sources, load_sources
from slawatch.db import DatabaseUnavailable, connect, embedded_dsn, redact, with_database
from slawatch.errors import ConfigError
from slawatch.outage import Backoff

if TYPE_CHECKING:  # imported when used: a one-shot command loads no web server
    from slawatch.operate.admin import AdminServer
    from slawatch.runtime.scheduler import Runner

# The embedded server's database for `run`/`migrate` without a DSN (the demo's shop lives there).
EMBEDDED_DATABASE = "slawatch"


def load_config(settings: Settings) -> tuple[list[Rule], list[NotifierConfig]]:
    """Rules and notifiers from their folders, cross-checked (rules given their
    calendars); ConfigError otherwise."""
    notifiers = load_notifiers(settings.notifiers_dir)
    rules = with_action_role(load_rules(settings.rules_dir), settings.action_role)
    check_notifier_names(rules, {n.name for n in notifiers})
    calendars = load_calendars(
        settings.calendars_dir, required="calendars_dir" in settings.model_fields_set
    )
    check_calendar_names(rules, calendars)
    check_not_own_api(notifiers, settings.http)
    return rules, notifiers


def check_not_own_api(notifiers: list[NotifierConfig], http: str | None) -> None:
    """ConfigError when a notifier posts to slawatch's own admin API (``http``, the
    SLAWATCH_HTTP bind): no route there takes alerts, so every one would be refused
    and end dead (or, by way of an endpoint that takes them, make more alerts)."""
    bind = parse_bind(http or "")
    if bind is None:
        return
    errors = []
    for config in notifiers:
        target = config.http_target()
        if target is None:
            continue
        field, url = target
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # checked when loaded; nothing to compare
            continue
        if port == bind[1] and _same_host(host, bind[0]):
            errors.append(
                f"{config.source}: {field}: aims at slawatch's own admin API (SLAWATCH_HTTP "
                f"{http}), which takes no alerts: every one would be refused; give the "
                "receiver's address"
            )
    if errors:
        raise ConfigError("\n".join(errors))


def _same_host(url_host: str, bind_host: str) -> bool:
    """Whether a URL's host reaches a server bound to ``bind_host`` on this machine:
    the same name or address, ``localhost`` for a loopback address, any loopback
    address for a server bound to every interface."""
    a, b = url_host.lower().strip("[]"), bind_host.lower().strip("[]")
    if a == b:
        return True
    if b in ("0.0.0.0", "::"):
        return is_loopback(a)
    return is_loopback(a) and is_loopback(b) and "localhost" in (a, b)


def load_event_sources(settings: Settings, rules: list[Rule]) -> list[SourceConfig]:
    """The event sources (``sources/*.yaml``), checked against ``rules``; ConfigError
    otherwise. The default folder may be missing (no sources); a named one may not."""
    sources = load_sources(
        settings.sources_dir, required="sources_dir" in settings.model_fields_set
    )
    check_sources(sources, rules)
    return sources


def database_dsn(settings: Settings) -> str:
    """The DSN to use: the configured one, or the embedded server's (started if needed)."""
    if settings.dsn:
        return settings.dsn
    # One line, before the server starts: a forgotten SLAWATCH_DSN makes a database of
    # some 50 MB in the current folder, and the operator must see which folder.
    pgdata = (settings.data_dir / "pgdata").resolve()
    doing = "using" if (pgdata / "PG_VERSION").exists() else "creating"
    print(
        f"slawatch: no SLAWATCH_DSN: {doing} the embedded PostgreSQL in {pgdata}, "
        f"database {EMBEDDED_DATABASE!r} (where 'slawatch demo' keeps its shop)",
        file=sys.stderr,
    )
    return embedded_database(settings)


def embedded_database(settings: Settings) -> str:
    """The DSN of slawatch's database on the embedded server, both started/created if needed."""
    server = embedded_dsn(settings.data_dir)
    ensure_database(server, EMBEDDED_DATABASE)
    return with_database(server, EMBEDDED_DATABASE)


def ensure_database(server_dsn: str, name: str) -> None:
    """Create database ``name`` on the server unless it exists."""
    with connect(server_dsn) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def admin_bind(settings: Settings) -> tuple[str, int] | None:
    """Where the admin API listens (None: turned off); ConfigError when that is off
    loopback without ``SLAWATCH_API_TOKEN``: other machines would reach an API nobody
    guards (a container's 0.0.0.0, say), so it does not start at all."""
    bind = parse_bind(settings.http or "")
    if bind is not None and settings.api_token is None and not is_loopback(bind[0]):
        raise ConfigError(
            f"SLAWATCH_HTTP: {settings.http} is reachable from other machines: set "
            "SLAWATCH_API_TOKEN, or bind to loopback (127.0.0.1:8181)"
        )
    return bind


def start_admin(
    settings: Settings, dsn: str, runner: Runner, *, any_port: bool = False
) -> AdminServer | None:
    """The admin API and page beside ``runner`` on ``SLAWATCH_HTTP`` (None: turned off).

    ``any_port``: when that port is taken, take a free one on the same host instead of
    failing (the demo, which may run beside a ``slawatch run``).
    """
    from slawatch.operate.admin import serve_admin

    bind = admin_bind(settings)
    if bind is None:
        return None

    def serve(at: tuple[str, int]) -> AdminServer:
        return serve_admin(
            dsn,
            at,
            # Read per request: a reload (SIGHUP) shows at once.
            lambda: list(runner.rules.values()),
            lambda: list(runner.notifiers),
            token=settings.api_token.get_secret_value() if settings.api_token else None,
            timeout=settings.db_timeout,
            pooler=settings.pooler,
            health=runner.health,
            registry=runner.registry,
            ingest_token=(
                settings.ingest_token.get_secret_value() if settings.ingest_token else None
            ),
            retention=settings.retention,
            runner_metrics=runner.metrics,
            ingest_tokens=settings.ingest_tokens,
            public_url=settings.public_url,
            forwarded_allow_ips=settings.forwarded_allow_ips,
            outage=runner.db.outage,  # one line per database outage, not one per pool
            unmigrated=lambda: runner.unmigrated_types,
        )

    try:
        return serve(bind)
    except ConfigError:
        if not any_port:
            raise
        return serve((bind[0], 0))


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
