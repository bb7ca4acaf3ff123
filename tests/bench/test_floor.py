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
    "sqlite_sender", "sqlite_receiver",
)  # fmt: skip


def test_floor_is_the_sum_of_the_required_work(tmp_path: Path) -> None:
    line = floor.measure(iterations=2, directory=tmp_path, peer_mb_s=200.0, page_cache_mb=8)
    assert (line["page_cache_mb"], line["per_commit"]) == (8, floor.PER_COMMIT)
    for name in PIECES:
        assert line[name] > 0, name
    required = 3 * line["tcp_hop"] + line["seal"] + line["open"]
    required += line["sqlite_sender"] + line["sqlite_receiver"]
    assert line["floor_ms"] == pytest.approx(required, abs=0.01)
    ceiling = line["cores"] * floor.MIB / 1e6 / (line["floor_ms"] / 1000)
    assert line["ceiling_mb_s"] == pytest.approx(ceiling, rel=0.01)
    assert line["ceiling_ratio"] == pytest.approx(line["ceiling_mb_s"] / 200.0, abs=0.01)
    assert list(tmp_path.iterdir()) == []  # its scratch files are gone
    assert "at most" in floor.describe(line)


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
