"""Reading a folder of YAML files, one object per file, into pydantic models.

Every error names the file and the field, one line each, e.g.
``rules/orders.yaml: renotify.every: '6 hourz' is not a duration (try 30s, ...)``.
"""

from __future__ import annotations

import re
import reprlib
import stat
import unicodedata
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

# Containers are summarised, never expanded: a YAML alias bomb is tiny as text
# but its full repr would not fit in memory.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 3, 8, 8, 8
_REPR.maxset, _REPR.maxfrozenset, _REPR.maxlong, _REPR.maxstring = 8, 8, 40, 60


def check_name(value: str, pattern: re.Pattern[str], what: str, letters: str) -> str:
    """``value`` if ``pattern`` (a name of at most 40 ``letters``, starting with a letter)
    matches it whole; else the ValueError that says what a ``what`` name is made of."""
    if not pattern.fullmatch(value):
        raise ValueError(
            f"{shorten(value)} is not a {what} name: {letters},"
            " starting with a letter, at most 40 characters"
        )
    return value


# PostgreSQL's longest name, in bytes (NAMEDATALEN - 1): a longer one is truncated.
NAME_BYTES = 63


def ident_letters(text: object) -> bool:
    """Whether ``text`` is made as a name is (:func:`is_ident`), whatever its length and
    Unicode form: text such as this is meant as a name, never as an expression."""
    if not isinstance(text, str) or not text or not (text[0].isalpha() or text[0] == "_"):
        return False
    return all(c.isalnum() or c in "_$" or unicodedata.category(c).startswith("M") for c in text)


def is_ident(text: object) -> bool:
    """Whether ``text`` is a name as PostgreSQL reads one (docs/reference/rules.md): a
    letter (of any script) or ``_`` first, then letters, their combining marks, digits,
    ``_`` and ``$``; at most :data:`NAME_BYTES` bytes in UTF-8; composed (Unicode NFC).
    slawatch quotes every name, so case matters and a keyword is a name like any other."""
    return (
        ident_letters(text)
        and unicodedata.is_normalized("NFC", str(text))
        and len(str(text).encode()) <= NAME_BYTES
    )


def ident_problem(text: object, what: str) -> str | None:
    """Why ``text`` is not a name (``what``: "a column name", "a table name" ...); None: it is."""
    if not ident_letters(text):
        return f"{shorten(text)} is not {what} (a letter or _, then letters, digits, _ and $)"
    name = str(text)
    if not unicodedata.is_normalized("NFC", name):
        # PostgreSQL compares names byte for byte: 'é' as e + U+0301 (NFD, as some
        # systems write it) is another name than the 'é' typed in CREATE TABLE (NFC).
        return f"{shorten(text)} is not {what}: {_decomposed(name)}"
    size = len(name.encode())
    if size > NAME_BYTES:
        return f"{shorten(text)} is not {what}: {size} bytes in UTF-8, at most {NAME_BYTES}"
    return None


def _decomposed(name: str) -> str:
    """What in ``name`` is not NFC (decomposed, as some systems write 'é': e + U+0301),
    and the name's NFC form."""
    nfc = unicodedata.normalize("NFC", name)
    # The first letter with its marks that NFC writes otherwise.
    clusters: list[str] = []
    for c in name:
        if clusters and unicodedata.category(c).startswith("M"):
            clusters[-1] += c
        else:
            clusters.append(c)
    part = next((c for c in clusters if unicodedata.normalize("NFC", c) != c), name)
    composed = unicodedata.normalize("NFC", part)

    def points(text: str) -> str:
        return " ".join(f"U+{ord(c):04X}" for c in text)

    return (
        f"its {part!r} ({points(part)}) is not composed (Unicode NFC) and PostgreSQL"
        f" compares names byte for byte; write it as NFC has it ({points(composed)}): {nfc!r}"
    )


def role_problem(text: str) -> str | None:
    """Why ``text`` is not a role name as set_config takes one (a rule's ``action.role``,
    ``SLAWATCH_ACTION_ROLE``); None: it is."""
    if problem := ident_problem(text, "a role name"):
        return problem
    if text.lower() in ("none", "public"):
        return f"{shorten(text)} is not a role name (none and public are keywords)"
    return None


