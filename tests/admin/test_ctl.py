"""``brokerctl`` (brokerd/admin/ctl.py): the table formatter, and the real command against the
two-daemon example deployment on 127.0.0.7 / 127.0.0.8 (other tests use .1 and .2)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.admin.ctl import format_table, main
from brokerd.storage.keys import new_handle
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from tests.commands import brokerctl

HOSTS = ("127.0.0.7", "127.0.0.8")
HANDLE = "c047dd43-6d66-486f-946c-abc999b3cf50"
NOWHERE = "//nowhere/Service"


# --------------------------------------------------------------------------- format_table


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_empty_view_prints_no_rows() -> None:
    assert format_table([]) == "(no rows)"
    assert format_table([], wide=True) == "(no rows)"


def test_columns_are_aligned_numbers_right_and_no_trailing_spaces() -> None:
    rows = [
        {"queue": "ClientQueue", "status": "on", "ready_messages": 0},
        {"queue": "Q", "status": "off", "ready_messages": 1234},
    ]
    out = lines(format_table(rows))
    assert out == [
        "queue        status  ready_messages",
        "ClientQueue  on                   0",
        "Q            off               1234",
    ]
    assert all(line == line.rstrip() for line in out)


def test_large_numbers_are_never_written_in_exponent_form() -> None:
    """An age of two weeks in seconds reads as a number, not ``1.20960e+06``; small ones
    keep six significant digits."""
    rows = [{"age_seconds": 1209600.123456}, {"age_seconds": 2.5e9}, {"age_seconds": 0.0421}]
    assert [line.strip() for line in lines(format_table(rows))[1:]] == [
        "1209600.123",
        "2500000000",
        "0.0421",
    ]


def test_uuids_are_shortened_unless_wide() -> None:
    rows = [{"conversation_handle": HANDLE, "state": "CD"}]
    short = format_table(rows)
    assert lines(short) == ["handle    state", "99b3cf50  CD"]
    wide = format_table(rows, wide=True)
    assert HANDLE in wide and "conversation_handle" in wide


def test_handles_made_together_stay_apart_when_shortened() -> None:
    """A conversation handle begins with the time it was made (``brokerd.storage.keys``):
    its shortened form is its random end, so handles of one minute stay apart."""
    handles = [str(new_handle()) for _ in range(20)]
    assert len({h[:8] for h in handles}) < 3  # their beginnings: the same time
    rows = [{"conversation_handle": h} for h in handles]
    shown = lines(format_table(rows))[1:]
    assert shown == [h[-8:] for h in handles] and len(set(shown)) == len(handles)


def test_transmission_status_is_last_and_whole() -> None:
    status = "no route to service '//nowhere/Service' " + "x" * 120 + "; DELAYED (R-ROUTE-13)"
    rows = [
        {"transmission_status": status, "message_sequence_number": 1, "to_service": "//a"},
        {"transmission_status": "", "message_sequence_number": 22, "to_service": "//bb"},
    ]
    out = lines(format_table(rows))
    assert out[0].split() == ["seq", "to_service", "transmission_status"]
    assert out[1].endswith(status)
    assert out[2] == " 22  //bb"  # numbers right-aligned under "seq"
    assert out[1].index(status) == out[0].index("transmission_status")


def test_long_text_is_cut_unless_wide_and_files_keep_their_end() -> None:
    long_text = "y" * 100
    path = "/very/long/directory/" + "d" * 60 + "/alpha/data/shop.sqlite"
    rows = [{"name": long_text, "file": path, "n": 1}]
    out = lines(format_table(rows))[1]
    assert long_text not in out and ("y" * 39 + "…") in out
    assert path not in out and "…" in out and "/alpha/data/shop.sqlite" in out
    wide = format_table(rows, wide=True)
    assert long_text in wide and path in wide


def test_values_booleans_none_timestamps_and_mixed_rows() -> None:
    rows: list[dict[str, Any]] = [
        {"peer": "beta", "encrypted": True, "login_time": "2026-01-02T03:04:05.678+00:00"},
        {"peer": "gamma", "encrypted": False, "login_time": "", "extra": None, "ratio": 0.5},
    ]
    out = lines(format_table(rows))
    assert out[0].split() == ["peer", "encrypted", "login_time", "extra", "ratio"]
    assert out[1].split() == ["beta", "yes", "2026-01-02", "03:04:05Z"]
    assert out[2].split() == ["gamma", "no", "0.5"]
    assert "2026-01-02T03:04:05.678+00:00" in format_table(rows, wide=True)


# --------------------------------------------------------------------------- errors in-process


def test_no_credentials_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BROKERD_CONFIG", raising=False)
    assert main(["endpoints"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("brokerctl: error: no credentials") and err.count("\n") == 1


def test_bad_config_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKERD_CONFIG", str(tmp_path / "missing.toml"))
    assert main(["queues"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("brokerctl: error: ") and "missing.toml" in err
    assert "BROKERD_CONFIG" in err and err.count("\n") == 1


def test_unknown_view_is_refused_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--token-file", "/nonexistent", "watch", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("brokerctl: error: unknown view 'nosuch'; views: ")
    assert "endpoints" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- real daemons


def ok_json(*args: str) -> Any:
    done = brokerctl(*args, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


async def _undeliverable(deployment: Deployment) -> None:
    """A message alpha can route nowhere: it stays in the transmission queue."""
    client = await deployment.daemons["alpha"].client()
    try:
        handle = await client.begin_dialog(example.SHOP_SERVICE, NOWHERE, example.CONTRACT)
        await client.send(handle, example.ORDER, b"<order id='lost'/>")
    finally:
        await client.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment = example.shop_and_warehouse(tmp_path_factory.mktemp("ctl"), hosts=HOSTS)
    try:
        for name in ("alpha", "beta"):
            deployment.start(name)
        asyncio.run(example.request_reply(deployment))
        asyncio.run(_undeliverable(deployment))
        yield deployment
    finally:
        deployment.stop_all()


@pytest.fixture
def alpha(deployment: Deployment) -> str:
    return str(deployment.daemons["alpha"].config_path)


@pytest.fixture
def beta(deployment: Deployment) -> str:
    return str(deployment.daemons["beta"].config_path)


def test_endpoints_after_request_reply(alpha: str, beta: str) -> None:
    """The initiator's closed endpoint is removed; the target keeps its own, closed, for
    ``limits.closed_endpoint_keep`` (SPEC §5)."""
    deadline = time.monotonic() + 10
    while [r for r in ok_json("--config", alpha, "endpoints") if r["state"] == "CD"]:
        assert time.monotonic() < deadline, "the initiator's closed endpoint stayed"
        time.sleep(0.2)
    rows = ok_json("--config", beta, "endpoints")
    done = [r for r in rows if r["far_service"] == example.SHOP_SERVICE]
    assert len(done) == 1
    assert done[0]["state"] == "CD" and done[0]["is_initiator"] is False
    assert done[0]["service"] == example.WAREHOUSE_SERVICE and done[0]["unacknowledged"] == 0

    table = brokerctl("--config", beta, "endpoints")
    assert table.returncode == 0, table.stderr
    header, *body = table.stdout.splitlines()
    assert header.split()[:4] == ["database", "handle", "conversation", "group"]
    assert {"lifetime", "dialog_timer"} <= set(header.split())
    assert any(done[0]["conversation_handle"][-8:] in line and " CD " in line for line in body)
    assert done[0]["conversation_handle"] not in table.stdout


def test_transmission_queue_holds_the_undeliverable_message(alpha: str) -> None:
    rows = ok_json("--config", alpha, "tq")
    assert rows == ok_json("--config", alpha, "transmission-queue")
    [lost] = [r for r in rows if r["to_service"] == NOWHERE]
    assert lost["message_sequence_number"] == 1 and lost["message_type"] == example.ORDER
    status = lost["transmission_status"]
    assert "no route" in status

    table = brokerctl("tq", "--config", alpha)  # options after the command work too
    assert table.returncode == 0, table.stderr
    header, *body = table.stdout.splitlines()
    assert header.split()[-1] == "transmission_status"
    assert {"error", "end"} <= set(header.split())
    assert lost["is_conversation_error"] is False and lost["is_end_of_dialog"] is False
    [row] = [line for line in body if NOWHERE in line]
    assert row.startswith(f"shop      {lost['conversation_handle'][-8:]}  ")
    assert row.endswith(status)


def test_queues_routes_connections_stats(alpha: str) -> None:
    queues = ok_json("--config", alpha, "queues")
    assert {(q["database"], q["queue"]) for q in queues} == {("shop", "ClientQueue")}

    routes = {(r["database"], r["name"]): r for r in ok_json("--config", alpha, "routes")}
    assert routes["shop", "ToWarehouse"]["address"] == f"tcp://{HOSTS[1]}:4022"
    assert routes["shop", "ToWarehouse"]["remote_service_name"] == example.WAREHOUSE_SERVICE

    connections = ok_json("--config", alpha, "connections")
    outbound = [c for c in connections if c["direction"] == "outbound"]
    assert [(c["peer"], c["address"], c["state"]) for c in outbound] == [
        ("beta", f"{HOSTS[1]}:4022", "open")
    ]
    assert outbound[0]["encrypted"] is True

    [stats] = ok_json("--config", alpha, "stats")
    assert stats["sent_messages"] >= 4 and stats["corrupted_messages"] == 0
    table = brokerctl("--config", alpha, "stats")
    assert table.stdout.splitlines()[0].split() == ["counter", "value"]


def test_environment_variable_ping_and_watch(alpha: str, deployment: Deployment) -> None:
    pong = brokerctl("ping", env={"BROKERD_CONFIG": alpha})
    assert pong.returncode == 0, pong.stderr
    assert pong.stdout.startswith(f"brokerd alpha at {HOSTS[0]}:4023 is up")

    watch = brokerctl("--config", alpha, "watch", "queues", "--interval", "0.05", "--count", "2")
    assert watch.returncode == 0, watch.stderr
    assert watch.stdout.count("ClientQueue") == 2

    beta = str(deployment.daemons["beta"].config_path)
    docs = brokerctl(
        "--config", beta, "watch", "routes", "--json", "--count", "2", "--interval", "0.05"
    )
    assert docs.returncode == 0, docs.stderr
    for line in docs.stdout.splitlines():
        assert "ToShop" in {r["name"] for r in json.loads(line)}
    assert len(docs.stdout.splitlines()) == 2


def test_wrong_token_is_refused_with_a_clear_message(alpha: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("00" * 32 + "\n")
    done = brokerctl("--config", alpha, "--token-file", str(wrong), "endpoints")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"brokerctl: error: brokerd at {HOSTS[0]}:4023 refused the token")
    assert "Traceback" not in done.stderr


def test_daemon_not_running(alpha: str, deployment: Deployment) -> None:
    token = str(deployment.daemons["alpha"].token_file)
    done = brokerctl("--host", HOSTS[0], "--port", "4029", "--token-file", token, "queues")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"brokerctl: error: cannot connect to brokerd at {HOSTS[0]}:4029: "
        "connection refused — is the daemon running?\n"
    )
    # --port overrides what the configuration says.
    again = brokerctl("--config", alpha, "--port", "4029", "ping")
    assert again.returncode == 2 and "is the daemon running?" in again.stderr


def test_leak_views_and_a_queue(alpha: str) -> None:
    """``ages`` counts endpoints by state and age, ``waiting`` puts the conversation whose
    message has no route first, ``queue`` lists a queue's rows with their status."""
    ages = ok_json("--config", alpha, "ages")
    assert ages and all({"database", "state", "age", "endpoints"} <= set(r) for r in ages)
    waiting = ok_json("--config", alpha, "waiting")
    assert waiting[0]["waiting_in"] == "transmission_queue" and waiting[0]["waiting"] == 1
    assert ok_json("--config", alpha, "queue", "ClientQueue") == []
    table = brokerctl("--config", alpha, "ages")
    assert table.returncode == 0 and table.stdout.split()[:3] == ["database", "state", "age_rank"]
    refused = brokerctl("--config", alpha, "queue", "Nowhere")
    assert refused.returncode == 2 and "Nowhere" in refused.stderr
