"""The Spark session the jobs run in: local mode by default, a cluster with ``--master``.

Local mode uses every core of this machine (``local[*]``) and a driver heap sized
for a few million events; a cluster is reached with ``master="spark://host:7077"``
(or ``yarn``, ``k8s://...``), where the executors' settings come from the cluster.
Spark's own logging is turned down to warnings; the console progress bar is
shown when stderr is a terminal, so long runs show their stages.

The settings follow the size of the input (``input_bytes``, known before Spark starts),
because the costs differ (R-REPORT-3; docs/analytics.md, Performance):

* **a small trace set** (below :data:`SMALL_INPUT_BYTES`, about 250,000 events): the
  run is all fixed costs, the JVM's start and a few hundred milliseconds per Spark job.
  One shuffle partition, no adaptive execution (each of its re-planned shuffle stages is
  a job of its own), no broadcast joins (each broadcast is a job), no code generation at
  all (compiling a plan, or an expression, costs more than running it on a few thousand
  rows), and a driver JVM that only uses its quick compiler and the serial collector;
* **a large one**: adaptive execution over ``2 x cores`` shuffle partitions (200 on a
  cluster), no generated method larger than the JVM compiles (:data:`JVM_HUGE_METHOD`),
  Spark's defaults otherwise, and a driver JVM with the parallel collector; below
  :data:`QUICK_COMPILER_BYTES` (a few million events) one that only uses its quick
  compiler too.

:func:`sql_settings` holds the SQL settings by size; :func:`sized_session` gives a running
application's session them for one analysis (:mod:`brokerd.analytics.service`).

In either case the driver JVM maps Spark's classes from a class-data-sharing archive
(:func:`class_archive_options`), and the tables the jobs share are read from the cache
without the plans that computed them (:func:`keep`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from brokerd.analytics.cache import CACHE_DIR
from brokerd.errors import AnalyticsError

DEFAULT_MASTER = "local[*]"
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
"""Spark's logging while the jobs run: errors only."""
SMALL_INPUT_BYTES = 64 * 1024 * 1024
"""Trace sets below this size (about 250,000 events of ~250 bytes) get the small settings."""
SMALL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The driver JVM for a small trace set: C1 only (no time spent in the optimising
compiler, which never pays back in a run of seconds), and the serial collector."""
QUICK_COMPILER_BYTES = 1024 * 1024 * 1024
"""Trace sets below this size (about four million events) but not small get a driver JVM
that only uses its quick compiler too (:data:`QUICK_JVM_OPTIONS`)."""
THROUGHPUT_COLLECTOR = "-XX:+UseParallelGC"
"""The collector of a driver JVM that runs tasks for a minute: the parallel one, which
stops the tasks to collect and spends nothing beside them, where G1 (the JVM's default on
this kind of machine) keeps threads of its own and barriers in every write of a
reference. Five million events took 57.6-65.0 s with it, against 66.0-71.2 s with G1
(alternated in one sitting, a Zen 5), the JVM's CPU about a tenth less; a million, 25.6
and 27.8 s against 28.9 and 29.7 s (docs/analytics.md, Performance)."""
QUICK_JVM_OPTIONS = f"-XX:TieredStopAtLevel=1 {THROUGHPUT_COLLECTOR}"
"""The driver JVM for a trace set of a few million events: C1 only. The optimising
compiler spends seconds on each of the huge methods Spark generates for a stage (a
sort's input loop of 250 KB of machine code took 4 s, compiled four times over), on
one of the two cores the tasks run on. A million events took 93 s end to end with it
and 66 s without; five million took as long either way (159 against 161 s), since there
the tasks run long enough to repay it."""


LAUNCHER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"
"""The launcher's JVM (it runs for a fraction of a second before the driver's)."""


ARCHIVE_QUIET = "-Xlog:cds*=off"
"""The JVM's own account of an archive (the classes a dump leaves out, generated classes
and those of signed jars, hundreds of warning lines as it exits; an archive of another
JVM, ignored) is not the user's: without it a run's output is the same with an archive,
while one is written and without one."""


CLASS_ARCHIVE_DIR = CACHE_DIR
"""Where the driver JVM's class archive is kept (:func:`class_archive_options`)."""
CLASS_ARCHIVE_SWITCH = "BROKERD_CLASS_ARCHIVE"
"""An environment variable: ``off`` runs the driver JVM without a class archive, neither
using nor writing one (a fresh checkout's test run in CI, whose few JVMs would each pay
for writing an archive that no later run uses)."""


