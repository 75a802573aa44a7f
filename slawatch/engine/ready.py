"""Which rules are ready to run: each rule's claim plan (engine/claim.py) once the
catalog says migrate has built what it needs, and why each other rule is not."""

from __future__ import annotations

from dataclasses import replace

from slawatch.config.rules import Rule
from slawatch.db import Connection
from slawatch.engine.catalog import TableInfo, deadline_type_of, key_columns, rule_table
from slawatch.engine.claim import ClaimPlan, plan_claim, probe_definition
from slawatch.engine.migrate import (
    event_function_pending,
    inline_refusal,
    pending,
    require_schema,
    with_probed_indexes,
)
from slawatch.engine.outbox import DEFAULT_OUTBOX, Outbox
from slawatch.engine.probefn import attach
from slawatch.errors import ConfigError

# How a problem that `slawatch migrate` solves ends (:func:`needs_migrate`).
RUN_MIGRATE = "run 'slawatch migrate'"


def needs_migrate(problem: str) -> bool:
    """Whether ``problem`` (from :func:`prepare_ready`) is one that `slawatch migrate`
    solves: the rule is new or changed since its migrate, not broken."""
    return problem.endswith(RUN_MIGRATE)


def prepare(conn: Connection, rule: Rule, *, outbox: Outbox = DEFAULT_OUTBOX) -> ClaimPlan:
    """Read the table's catalog entry and compose the claim; the table must be migrated.
    ``outbox``: SLAWATCH_OUTBOX (docs/explanation/outbox-rows.md)."""
    return prepare_all(conn, [rule], outbox=outbox)[rule.name]


def prepare_all(
    conn: Connection, rules: list[Rule], *, outbox: Outbox = DEFAULT_OUTBOX
) -> dict[str, ClaimPlan]:
    """Claim plans for every rule; one ConfigError naming every rule not ready to run."""
    plans, problems = prepare_ready(conn, rules, outbox=outbox)
    if problems:
        raise ConfigError("\n".join(problems.values()))
    return plans


def prepare_ready(
    conn: Connection, rules: list[Rule], *, outbox: Outbox = DEFAULT_OUTBOX
) -> tuple[dict[str, ClaimPlan], dict[str, str]]:
    """Claim plans for the rules ready to run, and why each other rule is not (by name).
    ``outbox``: the shape their claims write (SLAWATCH_OUTBOX).

    Raises ConfigError when slawatch's own schema is not there: no rule can run.
    """
    plans, problems = {}, {}
    require_schema(conn)
    stale_function = set(event_function_pending(conn, rules))
    found: list[tuple[Rule, TableInfo]] = []
    deadline_types: dict[str, str] = {}
    for rule in rules:
        if rule.name in stale_function:
            problems[rule.name] = (
                f"{rule.source}: rule {rule.name!r}: slawatch.event() does not know its event"
                f" types yet; {RUN_MIGRATE}"
            )
            continue
        info = rule_table(conn, rule)
        if info is None:
            problems[rule.name] = f"{rule.source}: table: {rule.table} does not exist"
            continue
        try:
            deadline_types[rule.name] = deadline_type_of(rule, info)
        except ConfigError as exc:
            problems[rule.name] = str(exc)
            continue
        # A trigger created since migrate: refused here too, never claimed through.
        refused = inline_refusal(conn, rule)
        if refused:
            problems[rule.name] = refused
            continue
        found.append((rule, info))
    # Each rule's wanted indexes, a table's rules on one copy of it (pending compares them).
    probed = with_probed_indexes(conn, found)
    for rule, _ in found:
        info = probed[rule.name]
        todo = pending(conn, rule, info)
        if todo:
            # Claiming now could be wrong (no tracking columns) or slow (no usable index).
            problems[rule.name] = (
                f"{rule.source}: rule {rule.name!r} is not migrated or changed since the "
                f"last migrate ({'; '.join(todo)}); {RUN_MIGRATE}"
            )
            continue
        key = key_columns(rule, info)
        problem = rule.placeholder_problem(key) or rule.row_problem(key)
        if problem:  # a rule keyed by the table's primary key: known only now
            problems[rule.name] = f"{rule.source}: {problem}"
            continue
        plans[rule.name] = plan_claim(
            rule,
            deadline_types[rule.name],
            partitioned=info.relkind == "p",
            key=key,
            outbox_in=outbox,
        )
    # In the order of ``rules``, as the reasons were logged before the probes were batched.
    order = {rule.name: n for n, rule in enumerate(rules)}
    problems = dict(sorted(problems.items(), key=lambda item: order[item[0]]))
    return with_probe_functions(conn, plans), problems


def with_probe_functions(conn: Connection, plans: dict[str, ClaimPlan]) -> dict[str, ClaimPlan]:
    """``plans``, each calling its rule's probe function where migrate created one."""
    defined = {n: d for n, p in plans.items() if (d := probe_definition(p)) is not None}
    found = attach(conn, defined)
    out = {}
    for rule, plan in plans.items():
        fn = found.get(rule)
        if fn is not None and plan.table is not None:
            plan = replace(plan, table=replace(plan.table, probe_fn=fn))
        elif fn is not None:
            plan = replace(plan, probe_fn=fn)
        out[rule] = plan
    return out
