"""A rule's probe as a function in the database: ``slawatch."<rule>_probe"``.

The probe ("anything due?", engine/claim.py and engine/statetable.py) is what an
idle scan costs. Sent as a statement it is planned on every run wherever nothing can
be prepared (behind a transaction pooler: ~0.4 ms of planning for ~0.02 ms of
execution). ``slawatch migrate`` creates one PL/pgSQL function per rule whose body
is that probe: PL/pgSQL keeps the plans of its statements per server process, and a
pooler keeps its server connections, so the probe is planned once per server
connection whatever the pooler does. An inline rule's function reads the probe's
values in a statement without parameters (:class:`Parts`), which PostgreSQL plans
generic from the first call; a ``track: table`` rule's takes its bounds, and
``plan_cache_mode = force_generic_plan`` (set on that function) skips the five custom
plans. Where the connection prepares statements the scans send the probe's three
values as a statement without parameters, prepared, instead, and compare them
themselves (:func:`slawatch.db.prepares`, engine/claim.py's ``_PROBE_VALUES``): the
same plan without the call around it, generic from its first run.

The call is one short statement, cheap to plan: ``SELECT slawatch."r_probe"('<digest>',
$cutoff, ...)``. The function compares the digest of the body the caller composed
with its own and answers NULL when they differ (an instance not reloaded yet during
a rolling reload, a folder that defines the rule otherwise): the caller then runs
the probe's text itself, as it does when the function is not there (a database not
migrated since the upgrade, a rule another deployment's migrate removed). So the
function never answers for a definition other than the caller's, and the claims stay
gated as before (engine/generation.py). A function that answered NULL is not called
again for :data:`RECHECK` seconds (the probe's text meanwhile, one statement instead
of two at every scan until the instance reloads): then once, in case a migrate made it
this definition's again.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from slawatch.config.rules import Rule
from slawatch.db import (
    Connection,
    execute_raw,
    first_row,
    lock_bounded,
    prepares,
    sqlstate,
    translate,
)
from slawatch.errors import DatabaseError

# What the probe of each way to track takes, in order (after the digest).
INLINE_PARAMS = ("cutoff", "renotify_by")  # inline and event rules
TABLE_PARAMS = ("since", "cutoff", "renotify_by")  # track: table, between sweeps

# The deadline values (cutoff, since) take the deadline's type: timestamp or
# timestamptz, as the probe's text compares them with the column and its index.
_TYPES = {"since": "anyelement", "cutoff": "anyelement", "renotify_by": "timestamptz"}
_SIGNATURES = {
    INLINE_PARAMS: "text, anyelement, timestamp with time zone",
    TABLE_PARAMS: "text, anyelement, anyelement, timestamp with time zone",
}
SUFFIX = "_probe"
MARK = "-- slawatch: the probe of rule "
UNDEFINED_FUNCTION = "42883"
# Seconds a function that answered NULL (another definition's body) is not called.
RECHECK = 60.0

_PLACEHOLDER = re.compile(r"%(?:(%)|\((\w+)\)s|(.))", re.DOTALL)


def name(rule_name: str) -> sql.Identifier:
    return sql.Identifier("slawatch", rule_name + SUFFIX)


def _positional(text: str, params: tuple[str, ...], first: int = 2) -> str:
    """A statement's text with psycopg's placeholders: ``%%`` a literal ``%``,
    ``%(name)s`` the function's parameter ``$n`` (the digest is ``$1``; ``first``: the
    number of the first of ``params``)."""

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "%"
        if m.group(2) in params:
            return f"${params.index(m.group(2)) + first}"
        raise ValueError(f"probe: unexpected placeholder {m.group(0)!r}")

    return _PLACEHOLDER.sub(one, text)


@dataclass(frozen=True)
class Rendered:
    """A statement rendered once, to run at every scan with :func:`slawatch.db.execute_raw`:
    its text with ``$1``, ``$2``, ... for ``params`` (bytes when it is ASCII, which every
    client encoding reads alike; else the text, which psycopg encodes at each run)."""

    query: bytes | str
    params: tuple[str, ...]

    def args(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """``values`` (by parameter name) in the order of the statement's ``$n``."""
        return tuple(values[p] for p in self.params)

    def run(
        self, conn: Connection, values: Mapping[str, Any], *, binary: bool | None = None
    ) -> tuple[Any, ...] | None:
        """The statement's first row, prepared where the pooler allows (``prepare=True``
        is ignored where prepared statements are off)."""
        query, args = self.query, self.args(values)
        return execute_raw(conn, query, args, prepare=True, binary=binary).fetchone()

    def first(
        self, conn: Connection, values: Mapping[str, Any], what: str, *, binary: bool = False
    ) -> tuple[Any, ...] | None:
        """:meth:`run` as its own unit of work, its errors translated (``what`` names the
        work): :func:`slawatch.db.first_row`."""
        return first_row(conn, self.query, self.args(values), what, binary=binary)


