"""A running analytics driver: one Spark application kept warm for many analyses (R-REPORT-3).

``brokerd analyze`` starts a JVM, and a JVM runs Spark's code cold: on a small deployment
that start and that cold code are most of the run (docs/analytics.md, "A running
analyzer"). ``brokerd analyzer SOCKET`` starts Spark once, warms its code up on a
generated trace set (:mod:`brokerd.analytics.synthetic`), and then answers
``brokerd analyze TRACE_DIR... --server SOCKET`` one analysis at a time, each in a
session of its own with the settings for its size
(:func:`brokerd.analytics.session.sized_session`); the report is the one
``brokerd analyze`` writes alone.

The socket is a Unix socket, 0600 in a directory this user owns (made 0700 when it is
made here): an analysis reads the trace files and writes the report as the analyzer's
user, on its machine, so only that user may ask. The exchange:

* the client sends one line, a JSON object: ``paths`` (absolute trace directories or
  segments), ``out`` (the absolute report directory), ``top`` and ``witness`` (the
  endpoints of database files, as ``--database`` reads them: each row's sent and received
  sequence numbers from 0 to :data:`MAX_SEQUENCE`); at most
  :data:`REQUEST_LIMIT` bytes;
* the analyzer answers with the analysis's progress lines, then one line that starts
  with :data:`RESULT` (the ASCII record separator) followed by a JSON object: ``ok``,
  and either ``passed``, ``text`` (the printed summary), ``summary`` and ``html`` (the
  files written) or ``error``.

A bad request, a trace set that cannot be read or an analysis that fails is answered
with an error and the analyzer goes on; a client that hangs up mid-analysis abandons it
(its Spark jobs are cancelled), and what an analysis cached is released after it. The
analyzer ends on SIGTERM or SIGINT: at once when idle; otherwise once the client it is
answering has its answer (the analysis under way cancelled, and said so; one already
done, its result; a request still being read, that the analyzer is stopping). It ends
with status 1 once an analysis finds its Spark application gone (that client is told
why).

This module's client side (:func:`ask`) imports neither PySpark nor the jobs.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import select
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from brokerd.errors import AnalyticsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from brokerd.analytics.report import Lines

REQUEST_LIMIT = 64 * 1024 * 1024
"""Bytes of one request line (the witness rows of many database files fit)."""
REQUEST_TIMEOUT = 30.0
"""Seconds a client has to send its request (the analyzer answers one at a time) ..."""
REPLY_TIMEOUT = 30.0
"""... and to take its answer (a stop waits for it no longer)."""
RESULT = "\x1e"
"""The first character of the answer's last line (progress lines never hold it)."""
MAX_PATHS = 10_000
"""Trace directories or segments one request names."""
MAX_TOP = 1_000_000
"""Rows kept per table (``--top``)."""
MAX_WITNESS = 1_000_000
"""Endpoint rows of database files one request carries."""
MAX_SEQUENCE = 2**63 - 1
"""The largest sequence number a witness row may carry (the audit reads them as 64-bit
signed integers, ``WITNESS_SCHEMA``); the smallest is 0 (nothing sent or received)."""
WATCH_INTERVAL = 0.25
"""Seconds between the checks that an analysis's client is still there."""
WARM_UP_CONVERSATIONS = 2_000
"""The generated set the analyzer warms up on (about 20,000 events)."""
DEFAULT_WARM_UPS = 3
"""Analyses of the generated set before the first request: the JVM compiles the code the
jobs run hot over a few runs (docs/analytics.md, "A running analyzer")."""

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
        except (ValueError, RecursionError) as exc:  # nested too deep: RecursionError
            raise AnalyticsError(f"a request is one line of JSON ({exc})") from None
        if not isinstance(data, dict) or set(data) != {"paths", "out", "top", "witness"}:
            raise AnalyticsError("a request holds paths, out, top and witness, nothing else")
        paths, out, top, witness = data["paths"], data["out"], data["top"], data["witness"]
        if (
            not isinstance(paths, list)
            or not 0 < len(paths) <= MAX_PATHS
            or not all(_is_path(p) for p in paths)
        ):
            raise AnalyticsError(f"paths: 1 to {MAX_PATHS:,} absolute paths")
        if not _is_path(out):
            raise AnalyticsError("out: an absolute path")
        if type(top) is not int or not 0 < top <= MAX_TOP:
            raise AnalyticsError(f"top: an integer from 1 to {MAX_TOP:,}")
        if (
            not isinstance(witness, list)
            or len(witness) > MAX_WITNESS
            or not all(_is_witness(w) for w in witness)
        ):
            raise AnalyticsError(
                f"witness: up to {MAX_WITNESS:,} [conversation id, initiator, sent, received] rows"
            )
        for row in witness:
            if not all(0 <= count <= MAX_SEQUENCE for count in row[2:]):
                raise AnalyticsError(
                    "witness: sent and received are sequence numbers from 0 to "
                    f"{MAX_SEQUENCE:,} (a row has {row[2]}, {row[3]})"
                )
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
        with contextlib.suppress(OSError):  # refused midway: its answer says why
            sock.sendall(request.encode())
        with sock.makefile("r", encoding="utf-8", newline="\n") as answer:
            for line in answer:
                if line.startswith(RESULT):
                    try:
                        result: dict[str, Any] = json.loads(line[1:])
                    except ValueError:
                        break
                    if not isinstance(result, dict):
                        break
                    if not result.get("ok"):
                        raise AnalyticsError(f"the analyzer: {result.get('error')}")
                    if not {"passed", "text", "summary", "html"} <= set(result):
                        break
                    return result
                if progress is not None:
                    progress.write(line)
                    progress.flush()
    raise AnalyticsError(f"{path}: the analyzer closed the connection without a whole result")


