"""An alert's row data is bounded (docs/reference/rules.md, ``columns``): a row over
MAX_DATA bytes is still alerted, once, with a small replacement that says so, in both
ways to track, in its resolved notice too, and the webhook sends the replacement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from psycopg import sql
from psycopg.types.json import Jsonb

from slawatch.actions.run import runner
from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.migrate import migrate
from slawatch.engine.outbox import MAX_DATA, TRUNCATED, capped
from slawatch.engine.ready import prepare
from slawatch.errors import ConfigError
from tests.integration.helpers import Conn, alerts_of, claim_all
from tests.receivers import WebhookReceiver

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
BIG = 4 * 1024 * 1024  # the probe's was 50 MiB: the same branch, a faster test

TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz NOT NULL, payload text
)"""


def rule(track: str, **fields: object) -> Rule:
    base = {
        "name": "late",
        "table": "public.orders",
        "track": track,
        "deadline": "paid_at",
        "after": "1h",
        "open_when": "status = 'paid'",
        "columns": ["id", "payload"],
        "notify": ["console"],
    }
    return Rule.model_validate(base | fields)


def row_size(conn: Conn, id: int) -> int:
    """The size the claim compares: the row's jsonb as the rule's columns build it."""
    (size,) = conn.execute(
        "SELECT pg_column_size(jsonb_build_object('id', id, 'payload', payload))"
        " FROM orders WHERE id = %s",
        (id,),
    ).fetchone()  # type: ignore[misc]
    return int(size)


def sized_orders(conn: Conn) -> None:
    """Order 1 at 4 MiB of payload, 2 exactly at the bound, 3 one byte over it."""
    conn.execute(TABLE)
    conn.execute(
        "INSERT INTO orders VALUES (1, 'paid', %s, repeat('x', %s)), (2, 'paid', %s, ''),"
        " (3, 'paid', %s, 'y')",
        (T0, BIG, T0, T0),
    )
    # A string's jsonb grows by its length: fill order 2 to the bound exactly.
    conn.execute(
        "UPDATE orders SET payload = repeat('z', %s) WHERE id = 2", (MAX_DATA - row_size(conn, 2),)
    )
    conn.execute(
        "UPDATE orders SET payload = repeat('y', %s) WHERE id = 3",
        (MAX_DATA + 1 - row_size(conn, 3) + 1,),
    )
    assert row_size(conn, 2) == MAX_DATA
    assert row_size(conn, 3) == MAX_DATA + 1


def replacement(size: int) -> str:
    return f"row data of {size:,} bytes is over the 65,536-byte limit; see the row in the table"


def row_data(conn: Conn, kind: str = "firing") -> dict[str, Any]:
    return {key: data for key, data in alerts_of(conn, "late", "key", "row_data", kind=kind)}


def test_a_row_over_the_bound_is_alerted_once_with_a_small_replacement(
    conn: Conn, track: str
) -> None:
    sized_orders(conn)
    big, over = row_size(conn, 1), row_size(conn, 3)
    late = rule(track, resolve=True)
    migrate(conn, [late])
    plan = prepare(conn, late)
    assert claim_all(conn, plan, T0 + 2 * H) == 3
    assert claim_all(conn, plan, T0 + 3 * H) == 0  # once
    got = row_data(conn)
    # The row's key columns are kept beside the sentence; the rest is left out.
    assert got["1"] == {"id": 1, TRUNCATED: replacement(big)}
    assert got["3"] == {"id": 3, TRUNCATED: replacement(over)}
    assert got["2"] == {"id": 2, "payload": "z" * (len(got["2"]["payload"]))}
    # The size the bound is on, of what was stored: as the claim measures a value just
    # built (`|| '{}'` builds one), not pg_column_size of the stored value, which is
    # compressed (order 1's 4 MiB of 'x' is some 50 kB so). Read back and sent again,
    # each is a jsonb equal to the stored one (ints and strings read back exactly).
    (stored,) = conn.execute(
        "SELECT max(pg_column_size(d || '{}')) FROM unnest(%s::jsonb[]) d",
        ([Jsonb(data) for (data,) in alerts_of(conn, "late", "row_data")],),
    ).fetchone()  # type: ignore[misc]
    assert stored == MAX_DATA  # order 2's, whole
    assert big > BIG
    # Their resolved notices are bounded alike.
    conn.execute("UPDATE orders SET status = 'shipped'")
    claim_all(conn, plan, T0 + 30 * H)
    if track == "table":  # a notified-once episode ends at the sweep
        claim_all(conn, plan, T0 + 31 * H)
    resolved = row_data(conn, "resolved")
    assert resolved["1"] == {"id": 1, TRUNCATED: replacement(big)}
    assert resolved["2"]["payload"] == got["2"]["payload"]


