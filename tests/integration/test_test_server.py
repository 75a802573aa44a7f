"""The tests are independent of pytest's machine-wide temporary folder.

Issue 6, case 11: a second pytest session on the machine (as root) resets
``/tmp/pytest-of-root`` to mode 0700; an embedded server under it, running as
its own system user, then failed its next checkpoint (``PANIC: could not open
file ".../global/pg_control": Permission denied``) and every later test failed.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest


def shared_root() -> Path:
    """Where pytest puts every session's temporary folders by default."""
    base = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()
    return Path(base).resolve() / f"pytest-of-{getpass.getuser()}"


@pytest.fixture
def another_session_started() -> Iterator[Path]:
    """Do to the shared root what a new pytest session does: chmod it 0700."""
    root = shared_root()
    root.mkdir(mode=0o700, exist_ok=True)
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
    server_dsn: str, another_session_started: Path
) -> None:
    with psycopg.connect(server_dsn, autocommit=True, connect_timeout=30) as conn:
        # A checkpoint opens pg_control by its absolute path: the step that failed.
        conn.execute("CHECKPOINT")
    with psycopg.connect(server_dsn, autocommit=True, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_tmp_path_is_not_under_the_shared_root(tmp_path: Path) -> None:
    """Servers that tests start in a tmp_path (the demo's) are safe the same way."""
    assert shared_root() not in tmp_path.parents
