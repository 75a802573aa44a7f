"""What each CLI command does, in terms of the library's functions."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import os
import re
import stat
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from pydantic import BaseModel

from slawatch.clock import Clock
from slawatch.config.durations import format_duration
from slawatch.config.files import shorten
from slawatch.config.rules import Rule, action_targets, load_rules
from slawatch.config.settings import Settings
from slawatch.db import (
    Connection,
    Database,
    connect,
    redact,
)
from slawatch.delivery.dispatcher import replay_deliveries, replay_problem
from slawatch.engine import generation
from slawatch.engine.baseline import recorded, select
from slawatch.engine.baseline import render_all as render_baselines
from slawatch.engine.catalog import TableInfo, broad_role
from slawatch.engine.due import RuleDue, count_due
from slawatch.engine.migrate import (
    check,
    event_function_pending,
    kept_event_types,
    leftovers,
    migrate_checked,
    pending,
    plan,
    render,
    require_schema,
    schema_current,
)
from slawatch.errors import BadInput, ConfigError, DatabaseError, DeliveryError, NotFound
from slawatch.operate.chart import as_html as sla_html
from slawatch.operate.chart import as_svg as sla_svg
from slawatch.operate.explain import explain
from slawatch.operate.inspect import events_text, list_alerts, parse_since, rules_report
from slawatch.operate.report import check_format
from slawatch.operate.report import query as report_query
from slawatch.operate.report import render as render_report
from slawatch.operate.report import report as sla_report
from slawatch.runtime.boot import (
    admin_bind,
    database_dsn,
    load_config,
    load_event_sources,
    start_admin,
)

if TYPE_CHECKING:
    from slawatch.delivery.dispatcher import Replayed
    from slawatch.operate.lifecycle import Silence

log = logging.getLogger(__name__)


def dispatch(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "check":
        return cmd_check(settings)
    if args.command == "migrate":
        return cmd_migrate(
            settings,
            args.print_only,
            args.baseline,
            args.rule,
            drop_event_types=args.drop_event_types,
        )
    if args.command == "run":
        if args.dry_run:
            return cmd_dry_run(settings, args.json)
        return cmd_run(settings, args.once, args.json)
    if args.command == "replay" and args.actions:
        return cmd_replay_actions(settings, args.rule)
    if args.command == "actions":
        return cmd_actions(settings, args.rule, args.status, args.json)
    if args.command == "replay":
        return cmd_replay(settings, args.rule, args.notifier, args.to)
    if args.command == "status":
        return cmd_status(settings, args.json)
    if args.command == "alerts":
        return cmd_alerts(
            settings,
            rule=args.rule,
            status=args.status,
            since=args.since,
            limit=args.limit,
            cursor=args.cursor,
            as_json=args.json,
        )
    if args.command == "report":
        return cmd_report(settings, args.rule, args.since, args.by, args.format, args.output)
    if args.command == "explain":
        return cmd_explain(settings, args.rule, args.json)
    if args.command == "ack":
        return cmd_ack(settings, args.alert, args.by, args.comment, args.json)
    if args.command == "silence":
        return cmd_silence(settings, args)
    if args.command == "init":
        return cmd_init(args.directory)
    if args.command == "demo":
        from slawatch.demo import run_demo  # the web server and scheduler: only here

        return run_demo(settings, args.seconds)
    if args.command == "event":
        return cmd_event(settings, args.type, args.key, at=args.at, data=args.data, ident=args.id)
    raise ConfigError(f"unknown command {args.command!r}")  # argparse stops this earlier


def cmd_init(directory: Path) -> int:
    """Write the starter configuration and say what to do next."""
    from slawatch.config.starter import write_starter

    written = write_starter(directory)
    print(f"wrote {len(written)} files:")
    print("\n".join(f"  {path}" for path in written))
    dsn = "postgresql://user@host/db"
    print(
        f"next: edit {directory / 'rules'}/ for a table of yours (and notifiers/), then\n"
        f"  cd {directory}\n"
        f"  slawatch --dsn {dsn} check     # the tables, columns and conditions exist?\n"
        f"  slawatch --dsn {dsn} migrate   # tracking columns and partial indexes\n"
        f"  slawatch --dsn {dsn} run"
    )
    return 0


def cmd_check(settings: Settings) -> int:
    """Validate the files; with a database also the tables, conditions, pending
    migrations, and how many rows the next scan would notify."""
    rules, notifiers = load_config(settings)
    what = f"{len(rules)} rules, {len(notifiers)} notifiers"
    sources = load_event_sources(settings, rules)
    if sources:
        what += f", {len(sources)} sources"
    if not settings.dsn:
        print(
            f"ok: {what} (files only; set SLAWATCH_DSN or --dsn to check them against a database)"
        )
        return 0
    now = Clock().now()
    with connect(settings.dsn, pooler=settings.pooler) as conn:
        tables = check(conn, rules)
        lines, unready = [], []
        schema = schema_current(conn)
        baselined = recorded(conn)
        stale_function = set(event_function_pending(conn, rules))
        records = generation.recorded(conn)
        for rule in rules:
            info = tables.get(rule.name)
            if info is None:  # an event rule whose timer table migrate creates
                unready.append(rule.name)
                lines.append(f"  {rule.name}: not migrated: no timer table slawatch.{rule.timers}")
                continue
            todo = pending(conn, rule, info)
            if rule.name in stale_function:
                todo.append("slawatch.event() does not know its event types yet")
            differs = generation.unrecorded(rule, records.get(rule.name))
            if differs:
                todo.append(differs)
            due = count_due(conn, rule, info, now)
            count = "could not count in 30 s" if due is None else f"{due:,}"
            if due is not None and due >= 1_000_000:
                count = "1,000,000 or more"
            what_due = "timers" if rule.events is not None else "rows"
            line = f"  {rule.name}: {count} {what_due} would be notified on the next scan"
            if rule.name in baselined:
                b = baselined[rule.name]
                line += f" (baseline: {b.rows:,} rows marked as seen, {b.at:%Y-%m-%d %H:%M %Z})"
            lines.append(line)
            if todo:
                unready.append(rule.name)
                lines.append(f"    not migrated: {'; '.join(todo)}")
            elif rule.query is not None:
                # Its cost is the query's, paid at each scan: say when it reads a large
                # table whole (explain shows the plan).
                verdict = explain(conn, rule, now, rules, outbox=settings.outbox)
                if not verdict.ok:
                    lines.append(f"  {rule.name}: note: {verdict.verdict}")
        refused, notes = _check_actions(conn, rules)
        role, broad = broad_role(conn)
    if broad is not None:
        notes.append(
            f"  note: slawatch connects as {role}, {broad}: only slawatch's checks bound"
            " what a rule's SQL may read and run, not the database (connect as a role with"
            " what 'migrate --print' grants: docs/explanation/safety.md)"
        )
    if refused:
        print(
            f"refused: {what} are valid, but {_many(len(refused), 'action')} cannot run as"
            " the role slawatch connects as (migrate --print prints the GRANTs they need):"
        )
        print("\n".join(refused + notes))
        return 2
    lines += notes
    if unready or not schema:
        names = ", ".join(unready) or "slawatch's own schema"
        print(f"not ready: {what} are valid, but 'slawatch run' needs 'slawatch migrate' first")
        print(f"  ({names})")
        print("\n".join(lines))
        return 1
    print(f"ok: {what}, checked against {redact(settings.dsn)}")
    print("\n".join(lines))
    return 0


def _check_actions(conn: Connection, rules: list[Rule]) -> tuple[list[str], list[str]]:
    """``check``'s lines about actions (docs/explanation/actions.md): each rule whose action
    the role cannot run, with the server's reason; a note for each ``track: table`` rule whose
    action writes the table it watches."""
    from slawatch.actions.verify import refused, writes_watched

    problems = [f"  {r.rule}: action: {r.reason}" for r in refused(conn, rules)]
    notes = [
        f"  {rule.name}: note: its action writes {rule.table}, which slawatch itself never"
        " writes (track: table)"
        for rule in rules
        if rule.track == "table" and writes_watched(conn, rule)
    ]
    return problems, notes


def cmd_migrate(
    settings: Settings,
    print_only: bool,
    baseline: bool = False,
    only: list[str] | None = None,
    *,
    drop_event_types: bool = False,
) -> int:
    """Migrate; with ``baseline``, then mark what is overdue now as seen (``only``: those
    rules). Event types of rules not in the folder stay unless ``drop_event_types``."""
    rules, _ = load_config(settings)
    if only and not baseline:
        raise ConfigError("migrate: --rule goes with --baseline")
    chosen = select(rules, only or [], str(settings.rules_dir)) if baseline else []
    if print_only:
        if not settings.dsn:
            if baseline:
                raise ConfigError(
                    "migrate --print --baseline needs a database (SLAWATCH_DSN or --dsn): the"
                    " script is made from the tables' keys and deadline types"
                )
            sys.stdout.write(render(rules))
            return 0
        with connect(settings.dsn, pooler=settings.pooler) as conn:
            tables = check(conn, rules)
            steps = plan(conn, rules, drop_event_types=drop_event_types, tables=tables)
            sys.stdout.write(render(rules, steps, leftovers(conn, rules)))
            if not drop_event_types:
                for line in kept_event_types(conn, rules):
                    print(f"-- {line}")
        if baseline:
            sys.stdout.write("\n" + render_baselines(chosen, tables, Clock().now()))
        return 0
    dsn = database_dsn(settings)
    with connect(dsn, pooler=settings.pooler) as conn:
        done, tables = migrate_checked(conn, rules, drop_event_types=drop_event_types)
        for line in done:
            print(line)
        for line in kept_event_types(conn, rules):
            print(line)
        print(f"ok: {len(rules)} rules migrated" + ("" if done else " (nothing to change)"))
        for left in leftovers(conn, rules):
            print(f"{left.what}\n  {left.statement}")
        if baseline:
            # The tables as the migrate's check read and probed them (a migrate changes
            # no key, kind or deadline type); an event rule's timer table it created, now.
            unread = [rule for rule in chosen if rule.name not in tables]
            tables = {**tables, **(check(conn, unread) if unread else {})}
            run_baselines(conn, chosen, tables, Clock().now())
    return 0


def run_baselines(
    conn: Connection, rules: list[Rule], tables: dict[str, TableInfo], now: datetime
) -> None:
    """Baseline each rule, printing progress (at most a line a second) and the totals."""
    from slawatch.engine.baseline import Progress, baseline_rule

    shown = [0.0]

    def progress(p: Progress) -> None:
        if p.finished:
            print(
                f"baseline: {p.rule}: {p.rows:,} rows marked as seen"
                f" ({p.batches} batch{'es' if p.batches != 1 else ''}, {p.seconds:.1f} s)",
                flush=True,
            )
        elif time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            print(f"baseline: {p.rule}: {p.rows:,} rows so far...", flush=True)

    total = 0
    for rule in rules:
        total += baseline_rule(conn, rule, tables[rule.name], now, progress=progress)
    print(
        f"ok: baseline of {len(rules)} rules: {total:,} rows overdue at {now:%Y-%m-%d %H:%M:%S%z}"
        " marked as seen; the next scans page only for what falls due from now on"
    )


def cmd_run(settings: Settings, once: bool, as_json: bool = False) -> int:
    """Scan and deliver until stopped (SIGHUP reloads); ``--once``: one drain and one
    delivery pass, then a summary per rule and notifier (``--json``: one JSON document).

    ``--once`` fails (exit 1) when a database error happened or a delivery went dead.

    Start-up waits for a database that is not there yet (slawatch/runtime/boot.py): ``run`` as
    long as it takes, ``--once`` at most ``SLAWATCH_DB_TIMEOUT``. SIGTERM while waiting
    exits 0 (``run``: as when running) or 143 (``--once``: it did not do its pass).
    """
    from slawatch.runtime.boot import Terminated, when_reachable
    from slawatch.runtime.scheduler import Runner

    # A bad file (or an unguarded admin API) is exit 2 at once, before any database.
    if not once:
        admin_bind(settings)
    load_event_sources(settings, load_config(settings)[0])
    dsn = database_dsn(settings)

    def start() -> Runner:
        # Read again at each attempt: a wait may be long, and SIGHUP meanwhile is ignored.
        rules, notifiers = load_config(settings)
        return Runner(
            dsn,
            rules,
            notifiers,
            timeout=settings.db_timeout,
            pooler=settings.pooler,
            retention=settings.retention,
            dedupe_window=settings.dedupe_window,
            load=lambda: load_config(settings),
            admin_url=settings.admin_url,
            actions=settings.actions,
            sources=load_event_sources(settings, rules),
            scan_connections=settings.scan_connections,
            outbox=settings.outbox,
        )

    try:
        runner = when_reachable(dsn, start, within=settings.db_timeout if once else None)
    except Terminated:
        log.info("stopped by SIGTERM while waiting for the database")
        return 143 if once else 0
    admin = None
    try:
        if not once:
            admin = start_admin(settings, dsn, runner)
            runner.serve(http=admin.url if admin is not None else None)
            return 0
        if as_json:
            # stdout carries the one JSON document: the console notifier writes to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                result = runner.once()
        else:
            result = runner.once()
    finally:
        if admin is not None:
            admin.stop()
        runner.close()
    if as_json:
        print(json.dumps(result.as_json()))
    else:
        print("\n".join(result.lines()))
    if result.errors:
        more = f" (and {len(result.errors) - 1} more errors)" if len(result.errors) > 1 else ""
        raise DatabaseError(result.errors[0] + more)
    if result.delivered.dead:
        raise DeliveryError(
            f"{result.delivered.dead} deliveries went dead (see the log above; "
            "'slawatch replay' sends them again)"
        )
    return 0


def _many(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def cmd_dry_run(settings: Settings, as_json: bool) -> int:
    """Per rule, what ``run --once`` would send now, and to which notifiers: counted
    in a read-only transaction, so nothing is sent or written (slawatch/engine/due.py)."""
    from slawatch.engine.due import dry_run
    from slawatch.engine.ready import prepare_all

    rules, _ = load_config(settings)
    now = Clock().now()
    with connect(database_dsn(settings), pooler=settings.pooler) as conn:
        prepare_all(conn, rules)  # refuses what 'run' would refuse (not migrated, ...)
        counts = dry_run(conn, rules, now)
        records = generation.recorded(conn)
    # What 'run' with these files would not claim at all (docs/how-to/rolling-deploys.md).
    stale = {r.name: generation.unrecorded(r, records.get(r.name)) for r in rules}
    total = sum(c.due.alerts for c in counts if c.due is not None)
    per_notifier: dict[str, int] = {}
    for c in counts:
        for name, n in (c.due.deliveries(c.rule) if c.due is not None else {}).items():
            per_notifier[name] = per_notifier.get(name, 0) + n
    if as_json:
        report = {
            "at": now.isoformat(),
            "rules": [c.to_dict() for c in counts],
            "alerts": total,
            "deliveries": dict(sorted(per_notifier.items())),
        }
        print(json.dumps(report))
        return 0

    def to(deliveries: dict[str, int]) -> str:
        sent = ", ".join(f"{name} {n:,}" for name, n in sorted(deliveries.items()) if n)
        return f" -> {sent}" if sent else ""

    print(f"dry run at {now:%Y-%m-%d %H:%M:%S %Z}: nothing sent, nothing written")
    for c in counts:
        if c.due is None:
            print(f"  {c.rule.name}: could not count in 30 s")
            continue
        d = c.due
        renotify = sum(d.again.values())
        kinds = f"{d.first:,} first, {renotify:,} re-notifications"
        if c.rule.resolve:
            kinds += f", {sum(d.resolved.values()):,} resolved"
        print(f"  {c.rule.name}: {_many(d.alerts, 'alert')} ({kinds}){to(d.deliveries(c.rule))}")
        _print_acts(c)
        if stale[c.rule.name]:
            print(f"    but {stale[c.rule.name]}")
    deliveries = _many(sum(per_notifier.values()), "delivery", "deliveries")
    print(f"total: {_many(total, 'alert')}, {deliveries}{to(per_notifier)}")
    return 0


def _print_acts(c: RuleDue) -> None:
    """``run --dry-run``'s lines for the action of rule ``c``: the statement, and the
    values it would be bound to for each due row whose notification triggers it."""
    action = c.rule.action
    if action is None:
        return
    if c.acts is None:
        print(f"    action: could not read the due rows in 30 s: {action.sql}")
        return
    rows, total = c.acts
    print(f"    action on #{c.rule.action_on}, would run {_many(total, 'time')}: {action.sql}")
    for a in rows:
        values = ", ".join(f"{k}={json.dumps(v)}" for k, v in a.params.items())
        print(f"      key {a.key}: {values}")
    if total > len(rows):
        print(f"      ... and {total - len(rows):,} more")


def cmd_replay(
    settings: Settings, rule: str | None, notifier: str | None, to: str | None = None
) -> int:
    """Dead and orphaned deliveries back to pending (``to``: to that notifier instead of
    ``notifier``); a running slawatch sends them at once."""
    rules, notifiers = load_config(settings)
    if rule is not None and rule not in {r.name for r in rules}:
        raise ConfigError(f"--rule: no rule named {rule!r} in {settings.rules_dir}")
    # A webhook action's deliveries go to its rule's target (action:<rule>).
    configured = {n.name for n in [*notifiers, *action_targets(rules)]}
    now = Clock().now()
    dsn = database_dsn(settings)
    with Database(dsn, size=1, timeout=settings.db_timeout, pooler=settings.pooler) as db:

        def work(conn: Connection) -> Replayed:
            problem = replay_problem(conn, notifier, to, configured, "--")
            if problem is not None:
                raise ConfigError(f"{problem} (in {settings.notifiers_dir})")
            return replay_deliveries(conn, now, rule, notifier, to=to, configured=configured)

        done = db.run("replay", work)
    what = f"{done.dead} dead" + (f" and {done.orphaned} orphaned" if done.orphaned else "")
    print(f"ok: {what} deliveries back to pending" + (f", to {to}" if to else ""))
    if done.resolved:
        print(f"{_many(done.resolved, 'resolved notice')} of their episodes sent again after them")
    if done.taken:
        print(f"{_many(done.taken, 'delivery', 'deliveries')} left: the alert went to {to} already")
    if done.left:
        print(
            f"{_many(done.left, 'delivery', 'deliveries')} left: their notifier is not configured"
            " (replay --notifier OLD --to NEW sends them to another)"
        )
    return 0


# ------------------------------------------------- actions (docs/explanation/actions.md)


def cmd_actions(settings: Settings, rule: str | None, status: str | None, as_json: bool) -> int:
    """The latest attempts of rules' actions, newest first."""
    from slawatch.actions.history import list_actions

    with _lifecycle_db(settings) as db:
        listed = db.run("listing actions", lambda c: list_actions(c, rule, status))
    if as_json:
        _print_json(listed)
        return 0
    if not listed.actions:
        print("no actions recorded" + (f" for rule {rule}" if rule else ""))
        return 0
    table = [
        [
            _when(a.at),
            a.rule,
            a.key,
            f"e{a.episode}:n{a.n}",
            str(a.attempt),
            a.status,
            "-" if a.rows is None else str(a.rows),
            a.error or "",
        ]
        for a in listed.actions
    ]
    header = ["AT", "RULE", "KEY", "ALERT", "TRY", "STATUS", "ROWS", "ERROR"]
    print(_table(header, table, right={4, 6}))
    return 0


