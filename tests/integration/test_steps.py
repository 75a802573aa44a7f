"""A step of rules scanned together: their probes in one statement (engine/steps.py),
the rules with something due scanned one by one (Runner.scan_step)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from slawatch.clock import Clock
from slawatch.db import Database, Pooler
from slawatch.engine import probefn
from slawatch.engine.claim import ClaimPlan, anything_due
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.engine.steps import askable, probe_step
from slawatch.runtime import scheduler as scheduler_module
from slawatch.runtime.scheduler import Runner, Step
from tests.integration.helpers import Conn, alerts_of, shop
from tests.integration.test_round_trips import round_trips
from tests.waiting import wait_until

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def fired(conn: Conn) -> list[tuple[str, str]]:
    """(rule, key) of every alert of every rule, in either shape of the outbox, in order."""
    return [(rule, key) for rule, key in alerts_of(conn, None, "rule", "key")]


class Fixed(Clock):
    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


def overdue(conn: Conn, order: int = 1, refund: int | None = None) -> None:
    """A paid order not shipped for 3 days (order_unshipped is due), and with
    ``refund`` a refund requested 4 days ago (refund_unprocessed is due)."""
    conn.execute(
        "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
        " VALUES (%s, 7, 100, 'paid', %s)",
        (order, NOW - timedelta(days=3)),
    )
    if refund is not None:
        conn.execute(
            "INSERT INTO refunds (id, order_id, amount_cents, status, requested_at)"
            " VALUES (%s, 1, 100, 'requested', %s)",
            (refund, NOW - timedelta(days=4)),
        )


def asked(conn: Conn) -> list[ClaimPlan]:
    """The shop's rules that a step asks (inline and event rules), order_unshipped
    neither first nor last."""
    plans = [prepare(conn, r) for r in shop(conn).values()]
    plans = [p for p in plans if askable(p)]
    plans.sort(key=lambda p: (p.rule.name != "refund_unprocessed", p.rule.name))
    assert len(plans) >= 4 and plans[0].rule.name == "refund_unprocessed"
    assert plans[-1].rule.name != "order_unshipped"
    return plans


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_a_step_is_asked_in_one_statement_and_each_rule_gets_its_own_probes_answer(
    conn: Conn, dsn: str, pooler: Pooler
) -> None:
    """Where the connection prepares (the probes' values side by side) and behind a
    pooler (the rules' probe functions): one round trip for the step, and each rule's
    answer is what its own probe says, as its work comes and goes."""
    plans = asked(conn)
    with Database(dsn, size=1, timeout=10, pooler=pooler) as db, db.connection("t") as c:

        def each() -> list[bool | None]:
            return [anything_due(c, p, NOW) for p in plans]

        got = probe_step(c, plans, NOW)
        assert got == each() and not any(got)
        overdue(conn, 1)
        got = probe_step(c, plans, NOW)
        assert got == each() and got.count(True) == 1
        assert got[[p.rule.name for p in plans].index("order_unshipped")] is True
        conn.execute("DELETE FROM orders")
        overdue(conn, 2, refund=1)
        got = probe_step(c, plans, NOW)
        assert got == each() and got.count(True) == 2 and got[0] is True
        assert round_trips(c, lambda: probe_step(c, plans, NOW)) == 1
        assert probe_step(c, [], NOW) == []


def runner_of(conn: Conn, dsn: str, names: list[str]) -> Runner:
    rules = shop(conn)
    return Runner(dsn, [rules[n] for n in names], [], Fixed(NOW), actions="off")


STEP = ["order_unshipped", "refund_unprocessed", "parcel_undelivered"]


def alone(runner: Runner) -> list[str]:
    """The rules ``runner`` scans with a scan of their own from now on, in order."""
    own: list[str] = []
    scan = runner.scan

    def scanning(rule: str) -> Any:
        own.append(rule)
        return scan(rule)

    runner.scan = scanning  # type: ignore[method-assign]
    return own


def test_a_steps_idle_rules_are_scanned_without_a_scan_of_their_own(conn: Conn, dsn: str) -> None:
    """The rule with something due is claimed by a scan of its own; the idle ones are
    each recorded scanned, claiming nothing, with no scan of their own."""
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)
    try:
        runner._held.clear()  # no held action to run again: every rule is asked
        overdue(conn, 1)
        own = alone(runner)
        runner.scan_step(step)
        assert own == ["order_unshipped"]
        alerts = fired(conn)
        assert alerts == [("order_unshipped", "1")]
        assert set(runner._scan_records._ran) == set(STEP)
        recorded = conn.execute("SELECT rule, claimed, error FROM slawatch.scan").fetchall()
        assert sorted(recorded) == [
            ("order_unshipped", 1, None),
            ("parcel_undelivered", 0, None),
            ("refund_unprocessed", 0, None),
        ]
        runner.scan_step(step)  # notified: idle now
        assert own == ["order_unshipped"]
    finally:
        runner.close()


def test_a_step_whose_statement_fails_scans_each_rule_alone(
    conn: Conn, dsn: str, caplog: Any
) -> None:
    """One rule's probe that fails (its table gone) fails the step's statement: each
    rule is then scanned alone, the others claim as before, the broken one says why
    and backs off; the step says so once, its statement backs off too, and once that
    backoff is over the others are asked in one statement again (one line more)."""
    caplog.set_level(logging.INFO, logger="slawatch")
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)
    try:
        runner._held.clear()
        overdue(conn, 1, refund=1)
        conn.execute("ALTER TABLE refunds RENAME TO refunds_gone")
        own = alone(runner)
        runner.scan_step(step)
        # Each asked alone first: the due one and the broken one get a scan of their own.
        assert sorted(own) == ["order_unshipped", "refund_unprocessed"]
        alerts = fired(conn)
        assert alerts == [("order_unshipped", "1")]
        failing = [r.message for r in caplog.records if "refund_unprocessed" in r.message]
        assert len(failing) == 2
        assert failing[0].startswith("the probes of the step of rule order_unshipped failing:")
        assert failing[1].startswith("rule refund_unprocessed: scans failing:")
        assert runner._running["refund_unprocessed"].retry_at > 0
        assert runner._running["order_unshipped"].retry_at == 0
        assert step.retry_at > 0
        own.clear()
        before = scans_of(runner)
        runner.scan_step(step)  # the statement backs off: every rule asked alone
        assert own == []  # nothing due: none scanned on its own, each recorded scanned
        after = scans_of(runner)
        assert [after[n] - before[n] for n in STEP] == [1, 0, 1]  # refund_: backing off
        own.clear()
        step.retry_at = 0.0  # its backoff over; refund_unprocessed's is not
        overdue(conn, 2)
        runner.scan_step(step)
        assert own == ["order_unshipped"]  # due; the others asked in one statement
        alerts = fired(conn)
        assert alerts == [("order_unshipped", "1"), ("order_unshipped", "2")]
        lines = [r.message for r in caplog.records if r.message.startswith("the probes of")]
        assert len(lines) == 2 and "working again" in lines[1]
    finally:
        runner.close()


def test_a_rule_whose_scan_still_runs_is_left_to_it(conn: Conn, dsn: str, caplog: Any) -> None:
    """No second scan of a rule starts while one runs (or waits for a thread); one
    that runs for far longer than a scan may is said once, as the rule's trouble."""
    caplog.set_level(logging.INFO, logger="slawatch")
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)
    try:
        runner._held.clear()
        overdue(conn, 1)
        assert runner._take("order_unshipped")
        runner.scan_step(step)
        assert fired(conn) == []
        assert not [r for r in caplog.records if "has been running" in r.message]
        runner._busy["order_unshipped"] -= 91  # began 91 s ago (every: 30s)
        runner.scan_step(step)
        runner.scan_step(step)
        lines = [r for r in caplog.records if "has been running" in r.message]
        assert len(lines) == 1 and lines[0].levelno == logging.ERROR
        assert lines[0].message.startswith("rule order_unshipped: scans failing: its scan")
        runner._release("order_unshipped")
        runner.scan_step(step)
        assert len(fired(conn)) == 1
    finally:
        runner.close()


def test_a_stuck_scan_is_said_by_the_beat_too(conn: Conn, dsn: str, caplog: Any) -> None:
    """The step jobs run on the scan threads: when every scan thread is stuck, they
    wait behind the stuck scans and say nothing. The beat (on the default executor)
    says a scan that has run for too long too, once."""
    caplog.set_level(logging.INFO, logger="slawatch")
    runner = runner_of(conn, dsn, STEP)
    try:
        assert runner._take("order_unshipped")  # its scan runs (or waits for a thread)
        runner.beat()
        assert not [r for r in caplog.records if "has been running" in r.message]
        runner._busy["order_unshipped"] -= 91  # began 91 s ago (every: 30s)
        runner.beat()
        runner.beat()
        lines = [r for r in caplog.records if "has been running" in r.message]
        assert len(lines) == 1 and lines[0].levelno == logging.ERROR
        assert lines[0].message.startswith("rule order_unshipped: scans failing: its scan")
    finally:
        runner._release("order_unshipped")
        runner.close()


def test_a_rule_whose_recorded_definition_is_another_is_not_scanned(conn: Conn, dsn: str) -> None:
    """As its own scan would: idle, not recorded scanned; due, not claimed (its own
    scan skips it); the step's other rules are scanned."""
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)
    try:
        runner._held.clear()
        runner.definitions.reread = 0.0
        rule = runner.rules["order_unshipped"]
        migrate(conn, [rule.model_copy(update={"after": rule.after + timedelta(hours=1)})])
        runner.scan_step(step)
        assert set(runner._scan_records._ran) == set(STEP) - {"order_unshipped"}
        overdue(conn, 1, refund=1)
        runner.scan_step(step)
        assert [rule for rule, _ in fired(conn)] == ["refund_unprocessed"]
        assert set(runner._scan_records._ran) == set(STEP) - {"order_unshipped"}
    finally:
        runner.close()