# -- the analyzer -------------------------------------------------------------------------


class Listener:
    """The analyzer's socket, the lock that makes its path this analyzer's, and the
    socket file it bound (removed at :meth:`close` only if it is still that file)."""

    def __init__(self, path: Path, sock: socket.socket, lock: int) -> None:
        self.path = path
        self.sock = sock
        self.lock = lock
        self.inode = path.lstat().st_ino

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            if self.path.lstat().st_ino == self.inode:
                self.path.unlink()
        os.close(self.lock)  # the lock goes with it


def _lock_file(path: Path) -> tuple[int, bool]:
    """The lock file's descriptor, and whether this call made the file (an analyzer that
    ended leaves its own: locking it again is what tells it is gone)."""
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), True
        except FileExistsError:
            pass
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC), False
        except FileNotFoundError:  # removed by a refused listen in between: again
            continue


def listen(path: Path) -> Listener:
    """A Unix socket listening at ``path``, 0600, in a directory of this user's alone
    (made 0700 if missing). ``PATH.lock`` (locked while the analyzer runs) says whether
    another analyzer has the path: a socket file it left when it ended is replaced."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = directory.stat()
    if owner.st_uid != os.getuid() or owner.st_mode & 0o022:
        raise AnalyticsError(f"{directory}: the socket's directory must be this user's alone")
    lock_path = path.with_name(path.name + ".lock")
    lock, made = _lock_file(lock_path)
    locked = False
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            raise AnalyticsError(f"{path}: an analyzer is listening there already") from None
        if path.is_symlink() or path.exists():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise AnalyticsError(f"{path}: exists and is not a socket")
            path.unlink()  # left by an analyzer that has ended: it held the lock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(16)
    except BaseException:
        if made and locked:  # refused: no lock file this call made is left behind
            with contextlib.suppress(OSError):
                lock_path.unlink()
        os.close(lock)
        raise
    return Listener(path, sock, lock)


class ClientLines:
    """The progress lines of one analysis, sent to its client whole; a client that has
    gone is noted (:attr:`gone`), never raised into the analysis."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.gone = threading.Event()
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str, /) -> int:
        with self._lock:
            self._pending += text
            end = self._pending.rfind("\n") + 1
            if end and not self.gone.is_set():
                whole, self._pending = self._pending[:end], self._pending[end:]
                try:
                    self.conn.sendall(whole.replace(RESULT, " ").encode())
                except OSError:
                    self.gone.set()
        return len(text)

    def flush(self) -> None:
        pass


