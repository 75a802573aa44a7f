"""Switching a rule's ``track`` carries its state over: nothing is paged again.

A rule's state is its episodes: inline, four tracking columns on each watched row
(claim.py); ``track: table``, one row per watched row in ``slawatch."<rule>_state"``
(statetable.py). Both keep the same four values per row, with the same meaning:
the deadline value of the open episode (``seen``, NULL when none is open; set with
n = 0 by a baseline), the episode number, the notifications sent in it, and the
time of the next one. So a switch copies them, and the new track goes on where the
old one stopped: an episode already notified is not noticed again as new, its
re-notifications come on schedule with the next n, and a later episode of the row
is numbered after the earlier ones (its alerts are new: an alert is rule, key,
episode and n).

- inline → table: each watched row that has state (an episode now or before, a
  baseline) gets its state row, and a state row of a watched row without state
  (left from an earlier ``track: table``) goes. The watched table is only read.
- table → inline: each state row is written into its watched row's columns.

The copy goes in batches in key order: ``batch`` rows read per statement, each
statement its own transaction, from the last key of the batch before (read again,
and skipped). A batch writes only the rows whose copy differs, so running it again
finishes an interrupted copy and changes nothing that is done. migrate tells an
unfinished switch from the old track's indexes, which it drops only after the copy
(slawatch/engine/migrate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import Connection, translate
from slawatch.engine.catalog import TableInfo, key_columns, table_ident
from slawatch.engine.statetable import state_table

BATCH = 10_000

Track = Literal["inline", "table"]

# One batch into the state table: the watched rows' tracking columns, by key.
_TO_TABLE = """\
WITH page AS (
    SELECT {keys}, {seen} AS sw_seen, {ep} AS sw_ep, {n} AS sw_n, {next} AS sw_next
      FROM {table}
     WHERE ({keys}) >= ({start})
     ORDER BY {keys}
     LIMIT {batch}
), copied AS (
    INSERT INTO {state} AS s ({keys}, sw_seen, sw_ep, sw_n, sw_next)
    SELECT {keys}, sw_seen, sw_ep, sw_n, sw_next FROM page
     WHERE sw_ep > 0 OR sw_seen IS NOT NULL OR sw_n > 0
    ON CONFLICT ({keys}) DO UPDATE
       SET sw_seen = excluded.sw_seen, sw_ep = excluded.sw_ep, sw_n = excluded.sw_n,
           sw_next = excluded.sw_next
     WHERE (s.sw_seen, s.sw_ep, s.sw_n, s.sw_next)
           IS DISTINCT FROM (excluded.sw_seen, excluded.sw_ep, excluded.sw_n, excluded.sw_next)
    RETURNING 1
), cleared AS (
    DELETE FROM {state} s USING page p
     WHERE {s_is_p} AND NOT (p.sw_ep > 0 OR p.sw_seen IS NOT NULL OR p.sw_n > 0)
    RETURNING 1
)
SELECT (SELECT count(*) FROM page),
       (SELECT count(*) FROM copied) + (SELECT count(*) FROM cleared),
       {last}{into}
  FROM (SELECT 1) AS one
  LEFT JOIN (SELECT {keys} FROM page ORDER BY {keys_desc} LIMIT 1) AS l ON true"""

# One batch into the watched rows' columns: the state rows, by key (the state
# table's primary key); each UPDATE finds its row through the watched table's key.
_TO_INLINE = """\
WITH page AS (
    SELECT {keys}, sw_seen, sw_ep, sw_n, sw_next
      FROM {state}
     WHERE ({keys}) >= ({start})
     ORDER BY {keys}
     LIMIT {batch}
), copied AS (
    UPDATE {table} AS t
       SET {seen} = p.sw_seen, {ep} = p.sw_ep, {n} = p.sw_n, {next} = p.sw_next
      FROM page p
     WHERE {t_is_p}
       AND (t.{seen}, t.{ep}, t.{n}, t.{next})
           IS DISTINCT FROM (p.sw_seen, p.sw_ep, p.sw_n, p.sw_next)
    RETURNING 1
)
SELECT (SELECT count(*) FROM page), (SELECT count(*) FROM copied),
       {last}{into}
  FROM (SELECT 1) AS one
  LEFT JOIN (SELECT {keys} FROM page ORDER BY {keys_desc} LIMIT 1) AS l ON true"""


@dataclass(frozen=True)
class Values:
    """What fills a batch: parameters (run by migrate) or PL/pgSQL variables (the
    DO block ``migrate --print`` prints)."""

    start: list[sql.Composable]  # the first key of the batch, one per key column
    batch: sql.Composable
    into: sql.Composable


def _keys(rule: Rule, info: TableInfo) -> list[str]:
    return key_columns(rule, info)


def params_values(rule: Rule, info: TableInfo) -> Values:
    """Parameters ``k0``, ``k1``, ... (cast to the key columns' types) and ``batch``."""
    return Values(
        start=[
            sql.SQL("{}::{}").format(sql.Placeholder(f"k{i}"), sql.SQL(info.columns[c]))
            for i, c in enumerate(_keys(rule, info))
        ],
        batch=sql.SQL("%(batch)s::integer"),
        into=sql.SQL(""),
    )


def statement(rule: Rule, info: TableInfo, to: Track, values: Values) -> sql.Composed:
    """One batch of the copy to track ``to``; returns (rows read, rows written, last key)."""
    key = _keys(rule, info)

    def cols(alias: str | None = None) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.Identifier(alias, c) if alias else sql.Identifier(c) for c in key
        )

    def same(left: str, right: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("{} = {}").format(sql.Identifier(left, c), sql.Identifier(right, c))
            for c in key
        )

    return sql.SQL(_TO_TABLE if to == "table" else _TO_INLINE).format(
        keys=cols(),
        keys_desc=sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c)) for c in key),
        last=cols("l"),
        start=sql.SQL(", ").join(values.start),
        batch=values.batch,
        into=values.into,
        table=table_ident(rule),
        state=state_table(rule),
        seen=sql.Identifier(rule.seen_column),
        ep=sql.Identifier(rule.episode_column),
        n=sql.Identifier(rule.n_column),
        next=sql.Identifier(rule.next_column),
        s_is_p=same("s", "p"),
        t_is_p=same("t", "p"),
    )


