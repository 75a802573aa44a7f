"""`slawatch ack` and `slawatch silence` as a user runs them: output, exit codes, errors."""

from __future__ import annotations

import json

from slawatch.engine.migrate import migrate
from tests.integration.helpers import Conn, shop
from tests.integration.test_cli import assert_one_line_error, slawatch


def test_ack_from_the_command_line(conn: Conn, dsn: str) -> None:
    migrate(conn, list(shop(conn).values()))
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " VALUES ('order_unshipped', '42', 1, 1, 'warning', now(), '{}')"
    )
    done = slawatch("ack", "order_unshipped:42:e1:n1", "--by", "alice", "--comment", "x", dsn=dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: acknowledged episode 1 of order_unshipped:42 (alert")
    again = slawatch("ack", "1", "--json", dsn=dsn)
    assert json.loads(again.stdout)["state"] == "already acknowledged"
    assert_one_line_error(slawatch("ack", "nope", dsn=dsn), 2, "is neither an alert id")
    assert_one_line_error(slawatch("ack", "77", dsn=dsn), 1, "no alert 77")
    # A rule the files do not have is an unknown name, exit 2 as the others; an unknown
    # alert of a known rule is not found, exit 1 as above.
    assert_one_line_error(
        slawatch("ack", "nosuch:1:e1:n1", dsn=dsn),
        2,
        "alert: no rule named 'nosuch' (defined: job_hung, order_unshipped, ",
    )
    assert_one_line_error(
        slawatch("ack", "order_unshipped:1:e1:n1", dsn=dsn), 1, "no alert order_unshipped:1:e1:n1"
    )
    # An alert of a rule since removed from the files is still acknowledged.
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " VALUES ('gone_rule', '5', 1, 1, 'warning', now(), '{}')"
    )
    gone = slawatch("ack", "gone_rule:5:e1:n1", dsn=dsn)
    assert gone.returncode == 0 and gone.stdout.startswith("ok: acknowledged"), gone


def test_silence_from_the_command_line(conn: Conn, dsn: str) -> None:
    migrate(conn, list(shop(conn).values()))
    added = slawatch(
        "silence", "--rule", "order_unshipped", "--key", "42", "--match", "user_id=7",
        "--until", "2h", "--author", "alice", "--comment", "courier strike", dsn=dsn,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(
        "ok: silence 1: deliveries of order_unshipped key 42 where user_id=7 are not sent until"
    )
    listed = slawatch("silence", "--list", dsn=dsn)
    assert listed.stdout.splitlines()[1].split()[:5] == [
        "1",
        "active",
        "order_unshipped",
        "42",
        "user_id=7",
    ]
    ended = slawatch("silence", "--expire", "1", dsn=dsn)
    assert ended.stdout.startswith("ok: silence 1 (order_unshipped key 42 where user_id=7) ended")
    assert slawatch("silence", "--list", dsn=dsn).stdout == "no silences\n"
    every = json.loads(slawatch("silence", "--list", "--all", "--json", dsn=dsn).stdout)
    assert [(s["id"], s["active"], s["matchers"]) for s in every] == [(1, False, {"user_id": 7})]
    bad = slawatch("silence", "--rule", "order_unshipped", "--until", "yesterday", dsn=dsn)
    assert_one_line_error(bad, 2, "--until: 'yesterday' is neither a time")
    assert_one_line_error(slawatch("silence", "--expire", "5", dsn=dsn), 1, "no silence with id 5")
