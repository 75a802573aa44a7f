"""Scheduled runs through healthchecks-compatible pings (docs/how-to/events.md#scheduled-runs):
one rule that expects a start at each time of a schedule (or a period after the last
run) and a success within ``within`` of each start, as healthchecks' cron checks do.
Real ``curl`` and ``bash`` against the admin API served by uvicorn, the rule scanned
with the test clock as ``slawatch run`` scans it: a missed start, a failed run and a
too-long run each page once; a run in time pages nothing and the next slot is expected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slawatch.config.rules import Rule
from slawatch.engine.migrate import migrate, plan
from tests.integration import test_events_http
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_pings import pages, rule, scan, sh

serve = test_events_http.serve

T0 = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
HOURLY_KEY = "c6a1f0de-3b52-4e0f-9d7a-58b2e4c19f03"
PERIODIC_KEY = "Pq7Wd2Rk9Vx4Ty6Bn3Mz8Jh5L"
HOURLY = f"""\
events:
  start: sync_started
  stop: sync_done
  fail: sync_failed
  within: 10m                  # must finish within 10 minutes of starting
  schedule: "0 * * * *"        # must start every hour, on the hour
  grace: 5m
  ping: {{key: {HOURLY_KEY}}}
notify: [console]
"""
PERIODIC = f"""\
events:
  start: export_started
  stop: export_done
  fail: export_failed
  within: 10m
  period: 1h
  grace: 5m
  ping: {{key: {PERIODIC_KEY}}}
