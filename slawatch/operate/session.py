"""Login sessions of the on-call page: a random id per login, kept by the browser in
an HttpOnly cookie and known to the database as ``slawatch.session``.

The database holds only an HMAC of the id keyed with the API token, never the id:
reading the table gives nothing to log in with, and a new token matches no stored
session (changing the token logs every browser out). A session ends when it is
:data:`SESSION_AGE` old by the application's clock, or at logout (its row is
deleted, so the cookie is worth nothing afterwards, on every instance: several
slawatch processes behind one address share the table). Each login removes at
most :data:`PRUNE` expired rows, so the table stays about the size of the live
sessions without a job of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from slawatch.db import Database
from slawatch.engine.queries import queries

SESSION_AGE = timedelta(hours=12)  # an on-call shift; then the token is asked for again
PRUNE = 100  # expired sessions removed per login
# What secrets.token_urlsafe(32) makes: anything else is no session, without a query.
_ID = re.compile(r"[A-Za-z0-9_-]{43}")


def _id_hash(session: str, token: str) -> bytes:
    return hmac.new(token.encode(), session.encode(), hashlib.sha256).digest()


def well_formed(cookie: str | None) -> bool:
    """Whether ``cookie`` could be a session id (the shape only; no database)."""
    return cookie is not None and _ID.fullmatch(cookie) is not None


def open_session(db: Database, token: str, now: datetime) -> str:
    """A new session valid until ``now + SESSION_AGE``; its id, for the cookie."""
    session = secrets.token_urlsafe(32)
    params = {
        "id": _id_hash(session, token),
        "now": now,
        "expires": now + SESSION_AGE,
        "prune": PRUNE,
    }
    query = queries()["open_session"]
    db.run("admin API: opening a page session", lambda c: c.execute(query, params))
    return session


def session_valid(db: Database, cookie: str | None, token: str, now: datetime) -> bool:
    """Whether ``cookie`` names a session of ``token`` that has not ended at ``now``."""
    if cookie is None or not well_formed(cookie):
        return False
    params = {"id": _id_hash(cookie, token), "now": now}
    row = db.run(
        "admin API: reading a page session",
        lambda c: c.execute(queries()["session_valid"], params).fetchone(),
    )
    return bool(row and row[0])


def close_session(db: Database, cookie: str | None, token: str) -> None:
    """End the session ``cookie`` names (nothing if it names none)."""
    if cookie is None or not well_formed(cookie):
        return
    params = {"id": _id_hash(cookie, token)}
    query = queries()["close_session"]
    db.run("admin API: ending a page session", lambda c: c.execute(query, params))
