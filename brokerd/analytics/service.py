"""A running analytics driver: one Spark application kept warm for many analyses.

``brokerd analyze`` starts a JVM, and a JVM runs Spark's code cold: on a small deployment
that start and that cold code are most of the run (docs/analytics.md, "A running
driver"). ``brokerd analyzer SOCKET`` starts Spark once, warms its code up on a
generated trace set (:mod:`brokerd.analytics.synthetic`), and then answers
``brokerd analyze TRACE_DIR... --server SOCKET`` one analysis at a time, each in a
session of its own with the settings for its size (:func:`~brokerd.analytics.session.
sized_session`); the report is the one ``brokerd analyze`` writes alone.

The socket is a Unix socket, 0600 in a directory this user owns (made 0700 when it is
made here): an analysis reads the trace files and writes the report as the analyzer's
user, on its machine, so only that user may ask. The exchange:

* the client sends one line, a JSON object: ``paths`` (absolute trace directories or
  segments), ``out`` (the absolute report directory), ``top`` and ``witness`` (the
  endpoints of database files, as ``--database`` reads them); at most
  :data:`REQUEST_LIMIT` bytes;
* the analyzer answers with the analysis's progress lines, then one line that starts
  with :data:`RESULT` (the ASCII record separator) followed by a JSON object: ``ok``,
  and either ``passed``, ``text`` (the printed summary), ``summary`` and ``html`` (the
  files written) or ``error``.

A bad request, a trace set that cannot be read or an analysis that fails is answered
with an error and the analyzer goes on; a client that leaves mid-analysis abandons it.

This module's client side (:func:`ask`) imports neither PySpark nor the jobs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from brokerd.errors import AnalyticsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REQUEST_LIMIT = 64 * 1024 * 1024
"""Bytes of one request line (the witness rows of many database files fit)."""
REQUEST_TIMEOUT = 30.0
"""Seconds a client has to send its request (the analyzer answers one at a time)."""
RESULT = "\x1e"
"""The first character of the answer's last line (progress lines never hold it)."""
MAX_PATHS = 10_000
MAX_TOP = 100_000
WARM_UP_CONVERSATIONS = 2_000
"""The generated set the analyzer warms up on (about 20,000 events)."""
DEFAULT_WARM_UPS = 3
"""Analyses of the generated set before the first request: the JVM compiles the code the
jobs run hot over a few runs (docs/analytics.md, "A running driver")."""

Witness = tuple[str, bool, int, int]


@dataclass(frozen=True)
class Request:
    """One analysis asked of the analyzer."""

    paths: tuple[Path, ...]
    out: Path
    top: int
    witness: tuple[Witness, ...] = ()

    def encode(self) -> bytes:
        return (
            json.dumps(
                {
                    "paths": [str(p) for p in self.paths],
                    "out": str(self.out),
                    "top": self.top,
                    "witness": [list(w) for w in self.witness],
                }
            )
            + "\n"
        ).encode()

    @classmethod
    def decode(cls, line: bytes) -> Request:
        """The request of one line, or :class:`AnalyticsError` saying what is wrong."""
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise AnalyticsError(f"a request is one line of JSON ({exc})") from None
        if not isinstance(data, dict) or set(data) != {"paths", "out", "top", "witness"}:
            raise AnalyticsError("a request holds paths, out, top and witness, nothing else")
        paths, out, top, witness = data["paths"], data["out"], data["top"], data["witness"]
        if (
            not isinstance(paths, list)
            or not 0 < len(paths) <= MAX_PATHS
            or not all(isinstance(p, str) and os.path.isabs(p) for p in paths)
        ):
            raise AnalyticsError(f"paths: 1 to {MAX_PATHS:,} absolute paths")
        if not isinstance(out, str) or not os.path.isabs(out):
            raise AnalyticsError("out: an absolute path")
        if type(top) is not int or not 0 < top <= MAX_TOP:
            raise AnalyticsError(f"top: an integer from 1 to {MAX_TOP:,}")
        if not isinstance(witness, list) or not all(_is_witness(w) for w in witness):
            raise AnalyticsError("witness: [conversation id, initiator, sent, received] rows")
        return cls(
            tuple(Path(p) for p in paths),
            Path(out),
            top,
            tuple((w[0], w[1], w[2], w[3]) for w in witness),
        )


def _is_witness(row: Any) -> bool:
    return (
        isinstance(row, list)
        and len(row) == 4
        and isinstance(row[0], str)
        and type(row[1]) is bool
        and type(row[2]) is int
        and type(row[3]) is int
    )


# -- the client ---------------------------------------------------------------------------