def _first_key(rule: Rule, info: TableInfo, to: Track, into: sql.Composable) -> sql.Composed:
    """The smallest key of the copy's source: where its first batch starts."""
    key = sql.SQL(", ").join(sql.Identifier(c) for c in _keys(rule, info))
    source = table_ident(rule) if to == "table" else state_table(rule)
    return sql.SQL("SELECT {}{} FROM {} ORDER BY {} LIMIT 1").format(key, into, source, key)


def copy(
    conn: Connection,
    rule: Rule,
    info: TableInfo,
    to: Track,
    batch: int = BATCH,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Carry ``rule``'s state over to track ``to`` on ``conn`` (autocommit: each batch
    commits on its own); the rows written. ``progress`` gets the rows written so far
    after each batch."""
    if batch < 2:  # each batch reads its first row again: one row would never move on
        raise ValueError("batch must be at least 2")
    with translate(f"track switch of rule {rule.name}"):
        first = conn.execute(_first_key(rule, info, to, sql.SQL(""))).fetchone()
    if first is None:
        return 0
    composed = statement(rule, info, to, params_values(rule, info))
    params: dict[str, object] = {f"k{i}": v for i, v in enumerate(first)} | {"batch": batch}
    written = 0
    while True:
        with translate(f"track switch of rule {rule.name}"):
            row = conn.execute(composed, params).fetchone()
        assert row is not None
        read, done, *last = row
        written += int(done)
        if progress is not None:
            progress(written)
        if read < batch:
            return written
        params |= {f"k{i}": v for i, v in enumerate(last)}


# Dollar-quoting tag of the printed DO block.
_TAG = "$slawatch_switch$"


def render(rule: Rule, info: TableInfo, to: Track, batch: int = BATCH) -> str:
    """The copy as a DO block a DBA runs with psql in autocommit (PostgreSQL 11 or later:
    it commits after every batch); running it again finishes or changes nothing."""
    key = _keys(rule, info)
    names = [sql.Identifier(f"_sw_k{i}") for i in range(len(key))]
    targets = sql.SQL(", ").join(names)
    body = statement(
        rule,
        info,
        to,
        Values(
            start=list(names),
            batch=sql.Literal(batch),
            into=sql.SQL("\n  INTO _sw_read, _sw_written, {}").format(targets),
        ),
    ).as_string(None)
    declare = "".join(
        sql.SQL("    {} {}%TYPE;\n")
        .format(name, sql.Identifier(rule.schema_name, rule.table_name, c))
        .as_string(None)
        for name, c in zip(names, key, strict=True)
    )
    first = _first_key(rule, info, to, sql.SQL(" INTO {}").format(targets)).as_string(None)
    indented = "\n".join("            " + line for line in body.splitlines())
    return (
        f"DO {_TAG}\nDECLARE\n{declare}"
        "    _sw_read bigint;\n    _sw_written bigint;\n    _sw_total bigint := 0;\n"
        f"BEGIN\n    {first};\n    IF FOUND THEN\n        LOOP\n{indented};\n"
        "            _sw_total := _sw_total + _sw_written;\n"
        "            COMMIT;\n"
        f"            RAISE NOTICE 'rule %: % rows carried over to track: {to}',"
        f" {sql.Literal(rule.name).as_string(None)}, _sw_total;\n"
        f"            EXIT WHEN _sw_read < {batch};\n"
        "        END LOOP;\n    END IF;\nEND\n"
        f"{_TAG}"
    )


def forget_watermark(rule: Rule) -> str:
    """The statement that drops the rule's watermark: the first scan of ``track: table``
    after a switch then sweeps, and finds every due row whatever its deadline."""
    return (
        sql.SQL("DELETE FROM slawatch.watermark WHERE rule = {}")
        .format(sql.Literal(rule.name))
        .as_string(None)
    )
