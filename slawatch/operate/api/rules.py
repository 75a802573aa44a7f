"""``/v1/rules``: each configured rule's status."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from slawatch.errors import NotFound
from slawatch.operate.api.context import Context
from slawatch.operate.inspect import (
    RulesReport,
    RuleStatus,
    check_rule_name,
    rule_status,
    rules_report,
)


def router(ctx: Context) -> APIRouter:
    api = APIRouter(tags=["rules"])

    @api.get("/v1/rules", response_model=RulesReport)
    def get_rules() -> RulesReport:
        """Every configured rule: overdue now, open episodes, deliveries, last scan."""
        now, current = ctx.clock.now(), list(ctx.configured().values())
        return ctx.read("rules", lambda c: rules_report(c, current, now))

    @api.get("/v1/rules/{rule}", response_model=RuleStatus)
    def get_rule(rule: Annotated[str, Path(max_length=100)]) -> RuleStatus:
        """One configured rule's status."""
        found = ctx.configured().get(rule)
        if found is None:
            raise NotFound(f"no rule named {check_rule_name(rule)!r}")
        now = ctx.clock.now()
        (status,) = ctx.read("rule", lambda c: rule_status(c, [found], now))
        return status

    return api
