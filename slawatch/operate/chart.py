"""The SLA chart outside the page (docs/how-to/report.md): ``slawatch report --format svg``
or ``--format html``, drawn here from a :class:`Report` as ``web/page.js`` draws it on
the on-call page from ``/v1/report``: per rule, one bar per period for the episodes
that fell due in it (scaled to the busiest period of all rules) and the compliance as
a line from 0 to 100 %. Pure functions of the report; every value is escaped.
"""

from __future__ import annotations

import math
from datetime import UTC
from html import escape

from slawatch.operate.report import Report, ReportRow, as_table

W, H = 24, 60  # one period's width and the chart's height, as page.js has them
_STYLE = """\
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #222; }
.sla-charts { display: flex; flex-wrap: wrap; gap: 1rem; }
figure.sla { margin: 0; }
figure.sla svg { width: 168px; height: 60px; border-bottom: 1px solid #ccc; }
figure.sla figcaption { font-size: 0.85em; }
pre { font-size: 12px; overflow-x: auto; }"""


def _esc(value: object) -> str:
    return escape(str(value), quote=True)


def _num(x: float) -> str:
    """A coordinate as JavaScript prints it (``12``, not ``12.0``)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def by_rule(r: Report) -> dict[str, list[ReportRow]]:
    """The report's rows per rule, in the report's order."""
    out: dict[str, list[ReportRow]] = {}
    for row in r.rows:
        out.setdefault(row.rule, []).append(row)
    return out


def rule_chart(rule: str, rows: list[ReportRow], top: int) -> str:
    """One rule's chart: an inline ``<svg>`` with one ``rect.breached`` per period, titled,
    and the compliance polyline over the periods where it is known."""
    bars, points = [], []
    for i, row in enumerate(rows):
        # JavaScript's Math.round (half up), not Python's round (half to even).
        h = 0 if row.breached == 0 else max(1, math.floor(row.breached / top * (H - 4) + 0.5))
        period = row.period.astimezone(UTC).isoformat().replace("+00:00", "Z")
        known = "not counted" if row.compliance is None else f"{row.compliance * 100:.1f} %"
        title = f"{period[:10]}: {row.breached} breached, compliance {known}"
        bars.append(
            f'<rect class="breached" x="{i * W + 4}" y="{H - h}" width="{W - 8}" height="{h}"'
            f' fill="#2a6fdb" data-period="{_esc(period)}" data-breached="{row.breached}">'
            f"<title>{_esc(title)}</title></rect>"
        )
        if row.compliance is not None:
            points.append(f"{_num(i * W + W / 2)},{_num((1 - row.compliance) * (H - 2) + 1)}")
    line = (
        f'<polyline class="compliance" fill="none" stroke="#b00" stroke-width="1.5"'
        f' points="{" ".join(points)}"/>'
        if points
        else ""
    )
    total = sum(row.breached for row in rows)
    label = f"{rule}: {total} breached over {len(rows)} periods"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {len(rows) * W} {H}"'
        f' role="img" aria-label="{_esc(label)}" data-rule="{_esc(rule)}">'
        f"{''.join(bars)}{line}</svg>"
    )


def _top(r: Report) -> int:
    return max([1, *(row.breached for row in r.rows)])


def as_svg(r: Report) -> str:
    """One SVG document: each rule's chart under its name, one below the other."""
    charts = by_rule(r)
    width = max([W, *(len(rows) * W for rows in charts.values())])
    step = H + 24
    parts = []
    for n, (rule, rows) in enumerate(charts.items()):
        total = sum(row.breached for row in rows)
        y = n * step
        parts.append(
            f'<text x="0" y="{y + 14}" font-family="sans-serif" font-size="12">'
            f"{_esc(f'{rule}: {total} breached')}</text>"
            f'<g transform="translate(0 {y + 20})">{rule_chart(rule, rows, _top(r))}</g>'
        )
    height = max(step, len(charts) * step)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'
    )


def as_html(r: Report) -> str:
    """One self-contained page (no script, no external asset): the charts as the on-call
    page draws them, then the report's table and notes."""
    stamp = "%Y-%m-%d %H:%M" if r.by == "hour" else "%Y-%m-%d"
    span = f"{r.start.astimezone(UTC):{stamp}} to {r.until.astimezone(UTC):{stamp}} UTC, by {r.by}"
    figures = "".join(
        f'<figure class="sla" data-rule="{_esc(rule)}">{rule_chart(rule, rows, _top(r))}'
        f"<figcaption>{_esc(rule)}: {sum(x.breached for x in rows)} breached</figcaption>"
        "</figure>"
        for rule, rows in by_rule(r).items()
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>slawatch SLA report, {_esc(span)}</title>"
        f"<style>\n{_STYLE}\n</style></head><body>"
        f"<h1>SLA report</h1><p>{_esc(span)}: episodes that fell due per period (bars) and"
        " compliance (line, 0 to 100 %).</p>"
        f'<div class="sla-charts">{figures}</div>'
        f"<pre>{_esc(as_table(r))}</pre>"
        "</body></html>\n"
    )
