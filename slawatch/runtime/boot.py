"""Start-up pieces every long-running command needs: the database to use (the
embedded server's when no DSN is set), the rules and notifiers read and
cross-checked, and the admin server beside a runner. ``slawatch run`` and the demo
both start this way."""

from __future__ import annotations

import sys

from psycopg import sql

from slawatch.config.notifiers import NotifierConfig, load_notifiers
from slawatch.config.rules import Rule, check_notifier_names, load_rules
from slawatch.config.settings import Settings, parse_bind
from slawatch.db import connect, embedded_dsn, with_database
from slawatch.errors import ConfigError
from slawatch.operate.admin import AdminServer, serve_admin
from slawatch.runtime.scheduler import Runner

# The embedded server's database for `run`/`migrate` without a DSN (the demo's shop lives there).
EMBEDDED_DATABASE = "slawatch"


def load_config(settings: Settings) -> tuple[list[Rule], list[NotifierConfig]]:
    """Rules and notifiers from their folders, cross-checked; ConfigError otherwise."""
    notifiers = load_notifiers(settings.notifiers_dir)
    rules = load_rules(settings.rules_dir)
    check_notifier_names(rules, {n.name for n in notifiers})
    return rules, notifiers


def database_dsn(settings: Settings) -> str:
    """The DSN to use: the configured one, or the embedded server's (started if needed)."""
    if settings.dsn:
        return settings.dsn
    print(
        f"slawatch: no SLAWATCH_DSN: using the embedded PostgreSQL in {settings.data_dir}/pgdata, "
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


def start_admin(
    settings: Settings, dsn: str, runner: Runner, *, any_port: bool = False
) -> AdminServer | None:
    """The admin API and page beside ``runner`` on ``SLAWATCH_HTTP`` (None: turned off).

    ``any_port``: when that port is taken, take a free one on the same host instead of
    failing (the demo, which may run beside a ``slawatch run``).
    """
    bind = parse_bind(settings.http or "")
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
        )

    try:
        return serve(bind)
    except ConfigError:
        if not any_port:
            raise
        return serve((bind[0], 0))