def test_a_reload_keeps_each_rule_in_one_step_at_its_every(conn: Conn, dsn: str) -> None:
    """A rule removed leaves its step (which keeps its time), a rule whose `every`
    changed moves to a step of that `every`, a rule added joins a step with room; every
    rule is in exactly one step job."""
    rules = shop(conn)
    runner = Runner(dsn, [rules[n] for n in STEP], [], actions="off")
    serving = threading.Thread(target=runner.serve, kwargs={"seconds": 60}, daemon=True)

    def steps() -> dict[str, tuple[list[str], float]]:
        assert runner._scheduler is not None
        jobs = [j for j in runner._scheduler.get_jobs() if j.id.startswith("scan:")]
        return {j.id: (sorted(j.args[0].names), j.trigger.interval.total_seconds()) for j in jobs}

    try:
        serving.start()
        wait_until(lambda: runner._scheduler is not None and bool(steps()), "the scan jobs")
        ((first, (names, every)),) = steps().items()
        assert names == sorted(STEP) and every == 30
        order = rules["order_unshipped"]
        faster = order.model_copy(update={"every": timedelta(seconds=10)})
        keep = [faster, rules["refund_unprocessed"], rules["job_hung"]]
        assert runner.apply(keep, [])
        got = steps()
        # job_hung, added, joins the step of its `every` with room.
        assert got[first] == (["job_hung", "refund_unprocessed"], 30)
        assert sorted(got.values()) == [
            (["job_hung", "refund_unprocessed"], 30),
            (["order_unshipped"], 10),
        ]
    finally:
        runner.stop()
        serving.join(timeout=30)
        runner.close()


