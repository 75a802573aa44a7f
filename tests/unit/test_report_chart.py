"""The SLA chart outside the page (operate/chart.py): drawn from a report's rows as
web/page.js draws it, every value escaped; the html page self-contained."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from slawatch.operate.chart import H, W, as_html, as_svg, rule_chart
from slawatch.operate.report import Report, ReportRow

T0 = datetime(2026, 3, 2, tzinfo=UTC)
NS = "{http://www.w3.org/2000/svg}"
NASTY = "late<&>\"'</svg><script>x</script>"


def row(rule: str, i: int, breached: int, due: int | None) -> ReportRow:
    return ReportRow(
        rule=rule,
        period=T0 + timedelta(days=i),
        due=due,
        breached=breached,
        compliance=None if not due else max(0.0, 1 - breached / due),
        open=0,
        late_p50=None,
        late_p90=None,
        late_p99=None,
        ack_p50=None,
        ack_p90=None,
        actions_ok=None,
        actions_failed=None,
    )


def report(rows: list[ReportRow]) -> Report:
    return Report(by="day", start=T0, until=T0 + timedelta(days=7), rows=rows, notes=[])


periods = st.lists(
    st.tuples(st.integers(0, 500), st.none() | st.integers(0, 600)), min_size=1, max_size=40
)


@given(periods)
def test_one_bar_per_period_scaled_and_one_point_per_known_compliance(
    data: list[tuple[int, int | None]],
) -> None:
    rows = [row("r", i, b, d) for i, (b, d) in enumerate(data)]
    top = max(1, *(b for b, _ in data))
    svg = ET.fromstring(rule_chart("r", rows, top))
    bars = svg.findall(f"{NS}rect")
    assert len(bars) == len(rows)
    for i, (bar, r) in enumerate(zip(bars, rows, strict=True)):
        h = int(bar.get("height", ""))
        assert int(bar.get("data-breached", "")) == r.breached
        assert float(bar.get("x", "")) == i * W + 4
        assert (h == 0) == (r.breached == 0)
        assert h <= H - 4 and int(bar.get("y", "")) == H - h
        assert abs(h - r.breached / top * (H - 4)) <= 1  # to the pixel, at least 1
    heights = [int(b.get("height", "")) for b in bars]
    pairs = list(zip(rows, heights, strict=True))
    for a, ha in pairs:
        for b, hb in pairs:
            assert not (a.breached < b.breached and ha > hb)  # more breached: never lower
    line = svg.find(f"{NS}polyline")
    known = [(i, r.compliance) for i, r in enumerate(rows) if r.compliance is not None]
    if not known:
        assert line is None
        return
    assert line is not None
    points = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
    assert points == [
        (i * W + W / 2, (1 - c) * (H - 2) + 1) for i, c in known
    ]  # 100 %: at the top (y 1); 0 %: at the bottom (y H - 1)


def test_values_are_escaped_in_the_svg_and_the_page() -> None:
    r = report([row(NASTY, 0, 2, 4), row(NASTY, 1, 0, None), row("ok", 0, 1, 1)])
    svg = as_svg(r)
    assert "<script>" not in svg and NASTY not in svg
    doc = ET.fromstring(svg)  # well-formed: nothing broke out of its attribute or text
    charts = doc.findall(f"{NS}g/{NS}svg")
    assert [c.get("data-rule") for c in charts] == [NASTY, "ok"]
    assert [len(c.findall(f"{NS}rect")) for c in charts] == [2, 1]
    assert doc.findall(f"{NS}text")[0].text == f"{NASTY}: 2 breached"
    page = as_html(r)
    assert "<script" not in page and NASTY not in page
    assert page.count("<svg") == 2 and page.count("<figure") == 2
    body = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    title = ET.fromstring(body).find(f"{NS}rect/{NS}title")
    assert title is not None and title.text == "2026-03-02: 2 breached, compliance 50.0 %"


def test_the_page_is_self_contained() -> None:
    page = as_html(report([row("order_unshipped", i, i, 10) for i in range(7)]))
    assert page.startswith("<!doctype html>")
    for outside in ("src=", "href=", "@import", "url("):
        assert outside not in page  # no asset to fetch
    # The only address is the SVG namespace, which is a name, never fetched.
    assert page.replace('xmlns="http://www.w3.org/2000/svg"', "").count("http") == 0