def _raw(text: str) -> bytes | str:
    return text.encode("ascii") if text.isascii() else text


def render(statement: sql.Composable, params: tuple[str, ...]) -> Rendered:
    """``statement``, whose placeholders are ``%(name)s`` of ``params``, rendered once."""
    return Rendered(_raw(_positional(statement.as_string(None), params, first=1)), params)


@dataclass(frozen=True)
class Parts:
    """An inline (or event) rule's probe in three parts, none with a parameter: the
    earliest deadline not notified (``due``, a query of one value of the deadline's
    type), the earliest re-notification (``again``, a query of one timestamptz), and
    whether anything else is to do (``other``, a boolean expression). The probe
    compares ``due`` with ``cutoff`` and ``again`` with ``renotify_by``."""

    due: sql.Composable
    again: sql.Composable
    other: sql.Composable


@dataclass(frozen=True)
class Definition:
    """A rule's probe function: what migrate creates and what the runtime calls."""

    rule: str
    params: tuple[str, ...]
    digest: str
    source: str  # the function's body, as pg_proc.prosrc holds it
    # SET plan_cache_mode = force_generic_plan on the function: where its statement
    # takes the function's parameters (a body from Parts takes none: see define).
    generic: bool = True

    @property
    def signature(self) -> str:
        return _SIGNATURES[self.params]

    def create(self) -> str:
        tag = "$sw_probe$"
        while tag in self.source:
            tag = tag[:-1] + "_$"
        return (
            f"CREATE OR REPLACE FUNCTION {name(self.rule).as_string(None)}({self.signature})\n"
            " RETURNS boolean LANGUAGE plpgsql STABLE PARALLEL SAFE\n"
            + (" SET plan_cache_mode = force_generic_plan\n" if self.generic else "")
            + f"AS {tag}{self.source}{tag}"
        )

    def drop_other(self) -> str:
        """The function of the other way to track, dropped (a switch of ``track``)."""
        other = next(s for p, s in _SIGNATURES.items() if p != self.params)
        return f"DROP FUNCTION IF EXISTS {name(self.rule).as_string(None)}({other})"


def define(
    rule: Rule, probe: sql.Composable, params: tuple[str, ...], parts: Parts | None = None
) -> Definition:
    """The probe function of ``rule`` whose probe is ``probe`` (placeholders ``params``).

    With ``parts`` (``probe``'s, :class:`Parts`) the body reads the three values in a
    statement that takes no parameter and compares them in PL/pgSQL: PostgreSQL plans
    a statement without parameters once per server process, generic from the first
    call, so the function needs no ``SET plan_cache_mode`` (a SET clause on a function
    saves and restores the setting at every call). Without, the body is the probe,
    whose parameters reach its statement, and the SET skips its five custom plans."""
    text = _positional(probe.as_string(None), params)
    digest = hashlib.sha256(f"{params}\n{text}".encode()).hexdigest()[:16]
    head = f"\n{MARK}{rule.name} (docs/explanation/claim.md)\n"
    check = (
        f"    IF $1 IS DISTINCT FROM '{digest}' THEN\n"
        "        RETURN NULL;  -- another definition's caller: it runs its own probe\n"
        "    END IF;\n"
    )
    if parts is None:
        source = f"{head}BEGIN\n{check}    RETURN (\n{text});\nEND\n"
        return Definition(rule.name, params, digest, source)
    if params != INLINE_PARAMS:
        raise ValueError(f"probe parts take {INLINE_PARAMS}, not {params}")
    due, again, other = (
        _positional(p.as_string(None), ()) for p in (parts.due, parts.again, parts.other)
    )
    # use_column: a name in the statement is the table's column, never one of the
    # variables (a column named like one would otherwise be an error, or a parameter).
    source = (
        f"\n#variable_conflict use_column{head}"
        "DECLARE\n    sw_due $2%TYPE;\n    sw_again timestamptz;\n    sw_other boolean;\n"
        f"BEGIN\n{check}"
        f"    SELECT ({due}),\n           ({again}),\n           {other}\n"
        "      INTO sw_due, sw_again, sw_other;\n"
        "    RETURN COALESCE(sw_due < $2, false) OR COALESCE(sw_again < $3, false) OR sw_other;\n"
        "END\n"
    )
    return Definition(rule.name, params, digest, source, generic=False)


@dataclass
class Installed:
    """A probe function found in the catalog."""

    rule: str
    procedure: str  # regprocedure, for DROP FUNCTION
    signature: str
    source: str


_INSTALLED = """\
SELECT p.proname, p.oid::regprocedure::text, pg_get_function_identity_arguments(p.oid),
       p.prosrc
  FROM pg_proc p
 WHERE p.pronamespace = 'slawatch'::regnamespace AND p.proname LIKE '%%\\_probe'
   AND strpos(p.prosrc, %s) > 0"""


