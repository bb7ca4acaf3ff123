"""The analytics' cache directory (docs/analytics.md, Performance): what one run makes
that the next can read, the report page's JavaScript bundle for one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from brokerd.analytics.cache import kept_text


def test_a_text_is_made_once_and_read_after(tmp_path: Path) -> None:
    made: list[str] = []

    def make() -> str:
        made.append("x")
        return "vega ü" * 1000

    directory = tmp_path / "cache"
    assert kept_text("bundle.js", make, directory) == "vega ü" * 1000
    assert kept_text("bundle.js", make, directory) == "vega ü" * 1000
    assert made == ["x"]
    assert sorted(p.name for p in directory.iterdir()) == ["bundle.js"]  # no file left half-named


def test_a_directory_that_cannot_be_written_makes_the_text_each_time(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("not a directory")
    assert kept_text("bundle.js", lambda: "made", tmp_path / "cache") == "made"
    assert (tmp_path / "cache").read_text() == "not a directory"


BUNDLE = """
import time
from brokerd.analytics import page
began = time.process_time()
bundle = page.vega_bundle()
print(len(bundle), round(time.process_time() - began, 3))
"""


def test_the_report_pages_bundle_is_made_by_the_first_run_and_read_by_the_next(
    tmp_path: Path,
) -> None:
    """vl-convert bundles vega, vega-lite and vega-embed afresh at each call (about 2 s
    of CPU); the next run reads the file the first one wrote, the same script."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", BUNDLE], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    (kept,) = (tmp_path / "brokerd").glob("vega-*.js")
    assert "window.vegaEmbed" in kept.read_text(encoding="utf-8")
    assert runs[0][0] == runs[1][0] == str(len(kept.read_text(encoding="utf-8")))
    assert float(runs[1][1]) < float(runs[0][1])
