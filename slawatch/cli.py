"""The command line: parse, call one function, map errors to exit codes.

Exit codes: 0 ok, 2 bad configuration or usage, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from slawatch import __version__
from slawatch.errors import ConfigError, SlawatchError
from slawatch.logs import setup as setup_logging
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
    p = command("run", "scan rules and deliver alerts until stopped")
    p.add_argument(
        "--once", action="store_true", help="drain every rule once, make one delivery pass, exit"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="with --once: the summary as one JSON document on stdout "
        "(the console notifier's lines go to stderr)",
    )
    p = command("replay", "put dead deliveries back to pending")
    p.add_argument("--rule", help="only alerts of this rule")
    p.add_argument("--notifier", help="only deliveries to this notifier")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "json", False) and not args.once:
        parser.error("--json goes with --once")
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
