"""One definition of a rule at a time (issue 24): migrate records each rule's
generation, and every claim, sweep and timer housekeeping of an instance running
another definition of the rule is refused by the database and changes nothing.
The fleet itself (two real ``slawatch run``, reloaded one after the other) is
test_reload.py's."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from slawatch.commands import cmd_check, cmd_dry_run
from slawatch.config.notifiers import ConsoleConfig
from slawatch.config.rules import Rule
from slawatch.config.settings import Settings
from slawatch.engine import generation
from slawatch.engine.migrate import migrate, plan, render
from slawatch.engine.ready import prepare
from slawatch.errors import DatabaseError
from slawatch.operate.inspect import rule_status
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.helpers import DAY, Conn, alerts_of, claim_all, shop
from tests.waiting import lock_waits, wait_until

NOW = datetime(2026, 3, 10, tzinfo=UTC)
WIDE = "status IN ('paid', 'packed')"


def widened(rule: Rule) -> Rule:
    return rule.model_copy(update={"open_when": WIDE})


def orders(conn: Conn) -> None:
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (NOW - 3 * DAY,))
    conn.execute("INSERT INTO orders VALUES (2, 7, 100, 'packed', %s)", (NOW - 3 * DAY,))


def written(conn: Conn) -> tuple[int, int]:
    """Alerts (in either shape of the outbox) and episode history rows: what a claim
    writes."""
    (episodes,) = conn.execute("SELECT count(*) FROM slawatch.episode").fetchone() or (0,)
    return len(alerts_of(conn, None, "key")), int(episodes)


def test_migrate_records_each_rules_definition_and_names_what_changed(conn: Conn) -> None:
    rules = shop(conn)
    got = generation.recorded(conn)
    assert set(got) == set(rules)
    rule = rules["order_unshipped"]
    assert got[rule.name].generation == generation.generation(rule)
    assert set(got[rule.name].definition) == set(generation.PARTS)
    # Only what decides episodes counts: a severity is not part of the definition.
    assert generation.generation(rule.model_copy(update={"severity": "critical"})) == (
        generation.generation(rule)
    )
    wide = widened(rule)
    assert plan(conn, list(rules.values())) == []  # recorded: nothing to do
    done = migrate(conn, [wide])
    assert (
        "rule order_unshipped: definition recorded (open_when changed): instances running"
        " the previous one stop claiming it until they are reloaded"
    ) in done
    assert generation.recorded(conn)[rule.name].generation == generation.generation(wide)
    printed = render([wide])  # without a database: every rule's record, last
    assert "SELECT slawatch.record_generation('order_unshipped', " in printed


@pytest.mark.parametrize("track", ["inline", "table"])
def test_a_claim_of_a_definition_not_recorded_changes_nothing(conn: Conn, track: str) -> None:
    """The instance not reloaded yet: its claims (and, track: table, its sweep) are
    refused by the database; the reloaded one's go through."""
    rule = shop(conn, track)["order_unshipped"]
    orders(conn)
    old = prepare(conn, rule)
    migrate(conn, [widened(rule)])
    with pytest.raises(DatabaseError) as refused:
        claim_all(conn, old, NOW)
    assert generation.refusal(refused.value) == "stale"
    assert "this instance runs definition" in str(refused.value)
    assert written(conn) == (0, 0)
    assert claim_all(conn, prepare(conn, widened(rule)), NOW) == 2  # both orders


def test_a_rule_never_recorded_is_claimed_as_before(conn: Conn) -> None:
    """A database upgraded to the record but not migrated with the rule since: claimed."""
    rule = shop(conn)["order_unshipped"]
    orders(conn)
    conn.execute("DELETE FROM slawatch.rule_generation")
    assert claim_all(conn, prepare(conn, rule), NOW) == 1


def test_recording_waits_for_claims_in_flight_and_claims_meanwhile_give_way(
    conn: Conn, dsn: str
) -> None:
    """The fleet race: migrate records a definition (here a longer ``after``) while a
    claim under the old one is in flight. The record waits for that claim's commit; a
    claim that starts while the record waits or holds gives way at once ('busy',
    nothing written), and after the record only the recorded definition claims."""
    rule = shop(conn)["order_unshipped"]
    later = rule.model_copy(update={"after": rule.after + timedelta(hours=1)})
    orders(conn)
    old = prepare(conn, rule)

    def record() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            migrate(own, [later])

    with psycopg.connect(dsn) as in_flight:  # a claim of the old definition, not committed
        in_flight.execute(
            "SELECT slawatch.claim_gate(%s, %s)", (rule.name, generation.generation(rule))
        )
        recording = threading.Thread(target=record)
        recording.start()
        wait_until(lambda: lock_waits(conn) == ["advisory"], "the record waiting for the claim")
        with pytest.raises(DatabaseError) as gave_way:
            claim_all(conn, old, NOW)
        assert generation.refusal(gave_way.value) == "busy"
        assert written(conn) == (0, 0)
        assert recording.is_alive()
        in_flight.commit()
    recording.join(30)
    assert not recording.is_alive()
    with pytest.raises(DatabaseError) as refused:
        claim_all(conn, old, NOW)
    assert generation.refusal(refused.value) == "stale"
    assert claim_all(conn, prepare(conn, later), NOW) == 1