def cmd_replay_actions(settings: Settings, rule: str | None) -> int:
    """Each failed action once more (``SLAWATCH_ACTIONS=off``/``dry-run``: only counted)."""
    from slawatch.actions.history import replay_actions

    rules, _ = load_config(settings)
    named = {r.name: r for r in rules}
    if rule is not None and rule not in named:
        raise ConfigError(f"--rule: no rule named {rule!r} in {settings.rules_dir}")
    if rule is not None and named[rule].action is None:
        raise ConfigError(f"--rule: rule {rule!r} has no action")
    with _lifecycle_db(settings) as db:
        done = replay_actions(db, rules, Clock().now(), settings.actions, rule)
    if settings.actions != "on":
        print(
            f"SLAWATCH_ACTIONS={settings.actions}: {_many(done.would_run, 'failed action')}"
            " would run again; nothing done"
        )
        return 0
    queued = (
        f"; {_many(done.queued, 'webhook action')} to be sent again (a running slawatch sends them)"
        if done.queued
        else ""
    )
    print(f"ok: {done.ok} actions ran again, {done.failed} failed again{queued}")
    return 0 if done.failed == 0 else 1


# ---------------------------------------------------------------- what an operator reads


def _print_json(model: BaseModel) -> None:
    print(model.model_dump_json(indent=2))


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; the columns in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _age(seconds: float) -> str:
    """``1h5m``: a duration's two largest units, for a table cell."""
    text = format_duration(timedelta(seconds=int(seconds)))
    return "".join(re.findall(r"\d+[wdhms]", text)[:2])