notify: [console]
"""

# healthchecks' docs: a run id pairs the start with its end; the exit status is the end.
WRAPPER = """\
RID=$(cat /proc/sys/kernel/random/uuid)
curl -fsS -m 10 --retry 5 -o /dev/null "$BASE/ping/{key}/start?rid=$RID"
m=$(bash -c "{job}" 2>&1)
curl -fsS -m 10 --retry 5 --data-raw "$m" "$BASE/ping/{key}/$??rid=$RID"
"""
# healthchecks' exit-code wrapper, without the start.
EXIT = """\
m=$(bash -c "{job}" 2>&1)
curl -fsS -m 10 --retry 5 --data-raw "$m" $BASE/ping/{key}/$?
"""
# healthchecks' cron line: only a success ping, when the job is done.
CRON = "true && curl -fsS -m 10 --retry 5 -o /dev/null $BASE/ping/{key}"


@pytest.fixture
def rules(conn: Conn) -> list[Rule]:
    found = [rule("hourly", HOURLY), rule("periodic", PERIODIC)]
    migrate(conn, found)
    return found


def timer(conn: Conn, name: str) -> tuple[bool, bool, datetime | None]:
    """(open, waiting, due_at) of the rule's one ping timer."""
    row = conn.execute(f"SELECT open, waiting, due_at FROM slawatch.{name}_timers").fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_a_cron_check_pages_a_missed_start_a_failed_run_and_a_too_long_run_once(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    hourly, _ = rules
    clock = FixedClock(T0)
    served = serve(rules, clock=clock)
    base = served.server.url

    def ping(at: datetime, script: str) -> None:
        clock._now = at
        sh(script.format(key=HOURLY_KEY, job="echo synced"), base)

    # 02:00: a run in time: started, finished after 3 minutes (two pings, a clock move).
    ping(T0 + 5 * S, f"curl -fsS -m 10 --retry 5 -o /dev/null $BASE/ping/{HOURLY_KEY}/start")
    assert timer(conn, "hourly") == (True, False, T0 + 5 * S + 10 * M)
    ping(T0 + 3 * M, EXIT)  # the job done, its exit status 0
    assert timer(conn, "hourly") == (True, True, None)  # waiting; the scan fills the slot in
    assert scan(served, hourly, T0 + 4 * M) == 0
    # The next slot is expected: 03:00, late after grace.
    assert timer(conn, "hourly") == (True, True, T0 + H + 5 * M)
    assert scan(served, hourly, T0 + H + 5 * M - S) == 0

    # 03:00: no start by 03:05: a missed start pages once.
    assert scan(served, hourly, T0 + H + 5 * M + S) == 1
    assert scan(served, hourly, T0 + H + 30 * M) == 0
    # It runs late, the whole wrapper at once: the next slot is 04:00 (+ grace).
    ping(T0 + H + 40 * M, WRAPPER)
    assert timer(conn, "hourly") == (True, True, None)
    assert scan(served, hourly, T0 + H + 41 * M) == 0
    assert timer(conn, "hourly") == (True, True, T0 + 2 * H + 5 * M)

    # 04:00: a run that fails (exit status 3): paged at once, once.
    t = T0 + 2 * H
    ping(t + 10 * S, WRAPPER.replace("{job}", "echo disk full >&2; exit 3"))
    assert scan(served, hourly, t + 11 * S) == 1
    assert scan(served, hourly, t + 30 * M) == 0
    # The 05:00 run succeeds: the failure ends, 06:00 is expected.
    ping(t + H + 2 * M, WRAPPER)
    assert scan(served, hourly, t + H + 3 * M) == 0
    assert timer(conn, "hourly") == (True, True, T0 + 4 * H + 5 * M)

    # 06:00: a run that never finishes: too long after 10 minutes, paged once; the 07:00
    # slot passing while it still runs pages nothing more.
    t = T0 + 4 * H
    ping(t + S, f"curl -fsS -m 10 --retry 5 -o /dev/null $BASE/ping/{HOURLY_KEY}/start")
    assert scan(served, hourly, t + 10 * M) == 0
    assert scan(served, hourly, t + 10 * M + 2 * S) == 1
    assert scan(served, hourly, t + H + 6 * M) == 0

    # A job that only pings when done (the cron line) is a whole run: it ends the hung
    # one, and a second such run at 08:00 is in time for its slot.
    ping(t + H + 30 * M, CRON)
    assert scan(served, hourly, t + H + 31 * M) == 0
    assert timer(conn, "hourly") == (True, True, T0 + 6 * H + 5 * M)
    ping(t + 2 * H + M, CRON)
    assert scan(served, hourly, t + 2 * H + 2 * M) == 0
    assert timer(conn, "hourly") == (True, True, T0 + 7 * H + 5 * M)

    got = pages(conn, "hourly")
    assert [p[:3] for p in got] == [("ping", 1, 1), ("ping", 2, 1), ("ping", 3, 1)]
    missed, failed, too_long = (p[3] for p in got)
    assert missed["events"][-1]["type"] == "sync_done"  # waiting since the last run ended
    # As for any start/stop rule, row.data is the start's (its run id), events the fail.
    assert set(failed["data"]) == {"rid"}
    assert [e["type"] for e in failed["events"]] == ["sync_failed"]
    assert too_long["started_at"] == (t + S).isoformat()


def test_a_period_counts_from_the_last_run_and_run_ids_still_dedupe(
    rules: list[Rule], conn: Conn, serve: Any
) -> None:
    _, periodic = rules
    clock = FixedClock(T0)
    served = serve(rules, clock=clock)
    base = served.server.url
    sh(WRAPPER.format(key=PERIODIC_KEY, job="echo exported"), base)
    # No scan needed: next start by the run's end + period + grace.
    assert timer(conn, "periodic") == (True, True, T0 + H + 5 * M)
    assert scan(served, periodic, T0 + H + 5 * M - S) == 0
    assert scan(served, periodic, T0 + H + 5 * M + S) == 1  # missed
    clock._now = t = T0 + H + 20 * M
    url = f"$BASE/ping/{PERIODIC_KEY}"
    sh(f"curl -fsS -m 10 -o /dev/null {url}/start?rid=r7", base)
    assert timer(conn, "periodic") == (True, False, t + 10 * M)
    clock._now = t + 4 * M
    sh(f"curl -fsS -m 10 -o /dev/null {url}?rid=r7", base)
    assert timer(conn, "periodic") == (True, True, t + 4 * M + H + 5 * M)
    # The same end of the same run, sent again (curl --retry after a lost answer): once.
    clock._now = t + 9 * M
    sh(f"curl -fsS -m 10 -o /dev/null {url}?rid=r7", base)
    assert timer(conn, "periodic") == (True, True, t + 4 * M + H + 5 * M)
    assert scan(served, periodic, t + 5 * M) == 0
    # A wrapper without a start whose job fails: paged at once with its output; the
    # next run's start does not end the failure, its success does.
    clock._now = t = t + H
    sh(EXIT.format(key=PERIODIC_KEY, job="echo no space >&2; exit 28"), base)
    assert timer(conn, "periodic") == (True, False, t)
    assert scan(served, periodic, t + S) == 1
    clock._now = t + 30 * M
    sh(f"curl -fsS -m 10 -o /dev/null {url}/start", base)
    assert timer(conn, "periodic") == (True, False, t)
    clock._now = t + 35 * M
    sh(f"curl -fsS -m 10 -o /dev/null {url}", base)
    assert timer(conn, "periodic") == (True, True, t + 35 * M + H + 5 * M)
    got = pages(conn, "periodic")
    assert [p[:3] for p in got] == [("ping", 1, 1), ("ping", 2, 1)]
    assert got[1][3]["data"] == {"exit_status": 28, "body": "no space"}


def test_migrate_adds_the_waiting_column_to_an_existing_timer_table(conn: Conn) -> None:
    before = rule("hourly", HOURLY.replace('  schedule: "0 * * * *"\n  grace: 5m\n', ""))
    migrate(conn, [before])
    # A timer table made by a release before scheduled runs: no waiting column.
    conn.execute("ALTER TABLE slawatch.hourly_timers DROP COLUMN waiting")
    conn.execute(
        "INSERT INTO slawatch.hourly_timers (key, open, stopped_at) VALUES ('k', false, now())"
    )
    hourly = rule("hourly", HOURLY)
    assert "slawatch.hourly_timers: added waiting" in [s.done for s in plan(conn, [hourly])]
    migrate(conn, [hourly])
    assert conn.execute("SELECT waiting FROM slawatch.hourly_timers").fetchall() == [(False,)]
    assert plan(conn, [hourly]) == []
