"""The SDK's API reference, ``docs/api.md``, generated from its docstrings.

    python -m brokerd.tools.apidoc            # write docs/api.md
    python -m brokerd.tools.apidoc --check    # exit 1 if docs/api.md is not current

Every public class, method and property of the SDK is listed with its signature and
docstring, in the order of :data:`SECTIONS`; one without a docstring is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any

from brokerd.sdk import activation, client, connection, dialog, keeper, messages, transaction
from protocol import errors

SECTIONS: list[tuple[str, list[type[Any]]]] = [
    ("Connecting", [client.BrokerClient, keeper.Reconnect, client.Connecting]),
    ("Dialogs and transactions", [dialog.Dialog, transaction.Transaction]),
    ("Activation", [activation.Activation, activation.ReaderPolicy]),
    ("Results", [messages.ReceivedMessage, messages.QuarantinedConversation]),
    (
        "Errors the SDK raises by itself",
        [
            errors.ClientError,
            errors.AuthenticationFailed,
            errors.OutcomeUnknown,
            errors.NotConnected,
            errors.TransactionLost,
            errors.RemoteError,
        ],
    ),
]
"""What the reference shows. The daemon's error codes, one class each, are listed in
``docs/errors.md``."""

OUT = Path(__file__).resolve().parents[2] / "docs" / "api.md"

_ = connection  # the connection is internal: named here so a newcomer finds it


class MissingDocstring(Exception):
    """A public call of the SDK has no docstring."""


def _doc(obj: object, name: str) -> str:
    text = inspect.getdoc(obj)
    if not text:
        raise MissingDocstring(f"{name} has no docstring")
    return text


def _members(cls: type[Any]) -> list[tuple[str, object]]:
    """Public methods and properties defined by ``cls`` itself, in source order."""
    out: list[tuple[str, object]] = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in {"code", "retriable"}:
            continue
        if isinstance(value, property | classmethod | staticmethod) or inspect.isfunction(value):
            out.append((name, value))
    return out


def _signature(name: str, value: object) -> str:
    if isinstance(value, property):
        return f"{name}  (property)"
    function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
    assert callable(function)
    prefix = "async " if inspect.iscoroutinefunction(function) else ""
    return f"{prefix}{name}{_format(inspect.signature(function))}"


def _format(signature: inspect.Signature) -> str:
    """A signature as written in the source (annotations are strings there, unquoted
    here), without ``self`` or ``cls``."""
    parts: list[str] = []
    star = False
    for param in signature.parameters.values():
        if param.name in {"self", "cls"}:
            continue
        if param.kind is param.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        stars = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}
        text = stars.get(param.kind, "") + param.name  # type: ignore[call-overload]
        if param.annotation is not param.empty:
            text += f": {param.annotation}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        if param.kind is param.VAR_POSITIONAL:
            star = True
        parts.append(text)
    returns = signature.return_annotation
    tail = "" if returns is signature.empty else f" -> {returns}"
    return f"({', '.join(parts)}){tail}"


def _class(cls: type[Any]) -> list[str]:
    qualified = f"{cls.__module__}.{cls.__qualname__}"
    lines = [f"### `{cls.__qualname__}`", "", f"`{qualified}`", "", _doc(cls, qualified), ""]
    if dataclasses.is_dataclass(cls):
        lines += ["Fields:", ""]
        lines += [f"- `{f.name}: {f.type}`" for f in dataclasses.fields(cls)]
        lines.append("")
    for name, value in _members(cls):
        target = value.fget if isinstance(value, property) else value
        lines += [
            f"#### `{_signature(name, value)}`",
            "",
            _doc(target, f"{qualified}.{name}"),
            "",
        ]
    return lines


def render() -> str:
    """The whole reference, as Markdown."""
    lines = [
        "# The SDK's API reference",
        "",
        "Generated from the docstrings by `python -m brokerd.tools.apidoc`; do not edit.",
        "The behaviour contract is `docs/spec.md` (§6 the verbs and their outcomes, §7",
        "client access); the errors the daemon reports are in `docs/errors.md`.",
        "",
    ]
    for title, classes in SECTIONS:
        lines += [f"## {title}", ""]
        for cls in classes:
            lines += _class(cls)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check docs/api.md is current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not current: run python -m brokerd.tools.apidoc", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
