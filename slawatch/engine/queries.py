"""Fixed SQL, loaded once: ``sql/queries.sql`` (named ``-- name --`` blocks), and the
schema's migration files."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, LiteralString]:
    """Split ``text`` into ``{name: query}``; text before the first header is ignored."""
    parts = _HEADER.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries


@cache
def queries() -> dict[str, LiteralString]:
    """All named queries of ``slawatch/sql/queries.sql``."""
    return parse_queries(resources.files("slawatch").joinpath("sql/queries.sql").read_text())


@cache
def migration_files() -> dict[str, LiteralString]:
    """The text of each ``.sql`` file in ``sql/migrations/``, by file name."""
    folder = resources.files("slawatch").joinpath("sql/migrations")
    return {f.name: f.read_text() for f in folder.iterdir() if f.name.endswith(".sql")}


@cache
def legacy_upgrade_sql() -> LiteralString:
    """The previous release's self-upgrading schema script, frozen (see schema.py)."""
    return resources.files("slawatch").joinpath("sql/legacy_upgrade.sql").read_text()
