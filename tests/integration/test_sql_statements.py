"""Every named statement of slawatch/sql/queries.sql is planned by the server under test.

The suite runs twice in CI (.ci/run): on the embedded PostgreSQL and again on an older
server (15 on CI's machine). The second run repeats only the tests whose subject is
slawatch's SQL; this test makes sure that every statement in queries.sql, whichever
tests run it, at least parses and plans there: a keyword or function of a newer
release fails here, on the server that lacks it, rather than in a user's deployment.
Statements are EXPLAINed (planned, never run), each placeholder bound to NULL, or to a
time where the statement adds an interval to it; the one statement that is several
(the migrator's own record) runs as it is, as every migrate runs it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import psycopg

from slawatch.engine.queries import queries
from tests.integration.helpers import Conn

NOW = datetime(2026, 3, 3, 12, tzinfo=UTC)
# Run rather than planned: several statements (EXPLAIN takes one).
RUN = {"schema_version_create"}


def placeholders(statement: str) -> dict[str, object] | list[object] | None:
    """NULL for each placeholder; a time for ``now`` and ``…_at``/``cutoff`` (``%(now)s +
    %(lease)s::interval`` is ``unknown + interval`` with a NULL of unknown type)."""
    named = re.findall(r"%\((\w+)\)s", statement)
    if named:
        return {
            name: NOW if name in ("now", "cutoff") or name.endswith("_at") else None
            for name in named
        }
    positional = statement.count("%s")
    return [None] * positional if positional else None


def test_the_server_plans_every_statement(schema: Conn) -> None:
    # One database for all of them (a fresh one per statement cost a minute of CI).
    refused = {}
    for name, statement in sorted(queries().items()):
        try:
            with schema.transaction(force_rollback=True):
                if name in RUN:
                    schema.execute(statement, placeholders(statement))
                else:
                    schema.execute("EXPLAIN " + statement, placeholders(statement))
        except psycopg.Error as exc:
            refused[name] = str(exc).splitlines()[0]
    assert refused == {}
    assert len(queries()) > 60  # the file was read whole
