"""The driver JVM's class-data-sharing archive (docs/analytics.md, Performance): one per
kind of driver JVM, since a JVM does not load an archive written by a JVM of other options,
and per PySpark installation, since it does not load one written from another classpath."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyspark
import pytest

from brokerd.analytics.session import (
    CLASS_ARCHIVE_SWITCH,
    class_archive,
    class_archive_options,
    driver_jvm_options,
)

VERSION = pyspark.__version__


def small(tmp_path: Path) -> str:
    """The small-set archive's name, with its installation's hash."""
    return class_archive("small", tmp_path).name


def test_each_kind_of_jvm_writes_and_maps_an_archive_of_its_own(tmp_path: Path) -> None:
    option, writer = class_archive_options("small", tmp_path)
    name = small(tmp_path)
    assert name.startswith(f"spark-{VERSION}-small-") and name.endswith(".jsa")
    assert option == f"-XX:ArchiveClassesAtExit={tmp_path}/{name}.{os.getpid()}.tmp -Xlog:cds*=off"
    assert writer == tmp_path / f"{name}.{os.getpid()}.jvm"
    # that JVM wrote its archive and exited (a pid that is not running)
    writer.write_text("999999999")
    Path(option.split()[0].split("=", 1)[1]).write_bytes(b"archive")
    assert class_archive_options("small", tmp_path) == (
        f"-XX:SharedArchiveFile={tmp_path}/{name} -Xlog:cds*=off",
        None,
    )
    large, large_writer = class_archive_options("large", tmp_path)
    assert large.startswith(f"-XX:ArchiveClassesAtExit={class_archive('large', tmp_path)}.")
    assert large_writer is not None


def test_archives_of_earlier_names_are_removed(tmp_path: Path) -> None:
    """One archive for both kinds, then one a kind whatever the checkout: each fitted one
    kind, or one checkout, at most (another checkout's JVM warned of it at every start)."""
    shared = tmp_path / f"spark-{VERSION}.jsa"
    shared.write_bytes(b"written by a small-set JVM")
    any_checkout = tmp_path / f"spark-{VERSION}-large.jsa"
    any_checkout.write_bytes(b"written from another checkout's classpath")
    option, _ = class_archive_options("large", tmp_path)
    assert not shared.exists() and not any_checkout.exists()
    assert "ArchiveClassesAtExit" in option


def test_a_second_writers_archive_is_removed_once_one_is_in_place(tmp_path: Path) -> None:
    """Two runs that started without an archive each write one; the first to be found is
    put in place, the other deleted (not left in the cache, 170 MB each)."""
    name = small(tmp_path)
    for pid in (999999998, 999999999):
        (tmp_path / f"{name}.{pid}.jvm").write_text(str(pid))
        (tmp_path / f"{name}.{pid}.tmp").write_bytes(str(pid).encode())
    option, writer = class_archive_options("small", tmp_path)
    assert option == f"-XX:SharedArchiveFile={tmp_path}/{name} -Xlog:cds*=off"
    assert writer is None
    assert sorted(p.name for p in tmp_path.glob("spark-*")) == [name]


def _writer(directory: Path, name: str, run: int, process: subprocess.Popen[bytes]) -> Path:
    """Note ``process`` as the JVM of run ``run`` (the number in the files' names) that
    writes ``name``'s archive as it exits; where it writes it."""
    (directory / f"{name}.{run}.jvm").write_text(str(process.pid))
    return directory / f"{name}.{run}.tmp"


def _sleeper(*arguments: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *arguments])


