"""The driver JVM's class-data-sharing archive (docs/analytics.md, Performance): one per
kind of driver JVM, since a JVM does not load an archive written by a JVM of other options."""

from __future__ import annotations

import os
from pathlib import Path

import pyspark

from brokerd.analytics.session import class_archive_options

VERSION = pyspark.__version__


def test_each_kind_of_jvm_writes_and_maps_an_archive_of_its_own(tmp_path: Path) -> None:
    option, writer = class_archive_options("small", tmp_path)
    assert (
        option == f"-XX:ArchiveClassesAtExit={tmp_path}/spark-{VERSION}-small.jsa.{os.getpid()}.tmp"
    )
    assert writer == tmp_path / f"spark-{VERSION}-small.jsa.{os.getpid()}.jvm"
    # that JVM wrote its archive and exited (a pid that is not running)
    writer.write_text("999999999")
    Path(option.split("=", 1)[1]).write_bytes(b"archive")
    assert class_archive_options("small", tmp_path) == (
        f"-XX:SharedArchiveFile={tmp_path}/spark-{VERSION}-small.jsa",
        None,
    )
    large, large_writer = class_archive_options("large", tmp_path)
    assert large.startswith(f"-XX:ArchiveClassesAtExit={tmp_path}/spark-{VERSION}-large.jsa.")
    assert large_writer is not None


def test_an_archive_shared_by_both_kinds_is_removed(tmp_path: Path) -> None:
    shared = tmp_path / f"spark-{VERSION}.jsa"
    shared.write_bytes(b"written by a small-set JVM")
    option, _ = class_archive_options("large", tmp_path)
    assert not shared.exists()
    assert "ArchiveClassesAtExit" in option


def test_a_second_writers_archive_is_removed_once_one_is_in_place(tmp_path: Path) -> None:
    """Two runs that started without an archive each write one; the first to be found is
    put in place, the other deleted (not left in the cache, 170 MB each)."""
    for pid in (999999998, 999999999):
        (tmp_path / f"spark-{VERSION}-small.jsa.{pid}.jvm").write_text(str(pid))
        (tmp_path / f"spark-{VERSION}-small.jsa.{pid}.tmp").write_bytes(str(pid).encode())
    option, writer = class_archive_options("small", tmp_path)
    assert option == f"-XX:SharedArchiveFile={tmp_path}/spark-{VERSION}-small.jsa"
    assert writer is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"spark-{VERSION}-small.jsa"]