@pytest.mark.parametrize("track", ["inline"])
def test_without_the_key_in_columns_the_sentence_is_alone(conn: Conn, track: str) -> None:
    sized_orders(conn)
    late = rule(track, columns=["payload"])
    migrate(conn, [late])
    assert claim_all(conn, prepare(conn, late), T0 + 2 * H) == 3
    (size,) = conn.execute(
        "SELECT pg_column_size(jsonb_build_object('payload', payload)) FROM orders WHERE id = 1"
    ).fetchone()  # type: ignore[misc]
    assert row_data(conn)["1"] == {TRUNCATED: replacement(int(size))}


@pytest.mark.parametrize("track", ["inline"])
def test_the_webhook_is_sent_the_replacement(
    conn: Conn, dsn: str, receiver: WebhookReceiver, track: str
) -> None:
    sized_orders(conn)
    big = row_size(conn, 1)
    late = rule(track, notify=["hook"])
    migrate(conn, [late])
    claimed = T0 + 2 * H
    assert claim_all(conn, prepare(conn, late), claimed) == 3
    hook = WebhookNotifier(
        WebhookConfig.model_validate({"name": "hook", "type": "webhook", "url": receiver.url})
    )
    with Database(dsn, size=2, timeout=10) as pool, freeze_time(claimed):
        assert deliver_due(pool, {"hook": hook}, Clock()).sent == 3
    hook.close()
    (request,) = receiver.requests
    rows = {a["key"]: a["row"] for a in request.alerts}
    assert rows["1"] == {"id": 1, TRUNCATED: replacement(big)}
    assert len(rows["2"]["payload"]) > MAX_DATA - 100
    assert len(request.body) < 3 * MAX_DATA


@pytest.mark.parametrize(
    ("action", "runs"),
    [
        ("insert into marks (id, note) values (:id, :payload)", ["2"]),
        ("insert into marks (id) values (:id)", ["1", "2", "3"]),
    ],
)
def test_an_action_that_reads_a_column_left_out_is_recorded_skipped(
    conn: Conn, track: str, action: str, runs: list[str]
) -> None:
    """Not run with NULL in the column's place; one that reads the key alone runs."""
    sized_orders(conn)
    conn.execute("CREATE TABLE marks (id bigint NOT NULL, note text)")
    late = rule(track, action={"sql": action})
    migrate(conn, [late])
    plan = prepare(conn, late).with_act(runner("on"))
    assert claim_all(conn, plan, T0 + 2 * H) == 3
    done = conn.execute("SELECT key, status, error FROM slawatch.action ORDER BY key").fetchall()
    why = f"row data over {MAX_DATA:,} bytes (docs/reference/rules.md, columns)"
    assert done == [(k, "ok", None) if k in runs else (k, "skipped", why) for k in ["1", "2", "3"]]
    marked = conn.execute("SELECT id::text FROM marks ORDER BY id").fetchall()
    assert [m for (m,) in marked] == runs


