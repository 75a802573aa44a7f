"""The verdict of `slawatch explain` on a scan's plans (slawatch/operate/explain.py)."""

from __future__ import annotations

from slawatch.config.rules import Rule
from slawatch.operate.explain import SMALL_PAGES, StatementPlan, judge


def rule() -> Rule:
    return Rule(
        name="late",
        table="public.orders",
        deadline="paid_at",
        open_when="status = 'paid'",
        notify=["console"],
    )


def plan(seq: list[str], unavoidable: list[str], indexes: tuple[str, ...] = ()) -> StatementPlan:
    return StatementPlan(
        name="claim",
        sql="",
        params={},
        text="",
        plan={},
        indexes=list(indexes),
        seq_scans=seq,
        seq_scans_unavoidable=unavoidable,
    )


def test_no_sequential_scan_is_ok_and_names_the_indexes() -> None:
    ok, verdict = judge(rule(), [plan([], [], ["sw_late_first", "sw_late_again"])], 10_000)
    assert ok and verdict == (
        "ok: no sequential scan of public.orders; indexes used: sw_late_again, sw_late_first"
    )


def test_a_scan_no_index_can_serve_fails_whatever_the_size() -> None:
    for pages in (0, SMALL_PAGES, 10_000):
        ok, verdict = judge(rule(), [plan(["public.orders"], ["public.orders"])], pages)
        assert not ok
        assert verdict.startswith("a scan would read public.orders whole: no index can serve it")


def test_a_small_table_read_whole_is_ok_up_to_the_limit() -> None:
    seq = [plan(["public.orders"], [])]
    ok, verdict = judge(rule(), seq, SMALL_PAGES)
    assert ok and "because it is small now (128 pages)" in verdict
    ok, verdict = judge(rule(), seq, SMALL_PAGES + 1)
    assert not ok and "(129 pages), though the partial indexes could serve it" in verdict


def test_any_statement_of_the_scan_counts() -> None:
    plans = [plan([], []), plan(["public.orders"], ["public.orders"])]
    assert judge(rule(), plans, 0)[0] is False