ARCHIVE_WRITE_WAIT = 60.0
"""Seconds a run waits for another run's JVM that is writing its class archive as it exits
(about 180 MB: a few seconds), before it starts without one."""

JvmKind = Literal["small", "large"]
"""The driver JVM's settings (:data:`SMALL_JVM_OPTIONS`, or a large set's:
:func:`driver_jvm_options`)."""


def _installation() -> tuple[str, str]:
    """This PySpark installation's directory, and the hash of it archives are named by."""
    import pyspark

    home = str(Path(pyspark.__file__).resolve().parent)
    return home, hashlib.sha256(home.encode()).hexdigest()[:12]


def class_archive(kind: JvmKind, directory: Path = CLASS_ARCHIVE_DIR) -> Path:
    """The class archive of ``kind`` of driver JVM for this PySpark installation."""
    import pyspark

    return directory / f"spark-{pyspark.__version__}-{kind}-{_installation()[1]}.jsa"


def _forget_gone_installations(directory: Path) -> None:
    """Note this installation (``installation-<hash>``, its directory inside), and remove
    the archives of installations that are gone (a checkout deleted: 170 MB each kind,
    and the archives its JVMs were writing)."""
    home, digest = _installation()
    (directory / f"installation-{digest}").write_text(home)
    for note in directory.glob("installation-*"):
        other = note.name.removeprefix("installation-")
        if other == digest or Path(note.read_text()).is_dir():
            continue
        for stale in directory.glob(f"spark-*-{other}.jsa*"):
            stale.unlink(missing_ok=True)
        note.unlink(missing_ok=True)


