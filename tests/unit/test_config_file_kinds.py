"""A *.yaml in a configuration folder that is not a regular file is one line, at once.

A FIFO named rules/x.yaml made `check` (and `run`) block on its read for good."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slawatch.config.rules import load_rules
from slawatch.errors import ConfigError

RULE = "events: {beat: x, within: 1h}\nnotify: [console]\n"


def test_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(RULE)
    os.mkfifo(tmp_path / "f.yaml")
    # In a child process: were the FIFO read, it would block until the timeout.
    code = (
        "import sys; from pathlib import Path\n"
        "from slawatch.config.rules import load_rules\n"
        "from slawatch.errors import ConfigError\n"
        "try: load_rules(Path(sys.argv[1]))\n"
        "except ConfigError as exc: print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{tmp_path / 'f.yaml'}: cannot read: not a regular file"]


def test_a_folder_named_yaml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(RULE)
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ConfigError) as info:
        load_rules(tmp_path)
    assert str(info.value) == f"{tmp_path / 'd.yaml'}: cannot read: not a regular file"


def test_a_symbolic_link_to_a_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text(RULE)
    (tmp_path / "r.yaml").symlink_to(tmp_path / "real.txt")
    assert [r.name for r in load_rules(tmp_path)] == ["r"]