def _when(t: datetime | None) -> str:
    return "-" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _count(value: int | None, capped: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:,}+" if capped else f"{value:,}"


def cmd_status(settings: Settings, as_json: bool) -> int:
    """Per rule: overdue now (and of those, not yet notified), open episodes awaiting a
    re-notification, deliveries pending/dead, the last scan."""
    rules, _ = load_config(settings)
    now = Clock().now()
    with connect(database_dsn(settings), pooler=settings.pooler) as conn:
        report = rules_report(conn, rules, now)
    if as_json:
        _print_json(report)
        return 0
    rows, notes = [], []
    for r in report.rules:
        scan = r.last_scan
        rows.append(
            [
                r.name,
                "events" if r.events is not None else r.track,
                _count(r.overdue, r.overdue_capped),
                _count(r.not_notified, r.not_notified_capped),
                _count(r.notified),
                _count(r.pending),
                _count(r.dead),
                "-" if r.oldest_pending_seconds is None else _age(r.oldest_pending_seconds),
                "never" if scan is None else f"{_age((now - scan.at).total_seconds())} ago",
                "-" if scan is None else f"{scan.duration_ms:,}ms",
                "-" if scan is None else ("failed" if scan.error else f"{scan.claimed:,}"),
            ]
        )
        if r.problem:
            notes.append(f"{r.name}: {r.problem}")
        if r.definition:
            notes.append(f"{r.name}: {r.definition}")
        if scan is not None and scan.error:
            notes.append(f"{r.name}: last scan failed: {scan.error}")
        if r.abandoned:
            notes.append(
                f"{r.name}: {_many(r.abandoned, 'episode', 'episodes')} abandoned (open longer"
                " than give_up_after)"
            )
        if r.orphaned:
            notes.append(
                f"{r.name}: {_many(r.orphaned, 'delivery', 'deliveries')} orphaned (notifier"
                " removed): 'slawatch replay --notifier OLD --to NEW' sends them to another"
            )
    for kind, count in report.held_events.items():
        notes.append(
            f"events held: {_many(count, 'event')} of type {kind!r}, which no rule knows:"
            " 'slawatch migrate' with a rule for it applies them"
        )
    header = ["RULE", "TRACK", "OVERDUE", "UNNOTIFIED", "NOTIFIED", "PENDING", "DEAD"]
    header += ["OLDEST PENDING", "LAST SCAN", "TOOK", "ALERTS"]
    print(_table(header, rows, right=set(range(2, 11))))
    for note in notes:
        print(note)
    return 0


