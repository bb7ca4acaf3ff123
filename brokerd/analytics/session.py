"""The Spark session the jobs run in: local mode by default, a cluster with ``--master``.

Local mode uses every core of this machine (``local[*]``) and a driver heap sized
for a few million events; a cluster is reached with ``master="spark://host:7077"``
(or ``yarn``, ``k8s://...``), where the executors' settings come from the cluster.
Spark's own logging is turned down to warnings; the console progress bar is
shown when stderr is a terminal, so long runs show their stages.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from brokerd.errors import AnalyticsError

DEFAULT_MASTER = "local[*]"
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
"""Spark's logging while the jobs run: errors only."""


def spark_session(
    master: str | None = None,
    *,
    driver_memory: str = "4g",
    shuffle_partitions: int | None = None,
    app_name: str = "brokerd-analyze",
) -> SparkSession:
    """Start (or reuse) the Spark session for the analytics jobs."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    local = master is None or master.startswith("local")
    partitions = shuffle_partitions or (2 * (os.cpu_count() or 2) if local else 200)
    builder = (
        SparkSession.builder.master(master or DEFAULT_MASTER)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .config("spark.sql.files.maxPartitionBytes", str(64 * 1024 * 1024))
        # A daemon may close (rename) an open segment while Spark reads the set.
        .config("spark.sql.files.ignoreMissingFiles", "true")
    )
    if local:
        builder = builder.config("spark.driver.memory", driver_memory).config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
        )
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # no Java, a master that does not answer, a bad setting
        raise AnalyticsError(f"cannot start Spark ({master or DEFAULT_MASTER}): {exc}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark
