"""The running analyzer (``brokerd analyzer``) and ``brokerd analyze --server``
(R-REPORT-3): the same report as ``brokerd analyze`` alone, one analysis at a time, bad
requests answered with an error while the analyzer goes on, a socket only its user
may use."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from brokerd.analytics.report import analyze
from brokerd.analytics.service import RESULT, Analyzer, Request, listen
from brokerd.analytics.synthetic import Plan, generate
from brokerd.errors import AnalyticsError
from brokerd.traces import columnar
from tests.commands import brokerd

START_TIMEOUT = 240.0
ANALYZER = [sys.executable, "-m", "brokerd", "analyzer"]
ANALYZE = [sys.executable, "-m", "brokerd", "analyze"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative --out is the client's directory's


class Running:
    def __init__(self, process: subprocess.Popen[str], path: Path, log: Path) -> None:
        self.process, self.path, self.log = process, path, log


@pytest.fixture(scope="module")
def analyzer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("analyzer")
    path, log = root / "run" / "analyzer.sock", root / "analyzer.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*ANALYZER, str(path), "--warm-up", "0", "--master", "local[2]"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while "listening at" not in log.read_text():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the analyzer did not start"
        time.sleep(0.2)
    try:
        yield Running(process, path, log)
        # SIGTERM in the middle of an analysis: it is cancelled, the analyzer ends (0)
        # and removes its socket; the client is told why it got no result
        generate(root / "last", Plan(conversations=100))
        client = subprocess.Popen(
            [*ANALYZE, str(root / "last"), "--server", str(path), "--out", str(root / "x")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert client.stderr is not None
        assert client.stderr.readline().startswith("[1/10]")
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, log.read_text()[-3000:]
        assert client.wait(60) == 2
        assert "the analyzer was stopped: the analysis was cancelled" in client.stderr.read()
        assert not path.exists()
    finally:
        for running in (process, client) if "client" in locals() else (process,):
            if running.poll() is None:
                running.kill()
                running.wait(30)


def test_the_analyzer_writes_the_report_analyze_writes(
    analyzer: Running, tmp_path: Path, spark: SparkSession
) -> None:
    generate(tmp_path / "bad", Plan(conversations=40, violations=True))
    done = brokerd(
        "analyze", str(tmp_path / "bad"), "--server", str(analyzer.path), "--out", "bad-report"
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "FAILED: 3 violation(s)" in done.stdout
    assert "building the message table" in done.stderr  # its progress, as it runs
    summary = json.loads((Path("bad-report") / "summary.json").read_text())
    assert summary["audit"]["violations"] == 3
    assert summary["inputs"]["lines_skipped"] == 1
    assert (Path("bad-report") / "report.html").read_text().startswith("<!doctype html>")
    alone = json.loads(json.dumps(analyze([tmp_path / "bad"], spark=spark, progress=None).view()))
    for run in (summary, alone):
        for field in ("generated", "runtime_seconds", "events_per_second", "master"):
            del run[field]
    assert summary == alone


def raw(path: Path, data: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    last = answer.rstrip("\n").split("\n")[-1]  # not splitlines: RESULT is a line break to it
    assert last.startswith(RESULT)
    result: dict[str, object] = json.loads(last[1:])
    return result


def test_bad_requests_get_an_error_and_the_analyzer_goes_on(
    analyzer: Running, tmp_path: Path
) -> None:
    def request(**fields: object) -> bytes:
        base: dict[str, object] = {"paths": ["/x"], "out": "/tmp/x", "top": 5, "witness": []}
        return json.dumps(base | fields).encode() + b"\n"

    for data, error in [
        (b"not json\n", "one line of JSON"),
        (request(paths=["relative"]), "absolute"),
        (request(out="/tmp/a\u0000b"), "absolute"),  # no file has a NUL byte in its name
        (request(top=0), "top"),
        (request(witness=[["c", 1, 2, 3]]), "witness"),
        (request(more=1), "nothing else"),
        (b'{"paths": ["/x"]', "before its newline"),
        (b"[" * 100_000 + b"\n", "one line of JSON"),  # nested too deep for the parser
    ]:
        result = raw(analyzer.path, data)
        assert result["ok"] is False and error in str(result["error"]), (data, result)
    done = brokerd("analyze", str(tmp_path / "nowhere"), "--server", str(analyzer.path), "--quiet")
    assert done.returncode == 2 and "no such trace directory" in done.stderr, done.stderr
    done = brokerd("analyze", str(tmp_path), "--server", str(analyzer.path), "--master", "local[1]")
    assert done.returncode == 2 and "--master and --server" in done.stderr
    assert analyzer.process.poll() is None


def test_the_socket_is_its_users_alone_and_not_taken_twice(analyzer: Running) -> None:
    assert stat.S_IMODE(analyzer.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(analyzer.path.parent.stat().st_mode) == 0o700
    with pytest.raises(AnalyticsError, match="already"):
        listen(analyzer.path)
    assert analyzer.path.exists()  # left as it was
    done = brokerd("analyzer", str(analyzer.path), "--warm-up", "0")
    assert done.returncode == 2 and "already" in done.stderr


def test_a_stale_socket_is_replaced_and_a_file_is_not(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(stale))
    left.close()  # bound, never listening: an analyzer that is gone
    listen(stale).close()
    assert not stale.exists()  # removed at close, being its own
    (tmp_path / "file").write_text("x")
    with pytest.raises(AnalyticsError, match="not a socket"):
        listen(tmp_path / "file")
    assert not (tmp_path / "file.lock").exists()  # refused: nothing of it left
    assert (tmp_path / "file").read_text() == "x"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(AnalyticsError, match="this user's alone"):
        listen(shared / "a.sock")


def test_no_analyzer_is_a_clear_error(tmp_path: Path) -> None:
    generate(tmp_path / "traces", Plan(conversations=5))
    done = brokerd("analyze", str(tmp_path / "traces"), "--server", str(tmp_path / "none.sock"))
    assert done.returncode == 2 and "no analyzer answers" in done.stderr


@pytest.fixture
def in_process(spark: SparkSession, tmp_path: Path) -> Iterator[Analyzer]:
    analyzer = Analyzer(spark, listen(tmp_path / "run" / "a.sock"))
    try:
        yield analyzer
    finally:
        analyzer.listener.close()


def cache_is_empty(spark: SparkSession) -> bool:
    jsc = spark.sparkContext._jsc
    assert jsc is not None
    manager = spark._jsparkSession.sharedState().cacheManager()  # type: ignore[attr-defined]
    return bool(manager.isEmpty()) and bool(jsc.getPersistentRDDs().isEmpty())


def test_the_warm_up_analyses_a_generated_set(in_process: Analyzer, spark: SparkSession) -> None:
    log = io.StringIO()
    in_process.warm_up(1, log, conversations=10)
    assert in_process.analyses == 1
    assert "warm-up 1/1" in log.getvalue()
    assert cache_is_empty(spark)


def test_a_client_that_hangs_up_abandons_its_analysis(
    in_process: Analyzer, spark: SparkSession, tmp_path: Path
) -> None:
    generate(tmp_path / "traces", Plan(conversations=200))
    ours, theirs = socket.socketpair()
    theirs.sendall(Request((tmp_path / "traces",), tmp_path / "report", 5).encode())
    log = io.StringIO()
    answering = threading.Thread(target=in_process.answer, args=(ours, log))
    answering.start()
    assert theirs.makefile("r").readline().startswith("[1/10]")
    theirs.close()
    answering.join(120)
    assert not answering.is_alive()
    assert "abandoned" in log.getvalue()
    assert not (tmp_path / "report").exists()
    assert cache_is_empty(spark)  # nothing of it left in the application's cache


def answer_alone(analyzer: Analyzer, data: bytes) -> tuple[dict[str, object], str]:
    ours, theirs = socket.socketpair()
    with theirs:
        theirs.sendall(data)
        log = io.StringIO()
        analyzer.answer(ours, log)
        received = b""
        with contextlib.suppress(ConnectionResetError):  # it closed with bytes left unread
            while chunk := theirs.recv(65536):
                received += chunk
        last = received.decode().rstrip("\n").split("\n")
    assert last[-1].startswith(RESULT)
    result: dict[str, object] = json.loads(last[-1][1:])
    return result, log.getvalue()


def test_a_failed_analysis_is_an_error_and_not_the_analyzers_end(
    in_process: Analyzer, spark: SparkSession, tmp_path: Path
) -> None:
    """A compacted segment whose ``seq`` column holds text, not numbers (written by some
    other tool): it reads to its end, so it is not left out as damaged, and the request
    is a good one; Spark then fails the analysis when it reads the column."""
    generate(tmp_path / "broken", Plan(conversations=5))
    segment = max(sorted((tmp_path / "broken").rglob("*.parquet")), key=columnar.rows)
    table = pq.read_table(segment)
    seq = table.schema.get_field_index("seq")
    pq.write_table(table.set_column(seq, "seq", table.column(seq).cast(pa.string())), segment)
    assert columnar.check(segment) is None  # whole, as far as Parquet goes
    request = Request((tmp_path / "broken",), tmp_path / "report", 5)
    result, log = answer_alone(in_process, request.encode())
    assert result["ok"] is False
    error = str(result["error"])
    assert error.startswith("the analysis failed: "), error
    assert "PARQUET_COLUMN_DATA_TYPE_MISMATCH" in error and "[seq]" in error, error
    assert str(segment) in error  # the file, named
    assert "Traceback" in log and "Py4JJavaError" in log  # for whoever runs the analyzer
    assert not in_process.failed  # Spark is still there
    assert not (tmp_path / "report").exists()
    assert cache_is_empty(spark)  # nothing of the failed analysis left cached
    # and the next request is analysed as ever
    generate(tmp_path / "traces", Plan(conversations=5))
    request = Request((tmp_path / "traces",), tmp_path / "report", 5)
    result, _ = answer_alone(in_process, request.encode())
    assert result["ok"] is True and result["passed"] is True, result
    assert (tmp_path / "report" / "summary.json").is_file()
    assert in_process.analyses == 1


def test_a_request_must_come_in_time(in_process: Analyzer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("brokerd.analytics.service.REQUEST_TIMEOUT", 0.3)
    began = time.monotonic()
    result, _ = answer_alone(in_process, b'{"paths": ')  # and then nothing
    assert result["ok"] is False and "no request within" in str(result["error"])
    assert time.monotonic() - began < 5


def test_a_request_over_the_limit_is_refused(
    in_process: Analyzer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("brokerd.analytics.service.REQUEST_LIMIT", 100_000)
    result, _ = answer_alone(in_process, b"x" * 200_000)  # no newline within the limit
    assert result["ok"] is False and "at most 100,000 bytes" in str(result["error"])
    result, _ = answer_alone(in_process, b"x" * 100_001 + b"\n")  # a newline one byte late
    assert result["ok"] is False and "at most 100,000 bytes" in str(result["error"])


def test_a_stop_during_the_warm_up_cancels_it(in_process: Analyzer) -> None:
    """SIGTERM or SIGINT while the analyzer warms up: its analysis is cancelled, and
    the warm-up ends without an error (the analyzer then ends, 0)."""
    log = io.StringIO()
    warming = threading.Thread(target=in_process.warm_up, args=(3, log, 300))
    warming.start()
    deadline = time.monotonic() + 60
    while not in_process.busy:
        assert time.monotonic() < deadline and warming.is_alive()
        time.sleep(0.01)
    time.sleep(1.0)  # into the analysis's jobs
    in_process.stop(signal.SIGTERM, None)
    warming.join(60)
    assert not warming.is_alive()
    assert in_process.analyses == 0  # the first analysis did not finish
    assert "warm-up" not in log.getvalue()


def test_a_request_survives_its_own_encoding(tmp_path: Path) -> None:
    request = Request((tmp_path / "a", tmp_path / "b"), tmp_path / "out", 7, (("c", True, 3, 2),))
    assert Request.decode(request.encode().rstrip(b"\n")) == request


def test_witness_counts_out_of_range_are_a_bad_request(
    in_process: Analyzer, spark: SparkSession, tmp_path: Path
) -> None:
    """R-TRACE-2: a database file's witness counts are sequence numbers, from 0 to the
    largest 64-bit one the audit reads; one out of that range is a bad request, said
    before any analysis runs, and the analyzer goes on."""
    generate(tmp_path / "traces", Plan(conversations=5))
    for sent, received in [(-1, 0), (0, -5), (2**63, 0), (0, 2**64 + 1)]:
        data = Request(
            (tmp_path / "traces",), tmp_path / "report", 5, (("c", True, sent, received),)
        ).encode()
        result, _ = answer_alone(in_process, data)
        assert result["ok"] is False, (sent, received, result)
        error = str(result["error"])
        assert error.startswith("witness:") and "9,223,372,036,854,775,807" in error, error
    assert in_process.analyses == 0 and not in_process.failed
    assert not (tmp_path / "report").exists()
    largest = Request((tmp_path / "traces",), tmp_path / "report", 5, (("c", True, 2**63 - 1, 0),))
    result, _ = answer_alone(in_process, largest.encode())
    assert result["ok"] is True, result


def test_a_stop_after_the_analysis_still_answers_its_client(
    in_process: Analyzer, spark: SparkSession, tmp_path: Path
) -> None:
    """R-REPORT-3: SIGTERM once the analysis is done and its result not yet sent (the
    client slow to read it): the client gets its result whole, and the analyzer then
    ends (its loop stops) instead of ending with the connection cut."""
    generate(tmp_path / "traces", Plan(conversations=5))
    out = tmp_path.joinpath(*["r" * 200] * 10)  # a long path: a result larger than the buffer
    request = Request((tmp_path / "traces",), out, 5)
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.sendall(request.encode())
    received: list[bytes] = []

    def client() -> None:
        data = b""
        while data.count(b" s (total ") < 10:  # every step has ended: the result is next
            chunk = theirs.recv(65536)
            assert chunk, data
            data += chunk
        deadline = time.monotonic() + 60
        while in_process.analyses == 0 or in_process.busy:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)  # the result is waiting for this client
        while chunk := theirs.recv(65536):
            data += chunk
        received.append(data)

    previous = signal.signal(signal.SIGTERM, in_process.stop)
    reading = threading.Thread(target=client)
    try:
        reading.start()
        log = io.StringIO()
        with ours:
            in_process.answer(ours, log)  # a stop here would end the analyzer (SystemExit)
        reading.join(60)
    finally:
        signal.signal(signal.SIGTERM, previous)
        theirs.close()
    assert not reading.is_alive() and received
    last = received[0].decode().rstrip("\n").split("\n")[-1]
    assert last.startswith(RESULT), received[0][-300:]
    result = json.loads(last[1:])
    assert result["ok"] is True and result["summary"] == str(out / "summary.json")
    assert in_process.stopping.is_set()  # the analyzer's loop ends after this answer
    assert "analyzer: answered" in log.getvalue()


def test_a_stop_while_a_request_is_read_tells_its_client(in_process: Analyzer) -> None:
    """SIGTERM while a client's request has not all come: that client is told the
    analyzer is stopping (not cut off), at once, and the analyzer's loop ends."""
    ours, theirs = socket.socketpair()
    theirs.sendall(b'{"paths": ')  # and the rest not yet

    def stop_once_answering() -> None:
        deadline = time.monotonic() + 10
        while not in_process.answering:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, in_process.stop)
    stopping = threading.Thread(target=stop_once_answering)
    log = io.StringIO()
    try:
        stopping.start()
        began = time.monotonic()
        in_process.answer(ours, log)
        stopping.join(10)
    finally:
        signal.signal(signal.SIGTERM, previous)
    with theirs:
        answer = b"".join(iter(lambda: theirs.recv(65536), b"")).decode()
    assert time.monotonic() - began < 5
    assert answer.startswith(RESULT)
    result = json.loads(answer[1:])
    assert result == {"ok": False, "error": "the analyzer is stopping: no request taken"}
    assert in_process.stopping.is_set()