def cmd_report(
    settings: Settings, rule: str | None, since: str, by: str, fmt: str, output: str | None = None
) -> int:
    """The SLA report (operate/report.py) for the configured rules; ``html`` and ``svg``
    draw its chart (operate/chart.py). ``output``: a file to write instead of stdout."""
    rules, _ = load_config(settings)
    wanted = report_query(rules, rule=rule, since=since, by=by, now=Clock().now())
    with connect(database_dsn(settings), pooler=settings.pooler) as conn:
        got = sla_report(conn, wanted)
    if fmt == "html":
        text = sla_html(got)
    elif fmt == "svg":
        text = sla_svg(got) + "\n"
    else:
        text = render_report(got, check_format(fmt)) + "\n"
    if output is None or output == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_whole(Path(output), text)
    except OSError as exc:
        raise BadInput(f"--output: {shorten(output)}: {exc.strerror or exc}") from None
    print(f"wrote {output}")
    return 0


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: written beside it under a temporary
    name, then renamed over it, so a write that fails (a full disk, a size limit) leaves
    the file that was there. A symbolic link is written through (the link stays); what is
    not a regular file (a FIFO, /dev/stdout, a directory) is written to directly."""
    if path.exists() and not path.is_file():
        path.write_text(text, encoding="utf-8")
        return
    target = path.resolve() if path.is_symlink() else path
    if target.exists():
        mode = stat.S_IMODE(target.stat().st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".slawatch-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_alerts(
    settings: Settings,
    *,
    rule: str | None,
    status: str | None,
    since: str | None,
    limit: int,
    cursor: int | None,
    as_json: bool,
) -> int:
    """The latest alerts, newest first, with their deliveries."""
    since_at = None if since is None else parse_since(since, Clock().now())
    dsn = database_dsn(settings)
    with connect(dsn, pooler=settings.pooler) as conn:
        page = list_alerts(
            conn, rule=rule, status=status, since=since_at, cursor=cursor, limit=limit
        )
    if as_json:
        _print_json(page)
        return 0
    if not page.alerts:
        print("no alerts")
        return 0
    rows = [
        [
            str(a.id),
            _when(a.fired_at),
            a.rule,
            shorten(a.key, 30) if len(a.key) > 28 else a.key,
            str(a.episode),
            str(a.n),
            a.severity,
            " ".join(
                f"{d.notifier}:{d.status}"
                + (
                    f"(in {d.summary_id})"  # the storm summary sent in its place
                    if d.summary_id is not None
                    else f"({d.attempts})"
                    if d.status != "sent"
                    else ""
                )
                for d in a.deliveries
            ),
        ]
        for a in page.alerts
    ]
    header = ["ID", "FIRED", "RULE", "KEY", "EP", "N", "SEVERITY", "DELIVERIES"]
    print(_table(header, rows, right={0, 4, 5}))
    if page.next_cursor is not None:
        print(f"more: add --cursor {page.next_cursor} for the next page")
    return 0


def cmd_explain(settings: Settings, name: str, as_json: bool) -> int:
    """The claim's plan for rule ``name``; exit 1 when a scan would read its table whole."""
    rules, _ = load_config(settings)
    rule = next((r for r in rules if r.name == name), None)
    if rule is None:
        raise ConfigError(f"no rule named {name!r} in {settings.rules_dir}")
    with connect(database_dsn(settings), pooler=settings.pooler) as conn:
        result = explain(conn, rule, Clock().now(), rules, outbox=settings.outbox)
    if as_json:
        _print_json(result)
        return 0 if result.ok else 1
    what = f"on {result.table} (track: {result.track})"
    if rule.events is not None:  # its table is slawatch's own
        what = f"on events: {events_text(rule)} (timers: {result.table})"
    print(f"rule {result.rule} {what}, at {_when(result.at)}")
    if result.outbox == "rows":
        print("outbox: rows (SLAWATCH_OUTBOX; docs/explanation/outbox-rows.md)")
    if rule.calendar is not None:
        print(
            f"after: {format_duration(rule.after)} of working time (calendar {rule.calendar}):"
            f" due now if {rule.deadline} <"
            f" {rule.cutoff(result.at).astimezone(UTC).isoformat(sep=' ').replace('+00:00', 'Z')}"
        )
    for step in result.statements:
        print(f"\n-- {step.name} --")
        print(step.sql)
        print("-- with " + ", ".join(f"{k} = {v}" for k, v in step.params.items()))
        print(f"\n{step.text}")
    print(f"\n{result.verdict}")
    return 0 if result.ok else 1