def installed(conn: Connection) -> list[Installed]:
    """slawatch's probe functions in the database (none before the schema)."""
    with translate("reading the probe functions"):
        there = conn.execute("SELECT to_regnamespace('slawatch')").fetchone()
        if there is None or there[0] is None:
            return []
        rows = conn.execute(_INSTALLED, (MARK,)).fetchall()
    return [Installed(r[0][: -len(SUFFIX)], r[1], r[2], r[3]) for r in rows]


@dataclass(frozen=True)
class Change:
    """One statement migrate runs for the probe functions, and what it reports."""

    statement: str
    done: str


def changes(wanted: dict[str, Definition | None], have: list[Installed]) -> list[Change]:
    """What brings the probe functions in line with ``wanted`` (by rule name; None: a
    rule whose probe is not known here). The function of a rule not in ``wanted`` is
    kept, as a partial rules folder keeps the event types it lacks (how-to/upgrades.md):
    it answers only a caller whose probe has its digest, so it is never wrong, only
    left over; dropping the rule's objects is for the user (reference/sql.md)."""
    out: list[Change] = []
    by_rule: dict[str, list[Installed]] = {}
    for item in have:
        by_rule.setdefault(item.rule, []).append(item)
    for rule, want in wanted.items():
        if want is None:
            continue
        items = by_rule.get(rule, [])
        if any(i.signature == want.signature and i.source == want.source for i in items):
            continue
        if any(i.signature != want.signature for i in items):
            out.append(Change(want.drop_other(), f"slawatch.{rule}{SUFFIX}: old signature dropped"))
        verb = "replaced" if items else "created"
        out.append(Change(want.create(), f"slawatch.{rule}{SUFFIX}: {verb} (rule {rule}'s probe)"))
    return out


@dataclass
class ProbeFunction:
    """How this process calls its rule's probe function (see the module's doc)."""

    definition: Definition
    # False once the function was not there: the probe's text until the next prepare.
    usable: bool = True
    # When (time.monotonic()) it last answered NULL: the probe's text for RECHECK seconds.
    declined: float | None = None

    @property
    def answers(self) -> bool:
        """Whether to call the function now: it is there, and has not answered NULL
        within :data:`RECHECK` seconds."""
        declined = self.declined
        return self.usable and (declined is None or time.monotonic() - declined >= RECHECK)

    def answer(self, value: Any) -> bool | None:
        """The function's ``value`` as an answer: None for its NULL (the body of another
        definition), after which it is not called for :data:`RECHECK` seconds."""
        if value is None:
            self.declined = time.monotonic()
            return None
        self.declined = None
        return bool(value)

    def __post_init__(self) -> None:
        d = self.definition
        args: list[sql.Composable] = [sql.Literal(d.digest)]
        for p in d.params:
            cast = "::timestamptz" if _TYPES[p] == "timestamptz" else ""
            args.append(sql.SQL("%({})s" + cast).format(sql.SQL(p)))
        # Rendered once: the call is what every idle scan runs.
        self.call = render(
            sql.SQL("SELECT {}({})").format(name(d.rule), sql.SQL(", ").join(args)), d.params
        )

    def expression(self, first: int) -> str:
        """The call as an expression, for a statement of several (engine/steps.py): its
        parameters ``$first``, ``$first + 1``, ... in the order of the definition's."""
        d = self.definition
        args = [sql.Literal(d.digest).as_string(None)]
        for i, p in enumerate(d.params):
            args.append(f"${first + i}" + ("::timestamptz" if _TYPES[p] == "timestamptz" else ""))
        return f"{name(d.rule).as_string(None)}({', '.join(args)})"

    def ask(self, conn: Connection, values: dict[str, Any]) -> bool | None:
        """The function's answer; None where the caller runs the probe's text instead:
        on a connection that prepares statements (:func:`slawatch.db.prepares`), or when the
        function cannot answer for this definition (or did not lately: :attr:`answers`)."""
        if not self.answers or prepares(conn):
            return None
        try:
            # A lock on the watched table fails it at once (lock_bounded).
            with translate(f"probe for rule {self.definition.rule}"), lock_bounded(conn):
                row = self.call.run(conn, values)
        except DatabaseError as exc:
            if sqlstate(exc) != UNDEFINED_FUNCTION:
                raise
            self.usable = False
            return None
        return self.answer(None if row is None else row[0])


def attach(conn: Connection, defined: dict[str, Definition]) -> dict[str, ProbeFunction]:
    """The probe functions to call, by rule name: those of ``defined`` whose function
    is in the database (whatever its body: a different one answers NULL)."""
    have = installed(conn) if defined else []
    there = {i.rule for i in have if i.rule in defined and i.signature == defined[i.rule].signature}
    return {r: ProbeFunction(d) for r, d in defined.items() if r in there}