class Analyzer:
    """The warm Spark application and the socket it answers on, one analysis at a time.

    An analysis is abandoned, its Spark jobs cancelled, when its client goes (the
    socket hung up) or the analyzer is asked to stop (SIGTERM, SIGINT: it then ends
    after the analysis); whatever it had cached is released after every analysis."""

    def __init__(self, spark: SparkSession, listener: Listener) -> None:
        self.spark = spark
        self.listener = listener
        self.analyses = 0
        self.busy = False
        """An analysis (a request's or the warm-up's) runs: a stop cancels it."""
        self.answering = False
        """A client is being answered, from its request to its answer: a stop waits."""
        self.stopping = threading.Event()
        self.failed = False
        """The Spark application is gone (its JVM ended): the analyzer ends, non-zero."""

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
                self.busy = True
                try:
                    self.analyse(Request((traces,), report, 10), None)
                except Exception:
                    if self.stopping.is_set():
                        return  # cancelled by the stop
                    raise
                finally:
                    self.busy = False
                if self.stopping.is_set():
                    return
                print(
                    f"analyzer: warm-up {run + 1}/{runs}: {time.perf_counter() - began:.1f} s",
                    file=log,
                    flush=True,
                )

    def analyse(self, request: Request, progress: Lines | None) -> dict[str, Any]:
        """Run one analysis in a session of its own and write its report."""
        from brokerd.analytics.load import plain_bytes, trace_files
        from brokerd.analytics.report import analyze, print_summary, write_report
        from brokerd.analytics.session import sized_session

        size = plain_bytes(trace_files(list(request.paths)))
        session = sized_session(self.spark, size)
        try:
            analysis = analyze(
                request.paths,
                master=self.spark.sparkContext.master,
                spark=session,
                top=request.top,
                progress=progress,
                witness=request.witness,
            )
        finally:
            self.release()
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

    def release(self) -> None:
        """Drop everything an analysis cached, a step that failed midway included."""
        with contextlib.suppress(Exception):
            self.spark.catalog.clearCache()
            jsc = self.spark.sparkContext._jsc
            assert jsc is not None
            for rdd in list(jsc.getPersistentRDDs().values()):
                rdd.unpersist()

    def stop(self, signum: int, _frame: object) -> None:
        """SIGTERM, SIGINT: end now when idle; when not, cancel the analysis (a request's
        or the warm-up's), and end once the client being answered has its answer (an
        analysis done has its result sent: a signal between the two never cuts it)."""
        if not (self.busy or self.answering):
            raise SystemExit(0)
        if not self.stopping.is_set():
            self.stopping.set()
            threading.Thread(target=self._cancel_while_busy, name="stop", daemon=True).start()

    def _cancel_while_busy(self) -> None:
        """Cancel the Spark jobs, again and again (a step starts new ones), until the
        analysis under way has ended."""
        while self.busy:
            with contextlib.suppress(Exception):
                self.spark.sparkContext.cancelAllJobs()
            time.sleep(WATCH_INTERVAL)

    def answer(self, conn: socket.socket, log: TextIO) -> None:
        """Read one request from ``conn``, run it and answer (nothing to a connection
        closed without a byte). A stop meanwhile ends the analyzer after the answer."""
        with conn:
            self.answering = True
            try:
                self._answer(conn, log)
            finally:
                self.answering = False

    def _answer(self, conn: socket.socket, log: TextIO) -> None:
        """:meth:`answer`'s work: a stop (:attr:`stopping`) before the analysis begins is
        the client's error; one during it cancels it (said); one after it, nothing."""
        try:
            line = _read_line(conn, time.monotonic() + REQUEST_TIMEOUT, self.stopping)
            if line is None:
                return
            request = Request.decode(line)
            if self.stopping.is_set():
                raise AnalyticsError("the analyzer is stopping: the request was not analysed")
        except AnalyticsError as exc:
            _reply(conn, {"ok": False, "error": str(exc)}, log)
            return
        lines = ClientLines(conn)
        done = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(conn, lines, done), name="client-watch", daemon=True
        )
        self.busy = True
        watcher.start()
        try:
            result = self.analyse(request, lines)
        except (AnalyticsError, OSError) as exc:  # unreadable traces, a report not written
            result = {"ok": False, "error": str(exc)}
        except Exception as exc:  # a failed analysis, not the analyzer
            result = {"ok": False, "error": f"the analysis failed: {_first_lines(exc)}"}
            if self.stopping.is_set():
                result["error"] = "the analyzer was stopped: the analysis was cancelled"
            elif not lines.gone.is_set():
                traceback.print_exc(file=log)
                self.failed = not self._alive()
        finally:
            self.busy = False
            done.set()
            watcher.join()
        if lines.gone.is_set():
            print("analyzer: its client left; the analysis was abandoned", file=log, flush=True)
            return
        _reply(conn, result, log)

    def _watch(self, conn: socket.socket, lines: ClientLines, done: threading.Event) -> None:
        """Note the client's hanging up (or a write to it that failed), then cancel the
        analysis as a stop does."""
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLHUP)
        while not done.is_set():
            if poller.poll(int(WATCH_INTERVAL * 1000)) or lines.gone.is_set():
                lines.gone.set()
                self._cancel_while_busy()
                return

    def _alive(self) -> bool:
        try:
            jsc = self.spark.sparkContext._jsc
            return jsc is not None and not jsc.sc().isStopped()
        except Exception:
            return False

    def serve_forever(self, log: TextIO) -> None:
        while not (self.stopping.is_set() or self.failed):
            conn, _ = self.listener.sock.accept()
            try:
                self.answer(conn, log)
            except OSError as exc:  # one client's socket, never the analyzer
                print(f"analyzer: a client's connection failed: {exc}", file=log, flush=True)


