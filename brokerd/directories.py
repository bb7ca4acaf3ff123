"""Directory entries made durable: a file or directory created (or renamed) is only
sure to survive a power loss once the directory holding its name is fsynced, whatever
was fsynced of the file itself.

Used by the files a durable commit or a durable trace event depends on: the directory of
a database file (SQLite syncs the database's own directory when it creates its journal or
WAL, not the directory above it), the segments of large bodies beside it, the trace
segments, and the client token.

May import: nothing of brokerd (the standard library only).
"""

from __future__ import annotations

import os
from pathlib import Path


def sync_directory(directory: Path) -> None:
    """Make ``directory``'s entries durable (a file created or renamed in it)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directory(directory: Path, mode: int = 0o777) -> bool:
    """Create ``directory`` (with ``mode``, less the umask) and whatever of its parents is
    missing (as ``mkdir -p`` does), each made durable in the directory above it; True if
    any was created. A directory that exists already is left as it is: what created it
    made its name durable."""
    missing: list[Path] = []
    at = directory
    while not at.is_dir():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    created = False
    for path in reversed(missing):
        try:
            path.mkdir(mode=mode if path == directory else 0o777)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue  # made meanwhile by another process (or thread), which syncs it
        sync_directory(path.parent)
        created = True
    return created
