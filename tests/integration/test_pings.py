"""Healthchecks-compatible pings (``/ping/<key>``, slawatch/operate/api/events.py): the
curl one-liners and the exit-code wrapper of healthchecks' docs, run as written by a
real shell with real ``curl`` against the admin API served by uvicorn, then the rules
scanned with the test clock as ``slawatch run`` scans them: a missed, a failed and a
too-long run each page once."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from slawatch.config.rules import Rule
from slawatch.engine.claim import drain
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.operate.guard import Limits
from tests.integration import test_events_http
from tests.integration.helpers import Conn, FixedClock, alerts_of
from tests.integration.test_admin import TOKEN
from tests.integration.test_events_http import Served

# The admin API on a free port, as the tests of POST /v1/events serve it.
serve = test_events_http.serve

T0 = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
NIGHTLY_KEY = "5f0c2b9e-81d4-4a7c-9b3e-2d6f1a8c4e70"  # a UUID, as healthchecks' are
JOB_KEY = "kJ3v9Qw2Zx8Lm4Np7Rt1Yb6Hc"  # 25 characters
NIGHTLY = f"""\
events:
  beat: nightly_ok
  fail: nightly_failed
  within: 25h
  ping: {{key: {NIGHTLY_KEY}}}
notify: [console]
"""
JOB = f"""\
events:
  start: job_started
  stop: job_done
  fail: job_failed
  within: 10m
  ping: {{key: {JOB_KEY}}}
