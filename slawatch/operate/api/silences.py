"""``/v1/silences``: deliveries of matching alerts stopped for a while."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from slawatch.operate.api.context import Context
from slawatch.operate.lifecycle import (
    INT8,
    MAX_TEXT,
    MAX_WHO,
    Silence,
    add_silence,
    delete_silence,
    list_silences,
    parse_until,
)


class SilenceRequest(BaseModel):
    """Silence a rule's deliveries (one key's, those whose row matches) until a time."""

    model_config = ConfigDict(extra="forbid")
    rule: str = Field(max_length=100)
    key: str | None = Field(default=None, max_length=MAX_TEXT)
    matchers: dict[str, Any] | None = Field(
        default=None, description="alert row fields that must be equal: {field: value}"
    )
    until: str = Field(
        max_length=100, description="an ISO 8601 time (no zone: UTC) or a duration from now: 2h"
    )
    comment: str = Field(default="", max_length=MAX_TEXT)
    author: str = Field(min_length=1, max_length=MAX_WHO)


class Silences(BaseModel):
    silences: list[Silence]


def router(ctx: Context) -> APIRouter:
    api = APIRouter(tags=["lifecycle"])

    @api.post("/v1/silences", response_model=Silence, status_code=201)
    def post_silence(body: SilenceRequest) -> Silence:
        """Stop delivering matching alerts until ``until``; they are still recorded."""
        now = ctx.clock.now()
        return add_silence(
            ctx.db,
            rule=body.rule,
            key=body.key,
            matchers=body.matchers,
            until=parse_until(body.until, now, "until"),
            comment=body.comment,
            author=body.author,
            now=now,
            rules=ctx.configured(),
        )

    @api.get("/v1/silences", response_model=Silences)
    def get_silences(
        expired: Annotated[bool, Query(alias="all", description="the expired ones too")] = False,
    ) -> Silences:
        """The active silences (every one with ``all``), oldest first."""
        return Silences(
            silences=list_silences(ctx.db, now=ctx.clock.now(), include_expired=expired)
        )

    @api.delete("/v1/silences/{silence}", response_model=Silence)
    def delete_one_silence(silence: Annotated[int, Path(ge=1, le=INT8)]) -> Silence:
        """End a silence now (one already over keeps its end)."""
        return delete_silence(ctx.db, silence, now=ctx.clock.now())

    return api
