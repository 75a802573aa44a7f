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
