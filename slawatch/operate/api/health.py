"""``/healthz``, ``/readyz`` and ``/metrics``: is the process alive, can it work, and
its Prometheus metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from pydantic import BaseModel

from slawatch import __version__
from slawatch.operate.api.context import RETRY_LATER


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class Ready(BaseModel):
    """Whether this process can do its work; ``checks`` says what failed."""

    ready: bool
    checks: dict[str, bool]
    error: str | None = None


def checks(report: Mapping[str, Any], prefix: str = "") -> dict[str, bool]:
    """``{"scheduler": True, "workers": {"console": False}}`` as flat named checks
    (``workers.console``)."""
    out: dict[str, bool] = {}
    for name, value in report.items():
        if isinstance(value, Mapping):
            out |= checks(value, f"{prefix}{name}.")
        else:
            out[f"{prefix}{name}"] = bool(value)
    return out


def router(
    probed: Callable[[], tuple[dict[str, bool], str | None]],
    health: Callable[[], Mapping[str, Any]] | None,
    registry: CollectorRegistry | None,
) -> APIRouter:
    """``probed``: the database's last readiness probe (``Readiness.report``);
    ``health``: the process's own parts as ``{name: alive}``; ``registry``: what
    ``/metrics`` exports (default: prometheus_client's global registry)."""
    api = APIRouter(tags=["health"])

    # Both are coroutines: they run on the event loop, never wait for the thread pool
    # (which the other requests may fill), and read nothing but memory.
    @api.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """The process is alive (no database involved)."""
        return Health(status="ok", version=__version__)

    @api.get("/readyz", response_model=Ready, responses={503: {"model": Ready}})
    async def readyz() -> JSONResponse:
        """The database is reachable and migrated (as last probed, at most one scan
        interval ago), and every part of the process is alive."""
        found, error = probed()
        if health is not None:
            for name, alive in checks(health()).items():
                # A part never turns a failed check of the same name into a success.
                found[name] = found.get(name, True) and alive
                if not alive and error is None:
                    error = f"{name} is not running"
        ready = all(found.values())
        body = Ready(ready=ready, checks=found, error=error)
        later = {} if ready else {"Retry-After": RETRY_LATER}
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503, headers=later)

    @api.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
    )
    def metrics() -> Response:
        """Prometheus metrics."""
        return Response(generate_latest(registry or REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return api
