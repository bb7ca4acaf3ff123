"""protocol/ is sans-I/O: no asyncio, sockets, sqlite, threads or clocks
(docs/design.md: protocol is sans-I/O). Checked on the source (imports and clock calls) and
at run time (importing protocol pulls none of those modules in)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PROTOCOL = Path(__file__).resolve().parents[2] / "protocol"
FORBIDDEN_MODULES = {
    "asyncio",
    "socket",
    "ssl",
    "sqlite3",
    "aiosqlite",
    "uvloop",
    "selectors",
    "threading",
    "multiprocessing",
    "subprocess",
    "time",
    "brokerd",
}
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


def _sources() -> list[Path]:
    files = sorted(PROTOCOL.glob("*.py"))
    assert len(files) >= 8
    return files


def test_protocol_imports_no_io_modules() -> None:
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES
            ]
    assert offenders == []


def test_protocol_reads_no_clock() -> None:
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in CLOCK_CALLS
            ):
                offenders.append(f"{path.name}:{node.lineno} .{node.func.attr}()")
    assert offenders == []


def test_importing_protocol_loads_no_io_module() -> None:
    """Beyond what its libraries load anyway (cryptography.x509 imports email.utils,
    which imports socket), importing protocol adds no I/O module."""
    code = (
        "import sys, construct, cryptography.x509, cryptography.hazmat.primitives.ciphers.aead;"
        "before = set(sys.modules);"
        "import protocol, protocol.dialog, protocol.fragments;"
        f"bad = sorted(m for m in {sorted(FORBIDDEN_MODULES)!r}"
        " if m in sys.modules and m not in before); print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=PROTOCOL.parent,
    )
    assert out.stdout.strip() == "[]"