def default_author() -> str:
    """Who runs the command, for the record of an ack or a silence."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):  # no user name for this uid (a container)
        return "cli"


def _lifecycle_db(settings: Settings) -> Database:
    """A one-connection pool to a database whose slawatch schema is current."""
    db = Database(
        database_dsn(settings), size=1, timeout=settings.db_timeout, pooler=settings.pooler
    )
    try:
        db.run("reading slawatch's schema", require_schema)
    except BaseException:
        db.close()
        raise
    return db


def cmd_ack(settings: Settings, alert: str, by: str | None, comment: str, as_json: bool) -> int:
    """Acknowledge an alert's episode; an episode already over is said, not an error."""
    from slawatch.operate.lifecycle import ack, parse_alert

    with _lifecycle_db(settings) as db:
        try:
            result = ack(db, alert, by=by or default_author(), comment=comment, now=Clock().now())
        except NotFound:
            _unknown_rule(settings, parse_alert(alert))
            raise
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        print(("ok: " if result.state != "ended" else "") + result.message())
    return 0


def _unknown_rule(settings: Settings, name: int | tuple[str, str, int, int]) -> None:
    """BadInput (exit 2, as every other unknown name) when an alert that was not found
    is named by a rule the rule files do not have; an alert of a rule removed since
    is still found (and acknowledged) first."""
    from slawatch.operate.lifecycle import unknown_rule

    if isinstance(name, int):
        return
    try:
        names = sorted(r.name for r in load_rules(settings.rules_dir))
    except ConfigError:
        return  # the rule files say nothing now: not found it is
    if name[0] not in names:
        raise unknown_rule("alert", name[0], names)


