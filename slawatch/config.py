"""Reading a folder of YAML files, one object per file, into pydantic models.

Every error names the file and the field, one line each, e.g.
``rules/orders.yaml: renotify.every: '6 hourz' is not a duration (try 30s, ...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from slawatch.errors import ConfigError


class FileModel(BaseModel):
    """A strict, immutable model that remembers the file it was read from."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    _source: Path | None = PrivateAttr(default=None)

    @property
    def source(self) -> str:
        """The file this came from, for error messages."""
        return str(self._source) if self._source is not None else "<config>"


M = TypeVar("M", bound=FileModel)


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """Turn pydantic's report into ``field: what is wrong`` lines."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        kind = err["type"]
        if kind == "extra_forbidden":
            known = ", ".join(sorted(f.alias or n for n, f in model.model_fields.items()))
            msg = f"unknown field (known fields: {known})" if "." not in loc else "unknown field"
        elif kind == "missing":
            msg = "is required"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            if kind not in ("value_error", "assertion_error") and "input" in err:
                msg = f"{err['input']!r}: {msg}"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return lines


def load_yaml_file(path: Path) -> dict[str, Any]:
    """One YAML mapping from a file, or a ConfigError naming the file and line."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return data


def load_dir(
    directory: Path,
    model: Callable[[dict[str, Any], Path], type[M]],
    what: str,
    prepare: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None,
) -> list[M]:
    """Load every ``*.yaml``/``*.yml`` in ``directory`` as ``model``; names must be unique.

    ``model`` chooses the model class from a file's data. All files are read
    before failing, so an operator sees every bad file at once.
    """
    if not directory.is_dir():
        env = f"SLAWATCH_{what.upper()}_DIR"
        raise ConfigError(f"{directory}: {what} folder not found (set --{what} or {env})")
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    errors: list[str] = []
    items: list[M] = []
    seen: dict[str, Path] = {}
    for path in files:
        try:
            data = load_yaml_file(path)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        data.setdefault("name", path.stem)
        try:
            if prepare is not None:
                data = prepare(data, path)
            cls = model(data, path)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        try:
            item = cls.model_validate(data)
        except ValidationError as exc:
            errors.extend(f"{path}: {line}" for line in describe_validation_error(exc, cls))
            continue
        name = str(getattr(item, "name", ""))
        if name in seen:
            errors.append(f"{path}: name: {name!r} is already used by {seen[name]}")
            continue
        seen[name] = path
        item._source = path
        items.append(item)
    if errors:
        raise ConfigError("\n".join(errors))
    return items
