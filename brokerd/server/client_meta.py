"""A client request's meta, read field by field: each helper returns the field checked
or refuses the request with ``InvalidRequest``.

Owns the checks of the fields many requests share: a UUID (a conversation handle, a
group, a broker instance; parsed once per text), a string, a flag, and the optional
``database`` a request names.

May import: ``protocol``.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from protocol.errors import InvalidRequest


def meta_uuid(meta: dict[str, Any], key: str, required: bool = True) -> uuid.UUID | None:
    value = meta.get(key)
    if value in (None, ""):
        if required:
            raise InvalidRequest(f"{key} is required")
        return None
    try:
        return _parsed_uuid(str(value))
    except ValueError:
        raise InvalidRequest(f"{key} {value!r} is not a UUID") from None


@functools.lru_cache(maxsize=65536)
def _parsed_uuid(text: str) -> uuid.UUID:
    """A handle as text, parsed once: a producer names the same conversations again and again."""
    return uuid.UUID(text)


def meta_str(meta: dict[str, Any], key: str, default: str | None = None) -> str:
    value = meta.get(key, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"{key} must be a string")
    return value


def meta_bool(meta: dict[str, Any], key: str) -> bool:
    """An optional flag: true or false (absent or null: false). Anything else, the text
    ``"false"`` or a number, is refused rather than taken for true."""
    value = meta.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be true or false")
    return value


def meta_database(meta: dict[str, Any]) -> str | None:
    """The optional ``database`` a request names (absent, null or empty: the default)."""
    value = meta.get("database")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest("database must be a string (a database's name) or null")
    return value


MAX_KEY_LENGTH = 200
"""Characters of a SEND's or BEGIN DIALOG's idempotency key, at most."""


def meta_key(meta: dict[str, Any]) -> str | None:
    """A SEND's or BEGIN DIALOG's optional idempotency ``key``: 1 to :data:`MAX_KEY_LENGTH`
    characters."""
    value = meta.get("key")
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LENGTH:
        raise InvalidRequest(f"key must be a string of 1 to {MAX_KEY_LENGTH} characters")
    return value