notify: [console]
"""


def rule(name: str, text: str) -> Rule:
    return Rule.model_validate(yaml.safe_load(text) | {"name": name})


def sh(script: str, base: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash as a cron job or a wrapper would run it: ``$BASE`` is where
    healthchecks' docs have ``https://hc-ping.com``."""
    return subprocess.run(
        ["bash", "-c", script],
        env={"PATH": "/usr/bin:/bin", "BASE": base},
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def scan(served: Served, found: Rule, at: datetime) -> int:
    """One scan of ``found`` at ``at``: the alerts it wrote."""
    with served.db.connection("test") as c:
        plan = prepare(c, found)
    return drain(served.db, plan, FixedClock(at)).claimed


def pages(conn: Conn, name: str) -> list[tuple[str, int, int, Any]]:
    """(key, episode, n, row) of every firing alert of rule ``name``, in order."""
    rows = alerts_of(conn, name, "key", "episode", "n", "row_data", kind="firing")
    return [(k, e, n, r) for k, e, n, r in rows]


def pinged(served: Served, kind: str) -> float:
    value = served.metrics.registry.get_sample_value(
        "slawatch_events_total", {"type": kind, "source": "ping", "outcome": "accepted"}
    )
    return value or 0.0


@pytest.fixture
def rules(conn: Conn) -> list[Rule]:
    found = [rule("nightly", NIGHTLY), rule("job", JOB)]
    migrate(conn, found)
    return found


def test_the_one_liners_and_the_wrapper_page_a_missed_a_failed_and_a_too_long_run_once(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    nightly, job = rules
    clock = FixedClock(T0)
    # With an API token: a ping needs none, its key is the secret.
    served = serve(rules, token=TOKEN, clock=clock)
    base = served.server.url

    # A nightly backup: the cron line of healthchecks' docs, as written.
    sh(
        f"true && curl -fsS -m 10 --retry 5 -o /dev/null $BASE/ping/{NIGHTLY_KEY}",
        base,
    )
    assert pinged(served, "nightly_ok") == 1
    assert scan(served, nightly, T0 + timedelta(hours=24)) == 0
    # The next night's backup never pings: missed, paged once.
    assert scan(served, nightly, T0 + timedelta(hours=25) + S) == 1
    assert scan(served, nightly, T0 + timedelta(hours=30)) == 0
    assert [p[:3] for p in pages(conn, "nightly")] == [("ping", 1, 1)]

    # A job that runs too long: /start, then nothing within 10 minutes.
    clock._now = t1 = T0 + timedelta(hours=2)
    sh(f"curl -fsS -m 10 --retry 5 -o /dev/null $BASE/ping/{JOB_KEY}/start", base)
    assert scan(served, job, t1 + 9 * M) == 0
    assert scan(served, job, t1 + 10 * M + S) == 1
    assert scan(served, job, t1 + 20 * M) == 0
    # It finishes at last: the exit-code wrapper of healthchecks' docs, exit status 0.
    clock._now = t1 + 30 * M
    sh(
        'm=$(bash -c "echo renewed; exit 0" 2>&1)\n'
        f'curl -fsS -m 10 --retry 5 --data-raw "$m" $BASE/ping/{JOB_KEY}/$?',
        base,
    )
    assert scan(served, job, t1 + 31 * M) == 0

    # A run that fails: the same wrapper, exit status 3; its output is the alert's data.
    clock._now = t2 = t1 + timedelta(hours=1)
    sh(
        'm=$(bash -c "echo disk full >&2; exit 3" 2>&1)\n'
        f'curl -fsS -m 10 --retry 5 --data-raw "$m" $BASE/ping/{JOB_KEY}/$?',
        base,
    )
    assert scan(served, job, t2 + S) == 1
    assert scan(served, job, t2 + 5 * M) == 0
    got = pages(conn, "job")
    assert [p[:3] for p in got] == [("ping", 1, 1), ("ping", 2, 1)]
    assert got[1][3]["data"] == {"exit_status": 3, "body": "disk full"}
    assert pinged(served, "job_started") == pinged(served, "job_done") == 1
    assert pinged(served, "job_failed") == 1


def test_fail_head_post_log_and_run_ids(rules: list[Rule], conn: Conn, serve: Any) -> None:
    _, job = rules
    clock = FixedClock(T0)
    served = serve(rules, clock=clock)
    base = served.server.url
    url = f"{base}/ping/{JOB_KEY}"
    # HEAD and POST are pings as GET is; the answer is healthchecks' "OK".
    head = sh(f"curl -fsS -m 10 -I {url}/start?rid=run-1", base)
    assert head.stdout.startswith("HTTP/1.1 200")
    assert sh(f"curl -fsS -m 10 -XPOST {url}/log -d 'half way'", base).stdout == "OK"
    ran = conn.execute("SELECT open, data FROM slawatch.job_timers WHERE key = 'ping'").fetchone()
    assert ran == (True, {"rid": "run-1"})  # the log changed nothing
    sh(f"curl -fsS -m 10 --retry 5 -o /dev/null {url}/fail?rid=run-1", base)
    assert scan(served, job, T0 + S) == 1
    # The id is the run id: the same end of the same run, sent twice, counts once.
    sh(f"curl -fsS -m 10 -o /dev/null {url}/fail?rid=run-1", base)
    assert pinged(served, "job_failed") == 1
    assert scan(served, job, T0 + 2 * S) == 0


def test_a_wrong_key_or_action_is_a_404_and_counted(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    served = serve(rules, token=TOKEN)
    base = served.server.url
    for path in (
        "/ping/kJ3v9Qw2Zx8Lm4Np7Rt1Yb6Hd",  # one character off
        f"/ping/{JOB_KEY}/256",
        f"/ping/{JOB_KEY}/nope",
        f"/ping/{JOB_KEY[:-1]}",
    ):
        failed = sh(f"curl -fsS -m 10 -o /dev/null $BASE{path}", base, check=False)
        assert failed.returncode == 22, path  # curl -f: an HTTP error
        assert "404" in failed.stderr
    rejected = served.metrics.registry.get_sample_value(
        "slawatch_events_total", {"type": "-", "source": "ping", "outcome": "rejected"}
    )
    assert rejected == 4
    assert conn.execute("SELECT count(*) FROM slawatch.job_timers").fetchone() == (0,)
    # The token still guards the rest of the API.
    assert served.api.get("/v1/rules").status_code == 401


def test_a_long_body_is_kept_as_far_as_an_events_data_holds(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    served = serve(rules)
    log = "x" * 100_000
    answer = served.api.post(f"/ping/{JOB_KEY}/fail", content=log.encode())
    assert answer.status_code == 200, answer.text
    (data,) = conn.execute("SELECT data FROM slawatch.job_timers").fetchone() or ()
    assert data["body_truncated"] is True
    assert 50_000 < len(data["body"]) < 64 * 1024
    assert log.startswith(data["body"])


def test_pings_take_the_producers_slots_not_the_readers(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    # No producer slot at all: every ping is turned away, the reads are not.
    served = serve(rules, limits=Limits(ingest=0))
    busy = served.api.get(f"/ping/{JOB_KEY}/start")
    assert busy.status_code == 503, busy.text
    assert busy.headers["Retry-After"] == "1"
    assert served.api.get("/v1/rules").status_code == 200
    assert conn.execute("SELECT count(*) FROM slawatch.job_timers").fetchone() == (0,)


@pytest.mark.parametrize(
    ("rid", "why"),
    [
        ("a\x00b", "control character (U+0000 at 1)"),
        ("a\x1b[2Jb", "control character (U+001B at 1)"),
        ("r" * 1000, "characters"),
        ("", "characters"),
    ],
)
def test_a_run_id_postgresql_cannot_keep_is_a_400_and_nothing_is_stored(
    rules: list[Rule], conn: Conn, serve: Any, rid: str, why: str
) -> None:
    served = serve(rules)
    answer = served.api.post(f"/ping/{JOB_KEY}/start", params={"rid": rid}, content=b"x")
    assert answer.status_code == 400, answer.text
    assert why in answer.text
    assert conn.execute("SELECT count(*) FROM slawatch.job_timers").fetchone() == (0,)
    # A body with NUL in it is kept, the NUL replaced (jsonb cannot hold it).
    answer = served.api.post(f"/ping/{JOB_KEY}/fail", content=b"out\x00put")
    assert answer.status_code == 200, answer.text
    (data,) = conn.execute("SELECT data FROM slawatch.job_timers").fetchone() or ()
    assert data["body"] == "out\ufffdput"
