"""The on-call page: ``/`` (slawatch/operate/page.py), its static files, and the login
that gives a browser its session cookie (slawatch/operate/session.py)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from slawatch.db import Connection
from slawatch.errors import BadInput, NotFound, SlawatchError
from slawatch.operate.api.context import Context, error, html
from slawatch.operate.inspect import (
    EpisodeAck,
    acks_of,
    alerts_per_hour,
    check_rule_name,
    list_alerts,
    parse_cursor,
    rules_report,
)
from slawatch.operate.lifecycle import silences_on
from slawatch.operate.page import (
    COOKIE,
    COOKIE_AGE,
    MAX_LOGIN_BODY,
    PAGE_ALERTS,
    STATIC,
    View,
    login_token,
    render_error,
    render_login,
    render_page,
)
from slawatch.operate.session import close_session, open_session


def router(ctx: Context, public_url: str | None) -> APIRouter:
    """``public_url``: the page's address as people reach it (https: the login cookie
    is ``Secure`` whatever the request's scheme)."""
    api = APIRouter(include_in_schema=False)
    token = ctx.token

    @api.get("/", response_class=HTMLResponse)
    def page(
        request: Request,
        rule: Annotated[str | None, Query(max_length=100)] = None,
        cursor: Annotated[str | None, Query(max_length=100)] = None,
    ) -> HTMLResponse:
        """The on-call page (slawatch/operate/page.py)."""
        now, current = ctx.clock.now(), list(ctx.configured().values())

        def gather(c: Connection) -> View:
            report = rules_report(c, current, now)
            hourly = alerts_per_hour(c, [r.name for r in current], now)
            alerts = list_alerts(
                c,
                rule=None if rule is None else check_rule_name(rule),
                cursor=None if cursor is None else parse_cursor(cursor),
                limit=PAGE_ALERTS,
            )
            acks: dict[tuple[str, str, int], EpisodeAck] = acks_of(
                c, [(a.rule, a.key, a.episode) for a in alerts.alerts]
            )
            return View(
                now=now,
                rules=report.rules,
                hourly={h.rule: h for h in hourly},
                alerts=alerts.alerts,
                next_cursor=alerts.next_cursor,
                acks=acks,
                columns={r.name: r.columns or [] for r in current},
                silences=silences_on(c, now=now),
                rule=rule,
                writes=token is not None or ctx.allow_writes,
                logout=token is not None and request.headers.get("authorization") is None,
            )

        try:
            view = ctx.read("page", gather)
        except BadInput as exc:
            return html(render_error(str(exc)), 400)
        except SlawatchError as exc:
            return html(render_error(str(exc).splitlines()[0]), 503)
        return html(render_page(view))

    @api.get("/static/{name}")
    def static(name: Annotated[str, Path(max_length=20)]) -> Response:
        """The page's style and script (files of the package, nothing from elsewhere)."""
        if name not in STATIC:
            raise NotFound(f"no file {name!r}")
        body, media = STATIC[name]
        return Response(body, media_type=media, headers={"Cache-Control": "no-cache"})

    def secure(request: Request) -> bool:
        # Behind a TLS proxy the request may look like plain http (an untrusted proxy's
        # X-Forwarded-Proto is ignored): the public URL says what browsers use.
        return request.url.scheme == "https" or (public_url or "").startswith("https://")

    @api.get("/login")
    def login_form() -> Response:
        return RedirectResponse("/", status_code=303)

    @api.post("/login")
    async def login(request: Request) -> Response:
        """Check the token a person typed; a new session and its cookie if it is right."""
        if token is None:
            return RedirectResponse("/", status_code=303)
        body = await request.body()  # the gate has held it to the login form's limit
        if len(body) > MAX_LOGIN_BODY:
            return error(413, f"a login form is at most {MAX_LOGIN_BODY} bytes")
        given = login_token(body)
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            return html(render_login("That is not this server's token."), 401)
        try:
            session = await run_in_threadpool(open_session, ctx.db, token, ctx.clock.now())
        except SlawatchError as exc:
            return html(render_login(f"Cannot log in now: {str(exc).splitlines()[0]}"), 503)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            session,
            max_age=int(COOKIE_AGE.total_seconds()),
            path="/",
            httponly=True,
            samesite="strict",
            secure=secure(request),
        )
        return response

    @api.post("/logout")
    async def logout(request: Request) -> Response:
        """End the session in the database (for every instance), then in the browser."""
        if token is not None:
            # A database that is away is a 503: the cookie stays until the session ends.
            await run_in_threadpool(close_session, ctx.db, request.cookies.get(COOKIE), token)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(
            COOKIE, path="/", httponly=True, samesite="strict", secure=secure(request)
        )
        return response

    return api
