"""``/v1/alerts``, ``/v1/stats`` and ``/v1/replay``: the alerts, their counts, and
their dead deliveries sent again."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from slawatch.db import Connection
from slawatch.delivery.dispatcher import Replayed as ReplayCount
from slawatch.delivery.dispatcher import replay_deliveries, replay_problem
from slawatch.errors import BadInput
from slawatch.operate.api.context import Context
from slawatch.operate.inspect import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Alert,
    AlertPage,
    DeliveryStatus,
    Stats,
    check_rule_name,
    get_alert,
    list_alerts,
    parse_cursor,
    parse_since,
    stats,
)


class ReplayRequest(BaseModel):
    """Which dead and orphaned deliveries go back to pending (none given: all of them),
    and with ``to`` to which notifier instead of ``notifier`` (one no longer configured
    may be named then)."""

    model_config = ConfigDict(extra="forbid")
    rule: str | None = Field(default=None, max_length=40)
    notifier: str | None = Field(default=None, max_length=200)
    to: str | None = Field(default=None, max_length=200)


class Replayed(BaseModel):
    """Shown only when not 0: ``orphaned``, ``taken``, ``left``, ``resolved``."""

    replayed: int = Field(description="dead and orphaned deliveries now pending again")
    orphaned: int = Field(default=0, description="of them, orphaned ones")
    taken: int = Field(default=0, description="left as they were: the alert went to `to` already")
    left: int = Field(default=0, description="left as they were: their notifier is not configured")
    resolved: int = Field(
        default=0, description="resolved notices sent again after their replayed notification"
    )


def router(ctx: Context) -> APIRouter:
    api = APIRouter(tags=["alerts"])

    @api.get("/v1/alerts", response_model=AlertPage)
    def get_alerts(
        rule: Annotated[str | None, Query(max_length=100, description="only this rule")] = None,
        status: Annotated[
            DeliveryStatus | None,
            Query(description="only alerts with a delivery in this status"),
        ] = None,
        since: Annotated[
            str | None,
            Query(
                max_length=100,
                description="fired at or after: ISO 8601 (UTC unless it says), or a duration ago",
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
        cursor: Annotated[
            str | None, Query(max_length=100, description="next_cursor of the previous page")
        ] = None,
    ) -> AlertPage:
        """Alerts, newest first, a page at a time."""
        since_at = None if since is None else parse_since(since, ctx.clock.now())
        after = None if cursor is None else parse_cursor(cursor)
        return ctx.read(
            "alerts",
            lambda c: list_alerts(
                c, rule=rule, status=status, since=since_at, cursor=after, limit=limit
            ),
        )

    @api.get("/v1/alerts/{alert:path}", response_model=Alert)
    def get_one_alert(alert: Annotated[str, Path(max_length=2000)]) -> Alert:
        """One alert, by numeric id or idempotency id (rule:key:eE:nN), with its deliveries."""
        return ctx.read("alert", lambda c: get_alert(c, alert))

    @api.get("/v1/stats", response_model=Stats)
    def get_stats() -> Stats:
        """Alerts by rule and severity, deliveries by notifier and status."""
        return ctx.read("stats", stats)

    @api.post("/v1/replay", response_model=Replayed, response_model_exclude_defaults=True)
    def post_replay(body: Annotated[ReplayRequest | None, Body()] = None) -> Replayed:
        """Dead and orphaned deliveries back to pending (with ``to``: to that notifier);
        the delivery workers send them at once."""
        body = body or ReplayRequest()
        if body.rule is not None and body.rule not in ctx.configured():
            raise BadInput(f"rule: no rule named {check_rule_name(body.rule)!r}")
        names, now = ctx.notifier_names(), ctx.clock.now()

        def work(c: Connection) -> ReplayCount:
            problem = replay_problem(c, body.notifier, body.to, names)
            if problem is not None:
                raise BadInput(problem)
            return replay_deliveries(c, now, body.rule, body.notifier, to=body.to, configured=names)

        done = ctx.read("replay", work)
        return Replayed(
            replayed=done.count,
            orphaned=done.orphaned,
            taken=done.taken,
            left=done.left,
            resolved=done.resolved,
        )

    return api
