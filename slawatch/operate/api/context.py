"""What every router of the admin API is given (:class:`Context`), and the error
answers they share."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TypeVar

from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.db import Connection, Database
from slawatch.operate.page import HEADERS

T = TypeVar("T")

# Retry-After of a 503: busy slots free within a second; a database that is away, or a
# server that is stopping (a restart, another instance), takes longer.
RETRY_BUSY, RETRY_LATER = "1", "5"
STOPPING = "slawatch is stopping; send it again (nothing of this request was stored)"
# Whoever sent a body that is refused may still be sending it: end the connection.
CLOSE = {"Connection": "close"}


class Error(BaseModel):
    """Every error response."""

    error: str


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    if status == 503 and not (headers and "Retry-After" in headers):
        headers = {**(headers or {}), "Retry-After": RETRY_LATER}  # every 503 says when
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def html(body: str, status: int = 200) -> HTMLResponse:
    more = {"Retry-After": RETRY_LATER} if status == 503 else {}
    return HTMLResponse(body, status_code=status, headers=HEADERS | more)


@dataclass(frozen=True)
class Context:
    """The database, the clock and the configuration the routes read.

    ``rules`` and ``notifiers`` may be callables, read per request, so that a reload
    shows at once."""

    db: Database
    clock: Clock
    rules: list[Rule] | Callable[[], list[Rule]]
    notifiers: list[str] | Callable[[], list[str]]
    token: str | None
    allow_writes: bool
    # Event types of rules in the rule files that wait for a migrate (a reload leaves
    # them out): their events are refused with that said.
    unmigrated: Callable[[], Collection[str]] = lambda: ()

    def configured(self) -> dict[str, Rule]:
        """The configured rules by name, as they are now."""
        rules = self.rules() if callable(self.rules) else self.rules
        return {r.name: r for r in rules}

    def notifier_names(self) -> set[str]:
        return set(self.notifiers() if callable(self.notifiers) else self.notifiers)

    def read(self, what: str, work: Callable[[Connection], T]) -> T:
        return self.db.run(f"admin API: {what}", work)
