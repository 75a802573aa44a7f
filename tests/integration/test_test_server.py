"""The embedded test server is independent of pytest's shared temporary folder.

Issue 6, case 11: a second pytest session on the machine (as root) resets
``/tmp/pytest-of-root`` to mode 0700; the server, running as its own system
user, then failed its next checkpoint (``PANIC: could not open file
".../global/pg_control": Permission denied``) and every later test failed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest


@pytest.fixture
def basetemp_root_reset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Do to pytest's shared root what a new pytest session does: chmod it 0700."""
    root = tmp_path_factory.getbasetemp().parent  # /tmp/pytest-of-<user>
    mode = root.stat().st_mode & 0o777
    root.chmod(0o700)
    try:
        yield root
    finally:
        root.chmod(mode)


@pytest.mark.skipif(
    bool(os.environ.get("SLAWATCH_TEST_DSN")), reason="only the embedded test server is at risk"
)
def test_the_server_survives_another_pytest_session(
    server_dsn: str, basetemp_root_reset: Path
) -> None:
    with psycopg.connect(server_dsn, autocommit=True, connect_timeout=30) as conn:
        # A checkpoint opens pg_control by its absolute path: the step that failed.
        conn.execute("CHECKPOINT")
    with psycopg.connect(server_dsn, autocommit=True, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
