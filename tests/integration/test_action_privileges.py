"""An action's privileges (docs/explanation/actions.md): ``migrate --print`` prints the GRANTs its
statement needs, and ``check`` asks the server whether the role slawatch connects as
can run it — here a real role holding only the printed GRANTs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from slawatch.actions.run import run_one, runner
from slawatch.cli import main
from slawatch.config.rules import Rule, with_action_role
from slawatch.demo import SHOP
from slawatch.engine.acting import Due
from slawatch.engine.migrate import grants, migrate
from slawatch.engine.ready import prepare
from tests.conftest import ROOT
from tests.integration.helpers import Conn, claim_all, dsn_as, scratch_role

# Reads a column the rule does not (worker): its SELECT is the action's own GRANT.
RESTART = (
    "update jobs set status = 'queued', worker = ''"
    " where id = :id and status = 'running' and worker <> ''"
)
REQUEUE = "select requeue(:id)"


def job_rule(sql: str = RESTART, track: str = "table") -> Rule:
    return Rule.model_validate(
        {
            "name": "job_hung",
            "table": "public.jobs",
            "key": "id",
            "track": track,
            "deadline": "heartbeat_at",
            "after": "15m",
            "open_when": "status = 'running'",
            "columns": ["id", "kind"],
            "notify": ["console"],
            "action": {"sql": sql},
        }
    )


def write(rules: Path, rule: Rule) -> None:
    rules.mkdir(exist_ok=True)
    body = rule.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"name"})
    (rules / f"{rule.name}.yaml").write_text(yaml.safe_dump(body))


@pytest.fixture
def role(conn: Conn, dsn: str) -> Iterator[tuple[str, str]]:
    """A login role holding nothing yet, and a DSN that connects as it."""
    with scratch_role(conn, "slawatch_app", "LOGIN") as name:
        yield name, dsn_as(dsn, name)


def shop(conn: Conn, rule: Rule) -> None:
    conn.execute(SHOP)
    conn.execute(
        "CREATE FUNCTION requeue(job bigint) RETURNS void LANGUAGE sql"
        " AS $$ UPDATE jobs SET status = 'queued' WHERE id = job $$"
    )
    conn.execute("REVOKE EXECUTE ON FUNCTION requeue(bigint) FROM PUBLIC")
    migrate(conn, [rule])
    conn.execute(
        "INSERT INTO jobs VALUES (1, 'sync', 'w1', 'running', %s)",
        (datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1),),
    )


def check(tmp_path: Path, dsn: str, rule: Rule, capsys: pytest.CaptureFixture[str]) -> Any:
    write(tmp_path / "rules", rule)
    rules = str(tmp_path / "rules")
    code = main(["--dsn", dsn, "--rules", rules, "--notifiers", str(ROOT / "notifiers"), "check"])
    return code, capsys.readouterr().out


def test_migrate_print_prints_the_grants_each_action_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "rules", job_rule())
    write(
        tmp_path / "rules",
        job_rule("insert into ops.restarts (job_id) values (:id)").model_copy(
            update={"name": "job_logged"}
        ),
    )
    write(tmp_path / "rules", job_rule(REQUEUE).model_copy(update={"name": "job_requeued"}))
    args = ["--rules", str(tmp_path / "rules"), "--notifiers", str(ROOT / "notifiers")]
    assert main([*args, "migrate", "--print"]) == 0
    out = capsys.readouterr().out
    assert 'GRANT UPDATE ("status", "worker") ON "jobs" TO "slawatch_app";' in out
    assert 'GRANT SELECT ("id", "status", "worker") ON "jobs" TO "slawatch_app";' in out
    assert 'GRANT USAGE ON SCHEMA "ops" TO "slawatch_app";' in out
    assert 'GRANT INSERT ("job_id") ON "ops"."restarts" TO "slawatch_app";' in out
    assert 'GRANT EXECUTE ON FUNCTION "requeue" TO "slawatch_app";' in out


@pytest.mark.parametrize("sql", [RESTART, REQUEUE])
def test_check_names_each_action_the_role_cannot_run_until_granted(
    conn: Conn,
    role: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sql: str,
) -> None:
    name, as_role = role
    rule = job_rule(sql)
    shop(conn, rule)
    without = job_rule().model_copy(update={"action": None})
    for g in grants([without], name):  # all but the action's
        conn.execute(g)
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 2, out
    what = "table jobs" if sql == RESTART else "function requeue"
    assert f"  job_hung: action: permission denied for {what}\n" in out
    assert out.startswith("refused: 1 rules, 1 notifiers are valid, but 1 action cannot run as")
    for g in grants([rule], name):
        conn.execute(g)
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 0, out
    assert out.startswith("ok: 1 rules")
    # The role ran nothing while checking: the job is still running.
    assert conn.execute("SELECT status FROM jobs").fetchone() == ("running",)


def test_the_printed_grants_are_enough_for_the_action_and_no_more(
    conn: Conn, role: tuple[str, str]
) -> None:
    name, as_role = role
    rule = job_rule()
    shop(conn, rule)
    for g in grants([rule], name):
        conn.execute(g)
    with psycopg.connect(as_role, autocommit=True) as app:
        plan = prepare(app, rule).with_act(runner("on"))
        assert claim_all(app, plan, datetime.now(UTC)) == 1
        assert app.execute("SELECT status FROM slawatch.action").fetchall() == [("ok",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("UPDATE jobs SET kind = 'other'")
    assert conn.execute("SELECT status, worker FROM jobs").fetchone() == ("queued", "")


def test_check_notes_a_track_table_rule_whose_action_writes_its_table(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rule = job_rule()
    shop(conn, rule)
    code, out = check(tmp_path, dsn, rule, capsys)
    assert code == 0, out
    assert "  job_hung: note: its action writes public.jobs, which slawatch itself never" in out
    conn.execute("CREATE TABLE restarts (job_id bigint)")
    elsewhere = job_rule("insert into restarts values (:id)")
    migrate(conn, [elsewhere])  # its definition recorded: check is about the action alone
    code, out = check(tmp_path, dsn, elsewhere, capsys)
    assert code == 0 and "job_hung: note:" not in out, out
    inline = job_rule(track="inline")
    migrate(conn, [inline])
    code, out = check(tmp_path, dsn, inline, capsys)
    assert code == 0 and "job_hung: note:" not in out, out


def test_check_names_an_action_on_a_missing_column(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rule = job_rule("update jobs set attempts = attempts + 1 where id = :id")
    shop(conn, rule)
    code, out = check(tmp_path, dsn, rule, capsys)
    assert code == 2, out
    assert '\n  job_hung: action: column "attempts" does not exist\n' in out


@pytest.fixture
def action_role(conn: Conn) -> Iterator[str]:
    """A role for actions only (no login), holding nothing yet."""
    with scratch_role(conn, "slawatch_act") as name:
        yield name


LOGGED = "insert into ops.restarts (job_id, who) values (:id, current_user)"
# Who ran it, as each statement records it.
WHO = {
    LOGGED: "SELECT who FROM ops.restarts",
    "update jobs set status = 'queued', worker = current_user where id = :id"
    " and status = 'running'": "SELECT worker FROM jobs WHERE status = 'queued'",
}


@pytest.mark.parametrize("sql", list(WHO))
def test_the_action_runs_as_its_role_with_exactly_the_printed_grants(
    conn: Conn, role: tuple[str, str], action_role: str, sql: str
) -> None:
    """slawatch connects as a least-privilege role; its actions run as a role of their
    own (current_user inside the action). The printed GRANTs are enough, and each one
    to the actions' role is needed."""
    name, as_role = role
    (rule,) = with_action_role([job_rule(sql)], action_role)
    shop(conn, rule)
    conn.execute("CREATE SCHEMA ops")
    conn.execute("CREATE TABLE ops.restarts (job_id bigint, who text)")
    printed = grants([rule], name)
    assert f'GRANT "{action_role}" TO "{name}"' in [g.as_string(None) for g in printed]
    for g in printed:
        conn.execute(g)
    with psycopg.connect(as_role, autocommit=True) as app:
        plan = prepare(app, rule).with_act(runner("on"))
        assert claim_all(app, plan, datetime.now(UTC)) == 1
        # Recorded by slawatch's role after the action: the actions' role cannot.
        assert app.execute("SELECT status FROM slawatch.action").fetchall() == [("ok",)]
        assert app.execute("SELECT current_user").fetchone() == (name,)
    assert conn.execute(WHO[sql]).fetchall() == [(action_role,)]
    due = Due("1", 1, 1, {"id": "1"})
    theirs = [g.as_string(None) for g in grants([rule], name)]
    theirs = [g for g in theirs if g.endswith(f'TO "{action_role}"')]
    # PUBLIC has USAGE on schema public by default: that one is printed, not needed here.
    needed = [g for g in theirs if g != f'GRANT USAGE ON SCHEMA "public" TO "{action_role}"']
    # USAGE on ops and INSERT (job_id, who); or UPDATE (status, worker), SELECT (id, status)
    assert len(needed) == 2, theirs
    with psycopg.connect(as_role, autocommit=True) as app:
        for g in needed:
            conn.execute(g.replace("GRANT ", "REVOKE ", 1).replace(" TO ", " FROM "))
            with app.transaction():
                got = run_one(app, rule, due)
                assert got.status == "failed" and got.error is not None
                assert got.error.startswith("permission denied"), (g, got.error)
                raise psycopg.Rollback()
            conn.execute(g)
        with app.transaction():
            assert run_one(app, rule, due).status == "ok"
            raise psycopg.Rollback()