def class_archive_options(
    kind: JvmKind, directory: Path = CLASS_ARCHIVE_DIR
) -> tuple[str, Path | None]:
    """The driver JVM's class-data-sharing options (the archive's, and its logging turned
    off: :data:`ARCHIVE_QUIET`), and where the JVM's pid is to be written.

    With an archive of Spark's classes (``spark-<version>-<kind>-<installation>.jsa``) the
    JVM maps them instead of reading the jars, which halves its start and its first job.
    Each ``kind`` of driver JVM (the small and the large settings) has an archive of its
    own: the classes one kind loads are not the other's (with one archive for both, a
    large set's Spark started in 7.5 s instead of 2.7). Without one, this run's
    JVM writes one when it exits, under a name of its own (runs at the same time never
    share a file); a later run puts it in place once that JVM is gone (its pid is written
    next to it, :func:`note_archive_writer`), waiting for it (:data:`ARCHIVE_WRITE_WAIT`)
    while it writes its archive as it exits. An archive names the PySpark installation
    that wrote it (a hash of its path: the classpath the JVM checks), so two checkouts
    each keep their own; a JVM that finds an archive of another JVM ignores it. Nothing
    when the directory cannot be written."""
    import pyspark

    archive = class_archive(kind, directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # earlier versions' names: one archive for both kinds (it fits one kind at most),
        # then one a kind for every checkout (it fits the checkout that wrote it only)
        (directory / f"spark-{pyspark.__version__}.jsa").unlink(missing_ok=True)
        (directory / f"spark-{pyspark.__version__}-{kind}.jsa").unlink(missing_ok=True)
        _forget_gone_installations(directory)
        deadline = time.monotonic() + ARCHIVE_WRITE_WAIT
        for writer in sorted(directory.glob(f"{archive.name}.*.jvm")):
            written = writer.with_suffix(".tmp")
            pid = int(writer.read_text())
            # a JVM writes its archive as it exits: while no archive is in place, one that
            # has begun is waited for (a run started right after another would otherwise
            # write an archive of its own, taking twice as long); one still running is not
            if _writing(pid, written) and (
                archive.exists() or not written.exists() or not _written(pid, written, deadline)
            ):
                continue
            writer.unlink(missing_ok=True)  # another run waiting for that JVM may be first
            if not written.exists():  # that JVM was killed before it wrote it
                continue
            with contextlib.suppress(FileNotFoundError):
                if archive.exists():  # another run's archive is in place already
                    written.unlink()
                else:
                    written.replace(archive)
        if archive.exists():
            return f"-XX:SharedArchiveFile={archive} {ARCHIVE_QUIET}", None
        if not os.access(directory, os.W_OK):
            return "", None
    except (OSError, ValueError):
        return "", None
    written = directory / f"{archive.name}.{os.getpid()}.tmp"
    return f"-XX:ArchiveClassesAtExit={written} {ARCHIVE_QUIET}", written.with_suffix(".jvm")


def note_archive_writer(spark: SparkSession, writer: Path) -> None:
    """Write the pid of ``spark``'s JVM, which writes a class archive when it exits."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    with contextlib.suppress(OSError):
        writer.write_text(str(jvm.java.lang.ProcessHandle.current().pid()))


@dataclass(frozen=True)
class Kept:
    """A table computed once (by the first job that reads it) for the jobs that follow."""

    df: DataFrame
    """What the jobs read: the cached table alone, not the plan that computes it."""
    source: DataFrame
    """The cached DataFrame (:meth:`release` drops its cache)."""

    def release(self) -> None:
        self.source.unpersist()


def keep(df: DataFrame) -> Kept:
    """``df`` cached (memory, then disk; columnar and compressed), and a DataFrame that
    starts from the cache itself.

    A DataFrame over a cached one still carries the whole plan behind the cache (the
    parse, the message table's fold and joins): every job that reads it analyses that
    plan and looks it up in the cache again, which is most of a small run's time. The
    DataFrame returned (``Kept.df``) is the cache's own relation, so the jobs plan a few
    operators; where Spark does not offer it (another version), the cached DataFrame."""
    cached = df.persist(StorageLevel.MEMORY_AND_DISK)
    spark = cached.sparkSession
    try:
        relation = cached._jdf.queryExecution().withCachedData()
        if relation.nodeName() == "InMemoryRelation":
            rows = spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(  # type: ignore[union-attr]
                spark._jsparkSession, relation
            )
            return Kept(DataFrame(rows, spark), cached)
    except Py4JError:
        pass
    return Kept(cached, cached)


def _written(pid: int, written: Path, deadline: float) -> bool:
    """Whether process ``pid`` has stopped writing the archive ``written`` by ``deadline``
    (``time.monotonic()``): it exited, or it is not the JVM that writes it (a process that
    has exited and is not reaped yet, or another one that was given its pid since)."""
    while _writing(pid, written):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _writing(pid: int, written: Path) -> bool:
    """Whether process ``pid`` is a running JVM that writes the archive ``written`` as it
    exits: not a process that has exited and is not reaped yet (a container without an
    init), nor one given its pid since (a restart). Where ``/proc`` cannot tell, any
    running process."""
    if not _alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return True
    state = stat[stat.rindex(")") + 2 :].split()[:1]
    return state != ["Z"] and f"-XX:ArchiveClassesAtExit={written}".encode() in command


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_small(input_bytes: int | None) -> bool:
    """Whether a trace set of ``input_bytes`` gets the small settings (None: unknown, large)."""
    return input_bytes is not None and input_bytes < SMALL_INPUT_BYTES


def driver_jvm_options(input_bytes: int | None, *, long_running: bool = False) -> str:
    """The driver JVM's compiler and collector for a trace set of ``input_bytes`` (None:
    unknown, a large set's: both compilers, :data:`THROUGHPUT_COLLECTOR`). A
    ``long_running`` JVM (a running analyzer's, which analyses set after set for days)
    keeps the JVM's defaults, G1 among them: the parallel collector is measured for one
    analysis, not for a JVM that idles between requests."""
    if long_running:
        return ""
    if is_small(input_bytes):
        return SMALL_JVM_OPTIONS
    if input_bytes is not None and input_bytes < QUICK_COMPILER_BYTES:
        return QUICK_JVM_OPTIONS
    return THROUGHPUT_COLLECTOR


HUGE_METHOD_LIMIT = "spark.sql.codegen.hugeMethodLimit"
JVM_HUGE_METHOD = 8000
"""The size in bytes above which HotSpot compiles no method (``-XX:HugeMethodLimit``, with
``DontCompileHugeMethods``): a large set's stage of whole-stage generated code with a
method above it runs as its operators instead, each with its expressions compiled in
small methods, not interpreted row after row (:data:`HUGE_METHOD_LIMIT`, Spark's advice
for HotSpot). Five million events: 60.6-61.2 s against 61.0-62.7 s without it (three
alternating rounds), and with the message table's lists worked out after its window
58.1-60.8 s."""
FACTORY_MODE = "spark.sql.codegen.factoryMode"
INTERPRETED = "NO_CODEGEN"
"""The value of :data:`FACTORY_MODE` that interprets every expression (a small set's)."""


def sql_settings(
    input_bytes: int | None, *, local: bool = True, shuffle_partitions: int | None = None
) -> dict[str, str]:
    """The SQL settings for a trace set of ``input_bytes`` (None: unknown, large): those a
    running session takes for each analysis (:func:`sized_session`)."""
    small = is_small(input_bytes)
    partitions = shuffle_partitions or (1 if small else 2 * (os.cpu_count() or 2) if local else 200)
    return {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.enabled": str(not small).lower(),
        "spark.sql.autoBroadcastJoinThreshold": "-1" if small else "10MB",
        "spark.sql.codegen.wholeStage": str(not small).lower(),
        # interpreted expressions too on a small set: no Janino compilation of each
        # projection, predicate and ordering (most of a small run's CPU otherwise)
        FACTORY_MODE: INTERPRETED if small else "FALLBACK",
        # Spark's default on a small set (no whole-stage code there): a running analyzer's
        # session for a small set does not keep a large set's limit
        HUGE_METHOD_LIMIT: "65535" if small else str(JVM_HUGE_METHOD),
    }


def compiles_expressions(spark: SparkSession) -> bool:
    """Whether ``spark``'s session compiles expressions (a large set's settings: where a few
    more aggregates cost less than a higher-order function, :mod:`brokerd.analytics.messages`)."""
    return spark.conf.get(FACTORY_MODE, None) != INTERPRETED


def sized_session(spark: SparkSession, input_bytes: int | None) -> SparkSession:
    """A session of ``spark``'s application (its JVM, its cache) with the SQL settings for
    ``input_bytes`` of traces and temporary views of its own: one analysis of a running
    driver (:mod:`brokerd.analytics.service`)."""
    local = (spark.sparkContext.master or DEFAULT_MASTER).startswith("local")
    session = spark.newSession()
    for key, value in sql_settings(input_bytes, local=local).items():
        session.conf.set(key, value)
    return session


def spark_session(
    master: str | None = None,
    *,
    driver_memory: str = "4g",
    shuffle_partitions: int | None = None,
    input_bytes: int | None = None,
    app_name: str = "brokerd-analyze",
    long_running: bool = False,
) -> SparkSession:
    """Start (or reuse) the Spark session for the analytics jobs over ``input_bytes`` of
    traces (None: unknown, the settings of a large set); ``long_running``: a running
    analyzer's, whose driver JVM keeps the JVM's collector (:func:`driver_jvm_options`)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # the JVM that spark-submit starts only to compute the driver's command line
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", LAUNCHER_JVM_OPTIONS)
    local = master is None or master.startswith("local")
    small = is_small(input_bytes)
    builder = SparkSession.builder.master(master or DEFAULT_MASTER).appName(app_name)
    for key, value in sql_settings(
        input_bytes, local=local, shuffle_partitions=shuffle_partitions
    ).items():
        builder = builder.config(key, value)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .config("spark.sql.files.maxPartitionBytes", str(64 * 1024 * 1024))
        # A daemon may close (rename) an open segment while Spark reads the set.
        .config("spark.sql.files.ignoreMissingFiles", "true")
    )
    # the driver runs here in either mode (client mode on a cluster)
    archive, writer = (
        class_archive_options("small" if small else "large")
        if os.environ.get(CLASS_ARCHIVE_SWITCH, "on") != "off"
        else ("", None)
    )
    if SparkSession.getActiveSession() is not None:
        writer = None  # getOrCreate returns it: its JVM has its options already
    jvm = f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()} {archive}"
    options = driver_jvm_options(input_bytes, long_running=long_running)
    builder = builder.config("spark.driver.extraJavaOptions", f"{jvm} {options}")
    if small:
        builder = builder.config("spark.executor.extraJavaOptions", SMALL_JVM_OPTIONS)
    if local:
        builder = builder.config("spark.driver.memory", driver_memory)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # no Java, a master that does not answer, a bad setting
        raise AnalyticsError(f"cannot start Spark ({master or DEFAULT_MASTER}): {exc}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    if writer is not None:
        note_archive_writer(spark, writer)
    return spark
