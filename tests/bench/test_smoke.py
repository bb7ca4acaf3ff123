"""The benchmark suite at smoke size: real daemons, a producer and a consumer process.

No figure is asserted (the machine is shared); only that every message arrived
exactly once and in order per dialog (``ok``) and that each line carries its figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.peer import find
from bench.report import add_ratios, markdown, percentile, read_lines
from bench.workloads import Options, run

FIELDS = (
    "workload", "messages", "size", "seconds", "msgs_per_s", "mb_per_s",
    "p50_ms", "p99_ms", "max_ms", "ok", "cpu_producer_s", "cpu_consumer_s",
    "cpu_daemon_s", "cpu_us_per_msg", "commits", "written_kb_per_msg", "mode",
)  # fmt: skip


def check(line: dict[str, object], messages: int) -> None:
    assert line["ok"], line.get("problems")
    assert line["received"] == messages
    for name in FIELDS:
        assert name in line, name


def test_w2_remote(tmp_path: Path) -> None:
    line = run(Options("W2", messages=400, size=200, dialogs=2, warmup=20, workdir=tmp_path))
    check(line, 400)
    assert set(line["cpu_daemon_s"]) == {"alpha", "beta"}
    # Both sides committed during the measured run (SENDs on A, arrivals on B), and fewer
    # times than there were messages: the commits are group commits.
    assert set(line["commits"]) == {"alpha", "beta"}
    assert all(0 < n < 400 for n in line["commits"].values()), line["commits"]
    if Path("/proc/self/io").exists():  # Linux's I/O accounting: what each wrote to disk
        written = line["written_kb_per_msg"]
        assert set(written) == {"alpha", "beta"} and all(v > 0 for v in written.values())
    assert line["mode"] == "" and line["encryption"] == "on"


def test_w2_in_batches_is_labelled(tmp_path: Path) -> None:
    """``batch`` SENDs per send_many request, the last batch shorter: still exactly once
    and in order on each dialog, and the line says it ran in batches."""
    options = Options(
        "W2", messages=430, size=200, dialogs=3, warmup=20, workdir=tmp_path, batch=100
    )
    line = run(options)
    check(line, 430)
    assert line["batch"] == 100 and line["mode"] == "batch 100"


def test_w1_in_one_database_is_labelled(tmp_path: Path) -> None:
    """W1 with both services in one database: SENDs go straight into the queue (R-DLG-13)."""
    line = run(
        Options("W1", messages=400, size=200, dialogs=1, warmup=20, workdir=tmp_path, databases=1)
    )
    check(line, 400)
    assert line["mode"] == "one database" and set(line["cpu_daemon_s"]) == {"solo"}


def test_w6_recovery_counts_the_restarted_sender_and_the_returning_receiver(
    tmp_path: Path,
) -> None:
    """W6: A is SIGKILLed holding a backlog and restarted, then B starts. Every message
    arrives exactly once, in order; A's figures run from its restart and B's from its
    start (it was not running when the measurement began), so both did work."""
    line = run(Options("W6", messages=1000, size=200, dialogs=10, workdir=tmp_path))
    check(line, 1000)
    assert line["first_delivery_s"] >= 0 and line["drained_s"] >= line["first_delivery_s"]
    for figure in ("cpu_daemon_s", "commits"):
        assert set(line[figure]) == {"alpha", "beta"}, figure
        assert all(v > 0 for v in line[figure].values()), (figure, line[figure])
    assert line["unacknowledged"] == 0  # every message acknowledged: nothing left to resend


def test_w3_large_remote(tmp_path: Path) -> None:
    line = run(Options("W3", messages=6, size=1 << 20, dialogs=1, warmup=2, workdir=tmp_path))
    check(line, 6)
    assert line["mb_per_s"]


def test_w1_local_by_the_command_and_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results.jsonl"
    argv = ["run", "-w", "W1", "--messages", "300", "--warmup", "20", "--trace", "off"]
    code = main([*argv, "--json", "--jsonl", str(results), "--workdir", str(tmp_path)])
    (line,) = [json.loads(t) for t in capsys.readouterr().out.splitlines()]
    assert code == 0
    check(line, 300)
    assert line["mode"] == "trace off" and set(line["cpu_daemon_s"]) == {"solo"}
    assert main(["summarize", str(results)]) == 0
    assert "| W1 | brokerd | trace off | 300 | 200 | 1 |" in capsys.readouterr().out


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99)) == (50, 99)
    assert percentile([7], 99) == 7


def test_ratios_and_the_summary_table(tmp_path: Path) -> None:
    ours = {"workload": "W2", "messages": 10, "size": 200, "broker": "brokerd", "mode": "",
            "msgs_per_s": 300.0, "p99_ms": 20.0, "ok": True}  # fmt: skip
    theirs = {"workload": "W2", "messages": 10, "size": 200, "broker": "rabbitmq",
              "msgs_per_s": 200.0, "p99_ms": 40.0, "ok": True}  # fmt: skip
    add_ratios(ours, theirs)
    assert ours["ratio_msgs_per_s"] == 1.5 and ours["ratio_p99_ms"] == 0.5
    path = tmp_path / "lines.jsonl"
    path.write_text(json.dumps(ours) + "\n" + json.dumps(theirs) + "\n")
    table = markdown(read_lines([path]))
    assert "| W2 | - | rabbitmq | 1.50x | - | - | 0.50x |" in table


def test_a_peer_directory_must_hold_the_set_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"holds no setup\.sh"):
        find("rabbitmq", tmp_path)
    with pytest.raises(ValueError, match="unknown peer"):
        find("kafka", tmp_path)
