"""What an operator sees of actions (docs/explanation/actions.md): ``GET /v1/actions``, each alert's
attempts in ``/v1/alerts`` and ``slawatch alerts --json``, and on the on-call page.

Two hung jobs are restarted (ok); a third, claimed once the statement's table is gone,
fails; a job of another rule has no action.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from slawatch.cli import main
from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.operate.admin import create_app, serve_in_thread
from tests.conftest import ROOT
from tests.integration.helpers import Conn, FixedClock, claim_all
from tests.integration.test_actions import T0, M, S, job_rule, naive, setup
from tests.pgcluster import free_port
from tests.waiting import wait_until

TOKEN = "actions-token-0123456789"


@pytest.fixture
def rule(conn: Conn) -> Rule:
    rule = job_rule()
    plan = setup(conn, rule, jobs=2)
    assert claim_all(conn, plan, T0 + 15 * M + S) == 2
    conn.execute("INSERT INTO jobs VALUES (3, 'mail', 'w2', 'running', %s)", (naive(T0 + 10 * M),))
    conn.execute("DROP TABLE restarts")
    assert claim_all(conn, plan, T0 + 25 * M + S) == 1
    return rule


@pytest.fixture
def api(rule: Rule, dsn: str) -> Iterator[httpx.Client]:
    with Database(dsn, size=2, timeout=5) as db:
        app = create_app(
            db, [rule], ["console"], token=None, allow_writes=True, clock=FixedClock(T0)
        )
        server = serve_in_thread(app, "127.0.0.1", 0)
        try:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                yield client
        finally:
            server.stop()


def listed(api: httpx.Client, **params: object) -> list[tuple[str, str, int]]:
    response = api.get("/v1/actions", params=params)
    assert response.status_code == 200, response.text
    return [(a["key"], a["status"], a["attempt"]) for a in response.json()["actions"]]


def test_get_actions_lists_the_newest_first_by_rule_and_status(api: httpx.Client) -> None:
    assert listed(api) == [("3", "failed", 1), ("2", "ok", 1), ("1", "ok", 1)]
    assert listed(api, status="ok") == [("2", "ok", 1), ("1", "ok", 1)]
    assert listed(api, rule="job_hung", limit=1) == [("3", "failed", 1)]
    assert listed(api, rule="order_unshipped") == []
    (failed,) = api.get("/v1/actions", params={"status": "failed"}).json()["actions"]
    assert failed["rule"] == "job_hung" and failed["episode"] == 1 and failed["n"] == 1
    assert 'relation "restarts" does not exist' in failed["error"]
    assert failed["params"] == {"id": "3", "kind": "mail"} and failed["rows"] is None
    assert failed["at"] == "2026-03-01T12:25:01Z" and failed["kind"] == "sql"


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"rule": "Bad!"}, 400, "rule: 'Bad!' is not a rule name"),
        ({"rule": "x\x00"}, 400, "is not a rule name"),
        ({"rule": "r" * 101}, 422, "rule: String should have at most 100"),
        ({"status": "dead"}, 422, "status: Input should be 'ok', 'failed'"),
        ({"limit": 0}, 422, "limit: Input should be greater than or equal to 1"),
        ({"limit": 1001}, 422, "limit: Input should be less than or equal to 1000"),
        ({"limit": "many"}, 422, "limit: Input should be a valid integer"),
    ],
)
def test_get_actions_bad_input_is_a_4xx_naming_it(
    api: httpx.Client, params: dict[str, object], status: int, says: str
) -> None:
    response = api.get("/v1/actions", params=params)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]


def test_get_actions_keeps_the_token_and_host_rules(rule: Rule, dsn: str) -> None:
    with Database(dsn, size=2, timeout=5) as db:
        app = create_app(db, [rule], ["console"], token=TOKEN, allow_writes=True)
        server = serve_in_thread(app, "127.0.0.1", 0)
        try:
            with httpx.Client(base_url=server.url, timeout=10) as api:
                assert api.get("/v1/actions").status_code == 401
                good = {"Authorization": f"Bearer {TOKEN}"}
                assert len(api.get("/v1/actions", headers=good).json()["actions"]) == 3
                doc = api.get("/openapi.json", headers=good).json()
                get = doc["paths"]["/v1/actions"]["get"]
                assert {p["name"] for p in get["parameters"]} == {"rule", "status", "limit"}
        finally:
            server.stop()
        open_app = create_app(db, [rule], ["console"], token=None, allow_writes=True)
        server = serve_in_thread(open_app, "127.0.0.1", 0)
        try:
            with httpx.Client(base_url=server.url, timeout=10) as api:
                foreign = api.get("/v1/actions", headers={"host": "evil.example"})
                assert foreign.status_code == 403
                assert "only a loopback Host" in foreign.json()["error"]
        finally:
            server.stop()


def test_each_alert_carries_the_attempts_it_triggered(
    api: httpx.Client, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    alerts = api.get("/v1/alerts").json()["alerts"]
    by_key = {a["key"]: a["actions"] for a in alerts}
    assert [(a["status"], a["rows"]) for a in by_key["1"]] == [("ok", 1)]
    assert [a["status"] for a in by_key["3"]] == ["failed"]
    number = next(a["id"] for a in alerts if a["key"] == "2")
    assert [a["params"] for a in api.get(f"/v1/alerts/{number}").json()["actions"]] == [
        {"id": "2", "kind": "sync"}
    ]
    assert main(["--dsn", dsn, "alerts", "--json"]) == 0
    printed = {a["key"]: a["actions"] for a in json.loads(capsys.readouterr().out)["alerts"]}
    assert printed == by_key


def test_a_renotification_shows_no_attempt_of_its_own(conn: Conn, rule: Rule, dsn: str) -> None:
    """Only the notification whose claim ran the action (``on``) carries it."""
    conn.execute("CREATE TABLE restarts (job_id bigint NOT NULL, kind text NOT NULL)")
    from slawatch.actions.run import runner
    from slawatch.engine.ready import prepare

    plan = prepare(conn, rule).with_act(runner("on"))
    assert claim_all(conn, plan, T0 + 30 * M + 2 * S) == 2  # jobs 1 and 2: number 2
    with Database(dsn, size=1) as db:
        from slawatch.operate.inspect import list_alerts

        page = db.run("test", lambda c: list_alerts(c, rule="job_hung"))
    assert sorted((a.key, a.n, len(a.actions)) for a in page.alerts) == [
        ("1", 1, 1),
        ("1", 2, 0),
        ("2", 1, 1),
        ("2", 2, 0),
        ("3", 1, 1),
    ]


def test_the_page_shows_each_attempt_beside_its_alert(api: httpx.Client) -> None:
    page = api.get("/").text
    articles = page.split('<article class="alert')[1:]
    assert len(articles) == 3
    for article in articles:
        key = article.split('<code class="key">', 1)[1].split("<", 1)[0]
        if key == "3":
            assert '<li class="act-failed"><b>action</b> failed' in article
            assert "relation &quot;restarts&quot; does not exist" in article
        else:
            assert '<li class="act-ok"><b>action</b> ok · 1 row ·' in article


def test_slawatch_actions_prints_the_same_list(
    rule: Rule, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dsn", dsn, "actions", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["actions"]
    assert [(a["key"], a["status"]) for a in got] == [("3", "failed"), ("2", "ok"), ("1", "ok")]
    assert main(["--dsn", dsn, "actions", "--status", "failed"]) == 0
    out = capsys.readouterr().out
    assert "2026-03-01 12:25:01Z" in out and "does not exist" in out and " ok " not in out


def test_slawatch_run_counts_its_actions_in_metrics(conn: Conn, dsn: str, tmp_path: Path) -> None:
    """The wiring of `slawatch run`: its runner counts each attempt in its /metrics."""
    rule = job_rule()
    setup(conn, rule, jobs=2)  # heartbeats long past: both jobs are hung now
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "job_hung.yaml").write_text(
        yaml.safe_dump(rule.model_dump(mode="json", by_alias=True, exclude_unset=True))
    )
    url = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")} | {
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(rules),
        "SLAWATCH_NOTIFIERS_DIR": str(ROOT / "notifiers"),
        "SLAWATCH_HTTP": url.removeprefix("http://"),
    }
    sample = 'slawatch_actions_total{rule="job_hung",status="ok"} 2.0'
    with subprocess.Popen(
        [sys.executable, "-m", "slawatch", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:

            def counted() -> bool:
                try:
                    return sample in httpx.get(f"{url}/metrics", timeout=5).text
                except httpx.TransportError:
                    assert proc.poll() is None, "slawatch run ended"
                    return False

            wait_until(counted, "slawatch_actions_total in /metrics")
        finally:
            proc.terminate()
            proc.wait(30)
    assert conn.execute("SELECT count(*) FROM restarts").fetchone() == (2,)
