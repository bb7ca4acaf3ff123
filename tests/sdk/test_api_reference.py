"""``docs/api.md`` is the SDK's reference generated from its docstrings: every public
call has one, and the file in the repository is the one the code generates."""

from __future__ import annotations

from brokerd.tools import apidoc


def test_every_public_call_of_the_sdk_is_documented_and_the_reference_is_current() -> None:
    text = apidoc.render()  # raises MissingDocstring for a public call without one
    assert "#### `async send_nowait" not in text  # a plain method is not shown as async
    assert "#### `async send(" in text and "### `Dialog`" in text
    assert apidoc.OUT.read_text() == text, "run: python -m brokerd.tools.apidoc"
