"""The code's shape, as the design promises it (docs/design.md, "Layers and packages" and
"The dialog engine's parts"): parts are composed, not inherited; no module is over 800
lines; no module imports another module's private name. The layering itself is
import-linter's (``lint-imports``, contracts in pyproject.toml)."""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import brokerd
import protocol

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (brokerd, protocol)
MAX_LINES = 800
_OTHERS = ("tests", "bench", "examples")
"""The project's other Python: held to the same size of module."""


def _modules() -> list[ModuleType]:
    found = []
    for package in PACKAGES:
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not info.name.endswith(".__main__"):  # running it is the command line
                found.append(importlib.import_module(info.name))
    return found


def _sources() -> list[Path]:
    return sorted(p for package in ("brokerd", "protocol") for p in (ROOT / package).rglob("*.py"))


def test_no_class_inherits_from_a_class_of_the_project_but_errors_protocols_and_enums() -> None:
    """Parts, not mixins: a concern is an object handed its collaborators. Only a real
    "is a" may inherit: an error, a protocol, an enum."""
    classes = 0
    wrong = []
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            classes += 1
            if getattr(cls, "_is_protocol", False) or issubclass(cls, BaseException | enum.Enum):
                continue
            own = [
                b.__qualname__
                for b in cls.__mro__[1:]
                if b.__module__.split(".")[0] in ("brokerd", "protocol")
            ]
            if own:
                wrong.append(f"{module.__name__}.{cls.__qualname__} inherits from {own}")
    assert classes > 150
    assert wrong == []


def test_no_module_is_over_800_lines() -> None:
    """The daemon's and the protocol's modules, and the tests', benchmarks' and
    examples' too: each is read by a newcomer."""
    everything = [*_sources(), *(p for d in _OTHERS for p in (ROOT / d).rglob("*.py"))]
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in everything}
    assert len(sizes) > 250
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_no_module_imports_another_modules_private_name() -> None:
    wrong = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] not in ("brokerd", "protocol"):
                    continue
                wrong += [
                    f"{path.relative_to(ROOT)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert wrong == []


def test_no_two_test_files_start_daemons_on_one_loopback_address() -> None:
    """A test file that names its daemons' addresses (127.0.x.y with x above 0; the
    127.0.0.x ones belong to the shared fixtures) has them to itself: CI runs test files
    on two workers at once, and two daemons cannot both listen on one address's 4022."""
    address = re.compile(r"127\.0\.([1-9]\d*)\.(\d+)")
    users: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for x, y in address.findall(path.read_text()):
            users.setdefault(f"127.0.{x}.{y}", set()).add(str(path.relative_to(ROOT)))
    shared = {a: sorted(files) for a, files in users.items() if len(files) > 1}
    assert shared == {}