def _described(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text() + Path(
            f"/proc/{pid}/cmdline"
        ).read_bytes().decode(errors="replace")
    except OSError as exc:
        return f"process {pid}: {exc}"


def test_a_run_waits_for_the_archive_another_jvm_is_writing_as_it_exits(
    tmp_path: Path,
) -> None:
    """Run twice in a row, the second run found the first's JVM still writing its archive
    and wrote one of its own (23 s for 106 events instead of 8). It now waits for that JVM
    to exit and maps the archive; a JVM that is still running (no archive begun) is not
    waited for."""
    name = small(tmp_path)
    running = _sleeper(f"-XX:ArchiveClassesAtExit={tmp_path}/{name}.1.tmp")
    writing = _sleeper(f"-XX:ArchiveClassesAtExit={tmp_path}/{name}.2.tmp")
    try:
        _writer(tmp_path, name, 1, running)
        _writer(tmp_path, name, 2, writing).write_bytes(b"written")

        exited: list[float] = []

        def exit_after_writing() -> None:
            writing.kill()
            writing.wait()
            exited.append(time.monotonic())

        threading.Timer(1.0, exit_after_writing).start()
        began = time.monotonic()
        option, writer = class_archive_options("small", tmp_path)
        returned = time.monotonic()
        # it returned once the writer had exited, not before (on a loaded machine this
        # thread may start its wait late: what counts is the order, not the 1 s)
        assert exited and exited[0] <= returned < began + 30
        assert option == f"-XX:SharedArchiveFile={tmp_path}/{name} -Xlog:cds*=off"
        assert writer is None
        assert (tmp_path / name).read_bytes() == b"written"
        # left to a later run (what the process was, should it not be)
        assert (tmp_path / f"{name}.1.jvm").exists(), _described(running.pid)
    finally:
        for process in (running, writing):
            process.kill()
            process.wait()


def test_an_archive_whose_writer_is_gone_is_not_waited_for(tmp_path: Path) -> None:
    """A writer that has exited but is not reaped yet (a container without an init), or
    whose pid another process was given since (a restart), wrote its archive whole: it is
    put in place at once, not waited for at every run."""
    name = small(tmp_path)
    unreaped = _sleeper(f"-XX:ArchiveClassesAtExit={tmp_path}/{name}.1.tmp")
    other = _sleeper()
    try:
        _writer(tmp_path, name, 1, unreaped).write_bytes(b"unreaped")
        _writer(tmp_path, name, 2, other).write_bytes(b"other")
        unreaped.kill()
        while Path(f"/proc/{unreaped.pid}/stat").read_text().split(") ")[1][0] != "Z":
            time.sleep(0.01)
        began = time.monotonic()
        option, writer = class_archive_options("small", tmp_path)
        assert time.monotonic() - began < 5
        assert option == f"-XX:SharedArchiveFile={tmp_path}/{name} -Xlog:cds*=off"
        assert writer is None
        assert sorted(p.name for p in tmp_path.glob("spark-*")) == [name]
    finally:
        for process in (unreaped, other):
            process.kill()
            process.wait()


def test_the_archives_of_an_installation_that_is_gone_are_removed(tmp_path: Path) -> None:
    """Each PySpark installation (a checkout's environment) keeps archives of its own, about
    170 MB each kind: once its directory is gone, the next run removes them, and the
    archives its JVMs were writing; another installation's that is still there stays."""
    gone, kept = tmp_path / "gone-checkout", tmp_path / "other-checkout"
    kept.mkdir()
    (tmp_path / "installation-0123456789ab").write_text(str(gone))
    (tmp_path / "installation-ba9876543210").write_text(str(kept))
    left = [
        f"spark-{VERSION}-small-0123456789ab.jsa",
        f"spark-{VERSION}-large-0123456789ab.jsa.4242.tmp",
        f"spark-{VERSION}-large-0123456789ab.jsa.4242.jvm",
    ]
    other = f"spark-{VERSION}-small-ba9876543210.jsa"
    for name in (*left, other):
        (tmp_path / name).write_bytes(b"archive")
    class_archive_options("small", tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert not names & {*left, "installation-0123456789ab"}
    assert {other, "installation-ba9876543210"} <= names
    home = tmp_path / f"installation-{class_archive('small', tmp_path).stem.rsplit('-', 1)[1]}"
    assert Path(home.read_text()) == Path(pyspark.__file__).resolve().parent


def run_with_cache(code: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by a Python of its own with ``cache`` as its cache home; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **{k: v for k, v in os.environ.items() if k != CLASS_ARCHIVE_SWITCH},
            "XDG_CACHE_HOME": str(cache),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


WRITER = """
from brokerd.analytics.session import spark_session
spark_session(input_bytes=None, driver_memory="1g").stop()
"""


def test_the_jvm_that_writes_an_archive_says_nothing_of_it(tmp_path: Path) -> None:
    """The first run of each kind writes its archive as its JVM exits. The JVM's own
    account of the classes it leaves out (signed jars, and generated classes: dozens of
    warning lines from a JVM that only started, thousands after a large set's jobs) is
    not the user's business: the run's output stays what it is without an archive."""
    cache = tmp_path / "cache"
    done = run_with_cache(WRITER, cache)
    written = list((cache / "brokerd").glob(f"{class_archive('large', Path()).name}.*.tmp"))
    assert len(written) == 1 and written[0].stat().st_size > 1_000_000
    jvm_lines = [line for line in (done.stdout + done.stderr).splitlines() if "[cds" in line]
    assert jvm_lines == []


def test_the_driver_jvms_compilers_follow_the_trace_sets_size() -> None:
    """A small set's driver JVM uses the quick compiler and the serial collector; a set of
    a few million events the quick compiler alone (the optimising one spent more on
    Spark's generated stages than the tasks gained) and the parallel collector; a larger or
    unknown set both compilers and the parallel collector; a running analyzer the JVM's
    defaults (docs/analytics.md, Performance)."""
    assert driver_jvm_options(100_000) == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert driver_jvm_options(250_000_000) == "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"
    assert driver_jvm_options(1_500_000_000) == "-XX:+UseParallelGC"
    assert driver_jvm_options(None) == "-XX:+UseParallelGC"
    # a running analyzer's JVM idles between requests for days: the JVM's own collector
    assert driver_jvm_options(None, long_running=True) == ""


SIZED = """
from brokerd.analytics.session import spark_session
spark = spark_session(input_bytes=SIZE, driver_memory="1g")
management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
print(list(management.getRuntimeMXBean().getInputArguments()))
print(sorted(bean.getName() for bean in management.getGarbageCollectorMXBeans()))
spark.stop()
"""


@pytest.mark.parametrize(("size", "quick"), [(250_000_000, True), (None, False)])
def test_a_large_sets_driver_jvm_runs_with_the_parallel_collector(
    tmp_path: Path, size: int | None, quick: bool
) -> None:
    """The options reach the driver JVM that Spark starts: a set of a few million events
    gets the quick compiler only, a larger one both; either collects with the parallel
    collector (its young and old generations' collectors are "PS Scavenge" and "PS
    MarkSweep"), not G1."""
    done = run_with_cache(SIZED.replace("SIZE", repr(size)), tmp_path)
    arguments, collectors = done.stdout.strip().splitlines()[-2:]
    assert ("-XX:TieredStopAtLevel=1" in arguments) is quick
    assert "UseSerialGC" not in arguments
    assert collectors == "['PS MarkSweep', 'PS Scavenge']"
