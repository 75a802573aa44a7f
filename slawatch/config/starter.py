"""``slawatch init DIR``: a starter configuration (package data under slawatch/starter/)
for a user to edit: an example rule, notifiers, a business calendar, an event source."""

from __future__ import annotations

import contextlib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from slawatch.errors import ConfigError


def _files(folder: Traversable, under: Path) -> list[tuple[Path, Traversable]]:
    found = []
    for item in sorted(folder.iterdir(), key=lambda t: t.name):
        if item.is_dir():
            found += _files(item, under / item.name)
        elif item.name.endswith(".yaml"):
            found.append((under / item.name, item))
    return found


def write_starter(directory: Path) -> list[Path]:
    """Write the starter files into ``directory`` (made if missing); return their paths.
    ConfigError, and nothing written, if any of them exists already."""
    files = _files(resources.files("slawatch").joinpath("starter"), directory)
    taken = [path for path, _ in files if path.exists() or path.is_symlink()]
    if taken:
        raise ConfigError(
            f"{taken[0]} exists; slawatch init overwrites nothing (pick an empty or new folder)"
        )
    written: list[Path] = []
    made: list[Path] = []  # the folders this made, parents first
    try:
        for path, source in files:
            missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
            for folder in reversed(missing):
                folder.mkdir()
                made.append(folder)
            with path.open("xb") as out:  # "x": never over a file made meanwhile
                written.append(path)
                out.write(source.read_bytes())
    except OSError as exc:
        # All or nothing: what this wrote and the folders it made are removed again.
        for path in reversed(written):
            with contextlib.suppress(OSError):
                path.unlink()
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        where = exc.filename or directory
        raise ConfigError(f"{where}: cannot write: {exc.strerror or exc}") from None
    return [path for path, _ in files]