def test_a_bug_in_a_step_scans_its_rules_one_by_one_and_says_so_once(
    conn: Conn, dsn: str, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's job that would die on an unexpected exception would leave its rules
    unscanned in silence: they are scanned alone, and one ERROR line says why."""
    caplog.set_level(logging.INFO, logger="slawatch")
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)

    def broken(plan: ClaimPlan) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr(scheduler_module, "askable", broken)
    try:
        overdue(conn, 1)
        runner.scan_step(step)
        runner.scan_step(step)
        alerts = fired(conn)
        assert alerts == [("order_unshipped", "1")]
        lines = [r for r in caplog.records if r.message.startswith("the probes of the step")]
        assert len(lines) == 1 and lines[0].levelno == logging.ERROR
        assert "unexpected RuntimeError: a bug" in lines[0].message
    finally:
        runner.close()


def scans_of(runner: Runner) -> dict[str, float]:
    """Each rule's scans that succeeded so far, its own or its step's
    (``slawatch_scan_duration_seconds``)."""
    got = {}
    for name in runner.rules:
        value = runner.registry.get_sample_value(
            "slawatch_scan_duration_seconds_count", {"rule": name}
        )
        got[name] = value or 0.0
    return got


def test_a_bug_in_a_steps_probes_backs_its_statement_off_and_says_so_once(
    conn: Conn, dsn: str, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception in the step's statement (its probes' building) is a
    bug: the statement backs off as a failing one does, its rules are scanned alone at
    every tick meanwhile, one ERROR line says it (not one per try, nor a line of its end
    for a tick that did not ask), and once fixed the step is asked together again."""
    caplog.set_level(logging.INFO, logger="slawatch")
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)
    tried: list[int] = []

    def broken(conn: Any, plans: list[ClaimPlan], now: datetime) -> list[bool | None]:
        if len(plans) > 1:  # the step's statement (a rule asked alone: one plan)
            tried.append(1)
        raise RuntimeError("a bug")

    monkeypatch.setattr(scheduler_module, "probe_step", broken)
    try:
        runner._held.clear()
        own = alone(runner)

        def tick() -> None:
            before = scans_of(runner)
            own.clear()
            runner.scan_step(step)
            assert sorted(own) == sorted(STEP)  # each rule scanned alone...
            after = scans_of(runner)
            assert all(after[n] == before[n] + 1 for n in STEP)  # ...and its scan went well

        tick()  # the bug: one ERROR, every rule alone
        assert len(tried) == 1 and step.retry_at > 0
        tick()  # the statement backs off: not tried
        tick()
        assert len(tried) == 1
        step.retry_at = 0.0  # its backoff over: every rule busy, none to ask this tick
        for name in STEP:
            assert runner._take(name)
        runner.scan_step(step)
        for name in STEP:
            runner._release(name)
        tick()  # tried again: still the bug, said already
        assert len(tried) == 2
        lines = [r for r in caplog.records if r.message.startswith("the probes of the step")]
        assert len(lines) == 1 and lines[0].levelno == logging.ERROR
        assert "unexpected RuntimeError: a bug" in lines[0].message
        monkeypatch.undo()  # fixed
        step.retry_at = 0.0
        own.clear()
        runner.scan_step(step)
        assert own == []  # idle, asked together: no scan of their own
        lines = [r for r in caplog.records if r.message.startswith("the probes of the step")]
        assert len(lines) == 2 and "working again" in lines[1].message
    finally:
        runner.close()


