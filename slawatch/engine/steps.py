"""The probes of several rules in one statement: a step of idle scans.

``slawatch run`` scans the rules that come due at the same instant together (a
*step*, runtime/scheduler.py): one statement asks every inline or event rule of the
step whether its claim would claim or close anything, and only the rules that say
yes, or that this statement cannot answer for, are scanned one by one. An idle rule
then costs a share of one statement, one checkout of a connection and one run of the
scheduler, instead of one of each: with a thousand rules scanned every few seconds,
those were most of what slawatch itself spent (docs/performance.md, many rules).

Each rule's part is its own probe (engine/claim.py), so the answers are the ones
its scan would have had:

- where the connection prepares statements, the probes' three values each
  (``_PROBE_VALUES``), side by side in one row, prepared; PostgreSQL plans a statement
  without a parameter generic at its first run;
- behind a transaction pooler, the rules' probe functions (engine/probefn.py), each
  a call in one ``SELECT``: each function keeps its plans per server connection, and
  the statement around them is cheap to plan. A rule without a usable function is
  not asked (its scan probes it), nor is a function's NULL taken for an answer (a
  definition other than the caller's): that rule is then not asked for a while
  (engine/probefn.py, ``RECHECK``), its scan running its probe's text alone.

``track: table`` rules are not asked here: their probe depends on where their last
sweep ended (engine/statetable.py), which their own scan reads.

One statement for many rules must not wait for one rule's table: the statement runs
with ``lock_timeout`` set for it alone (:data:`slawatch.db.LOCK_TIMEOUT`, in the same request:
slawatch.db.pipelined), so a table held by an ``ALTER TABLE`` or a ``LOCK TABLE``
fails it at once instead of holding up the step's other rules, which are then
scanned one by one (runtime/scheduler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from slawatch.db import Connection, execute_raw, lock_bounded, prepares, translate
from slawatch.engine.claim import ClaimPlan, probe_answer

# Statements composed for the steps, by what they are made of (a reload makes new ones;
# kept at most this many).
_TEXTS: dict[tuple[Any, ...], bytes | str] = {}
_TEXTS_MAX = 4_096


def askable(plan: ClaimPlan) -> bool:
    """Whether ``plan``'s rule can be asked in a step: an inline or event rule with a
    probe (a rule without one claims at every scan)."""
    return plan.table is None and plan.probe_parts is not None


def probe_step(conn: Connection, plans: Sequence[ClaimPlan], now: datetime) -> list[bool | None]:
    """Whether each of ``plans`` (all :func:`askable`) would claim or close anything at
    ``now``, in one statement on ``conn``; None for a plan this statement does not
    answer for (its scan probes it alone). Raises what the statement raised (a
    :class:`~slawatch.errors.SlawatchError`)."""
    if not plans:
        return []
    what = f"probe for rules {', '.join(p.rule.name for p in plans)}"
    if prepares(conn):
        return _by_values(conn, plans, now, what)
    return _by_functions(conn, plans, now, what)


def _by_values(
    conn: Connection, plans: Sequence[ClaimPlan], now: datetime, what: str
) -> list[bool | None]:
    parts = []
    for plan in plans:
        values = plan.probe_values
        assert values is not None  # askable
        parts.append(values.query)
    key = ("values", *parts)
    query = _TEXTS.get(key)
    if query is None:
        joined = ",\n     ".join(f"({_text(q)}) AS p{i}" for i, q in enumerate(parts))
        query = _kept(key, f"SELECT * FROM {joined}")
    # Binary: the times are read whatever the session's DateStyle (as anything_due).
    row = _first(conn, query, (), what, binary=True)
    if row is None:
        return [None] * len(plans)
    return [
        probe_answer(
            row[3 * i : 3 * i + 3],
            plan.to_deadline(plan.rule.cutoff(now)),
            plan.rule.renotify_cutoff(now),
        )
        for i, plan in enumerate(plans)
    ]


def _by_functions(
    conn: Connection, plans: Sequence[ClaimPlan], now: datetime, what: str
) -> list[bool | None]:
    out: list[bool | None] = [None] * len(plans)
    asked: list[int] = []
    args: list[Any] = []
    key: list[Any] = ["functions"]
    for i, plan in enumerate(plans):
        fn = plan.probe_fn
        if fn is None or not fn.answers:
            continue
        values = {
            "cutoff": plan.to_deadline(plan.rule.cutoff(now)),
            "renotify_by": plan.rule.renotify_cutoff(now),
        }
        asked.append(i)
        args.extend(values[p] for p in fn.definition.params)
        key.append((fn.definition.rule, fn.definition.digest, fn.definition.params))
    if not asked:
        return out
    query = _TEXTS.get(tuple(key))
    if query is None:
        calls, first = [], 1
        for i in asked:
            fn = plans[i].probe_fn
            assert fn is not None
            calls.append(fn.expression(first))
            first += len(fn.definition.params)
        query = _kept(tuple(key), "SELECT " + ",\n       ".join(calls))
    row = _first(conn, query, args, what)
    if row is not None:
        for i, value in zip(asked, row, strict=True):
            fn = plans[i].probe_fn
            assert fn is not None
            out[i] = fn.answer(value)
    return out


def _first(
    conn: Connection, query: bytes | str, args: Sequence[Any], what: str, *, binary: bool = False
) -> tuple[Any, ...] | None:
    """The statement's one row, prepared where the connection prepares, after
    :data:`slawatch.db.LOCK_TIMEOUT` is set for it alone: one request, one transaction."""
    with translate(what):
        with lock_bounded(conn):
            cur = execute_raw(conn, query, args, prepare=True, binary=binary)
        row: tuple[Any, ...] | None = cur.fetchone()
    return row


def _text(query: bytes | str) -> str:
    return query.decode("ascii") if isinstance(query, bytes) else query


def _kept(key: tuple[Any, ...], text: str) -> bytes | str:
    if len(_TEXTS) >= _TEXTS_MAX:
        _TEXTS.clear()
    query = _TEXTS[key] = text.encode("ascii") if text.isascii() else text
    return query
