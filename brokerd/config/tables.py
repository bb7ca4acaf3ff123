"""Reading TOML tables: :class:`Table` checks keys and value types and builds every
:class:`~brokerd.errors.ConfigError` with the file and the dotted key; with the helpers
for dataclass defaults, value descriptions, duplicate names and "did you mean" hints."""

from __future__ import annotations

import difflib
import math
import uuid
from collections.abc import Iterable
from dataclasses import MISSING, fields
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from brokerd.errors import ConfigError
from protocol.frames import MAX_NAME_BYTES


def describe(value: object) -> str:
    """A TOML-flavoured description of a value for error messages."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime):
        return "a local date-time" if value.tzinfo is None else "a date-time"
    if isinstance(value, date):
        return "a date"
    if isinstance(value, time):
        return "a time"
    return type(value).__name__


def defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


INT_MAX = 2**31 - 1
"""SQL Server's INT at most: the most seconds a setting may give (68 years; beyond it,
timers and the dates they are added to overflow), and the bound of a dialog's lifetime, a
conversation timer's timeout and an error code (``brokerd.dialogs.verbs.conversation``)."""


class Table:
    """One TOML table being read: knows its dotted key and refuses unknown keys at once."""

    def __init__(
        self, file: Path, where: str, data: dict[str, Any], allowed: Iterable[str]
    ) -> None:
        self.file = file
        self.where = where
        self.data = data
        allowed = tuple(allowed)
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(
                    file,
                    self.key(key),
                    f"unknown key '{key}'{hint}; allowed keys here: {', '.join(sorted(allowed))}",
                )

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def error(self, name: str, problem: str) -> ConfigError:
        return ConfigError(self.file, self.key(name), problem)

    def _typed(self, name: str, kinds: tuple[type, ...], what: str) -> Any:
        """The value, None if absent; refuses another type (a boolean is never a number)."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.error(name, f"must be {what}, not {describe(value)}")
        return value

    def text(self, name: str) -> str | None:
        value: str | None = self._typed(name, (str,), "a string")
        if value is not None and not value:
            raise self.error(name, "must not be empty")
        return value

    def required_text(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise self.error(name, "is required")
        return value

    def name(self, name: str = "name") -> str:
        value = self.required_text(name)
        size = len(value.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise self.error(
                name, f"is {size} bytes long in UTF-8; at most {MAX_NAME_BYTES} are allowed"
            )
        return value

    def optional_name(self, name: str) -> str | None:
        return self.name(name) if name in self.data else None

    def integer(self, name: str, default: int, low: int, high: int | None = None) -> int:
        value: int | None = self._typed(name, (int,), "an integer")
        if value is None:
            return default
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise self.error(name, f"must be {bounds}, not {value}")
        return value

    def seconds(self, name: str, default: float) -> float:
        value: float | None = self._typed(name, (int, float), "a number of seconds")
        if value is None:
            return default
        if not math.isfinite(value) or value <= 0:
            raise self.error(name, f"must be a positive number of seconds, not {value}")
        if value > INT_MAX:  # a timer or a date that far off overflows
            raise self.error(name, f"must be at most {INT_MAX:,} seconds, not {value:g}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        value: bool | None = self._typed(name, (bool,), "true or false")
        return default if value is None else value

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() not in choices:
            raise self.error(name, f"must be one of {', '.join(choices)}, not {value!r}")
        return value.lower()

    def path(self, name: str, base: Path) -> Path | None:
        value = self.text(name)
        if value is None:
            return None
        if "\x00" in value:
            raise self.error(name, "must not contain a NUL character")
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    def required_path(self, name: str, base: Path) -> Path:
        value = self.path(name, base)
        if value is None:
            raise self.error(name, "is required (a file path)")
        return value

    def broker_instance(self, name: str) -> uuid.UUID | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return uuid.UUID(value)
        except ValueError:
            raise self.error(name, f"{value!r} is not a UUID") from None

    def strings(self, name: str) -> list[str]:
        value: list[Any] | None = self._typed(name, (list,), "an array of strings")
        if value is None:
            return []
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.error(
                    f"{name}[{i}]", f"must be a non-empty string, not {describe(item)}"
                )
        return value

    def table(self, name: str, allowed: Iterable[str], required: bool = False) -> Table | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(name, f"is required (a [{self.key(name)}] table)")
            return None
        if not isinstance(value, dict):
            raise self.error(name, f"must be a table ([{self.key(name)}]), not {describe(value)}")
        return Table(self.file, self.key(name), value, allowed)

    def tables(self, name: str, allowed: Iterable[str]) -> list[Table]:
        """An array of tables (``[[name]]`` or an array of inline tables)."""
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(
                name, f"must be an array of tables ([[{self.key(name)}]]), not {describe(value)}"
            )
        result = []
        for i, item in enumerate(value):
            where = f"{self.key(name)}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(self.file, where, f"must be a table, not {describe(item)}")
            result.append(Table(self.file, where, item, allowed))
        return result


class Unique:
    """Names of one kind in one database, each remembered with the key that defined it."""

    def __init__(self, kind: str, database: str, fold: bool) -> None:
        self.kind = kind
        self.database = database
        self.fold = fold
        self.seen: dict[str, str] = {}

    def add(self, t: Table, name: str) -> None:
        key = name.casefold() if self.fold else name
        if key in self.seen:
            how = " (compared without regard to case)" if self.fold else ""
            raise t.error(
                "name",
                f"{self.kind} '{name}' is already defined in database '{self.database}' "
                f"at {self.seen[key]}{how}",
            )
        self.seen[key] = t.where


def near(name: str, known: set[str]) -> str:
    """A hint for a reference that does not resolve: same name in another case, or a typo."""
    for candidate in sorted(known):
        if candidate.casefold() == name.casefold():
            return f" (names are case-sensitive: did you mean '{candidate}'?)"
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