def test_a_null_row_is_said_so_never_with_an_empty_size(conn: Conn) -> None:
    """No claim builds a NULL row (jsonb_build_object's, or the key's), but the cap does
    not turn one into "row data of  bytes": a sentence that says what it is (NULL would
    fail the alert's NOT NULL, and so the rule's every claim)."""

    def cap(value: str) -> Any:
        query = sql.SQL("SELECT {}").format(capped(sql.SQL(value), ["payload"]))
        (got,) = conn.execute(query, {"unused": None}).fetchone()  # type: ignore[misc]
        return got

    assert cap("NULL::jsonb") == {TRUNCATED: "no row data (NULL); see the row in the table"}
    assert cap("'{\"id\": 1}'::jsonb") == {"id": 1}
    over = f"jsonb_build_object('id', 1, 'payload', repeat('x', {MAX_DATA}))"
    (size,) = conn.execute(f"SELECT pg_column_size({over})").fetchone()  # type: ignore[misc]
    assert cap(over) == {"id": 1, TRUNCATED: replacement(size)}


KEYED = """
CREATE TABLE tagged (
    id bigint NOT NULL, tag text NOT NULL, status text NOT NULL, paid_at timestamptz NOT NULL,
    payload text,
    UNIQUE (id, tag)  -- 'k' x 64 KiB compresses to fit an index entry
)"""


def test_an_action_reading_a_key_column_cut_with_its_row_is_skipped_and_logged(
    conn: Conn, track: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A key of two columns is read by an action from the alert's row (``columns``): when
    the key's own columns are over the bound, the row keeps the sentence alone, and the
    action is recorded skipped with a WARNING, never run with NULL keys. Its key kept
    (only the payload over the bound), it runs."""
    conn.execute(KEYED)
    conn.execute(
        "INSERT INTO tagged VALUES (1, repeat('k', %s), 'paid', %s, ''),"
        " (2, 'b', 'paid', %s, repeat('p', %s)), (3, 'c', 'paid', %s, 'small')",
        (MAX_DATA + 10, T0, T0, MAX_DATA + 10, T0),
    )
    conn.execute("CREATE TABLE marks (id bigint, tag text)")  # NULLs would go in
    late = rule(
        track,
        table="public.tagged",
        key=["id", "tag"],
        columns=["id", "tag", "payload"],
        action={"sql": "insert into marks (id, tag) values (:id, :tag)"},
    )
    migrate(conn, [late])
    plan = prepare(conn, late).with_act(runner("on"))
    with caplog.at_level("WARNING", logger="slawatch.actions.run"):
        assert claim_all(conn, plan, T0 + 2 * H) == 3
    done = conn.execute(
        "SELECT left(key, 8), status, error, params FROM slawatch.action ORDER BY key"
    ).fetchall()
    why = f"row data over {MAX_DATA:,} bytes (docs/reference/rules.md, columns)"
    assert done == [
        ("(1,kkkkk", "skipped", why, {"id": None, "tag": None}),
        ("(2,b)", "ok", None, {"id": "2", "tag": "b"}),
        ("(3,c)", "ok", None, {"id": "3", "tag": "c"}),
    ]
    assert conn.execute("SELECT id, tag FROM marks ORDER BY id").fetchall() == [
        (2, "b"),
        (3, "c"),
    ]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("rule late: action for key (1,kkkk")
    assert warning.endswith(
        "(episode 1) not run, recorded skipped: its row data was over 65,536 bytes, and the"
        " alert's row (cut to fit) has no value for :id, :tag (docs/reference/rules.md, columns)"
    )
    rows = row_data(conn)
    assert [k for k, r in rows.items() if TRUNCATED in r and "id" not in r] == [
        next(k for k in rows if k.startswith("(1,"))
    ]


def test_a_primary_key_column_named_as_the_cap_field_is_refused(conn: Conn, track: str) -> None:
    """Rules load refuses `columns` (or a key) with a column named as the field
    (tests/unit/test_rules.py); a rule keyed by the table's primary key without `columns`
    is known only from the catalog: refused when the claim is prepared."""
    conn.execute(
        "CREATE TABLE odd (_slawatch_truncated bigint PRIMARY KEY, status text NOT NULL,"
        " paid_at timestamptz NOT NULL)"
    )
    odd = rule(track, table="public.odd", columns=None)
    migrate(conn, [odd])
    with pytest.raises(ConfigError, match="key or deadline: a column named _slawatch_truncated"):
        prepare(conn, odd)
