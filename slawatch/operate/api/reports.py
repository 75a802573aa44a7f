"""``/v1/report``: the SLA report."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from slawatch.operate.api.context import Context
from slawatch.operate.report import DEFAULT_SINCE, Report, check_format
from slawatch.operate.report import query as report_query
from slawatch.operate.report import render as render_report
from slawatch.operate.report import report as sla_report


def router(ctx: Context) -> APIRouter:
    api = APIRouter(tags=["report"])

    @api.get("/v1/report", response_model=Report)
    def get_report(
        rule: Annotated[str | None, Query(max_length=100, description="only this rule")] = None,
        since: Annotated[
            str, Query(max_length=100, description="how far back: a duration (7d)")
        ] = DEFAULT_SINCE,
        by: Annotated[str, Query(max_length=20, description="hour, day or week")] = "day",
        format: Annotated[
            str, Query(max_length=20, description="json (default), csv or table")
        ] = "json",
    ) -> Response:
        """The SLA report (docs/how-to/report.md): per rule and period, from the episode
        history."""
        fmt = check_format(format)
        wanted = report_query(
            list(ctx.configured().values()), rule=rule, since=since, by=by, now=ctx.clock.now()
        )
        got = ctx.read("report", lambda c: sla_report(c, wanted))
        if fmt == "json":
            return Response(got.model_dump_json(), media_type="application/json")
        media = "text/csv" if fmt == "csv" else "text/plain"
        return Response(render_report(got, fmt) + "\n", media_type=f"{media}; charset=utf-8")

    return api
