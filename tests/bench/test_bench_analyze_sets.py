"""The analytics benchmark's trace sets: generated once, kept, and never replaced unasked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_analyze import trace_set

LINE = b'{"v":1,"instance":"hub","n":1,"ts":"2026-11-30T10:00:00.000000Z","event":"started"}\n'


def test_a_set_without_its_truth_is_not_replaced(tmp_path: Path) -> None:
    """Segments made some other way (by hand, or by ``brokerd.analytics.synthetic``) have
    no ``truth.json``: the benchmark says so and leaves them as they are."""
    segment = tmp_path / "66" / "traces" / "hub" / "hub-20261130T100000-1-00001.jsonl"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(LINE)
    with pytest.raises(SystemExit, match=r"no truth\.json"):
        trace_set(tmp_path, 66, regenerate=False)
    assert segment.read_bytes() == LINE


def test_a_set_with_its_truth_is_read_as_it_is(tmp_path: Path) -> None:
    directory = tmp_path / "66"
    (directory / "traces").mkdir(parents=True)
    truth = {"events": 7, "messages_sent": 1, "retransmissions": 0, "duplicates": 0}
    (directory / "truth.json").write_text(json.dumps(truth))
    assert trace_set(tmp_path, 66, regenerate=False) == truth


def test_a_missing_set_is_generated_with_its_truth(tmp_path: Path) -> None:
    expected = trace_set(tmp_path, 66, regenerate=False)
    assert expected["events"] > 0 and expected["messages_sent"] > 0
    assert json.loads((tmp_path / "66" / "truth.json").read_text()) == expected
    assert any((tmp_path / "66" / "traces").rglob("*.parquet"))