def sent(runner: Runner) -> list[str]:
    """The statements ``runner`` sends from now on, on whichever pooled connection
    (each traced while taken), in order: the first line of each (Parse or Query)."""
    out: list[str] = []
    connection = runner.db.connection

    @contextlib.contextmanager
    def traced(what: str, **kwargs: Any) -> Iterator[Any]:
        with connection(what, **kwargs) as conn, tempfile.TemporaryFile("w+") as trace:
            conn.pgconn.trace(trace.fileno())
            try:
                yield conn
            finally:
                conn.pgconn.untrace()
                trace.seek(0)
                for f in (line.split("\t") for line in trace.read().splitlines()):
                    if len(f) > 3 and f[1] == "F" and f[3] in ("Parse", "Query"):
                        out.append(f[-1])

    runner.db.connection = traced  # type: ignore[method-assign]
    return out


def test_behind_a_pooler_a_function_answering_null_is_left_out_for_the_probe_text(
    conn: Conn, dsn: str
) -> None:
    """Behind a transaction pooler a rule whose function is another definition's (a
    rolling deploy) answers NULL: the rule is scanned alone with its probe's text, and
    from then on neither the step nor its scan calls that function (the step's
    statement and the rule's text each tick, not its call besides) until RECHECK has
    passed; it still claims what comes due, and once its function is its definition's
    again it is asked with its step again."""
    rules = shop(conn)
    runner = Runner(
        dsn, [rules[n] for n in STEP], [], Fixed(NOW), actions="off", pooler="transaction"
    )
    step = Step.of(list(STEP), 30.0)
    fn = runner.plans["order_unshipped"].probe_fn
    assert fn is not None and fn.answers
    # Another definition's function: its digest is not this instance's.
    row = conn.execute(
        "SELECT pg_get_functiondef('slawatch.order_unshipped_probe'::regproc)"
    ).fetchone()
    assert row is not None
    conn.execute(row[0].replace(fn.definition.digest, "0" * 16))
    try:
        runner._held.clear()
        runner.definitions.reread = 3600.0  # the records read once: no reads between ticks
        own = alone(runner)
        runner.scan_step(step)  # NULL: scanned alone, with its probe's text
        assert own == ["order_unshipped"] and not fn.answers
        for _ in range(3):
            before = scans_of(runner)
            own.clear()
            statements = sent(runner)
            runner.scan_step(step)
            del runner.db.connection  # untraced
            assert own == ["order_unshipped"]
            assert all(scans_of(runner)[n] == before[n] + 1 for n in STEP)
            # The step's (lock_timeout, then the other rules' calls) and the rule's text.
            assert len(statements) == 3, statements
            assert not [s for s in statements if "order_unshipped_probe" in s]
            assert "refund_unprocessed_probe" in statements[1]
        overdue(conn, 1)
        runner.scan_step(step)  # never quiet: its text sees the order
        assert fired(conn) == [("order_unshipped", "1")]
        runner.scan_step(step)  # notified: idle
        migrate(conn, list(rules.values()))  # its definition's function again
        assert fn.declined is not None
        fn.declined -= probefn.RECHECK  # RECHECK has passed
        own.clear()
        runner.scan_step(step)
        assert own == [] and fn.answers  # asked with its step, and answering
    finally:
        runner.close()


