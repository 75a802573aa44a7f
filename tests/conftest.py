"""Shared fixtures: a real PostgreSQL for the whole session, a fresh database per test.

``SLAWATCH_TEST_DSN`` points the tests at a server; without it they start the
embedded server (the same one ``slawatch demo`` uses) in a temporary folder.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from slawatch.db import embedded_dsn, with_database

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A DSN for a server on which tests may create databases."""
    dsn = os.environ.get("SLAWATCH_TEST_DSN")
    if dsn:
        return dsn
    return embedded_dsn(tmp_path_factory.mktemp("embedded"))


@pytest.fixture
def dsn(server_dsn: str) -> Iterator[str]:
    """A new empty database for one test, dropped afterwards."""
    name = f"slawatch_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    try:
        yield with_database(server_dsn, name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
