"""Orphaned deliveries (issue 13): a notifier removed from the configuration leaves no
delivery pending for ever. They are settled 'orphaned' at start, at reload and with
maintenance, shown, prunable, and `replay --notifier OLD --to NEW` sends them on."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from slawatch.actions.run import runner
from slawatch.config.rules import Rule, load_rules
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import replay_deliveries, settle_orphans
from slawatch.demo import SHOP
from slawatch.engine.ready import prepare
from slawatch.operate.admin import serve_admin
from slawatch.runtime.maintain import prune_batch
from tests.conftest import ROOT
from tests.integration.helpers import Conn, FixedClock, claim_all, shop
from tests.integration.lifecycle_helpers import statuses
from tests.integration.test_cli import assert_one_line_error, slawatch
from tests.integration.test_deliver import shown_deliveries, shown_statuses
from tests.receivers import WebhookReceiver, closed_port

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DUE = T0 + timedelta(hours=48, seconds=1)
# The tests below the first settle, lease, prune and replay today's deliveries one by
# one (slawatch.delivery): pinned to "alerts". The rows' orphans:
# test_outbox_rows_deliver.py.
OUTBOX: Outbox = "alerts"


def folders(tmp_path: Path, notify: str, notifiers: dict[str, str]) -> list[str]:
    """rules/ with order_unshipped notifying ``notify``, and notifiers/ with ``notifiers``
    (name: YAML); the command-line options naming them."""
    rules, hooks = tmp_path / "rules", tmp_path / "notifiers"
    for folder in (rules, hooks):
        folder.mkdir(exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
    text = (ROOT / "rules" / "order_unshipped.yaml").read_text()
    (rules / "order_unshipped.yaml").write_text(text.replace("[console]", f"[{notify}]"))
    for name, body in notifiers.items():
        (hooks / f"{name}.yaml").write_text(body)
    return ["--rules", str(rules), "--notifiers", str(hooks)]


def hook(url: str) -> str:
    return f"type: webhook\nurl: {url}\ntimeout: 2s\nretry: {{first: 1h, max: 2h}}\n"


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_a_removed_notifiers_deliveries_are_orphaned_at_start_and_replayed_elsewhere(
    conn: Conn, dsn: str, tmp_path: Path, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    """What an operator sees, in either shape of the outbox (SLAWATCH_OUTBOX)."""
    env = {"SLAWATCH_OUTBOX": outbox}
    conn.execute(SHOP)
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 990, 'paid', now() - interval '3 days'),"
        " (2, 7, 990, 'paid', now() - interval '3 days')"
    )
    # Notified to `old`, whose receiver is down: both wait to retry.
    old = folders(tmp_path, "old", {"old": hook(f"http://127.0.0.1:{closed_port()}/x")})
    assert slawatch(*old, "migrate", dsn=dsn, env=env).returncode == 0
    ran = slawatch(*old, "run", "--once", dsn=dsn, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "notifier old: 0 sent, 2 retried, 0 dead" in ran.stdout
    assert shown_statuses(conn) == {"pending": 2}
    # `old` is removed, `hook` added: the start settles old's deliveries, in one line.
    new = folders(tmp_path, "hook", {"hook": hook(receiver.url)})
    ran = slawatch(*new, "run", "--once", dsn=dsn, env=env)
    assert ran.returncode == 0, ran.stderr
    lines = [ln for ln in ran.stderr.splitlines() if "orphaned" in ln]
    assert len(lines) == 1, ran.stderr
    assert "2 pending deliveries orphaned: their notifiers are not configured: old (2)" in lines[0]
    assert shown_statuses(conn) == {"orphaned": 2}
    status = slawatch(*new, "status", dsn=dsn, env=env)
    assert "order_unshipped: 2 deliveries orphaned (notifier removed)" in status.stdout
    listed = slawatch(*new, "alerts", "--status", "orphaned", dsn=dsn, env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("old:orphaned(1)") == 2
    # Unknown names: one line each, exit 2, nothing changed.
    for args, says in [
        (["--notifier", "old"], "--notifier: no notifier named 'old' is configured"),
        (["--notifier", "old", "--to", "nope"], "--to: no notifier named 'nope' is configured"),
        (["--to", "hook"], "--to: goes with --notifier"),
        (["--notifier", "olde", "--to", "hook"], "and no dead or orphaned deliveries go to one"),
    ]:
        assert_one_line_error(slawatch(*new, "replay", *args, dsn=dsn, env=env), 2, says)
    assert shown_statuses(conn) == {"orphaned": 2}
    # Sent elsewhere.
    done = slawatch(*new, "replay", "--notifier", "old", "--to", "hook", dsn=dsn, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok: 0 dead and 2 orphaned deliveries back to pending, to hook\n"
    ran = slawatch(*new, "run", "--once", dsn=dsn, env=env)
    assert ran.returncode == 0, ran.stderr
    assert sorted(receiver.alert_ids) == ["order_unshipped:1:e1:n1", "order_unshipped:2:e1:n1"]
    assert shown_statuses(conn) == {"sent": 2}
    assert {d.notifier for d in shown_deliveries(conn)} == {"hook"}


def pending_to(conn: Conn, notify: list[str], count: int = 2) -> Rule:
    """``count`` orders overdue and claimed at DUE, notified to ``notify``."""
    rule = shop(conn)["order_unshipped"].model_copy(update={"notify": notify})
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(1, %s::int) g",
        (T0, count),
    )
    plan = prepare(conn, rule, outbox=OUTBOX).with_act(runner("off"))
    assert claim_all(conn, plan, DUE) == count
    return rule


def test_one_in_flight_is_left_to_its_sender_until_its_lease_runs_out(
    conn: Conn, db: Database
) -> None:
    """Another process still sending it has the notifier: its lease is respected."""
    pending_to(conn, ["old"])
    lease = DUE + timedelta(seconds=30)
    conn.execute(  # leased as the claim leases: next_attempt_at stays (it is due)
        "UPDATE slawatch.delivery SET lease_owner = %s, lease_expires_at = %s"
        " WHERE id = (SELECT min(id) FROM slawatch.delivery)",
        (uuid.uuid4(), lease),
    )
    assert settle_orphans(db, ["console"], FixedClock(DUE + timedelta(seconds=1))) == {"old": 1}
    assert statuses(conn) == {"orphaned": 1, "pending": 1}
    assert settle_orphans(db, ["console"], FixedClock(lease)) == {"old": 1}  # the next look
    assert statuses(conn) == {"orphaned": 2}
    rows = conn.execute("SELECT DISTINCT lease_owner FROM slawatch.delivery").fetchall()
    assert rows == [(None,)]  # fenced: the old sender can no longer settle it


def test_orphaned_history_is_pruned_and_configured_notifiers_are_untouched(
    conn: Conn, db: Database
) -> None:
    pending_to(conn, ["old", "console"])
    cutoff = DUE + timedelta(days=1)
    pruned = prune_batch(conn, cutoff)  # pending deliveries keep their alerts
    assert (pruned.alerts, pruned.deliveries) == (0, 0)
    assert settle_orphans(db, ["console"], FixedClock(DUE)) == {"old": 2}
    assert statuses(conn) == {"orphaned": 2, "pending": 2}
    conn.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE notifier = 'console'")
    pruned = prune_batch(conn, cutoff)
    assert (pruned.alerts, pruned.deliveries) == (2, 4)


def test_replay_to_another_notifier_skips_an_alert_that_went_there_already(
    conn: Conn, db: Database
) -> None:
    pending_to(conn, ["old", "console"])
    settle_orphans(db, ["console"], FixedClock(DUE))
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'dead' WHERE notifier = 'console'"
        " AND alert_id = (SELECT min(alert_id) FROM slawatch.delivery)"
    )
    with db.connection("replay") as c:
        done = replay_deliveries(c, DUE, None, "old", to="console", configured=["console"])
    # Both alerts have a delivery to console already: old's stay orphaned.
    assert (done.count, done.taken, done.left) == (0, 2, 0)
    with db.connection("replay") as c:
        done = replay_deliveries(c, DUE, None, None, configured=["console"])
    # The dead one goes back to console; the orphaned ones are not configured anywhere.
    assert (done.dead, done.orphaned, done.left) == (1, 0, 2)
    assert statuses(conn) == {"orphaned": 2, "pending": 2}


def test_the_admin_api_replays_to_another_notifier(conn: Conn, dsn: str, db: Database) -> None:
    rules = load_rules(ROOT / "rules")
    pending_to(conn, ["old"])
    settle_orphans(db, ["console"], FixedClock(DUE))
    server = serve_admin(
        dsn, ("127.0.0.1", 0), rules, ["console"], token=None, timeout=5, pooler="auto"
    )
    try:
        with httpx.Client(base_url=server.url, timeout=10) as api:
            refused = api.post("/v1/replay", json={"notifier": "old"})
            assert refused.status_code == 400
            assert refused.json()["error"].startswith(
                "notifier: no notifier named 'old' is configured"
            )
            refused = api.post("/v1/replay", json={"notifier": "old", "to": "pager"})
            assert refused.status_code == 400
            assert refused.json()["error"] == "to: no notifier named 'pager' is configured"
            assert api.post("/v1/replay").json() == {"replayed": 0, "left": 2}
            # The page shows them as what they are.
            assert api.get("/").text.count('<li class="st-orphaned"><b>old</b> orphaned') == 2
            moved = api.post("/v1/replay", json={"notifier": "old", "to": "console"})
            assert moved.json() == {"replayed": 2, "orphaned": 2}
            page = api.get("/v1/alerts", params={"status": "orphaned"}).json()
            assert page["alerts"] == []
    finally:
        server.stop()
    assert statuses(conn) == {"pending": 2}


def test_maintenance_orphans_only_what_was_due_for_its_grace(conn: Conn, db: Database) -> None:
    """A fleet mid-reload: an instance that does not have notifier `new` yet must not
    orphan `new`'s fresh deliveries in its maintenance; once they were due for the grace
    (nobody sent them), it does. Start and reload (no grace) settle them at once, even
    one waiting to retry."""
    from slawatch.runtime.scheduler import ORPHAN_GRACE

    pending_to(conn, ["new"])
    conn.execute("UPDATE slawatch.delivery SET next_attempt_at = %s", (DUE,))
    soon = FixedClock(DUE + ORPHAN_GRACE - timedelta(seconds=1))
    assert settle_orphans(db, ["console"], soon, ORPHAN_GRACE) == {}
    assert statuses(conn) == {"pending": 2}
    later = FixedClock(DUE + ORPHAN_GRACE)
    assert settle_orphans(db, ["console"], later, ORPHAN_GRACE) == {"new": 2}
    assert statuses(conn) == {"orphaned": 2}
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'pending', next_attempt_at = %s",
        (DUE + timedelta(hours=1),),
    )
    assert settle_orphans(db, ["console"], FixedClock(DUE)) == {"new": 2}


def test_a_lease_that_ran_out_is_given_the_grace_from_when_it_ran_out(
    conn: Conn, db: Database
) -> None:
    """The claim's lease leaves next_attempt_at at the due time: a delivery whose
    sender stalled is due again when its lease runs out, and maintenance gives it the
    grace from then (another instance may still have the notifier and take it over)."""
    from slawatch.runtime.scheduler import ORPHAN_GRACE

    pending_to(conn, ["new"])
    conn.execute("UPDATE slawatch.delivery SET next_attempt_at = %s", (DUE,))
    ran_out = DUE + timedelta(hours=1)
    conn.execute(
        "UPDATE slawatch.delivery SET lease_owner = %s, lease_expires_at = %s"
        " WHERE id = (SELECT min(id) FROM slawatch.delivery)",
        (uuid.uuid4(), ran_out),
    )
    soon = FixedClock(ran_out + ORPHAN_GRACE - timedelta(seconds=1))
    assert settle_orphans(db, ["console"], soon, ORPHAN_GRACE) == {"new": 1}
    assert statuses(conn) == {"orphaned": 1, "pending": 1}
    later = FixedClock(ran_out + ORPHAN_GRACE)
    assert settle_orphans(db, ["console"], later, ORPHAN_GRACE) == {"new": 1}
    assert statuses(conn) == {"orphaned": 2}
