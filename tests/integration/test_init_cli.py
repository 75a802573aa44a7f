"""`slawatch init DIR` that cannot write every starter file is one line, exit 2, and
leaves DIR as it found it. It used to end in a traceback (DIR a file, a folder it cannot
make) and, when a later file failed, leave the first ones written."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_cli import assert_one_line_error, slawatch


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_init_into_a_file_is_one_line(tmp_path: Path) -> None:
    mine = tmp_path / "notes.txt"
    mine.write_text("mine\n")
    assert_one_line_error(
        slawatch("init", str(mine)), 2, f"{mine}/calendars: cannot write: Not a directory"
    )
    assert mine.read_text() == "mine\n"


def test_init_that_fails_half_way_removes_what_it_wrote(tmp_path: Path) -> None:
    # rules/ is a file of the user's: calendars/ and notifiers/ are written first, then
    # rules/<x>.yaml cannot be.
    (tmp_path / "rules").write_text("mine\n")
    result = slawatch("init", str(tmp_path))
    assert_one_line_error(result, 2, f"{tmp_path / 'rules'}/")
    assert "cannot write: Not a directory" in result.stderr
    assert tree(tmp_path) == ["rules"]
    assert (tmp_path / "rules").read_text() == "mine\n"


def test_init_into_a_new_folder_writes_every_file(tmp_path: Path) -> None:
    result = slawatch("init", str(tmp_path / "a" / "b"))
    assert result.returncode == 0, result.stderr
    assert "rules" in tree(tmp_path / "a" / "b")
