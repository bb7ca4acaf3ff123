"""The daemon's allocator thresholds for large buffers (``brokerd.server.allocator``)."""

from __future__ import annotations

import platform

import pytest

from brokerd.server.allocator import tune_allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_the_thresholds_are_set_on_glibc() -> None:
    assert tune_allocator() is True
    assert tune_allocator() is True  # idempotent: a second start changes nothing


@pytest.mark.parametrize("variable", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_a_threshold_in_the_environment_is_the_operators_choice(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "131072")
    assert tune_allocator() is False