def _describe(s: Silence) -> str:
    what = s.rule + (f" key {s.key}" if s.key is not None else "")
    if s.matchers:
        what += " where " + ", ".join(f"{k}={json.dumps(v)}" for k, v in s.matchers.items())
    return what


def cmd_silence(settings: Settings, args: argparse.Namespace) -> int:
    """Add a silence, list them (--list) or end one (--expire ID)."""
    from slawatch.operate.lifecycle import add_silence, list_silences, parse_matchers, parse_until

    creating = [
        f"--{name}"
        for name in ("rule", "key", "until", "author")
        if getattr(args, name) is not None
    ] + (["--match"] if args.match else [])
    if args.list and args.expire is not None:
        raise ConfigError("silence: --list and --expire go alone")
    if (args.list or args.expire is not None) and creating:
        raise ConfigError(
            f"silence: {', '.join(creating)}: for adding a silence, not with --list or --expire"
        )
    if args.all and not args.list:
        raise ConfigError("silence: --all goes with --list")
    now = Clock().now()
    if args.list:
        with _lifecycle_db(settings) as db:
            silences = list_silences(db, now=now, include_expired=args.all)
        if args.json:
            print(json.dumps([s.to_dict() for s in silences]))
        else:
            _print_silences(silences)
        return 0
    if args.expire is not None:
        from slawatch.operate.lifecycle import delete_silence

        with _lifecycle_db(settings) as db:
            ended = delete_silence(db, args.expire, now=now)
        if args.json:
            print(json.dumps(ended.to_dict()))
        else:
            print(f"ok: silence {ended.id} ({_describe(ended)}) ended {ended.to_dict()['ends_at']}")
        return 0
    if args.rule is None or args.until is None:
        raise ConfigError("silence: --rule and --until are needed (or --list, or --expire ID)")
    rules = {r.name: r for r in load_rules(settings.rules_dir)}
    until = parse_until(args.until, now)
    matchers = parse_matchers(args.match)
    with _lifecycle_db(settings) as db:
        added = add_silence(
            db,
            rule=args.rule,
            key=args.key,
            matchers=matchers,
            until=until,
            comment=args.comment,
            author=args.author or default_author(),
            now=now,
            rules=rules,
        )
    if args.json:
        print(json.dumps(added.to_dict()))
    else:
        print(
            f"ok: silence {added.id}: deliveries of {_describe(added)} are not sent until "
            f"{added.to_dict()['ends_at']} (alerts are still recorded)"
        )
    return 0


