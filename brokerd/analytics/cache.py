"""The analytics' cache directory: what a run can keep for the next one.

``~/.cache/brokerd`` (``$XDG_CACHE_HOME/brokerd`` if set) holds what depends only on
the installed versions, never on a trace set: the driver JVM's class archives
(:func:`brokerd.analytics.session.class_archive_options`) and the report page's
JavaScript bundle (:func:`brokerd.analytics.page.vega_bundle`). Each file is named
after the versions it was made from, so an upgrade makes a new one.

May import nothing of brokerd.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "brokerd"
"""Where the analytics keep what a run makes for the next."""


def kept_text(name: str, make: Callable[[], str], directory: Path = CACHE_DIR) -> str:
    """The text of the cached file ``name``; made with ``make`` and written there when
    it is not there yet.

    A file is written whole under a name of its own and then renamed, so a run reads
    either nothing or the whole file, whatever runs at the same time or is killed. A
    directory that cannot be written (or read) only means the text is made each time."""
    path = directory / name
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    text = make()
    written = directory / f"{name}.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written.write_text(text, encoding="utf-8")
        written.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            written.unlink(missing_ok=True)
    return text
