"""The error tree shared by the daemon and the SDK: one class per code, all documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.errors import BrokerError, RemoteError, error_codes, for_code

DOC = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()


@pytest.mark.parametrize("code", sorted(error_codes()))
def test_every_code_is_documented_with_its_class(code: str) -> None:
    cls = error_codes()[code]
    assert f"| `{code}` | `{cls.__name__}` |" in DOC


@pytest.mark.parametrize("code", sorted(error_codes()))
def test_for_code_gives_back_the_class_that_sent_it(code: str) -> None:
    cls = error_codes()[code]
    assert for_code(code) is cls
    error = cls("refused for a reason", kind=cls.__name__)
    assert isinstance(error, RemoteError) and isinstance(error, BrokerError)
    assert "refused for a reason" in str(error) and error.kind == cls.__name__


def test_an_unknown_code_is_the_base_class() -> None:
    assert for_code("from_a_newer_daemon") is RemoteError
    assert for_code(None) is RemoteError
