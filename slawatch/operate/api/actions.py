"""``/v1/actions``: the latest attempts of the rules' actions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from slawatch.actions.history import MAX_LIST as MAX_ACTIONS
from slawatch.actions.history import ActionList, ActionStatus, list_actions
from slawatch.operate.api.context import Context
from slawatch.operate.inspect import DEFAULT_LIMIT, check_rule_name


def router(ctx: Context) -> APIRouter:
    api = APIRouter(tags=["actions"])

    @api.get("/v1/actions", response_model=ActionList)
    def get_actions(
        rule: Annotated[str | None, Query(max_length=100, description="only this rule")] = None,
        status: Annotated[ActionStatus | None, Query(description="only this status")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_ACTIONS)] = DEFAULT_LIMIT,
    ) -> ActionList:
        """The latest attempts of rules' actions (docs/explanation/actions.md), newest first."""
        name = None if rule is None else check_rule_name(rule)
        return ctx.read("actions", lambda c: list_actions(c, name, status, limit))

    return api