def test_a_table_held_locked_holds_up_its_rule_only(conn: Conn, dsn: str, caplog: Any) -> None:
    """A rule's table held by a LOCK TABLE (an ALTER TABLE, a VACUUM FULL) fails the
    step's statement within its lock_timeout instead of holding it. Each rule is then
    asked alone, as safe from the lock: the locked rule says so as its trouble and
    backs off, with no scan of its own (which would wait for the lock on a scan thread
    the other rules need: with two threads, two such rules stopped every rule); the
    others are scanned and claim while the lock is held. Once it is gone, the locked
    rule claims at its next scan."""
    caplog.set_level(logging.INFO, logger="slawatch")
    runner = runner_of(conn, dsn, STEP)
    step = Step.of(list(STEP), 30.0)
    own = alone(runner)
    other = psycopg.connect(dsn, autocommit=False)
    done = threading.Event()

    def scanning() -> None:
        runner.scan_step(step)
        done.set()

    def alerted() -> list[tuple[str]]:
        return [(rule,) for rule, _ in fired(conn)]

    try:
        runner._held.clear()
        overdue(conn, 1, refund=1)
        other.execute("LOCK TABLE refunds")
        threading.Thread(target=scanning, daemon=True).start()
        wait_until(done.is_set, "the step's scans, while the lock is held")
        assert alerted() == [("order_unshipped",)]
        assert own == ["order_unshipped"]
        locked = runner._running["refund_unprocessed"]
        assert locked.trouble.failing and locked.retry_at > 0
        # The lock is that rule's trouble, not the step's: its statement does not back off.
        assert not [r for r in caplog.records if r.message.startswith("the probes of")]
        assert step.retry_at == 0
        # The statement backs off: the next tick asks each rule alone, as safe.
        done.clear()
        threading.Thread(target=scanning, daemon=True).start()
        wait_until(done.is_set, "the next tick's scans, while the lock is held")
        assert own == ["order_unshipped"] and alerted() == [("order_unshipped",)]
        other.rollback()
        locked.retry_at = 0.0  # its backoff waited out
        runner.scan_step(step)
        assert alerted() == [("order_unshipped",), ("refund_unprocessed",)]
        assert own == ["order_unshipped", "refund_unprocessed"]
        assert not locked.trouble.failing
    finally:
        other.close()
        runner.close()


def test_a_rule_whose_held_actions_may_run_again_is_scanned_alone(conn: Conn, dsn: str) -> None:
    """At start every rule may have actions held for a retry (another run's): each is
    scanned alone once, which looks; then, none held, it is asked with its step."""
    rules = shop(conn)
    runner = Runner(dsn, [rules[n] for n in STEP], [], Fixed(NOW), actions="on")
    step = Step.of(list(STEP), 30.0)
    try:
        own = alone(runner)
        runner.scan_step(step)
        assert sorted(own) == sorted(STEP)
        own.clear()
        runner.scan_step(step)
        assert own == []
    finally:
        runner.close()


