"""bench/run.py's table and bench/prune.py's pruner: what a reader relies on to rerun a
row, to see a missing measurement as missing, and a failed pruner as failed."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import prune
import run


def test_every_section_can_be_named_and_events_stands_for_its_five() -> None:
    assert run.sections("events") == set(run.EVENT_SECTIONS)
    assert run.sections(" claim, long ,") == {"claim", "long"}
    assert run.sections(",".join(run.SECTIONS)) == set(run.SECTIONS)
    with pytest.raises(SystemExit, match="unknown section 'clam'"):
        run.sections("claim,clam")


def test_the_event_figures_import_neither_the_table_script_nor_a_cycle() -> None:
    # What bench/run.py and bench/events.py both need is in bench/common.py.
    code = "import sys; sys.path.insert(0, 'bench'); import events; assert 'run' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_a_measure_function_another_branch_has_not_brought_is_none() -> None:
    assert run.guarded("benchdb", "server_dsn") is not None
    assert run.guarded("benchdb", "measure") is None  # the module is there, the function not
    assert run.guarded("benchdb", "Scratch") is not None
    assert run.guarded("no_such_bench_module", "measure") is None
    assert run.guarded("benchdb", "uuid") is None  # an attribute, not callable


def test_a_measure_function_that_raises_is_a_row_that_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(dsn: str | None, alerts: int) -> dict[str, float]:
        raise KeyError("ratio")

    assert run.attempt(broken, None, alerts=10) == (None, "failed: KeyError('ratio')")
    assert "KeyError" in capsys.readouterr().err  # the traceback, for whoever reruns it
    assert run.attempt(lambda dsn: {"ratio": 0.6}, "x") == ({"ratio": 0.6}, "")


def test_rows_print_as_markdown_with_the_command_that_reruns_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        run.Row("claim", "2.61x raw", "≥ 2.5x raw", True, "claim"),
        run.not_measured("idle", "≤ 1.5x", "idle", "needs bench/idle.py measure()"),
    ]
    run.print_rows("T", rows, markdown=True)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "| figure | now | goal | command |"
    assert out[3] == "| claim | 2.61x raw (**met**) | ≥ 2.5x raw | `bench/run.py --only claim` |"
    assert out[4] == (
        "| idle | not measured (needs bench/idle.py measure()) | ≤ 1.5x |"
        " `bench/run.py --only idle` |"
    )


def test_a_pruner_that_fails_is_reported_not_read_as_cheap() -> None:
    # A real connection attempt to a port nothing listens on: the thread's error surfaces.
    pruner = prune.Pruner("postgresql://nobody@127.0.0.1:1/none", datetime.now(UTC))
    pruner.start()
    with pytest.raises(RuntimeError, match="the pruner failed"):
        pruner.stop()


def test_issue_27s_table_has_every_goal_met_not_met_or_not_measured() -> None:
    figures = {
        "table": (2.6, "2.60\u00d7"),
        "idle": (1.3, "1.30\u00d7"),
        "timer_bytes": (250.0, "250 B"),
    }
    rows = {r.figure: r for r in run.issue27_rows(figures, {"prune": "skipped: --skip prune"})}
    assert len(rows) == len(run.ISSUE_27)  # every row of the issue, measured or not
    table = rows["`track: table` claim + outbox vs the seed's raw claim"]
    assert (table.met, table.goal, table.now) == (True, "≥ 2.5\u00d7", "2.60\u00d7")
    idle = rows["idle DB time, 100 rules, vs the raw probes"]
    assert (idle.met, idle.goal) == (False, "≤ 1.2\u00d7")  # at most: above is not met
    assert rows["bytes per open timer"].met is True  # the limit itself is met
    prune = rows["retention with 10 M alerts of history: pruning a drain's worth vs the drain"]
    assert (prune.met, prune.now, prune.goal) == (
        None,
        "not measured (skipped: --skip prune)",
        "≤ 10 %",
    )
    assert prune.command() == "bench/run.py --only prune"  # a section of the run now
    inline = rows["`track: inline` claim + outbox vs raw"]
    assert (inline.met, inline.now) == (None, "not measured (skipped)")


def test_an_event_figure_is_read_from_the_row_that_names_it_or_is_missing() -> None:
    rows = [
        run.Row(
            "`slawatch.event` ingest, one round trip each",
            "0.50\u00d7 (...)",
            "≥ 0.7\u00d7",
            False,
            "i",
        ),
        run.Row(
            "the same, pipelined (the server's own cost)", "0.72\u00d7 (2,462/s)", "", True, "i"
        ),
        run.Row(
            "bytes per open timer (heap + indexes), 1,000 open", "1,291 B (heap...)", "", None, "l"
        ),
    ]
    assert run.event_figure(rows, "pipelined") == (0.72, "0.72\u00d7 (2,462/s)")
    assert run.event_figure(rows, "bytes per open timer") == (1291.0, "1,291 B (heap...)")
    assert run.event_figure(rows, "firing due timers") is None