def shorten(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters, for quoting bad input in errors.

    A long string keeps its start and says how long it was, e.g.
    ``'aaaa…' (10,485,760 characters)``, so an error line stays one short line
    whatever the operator's file holds.
    """
    if isinstance(value, str):
        text = repr(value)
        if len(text) <= limit:
            return text
        return f"{text[: max(limit - 1, 1)]}…{text[0]} ({len(value):,} characters)"
    try:
        text = _REPR.repr(value)
    except ValueError:  # an int of more digits than Python will print (over 4300)
        digits = int(value.bit_length() * 0.30103) if isinstance(value, int) else 0
        text = f"<an integer of about {digits:,} digits>"
    return text if len(text) <= limit else text[: max(limit - 1, 1)] + "…"


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """Turn pydantic's report into ``field: what is wrong`` lines, quoting at most about
    80 characters of any bad value."""
    lines = []
    for err in exc.errors():
        loc = ".".join(_loc_part(p) for p in err["loc"] if not str(p).startswith("function-"))
        kind = err["type"]
        if kind == "extra_forbidden":
            known = ", ".join(sorted(f.alias or n for n, f in model.model_fields.items()))
            msg = f"unknown field (known fields: {known})" if "." not in loc else "unknown field"
        elif kind == "missing":
            msg = "is required"
        else:
            msg = _without_long_input(err["msg"].removeprefix("Value error, "), err.get("input"))
            if kind not in ("value_error", "assertion_error") and "input" in err:
                msg = f"{shorten(err['input'])}: {msg}"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return lines


def _loc_part(part: object) -> str:
    text = str(part)
    return text if len(text) <= 80 else shorten(text)


def _without_long_input(msg: str, value: object) -> str:
    """A validator's message with a long bad value in it quoted only in short.

    Validators should quote with :func:`shorten`; this catches the ones that
    quote ``{value!r}`` or ``{value}`` whole.
    """
    if isinstance(value, str) and len(value) > 80:
        msg = msg.replace(repr(value), shorten(value)).replace(value, shorten(value))
    return msg


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names the same key twice: YAML would keep the last one silently."""

    def __init__(self, key: yaml.ScalarNode, first: yaml.ScalarNode) -> None:
        self.problem = (
            f"{shorten(key.value, 60)}: given twice (first on line"
            f" {first.start_mark.line + 1}); YAML would keep only this one"
        )
        self.problem_mark = key.start_mark
        super().__init__(self.problem)


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
    """Raise DuplicateKeyError if ``node`` names a key twice (``<<`` merges excepted: an
    explicit key may override a merged one, as YAML means)."""
    first: dict[tuple[str, str], yaml.ScalarNode] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        seen = first.setdefault((key_node.tag, key_node.value), key_node)
        if seen is not key_node:
            raise DuplicateKeyError(key_node, seen)


class _SafeLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_duplicate_keys(node)
        return super().construct_mapping(node, deep=deep)


_FAST: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = _SafeLoader
if hasattr(yaml, "CSafeLoader"):  # PyYAML built with libyaml

    class _CSafeLoader(yaml.CSafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            _refuse_duplicate_keys(node)
            return super().construct_mapping(node, deep=deep)

    _FAST = _CSafeLoader


def _loader_for(text: str) -> type[yaml.SafeLoader] | type[yaml.CSafeLoader]:
    """libyaml's loader if PyYAML has it (the pure-Python one needs ~15 s for a 10 MB
    value), unless the text could nest deeply: libyaml recurses in C and crashes the
    process (SIGSEGV) at ~100,000 levels, where the pure-Python one raises RecursionError.
    """
    # Each level of nesting needs one of these characters, so this bounds the depth.
    depth = sum(text.count(c) for c in "[{-:?")
    return _FAST if depth < 1000 else _SafeLoader


def load_yaml_file(path: Path) -> dict[str, Any]:
    """One YAML mapping from a file, or a ConfigError naming the file and line."""
    try:
        # A FIFO (or a device) named *.yaml would block the read for good: only a
        # regular file is read.
        if not stat.S_ISREG(path.stat().st_mode):
            raise ConfigError(f"{path}: cannot read: not a regular file")
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=_loader_for(text))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from exc
    except ValueError as exc:  # a value PyYAML's constructors refuse: 2020-13-45, !!int x
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "integer string conversion" in problem:
            problem = "a number of more than 4300 digits"
        elif len(problem) > 100:
            problem = problem[:99] + "…"
        raise ConfigError(f"{path}: invalid YAML: {problem}") from exc
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