def test_check_plans_the_action_as_its_role(
    conn: Conn,
    role: tuple[str, str],
    action_role: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SLAWATCH_ACTION_ROLE: check plans each action as that role: one line when
    slawatch's role may not switch to it, or the role lacks a privilege."""
    name, as_role = role
    rule = job_rule()
    shop(conn, rule)
    for g in grants([rule], name):  # the statement's privileges to slawatch's own role
        conn.execute(g)
    monkeypatch.setenv("SLAWATCH_ACTION_ROLE", action_role)
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 2, out
    assert f"  job_hung: action: cannot run as role {action_role}: permission denied" in out
    conn.execute(f"GRANT {action_role} TO {name}")
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 2, out
    assert "  job_hung: action: permission denied for table jobs\n" in out
    for g in grants(with_action_role([rule], action_role), name):
        conn.execute(g)
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 0, out


def test_check_refuses_an_action_whose_table_is_slawatchs_own_through_the_search_path(
    conn: Conn,
) -> None:
    """``delete from delivery`` names no schema: as a role named slawatch resolves it
    (``"$user", public``: its own schema first) it is slawatch's outbox, which load
    cannot see in the text. The server's resolution decides, as the action's role."""
    from slawatch.actions.verify import refused

    conn.execute(SHOP)
    conn.execute(
        "CREATE TABLE delivery (id bigint); CREATE SCHEMA slawatch;"
        " CREATE TABLE slawatch.delivery (id bigint)"
    )
    rule = job_rule("delete from delivery where id = :id", track="inline")
    assert refused(conn, [rule]) == []  # public.delivery: the application's
    conn.execute("SET search_path = slawatch, public")
    (got,) = refused(conn, [rule])
    assert got.reason == (
        "delivery is slawatch.delivery through the search path, slawatch's own table:"
        " name the application's table with its schema"
    )
    assert refused(conn, [job_rule("delete from public.delivery where id = :id")]) == []


def test_check_resolves_each_rules_tables_as_its_own_role_many_rules_at_once(conn: Conn) -> None:
    """The tables named without a schema are resolved for all the rules in one statement
    per role the actions run as: each rule still gets its own answer, as its own role
    resolves the names (one without USAGE on schema slawatch passes over it to
    public.delivery), and names its first such table."""
    from slawatch.actions.verify import Refused, refused

    conn.execute(SHOP)
    conn.execute(
        "CREATE TABLE delivery (id bigint); CREATE SCHEMA slawatch;"
        " CREATE TABLE slawatch.delivery (id bigint); CREATE TABLE slawatch.jobs (id bigint)"
    )
    conn.execute("SET search_path = slawatch, public")

    def rule(name: str, statement: str, role: str | None = None) -> Rule:
        (got,) = with_action_role([job_rule(statement, track="inline")], role)
        return got.model_copy(update={"name": name})

    bad = "delete from delivery where id = :id"
    two = (  # two names without a schema, both slawatch's as the connected role resolves them
        "update public.jobs set status = 'x' where id = :id"
        " and id in (select id from delivery) and id in (select id from jobs)"
    )
    own = (
        "is slawatch.{0} through the search path, slawatch's own table:"
        " name the application's table with its schema"
    )
    with scratch_role(conn, "slawatch_act") as role:
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        conn.execute(f"GRANT SELECT, UPDATE, DELETE ON public.delivery, public.jobs TO {role}")
        # r0, r2, r4 as the connected role: slawatch.delivery; r1, r3, r5 as `role`: public's.
        rules = [rule(f"r{i}", bad, role if i % 2 else None) for i in range(6)]
        rules.insert(3, rule("fine", "delete from public.delivery where id = :id"))
        rules += [rule("two", two), rule("two_as_role", two, role)]
        assert refused(conn, rules) == [
            *(Refused(f"r{i}", "delivery " + own.format("delivery")) for i in (0, 2, 4)),
            Refused("two", "delivery " + own.format("delivery")),  # the first, by name
        ]


def test_check_says_when_slawatchs_role_reaches_past_its_checks(
    conn: Conn, dsn: str, role: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A role with the printed GRANTs alone: no note. A superuser, or a member of a role
    that reads past the tables (pg_read_all_stats: other sessions' SQL): `check` says
    that only slawatch's checks then bound a rule's SQL (docs/explanation/safety.md)."""
    name, as_role = role
    rule = job_rule()
    shop(conn, rule)
    for g in grants([rule], name):
        conn.execute(g)
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 0, out
    assert "note: slawatch connects as" not in out
    conn.execute(f'GRANT pg_read_all_stats TO "{name}"')
    code, out = check(tmp_path, as_role, rule, capsys)
    assert code == 0, out
    assert (
        f"  note: slawatch connects as {name}, a member of pg_read_all_stats: only slawatch's"
        " checks bound what a rule's SQL may read and run, not the database" in out
    )
    (me,) = conn.execute("SELECT current_user").fetchone() or ("",)
    code, out = check(tmp_path, dsn, rule, capsys)
    assert code == 0, out
    assert f"  note: slawatch connects as {me}, a superuser: only slawatch's checks" in out


def test_check_plans_many_actions_in_few_round_trips_each_rule_its_own_verdict(
    conn: Conn,
) -> None:
    """``check`` plans all the actions in one pipelined request (a transaction per role
    and per 100 rules), not five round trips a rule; a refused statement fails the rest of
    its request, and the rules after it are planned again: two refused in a row, a role
    that does not exist (each of its rules told so), a role without a privilege, the last
    rule refused: each rule's verdict is the one it gets alone, and the connection is
    left out of any transaction."""
    from slawatch.actions.verify import Refused, refused
    from tests.integration.test_round_trips import round_trips

    conn.execute(SHOP)
    fine = "update jobs set status = 'queued' where id = :id"

    def rule(i: int, statement: str = fine, role: str | None = None) -> Rule:
        (got,) = with_action_role([job_rule(statement, track="inline")], role)
        return got.model_copy(update={"name": f"r{i}"})

    with scratch_role(conn, "slawatch_act") as act:
        conn.execute(f"GRANT SELECT, UPDATE ON public.jobs TO {act}")
        rules = [rule(i) for i in range(240)]  # three transactions of 100 rules at most
        rules[3] = rule(3, "update jobs set nope = 'x' where id = :id")
        rules[4] = rule(4, "update nojobs set status = 'x' where id = :id")
        rules[150] = rule(150, role="slawatch_no_such_role")
        rules[151] = rule(151, role="slawatch_no_such_role")
        rules[200:210] = [rule(i, role=act) for i in range(200, 210)]
        rules[205] = rule(205, "update orders set status = 'x' where id = :id", act)
        rules[-1] = rule(len(rules) - 1, "select nofunc(:id)")
        got: list[Refused] = []
        trips = round_trips(conn, lambda: got.extend(refused(conn, rules)))
        no_role = (
            'cannot run as role slawatch_no_such_role: role "slawatch_no_such_role" does not exist'
        )
        assert got == [
            Refused("r3", 'column "nope" of relation "jobs" does not exist'),
            Refused("r4", 'relation "nojobs" does not exist'),
            Refused("r150", no_role),
            Refused("r151", no_role),
            Refused("r205", "permission denied for table orders"),
            Refused(
                f"r{len(rules) - 1}",
                "function nofunc(unknown) does not exist",
            ),
        ]
        assert got == [r for one in rules for r in refused(conn, [one])]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # One request, one more after each refusal (both of a role's refusals in one), and one
    # for each role's tables named without a schema: 5 per rule before (1,200 here).
    assert trips <= 1 + 5 + 2, trips