def _print_silences(silences: list[Silence]) -> None:
    if not silences:
        print("no silences")
        return
    head = ("ID", "STATE", "RULE", "KEY", "MATCH", "UNTIL", "AUTHOR", "COMMENT")
    rows = [
        [
            str(s.id),
            "active" if s.active else "expired",
            s.rule,
            "" if s.key is None else s.key,
            ", ".join(f"{k}={json.dumps(v)}" for k, v in s.matchers.items()),
            str(s.to_dict()["ends_at"]),
            s.author,
            s.comment,
        ]
        for s in silences
    ]
    # One line per silence whatever a comment or key holds, and no column a screen wide.
    rows = [[" ".join(c.split())[:60] for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [list(head), *rows]) for i in range(len(head))]
    for r in [list(head), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


# ---------------------------------------------------------------- events


def cmd_event(
    settings: Settings,
    kind: str,
    key: str,
    *,
    at: str | None = None,
    data: str | None = None,
    ident: str | None = None,
) -> int:
    """Record one event, checked as ``POST /v1/events`` checks it (its type must be one
    the rules use); prints ``accepted``, ``duplicate`` (a repeat of TYPE and --id) or
    ``held`` (the database's slawatch.event() knows no rule for it yet: run migrate)."""
    from slawatch.engine.timers import known_types
    from slawatch.events.ingest import EventError, ingest, parse_event

    rules = load_rules(settings.rules_dir)
    now = Clock().now()
    raw: dict[str, object] = {"type": kind, "key": key}
    if at is not None:
        raw["at"] = at
    if data is not None:
        try:
            raw["data"] = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise BadInput(f"--data: not JSON: {str(exc).splitlines()[0]}") from None
    if ident is not None:
        raw["id"] = ident
    try:
        event = parse_event(raw, None, known_types(rules), now, settings.retention)
    except EventError as exc:
        where = {"type": "TYPE", "key": "KEY"}.get(exc.field or "", f"--{exc.field}")
        raise BadInput(f"{where}: {exc.reason}") from None
    with _lifecycle_db(settings) as db:
        got = ingest(db, [event], now)
    print("accepted" if got.accepted else "held" if got.held else "duplicate")
    return 0
