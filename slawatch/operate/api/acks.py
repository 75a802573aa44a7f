"""``POST /v1/alerts/{alert}/ack``: an alert's episode acknowledged."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from slawatch.operate.api.context import Context
from slawatch.operate.lifecycle import MAX_NAME, MAX_TEXT, MAX_WHO, Ack, ack


class AckRequest(BaseModel):
    """Who acknowledges, and why."""

    model_config = ConfigDict(extra="forbid")
    by: str = Field(min_length=1, max_length=MAX_WHO)
    comment: str = Field(default="", max_length=MAX_TEXT)


def router(ctx: Context) -> APIRouter:
    api = APIRouter(tags=["lifecycle"])

    @api.post("/v1/alerts/{alert:path}/ack", response_model=Ack)
    def post_ack(alert: Annotated[str, Path(max_length=MAX_NAME)], body: AckRequest) -> Ack:
        """Acknowledge the alert's episode: it is not notified again (a new episode pages)."""
        return ack(ctx.db, alert, by=body.by, comment=body.comment, now=ctx.clock.now())

    return api