def _first_lines(exc: Exception) -> str:
    """An error's message without the JVM's stack (a Py4J error carries all of it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith("at ")][:3]
    return " ".join(kept)[:1000]


def _reply(conn: socket.socket, result: dict[str, Any], log: TextIO) -> None:
    conn.settimeout(REPLY_TIMEOUT)
    try:
        conn.sendall((RESULT + json.dumps(result, default=str) + "\n").encode())
    except OSError:  # gone, or not reading (a timeout): a stop does not wait for ever
        print("analyzer: its client left before its result", file=log, flush=True)
        return
    verdict = "answered" if result["ok"] else f"error: {result['error']}"
    print(f"analyzer: {verdict}", file=log, flush=True)


def _is_path(value: object) -> bool:
    """Whether ``value`` is an absolute path a file can have (no NUL byte)."""
    return isinstance(value, str) and os.path.isabs(value) and "\0" not in value


def _read_line(conn: socket.socket, deadline: float, stopping: threading.Event) -> bytes | None:
    """The request's line, at most :data:`REQUEST_LIMIT` bytes, by ``deadline`` (None:
    the connection closed without a byte); a stop (``stopping``) ends the wait, an
    error the client is told."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        conn.settimeout(max(0.001, min(left, WATCH_INTERVAL)))
        try:
            chunk = conn.recv(1 << 16)
        except TimeoutError:
            if stopping.is_set():
                raise AnalyticsError("the analyzer is stopping: no request taken") from None
            if left > WATCH_INTERVAL:
                continue
            raise AnalyticsError(f"no request within {REQUEST_TIMEOUT:.0f} s") from None
        finally:
            conn.settimeout(None)
        if not chunk and not chunks:
            return None
        if not chunk:
            raise AnalyticsError("the request ended before its newline")
        end = chunk.find(b"\n")
        size += len(chunk) if end < 0 else end
        if size > REQUEST_LIMIT:
            raise AnalyticsError(f"a request is at most {REQUEST_LIMIT:,} bytes")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)


def serve(path: Path, master: str | None, warm_ups: int, log: TextIO = sys.stderr) -> int:
    """``brokerd analyzer``: listen at ``path`` until SIGTERM or SIGINT (0), or until an
    analysis finds the Spark application gone (1)."""
    from brokerd.analytics.session import spark_session

    listener = listen(path)
    spark = None
    try:
        spark = spark_session(master, app_name="brokerd-analyzer", long_running=True)
        analyzer = Analyzer(spark, listener)
        # after Spark's start: PySpark's own SIGINT handler would cancel from within a call
        signal.signal(signal.SIGTERM, analyzer.stop)
        signal.signal(signal.SIGINT, analyzer.stop)
        analyzer.warm_up(warm_ups, log)
        print(f"analyzer: listening at {path} ({spark.sparkContext.master})", file=log, flush=True)
        analyzer.serve_forever(log)
        return 1 if analyzer.failed else 0
    except SystemExit:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        listener.close()
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()