def test_a_reload_that_grows_the_scan_threads_while_a_step_hands_off_loses_no_rule(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload adds rules while a step's job, on the first executor's one thread, is
    handing its rule off: the executor is replaced by a larger one (its threads follow
    the rules), the hand-off meets the old one shut down and scans on its own thread,
    the old thread then ends; no rule is scanned twice at once (that scan, held, while
    its step runs on the new threads), and every rule, old and added, is scanned after
    the reload (``track: table`` rules: each handed off at every tick)."""
    monkeypatch.setattr(scheduler_module, "STEP_RULES", 6)
    base = shop(conn, "table")["order_unshipped"]
    rules = [
        base.model_copy(update={"name": f"late{i:02}", "every": timedelta(seconds=1)})
        for i in range(12)
    ]
    migrate(conn, rules)
    runner = Runner(dsn, rules[:1], [], scan_connections=4, actions="off")
    lock = threading.Lock()
    scanning: set[str] = set()
    twice: list[str] = []
    where: dict[str, list[str]] = {}
    scan, scan_step = runner.scan, runner.scan_step
    stepped = threading.Event()  # late00's step ran twice on the new threads

    def scanned(rule: str) -> Any:
        here = threading.current_thread().name
        with lock:
            if rule in scanning:
                twice.append(rule)
            scanning.add(rule)
            where.setdefault(rule, []).append(here)
        try:
            if here == "scans_0":  # the hand-off on the old thread: its step runs meanwhile
                stepped.wait(60)
            return scan(rule)
        finally:
            with lock:
                scanning.discard(rule)

    new_runs: list[str] = []

    def stepping(step: Step) -> None:
        scan_step(step)
        if "late00" in step.names and threading.current_thread().name.startswith("scans-4"):
            new_runs.append(threading.current_thread().name)
            if len(new_runs) >= 2:
                stepped.set()

    runner.scan = scanned  # type: ignore[method-assign]
    runner.scan_step = stepping  # type: ignore[method-assign]
    handing, resume = threading.Event(), threading.Event()
    serving = threading.Thread(target=runner.serve, kwargs={"seconds": 60}, daemon=True)
    try:
        serving.start()
        wait_until(lambda: runner._scan_executor is not None, "the scan threads")
        first = runner._scan_executor
        assert first is not None and first.threads == 1
        call = first.call

        def held(run: Any) -> None:  # the first hand-off waits for the reload
            if not handing.is_set():
                handing.set()
                resume.wait(60)
            call(run)

        first.call = held  # type: ignore[method-assign]
        wait_until(handing.is_set, "a step handing its rule off")
        assert runner.apply(rules, [])
        assert runner._scan_executor is not first and runner._scan_threads == 4
        before = scans_of(runner)
        resume.set()
        wait_until(
            lambda: all(n >= before.get(r, 0) + 2 for r, n in scans_of(runner).items()),
            "every rule scanned twice after the reload",
        )
        # The hand-off met the old executor shut down: on the step's own thread.
        assert where["late00"][0] == "scans_0"
        wait_until(
            lambda: not [t for t in threading.enumerate() if t.name == "scans_0"],
            "the old scan thread's end",
        )
    finally:
        resume.set()
        stepped.set()
        runner.stop()
        serving.join(timeout=30)
        runner.close()
    assert twice == []
    assert sorted(where) == [r.name for r in rules]


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_a_table_rules_scan_on_a_locked_table_says_so_and_backs_off(
    conn: Conn, dsn: str, caplog: Any, pooler: Pooler
) -> None:
    """A `track: table` rule has a scan of its own at every tick; between sweeps it
    probes its table with the step's lock_timeout (its probe's text where the
    connection prepares, its function behind a pooler). A lock on the table fails the
    probe at once, said as the rule's trouble, and the rule backs off: the scan thread
    is not held for as long as the lock (two such rules held both default threads, and
    every rule stopped, saying nothing). Once the lock is gone, it claims."""
    caplog.set_level(logging.INFO, logger="slawatch")
    rule = shop(conn, "table")["order_unshipped"]
    runner = Runner(dsn, [rule], [], Fixed(NOW), actions="off", pooler=pooler)
    other = psycopg.connect(dsn, autocommit=False)
    done = threading.Event()

    def scanning() -> None:
        runner.scan(rule.name)
        done.set()

    try:
        assert runner.scan(rule.name) is not None  # the first: a sweep; then probes
        other.execute("LOCK TABLE orders")
        threading.Thread(target=scanning, daemon=True).start()
        wait_until(done.is_set, "the scan, while the lock is held")
        running = runner._running[rule.name]
        assert running.trouble.failing and running.retry_at > 0
        lines = [r for r in caplog.records if "its table is locked" in r.message]
        assert len(lines) == 1 and "lock timeout" in lines[0].message
        failures = runner.registry.get_sample_value(
            "slawatch_scan_failures_total", {"rule": rule.name}
        )
        assert failures == 1
        other.rollback()
        conn.execute(
            "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
            " VALUES (1, 7, 100, 'paid', %s)",
            (NOW - timedelta(hours=48, seconds=1),),
        )
        running.retry_at = 0.0  # its backoff waited out
        result = runner.scan(rule.name)
        assert result is not None and result.claimed == 1
        assert not running.trouble.failing
    finally:
        other.close()
        runner.close()