def ask(path: Path, request: Request, progress: TextIO | None) -> dict[str, Any]:
    """Send ``request`` to the analyzer listening at ``path``, copy its progress lines to
    ``progress``, and return its result (``ok`` true); an error is :class:`AnalyticsError`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise AnalyticsError(
                f"{path}: no analyzer answers ({exc.strerror or exc}); "
                "'brokerd analyzer SOCKET' starts one"
            ) from None
        sock.sendall(request.encode())
        with sock.makefile("r", encoding="utf-8", newline="\n") as answer:
            for line in answer:
                if line.startswith(RESULT):
                    result: dict[str, Any] = json.loads(line[1:])
                    if not result.get("ok"):
                        raise AnalyticsError(f"the analyzer: {result.get('error')}")
                    return result
                if progress is not None:
                    progress.write(line)
                    progress.flush()
    raise AnalyticsError(f"{path}: the analyzer closed the connection without a result")


# -- the analyzer -------------------------------------------------------------------------


def listen(path: Path) -> socket.socket:
    """A Unix socket listening at ``path``, 0600, in a directory of this user's (made
    0700 if missing). A socket file left by an analyzer that is gone is replaced; one
    that answers is not."""
    directory = path.parent
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True)
    owner = directory.stat()
    if owner.st_uid != os.getuid() or owner.st_mode & 0o022:
        raise AnalyticsError(f"{directory}: the socket's directory must be this user's alone")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise AnalyticsError(f"{path}: exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left by an analyzer that is gone
            else:
                raise AnalyticsError(f"{path}: an analyzer is listening there already")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    server.listen(16)
    return server


class Analyzer:
    """The warm Spark application and the socket it answers on, one analysis at a time."""

    def __init__(self, spark: SparkSession, server: socket.socket) -> None:
        self.spark = spark
        self.server = server
        self.analyses = 0

    def warm_up(self, runs: int, log: TextIO, conversations: int = WARM_UP_CONVERSATIONS) -> None:
        """Analyse a generated trace set of ``conversations`` ``runs`` times, so that the
        first request finds the jobs' code compiled."""
        if runs <= 0:
            return
        from brokerd.analytics.synthetic import Plan, generate

        with tempfile.TemporaryDirectory(prefix="brokerd-analyzer-") as scratch:
            traces, report = Path(scratch, "traces"), Path(scratch, "report")
            generate(traces, Plan(conversations=conversations, seconds=120))
            for run in range(runs):
                began = time.perf_counter()
                self.analyse(Request((traces,), report, 10), None)
                print(
                    f"analyzer: warm-up {run + 1}/{runs}: {time.perf_counter() - began:.1f} s",
                    file=log,
                    flush=True,
                )

    def analyse(self, request: Request, progress: TextIO | None) -> dict[str, Any]:
        """Run one analysis in a session of its own and write its report."""
        from brokerd.analytics.load import plain_bytes, trace_files
        from brokerd.analytics.report import (
            analyze,
            print_summary,
            write_report,
        )
        from brokerd.analytics.session import sized_session

        size = plain_bytes(trace_files(list(request.paths)))
        session = sized_session(self.spark, size)
        analysis = analyze(
            request.paths,
            master=self.spark.sparkContext.master,
            spark=session,
            top=request.top,
            progress=progress,
            witness=request.witness,
        )
        text = io.StringIO()
        print_summary(analysis, text)
        summary, html = write_report(analysis, request.out)
        self.analyses += 1
        return {
            "ok": True,
            "passed": analysis.audit.passed,
            "text": text.getvalue(),
            "summary": str(summary),
            "html": str(html),
            "seconds": round(analysis.runtime_seconds, 3),
        }

    def answer(self, conn: socket.socket, log: TextIO) -> None:
        """Read one request from ``conn``, run it and answer (nothing to a connection
        closed without a byte: another analyzer's check that this one listens)."""
        with conn, conn.makefile("w", encoding="utf-8", newline="\n") as reply:
            try:
                conn.settimeout(REQUEST_TIMEOUT)
                line = _read_line(conn)
                if line is None:
                    return
                conn.settimeout(None)
                result = self.analyse(Request.decode(line), reply)
            except TimeoutError:
                result = {"ok": False, "error": f"no request within {REQUEST_TIMEOUT:.0f} s"}
            except AnalyticsError as exc:
                result = {"ok": False, "error": str(exc)}
            except OSError as exc:  # the client left, or the report cannot be written
                if isinstance(exc, BrokenPipeError | ConnectionResetError):
                    print("analyzer: a client left before its result", file=log, flush=True)
                    return
                result = {"ok": False, "error": f"{exc}"}
            except Exception as exc:  # a failed analysis, not the analyzer
                result = {"ok": False, "error": f"the analysis failed: {exc}"}
            with contextlib.suppress(OSError):
                reply.write(RESULT + json.dumps(result, default=str) + "\n")
                reply.flush()
            verdict = "error: " + str(result["error"]) if not result["ok"] else "answered"
            print(f"analyzer: {verdict}", file=log, flush=True)

    def serve_forever(self, log: TextIO) -> None:
        while True:
            conn, _ = self.server.accept()
            try:
                self.answer(conn, log)
            except OSError as exc:  # one client's socket, never the analyzer
                print(f"analyzer: a client's connection failed: {exc}", file=log, flush=True)


def _read_line(conn: socket.socket) -> bytes | None:
    """The request's line, at most :data:`REQUEST_LIMIT` bytes (None: closed at once)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk and not chunks:
            return None
        if not chunk:
            raise AnalyticsError("the request ended before its newline")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > REQUEST_LIMIT:
            raise AnalyticsError(f"a request is at most {REQUEST_LIMIT:,} bytes")


def serve(path: Path, master: str | None, warm_ups: int, log: TextIO = sys.stderr) -> int:
    """``brokerd analyzer``: listen at ``path`` until SIGTERM or SIGINT."""
    from brokerd.analytics.session import spark_session

    server = listen(path)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    spark = None
    try:
        spark = spark_session(master, app_name="brokerd-analyzer")
        analyzer = Analyzer(spark, server)
        analyzer.warm_up(warm_ups, log)
        print(f"analyzer: listening at {path} ({spark.sparkContext.master})", file=log, flush=True)
        analyzer.serve_forever(log)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        with contextlib.suppress(OSError):
            path.unlink()
        if spark is not None:
            spark.stop()
    return 0
