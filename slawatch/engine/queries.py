"""Fixed SQL, loaded once from ``sql/queries.sql`` (named ``-- name --`` blocks)."""

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
def schema_sql() -> LiteralString:
    """The DDL of slawatch's own schema."""
    return resources.files("slawatch").joinpath("sql/schema.sql").read_text()
