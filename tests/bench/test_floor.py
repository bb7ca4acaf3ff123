"""The W3 floor (``python -m bench floor``): each piece of required work is measured on
real sockets, real SQLite files and the protocol's own sealing; the floor is their sum
and the ceiling follows from it. No figure is asserted beyond being a measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import floor
from bench.__main__ import main

PIECES = (
    "tcp_hop", "seal", "open", "seal_signed_only", "open_signed_only", "md5",
    "store_sender", "store_receiver", "durable_file",
)  # fmt: skip


def test_floor_is_the_sum_of_the_required_work(tmp_path: Path) -> None:
    line = floor.measure(iterations=2, directory=tmp_path, peer_mb_s=200.0, page_cache_mb=8)
    assert (line["page_cache_mb"], line["per_commit"]) == (8, floor.PER_COMMIT)
    for name in PIECES:
        assert line[name] > 0, name
    required = 3 * line["tcp_hop"] + line["seal"] + line["open"]
    required += line["store_sender"] + line["store_receiver"]
    assert line["floor_ms"] == pytest.approx(required, abs=0.01)
    ceiling = line["cores"] * floor.MIB / 1e6 / (line["floor_ms"] / 1000)
    assert line["ceiling_mb_s"] == pytest.approx(ceiling, rel=0.01)
    assert line["ceiling_ratio"] == pytest.approx(line["ceiling_mb_s"] / 200.0, abs=0.01)
    least = 3 * line["tcp_hop"] + 2 * line["md5"] + 2 * line["durable_file"]
    assert line["least_ms"] == pytest.approx(least, abs=0.01)
    assert line["least_ms"] < line["floor_ms"]  # no SQLite, no cipher, no copies
    least_ceiling = line["cores"] * floor.MIB / 1e6 / (line["least_ms"] / 1000)
    assert line["least_ceiling_mb_s"] == pytest.approx(least_ceiling, rel=0.01)
    assert line["least_ceiling_ratio"] == pytest.approx(
        line["least_ceiling_mb_s"] / 200.0, abs=0.01
    )
    assert list(tmp_path.iterdir()) == []  # its scratch files are gone
    text = floor.describe(line)
    assert "at most" in text and "least any design does" in text


def test_durable_file_writes_every_body_in_its_ring(tmp_path: Path) -> None:
    """The least durable store really writes: the ring's file holds the bodies written
    (a file never written would measure nothing)."""
    body = bytes(range(1, 256)) * 4112  # about 1 MiB, no zero byte
    assert floor.durable_file(tmp_path, body, iterations=1) > 0
    data = (tmp_path / "bodies").read_bytes()
    assert len(data) == floor.RING_SLOTS * len(body)
    written = 2 * floor.PER_COMMIT  # a warm-up step and the measured one
    slots = [data[i * len(body) : (i + 1) * len(body)] for i in range(floor.RING_SLOTS)]
    assert slots[:written] == [body] * written
    assert slots[written:] == [bytes(len(body))] * (floor.RING_SLOTS - written)


def test_floor_command_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["floor", "--iterations", "1", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["what"].startswith("W3 floor") and line["floor_ms"] > 0
    assert "ceiling_ratio" not in line
    assert line["page_cache_mb"] == floor.PAGE_CACHE_MB


@pytest.mark.parametrize(
    "args", [["--peer-mb-s", "0"], ["--page-cache-mb", "0"], ["--page-cache-mb", "4097"]]
)
def test_floor_command_refuses_figures_out_of_bounds(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["floor", *args])
    assert "must be" in capsys.readouterr().err
