"""The command line: parse, call one function, map errors to exit codes.

Exit codes: 0 ok, 2 bad configuration or usage, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

from pydantic import ValidationError

from slawatch import __version__
from slawatch.config.files import shorten
from slawatch.config.settings import Settings
from slawatch.errors import BadInput, ConfigError, SlawatchError
from slawatch.logs import setup as setup_logging
from slawatch.operate.inspect import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    STATUSES,
    check_limit,
    check_rule_name,
    parse_cursor,
)

T = TypeVar("T")


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
        "--sources",
        metavar="DIR",
        type=Path,
        default=default,
        help="event sources folder (env SLAWATCH_SOURCES_DIR, default ./sources)",
    )
    parser.add_argument(
        "--calendars",
        metavar="DIR",
        type=Path,
        default=default,
        help="business calendars folder (env SLAWATCH_CALENDARS_DIR, default ./calendars)",
    )
    parser.add_argument(
        "--dsn",
        default=default,
        help="PostgreSQL to watch (env SLAWATCH_DSN; unset: the embedded server)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``slawatch: error: ...`` and exit 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"slawatch: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        "--drop-event-types",
        action="store_true",
        help="remove from slawatch.event() the event types of rules not in this folder"
        " (kept otherwise: the database may be using them)",
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
    p.add_argument(
        "--json",
        action="store_true",
        help="with --once: the summary as one JSON document on stdout (the console"
        " notifier's lines go to stderr); with --dry-run: the counts as JSON",
    )
    p = command("replay", "put dead and orphaned deliveries back to pending")
    p.add_argument("--rule", help="only alerts of this rule")
    p.add_argument(
        "--notifier",
        help="only deliveries to this notifier (also one removed from the configuration)",
    )
    p.add_argument(
        "--to",
        metavar="NAME",
        help="with --notifier: send its dead and orphaned deliveries to notifier NAME instead",
    )
    p.add_argument(
        "--actions",
        action="store_true",
        help="instead: run each failed action once more (recorded as its next attempt)",
    )
    p = command("actions", "the latest attempts of rules' actions, newest first")
    p.add_argument("--rule", type=_checked(check_rule_name), help="only actions of this rule")
    p.add_argument(
        "--status",
        choices=["ok", "failed", "skipped", "would_run", "pending", "retry"],
        help="only this status",
    )
    _json_option(p)
    p = command("status", "per rule: overdue now, notified, deliveries pending/dead, last scan")
    _json_option(p)
    p = command("alerts", "the latest alerts and their deliveries, newest first")
    p.add_argument("--rule", type=_checked(check_rule_name), help="only alerts of this rule")
    p.add_argument(
        "--status",
        choices=STATUSES,
        help="only alerts with a delivery in this status",
    )
    p.add_argument(
        "--since", metavar="TIME", help="fired at or after TIME (2026-03-01T12:00Z, or 1h, 2d ago)"
    )
    p.add_argument(
        "--limit",
        type=_checked(lambda t: check_limit(_int(t))),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"at most N alerts, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})",
    )
    p.add_argument(
        "--cursor",
        type=_checked(parse_cursor),
        metavar="C",
        help="the page after the one that printed this cursor",
    )
    _json_option(p)
    p = command(
        "report",
        "the SLA report: per rule and period, due, breached, compliance, open, lateness,"
        " time to acknowledge, actions",
    )
    p.add_argument("--rule", metavar="R", help="only this rule")
    p.add_argument(
        "--since", metavar="D", default="7d", help="how far back: a duration (default 7d)"
    )
    p.add_argument("--by", choices=["hour", "day", "week"], default="day", help="period")
    p.add_argument(
        "--format",
        choices=["table", "json", "csv", "html", "svg"],
        default="table",
        help="output format (html: one page with the chart; svg: the chart)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE instead of stdout, whole or not at all (-: stdout)",
    )
    p = command("explain", "the claim's plan for a rule; exit 1 if it would read the table whole")
    p.add_argument("rule", metavar="RULE", type=_checked(check_rule_name), help="a rule's name")
    _json_option(p)
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
    p = command(
        "event",
        "record an event for the event rules (as POST /v1/events does); prints accepted or"
        " duplicate",
    )
    p.add_argument("type", metavar="TYPE", help="the event's type, one a rule uses")
    p.add_argument("key", metavar="KEY", help="what it is about: an order, a host, a job")
    p.add_argument(
        "--at", metavar="T", help="when it happened: ISO 8601 with a zone (default: now)"
    )
    p.add_argument("--data", metavar="JSON", help="a JSON object, carried into the alert's row")
    p.add_argument(
        "--id",
        metavar="ID",
        help="the event's id: a repeat of TYPE and ID within a day is dropped (duplicate)",
    )
    p = command(
        "init", "write a starter configuration to edit: rules/, notifiers/, calendars/, sources/"
    )
    p.add_argument("directory", metavar="DIR", type=Path, help="where (made if missing)")
    p = command("demo", "embedded PostgreSQL + a sample shop; alerts printed as they fire")
    p.add_argument(
        "--seconds",
        type=_positive_float,
        default=None,
        metavar="N",
        help="stop after N seconds (default: until Ctrl-C)",
    )
    return parser


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def _int(text: str) -> int:
    if not text.strip().lstrip("-").isdigit() or len(text) > 20:
        raise BadInput(f"{shorten(text)} is not a whole number")
    return int(text)


def _checked(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a check that raises BadInput: its message, one line."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except BadInput as exc:
            # argparse names the argument itself: drop the check's own "field: ".
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None

    return parse


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
        "sources_dir": getattr(args, "sources", None),
        "calendars_dir": getattr(args, "calendars", None),
        "dsn": getattr(args, "dsn", None),
    }
    return settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.json and not (args.once or args.dry_run):
        parser.error("--json goes with --once or --dry-run")
    if args.command == "replay" and args.actions and (args.notifier or args.to):
        parser.error("--actions replays actions: it does not go with --notifier or --to")
    if args.command == "run" and args.once and args.dry_run:
        parser.error("--dry-run sends nothing: it does not go with --once")
    try:
        settings = settings_from(args)
        setup_logging(settings.log_level, settings.log_format)
        from slawatch import commands

        return commands.dispatch(args, settings)
    except SlawatchError as exc:
        for line in str(exc).splitlines():
            print(f"slawatch: error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`slawatch explain | head`): no traceback. Python
        # would report the failed flush of stdout at exit once more; point it at
        # /dev/null first (the recipe in the signal module's documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