def test_status_and_check_name_a_rule_whose_files_are_not_the_recorded_definition(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rule = shop(conn)["order_unshipped"]
    wide = widened(rule)
    (tmp_path / "rules").mkdir()
    shipped = (ROOT / "rules" / "order_unshipped.yaml").read_text()
    (tmp_path / "rules" / "order_unshipped.yaml").write_text(
        shipped.replace("status = 'paid'", WIDE)
    )
    ((status,),) = [rule_status(conn, [wide], NOW)]
    assert status.definition is not None and "(open_when differ)" in status.definition
    assert rule_status(conn, [rule], NOW)[0].definition is None
    settings = Settings(rules_dir=tmp_path / "rules", notifiers_dir=ROOT / "notifiers", dsn=dsn)
    assert cmd_check(settings) == 1  # not ready: run would not claim it
    out = capsys.readouterr().out
    assert "; not the definition slawatch migrate recorded at " in out
    assert "(open_when differ)" in out
    # A change that needs no new index: run would start, and not claim it.
    (tmp_path / "rules" / "order_unshipped.yaml").write_text(shipped.replace("48h", "49h"))
    assert cmd_dry_run(settings, as_json=False) == 0
    assert "    but not the definition slawatch migrate recorded at " in capsys.readouterr().out


def test_an_idle_instance_sees_its_rule_turn_stale_and_current_again(conn: Conn, dsn: str) -> None:
    """Nothing due, so no claim asks the gate: the records read again (every
    REREAD; here at once) tell /readyz and the metric, one log line each way."""
    rule = shop(conn)["order_unshipped"]
    later = rule.model_copy(update={"after": rule.after + timedelta(hours=1)})
    runner = Runner(dsn, [rule], [ConsoleConfig(name="console", type="console")], poll=0.2)
    runner.definitions.reread = 0.0
    turns: list[tuple[str, bool]] = []
    runner.definitions.changed = lambda name, stale: turns.append((name, stale))
    try:
        assert runner.scan(rule.name) is not None and turns == []
        migrate(conn, [later])
        assert runner.scan(rule.name) is None  # skipped: not this instance's to claim
        assert turns == [(rule.name, True)]
        assert runner.health()["definition"] == {rule.name: False}
        assert runner.scan(rule.name) is None and turns == [(rule.name, True)]  # said once
        migrate(conn, [rule])  # the record moves back to this instance's definition
        assert runner.scan(rule.name) is not None
        assert turns == [(rule.name, True), (rule.name, False)]
        assert runner.health()["definition"] == {rule.name: True}
    finally:
        runner.close()


def test_a_stale_rule_is_said_stale_by_the_parts_of_the_definition_recorded_now(
    conn: Conn, dsn: str
) -> None:
    """The records read every few seconds are the generations alone; the line that
    names the parts that differ comes from the definition recorded when the rule is
    found stale, each time it is: a rule stale again, against another definition,
    names that one's parts."""
    from slawatch.db import Database
    from slawatch.runtime.definitions import Definitions

    rule = shop(conn)["order_unshipped"]
    later = rule.model_copy(update={"after": rule.after + timedelta(hours=1)})
    elsewhere = rule.model_copy(update={"open_when": f"({rule.open_when}) AND total_cents > 0"})
    db = Database(dsn, size=1, timeout=10)
    said: list[str] = []
    definitions = Definitions(db, reread=0.0)
    definitions._set = lambda name, why: said.append(why or "")  # type: ignore[method-assign]
    try:
        assert definitions.check(rule)
        migrate(conn, [later])
        assert not definitions.check(rule)
        assert "(after differ)" in said[-1]
        migrate(conn, [rule])
        assert definitions.check(rule)
        migrate(conn, [elsewhere])
        assert not definitions.check(rule)
        assert "(open_when differ)" in said[-1]
    finally:
        db.close()


def test_run_once_with_a_stale_rule_fails_naming_it_and_records_no_scan(
    conn: Conn, dsn: str
) -> None:
    rule = shop(conn)["order_unshipped"]
    orders(conn)
    runner = Runner(dsn, [rule], [ConsoleConfig(name="console", type="console")])
    try:
        migrate(conn, [widened(rule)])
        result = runner.once()
    finally:
        runner.close()
    assert result.failed and result.rules == {rule.name: None}
    (error,) = result.errors
    assert f"rule {rule.name}: this instance runs definition" in error
    assert written(conn) == (0, 0)
    # Not a failure of the rule's scans: the instances running the recorded one scan it.
    assert conn.execute("SELECT count(*) FROM slawatch.scan").fetchone() == (0,)
